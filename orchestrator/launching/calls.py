"""The calls in flight from the driver to the pool's workers: sent, queued, answered, given up.

Ray runs an actor's calls in order, one at a time. The driver sends each call on a ``Slot``
(``send``): the slot enters the call's state, and the call's object ref is remembered with its
slot until its answer is handled (``take``) or the call is given up (``cancel``, ``forget``). A
trial may be queued behind the one a busy worker runs (``Slot.queue``); its answer is handled
after the running one's (``ahead_of``), and it is promoted then (``promote``) or taken back if it
never ran (``unqueue``).

This is the pool's bookkeeping, apart from Ray's lifetime (``launching/pool.py``: start, spawn,
join, close): the pool owns one ``CallsInFlight`` for every batch it serves, since a call sent in
one batch may answer in the next. Ray is imported only to ask whether an answer is back.
"""

from __future__ import annotations

import math
import time
from typing import Any

from orchestrator.launching.slot import Call, Slot, SlotState, SlotStateError


class CallsInFlight:
    """The object refs of the calls sent to workers and not yet handled, each with its slot."""

    def __init__(self) -> None:
        self.refs: dict[Any, tuple[Slot, Call]] = {}  # object ref -> (slot, call)

    def send(
        self, slot: Slot, call: Call, *args: Any, deadline: float = math.inf, job: Any = None
    ) -> Any:
        """Send ``call`` to the slot's worker: the slot enters the call's state until ``take``.

        A run call to a BUSY slot is queued behind its trial (``Slot.queue``): the worker runs
        it next, and its deadline is set when it is promoted (``promote``).

        Args:
            slot: the GPU.
            call: which of the worker's methods.
            *args: its arguments.
            deadline: ``time.monotonic()`` by which the answer must be back.
            job: the job of a ``Call.RUN`` (``batch.Job``).

        Returns:
            The call's object ref.
        """
        queue = call is Call.RUN and slot.state is SlotState.BUSY
        if queue and not slot.may_queue:  # refused before anything is sent
            raise SlotStateError(f"{slot.label}: a trial is queued already")
        ref = getattr(slot.actor, call.value).remote(*args)
        if queue:
            slot.queue(ref, job)
        else:
            slot.begin(call, ref, deadline, job)
        self.refs[ref] = (slot, call)
        return ref

    def ahead_of(self, ref: Any) -> Any:
        """For the answer of a trial queued behind another whose answer is not taken yet, the
        other's ref (None otherwise). Ray ran that one first, or failed both as their worker
        died, so its answer is there too, and is to be handled first (``take``)."""
        owner = self.refs.get(ref)
        if owner is None or owner[0].queued is None or owner[0].queued.ref != ref:
            return None
        return owner[0].ref

    def answered(self, ref: Any) -> bool:
        """Whether a call's answer is back (handled or not)."""
        import ray

        return bool(ray.wait([ref], timeout=0)[0])

    def take(self, ref: Any) -> tuple[Slot, Call] | None:
        """The slot and call an answered ref was for (None: given up); no longer in flight.

        Only a slot's call in flight is taken, never its queued trial: Ray ran that one first,
        so its answer is handled first (``promote``).
        """
        owner = self.refs.get(ref)
        if owner is not None and owner[0].ref != ref:
            raise SlotStateError(f"{owner[0].label}: the queued trial's answer taken before "
                                 "the one in flight")
        owner = self.refs.pop(ref, None)
        if owner is not None:
            owner[0].end_call()
        return owner

    def promote(self, slot: Slot, timeout_s: float) -> Any:
        """The slot's queued trial is now in flight, due within ``timeout_s`` from now (it
        began when the one before it returned); returns its job."""
        return slot.promote(time.monotonic() + timeout_s).job

    def unqueue(self, slot: Slot) -> Any:
        """Take back the slot's queued trial, which never ran: its answer is ignored, and a
        worker held rather than killed does not run it (``stop_queued``); returns its job (None:
        none was queued)."""
        queued = slot.unqueue()
        if queued is None:
            return None
        self.refs.pop(queued.ref, None)
        return queued.job

    def cancel(self, slot: Slot) -> None:
        """Give up the slot's call in flight (its answer, if it comes, is ignored)."""
        self.refs.pop(slot.ref, None)
        slot.end_call()

    def forget(self, slot: Slot) -> None:
        """Forget the slot's call in flight (its GPU is retired: nothing of it is handled)."""
        self.refs.pop(slot.ref, None)
