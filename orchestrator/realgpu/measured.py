"""Real-GPU measurements as data: the folders of ``data/measured/``, loaded as trial rows.

Each folder is one run on real hardware: ``provenance.yaml`` says which board, driver, libraries,
preset and command, and whether the rows are the run's raw output or were rebuilt from what it
printed; ``rows.jsonl`` holds one trial row per line, with the fields a results store holds (a
rebuilt row has fewer). The simulated GPU is judged against these rows
(``scripts/sim_vs_real.py``), and a lease's check adds a folder in the same format.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from orchestrator.errors import UserError

PROVENANCE_KEYS = ("board", "profile", "driver", "libraries", "preset", "date", "command")
ROW_KEYS = ("trial_key", "repeat", "workload", "framework", "device_name", "time_per_iter_s",
            "avg_power_w", "energy_per_iter_j", "observed_sm_clock_mhz", "status")


def measured_dir() -> Path:
    """The project's folder of real-GPU runs (``data/measured``)."""
    return Path(__file__).resolve().parents[2] / "data" / "measured"


@dataclass(frozen=True)
class MeasuredRun:
    """One run on real hardware: where it is, what it was, and its rows."""

    path: Path
    provenance: dict[str, Any]
    rows: list[dict[str, Any]]

    @property
    def rebuilt(self) -> bool:
        """The rows were rebuilt from printed figures, not stored by the run itself."""
        return bool(self.provenance.get("rebuilt"))


def load(path: str | Path) -> MeasuredRun:
    """One run's folder, checked: its provenance names every key of ``PROVENANCE_KEYS`` and each
    row every key of ``ROW_KEYS``.

    Raises:
        UserError: a file is missing or malformed, or a key is missing (the message names it).
    """
    path = Path(path)
    try:
        provenance = yaml.safe_load((path / "provenance.yaml").read_text())
        lines = (path / "rows.jsonl").read_text().splitlines()
        rows = [json.loads(line) for line in lines if line.strip()]
    except (OSError, yaml.YAMLError, json.JSONDecodeError) as e:
        raise UserError(f"{path}: not a measured run ({type(e).__name__}: {e})") from None
    if not isinstance(provenance, dict):
        raise UserError(f"{path}/provenance.yaml: expected a mapping")
    missing = [k for k in PROVENANCE_KEYS if k not in provenance]
    if missing:
        raise UserError(f"{path}/provenance.yaml: missing {', '.join(missing)}")
    for i, row in enumerate(rows, 1):
        lacking = [k for k in ROW_KEYS if k not in row]
        if lacking:
            raise UserError(f"{path}/rows.jsonl line {i}: missing {', '.join(lacking)}")
    return MeasuredRun(path, provenance, rows)


def runs(root: str | Path | None = None) -> list[MeasuredRun]:
    """Every run under ``root`` (default: the project's ``data/measured``), oldest first."""
    root = measured_dir() if root is None else Path(root)
    return [load(p) for p in sorted(root.iterdir()) if (p / "provenance.yaml").is_file()]


def into_store(run: MeasuredRun, store_dir: str | Path) -> int:
    """Put a run's rows into the results store at ``store_dir`` (made if absent); returns how
    many were new. ``dvfs report`` reads the store as it reads a sweep's."""
    from orchestrator.results.store import ResultStore

    with ResultStore(Path(store_dir)) as store:
        return sum(store.put(row) for row in run.rows)
