"""Repeats and recommended settings (comparisons are :mod:`analysis.compare`'s).

Everything here works on *settings*: the repeats of one setting of one group are first reduced to
their median and range by :func:`aggregate_repeats`, because a setting chosen on one lucky repeat
is noise, not a recommendation.

A recommendation is measured against the group's *baseline*: the trial run at the device's default
setting (``default_setting == True``: nothing asked), or, in a group without one, the setting with
the highest SM clock (the ``baseline`` column says which). ``saving_pct`` is the energy per
iteration saved against the baseline, ``slowdown_pct`` the time per iteration lost, both in percent
of the baseline's value.

Energy-delay products are per iteration: ``edp_js`` = J x s, ``ed2p_js2`` = J x s².
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

import numpy as np
import pandas as pd

from analysis._frame import (
    DEFAULT_GROUP,
    SETTING_COLUMNS,
    exclusion_reasons,
    group_positions,
    is_missing,
    numeric,
    require_columns,
    truthy,
    with_columns,
    worst_status,
)
from orchestrator.errors import UserError

TIME = "time_per_iter_s"
ENERGY = "energy_per_iter_j"
SPREAD_METRICS = (TIME, ENERGY)
# Other numbers carried per setting, with how repeats are reduced.
_REDUCE = {
    "observed_sm_clock_mhz": "median",
    "avg_power_w": "median",
    "peak_power_w": "max",
    "temperature_c": "max",
    "throughput": "median",
    "tflops": "median",
    "gbps": "median",
    "energy_j": "median",
    "time_s": "median",
    "energy_per_tflop_j": "median",
    "energy_per_gb_j": "median",
    "rel_error": "max",
    "iterations": "sum",
    "rate": "median",
    "energy_per_item_j": "median",
    "peak_memory_bytes": "max",
    "peak_memory_per_item_bytes": "max",
}
OBJECTIVES = ("baseline", "min_energy", "min_edp", "min_ed2p", "min_energy_within_slowdown")


def _join_unique(values: Sequence[object]) -> object:
    seen = list(dict.fromkeys(str(v) for v in values if not is_missing(v)))
    return None if not seen else seen[0] if len(seen) == 1 else ", ".join(seen)


def _reduce(values: np.ndarray, how: str) -> float:
    v = values[np.isfinite(values)]
    if not len(v):
        return math.nan
    return float({"median": np.median, "max": np.max, "sum": np.sum, "min": np.min}[how](v))


def aggregate_repeats(
    df: pd.DataFrame, by: Sequence[str] = DEFAULT_GROUP, settings: Sequence[str] = SETTING_COLUMNS
) -> pd.DataFrame:
    """Reduces the repeats of each setting to one row: medians and spread.

    A setting is ``ok`` only if every repeat is ``ok`` (else it takes the most severe status
    seen), and ``valid`` only if every repeat is valid: one wrong result at a clock is enough to
    make it no recommendation. Medians and ranges are taken over the usable repeats (ok, valid,
    measured); a setting with none takes them over whatever repeats have numbers, so a failed
    setting can still be drawn.

    Args:
        df: Trial rows (from :func:`analysis.load`).
        by: The grouping columns.
        settings: The columns that make a setting within a group.

    Returns:
        One row per (group, setting): the ``by`` and ``settings`` columns; ``n_repeats`` and
        ``n_usable``; ``status``, ``status_counts`` (e.g. ``"ok×2, wrong×1"``), ``valid``,
        ``invalid_reason``, ``error``; ``time_per_iter_s`` and ``energy_per_iter_j`` (medians)
        with ``_min`` and ``_max`` (their range); medians (max for peak power, temperature and
        error, sum for iterations) of the other measured columns; ``device_uuid``
        (comma-joined when several GPUs), ``n_devices`` and ``sweep_dir``.
    """
    by = list(by)
    require_columns(df, by, "aggregate_repeats")
    df = with_columns(df, [*settings, "status", "valid", "invalid_reason", "error", "device_uuid",
                           "sweep_dir", *SPREAD_METRICS, *_REDUCE])
    usable = exclusion_reasons(df, needed=SPREAD_METRICS).isna().to_numpy()
    valid = truthy(df["valid"])
    nums = {c: numeric(df[c]) for c in (*SPREAD_METRICS, *_REDUCE)}
    out = [_setting_row(df, key, pos, usable, valid, nums)
           for key, pos in group_positions(df, [*by, *settings])]
    result = pd.DataFrame(out)
    if "default_setting" in result:
        result["default_setting"] = truthy(result["default_setting"])
    return result


def as_settings(df: pd.DataFrame, by: Sequence[str] = DEFAULT_GROUP) -> pd.DataFrame:
    """``df`` when its repeats are reduced already (it has ``n_repeats``), else
    :func:`aggregate_repeats` of it: what takes "trial rows or settings" starts here."""
    return df if "n_repeats" in df.columns else aggregate_repeats(df, by)


def _setting_row(df: pd.DataFrame, key: dict, pos: np.ndarray, usable_all: np.ndarray,
                 valid_all: np.ndarray, nums: dict[str, np.ndarray]) -> dict:
    """The one row of a setting: the repeats at row positions ``pos`` of ``df`` reduced."""
    usable = pos[usable_all[pos]]
    use = usable if len(usable) else pos
    statuses = [df["status"].iat[i] for i in pos]
    counts = Counter("missing" if is_missing(s) else str(s) for s in statuses)
    valid = bool(valid_all[pos].all())
    invalid = [i for i in pos if not valid_all[i]]
    reasons = _join_unique([df["invalid_reason"].iat[i] for i in invalid])
    row = dict(key)
    row.update(
        n_repeats=len(pos),
        n_usable=len(usable),
        status=worst_status(statuses),
        status_counts=", ".join(f"{s}×{n}" for s, n in sorted(counts.items())),
        valid=valid,
        invalid_reason=None if valid else
        f"{len(invalid)}/{len(pos)} repeats invalid: {reasons or 'no reason recorded'}",
        error=_join_unique([df["error"].iat[i] for i in pos]),
    )
    for m in SPREAD_METRICS:
        row[m] = _reduce(nums[m][use], "median")
        row[f"{m}_min"] = _reduce(nums[m][use], "min")
        row[f"{m}_max"] = _reduce(nums[m][use], "max")
    for c, how in _REDUCE.items():
        row[c] = _reduce(nums[c][use], how)
    uuids = [df["device_uuid"].iat[i] for i in pos]
    row["device_uuid"] = _join_unique(uuids)
    row["n_devices"] = len({u for u in uuids if not is_missing(u)})
    row["sweep_dir"] = _join_unique([df["sweep_dir"].iat[i] for i in pos])
    return row


def _pick(sub: pd.DataFrame, score: np.ndarray) -> int | None:
    """The position of the least finite score (None if none); ties go to the faster, then the
    higher-clocked setting."""
    if not len(sub):
        return None
    clock = numeric(sub["sm_clock_max_mhz"])
    order = np.lexsort((-np.nan_to_num(clock, nan=np.inf), numeric(sub[TIME]), score))
    return int(order[0]) if np.isfinite(score[order[0]]) else None


def _baseline(sub: pd.DataFrame, cand: np.ndarray) -> tuple[int | None, str]:
    """The baseline row position of a group and how it was chosen."""
    default = truthy(sub["default_setting"])
    usable_default = np.flatnonzero(default & cand)
    if len(usable_default):
        n = numeric(sub["n_repeats"])[usable_default]
        return int(usable_default[np.argmax(n)]), "default"
    candidates = np.flatnonzero(cand)
    clock = numeric(sub["sm_clock_max_mhz"])[candidates]
    if not len(candidates) or not np.isfinite(clock).any():
        return None, "none (no usable default or clocked trial)"
    top = candidates[clock == np.nanmax(clock)]
    best = top[np.argmin(numeric(sub[TIME])[top])]
    if default.any():
        failed = worst_status(sub["status"][default].tolist())
        return int(best), f"highest clock (default trial not usable: status={failed})"
    return int(best), "highest clock (no default trial)"


def beyond_spread(a_min: float, a_max: float, b_min: float, b_max: float,
                  n_a: int, n_b: int) -> object:
    """True if two ranges are disjoint, NA when either has fewer than two repeats."""
    if n_a < 2 or n_b < 2 or not all(map(np.isfinite, (a_min, a_max, b_min, b_max))):
        return pd.NA
    return bool(a_max < b_min or b_max < a_min)


def _picks(sub: pd.DataFrame, cand: np.ndarray, b: int | None,
           max_slowdown: float) -> dict[str, int | None]:
    """The row position each objective picks among the usable settings ``cand`` of a group."""
    t, e, inf = numeric(sub[TIME]), numeric(sub[ENERGY]), np.inf
    picks = {
        "baseline": b,
        "min_energy": _pick(sub, np.where(cand, e, inf)),
        "min_edp": _pick(sub, np.where(cand, e * t, inf)),
        "min_ed2p": _pick(sub, np.where(cand, e * t * t, inf)),
        "min_energy_within_slowdown": None,
    }
    if b is not None:
        allowed = cand & (t <= t[b] * (1.0 + max_slowdown))
        picks["min_energy_within_slowdown"] = _pick(sub, np.where(allowed, e, inf))
    return picks


def _objective_row(sub: pd.DataFrame, i: int, b: int | None, keep: Sequence[str]) -> dict:
    """The numbers of the setting at position ``i``, and its changes against baseline ``b``."""
    t, e = numeric(sub[TIME]), numeric(sub[ENERGY])
    r = sub.iloc[i]
    row = {c: r[c] for c in keep}
    row.update(
        time_per_iter_s=t[i], energy_per_iter_j=e[i],
        time_per_iter_s_min=r.get(f"{TIME}_min"), time_per_iter_s_max=r.get(f"{TIME}_max"),
        energy_per_iter_j_min=r.get(f"{ENERGY}_min"), energy_per_iter_j_max=r.get(f"{ENERGY}_max"),
        edp_js=e[i] * t[i], ed2p_js2=e[i] * t[i] ** 2,
        avg_power_w=r.get("avg_power_w"), n_repeats=r.get("n_repeats"),
        note=None,
    )
    if b is not None:
        rb = sub.iloc[b]
        row["saving_pct"] = 100.0 * (1.0 - e[i] / e[b])
        row["slowdown_pct"] = 100.0 * (t[i] / t[b] - 1.0)
        row["saving_beyond_spread"] = pd.NA if i == b else beyond_spread(
            float(r[f"{ENERGY}_min"]), float(r[f"{ENERGY}_max"]),
            float(rb[f"{ENERGY}_min"]), float(rb[f"{ENERGY}_max"]),
            int(r["n_repeats"]), int(rb["n_repeats"]))
    return row


def _group_recommendations(key: dict, sub: pd.DataFrame, by: Sequence[str],
                           max_slowdown: float) -> list[dict]:
    """The rows of one group: one per objective, or one row with a note when nothing is usable."""
    reasons = exclusion_reasons(sub, needed=SPREAD_METRICS)
    cand = reasons.isna().to_numpy()
    b, how = _baseline(sub, cand)
    if not cand.any():
        why = Counter(str(r) for r in reasons)
        return [{**key, "objective": None, "baseline": how,
                 "note": f"no usable setting among {len(sub)}: " + "; ".join(
                     f"{n}× {r}" for r, n in why.most_common())}]
    keep = [c for c in [*by, *SETTING_COLUMNS] if c not in key]
    rows = []
    for objective, i in _picks(sub, cand, b, max_slowdown).items():
        row = {**key, "objective": objective, "baseline": how,
               "max_slowdown_pct": 100 * max_slowdown}
        if i is None:
            row["note"] = "no baseline to measure against"
        else:
            row.update(_objective_row(sub, i, b, keep))
        rows.append(row)
    return rows


def recommend(
    df: pd.DataFrame, by: Sequence[str] = DEFAULT_GROUP, max_slowdown: float = 0.10
) -> pd.DataFrame:
    """The recommended settings of each group, with their savings against the baseline.

    Args:
        df: Trial rows, or settings already reduced by :func:`aggregate_repeats`.
        by: The grouping columns.
        max_slowdown: For ``min_energy_within_slowdown``: the largest time-per-iteration increase
            over the baseline allowed, as a fraction (0.10: 10 % slower).

    Returns:
        Per group, one row per objective (``objective``): ``baseline`` (the reference point
        itself), ``min_energy``, ``min_edp``, ``min_ed2p`` and ``min_energy_within_slowdown``;
        with the group and setting columns, ``time_per_iter_s``, ``energy_per_iter_j`` (medians)
        and their ranges, ``edp_js``, ``ed2p_js2``, ``avg_power_w``, ``n_repeats``,
        ``baseline`` (how the baseline was chosen), ``saving_pct``, ``slowdown_pct``,
        ``saving_beyond_spread`` (energy ranges of the setting and the baseline disjoint; NA with
        fewer than two repeats of either) and ``note``. A group with no usable setting gets one
        row with ``objective`` None and a note.

    Raises:
        UserError: ``max_slowdown`` is negative.
    """
    if not max_slowdown >= 0:
        raise UserError(f"max_slowdown must be a fraction >= 0 (0.1 for 10 %), got {max_slowdown}")
    by = list(by)
    agg = df if "n_repeats" in df.columns else aggregate_repeats(df, by)
    agg = with_columns(agg, [*SETTING_COLUMNS, "avg_power_w", f"{ENERGY}_min", f"{ENERGY}_max"])
    out: list[dict] = []
    for key, pos in group_positions(agg, by):
        out.extend(_group_recommendations(key, agg.iloc[pos].reset_index(drop=True), by,
                                          max_slowdown))
    result = pd.DataFrame(out)
    first = [*by, "objective", *SETTING_COLUMNS, TIME, ENERGY, "saving_pct", "slowdown_pct",
             "baseline"]
    result = with_columns(result, first)
    return result[first + [c for c in result.columns if c not in first]]
