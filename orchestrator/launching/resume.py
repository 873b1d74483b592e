"""Resume: which of a sweep's trials its stores already hold, and which run again.

Every rule of resume lives here: what the retry policy means (``hydra.launcher.retry``, one of
``settings.RETRY_POLICIES``) and what one trial's stored rows mean (``resume_of``: run it, as which
attempt, or let its rows stand), asked of a store in one keyed query (``resume_trials``, also what a
single ``dvfs sweep`` uses); a re-run with nothing to run, answered without Ray or a GPU
(``already_stored``); and the stores a launched batch writes (``BatchStores``), with the GPUs each
has recorded.

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

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.errors import UserError
from orchestrator.jobs.job import record_sweep
from orchestrator.launching.settings import RETRY_POLICIES, LaunchSettings
from orchestrator.results.rows import JobResult, Status, attempt_of
from orchestrator.results.store import STORE_FILENAME, ResultStore

if TYPE_CHECKING:
    from orchestrator.launching.batch import Job, JobStream
    from orchestrator.launching.slot import Slot
    from orchestrator.progress import Progress


# --- one trial ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Resume:
    """What a sweep does with one trial, given what its store holds.

    Attributes:
        run: run the trial now; else ``rows`` stand for it.
        attempt: the attempt number a run now gets (1 + the latest stored; 1 for a new trial).
        rows: the rows of its latest complete attempt (None: none stored).
    """

    run: bool
    attempt: int = 1
    rows: list[dict[str, Any]] | None = None


def resume_of(rows: Sequence[Mapping[str, Any]], repeats: int, retry: str) -> Resume:
    """What to do with a trial whose stored rows (every attempt) are ``rows``.

    An attempt is complete with a row for every one of ``repeats``; an incomplete latest attempt
    (the store filled up half-way) runs again whatever the policy, as a new attempt.
    """
    if not rows:
        return Resume(run=True)
    latest = max(attempt_of(r) for r in rows)
    last = [dict(r) for r in rows if attempt_of(r) == latest]
    if {r["repeat"] for r in last} < set(range(repeats)):
        return Resume(run=True, attempt=latest + 1)
    statuses = {r.get("status") for r in last}
    again = {
        "never": False,
        "not_measured": Status.NOT_MEASURED in statuses,
        # out of memory at this size stays so: only a smaller size (a new trial key) runs
        "failed": bool(statuses - {Status.OK, Status.OUT_OF_MEMORY}),
    }[retry]
    return Resume(run=again, attempt=latest + 1, rows=last)


def resume_trials(
    store: ResultStore, keys: Iterable[str], repeats: int, retry: str = "not_measured"
) -> dict[str, Resume]:
    """Resume: what to do with each trial key, from one keyed store query (``rows_for``).

    Args:
        store: the sweep's ``ResultStore``.
        keys: the trial keys of the jobs about to run.
        repeats: windows per trial (a complete attempt has a row for each).
        retry: one of :data:`RETRY_POLICIES`.
    """
    if retry not in RETRY_POLICIES:
        raise UserError(f"retry={retry!r} is not one of: {', '.join(RETRY_POLICIES)}")
    keys = list(dict.fromkeys(keys))
    found = store.rows_for(keys)
    return {k: resume_of(found.get(k, []), repeats, retry) for k in keys}


# --- a batch -----------------------------------------------------------------------------------
def launcher_meta(settings: LaunchSettings, slots: list[Slot]) -> dict[str, Any]:
    """The store's ``launcher`` meta item: how the sweep reached which GPUs (a re-run reads the
    GPUs to find stored trials by, ``already_stored``; the report names them)."""
    placement = settings.placement
    return {
        "name": "ray_gpus",
        "address": settings.address,
        "placement": list(placement) if isinstance(placement, tuple) else placement,
        "gpus": [{"uuid": s.uuid, "host": s.info.host, "node_id": s.node_id} for s in slots],
    }


def already_stored(
    jobs: JobStream, settings: LaunchSettings, progress: Progress
) -> list[JobResult] | None:
    """Each job's stored result when a re-run has nothing to run, found without Ray or a GPU.

    A job of ``placement=any`` is done when one of the GPUs its store's last launch recorded holds
    its trial, and the retry policy does not run it again. One keyed query per store and chunk.

    Returns:
        Each job's ``JobResult``, in order; None when some trial has to run or the stores cannot
        tell without the pool (a new store, ``placement=every`` or a list, ``device.gpus``).
    """
    if settings.placement != "any" or any(g is not None for g in jobs.selections):
        return None
    if not all((d / STORE_FILENAME).exists() for d in jobs.store_dirs):
        return None
    stores = {d: ResultStore(d, readonly=True) for d in jobs.store_dirs}
    try:
        uuids = {d: [g["uuid"] for g in (s.get_meta("launcher") or {}).get("gpus", [])]
                 for d, s in stores.items()}
        results: list[JobResult] = []
        while not jobs.exhausted and all(uuids.values()):
            chunk = jobs.take(500)
            found: dict[str, Any] = {}
            for group in {(j.store_dir, j.repeats) for j in chunk}:
                d, repeats = group
                keys = [j.spec.trial_key(u) for j in chunk if (j.store_dir, j.repeats) == group
                        for u in uuids[d]]
                found.update(resume_trials(stores[d], keys, repeats, settings.retry))
            for job in chunk:
                done = [found[k] for k in (job.spec.trial_key(u) for u in uuids[job.store_dir])
                        if k in found and not found[k].run]
                if not done:
                    jobs.rewind()
                    return None
                results.append(JobResult.of(done[0].rows, job.spec.objective_name))
    finally:
        for s in stores.values():
            s.close()
    if len(results) < jobs.total:
        jobs.rewind()
        return None
    progress.trial_skipped(len(results))
    return results


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

    def __init__(self, settings: LaunchSettings) -> None:
        self.settings = settings
        self.every = settings.placement == "every"
        self.open: dict[Path, Any] = {}
        self.recorded: dict[Path, list[str]] = {}  # store dir -> GPUs of its earlier launches

    def of(self, job: Job, slots: list[Slot]) -> Any:
        """The store ``job`` writes to, opened (and its meta written) the first time."""
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
        meta = launcher_meta(self.settings, slots)  # this launch's: the same for every store
        for store in self.open.values():
            merged = merge_gpus(meta, store.get_meta("launcher"))  # with those it recorded
            store.put_meta("launcher", merged)

    def note_retired(self, uuid: str, entry: dict[str, Any]) -> None:
        """Record a retired GPU in every open store (the report names it and why)."""
        for store in self.open.values():
            store.put_meta("retired_gpus", {**(store.get_meta("retired_gpus") or {}), uuid: entry})

    def gpus_of(self, job: Job, slots: list[Slot]) -> list[str]:
        """The GPUs whose stored trial of ``job`` counts: the pool's that may run it, and for a job
        of ``placement=any`` over every GPU, those the store recorded before."""
        uuids = [s.uuid for s in slots if s.runs(job)]
        if not self.every and job.device.get("gpus") is None:
            uuids += [u for u in self.recorded.get(job.store_dir, ()) if u not in uuids]
        return uuids

    def resume(self, chunk: Iterable[Job], slots: list[Slot]) -> list[dict[str, Resume]]:
        """What the stores hold of each of ``chunk``'s jobs, in order: for each GPU whose stored
        trial of it counts (:meth:`gpus_of`, asked once per job), what to do with that trial
        (``{GPU uuid: Resume}``); one keyed query per store and repeats (``resume_trials``)."""
        chunk = list(chunk)
        keyed: list[dict[str, str]] = [{} for _ in chunk]  # per job: GPU uuid -> trial key
        found: dict[tuple[Path, int], dict[str, Resume]] = {}
        for group in dict.fromkeys((j.store_dir, j.repeats) for j in chunk):
            at = [i for i, j in enumerate(chunk) if (j.store_dir, j.repeats) == group]
            store = self.of(chunk[at[0]], slots)  # opened first: it says which GPUs it recorded
            for i in at:
                keyed[i] = {u: chunk[i].spec.trial_key(u) for u in self.gpus_of(chunk[i], slots)}
            keys = [key for i in at for key in keyed[i].values()]
            found[group] = resume_trials(store, keys, group[1], self.settings.retry)
        return [{u: found[(j.store_dir, j.repeats)][key] for u, key in keys.items()}
                for j, keys in zip(chunk, keyed, strict=True)]

    def close(self) -> None:
        """Close every open store."""
        for store in self.open.values():
            store.close()
