"""SIGTERM, for a ``dvfs`` command, is an interrupt like Ctrl-C.

``install`` makes SIGTERM raise ``KeyboardInterrupt`` in the main thread, so that every
``finally`` runs: the guard and the pool of workers restore the GPUs, the store keeps every
finished trial. A library on the way up may turn that exception into another one (a SIGTERM that
lands inside Hydra's config composition comes out as a config error), so ``terminated`` says
whether one arrived, and whoever turns exceptions into messages asks it first.

Python drops the exception when the signal lands in a garbage-collector callback or a
``__del__`` (it prints "Exception ignored in: <function _xla_gc_callback ...>" and goes on: seen
when JAX's callback was running), so a SIGTERM could be lost while the guard had already put the
GPU back mid-trial. Long loops therefore ``check`` between steps: each trial before it starts and
before it returns its rows (a window cut short by a restore is never stored), and the launcher's
loop.
"""

from __future__ import annotations

import signal
from typing import Any

_received = False


def install() -> Any:
    """Route SIGTERM to ``KeyboardInterrupt`` for a new command (an earlier command's SIGTERM
    is forgotten); returns the handler it replaced."""
    global _received
    _received = False
    return signal.signal(signal.SIGTERM, _on_sigterm)


def check() -> None:
    """Raise ``KeyboardInterrupt`` if SIGTERM arrived, in case the handler's own was dropped."""
    if _received:
        raise KeyboardInterrupt("SIGTERM")


def terminated() -> bool:
    """True once this process has received SIGTERM."""
    return _received


def _on_sigterm(signum: int, frame: Any) -> None:
    global _received
    _received = True
    raise KeyboardInterrupt("SIGTERM")
