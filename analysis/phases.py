"""Where a sweep's wall time went: its windows against everything else a trial does.

The physical limit of a sweep is the sum of its windows (and the check runs its checks need);
every other second (building kernels, applying settings, warm-up, waiting for the energy
counter's edges, comparing outputs, restoring the device) is overhead. Each row carries its
phases' wall time (``phase_<name>_s``, ``orchestrator.measuring.phases.PHASES``: a trial's own
phases on its first repeat, the restore on its last) and their sum ``wall_s``, so summing rows sums
trials. Rows stored before the columns existed have none; a sweep of such rows is left out.
"""

from __future__ import annotations

import pandas as pd

from orchestrator.measuring.phases import PHASES

COLUMNS = [f"phase_{name}_s" for name in PHASES]
_OUT = ["sweep_id", "trials", "wall_s", *COLUMNS, "efficiency", "biggest_other",
        "biggest_other_s"]


def sweep_phases(df: pd.DataFrame) -> pd.DataFrame:
    """Per sweep: its trials, wall time, each phase's total, and the windows' share of the time.

    Args:
        df: trial rows (:func:`analysis.load`).

    Returns:
        One row per ``sweep_id`` with timed rows: ``trials``, ``wall_s`` (the trials' summed wall
        time), ``phase_<name>_s`` totals, ``efficiency`` (the windows' share of ``wall_s``), and
        ``biggest_other`` / ``biggest_other_s``: the largest phase that is not the window. Empty
        when no row carries phase times.
    """
    if "wall_s" not in df:
        return pd.DataFrame(columns=_OUT)
    timed = df[pd.to_numeric(df["wall_s"], errors="coerce").notna()]
    out = []
    for sweep, rows in timed.groupby("sweep_id", sort=True):
        totals = {c: float(pd.to_numeric(rows[c], errors="coerce").fillna(0).sum())
                  for c in COLUMNS}
        wall = float(pd.to_numeric(rows["wall_s"], errors="coerce").sum())
        others = {c: v for c, v in totals.items() if c != "phase_window_s"}
        biggest = max(others, key=others.get)
        out.append({
            "sweep_id": sweep, "trials": int(rows["trial_key"].nunique()), "wall_s": wall,
            **totals,
            "efficiency": totals["phase_window_s"] / wall if wall > 0 else float("nan"),
            "biggest_other": biggest.removeprefix("phase_").removesuffix("_s"),
            "biggest_other_s": others[biggest],
        })
    return pd.DataFrame(out, columns=_OUT)
