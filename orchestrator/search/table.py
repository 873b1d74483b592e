"""The stability sweeper's results: the ``thresholds`` table, and which phase asked each trial.

One row per search (a GPU x a group of overrides), in the one ``thresholds.csv`` schema
(:data:`analysis.thresholds.COLUMNS`, which ``dvfs report`` writes too): ``stable_value`` is the
lowest stable clock or power limit (the highest stable offset), set only once confirmed with
``n`` clean iterations; ``failing_value`` the highest failing clock or power (the lowest failing
offset). The columns only the analysis of every stored trial knows
(``excluded_invalid_trials``, ``trials_without_clock``) are empty here.

The table goes to ``thresholds.csv`` in the sweep directory and to the store's ``thresholds``
meta item; the store's ``search_trials`` meta item maps each trial key to its phase, which is how
``analysis.thresholds`` learns the search's roles (``roles=``). Units: the setting's (``unit``).
"""

from __future__ import annotations

import csv
import json
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from analysis.thresholds import COLUMNS
from orchestrator.search.algorithm import CONFIDENCE
from orchestrator.search.space import SearchOptions

if TYPE_CHECKING:
    from orchestrator.search.plan import Target

THRESHOLDS_CSV = "thresholds.csv"
"""The thresholds table's file name in the sweep directory."""

SEARCH_TRIALS_META = "search_trials"
"""The store's meta item that maps each trial key of a stability sweep to its search phase."""

_IDENTITY = ("workload", "framework", "dtype", "precision")


def thresholds_table(targets: Sequence[Target], options: SearchOptions) -> list[dict[str, Any]]:
    """One row per search, every column of :data:`analysis.thresholds.COLUMNS`."""
    setting = options.ordered
    rows = []
    for t in targets:
        result = vars(t.search.result())
        roles = Counter(probe.role for probe, _ in t.search.history)
        row = {
            "device_index": t.gpu.index,
            "device_uuid": t.gpu.uuid,
            "device_name": t.gpu.name,
            **{k: t.labels.get(k) for k in _IDENTITY},
            "group": t.group_label or None,
            "setting": setting.key,
            "unit": setting.unit,
            "riskier": setting.riskier,
            "confidence": CONFIDENCE,
            "confirm_iterations": options.confirm_iterations,
            "search_roles": ", ".join(f"{r}×{n}" for r, n in sorted(roles.items())) or None,
        }
        rows.append({k: row[k] if k in row else result.get(k) for k in COLUMNS})
    return rows


def write_thresholds(
    store_dir: str | Path, rows: list[dict[str, Any]], options: SearchOptions, trials: int
) -> Path:
    """Write the table to ``thresholds.csv`` and to the store's ``thresholds`` meta item.

    The CSV is written to a temporary file and renamed, so a reader never sees half a table.

    Returns:
        The CSV file written.
    """
    from orchestrator.results.store import ResultStore

    path = Path(store_dir) / THRESHOLDS_CSV
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".csv.tmp")
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows({k: ("" if v is None else v) for k, v in r.items()} for r in rows)
    tmp.replace(path)
    with ResultStore(store_dir) as store:
        store.put_meta(
            "thresholds",
            {
                "sweeper": "stability",
                "options": json.loads(json.dumps(options.__dict__)),
                "confidence": CONFIDENCE,
                "trials": trials,
                "rows": rows,
            },
        )
    return path


def record_trials(store_dir: str | Path, trials: Mapping[str, Mapping[str, Any]]) -> None:
    """Add trials to the store's ``search_trials`` meta item (trial key -> role, attempt, value...).

    The rows themselves are the trial's own; this item is how ``analysis.thresholds`` learns
    which phase of the search asked for each (``roles=``).
    """
    from orchestrator.results.store import ResultStore

    with ResultStore(store_dir) as store:
        item = store.get_meta(SEARCH_TRIALS_META) or {"trials": {}}
        item["trials"].update({k: dict(v) for k, v in trials.items()})
        item["roles"] = {k: v["role"] for k, v in item["trials"].items()}
        store.put_meta(SEARCH_TRIALS_META, item)


def describe(row: Mapping[str, Any], label: str) -> str:
    """One line of the report for one row of the table."""
    unit, key = row["unit"], str(row["setting"]).split(".", 1)[1]

    def v(x: Any) -> str:
        return f"{x:g} {unit}"

    failing = ""
    if row["failing_value"] is not None:
        failing = (f"; fails at {v(row['failing_value'])} ({row['failure_statuses']} in "
                   f"{row['trials_at_failing']} trial(s))")
    if row["stable_value"] is not None:
        head = (
            f"{key} stable at {v(row['stable_value'])}: {row['iterations_at_stable']} clean "
            f"iterations in {row['trials_at_stable']} trial(s), fault rate < "
            f"{row['fault_rate_bound']:.2g}/iteration ({CONFIDENCE:.0%})"
        )
    elif row["candidate_value"] is not None:
        head = (f"{key} unconfirmed at {v(row['candidate_value'])} "
                f"({row['iterations_at_stable']} clean iterations)")
    else:
        head = f"{key}: no stable value"
    tail = f"; {row['trials_used']} trials (a grid: {row['grid_size']})"
    note = f"; {row['note']}" if row["note"] else ""
    return f"stability: {label} {row['device_uuid']}: {head}{failing}{tail}{note}"
