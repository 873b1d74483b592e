"""The pool's early start: trials begin on the first worker up, the others join as they boot.

On a local Ray instance whose jobs may run on any GPU (placement ``any``, no ``device.gpus``),
sixteen workers booting and importing their frameworks at once on two cores all come up late, and
the first trial waits for the last of them. :class:`EarlyStart` (a part of ``pool.GpuPool``)
starts them one per two cores, keeps the first that answers, and lets the others join as they
answer (``join``), each within ``start_timeout_s`` of its start.

What the rest of the driver must allow for: while workers are joining, the pool's slots are not
all its GPUs. The supervisor gives each GPU at most its share of the batch meanwhile (a short
sweep still reaches the late ones), and resume asks the store about every GPU the store has
recorded, not only the joined ones (``orchestrator.launching.resume``). A worker that Ray places on
a GPU already in the pool (one retired, its resource released) is held, so the next lands elsewhere.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from orchestrator.errors import DeviceLostError, UserError
from orchestrator.launching.ray_calls import first_line, kill
from orchestrator.launching.slot import Slot, selection_key

if TYPE_CHECKING:
    from orchestrator.launching.settings import LaunchSettings
    from orchestrator.measuring.worker import WorkerInfo


class EarlyStart:
    """The joining workers of a ``GpuPool`` (which provides ``settings``, ``selections``,
    ``slots``, ``spawn``, ``next_deadline`` and the per-node GPU counts)."""

    settings: LaunchSettings
    selections: dict[str, Any]
    slots: list[Slot]
    _node_gpus: dict[str | None, int]
    spawn: Callable[..., Any]
    next_deadline: Callable[[], float]

    def reset_joining(self) -> None:
        """No worker joining (a new pool)."""
        self._joining: dict[Any, tuple[Any, float]] = {}  # identify ref -> worker, deadline
        self._held: list[Any] = []  # workers Ray placed on a GPU the pool already has
        self._last_error: str | None = None
        self._unspawned = 0  # workers still to start

    def hold(self, actor: Any) -> None:
        """Keep ``actor`` (and so its GPU) until every worker has joined: Ray would place the
        next worker on a GPU freed now (a retired one)."""
        self._held.append(actor)

    def _hold_and_retry(self, actor: Any) -> None:
        self.hold(actor)
        self._unspawned += 1
        self._spawn_joining(1)

    def _release_held(self) -> None:
        if not self.filling:
            for actor in self._held:
                kill(actor)
            self._held.clear()

    @property
    def join_error(self) -> str | None:
        """Why the last worker to answer could not join (None: it joined, or was held)."""
        return self._last_error

    def end_joining(self) -> None:
        """End the joining and held workers (the pool closes)."""
        for actor in [*(a for a, _ in self._joining.values()), *self._held]:
            kill(actor)
        self.reset_joining()

    @property
    def early(self) -> bool:
        """Whether trials may start before every worker is up: a local instance (one node, no
        duplicate GPUs) whose jobs may run on any GPU (placement ``any``, no ``device.gpus``). On
        two cores, sixteen workers take ten seconds to boot; the first trial need not wait."""
        return (self.settings.address is None and self.settings.placement == "any"
                and list(self.selections) == [selection_key(None)])

    def _join_first(self, total: int, note: Callable[[str], None]) -> None:
        """Start the workers a few at a time (one per two cores, and one more as each comes up:
        sixteen booting at once on two cores all come up late, and the first up then loads its
        framework beside the others' boots); keep the first that answers, and the others as
        they answer (``join``), each within ``start_timeout_s`` of its start.

        Raises:
            UserError: no worker answered in time, or every one failed.
        """
        import ray

        self._unspawned = total
        self._spawn_joining(max(1, (os.cpu_count() or 1) // 2))
        errors = []
        while not self.slots and self._joining:
            ready, _ = ray.wait(list(self._joining), num_returns=1,
                                timeout=max(self.next_deadline() - time.monotonic(), 0.0))
            if not ready:
                break
            slot = self.join(ready[0])
            if slot is None and self._last_error:
                errors.append(self._last_error)
            for action in slot.info.restored if slot else ():
                note(f"ray_gpus: {action} (left changed by a killed process)")
        if not self.slots:
            raise UserError(
                f"no worker could start on a GPU: {errors[0] if errors else 'none became free'}"
            )

    def _spawn_joining(self, n: int) -> None:
        """Start up to ``n`` more of the workers not started yet, each asked which GPU it got."""
        deadline = time.monotonic() + self.settings.start_timeout_s
        for _ in range(min(n, self._unspawned)):
            actor = self.spawn()
            self._joining[actor.identify.remote(list(self.selections.values()))] = (actor, deadline)
            self._unspawned -= 1

    @property
    def filling(self) -> bool:
        """Whether workers of an early start are still to join (started or not yet)."""
        return bool(self._joining or self._unspawned)

    def joining(self, ref: Any) -> bool:
        """Whether ``ref`` is the answer of a worker still joining the pool."""
        return ref in self._joining

    def join(self, ref: Any) -> Slot | None:
        """Take a joining worker's answer: its new slot (IDENTIFIED), or None (it failed, or its
        GPU is already in the pool: it is held and another one starts)."""

        actor, _ = self._joining.pop(ref)
        self._spawn_joining(1)
        slot = self._admit(ref, actor)
        self._release_held()
        return slot

    def _admit(self, ref: Any, actor: Any) -> Slot | None:
        import ray

        self._last_error = None
        try:
            info: WorkerInfo = ray.get(ref)
        except ray.exceptions.RayError as e:
            if isinstance(getattr(e, "cause", None), DeviceLostError):
                self._hold_and_retry(actor)  # it holds a lost GPU: no other worker lands there
                return None
            self._last_error = first_line(e)
            kill(actor)
            return None
        if any(s.uuid == info.uuid for s in self.slots):  # Ray gave it a GPU the pool has
            self._hold_and_retry(actor)  # (a retired one): the next worker lands elsewhere
            return None
        self._node_gpus[info.node_id] = self._node_gpus.get(info.node_id, 0) + 1
        slot = Slot(info, actor, selections=set(self.selections))
        self.slots.append(slot)
        self.slots.sort(key=lambda s: s.info.identity.index)
        return slot

    def expire_joining(self) -> int:
        """End the joining workers past their deadline; returns how many."""
        now = time.monotonic()
        late = [ref for ref, (_, deadline) in self._joining.items() if deadline <= now]
        for ref in late:
            kill(self._joining.pop(ref)[0])
        self._spawn_joining(len(late))
        self._release_held()
        return len(late)
