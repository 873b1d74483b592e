"""Ctrl-C and SIGTERM, for a ``dvfs`` command: recorded, raised, and checked again.

``handling`` routes SIGINT (Ctrl-C) and SIGTERM to one handler that records the signal and raises
``KeyboardInterrupt`` in the main thread, so that every ``finally`` runs: the guard and the pool
of workers restore the GPUs, the store keeps every finished trial. A library on the way up may
turn that exception into another one (a signal that lands inside Hydra's config composition
comes out as a config error), so ``received`` says whether one arrived, and whoever turns
exceptions into messages asks it first.

Python drops the exception when the signal lands in a garbage-collector callback or a ``__del__``
(it prints "Exception ignored in: <function _xla_gc_callback ...>" and goes on: seen when JAX's
callback was running, for SIGTERM and for Ctrl-C alike, in the ``ray_gpus`` driver's loop and in
an in-process trial), so a signal could be lost while the guard had already put the GPU back
mid-trial. Long loops therefore ``check`` between steps: each trial before it starts and before
it returns its rows (a window cut short by a restore is never stored), the launcher's loop each
turn, and the CLI before it exits.

A Ray worker runs its trials with no signal of its own: the driver that stops marks each of its
GPUs ``closing`` on disk, and the worker ``watch``es that mark, so that its running trial stops
at the next ``check`` too (kernel calls check after each chunk, about 1/32 of a window), its GPU
is put back and nothing of it is stored, instead of running to its end (a 20 s trial outlived
the driver's 15 s wait for its worker, which was then killed with the GPU still set).

A second signal while the command stops raises nothing (it would cut the restores short): it says
what the command is waiting for and how to force it; a third forces it (``os._exit``), and the
GPUs whose restore had not finished stay in the journal, for ``dvfs restore`` or the next sweep.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM)
NAMES = {signal.SIGINT: "SIGINT", signal.SIGTERM: "SIGTERM"}

_received: int | None = None  # the first signal this command received
_count = 0  # signals received since then
_depth = 0  # nested ``handling`` blocks (only the outermost installs and forgets)
_deferring = 0  # nested ``deferred`` blocks: a first signal is recorded, raised at their end
_watch: Callable[[], str | None] | None = None  # a worker's stop request ("why"), or None
_watch_every_s = 0.0
_watch_next = 0.0  # time.monotonic() of the watch's next look

STOPPING = (
    "dvfs: already stopping: each running trial ends and its GPU is put back first. "
    "Press Ctrl-C again to stop at once: a GPU not yet put back stays as the trial set it, "
    "listed in the journal, until `dvfs restore` (or the next `dvfs sweep`) puts it back.\n"
)
FORCED = (
    "dvfs: stopped at once; run `dvfs restore` to put back any GPU the journal still lists.\n"
)


@contextlib.contextmanager
def handling() -> Iterator[None]:
    """Route SIGINT and SIGTERM to ``KeyboardInterrupt`` for one command, and after it put the
    previous handlers back and forget its signal (code that runs later in the process, a test's
    next trial, is not stopped by it). Re-entrant: a nested block (``dvfs sweep`` inside the
    CLI's) changes nothing. Outside the main thread, a no-op."""
    global _depth, _received, _count
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = install() if _depth == 0 else None
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if previous is not None:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            _received, _count = None, 0


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """A step that must not be cut in the middle: a signal inside it is recorded, and raised
    when it ends. ``ray.init`` is one: interrupted after it started Ray's processes but before
    this process joined them, the process dies of SIGSEGV at exit (seen 3 times in 15 Ctrl-Cs
    sent 4.5-7 s into ``dvfs sweep -m``), instead of exiting 130."""
    global _deferring
    _deferring += 1
    try:
        yield
    finally:
        _deferring -= 1
    if _deferring == 0:
        check()


def install() -> dict[int, Any]:
    """Route SIGINT and SIGTERM to this module's handler for a new command (an earlier command's
    signal is forgotten); returns the handlers it replaced."""
    global _received, _count
    _received, _count = None, 0
    return {signum: signal.signal(signum, _on_signal) for signum in SIGNALS}


def check() -> None:
    """Raise ``KeyboardInterrupt`` if a signal arrived (in case the handler's own was dropped) or
    the watched stop request is there (at most one look per ``every_s``: a chunk of kernel calls
    on an H200 can be a millisecond, and a look at a file ~3 us)."""
    global _watch_next
    stop = stopped()
    if stop is not None:
        raise stop
    if _watch is not None and time.monotonic() >= _watch_next:
        _watch_next = time.monotonic() + _watch_every_s
        why = _watch()
        if why:
            raise KeyboardInterrupt(why)


@contextlib.contextmanager
def watch(stop_requested: Callable[[], str | None], every_s: float = 0.05) -> Iterator[None]:
    """While the block runs, ``check`` also raises ``KeyboardInterrupt(why)`` once
    ``stop_requested()`` returns a reason (a worker's: its driver marked the GPU closing)."""
    global _watch, _watch_every_s, _watch_next
    saved = _watch, _watch_every_s
    _watch, _watch_every_s, _watch_next = stop_requested, every_s, 0.0
    try:
        yield
    finally:
        _watch, _watch_every_s = saved


def stopped() -> KeyboardInterrupt | None:
    """The ``KeyboardInterrupt`` to raise for the signal this command received (None: none), for
    a caller that found it turned into another exception (``raise stop from e``)."""
    return None if _received is None else KeyboardInterrupt(NAMES[_received])


def received() -> int | None:
    """The first signal (``signal.SIGINT`` or ``SIGTERM``) this command received, or None."""
    return _received


def terminated() -> bool:
    """True once this command has received SIGTERM first."""
    return _received == signal.SIGTERM


def exit_code() -> int:
    """The exit code of a command stopped by its signal: 130 for SIGINT, 143 for SIGTERM."""
    return 128 + (_received or signal.SIGINT)


def _on_signal(signum: int, frame: Any) -> None:
    global _received, _count
    _count += 1
    if _received is None:
        _received = signum
        if _deferring:
            return  # raised when the step ends (``deferred``)
        raise KeyboardInterrupt(NAMES[signum])
    # While stopping: raising again would cut a restore short. os.write, not print: the signal
    # may have landed inside a print to stderr, which is not re-entrant.
    if _count == 2:
        os.write(2, STOPPING.encode())
    else:
        os.write(2, FORCED.encode())
        os._exit(exit_code())
