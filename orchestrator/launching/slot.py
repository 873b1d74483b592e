"""One GPU of the driver's pool and its worker: the slot, and the state machine it moves through.

**A slot's life** is a small state machine (``SlotState``), and only the slot and the pool
(``orchestrator.launching.pool.GpuPool``) move it: a call sent to the worker (``GpuPool.call``) puts
the slot in that call's state, its answer is taken back with ``GpuPool.take``, and
``Slot.mark_idle`` / ``GpuPool.retire`` end a call's work. A transition the machine does not have
raises ``SlotStateError``: the supervisor cannot lose a GPU in a state nobody handles. ::

    IDENTIFIED --acquire--> ACQUIRING --warm--> WARMING --> IDLE --run--> BUSY --> IDLE
    (a worker died or hung: any call's state --identify--> STARTING --acquire--> ACQUIRING)
    (any state but RETIRED --> RETIRED, for good)

**A trial queued behind the running one.** A BUSY slot may hold one more run call (``queue``):
Ray runs an actor's calls in the order they were sent, so the worker starts it the moment the
running trial returns, without waiting for the driver to hear of it and answer. When the running
trial's answer is handled, the queued one becomes the trial in flight (``promote``: still BUSY,
its deadline from then); a worker that dies or is replaced never ran it, and ``unqueue`` gives
its job back to be sent again.

This module imports neither Ray nor a framework.
"""

from __future__ import annotations

import enum
import json
import math
import time
from dataclasses import dataclass
from typing import Any

from orchestrator.jobs.replies import WorkerInfo


# --- a slot: one GPU and its worker -----------------------------------------------------------
class SlotState(enum.Enum):
    """Where one GPU's worker is in its life."""

    IDENTIFIED = "identified"  # its first worker answered identify; nothing sent since
    STARTING = "starting"  # a replacement worker is starting (identify in flight)
    ACQUIRING = "acquiring"  # taking the GPU's lease (acquire in flight)
    WARMING = "warming"  # importing the frameworks (warm in flight)
    IDLE = "idle"  # ready for a trial
    BUSY = "busy"  # a trial in flight
    RETIRED = "retired"  # out of the sweep for good


class Call(enum.Enum):
    """A call the driver sends a worker; the value is the worker's method name."""

    IDENTIFY = "identify"
    ACQUIRE = "acquire"
    WARM = "warm"
    RUN = "run"

    @property
    def state(self) -> SlotState:
        """The state a slot is in while this call is in flight."""
        return _STATE_DURING[self]


_STATE_DURING = {
    Call.IDENTIFY: SlotState.STARTING,
    Call.ACQUIRE: SlotState.ACQUIRING,
    Call.WARM: SlotState.WARMING,
    Call.RUN: SlotState.BUSY,
}

_S = SlotState
# Every transition a slot may make; anything else is a bug of the supervisor (SlotStateError).
TRANSITIONS: dict[SlotState, frozenset[SlotState]] = {
    _S.IDENTIFIED: frozenset({_S.ACQUIRING, _S.RETIRED}),
    _S.STARTING: frozenset({_S.STARTING, _S.ACQUIRING, _S.RETIRED}),
    _S.ACQUIRING: frozenset({_S.WARMING, _S.STARTING, _S.RETIRED}),
    _S.WARMING: frozenset({_S.IDLE, _S.STARTING, _S.RETIRED}),
    _S.IDLE: frozenset({_S.BUSY, _S.RETIRED}),
    _S.BUSY: frozenset({_S.IDLE, _S.STARTING, _S.RETIRED}),
    _S.RETIRED: frozenset(),
}


# What a lane of the progress line shows for a slot that runs no trial.
_LANE_TEXT = {
    SlotState.IDENTIFIED: "starting",
    SlotState.ACQUIRING: "taking GPU",
}


class SlotStateError(RuntimeError):
    """A slot was asked to make a transition its state machine does not have."""


@dataclass(frozen=True)
class RunCall:
    """A trial sent to a worker.

    Attributes:
        ref: the object ref of its answer.
        job: the job (``batch.Job``).
        dispatched_at: Unix seconds it was sent.
    """

    ref: Any
    job: Any
    dispatched_at: float


class Slot:
    """One GPU of the pool and the worker that owns it.

    Its state, the call in flight and that call's deadline change only through its methods and
    the pool's (``GpuPool.call``, ``take``, ``cancel``, ``retire``), which keep them consistent.

    Args:
        info: what the GPU's worker answered to ``identify``.
        actor: the worker (a Ray actor handle).
        multi_node: the pool spans several nodes (labels then name the host).
        selections: the ``selection_key`` of every ``device.gpus`` value that picks this GPU.
    """

    def __init__(
        self, info: WorkerInfo, actor: Any, *, multi_node: bool = False,
        selections: set[str] | None = None,
    ) -> None:
        self.uuid = info.uuid
        self.info = info  # the current worker's identify(): identity, node, host, pid, Ray GPU id
        self.actor = actor
        self.multi_node = multi_node
        self.selections = set(selections or ())
        self.restarts = 0  # workers started after the first one
        self.builds = 0  # kernels the worker has built (its cache's counter)
        self.deaths_in_a_row = 0
        self.retired_reason: str | None = None
        self.parked: list[Any] = []  # replacements that landed on another GPU of the node
        self._state = SlotState.IDENTIFIED
        self._since = time.monotonic()
        self._ref: Any = None
        self._deadline = math.inf
        self._trial: RunCall | None = None  # the trial in flight
        self._queued: RunCall | None = None  # the trial sent to run after it

    # --- reading -------------------------------------------------------------------------------
    @property
    def state(self) -> SlotState:
        """Where the worker is in its life."""
        return self._state

    @property
    def since(self) -> float:
        """``time.monotonic()`` at which the current state began."""
        return self._since

    @property
    def ref(self) -> Any:
        """The object ref of the call in flight (None: none)."""
        return self._ref

    @property
    def deadline(self) -> float:
        """``time.monotonic()`` by which the call in flight must be back (inf: no limit)."""
        return self._deadline

    @property
    def job(self) -> Any:
        """The job of the trial in flight (``batch.Job``; None: no trial)."""
        return None if self._trial is None else self._trial.job

    @property
    def queued(self) -> RunCall | None:
        """The trial queued behind the one in flight (None: none)."""
        return self._queued

    @property
    def may_queue(self) -> bool:
        """A trial is in flight and none is queued behind it: one more may be sent."""
        return self._state is SlotState.BUSY and self._queued is None

    @property
    def live(self) -> bool:
        """Not retired: it may still run trials."""
        return self._state is not SlotState.RETIRED

    @property
    def label(self) -> str:
        """``gpu2`` (one node) or ``gpu2@host`` (a cluster); ``cpu0`` for the host CPU."""
        identity = self.info.identity
        name = f"{'cpu' if identity.backend == 'cpu' else 'gpu'}{identity.index}"
        return f"{name}@{self.info.host}" if self.multi_node else name

    @property
    def node_id(self) -> str | None:
        """The Ray node the GPU belongs to."""
        return self.info.node_id

    def runs(self, job: Any) -> bool:
        """True if the job's ``device.gpus`` selects this GPU (the job may run here)."""
        return job.gpus_key in self.selections

    def activity(self, frameworks: tuple[str, ...] = ()) -> str:
        """What its lane of the progress line shows, e.g. ``gemm/jax@1065`` or ``taking GPU``."""
        if self._state is SlotState.BUSY and self._trial is not None:
            spec = self._trial.job.spec
            clock = spec.config.device.sm_clock_mhz
            where = f"@{clock}" if clock is not None else ""
            return f"{spec.workload_name}/{spec.config.framework.name}{where}"
        if self._state is SlotState.WARMING:
            return f"loading {'+'.join(frameworks)}"
        return _LANE_TEXT.get(self._state, self._state.value)

    # --- transitions ---------------------------------------------------------------------------
    def _enter(self, state: SlotState) -> None:
        if state not in TRANSITIONS[self._state]:
            raise SlotStateError(
                f"{self.label} ({self.uuid}): no transition {self._state.name} -> {state.name}"
            )
        self._state, self._since = state, time.monotonic()

    def begin(self, call: Call, ref: Any, deadline: float = math.inf, job: Any = None) -> None:
        """A call was sent to the worker: enter its state (``GpuPool.call`` sends it)."""
        if (job is None) != (call is not Call.RUN):
            raise SlotStateError(f"{self.label}: a job goes with a run call, and only with one")
        if self._queued is not None:
            raise SlotStateError(f"{self.label}: a {call.value} call sent with a trial queued")
        self._enter(call.state)
        self._ref, self._deadline = ref, deadline
        if job is not None:
            self._trial = RunCall(ref, job, time.time())

    def queue(self, ref: Any, job: Any) -> None:
        """A trial was sent to run after the one in flight (``GpuPool.call`` on a BUSY slot)."""
        if not self.may_queue:
            queued = "one queued already" if self._queued is not None else self._state.name
            raise SlotStateError(f"{self.label}: no trial may be queued ({queued})")
        self._queued = RunCall(ref, job, time.time())

    def promote(self, deadline: float) -> RunCall:
        """The trial in flight was answered: the queued one is now in flight (it began as the
        other returned), due by ``deadline``; returns it."""
        if self._queued is None or self._ref is not None:
            raise SlotStateError(f"{self.label}: nothing to promote, or a call still in flight")
        self._trial, self._queued = self._queued, None
        self._ref, self._deadline, self._since = self._trial.ref, deadline, time.monotonic()
        return self._trial

    def unqueue(self) -> RunCall | None:
        """Take back the queued trial (its worker is being replaced or retired: it never ran)."""
        queued, self._queued = self._queued, None
        return queued

    def end_call(self) -> None:
        """The call in flight is answered or given up: no ref, no deadline (state unchanged)."""
        self._ref, self._deadline = None, math.inf

    def take_trial(self) -> RunCall:
        """The trial that was in flight (its answer is being handled), now cleared."""
        trial, self._trial = self._trial, None
        if trial is None:
            raise SlotStateError(f"{self.label}: no trial in flight")
        return trial

    def mark_idle(self) -> None:
        """The worker is ready for a trial (warmed up, or back from one)."""
        self._enter(SlotState.IDLE)

    def retire(self, reason: str) -> list[Any]:
        """Take the GPU out of the sweep for good; returns the workers to end (``GpuPool.retire``
        ends them and forgets the call in flight)."""
        if self._queued is not None:
            raise SlotStateError(f"{self.label}: retired with a trial queued")
        self._enter(SlotState.RETIRED)
        self.end_call()
        self.retired_reason = reason
        actors, self.parked = [self.actor, *self.parked], []
        return actors

    # --- its workers ---------------------------------------------------------------------------
    def worker_died(self) -> int:
        """Count one more worker death in a row; returns the count."""
        self.deaths_in_a_row += 1
        return self.deaths_in_a_row

    def trial_returned(self, builds: int) -> None:
        """A trial came back from a live worker: its kernel counter, and no deaths in a row."""
        self.builds, self.deaths_in_a_row = builds, 0

    def new_worker(self, actor: Any, *, restart: bool) -> None:
        """A worker was started for this GPU (``restart``: it replaces one that died)."""
        self.actor = actor
        self.restarts += int(restart)

    def park(self) -> int:
        """Hold the current worker (it landed on another GPU of the node, which it keeps busy
        so the next one cannot land there); returns how many are held."""
        self.parked.append(self.actor)
        return len(self.parked)

    def adopt(self, info: WorkerInfo) -> list[Any]:
        """The current worker is on this GPU: take its identify(); returns the parked workers,
        for the caller to end."""
        self.info = info
        parked, self.parked = self.parked, []
        return parked


def selection_key(gpus: Any) -> str:
    """One ``device.gpus`` value as a key (None, the default, selects every GPU)."""
    return json.dumps(gpus, default=str)
