"""Which job runs next on which GPU: admission, the queue, and the shares while workers join.

Every rule of scheduling lives here. **Admission** comes first: before any trial, every distinct
``device`` config of the batch's checked jobs (the first job with each distinct value,
``batch.JobStream.check``) goes to each GPU's worker, which checks it against that GPU's policy
and supported values and changes nothing (``refusals``, ``GpuWorker.check``); and the pool admits
each GPU once (``refuse_duplicates``). Then the supervisor (``launching/supervisor.py``) moves
jobs from the batch's stream into a ``JobQueue`` as the GPUs need them, and asks it, one GPU at a
time, for that GPU's next job:

- placement ``any`` or a list of GPUs: one queue for all GPUs, each taking the first job its
  ``device.gpus`` selects; ``every``: a queue per GPU (each job once on each GPU);
- while workers are still joining or warming up, a GPU takes at most its share of the batch
  (``share_while_starting``): a short sweep leaves work for the GPUs that come up late;
- a busy GPU may take one job to run after its trial (``queue_ahead``): from its own queue, or
  from the shared one only while at least as many jobs wait as there are live GPUs that may run
  it, so the last jobs go to whichever GPU is free first, never behind a busy one (a job pinned
  to this GPU alone may always wait behind its trial);
- a job given back (sent, but its worker died or its GPU was retired before running it) goes to
  the front of its queue;
- a job no live GPU may run any more (``every``: queued on a retired GPU; else every GPU it
  selects retired) is taken off with why (``stranded``), for the supervisor to record.

The queue imports neither Ray nor a framework, and sends nothing; admission asks the workers.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from orchestrator.errors import UserError
from orchestrator.launching.slot import SlotState

R = TypeVar("R")  # a stored trial's result (``rows.JobResult``)

if TYPE_CHECKING:
    from orchestrator.jobs.replies import WorkerInfo
    from orchestrator.launching.batch import Job
    from orchestrator.launching.slot import Slot


class JobQueue:
    """The jobs of one batch waiting for a GPU.

    Args:
        every: placement ``every`` (a queue per GPU) rather than one shared queue.
        uuids: the GPUs of the pool so far (``add_gpu`` adds those that join later).
    """

    def __init__(self, every: bool, uuids: Iterable[str]) -> None:
        self.every = every
        self.shared: deque[Job] = deque()  # placement any or a list of GPUs
        self.per_gpu: dict[str, deque[Job]] = {u: deque() for u in uuids}  # placement every
        self.dealt: dict[str, int] = {}  # GPU uuid -> jobs it was sent in this batch

    def add_gpu(self, uuid: str) -> None:
        """A GPU joined the pool: it gets a queue of its own (``every``)."""
        self.per_gpu.setdefault(uuid, deque())

    def plan(self, job: Job, slots: list[Slot], stored: dict[str, R]) -> dict[str, R]:
        """Queue a job where no stored trial of it stands: on each GPU it selects (``every``),
        else once, unless one GPU's trial stands for it.

        Args:
            job: the job.
            slots: the pool's GPUs.
            stored: the results of its stored trials that stand (GPU uuid -> result).

        Returns:
            Those that stand instead of a run (GPU uuid -> result).
        """
        if not self.every:
            if stored:
                return dict([next(iter(stored.items()))])
            self.shared.append(job)
            return {}
        standing = {}
        for slot in (s for s in slots if s.runs(job)):
            if slot.uuid in stored:
                standing[slot.uuid] = stored[slot.uuid]
            else:
                self.per_gpu[slot.uuid].append(job)
        return standing

    def put_back(self, job: Job, uuid: str, *, sent: bool) -> None:
        """Put a job that GPU ``uuid`` will not run back at the front of its queue (``sent``: it
        had been dealt to that GPU, which no longer counts it)."""
        (self.per_gpu[uuid] if self.every else self.shared).appendleft(job)
        if sent:
            self.dealt[uuid] -= 1

    def waiting(self, live: Iterable[str]) -> int:
        """Jobs waiting: the shared queue's, or the shortest queue of the ``live`` GPUs'."""
        if not self.every:
            return len(self.shared)
        return min((len(self.per_gpu[u]) for u in live), default=0)

    def empty(self) -> bool:
        """No job waits for any GPU."""
        return not any(self.per_gpu.values()) if self.every else not self.shared

    def least_used(self, slots: Iterable[Slot]) -> list[Slot]:
        """The slots, those whose GPU was sent the fewest jobs first."""
        return sorted(slots, key=lambda s: self.dealt.get(s.uuid, 0))

    def take(
        self, slot: Slot, *, share: int | None = None, ahead_among: list[Slot] | None = None
    ) -> Job | None:
        """The next job the slot's GPU runs, taken off its queue and counted (None: none now).

        Args:
            slot: the GPU.
            share: at most this many jobs per GPU from the shared queue (None: no limit).
            ahead_among: the GPU is busy and the job is to run after its trial; the live GPUs: a
                shared job is taken only while at least as many jobs wait as there are of them
                that may run it. None: the GPU is idle.
        """
        if self.every:
            queue = self.per_gpu[slot.uuid]
            if not queue:
                return None
            job = queue.popleft()
        else:
            if share is not None and self.dealt.get(slot.uuid, 0) >= share:
                return None
            job = next((j for j in self.shared if slot.runs(j)), None)
            if job is None:
                return None
            if ahead_among is not None and len(self.shared) < sum(s.runs(job) for s in ahead_among):
                return None
            self.shared.remove(job)
        self.dealt[slot.uuid] = self.dealt.get(slot.uuid, 0) + 1
        return job

    def drain(self, uuid: str) -> list[Job]:
        """Take every job off GPU ``uuid``'s queue (``every``: its GPU was retired)."""
        queue = self.per_gpu[uuid]
        jobs = list(queue)
        queue.clear()
        return jobs

    def stranded(self, slots: list[Slot]) -> list[Stranded]:
        """Take off the queues every job that no live GPU may run now, each with the retired
        GPUs it was for and why it will not run: ``every``, the jobs queued on a retired GPU
        (each waits for that GPU alone); else the shared jobs whose every selected GPU is
        retired. The supervisor records them, whatever the placement, with this one question.
        """
        if self.every:
            return [Stranded(job, [slot], f"not run: GPU retired ({slot.retired_reason})")
                    for slot in slots if not slot.live for job in self.drain(slot.uuid)]
        found = []
        for job in list(self.shared):
            selecting = [s for s in slots if s.runs(job)]
            if not any(s.live for s in selecting):
                self.shared.remove(job)
                reasons = "; ".join(sorted({s.retired_reason or "retired" for s in selecting}))
                found.append(Stranded(job, selecting,
                                      f"not run: no GPU it may run on is left ({reasons})"))
        return found


class Stranded(NamedTuple):
    """A queued job that no live GPU may run (:meth:`JobQueue.stranded`)."""

    job: Job
    selecting: list[Slot]  # the retired GPUs it was for (never empty: its row names the first)
    error: str  # its rows' error: why it was not run


def share_while_starting(
    slots: list[Slot], *, filling: bool, expected: int, total: int
) -> int | None:
    """While workers are still joining or warming up, the most jobs a GPU takes: its share of the
    batch (the jobs over the workers, at least one), so a short sweep leaves work for the GPUs
    that come up late; None (no limit) once all are up.

    Args:
        slots: the pool's GPUs so far.
        filling: workers are still joining the pool (``GpuPool.filling``).
        expected: the workers started, joined or not (``GpuPool.expected``).
        total: the batch's jobs.
    """
    starting = (SlotState.IDENTIFIED, SlotState.ACQUIRING, SlotState.WARMING)
    if not filling and not any(s.state in starting for s in slots):
        return None
    workers = expected if filling else len(slots)
    return max(1, total // max(workers, 1))


def gpus_at_once(selections: Iterable[Any], expected: int) -> int:
    """How many GPUs a batch's jobs run on at once (for its estimate): the widest of their
    ``device.gpus`` selections, every GPU of the pool for none. The workers may still be joining
    (``expected`` of them: ``GpuPool.expected``), so the slots are not counted."""
    widest = max((expected if sel is None else min(len(sel), expected) for sel in selections),
                 default=1)
    return max(1, widest)


# --- admission ---------------------------------------------------------------------------------
def refusals(slots: list[Slot], jobs: list[Any]) -> list[str]:
    """Each (job, GPU) the GPU refuses, as a one-line message; empty when all are admitted.

    Args:
        slots: the GPUs to ask (those not live are skipped).
        jobs: the jobs (``batch.Job``) whose settings to check; each on the GPUs it may run on.
    """
    import ray

    unique: dict[str, dict[str, Any]] = {}
    for j in jobs:
        unique.setdefault(_key(j), j.device)
    refused: dict[str, list[tuple[Slot, str]]] = {}
    live = [s for s in slots if s.live]
    for slot, ref in [(s, s.actor.check.remote(list(unique.values()))) for s in live]:
        try:
            errs = ray.get(ref)
        except ray.exceptions.RayActorError:
            continue  # a worker being replaced; the supervisor sees to it
        for key, err in zip(unique, errs):
            if err is not None:
                refused.setdefault(key, []).append((slot, err))
    return [
        f"job #{j.num} ({j.what}) on {slot.label} ({slot.uuid}): {err}"
        for j in jobs
        for slot, err in refused.get(_key(j), [])
        if slot.runs(j)
    ]


def refuse_duplicates(infos: list[WorkerInfo]) -> None:
    """Two workers that see one GPU (``jobs.replies.WorkerInfo`` s) cannot both be in the pool.

    Raises:
        UserError: naming the GPU, both hosts and both simulated machines.
    """
    seen: dict[str, Any] = {}
    for info in infos:
        other = seen.setdefault(info.uuid, info)
        if other is not info:
            raise UserError(
                f"two workers see GPU {info.uuid} (hosts {other.host} and {info.host}, sim "
                f"state {other.sim_state_dir} and {info.sim_state_dir}): on a simulated "
                "cluster give each node its own DVFS_SIM_STATE_DIR and device.seed"
            )


def _key(job: Any) -> str:
    return json.dumps(job.device, sort_keys=True, default=str)
