"""Column names and small helpers shared by the analysis functions.

The columns are those of a trial row (see ``docs/design.md``, "What a trial records"). Units are
in the names: seconds (``_s``), joules (``_j``), watts (``_w``), megahertz (``_mhz``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from orchestrator.errors import UserError

DEFAULT_GROUP: list[str] = ["workload", "size", "dtype", "precision", "framework", "device_name"]
"""What makes two trials comparable: the same computation on the same GPU model.

Fronts, recommendations and repeat medians are computed within a group. Two GPUs of one model
fall in one group (their spread then includes the silicon lottery); pass a list with
``device_uuid`` in place of ``device_name`` for per-GPU results.
"""

THRESHOLD_GROUP: list[str] = ["device_uuid", "workload", "framework", "dtype", "precision"]
"""Stability thresholds belong to one physical GPU and one computation."""

SETTING_COLUMNS: list[str] = [
    "sm_clock_min_mhz",
    "sm_clock_max_mhz",
    "mem_clock_mhz",
    "power_limit_w",
    "clock_offset_mhz",
    "default_setting",
]
"""What was asked of the device (None: left at the device's default)."""

OK = "ok"
NOT_MEASURED = "not_measured"  # a trial that measured nothing (orchestrator.results.rows.Status)
OUT_OF_MEMORY = "out_of_memory"  # its size did not fit the device: no evidence about the setting
# Most severe first: the status a setting gets when its repeats disagree.
_SEVERITY = ("crash", "timeout", "device_error", "wrong", "nondeterministic", OUT_OF_MEMORY,
             NOT_MEASURED, OK)


def require_columns(df: pd.DataFrame, columns: Sequence[str], what: str) -> None:
    """Raises a UserError naming the columns ``what`` needs and ``df`` lacks."""
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise UserError(f"{what} needs column(s) {', '.join(missing)}; the frame has none such")


def with_columns(df: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    """Returns ``df`` with every listed column present (missing ones filled with None)."""
    missing = [c for c in columns if c not in df.columns]
    if not missing:
        return df
    fill = {c: pd.Series([None] * len(df), index=df.index, dtype=object) for c in missing}
    return df.assign(**fill)


def truthy(series: pd.Series) -> np.ndarray:
    """A boolean array: True where the value is exactly True (missing counts as False)."""
    return np.array([isinstance(v, (bool, np.bool_)) and bool(v) for v in series], dtype=bool)


def numeric(series: pd.Series) -> np.ndarray:
    """A float array of a column (None and non-numbers become NaN)."""
    return pd.to_numeric(series, errors="coerce").to_numpy(dtype=float, na_value=np.nan)


def is_missing(value: object) -> bool:
    """Whether a cell holds no value (None, NaN, pandas NA)."""
    if value is None:
        return True
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):  # lists and dicts
        return False


def exclusion_reasons(df: pd.DataFrame, needed: Sequence[str] = ()) -> pd.Series:
    """Why each row cannot be a candidate for a front or a recommendation.

    Args:
        df: Trial rows or aggregated settings (with ``status``, ``valid``, ``invalid_reason``).
        needed: Numeric columns a candidate must have finite values in.

    Returns:
        A series of None (a candidate) or a reason: ``"status=<status>"``, ``"invalid: <why>"``,
        ``"missing <column>"``.
    """
    df = with_columns(df, ["status", "valid", "invalid_reason"])
    valid = truthy(df["valid"])
    values = {c: numeric(df[c]) if c in df.columns else np.full(len(df), np.nan) for c in needed}
    reasons: list[str | None] = []
    for i, (status, why) in enumerate(zip(df["status"], df["invalid_reason"])):
        if status != OK:
            reasons.append(f"status={'missing' if is_missing(status) else status}")
        elif not valid[i]:
            reasons.append(f"invalid: {why if not is_missing(why) else 'no reason recorded'}")
        else:
            bad = [c for c in needed if not np.isfinite(values[c][i])]
            reasons.append(f"missing {', '.join(bad)}" if bad else None)
    return pd.Series(reasons, index=df.index, dtype=object)


def worst_status(statuses: Sequence[object]) -> object:
    """The most severe status among a setting's repeats (``ok`` only if all are ``ok``)."""
    present = [s for s in statuses if not is_missing(s)]
    if not present:
        return None
    for s in _SEVERITY:
        if s in present:
            return s
    return sorted(map(str, present))[0]  # an unknown status still wins over "ok"


def group_keys(df: pd.DataFrame, by: Sequence[str]) -> list[tuple]:
    """The grouping columns of ``df`` as one hashable tuple per row.

    Missing values (None, NaN, NA) become None, so that they compare equal (NaN does not), and
    lists and dicts become tuples. Kept as plain tuples: a DataFrame would turn None back to NaN.
    """

    def norm(v: object) -> object:
        if isinstance(v, list):
            return tuple(v)
        if isinstance(v, dict):
            return tuple(sorted(v.items()))
        if is_missing(v):
            return None
        if isinstance(v, (np.floating, np.integer, np.bool_)):
            return v.item()
        return v

    columns = [[norm(v) for v in df[c].tolist()] for c in by]
    return list(zip(*columns)) if columns else [()] * len(df)


def group_positions(df: pd.DataFrame, by: Sequence[str]) -> list[tuple[dict, np.ndarray]]:
    """The groups of ``df`` as ``(key_dict, row_positions)``, in order of first appearance.

    Rows whose keys are None or NaN form groups of their own: pandas' ``groupby`` drops them by
    default, and a dropped row here would be a trial silently missing from a result.
    """
    by = list(by)
    if not by:
        return [({}, np.arange(len(df)))]
    index_of: dict[tuple, list[int]] = {}
    for pos, key in enumerate(group_keys(df, by)):
        index_of.setdefault(key, []).append(pos)
    return [(dict(zip(by, key)), np.array(p, dtype=int)) for key, p in index_of.items()]
