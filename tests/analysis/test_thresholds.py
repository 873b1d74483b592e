"""Stability thresholds on a hand-made frame."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analysis import thresholds


def t(uuid, fw, clock, status="ok", iterations=500, valid=True, role=None):
    return {"device_uuid": uuid, "device_name": "A100", "workload": "gemm", "framework": fw,
            "dtype": "float32", "precision": "highest", "sm_clock_max_mhz": clock,
            "status": status, "iterations": iterations, "valid": valid,
            "invalid_reason": None if valid else "clock did not lock", "search_role": role}


@pytest.fixture
def result():
    df = pd.DataFrame([
        # GPU-A, jax: monotone. Fails at 600 (wrong) and 800 (crash), passes from 1000 up.
        t("GPU-A", "jax", 600, "wrong", 400),
        t("GPU-A", "jax", 800, "crash", None),
        t("GPU-A", "jax", 1000, iterations=500, role="confirm"),
        t("GPU-A", "jax", 1000, iterations=500, role="confirm"),
        t("GPU-A", "jax", 1200, iterations=1000, role="probe"),
        t("GPU-A", "jax", None, iterations=800),  # the default setting: not on the clock axis
        # GPU-A, tensorflow: non-monotone. Passes at 600, fails at 800, passes at 1000 and 1200;
        # a pass at 500 flagged invalid does not count.
        t("GPU-A", "tensorflow", 500, valid=False),
        t("GPU-A", "tensorflow", 600, iterations=300),
        t("GPU-A", "tensorflow", 800, "nondeterministic", 300),
        t("GPU-A", "tensorflow", 1000, iterations=300),
        t("GPU-A", "tensorflow", 1200, iterations=300),
        # GPU-B, jax: every clock passes.
        *[t("GPU-B", "jax", c, iterations=100) for c in (600, 800, 1000, 1200)],
    ])
    return thresholds(df).set_index(["device_uuid", "framework"])


def test_a_monotone_threshold(result):
    r = result.loc[("GPU-A", "jax")]
    assert r["stable_value"] == 1000 and r["failing_value"] == 800
    assert r["lowest_passing_value"] == 1000 and not r["non_monotone"]
    assert r["iterations_at_stable"] == 1000  # 2 trials x 500 clean iterations at 1000 MHz
    assert r["fault_rate_bound"] == pytest.approx(3 / 1000)  # rule of three
    assert r["trials_at_stable"] == 2 and r["failures_at_failing"] == 1
    assert r["failure_statuses"] == "crash×1, wrong×1"
    assert r["trials_used"] == 5 and r["trials_without_clock"] == 1
    assert r["values_tested"] == 4
    assert r["search_roles"] == "confirm×2, probe×1"


def test_a_failure_above_a_pass_is_non_monotone(result):
    r = result.loc[("GPU-A", "tensorflow")]
    assert r["non_monotone"]
    assert r["lowest_passing_value"] == 600  # the literal lowest pass
    assert r["stable_value"] == 1000  # the bottom of the range with no failure above it
    assert r["failing_value"] == 800
    assert r["iterations_at_stable"] == 300 and r["fault_rate_bound"] == pytest.approx(0.01)
    assert r["excluded_invalid_trials"] == 1 and r["trials_used"] == 4
    assert "non-monotone" in r["note"]


def test_no_failure_means_the_threshold_is_at_or_below_the_lowest_clock(result):
    r = result.loc[("GPU-B", "jax")]
    assert r["stable_value"] == 600 and np.isnan(r["failing_value"])
    assert not r["non_monotone"] and r["iterations_at_stable"] == 100
    assert "no failure seen down to 600 MHz" in r["note"]


def test_every_clock_failing_has_no_stable_clock():
    df = pd.DataFrame([t("GPU-C", "jax", c, "wrong") for c in (600, 800)])
    r = thresholds(df).iloc[0]
    assert np.isnan(r["stable_value"]) and r["failing_value"] == 800
    assert np.isnan(r["fault_rate_bound"]) and "every tested clock failed" in r["note"]


def test_search_role_is_optional():
    df = pd.DataFrame([t("GPU-C", "jax", 900)]).drop(columns=["search_role"])
    r = thresholds(df).iloc[0]
    assert r["stable_value"] == 900 and r["search_roles"] is None


def test_a_device_error_is_no_failure_of_the_clock():
    """A lost GPU says nothing about its clock: the threshold is where it would be without it."""
    df = pd.DataFrame([
        t("GPU-D", "jax", 800, "wrong"),
        t("GPU-D", "jax", 1000, "device_error", 0),
        t("GPU-D", "jax", 1000),
        t("GPU-D", "jax", 1200, "device_error", 0),
    ])
    r = thresholds(df).iloc[0]
    assert r["failing_value"] == 800 and r["stable_value"] == 1000
    assert r["failure_statuses"] == "wrong×1" and r["failures_at_failing"] == 1
    assert r["trials_used"] == 2 and not r["non_monotone"]


def test_the_table_has_the_one_thresholds_csv_header():
    from analysis.thresholds import COLUMNS

    table = thresholds(pd.DataFrame([t("GPU-C", "jax", 900), t("GPU-C", "jax", 600, "wrong")]))
    assert list(table.columns) == COLUMNS
    r = table.iloc[0]
    assert (r["setting"], r["unit"], r["riskier"]) == ("device.sm_clock_mhz", "MHz", "lower")
    # what only the stability search knows is present and empty
    search_only = ("confirmed", "candidate_value", "grid_size")
    assert all(r[c] is None or np.isnan(r[c]) for c in search_only)
