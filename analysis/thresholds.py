"""Stability thresholds: how low a GPU's SM clock can go before a kernel's results go wrong.

Per GPU (``device_uuid``) and computation (workload, framework, dtype, precision), every tested
clock is either *passing* (at least one trial, every trial ``ok``) or *failing* (at least one
trial not ``ok``: wrong, nondeterministic, crash, timeout, device error).

- ``lowest_stable_mhz``: the lowest passing clock with no failure at it or anywhere above it: the
  bottom of the stable range, the clock one could set. When the results are monotone it is
  also the lowest passing clock (``lowest_passing_mhz``); when they are not (``non_monotone``:
  a failure above some passing clock) the two differ and the lower pass is not trusted.
- ``highest_failing_mhz``: the highest clock at which a trial failed.
- ``fault_rate_bound``: the rule of three: after ``n`` clean iterations at the threshold, the
  per-iteration fault probability is below ``3 / n`` with 95 % confidence (a good approximation
  for ``n`` of 30 and more). It bounds silent faults of the kind the checks detect, per
  iteration, at that clock on that GPU.

A passing trial counts only when its measurement is valid: a trial flagged invalid may not have
run at the clock asked (a clock that did not lock, throttling), and counting its pass could put
the threshold too low. Failures count whatever their validity. Excluded trials are counted in
``excluded_invalid_trials``. Trials without an asked clock (the device default) are not on the
clock axis and are counted in ``trials_without_clock``.

A sweep of the stability sweeper (``hydra/sweeper=stability``) records which phase of its search
asked for each trial (``coarse``, ``bisect``, ``confirm``, ``retry``) in the store's
``search_trials`` meta item; pass its ``roles`` (trial key -> phase) and ``search_roles`` counts
them (a ``search_role`` column wins where set). The sweeper's own table (``thresholds.csv``, and
the store's ``thresholds`` meta item) adds what only the search knows: whether the lowest stable
clock was confirmed with the ``n`` clean iterations asked for.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

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

COLUMNS = [
    "device_name", "lowest_stable_mhz", "highest_failing_mhz", "lowest_passing_mhz",
    "non_monotone", "iterations_at_stable", "trials_at_stable", "fault_rate_bound",
    "iterations_at_failing", "failures_at_failing", "failure_statuses", "clocks_tested",
    "trials_used", "excluded_invalid_trials", "trials_without_clock", "search_roles", "note",
]


def _fmt(v: float) -> str:
    return f"{v:g}"


def _search_roles(df: pd.DataFrame, roles: Mapping[str, str] | None) -> list[object]:
    """Each trial's search phase: its ``search_role``, else ``roles[trial_key]``."""
    keys = df["trial_key"].tolist() if "trial_key" in df.columns else [None] * len(df)
    out: list[object] = []
    for role, key in zip(df["search_role"].tolist(), keys):
        if is_missing(role) and roles and isinstance(key, str):
            role = roles.get(key)
        out.append(role)
    return out


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
            offset search).
        roles: Trial key -> search phase, for trials without a ``search_role``: the ``roles`` of
            the stability sweeper's ``search_trials`` meta item (``analysis.load_meta``).

    Returns:
        One row per group: the ``by`` columns and those of :data:`COLUMNS`.
    """
    by = list(by)
    require_columns(df, [clock, "status"], "thresholds")
    df = with_columns(df, [*by, "device_name", "valid", "iterations", "checked_iters", "search_role"])
    search_role = _search_roles(df, roles)
    clocks = numeric(df[clock])
    # Clean iterations are checked calls: a check run may be shorter than its window, and rows
    # stored before checked_iters existed checked every timed call.
    checked = numeric(df["checked_iters"])
    iters = np.where(np.isfinite(checked), checked, numeric(df["iterations"]))
    status = df["status"].tolist()
    valid = truthy(df["valid"])
    ok = np.array([s == OK for s in status])
    # A device_error (lost GPU, overheated, ECC) says the device is unhealthy, not that the
    # clock is unstable: it is reported with the device, never counted against the clock.
    failed = np.array([not is_missing(s) and s not in (OK, "device_error") for s in status])
    out: list[dict] = []
    for key, pos in group_positions(df, by):
        has_clock = pos[np.isfinite(clocks[pos])]
        passes = has_clock[ok[has_clock] & valid[has_clock]]
        fails = has_clock[failed[has_clock]]
        excluded = has_clock[ok[has_clock] & ~valid[has_clock]]
        fail_clocks = set(clocks[fails].tolist())
        pass_clocks = set(clocks[passes].tolist()) - fail_clocks
        highest_failing = max(fail_clocks) if fail_clocks else np.nan
        lowest_passing = min(pass_clocks) if pass_clocks else np.nan
        above = [c for c in pass_clocks if not fail_clocks or c > highest_failing]
        lowest_stable = min(above) if above else np.nan
        non_monotone = bool(fail_clocks and pass_clocks and highest_failing > lowest_passing)

        at_stable = passes[clocks[passes] == lowest_stable]
        n_clean = float(np.nansum(iters[at_stable])) if len(at_stable) else np.nan
        at_failing = fails[clocks[fails] == highest_failing]
        iters_failing_all = has_clock[clocks[has_clock] == highest_failing]
        roles = Counter(str(search_role[i]) for i in pos if not is_missing(search_role[i]))

        if not len(has_clock):
            note = "no trial with an asked clock"
        elif not pass_clocks and fail_clocks:
            note = f"every tested clock failed (up to {_fmt(highest_failing)} MHz)"
        elif not pass_clocks:
            note = "no valid passing trial"
        elif not fail_clocks:
            note = (f"no failure seen down to {_fmt(lowest_passing)} MHz, the lowest clock tested: "
                    "the threshold is there or lower")
        elif np.isnan(lowest_stable):
            note = f"failures at the highest clock tested ({_fmt(highest_failing)} MHz)"
        elif non_monotone:
            note = (f"non-monotone: a failure at {_fmt(highest_failing)} MHz above a pass at "
                    f"{_fmt(lowest_passing)} MHz")
        else:
            note = None
        if np.isfinite(n_clean) and n_clean < 30 and note is None:
            note = "fewer than 30 clean iterations at the threshold: the 3/n bound is rough"

        row = dict(key)
        row.update(
            device_name=next((v for v in df["device_name"].iloc[pos] if not is_missing(v)), None),
            lowest_stable_mhz=lowest_stable,
            highest_failing_mhz=highest_failing,
            lowest_passing_mhz=lowest_passing,
            non_monotone=non_monotone,
            iterations_at_stable=n_clean,
            trials_at_stable=len(at_stable),
            fault_rate_bound=3.0 / n_clean if np.isfinite(n_clean) and n_clean > 0 else np.nan,
            iterations_at_failing=float(np.nansum(iters[iters_failing_all]))
            if len(iters_failing_all) else np.nan,
            failures_at_failing=len(at_failing),
            failure_statuses=", ".join(f"{s}×{n}" for s, n in
                                       sorted(Counter(status[i] for i in fails).items())) or None,
            clocks_tested=len(set(clocks[has_clock].tolist())),
            trials_used=len(passes) + len(fails),
            excluded_invalid_trials=len(excluded),
            trials_without_clock=len(pos) - len(has_clock),
            search_roles=", ".join(f"{r}×{n}" for r, n in sorted(roles.items())) or None,
            note=note,
        )
        out.append(row)
    return pd.DataFrame(out, columns=[*by, *[c for c in COLUMNS if c not in by]])
