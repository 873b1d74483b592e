"""The energy/time Pareto front of a sweep.

A setting is on the front of its group when no other setting of the group is at least as good
in both time per iteration and energy per iteration and strictly better in one: the settings a
user might rationally choose, depending on how much time they will trade for joules. Both axes
are per unit of work (one iteration of the kernel), so the front compares like with like within
a group (:data:`analysis.DEFAULT_GROUP`).

Only points that ran correctly and were measured validly (``status == "ok"`` and
``valid == True``) may be on the front; every other row is kept and says why it was left out.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from analysis._frame import (
    DEFAULT_GROUP,
    exclusion_reasons,
    group_positions,
    numeric,
    require_columns,
)


def front_mask(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The non-dominated points of a set, minimising both coordinates, in O(n log n).

    Point q dominates p when ``q.x <= p.x`` and ``q.y <= p.y`` and one of them is strict. Equal
    points do not dominate each other, so duplicates on the front are all on it.

    Args:
        x: Finite first coordinates.
        y: Finite second coordinates, of the same length.

    Returns:
        A boolean array: True where the point is on the front.
    """
    n = len(x)
    on = np.zeros(n, dtype=bool)
    if n == 0:
        return on
    order = np.lexsort((y, x))  # by x, then y
    xs, ys = x[order], y[order]
    first = np.r_[True, xs[1:] != xs[:-1]]  # the first point of each run of equal x
    run = np.cumsum(first) - 1
    run_min_y = ys[first]  # sorted by y within a run: its first point has the run's least y
    best_before = np.r_[np.inf, np.minimum.accumulate(run_min_y)[:-1]]  # least y at smaller x
    # On the front: the least y of its x, and strictly below every point with a smaller x.
    on[order] = (ys == run_min_y[run]) & (run_min_y[run] < best_before[run])
    return on


def pareto_front(
    df: pd.DataFrame,
    x: str = "time_per_iter_s",
    y: str = "energy_per_iter_j",
    by: Sequence[str] | None = DEFAULT_GROUP,
) -> pd.DataFrame:
    """Marks the non-dominated points of each group, minimising ``x`` and ``y``.

    Args:
        df: Trial rows, or settings from :func:`analysis.aggregate_repeats`.
        x: The first objective (default: seconds per iteration).
        y: The second objective (default: joules per iteration).
        by: The grouping columns; None or [] for one front over every row.

    Returns:
        Every input row, in the input order and index, with two more columns: ``on_front``
        (bool) and ``front_excluded_reason`` (None for a candidate, else why the row could not
        be on the front: ``"status=wrong"``, ``"invalid: <why>"``, ``"missing <column>"``).
    """
    by = list(by or [])
    require_columns(df, [x, y, *by], "pareto_front")
    reasons = exclusion_reasons(df, needed=[x, y])
    xs, ys = numeric(df[x]), numeric(df[y])
    on_front = np.zeros(len(df), dtype=bool)
    candidate = reasons.isna().to_numpy()
    for _, pos in group_positions(df, by):
        pos = pos[candidate[pos]]
        on_front[pos] = front_mask(xs[pos], ys[pos])
    out = df.copy()
    out["on_front"] = on_front
    out["front_excluded_reason"] = reasons
    return out
