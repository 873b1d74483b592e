"""The pool's early start: trials begin on the first worker up, the others join as they boot.

On a local Ray instance whose jobs may run on any GPU (placement ``any``, no ``device.gpus``),
sixteen workers booting and importing their frameworks at once on two cores all come up late, and
the first trial waits for the last of them. The pool (``pool.GpuPool``) then starts them one per
two cores, keeps the first that answers, and lets the others join as they answer
(``GpuPool.join``), each within ``start_timeout_s`` of its start. :class:`EarlyStart` is the
pool's collaborator that owns the workers started and not yet answered (and those held): it
starts them, hands each answer to the pool, and ends the late ones; the pool decides what an
answer becomes (a slot, or a worker held).

What the rest of the driver must allow for: while workers are joining, the pool's slots are not
all its GPUs. The supervisor gives each GPU at most its share of the batch meanwhile (a short
sweep still reaches the late ones), and resume asks the store about every GPU the store has
recorded, not only the joined ones (``orchestrator.launching.resume``). A worker that Ray places on
a GPU already in the pool (one retired, its resource released) is held, so the next lands elsewhere.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from orchestrator.launching.ray_calls import kill


class EarlyStart:
    """The workers of an early start not joined yet: started and waited for, or still to start.

    Args:
        spawn: starts a worker (Ray picks its GPU).
        selections: what each new worker is asked (``GpuWorker.identify``): the pool's
            ``device.gpus`` selections.
        start_timeout_s: the seconds a worker has to answer, read at each start (a later batch
            may change it).
    """

    def __init__(self, spawn: Callable[[], Any], selections: list[Any],
                 start_timeout_s: Callable[[], float]) -> None:
        self._spawn = spawn
        self._selections = selections
        self._start_timeout_s = start_timeout_s
        self._joining: dict[Any, tuple[Any, float]] = {}  # identify ref -> worker, deadline
        self._held: list[Any] = []  # workers Ray placed on a GPU the pool already has
        self._unspawned = 0  # workers still to start

    def begin(self, total: int, first: int) -> None:
        """Expect ``total`` workers and start ``first`` of them now."""
        self._unspawned = total
        self.start(first)

    def start(self, n: int) -> None:
        """Start up to ``n`` more of the workers not started yet, each asked which GPU it got."""
        deadline = time.monotonic() + self._start_timeout_s()
        for _ in range(min(n, self._unspawned)):
            actor = self._spawn()
            self._joining[actor.identify.remote(list(self._selections))] = (actor, deadline)
            self._unspawned -= 1

    @property
    def filling(self) -> bool:
        """Whether workers are still to join (started or not yet)."""
        return bool(self._joining or self._unspawned)

    def owns(self, ref: Any) -> bool:
        """Whether ``ref`` is the answer of a worker still joining."""
        return ref in self._joining

    def refs(self) -> list[Any]:
        """The answers still awaited."""
        return list(self._joining)

    def deadlines(self) -> Iterator[float]:
        """When each joining worker's time to answer ends (``time.monotonic()``)."""
        return (deadline for _, deadline in self._joining.values())

    def take(self, ref: Any) -> Any:
        """The worker whose answer ``ref`` is (no longer joining); the next worker starts."""
        actor, _ = self._joining.pop(ref)
        self.start(1)
        return actor

    def hold(self, actor: Any) -> None:
        """Keep ``actor`` (and so its GPU) until every worker has joined: Ray would place the
        next worker on a GPU freed now (a retired one)."""
        self._held.append(actor)

    def hold_and_retry(self, actor: Any) -> None:
        """Hold ``actor`` and start another worker in its place: it lands on another GPU."""
        self.hold(actor)
        self._unspawned += 1
        self.start(1)

    def release_held(self) -> None:
        """End the held workers once no other is to join."""
        if not self.filling:
            for actor in self._held:
                kill(actor)
            self._held.clear()

    def expire(self) -> int:
        """End the joining workers past their deadline, start as many more; returns how many."""
        now = time.monotonic()
        late = [ref for ref, (_, deadline) in self._joining.items() if deadline <= now]
        for ref in late:
            kill(self._joining.pop(ref)[0])
        self.start(len(late))
        self.release_held()
        return len(late)

    def end(self) -> None:
        """End the joining and held workers; start no more (the pool closes)."""
        for actor in [*(a for a, _ in self._joining.values()), *self._held]:
            kill(actor)
        self._joining.clear()
        self._held.clear()
        self._unspawned = 0
