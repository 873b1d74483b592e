"""Boards side by side: each GPU model at its own best setting, computation by computation.

Two boards seldom share a setting (an A100's SM clock tops out at 1410 MHz, an H100's at 1980
MHz, and their power caps differ), so :func:`analysis.compare`, which matches settings, says
little about which board does a computation for less. Here each board is taken at the setting
that is best *on it* for the sweep's objective (``objective`` in the trials' configs: least
energy per iteration unless the sweep asked for time, EDP or ED²P), among its usable settings
(every repeat ok and valid), and the boards of one computation (workload, size, dtype, precision,
framework) are set side by side: time and energy per iteration (one iteration is the same work on
every board), each also as a ratio to the best of those boards.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from analysis._frame import (
    DEFAULT_GROUP,
    SETTING_COLUMNS,
    exclusion_reasons,
    group_positions,
    is_missing,
    numeric,
)
from analysis.recommend import ENERGY, SPREAD_METRICS, TIME, as_settings
from orchestrator.errors import UserError

COMPUTATION = [c for c in DEFAULT_GROUP if c != "device_name"]
"""What two boards must share to be compared: the same computation."""

OBJECTIVES: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "energy_per_work": lambda t, e: e,
    "time_per_work": lambda t, e: t,
    "edp": lambda t, e: e * t,
    "ed2p": lambda t, e: e * t * t,
}
"""A sweep's objective (``config.OBJECTIVES``) as the score of a setting: lower is better."""

CARRIED = ["avg_power_w", "observed_sm_clock_mhz", "n_repeats"]
BOARD_COLUMNS = [*COMPUTATION, "device_name", "objective", *SETTING_COLUMNS, TIME, ENERGY,
                 *CARRIED, "n_settings", "time_vs_best", "energy_vs_best"]
"""The columns of :func:`compare_boards`."""


def sweep_objective(df: pd.DataFrame) -> str:
    """The objective the trials' configs name (``energy_per_work`` when they name none, or
    several)."""
    named = {c.get("objective") for c in df.get("config", pd.Series(dtype=object))
             if isinstance(c, dict)}
    named.discard(None)
    if len(named) == 1 and next(iter(named)) in OBJECTIVES:
        return str(named.pop())
    return "energy_per_work"


def compare_boards(df: pd.DataFrame, objective: str | None = None) -> pd.DataFrame:
    """Each board (``device_name``) at its best setting, per computation run on two or more.

    Args:
        df: Trial rows, or settings (:func:`analysis.aggregate_repeats`).
        objective: One of :data:`OBJECTIVES`; default :func:`sweep_objective` of ``df``.

    Returns:
        One row per computation and board, in :data:`BOARD_COLUMNS`: the board's best setting
        (its setting columns), its median time and energy per iteration there, mean power and
        observed SM clock, how many usable settings it had (``n_settings``), and
        ``time_vs_best`` and ``energy_vs_best``: its time and energy over the least among the
        computation's boards (1.0: the best board). Empty when the rows hold fewer than two
        boards, or no computation ran usable settings on two.

    Raises:
        UserError: an unknown objective.
    """
    objective = objective or sweep_objective(df)
    if objective not in OBJECTIVES:
        raise UserError(f"objective {objective!r} is not one of: {', '.join(OBJECTIVES)}")
    empty = pd.DataFrame(columns=BOARD_COLUMNS)
    if "device_name" not in df or df["device_name"].nunique(dropna=True) < 2:
        return empty
    settings = as_settings(df)
    usable = settings[exclusion_reasons(settings, needed=SPREAD_METRICS).isna().to_numpy()]
    score = OBJECTIVES[objective](numeric(usable[TIME]), numeric(usable[ENERGY]))
    rows = []
    for key, pos in group_positions(usable, [*COMPUTATION, "device_name"]):
        if is_missing(key["device_name"]):
            continue
        best = usable.iloc[pos[int(np.argmin(score[pos]))]]
        rows.append({**key, "objective": objective,
                     **{c: best.get(c) for c in [*SETTING_COLUMNS, TIME, ENERGY, *CARRIED]},
                     "n_settings": len(pos)})
    out = pd.DataFrame(rows, columns=BOARD_COLUMNS[:-2])
    parts = []
    for _, pos in group_positions(out, COMPUTATION):
        sub = out.iloc[pos]
        if len(sub) < 2:
            continue
        t, e = numeric(sub[TIME]), numeric(sub[ENERGY])
        parts.append(sub.assign(time_vs_best=t / t.min(), energy_vs_best=e / e.min()))
    return pd.concat(parts, ignore_index=True)[BOARD_COLUMNS] if parts else empty
