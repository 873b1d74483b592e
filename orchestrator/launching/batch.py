"""A batch of Hydra jobs as the supervisor takes it: checked up front, prepared as it is run.

Hydra hands the launcher a batch as one list of overrides per job. :class:`JobStream` turns it
into validated :class:`Job` s without composing every job before the first trial:

1. :meth:`JobStream.check` composes one job per distinct override of the batch (each value of
   each swept key, ``compose.SweepComposer.check_values``): a bad value anywhere is a one-line
   ``UserError`` before any device is touched, and the jobs it composed tell where rows go, which
   GPUs are selected, which frameworks to load and which device settings each GPU must allow;
2. :meth:`JobStream.take` prepares the next jobs when the supervisor's queue runs low (a
   dictionary lookup and a few checks each), so a 10,000-job grid starts as fast as a 30-job one
   and holds only the jobs in flight.

A job refused only as a combination of good values (e.g. a precision one workload of the grid
lacks) stops the sweep when it is prepared, with the GPUs restored and every stored trial kept.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.errors import UserError
from orchestrator.jobs.job import PER_JOB_KEYS, JobSpec, machine_key
from orchestrator.launching.compose import SweepComposer
from orchestrator.launching.slot import selection_key


@dataclass
class Job:
    """One Hydra job of a batch, validated.

    Attributes:
        num: Hydra's job number.
        overrides: its overrides.
        spec: its validated, typed config and where its rows go.
        timeout_s: the per-trial limit (``hydra.launcher.timeout_s``, else ``measure.timeout_s``).
        what: the overrides that set this job apart from the rest of its batch.
    """

    num: int
    overrides: tuple[str, ...]
    spec: JobSpec
    timeout_s: float
    what: str = ""

    @property
    def store_dir(self) -> Path:
        """The store its rows go to."""
        assert self.spec.store_dir is not None
        return self.spec.store_dir

    @property
    def sweep_id(self) -> str:
        """Stamped on its rows."""
        return self.spec.sweep_id

    @property
    def label(self) -> str:
        """E.g. ``gemm/jax float32 [sm=1065 MHz]``."""
        return self.spec.label

    @property
    def repeats(self) -> int:
        """Windows per trial."""
        return self.spec.repeats

    @property
    def device(self) -> dict[str, Any]:
        """The resolved ``device`` section."""
        return self.spec.device

    @property
    def gpus_key(self) -> str:
        """Its ``device.gpus`` as a key: which GPUs of the pool may run it (``Slot.runs``)."""
        return selection_key(self.device.get("gpus"))


class JobStream:
    """The jobs of one batch, prepared in order as they are taken.

    Args:
        composer: the sweep's composer.
        job_overrides: one list of overrides per job.
        first_num: Hydra's number of the batch's first job.
        timeout_s: ``hydra.launcher.timeout_s`` (None: each job's ``measure.timeout_s``).
    """

    def __init__(
        self,
        composer: SweepComposer,
        job_overrides: Sequence[Sequence[str]],
        first_num: int = 0,
        timeout_s: float | None = None,
    ) -> None:
        self.composer = composer
        self.overrides = [tuple(str(o) for o in ov) for ov in job_overrides]
        self.first_num = first_num
        self.timeout_s = timeout_s
        self.whats = distinct_overrides(self.overrides)
        self._nums = list(range(first_num, first_num + len(self.overrides)))
        self.samples: list[Job] = []  # the first job with each distinct override (``check``)
        self._machines: dict[str, Job] = {}  # machine key -> its first checked job
        self._dirs: set[Path] = set()
        self._gpus: set[str] = set()
        self.taken = 0

    @property
    def total(self) -> int:
        """Jobs in the batch."""
        return len(self.overrides)

    @property
    def nums(self) -> list[int]:
        """Hydra's job numbers of the batch, in order."""
        return self._nums

    @property
    def exhausted(self) -> bool:
        """Every job has been taken."""
        return self.taken >= self.total

    def check(self) -> None:
        """Compose one job per distinct override; learn the machines the batch runs on.

        Raises:
            UserError: a refused value, naming its first job; a store or GPUs made per job.
        """
        try:
            firsts = self.composer.check_values(self.overrides, self.first_num)
        except UserError as e:
            i, more = self.composer.failed_at, self.composer.more_refused
            also = f" (and {more} more refused job(s))" if more else ""
            raise UserError(f"job #{self.first_num + i} ({self.whats[i]}): {e}{also}; nothing "
                            "was run") from e
        self._learn([self._job(i, spec) for i, spec in firsts])

    def _learn(self, samples: list[Job]) -> None:
        """What the checked jobs tell: the machines, stores and GPU selections of the batch."""
        self.samples = samples
        self._machines = {}
        for job in samples:
            self._machines.setdefault(machine_key(job.device), job)
        self._dirs = {j.store_dir for j in samples}
        self._gpus = {j.gpus_key for j in samples}
        self._fits(samples)

    def _fits(self, jobs: list[Job]) -> None:
        """Jobs the checked ones did not foresee (a store, GPUs or a machine of their own) are
        refused: the pool and the claimed stores were set up for the checked ones."""
        for job in jobs:
            if machine_key(job.device) not in self._machines:
                raise UserError(one_machine_message([self.first, job]))
            if job.store_dir not in self._dirs or job.gpus_key not in self._gpus:
                raise UserError(f"job #{job.num} ({job.what}): its store_dir or device.gpus is "
                                "made per job (an interpolation): set it for the sweep instead")

    def take(self, n: int) -> list[Job]:
        """The next ``n`` jobs (fewer at the end), validated.

        Raises:
            UserError: a job refused as a combination of values that each passed ``check``.
        """
        jobs = []
        while n > 0 and not self.exhausted:
            i, self.taken, n = self.taken, self.taken + 1, n - 1
            jobs.append(self._job(i, self._spec(i)))
        self._fits(jobs)
        return jobs

    def rewind(self) -> None:
        """Start again from the first job (the jobs are made again, the same)."""
        self.taken = 0

    # --- one machine at a time -----------------------------------------------------------------
    @property
    def machine_firsts(self) -> list[Job]:
        """The first checked job of each machine the batch runs on (one: a single machine)."""
        return list(self._machines.values())

    def by_machine(self) -> list[JobStream]:
        """The batch as one checked stream per machine, in the order each machine first comes
        (itself when the batch runs on one): a pool of workers serves one machine.

        Each job is composed once to learn its machine (a dictionary lookup and a few checks
        each): a batch spans machines when it compares boards, and the boards' jobs may
        interleave in any order.
        """
        if len(self._machines) <= 1:
            return [self]
        parts: dict[str, list[tuple[int, JobSpec]]] = {}
        for i in range(self.total):
            spec = self._spec(i)
            parts.setdefault(machine_key(spec.device), []).append((i, spec))
        return [self._part(jobs) for jobs in parts.values()]

    def _part(self, jobs: list[tuple[int, JobSpec]]) -> JobStream:
        """The stream of these jobs of the batch (positions and specs), checked as ``check``
        would: the first job with each of their distinct overrides is a sample."""
        part = JobStream(self.composer, [self.overrides[i] for i, _ in jobs], 0, self.timeout_s)
        part._nums = [self._nums[i] for i, _ in jobs]
        part.whats = [self.whats[i] for i, _ in jobs]
        seen: set[str] = set()
        samples = []
        for pos, (i, spec) in enumerate(jobs):
            if samples and all(o in seen for o in self.overrides[i]):
                continue
            seen.update(self.overrides[i])
            samples.append(part._job(pos, spec))
        part._learn(samples)
        return part

    # --- what the checked jobs tell ------------------------------------------------------------
    @property
    def store_dirs(self) -> list[Path]:
        """Every store the batch writes to."""
        return sorted(self._dirs)

    @property
    def selections(self) -> list[Any]:
        """Every distinct ``device.gpus`` of the batch."""
        return list({j.gpus_key: j.device.get("gpus") for j in self.samples}.values())

    @property
    def frameworks(self) -> tuple[str, ...]:
        """Every framework the batch runs (what each worker loads before its first trial)."""
        return tuple(sorted({j.spec.config.framework.name for j in self.samples}))

    def measures(self) -> list[Any]:
        """Each job's ``measure`` section, in order (what the sweep's estimate reads): the first
        checked job's for all when no override touches ``measure`` (a grid of settings), else
        each job's own (composed again: a dictionary lookup each)."""
        keys = {o.split("=", 1)[0].lstrip("+~") for ov in self.overrides for o in ov}
        if not any(k.split(".", 1)[0] in ("measure", "experiment") for k in keys):
            return [self.first.spec.config.measure] * self.total
        return [self._spec(i).config.measure for i in range(self.total)]

    @property
    def first(self) -> Job:
        """A checked job: whose device config opens the machine."""
        return self.samples[0]

    def _spec(self, i: int) -> JobSpec:
        try:
            return self.composer.spec(self.overrides[i], self._nums[i])
        except UserError as e:
            raise UserError(f"job #{self._nums[i]} ({self.whats[i]}): {e}; the sweep stops "
                            "here (stored trials are kept, a re-run resumes)") from e

    def _job(self, i: int, spec: JobSpec) -> Job:
        timeout_s = float(self.timeout_s or spec.config.measure.timeout_s)
        return Job(self._nums[i], self.overrides[i], spec, timeout_s, self.whats[i])


def distinct_overrides(job_overrides: list[Any]) -> list[str]:
    """Per job, the overrides not shared by every job of the batch (what a message should name)."""
    lists = [list(o) for o in job_overrides]
    common = set.intersection(*(set(o) for o in lists)) if len(lists) > 1 else set()
    return [" ".join(o for o in ov if o not in common) or "no overrides" for ov in lists]


def one_machine_message(jobs: list[Job]) -> str:
    """Why jobs on different machines cannot share this sweep (``jobs``: one per machine)."""
    return (
        "hydra/launcher=ray_gpus runs one machine per sweep, but these jobs differ in "
        f"{', '.join(differing_device_keys(jobs))}: run them as separate sweeps (the same "
        "store_dir gathers them) or with hydra/launcher=basic"
    )


def differing_device_keys(jobs: list[Job]) -> list[str]:
    """The ``device.*`` keys, other than the per-job ones, whose values differ between jobs."""
    keys = sorted({k for j in jobs for k in j.device if k not in PER_JOB_KEYS})
    return [
        f"device.{k}"
        for k in keys
        if len({json.dumps(j.device.get(k), default=str) for j in jobs}) > 1
    ]
