"""Constants the tests share (imported as ``support``; ``tests/`` is on pytest's pythonpath)."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DVFS = [sys.executable, "-m", "orchestrator.cli"]
