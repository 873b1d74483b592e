"""Repeats, recommended settings and comparisons.

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
    OK,
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
    usable_all = exclusion_reasons(df, needed=SPREAD_METRICS).isna().to_numpy()
    valid_all = truthy(df["valid"])
    nums = {c: numeric(df[c]) for c in (*SPREAD_METRICS, *_REDUCE)}
    status_all = df["status"].tolist()
    out: list[dict] = []
    for key, pos in group_positions(df, [*by, *settings]):
        usable = pos[usable_all[pos]]
        use = usable if len(usable) else pos
        statuses = [status_all[i] for i in pos]
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
        out.append(row)
    result = pd.DataFrame(out)
    if "default_setting" in result:
        result["default_setting"] = truthy(result["default_setting"])
    return result


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


def _beyond_spread(a_min: float, a_max: float, b_min: float, b_max: float,
                   n_a: int, n_b: int) -> object:
    """True if two ranges are disjoint, NA when either has fewer than two repeats."""
    if n_a < 2 or n_b < 2 or not all(map(np.isfinite, (a_min, a_max, b_min, b_max))):
        return pd.NA
    return bool(a_max < b_min or b_max < a_min)


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
    keep = [*by, *SETTING_COLUMNS]
    out: list[dict] = []
    for key, pos in group_positions(agg, by):
        sub = agg.iloc[pos].reset_index(drop=True)
        reasons = exclusion_reasons(sub, needed=SPREAD_METRICS)
        cand = reasons.isna().to_numpy()
        t, e = numeric(sub[TIME]), numeric(sub[ENERGY])
        b, how = _baseline(sub, cand)
        if not cand.any():
            why = Counter(str(r) for r in reasons)
            out.append({**key, "objective": None, "baseline": how,
                        "note": f"no usable setting among {len(sub)}: " + "; ".join(
                            f"{n}× {r}" for r, n in why.most_common())})
            continue
        inf = np.inf
        picks = {
            "baseline": b,
            "min_energy": _pick(sub, np.where(cand, e, inf)),
            "min_edp": _pick(sub, np.where(cand, e * t, inf)),
            "min_ed2p": _pick(sub, np.where(cand, e * t * t, inf)),
        }
        if b is not None:
            allowed = cand & (t <= t[b] * (1.0 + max_slowdown))
            picks["min_energy_within_slowdown"] = _pick(sub, np.where(allowed, e, inf))
        else:
            picks["min_energy_within_slowdown"] = None
        for objective in OBJECTIVES:
            i = picks[objective]
            row = {**key, "objective": objective, "baseline": how, "max_slowdown_pct": 100 * max_slowdown}
            if i is None:
                row["note"] = "no baseline to measure against"
                out.append(row)
                continue
            r = sub.iloc[i]
            row.update({c: r[c] for c in keep if c not in key})
            row.update(
                time_per_iter_s=t[i], energy_per_iter_j=e[i],
                time_per_iter_s_min=r.get(f"{TIME}_min"), time_per_iter_s_max=r.get(f"{TIME}_max"),
                energy_per_iter_j_min=r.get(f"{ENERGY}_min"),
                energy_per_iter_j_max=r.get(f"{ENERGY}_max"),
                edp_js=e[i] * t[i], ed2p_js2=e[i] * t[i] ** 2,
                avg_power_w=r.get("avg_power_w"), n_repeats=r.get("n_repeats"),
                note=None,
            )
            if b is not None:
                rb = sub.iloc[b]
                row["saving_pct"] = 100.0 * (1.0 - e[i] / e[b])
                row["slowdown_pct"] = 100.0 * (t[i] / t[b] - 1.0)
                row["saving_beyond_spread"] = pd.NA if i == b else _beyond_spread(
                    float(r[f"{ENERGY}_min"]), float(r[f"{ENERGY}_max"]),
                    float(rb[f"{ENERGY}_min"]), float(rb[f"{ENERGY}_max"]),
                    int(r["n_repeats"]), int(rb["n_repeats"]))
            out.append(row)
    result = pd.DataFrame(out)
    first = [*by, "objective", *SETTING_COLUMNS, TIME, ENERGY, "saving_pct", "slowdown_pct",
             "baseline"]
    result = with_columns(result, first)
    return result[first + [c for c in result.columns if c not in first]]


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

    Settings are matched within a group (same workload, size, ..., and same asked clocks and
    limits); only settings usable on both sides count. For each matched setting the ratio of
    the medians ``a / b`` is taken; the difference is *beyond spread* when the two repeat ranges
    do not overlap. That is a weak test with few repeats: with no real difference, two ranges of
    ``n_a`` and ``n_b`` repeats come out disjoint by chance with probability
    ``2 n_a! n_b! / (n_a + n_b)!`` (1/3 for 2 and 2, 1/10 for 3 and 3), given as ``p_chance``;
    ``significant`` is True when the ranges are disjoint and ``p_chance <= 0.05``.

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
        is at most 0.05; False otherwise; NA when no setting could be judged. Per setting: the setting columns, ``a_median``,
        ``b_median``, their ranges and repeat counts, ``ratio``, ``beyond_spread``,
        ``p_chance`` and ``significant``.
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
        if not len(sa) or not len(sb):
            continue
        ra, rb = sa.iloc[0], sb.iloc[0]
        na, nb = int(ra["n_usable"]), int(rb["n_usable"])
        p_chance = 2.0 * math.factorial(na) * math.factorial(nb) / math.factorial(na + nb)
        for m in metrics:
            beyond = _beyond_spread(float(ra[f"{m}_min"]), float(ra[f"{m}_max"]),
                                    float(rb[f"{m}_min"]), float(rb[f"{m}_max"]), na, nb) \
                if f"{m}_min" in sub else pd.NA
            rows.append({
                **key, "metric": m, "a": a, "b": b,
                "a_median": ra[m], "b_median": rb[m], "ratio": ra[m] / rb[m],
                "a_min": ra.get(f"{m}_min"), "a_max": ra.get(f"{m}_max"),
                "b_min": rb.get(f"{m}_min"), "b_max": rb.get(f"{m}_max"),
                "n_a": na, "n_b": nb, "beyond_spread": beyond,
                "p_chance": p_chance if beyond is not pd.NA else math.nan,
                "significant": pd.NA if beyond is pd.NA else bool(beyond and p_chance <= 0.05),
            })
    detail = pd.DataFrame(rows, columns=[*match, "metric", "a", "b", "a_median", "b_median", "ratio",
                                         "a_min", "a_max", "b_min", "b_max", "n_a", "n_b",
                                         "beyond_spread", "p_chance", "significant"])
    if per_setting:
        return detail
    summary: list[dict] = []
    for key, pos in group_positions(detail, [*by, "metric"]):
        sub = detail.iloc[pos]
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
        summary.append({
            **key, "a": a, "b": b, "n_settings": len(sub),
            "median_ratio": float(np.median(ratio)), "min_ratio": float(ratio.min()),
            "max_ratio": float(ratio.max()),
            "n_beyond_spread": int(sum(v is True for v in sub["beyond_spread"])),
            "n_judged": len(judged), "p_chance": p_group, "significant": significant,
        })
    return pd.DataFrame(summary, columns=[*by, "metric", "a", "b", "n_settings", "median_ratio",
                                          "min_ratio", "max_ratio", "n_beyond_spread", "n_judged",
                                          "p_chance", "significant"])
