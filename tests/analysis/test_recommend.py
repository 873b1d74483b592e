"""Recommendations and comparisons against hand calculations."""

from __future__ import annotations

import pandas as pd
import pytest

from analysis import aggregate_repeats, compare, recommend

GROUP = {"workload": "gemm", "size": "large", "dtype": "float32", "precision": "highest",
         "device_name": "A100"}


def trial(framework, clock, t, e, status="ok", repeat=0, valid=True):
    return {**GROUP, "framework": framework, "sm_clock_min_mhz": clock, "sm_clock_max_mhz": clock,
            "mem_clock_mhz": None, "power_limit_w": None, "clock_offset_mhz": None,
            "default_setting": clock is None, "time_per_iter_s": t, "energy_per_iter_j": e,
            "status": status, "valid": valid, "invalid_reason": None if valid else "throttled",
            "repeat": repeat, "device_uuid": "GPU-1", "avg_power_w": e / t}


@pytest.fixture
def frame():
    return pd.DataFrame([
        # jax: a default trial, and 1000 MHz with three repeats (medians 1.2 s, 6.5 J).
        trial("jax", None, 1.00, 10.0),
        trial("jax", 1200, 1.05, 8.0),
        trial("jax", 1000, 1.1, 6.4, repeat=0),
        trial("jax", 1000, 1.2, 6.5, repeat=1),
        trial("jax", 1000, 1.3, 7.0, repeat=2),
        trial("jax", 800, 1.60, 6.0),
        trial("jax", 600, 2.40, 5.0, status="wrong"),  # least energy, but wrong: never chosen
        trial("jax", 700, 2.00, 5.5, valid=False),  # invalid: never chosen
        # tensorflow: no default trial, so the baseline is the highest clock.
        trial("tensorflow", 1400, 1.0, 12.0),
        trial("tensorflow", 1000, 1.3, 9.0),
    ])


def pick(recs, framework, objective):
    r = recs[(recs["framework"] == framework) & (recs["objective"] == objective)]
    assert len(r) == 1
    return r.iloc[0]


def test_repeats_reduce_to_median_and_range(frame):
    agg = aggregate_repeats(frame)
    r = agg[(agg["framework"] == "jax") & (agg["sm_clock_max_mhz"] == 1000)].iloc[0]
    assert r["n_repeats"] == 3 and r["n_usable"] == 3
    assert r["time_per_iter_s"] == pytest.approx(1.2)
    assert (r["time_per_iter_s_min"], r["time_per_iter_s_max"]) == pytest.approx((1.1, 1.3))
    assert r["energy_per_iter_j"] == pytest.approx(6.5)
    assert (r["energy_per_iter_j_min"], r["energy_per_iter_j_max"]) == pytest.approx((6.4, 7.0))
    assert len(agg) == 8  # 6 jax settings + 2 tensorflow ones: nothing dropped


def test_recommendations_equal_the_hand_calculation(frame):
    recs = recommend(frame, max_slowdown=0.10)
    # jax, baseline = the default trial: t0 = 1.0 s, E0 = 10 J.
    #   setting   t (s)  E (J)  EDP = E*t   ED2P = E*t^2
    #   default   1.00   10.0   10.0        10.0
    #   1200      1.05    8.0    8.4         8.82
    #   1000      1.20    6.5    7.8         9.36   (medians of 3 repeats)
    #   800       1.60    6.0    9.6        15.36
    #   (600 is wrong, 700 invalid: excluded)
    assert pick(recs, "jax", "baseline")["baseline"] == "default"
    e = pick(recs, "jax", "min_energy")
    assert e["sm_clock_max_mhz"] == 800
    assert e["saving_pct"] == pytest.approx(100 * (1 - 6.0 / 10.0))  # 40 %
    assert e["slowdown_pct"] == pytest.approx(100 * (1.6 / 1.0 - 1))  # 60 %
    edp = pick(recs, "jax", "min_edp")
    assert edp["sm_clock_max_mhz"] == 1000 and edp["edp_js"] == pytest.approx(7.8)
    assert edp["saving_pct"] == pytest.approx(35.0) and edp["slowdown_pct"] == pytest.approx(20.0)
    ed2p = pick(recs, "jax", "min_ed2p")
    assert ed2p["sm_clock_max_mhz"] == 1200 and ed2p["ed2p_js2"] == pytest.approx(8.82)
    # within 10 %: t <= 1.1 s leaves the default and 1200 MHz; 1200 has less energy.
    w = pick(recs, "jax", "min_energy_within_slowdown")
    assert w["sm_clock_max_mhz"] == 1200
    assert w["saving_pct"] == pytest.approx(20.0) and w["slowdown_pct"] == pytest.approx(5.0)
    # tensorflow, no default: baseline = 1400 MHz (t0 = 1.0 s, E0 = 12 J).
    b = pick(recs, "tensorflow", "baseline")
    assert b["baseline"] == "highest clock (no default trial)" and b["sm_clock_max_mhz"] == 1400
    e = pick(recs, "tensorflow", "min_energy")
    assert e["sm_clock_max_mhz"] == 1000
    assert e["saving_pct"] == pytest.approx(25.0) and e["slowdown_pct"] == pytest.approx(30.0)
    w = pick(recs, "tensorflow", "min_energy_within_slowdown")  # 1.3 s > 1.1 s: only 1400 fits
    assert w["sm_clock_max_mhz"] == 1400 and w["saving_pct"] == pytest.approx(0.0)


def test_a_failed_default_trial_falls_back_to_the_highest_clock(frame):
    df = frame.copy()
    df.loc[df["default_setting"] & (df["framework"] == "jax"), "status"] = "crash"
    b = pick(recommend(df), "jax", "baseline")
    assert b["sm_clock_max_mhz"] == 1200
    assert b["baseline"] == "highest clock (default trial not usable: status=crash)"


def test_a_group_with_no_usable_setting_says_so():
    df = pd.DataFrame([trial("jax", 1000, 1.0, 5.0, status="crash")])
    recs = recommend(df)
    assert len(recs) == 1 and recs["objective"].isna().all()
    assert "no usable setting" in recs["note"].iat[0]


def test_negative_max_slowdown_is_refused(frame):
    with pytest.raises(Exception, match="max_slowdown"):
        recommend(frame, max_slowdown=-0.1)


def test_compare_reports_ratios_and_honest_significance():
    rows = []
    for clock in (800, 1000, 1200):
        for r in range(3):
            rows.append(trial("jax", clock, 1.0 + 0.01 * r, 5.0 + 0.01 * r, repeat=r))
            rows.append(trial("tensorflow", clock, 2.0 + 0.01 * r, 5.0 + 0.02 * r, repeat=r))
    df = pd.DataFrame(rows)
    detail = compare(df, "jax", "tensorflow", per_setting=True)
    t = detail[detail["metric"] == "time_per_iter_s"]
    assert len(t) == 3
    assert t["ratio"].to_numpy() == pytest.approx([1.01 / 2.01] * 3)
    assert t["beyond_spread"].tolist() == [True] * 3
    assert t["p_chance"].to_numpy() == pytest.approx([0.1] * 3)  # 2 * 3! 3! / 6!
    assert t["significant"].tolist() == [False] * 3  # one setting alone: 0.1 > 0.05
    summary = compare(df, "jax", "tensorflow").set_index("metric")
    assert summary.loc["time_per_iter_s", "median_ratio"] == pytest.approx(1.01 / 2.01)
    assert summary.loc["time_per_iter_s", "p_chance"] == pytest.approx(2 * 0.05 ** 3)
    assert summary.loc["time_per_iter_s", "significant"] is True or \
        summary.loc["time_per_iter_s", "significant"] == True  # noqa: E712
    # Energy ranges overlap (5.00-5.02 vs 5.00-5.04): not significant.
    assert summary.loc["energy_per_iter_j", "n_beyond_spread"] == 0
    assert bool(summary.loc["energy_per_iter_j", "significant"]) is False


def test_compare_with_single_repeats_cannot_judge():
    df = pd.DataFrame([trial("jax", 1000, 1.0, 5.0), trial("tensorflow", 1000, 2.0, 6.0)])
    summary = compare(df, "jax", "tensorflow")
    assert summary["significant"].isna().all()
    assert summary["median_ratio"].to_numpy() == pytest.approx([0.5, 5 / 6])
