"""SIGTERM, for a ``dvfs`` command, is an interrupt like Ctrl-C.

``install`` makes SIGTERM raise ``KeyboardInterrupt`` in the main thread, so that every
``finally`` runs: the guard and the pool of workers restore the GPUs, the store keeps every
finished trial. A library on the way up may turn that exception into another one (a SIGTERM that
lands inside Hydra's config composition comes out as a config error), so ``terminated`` says
whether one arrived, and whoever turns exceptions into messages asks it first.
"""

from __future__ import annotations

import signal
from typing import Any

_received = False


def install() -> Any:
    """Route SIGTERM to ``KeyboardInterrupt``; returns the handler it replaced."""
    return signal.signal(signal.SIGTERM, _on_sigterm)


def terminated() -> bool:
    """True once this process has received SIGTERM."""
    return _received


def _on_sigterm(signum: int, frame: Any) -> None:
    global _received
    _received = True
    raise KeyboardInterrupt("SIGTERM")
