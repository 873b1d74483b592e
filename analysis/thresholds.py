"""Stability thresholds: how low a GPU's SM clock can go before a kernel's results go wrong.

Per GPU (``device_uuid``) and computation (workload, framework, dtype, precision), every tested
clock is either *passing* (at least one trial, every trial ``ok``) or *failing* (at least one
trial whose status fails the setting, :func:`orchestrator.results.rows.fails_setting`: wrong,
nondeterministic, crash, timeout). A ``device_error`` (a lost GPU, an XID, ECC, overheating)
says the device was unhealthy, not that the clock is unstable, and a ``not_measured`` trial ran
nothing: neither ever counts against a clock, nor for it.

- ``stable_value``: the lowest passing clock with no failure at it or anywhere above it: the
  bottom of the stable range, the clock one could set. When the results are monotone it is
  also the lowest passing clock (``lowest_passing_value``); when they are not (``non_monotone``:
  a failure above some passing clock) the two differ and the lower pass is not trusted.
- ``failing_value``: the highest clock at which a trial failed.
- ``fault_rate_bound``: the rule of three: after ``n`` clean iterations at the threshold, the
  per-iteration fault probability is below ``3 / n`` with 95 % confidence (a good approximation
  for ``n`` of 30 and more). It bounds silent faults of the kind the checks detect, per
  iteration, at that clock on that GPU.

A passing trial counts only when its measurement is valid: a trial flagged invalid may not have
run at the clock asked (a clock that did not lock, throttling), and counting its pass could put
the threshold too low. Failures count whatever their validity. Excluded trials are counted in
``excluded_invalid_trials``. Trials without an asked clock (the device default) are not on the
clock axis and are counted in ``trials_without_clock``.

One table, two writers: ``dvfs report`` writes this function's frame to ``thresholds.csv``, and
the stability sweeper (``hydra/sweeper=stability``, :mod:`orchestrator.search.table`) writes its
own searches' table there with the same :data:`COLUMNS`. A column only one of them knows is
present and empty in the other's file: the search alone knows whether ``stable_value`` was
confirmed with the ``n`` clean iterations asked for (``confirmed``, ``candidate_value``,
``steps_between``, ``grid_size``, ``confirm_iterations``, ``group``); only this function sees
every stored trial, so ``excluded_invalid_trials`` and ``trials_without_clock`` are its own.

A sweep of the stability sweeper records which phase of its search asked for each trial
(``coarse``, ``bisect``, ``confirm``, ``retry``) in the store's ``search_trials`` meta item; pass
its ``roles`` (trial key -> phase) and ``search_roles`` counts them (a ``search_role`` column wins
where set).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis._frame import (
    OK,
    THRESHOLD_GROUP,
    group_positions,
    is_missing,
    numeric,
    require_columns,
    truthy,
    with_columns,
)
from orchestrator.results.rows import fails_setting

COLUMNS = [
    # which GPU and computation
    "device_index", "device_uuid", "device_name", "workload", "framework", "dtype", "precision",
    "group",
    # the setting searched, its unit, and which way is riskier ("lower" or "higher")
    "setting", "unit", "riskier",
    # where the threshold lies, in the setting's unit
    "stable_value", "failing_value", "candidate_value", "lowest_passing_value", "confirmed",
    "non_monotone", "steps_between",
    # the evidence at the stable and at the failing value
    "iterations_at_stable", "trials_at_stable", "fault_rate_bound", "confidence",
    "iterations_at_failing", "trials_at_failing", "failures_at_failing", "failure_statuses",
    # the effort, and what a reader must know
    "trials_used", "grid_size", "values_tested", "excluded_invalid_trials",
    "trials_without_clock", "search_roles", "confirm_iterations", "note",
]
"""The columns of ``thresholds.csv``, whichever writes it (one row per GPU and computation)."""

CONFIDENCE = 0.95
"""The confidence of ``fault_rate_bound`` (the rule of three)."""

_SETTING_OF_COLUMN = {"sm_clock_max_mhz": "device.sm_clock_mhz"}  # else device.<column>


@dataclass(frozen=True)
class _Trials:
    """The per-trial arrays every group's summary reads (positions are the frame's rows)."""

    values: np.ndarray  # the setting asked (NaN: none)
    iters: np.ndarray  # checked calls
    status: list[object]
    passed: np.ndarray  # ok and valid
    failed: np.ndarray  # the status fails the setting
    excluded: np.ndarray  # ok but invalid
    roles: list[object]
    names: list[object]
    indices: list[object]


def _fmt(v: float) -> str:
    return f"{v:g}"


def _first(values: Sequence[object]) -> object:
    return next((v for v in values if not is_missing(v)), None)


def _search_roles(df: pd.DataFrame, roles: Mapping[str, str] | None) -> list[object]:
    """Each trial's search phase: its ``search_role``, else ``roles[trial_key]``."""
    keys = df["trial_key"].tolist() if "trial_key" in df.columns else [None] * len(df)
    out: list[object] = []
    for role, key in zip(df["search_role"].tolist(), keys):
        if is_missing(role) and roles and isinstance(key, str):
            role = roles.get(key)
        out.append(role)
    return out


def _trials(df: pd.DataFrame, clock: str, roles: Mapping[str, str] | None) -> _Trials:
    """The arrays of ``df`` (which has every column the summary reads)."""
    # Clean iterations are checked calls: a check run may be shorter than its window, and rows
    # stored before checked_iters existed checked every timed call.
    checked = numeric(df["checked_iters"])
    status = df["status"].tolist()
    ok = np.array([s == OK for s in status], dtype=bool)
    valid = truthy(df["valid"])
    return _Trials(
        values=numeric(df[clock]),
        iters=np.where(np.isfinite(checked), checked, numeric(df["iterations"])),
        status=status,
        passed=ok & valid,
        failed=np.array([fails_setting(s) for s in status], dtype=bool),
        excluded=ok & ~valid,
        roles=_search_roles(df, roles),
        names=df["device_name"].tolist(),
        indices=df["device_index"].tolist(),
    )


def _note(
    tested: int, passing: set, failing: set, stable: float, non_monotone: bool, unit: str
) -> str | None:
    """What a reader must know about one group's threshold (None: nothing)."""
    if not tested:
        return "no trial with an asked clock"
    highest_failing = max(failing) if failing else np.nan
    if not passing and failing:
        return f"every tested clock failed (up to {_fmt(highest_failing)} {unit})"
    if not passing:
        return "no valid passing trial"
    if not failing:
        return (f"no failure seen down to {_fmt(min(passing))} {unit}, the lowest clock tested: "
                "the threshold is there or lower")
    if np.isnan(stable):
        return f"failures at the highest clock tested ({_fmt(highest_failing)} {unit})"
    if non_monotone:
        return (f"non-monotone: a failure at {_fmt(highest_failing)} {unit} above a pass at "
                f"{_fmt(min(passing))} {unit}")
    return None


def _counts(items: Sequence[object]) -> str | None:
    """``"a×2, b×1"`` (sorted), or None for no item."""
    return ", ".join(f"{k}×{n}" for k, n in sorted(Counter(items).items())) or None


def _summary(t: _Trials, pos: np.ndarray, unit: str) -> dict[str, object]:
    """One group's threshold, from the trials at positions ``pos``."""
    on_axis = pos[np.isfinite(t.values[pos])]
    passes, fails = on_axis[t.passed[on_axis]], on_axis[t.failed[on_axis]]
    fail_values = set(t.values[fails].tolist())
    pass_values = set(t.values[passes].tolist()) - fail_values
    failing = max(fail_values) if fail_values else np.nan
    above = [c for c in pass_values if not fail_values or c > failing]
    stable = min(above) if above else np.nan
    non_monotone = bool(fail_values and pass_values and failing > min(pass_values))
    at_stable = passes[t.values[passes] == stable]
    n_clean = float(np.nansum(t.iters[at_stable])) if len(at_stable) else np.nan
    at_failing = on_axis[t.values[on_axis] == failing]
    note = _note(len(on_axis), pass_values, fail_values, stable, non_monotone, unit)
    if np.isfinite(n_clean) and n_clean < 30 and note is None:
        note = "fewer than 30 clean iterations at the threshold: the 3/n bound is rough"
    return dict(
        stable_value=stable,
        failing_value=failing,
        lowest_passing_value=min(pass_values) if pass_values else np.nan,
        non_monotone=non_monotone,
        iterations_at_stable=n_clean,
        trials_at_stable=len(at_stable),
        fault_rate_bound=3.0 / n_clean if np.isfinite(n_clean) and n_clean > 0 else np.nan,
        confidence=CONFIDENCE,
        iterations_at_failing=float(np.nansum(t.iters[at_failing])) if len(at_failing) else np.nan,
        trials_at_failing=len(at_failing),
        failures_at_failing=len(fails[t.values[fails] == failing]),
        failure_statuses=_counts([t.status[i] for i in fails]),
        trials_used=len(passes) + len(fails),
        values_tested=len(set(t.values[on_axis].tolist())),
        excluded_invalid_trials=int(t.excluded[on_axis].sum()),
        trials_without_clock=len(pos) - len(on_axis),
        search_roles=_counts([str(t.roles[i]) for i in pos if not is_missing(t.roles[i])]),
        note=note,
    )


def thresholds(
    df: pd.DataFrame,
    by: Sequence[str] = THRESHOLD_GROUP,
    clock: str = "sm_clock_max_mhz",
    roles: Mapping[str, str] | None = None,
) -> pd.DataFrame:
    """The stability threshold of each GPU and computation.

    Args:
        df: Trial rows (from :func:`analysis.load`); a ``search_role`` column from the stability
            sweeper is summarised when present, never required.
        by: The grouping columns.
        clock: The ordered setting, in MHz (``sm_clock_max_mhz``; ``clock_offset_mhz`` for an
            offset search). Lower values are taken as the riskier ones.
        roles: Trial key -> search phase, for trials without a ``search_role``: the ``roles`` of
            the stability sweeper's ``search_trials`` meta item (``analysis.load_meta``).

    Returns:
        One row per group: the ``by`` columns not in :data:`COLUMNS`, then :data:`COLUMNS`
        (those only the stability search knows left empty).
    """
    by = list(by)
    require_columns(df, [clock, "status"], "thresholds")
    df = with_columns(df, [*by, "device_name", "device_index", "valid", "iterations",
                           "checked_iters", "search_role"])
    trials = _trials(df, clock, roles)
    setting = _SETTING_OF_COLUMN.get(clock, f"device.{clock}")
    unit = "W" if clock.endswith("_w") else "MHz"
    out: list[dict] = []
    for key, pos in group_positions(df, by):
        row = dict(key)
        row.setdefault("device_name", _first([trials.names[i] for i in pos]))
        row.setdefault("device_index", _first([trials.indices[i] for i in pos]))
        row.update(setting=setting, unit=unit, riskier="lower", **_summary(trials, pos, unit))
        out.append(row)
    return pd.DataFrame(out, columns=[*[c for c in by if c not in COLUMNS], *COLUMNS])
