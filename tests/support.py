"""What the tests share (imported as ``support``; ``tests/`` is on pytest's pythonpath)."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DVFS = [sys.executable, "-m", "orchestrator.cli"]


def sim_slot(index: int, selections: set[str] | None = None, actor: object = None):
    """A pool slot for simulated GPU ``index`` (``GPU-<index>``), as its worker's identify makes
    it; no Ray."""
    from orchestrator.devices.base import DeviceIdentity
    from orchestrator.slot import Slot
    from orchestrator.worker import WorkerInfo

    uuid = f"GPU-{index}"
    identity = DeviceIdentity(index, uuid, f"00000000:0{index}:00.0", "A100", "ampere", "550",
                              "sim")
    info = WorkerInfo(uuid, identity, str(index), None, "host", 100 + index)
    return Slot(info, actor=actor, selections=selections)
