"""Two values of one column side by side, setting by setting: JAX vs TensorFlow, one GPU vs another.

Settings are matched within a group (same workload, size, ..., and the same asked clocks and
limits); only settings usable on both sides count. For each matched setting the ratio of the
medians ``a / b`` is taken; the difference is *beyond spread* when the two repeat ranges do not
overlap. That is a weak test with few repeats: with no real difference, two ranges of ``n_a`` and
``n_b`` repeats come out disjoint by chance with probability ``2 n_a! n_b! / (n_a + n_b)!`` (1/3
for 2 and 2, 1/10 for 3 and 3), given as ``p_chance``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from analysis._frame import (
    DEFAULT_GROUP,
    SETTING_COLUMNS,
    exclusion_reasons,
    group_positions,
    require_columns,
)
from analysis.recommend import SPREAD_METRICS, aggregate_repeats, beyond_spread
from orchestrator.errors import UserError

DETAIL_COLUMNS = ["metric", "a", "b", "a_median", "b_median", "ratio", "a_min", "a_max", "b_min",
                  "b_max", "n_a", "n_b", "beyond_spread", "p_chance", "significant"]
"""The columns of a per-setting comparison, after the group and setting columns."""
SUMMARY_COLUMNS = ["metric", "a", "b", "n_settings", "median_ratio", "min_ratio", "max_ratio",
                   "n_beyond_spread", "n_judged", "p_chance", "significant"]
"""The columns of a per-group comparison, after the group columns."""


def compare(
    df: pd.DataFrame,
    a: object,
    b: object,
    on: str = "framework",
    *,
    by: Sequence[str] | None = None,
    metrics: Sequence[str] = SPREAD_METRICS,
    per_setting: bool = False,
) -> pd.DataFrame:
    """Compares two values of one column (JAX vs TensorFlow, one GPU vs another) setting by setting.

    See the module docstring for how settings are matched and judged; ``significant`` is True
    when the ranges are disjoint and ``p_chance <= 0.05``.

    Args:
        df: Trial rows.
        a: The value of ``on`` in the numerator (e.g. ``"jax"``).
        b: The value of ``on`` in the denominator (e.g. ``"tensorflow"``).
        on: The column that tells the two sides apart.
        by: The grouping columns; default :data:`DEFAULT_GROUP` without ``on``.
        metrics: The columns compared.
        per_setting: Return one row per matched setting instead of one per group.

    Returns:
        Per group and metric (``per_setting=False``): ``n_settings`` matched, ``median_ratio``,
        ``min_ratio``, ``max_ratio`` (of ``a / b``), ``n_beyond_spread``, ``n_judged`` (settings
        with two or more repeats a side), ``p_chance`` and ``significant``: True when every
        judged setting is beyond spread in the same direction and the chance of that with no
        real difference, ``2 * prod(p_i / 2)`` over the judged settings (taken as independent),
        is at most 0.05; False otherwise; NA when no setting could be judged. Per setting: the
        setting columns, ``a_median``, ``b_median``, their ranges and repeat counts, ``ratio``,
        ``beyond_spread``, ``p_chance`` and ``significant``.

    Raises:
        UserError: no trial has either value of ``on``.
    """
    by = [c for c in (DEFAULT_GROUP if by is None else by) if c != on]
    require_columns(df, [on, *by], "compare")
    agg = aggregate_repeats(df[df[on].isin([a, b])], [*by, on])
    if not len(agg):
        raise UserError(f"compare: no trials with {on} = {a!r} or {b!r}")
    agg = agg[exclusion_reasons(agg, needed=list(metrics)).isna().to_numpy()]
    match = [*by, *SETTING_COLUMNS]
    rows: list[dict] = []
    for key, pos in group_positions(agg, match):
        sub = agg.iloc[pos]
        sa, sb = sub[sub[on] == a], sub[sub[on] == b]
        if len(sa) and len(sb):
            rows.extend({**key, **_matched(sa.iloc[0], sb.iloc[0], m, a, b)} for m in metrics)
    detail = pd.DataFrame(rows, columns=[*match, *DETAIL_COLUMNS])
    if per_setting:
        return detail
    summary = [{**key, **_summarise(detail.iloc[pos], a, b)}
               for key, pos in group_positions(detail, [*by, "metric"])]
    return pd.DataFrame(summary, columns=[*by, *SUMMARY_COLUMNS])


def _matched(ra: pd.Series, rb: pd.Series, m: str, a: object, b: object) -> dict:
    """One metric of one matched setting: the two medians, their ratio, and whether it is noise."""
    na, nb = int(ra["n_usable"]), int(rb["n_usable"])
    p_chance = 2.0 * math.factorial(na) * math.factorial(nb) / math.factorial(na + nb)
    beyond = pd.NA
    if f"{m}_min" in ra.index:
        beyond = beyond_spread(float(ra[f"{m}_min"]), float(ra[f"{m}_max"]),
                               float(rb[f"{m}_min"]), float(rb[f"{m}_max"]), na, nb)
    return {
        "metric": m, "a": a, "b": b,
        "a_median": ra[m], "b_median": rb[m], "ratio": ra[m] / rb[m],
        "a_min": ra.get(f"{m}_min"), "a_max": ra.get(f"{m}_max"),
        "b_min": rb.get(f"{m}_min"), "b_max": rb.get(f"{m}_max"),
        "n_a": na, "n_b": nb, "beyond_spread": beyond,
        "p_chance": p_chance if beyond is not pd.NA else math.nan,
        "significant": pd.NA if beyond is pd.NA else bool(beyond and p_chance <= 0.05),
    }


def _summarise(sub: pd.DataFrame, a: object, b: object) -> dict:
    """One group's matched settings of one metric, reduced to ratios and one verdict."""
    ratio = sub["ratio"].to_numpy(dtype=float)
    judged = [(bool(s), float(p), r) for s, p, r in
              zip(sub["beyond_spread"], sub["p_chance"], ratio) if s is not pd.NA]
    p_group = math.nan
    if not judged:
        significant: object = pd.NA
    elif all(s for s, _, _ in judged) and len({r > 1 for _, _, r in judged}) == 1:
        # Every judged setting separated, all the same way: by chance (independent settings,
        # no real difference) each does so in a given direction with probability p_i / 2.
        p_group = 2.0 * math.prod(p / 2.0 for _, p, _ in judged)
        significant = bool(p_group <= 0.05)
    else:
        significant = False
    return {
        "a": a, "b": b, "n_settings": len(sub),
        "median_ratio": float(np.median(ratio)), "min_ratio": float(ratio.min()),
        "max_ratio": float(ratio.max()),
        "n_beyond_spread": int(sum(v is True for v in sub["beyond_spread"])),
        "n_judged": len(judged), "p_chance": p_group, "significant": significant,
    }
