"""The result stores a batch writes, and which of its trials they already hold (resume).

A trial is keyed by its job and its GPU (``JobSpec.trial_key``), so resume must ask the store
about the right GPUs. With ``placement=any`` a job is done when *any* GPU holds its trial, and
the GPUs to ask are not only those of the pool now: workers of an early-started pool join one by
one (``orchestrator.launching.pool``), and a re-run may get other GPUs than the run that stored the
trial. So each store's ``launcher`` meta item accumulates every GPU a launch of it ever had
(:func:`merge_gpus`), and a job of ``placement=any`` that selects every GPU is looked up on the
pool's GPUs *and* on those recorded ones (``already_stored`` does the same without a pool).
``placement=every`` and a job's own ``device.gpus`` ask only the pool's GPUs that may run it: a
fleet survey wants the trial on each of them.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from orchestrator.launching.batch import Job, launcher_meta
from orchestrator.launching.slot import Slot, selection_key
from orchestrator.results.jobs import record_sweep, resume_trials

EVERY_GPU = selection_key(None)


def merge_gpus(meta: dict[str, Any], previous: dict[str, Any] | None) -> dict[str, Any]:
    """``meta`` (this launch's ``launcher`` item) with the GPUs of ``previous`` it lacks appended:
    a store names every GPU that may hold its trials."""
    have = {g["uuid"] for g in meta["gpus"]}
    kept = [g for g in (previous or {}).get("gpus", []) if g.get("uuid") not in have]
    return {**meta, "gpus": [*meta["gpus"], *kept]}


class BatchStores:
    """The open stores of one batch (one per ``store_dir``) and the GPUs each has recorded.

    Args:
        settings: the launcher settings (placement, retry, address).
    """

    def __init__(self, settings: Any) -> None:
        self.settings = settings
        self.every = settings.placement == "every"
        self.open: dict[Path, Any] = {}
        self.recorded: dict[Path, list[str]] = {}  # store dir -> GPUs of its earlier launches

    def of(self, job: Job, slots: list[Slot]) -> Any:
        """The store ``job`` writes to, opened (and its meta written) the first time."""
        from orchestrator.results.store import ResultStore

        store = self.open.get(job.store_dir)
        if store is None:
            store = self.open[job.store_dir] = ResultStore(job.store_dir)
            record_sweep(store, job.spec)
            previous = store.get_meta("launcher")
            self.recorded[job.store_dir] = [g["uuid"] for g in (previous or {}).get("gpus", [])]
            store.put_meta("launcher", merge_gpus(launcher_meta(self.settings, slots), previous))
        return store

    def note_gpus(self, slots: list[Slot]) -> None:
        """Record the pool's GPUs in every open store (a worker joined)."""
        for store in self.open.values():
            meta = launcher_meta(self.settings, slots)
            store.put_meta("launcher", merge_gpus(meta, store.get_meta("launcher")))

    def note_retired(self, uuid: str, entry: dict[str, Any]) -> None:
        """Record a retired GPU in every open store (the report names it and why)."""
        for store in self.open.values():
            store.put_meta("retired_gpus", {**(store.get_meta("retired_gpus") or {}), uuid: entry})

    def gpus_of(self, job: Job, slots: list[Slot]) -> list[str]:
        """The GPUs whose stored trial of ``job`` counts: the pool's that may run it, and for a job
        of ``placement=any`` over every GPU, those the store recorded before."""
        uuids = [s.uuid for s in slots if s.runs(job)]
        if not self.every and job.gpus_key == EVERY_GPU:
            uuids += [u for u in self.recorded.get(job.store_dir, ()) if u not in uuids]
        return uuids

    def resume(self, chunk: Iterable[Job], slots: list[Slot]) -> dict[tuple[Path, int], dict]:
        """What the stores hold of ``chunk``'s trials: one keyed query per store and repeats,
        ``{(store_dir, repeats): {trial key: Resume}}`` (``jobs.resume_trials``)."""
        chunk = list(chunk)
        found: dict[tuple[Path, int], dict] = {}
        for group in dict.fromkeys((j.store_dir, j.repeats) for j in chunk):
            jobs = [j for j in chunk if (j.store_dir, j.repeats) == group]
            store = self.of(jobs[0], slots)
            keys = [j.spec.trial_key(u) for j in jobs for u in self.gpus_of(j, slots)]
            found[group] = resume_trials(store, keys, group[1], self.settings.retry)
        return found

    def close(self) -> None:
        """Close every open store."""
        for store in self.open.values():
            store.close()
