"""The report of a real sweep on the simulated GPU, through ``dvfs report`` as a user runs it.

One sweep for the whole module (the ``sim_sweep`` fixture of ``conftest.py``): the quickstart's
grid of 2 workloads x 2 frameworks x 8 SM-clock settings on a simulated A100.
"""

from __future__ import annotations

import re

import pandas as pd
import pytest
from report_support import (
    MID_SIZE,
    REPORT_SIZE,
    SWEEP_FRAMEWORKS,
    SWEEP_TRIALS,
    SWEEP_WORKLOADS,
    png_size,
)

pytestmark = pytest.mark.slow

FILES = ("pareto.png", "pareto.svg", "clocks.png", "report.md", "report.html", "trials.csv",
         "front.csv", "recommendations.csv")


def test_the_sweep_stored_every_trial(sim_sweep):
    trials = pd.read_csv(sim_sweep["out"] / "trials.csv")
    assert len(trials) == SWEEP_TRIALS
    assert set(trials["workload"]) == set(SWEEP_WORKLOADS)
    assert set(trials["framework"]) == set(SWEEP_FRAMEWORKS)
    assert (trials["backend"] == "sim").all()


def test_dvfs_report_exits_0_and_names_what_it_wrote(sim_sweep):
    run = sim_sweep["final_run"]
    assert run.returncode == 0, run.stderr
    assert "report written to" in run.stdout and "report.html" in run.stdout


def test_every_file_is_written_and_not_empty(sim_sweep):
    for name in FILES:
        path = sim_sweep["out"] / name
        assert path.is_file(), name
        assert path.stat().st_size > 0, name


def test_pngs_have_the_size_asked_with_size(sim_sweep):
    assert png_size(sim_sweep["out"] / "pareto.png") == REPORT_SIZE
    assert png_size(sim_sweep["out"] / "clocks.png") == REPORT_SIZE


def test_recommendations_name_a_setting_for_every_group(sim_sweep):
    recs = pd.read_csv(sim_sweep["out"] / "recommendations.csv")
    groups = {(w, f) for w in SWEEP_WORKLOADS for f in SWEEP_FRAMEWORKS}
    assert set(zip(recs["workload"], recs["framework"])) == groups
    for objective in ("baseline", "min_energy", "min_edp", "min_energy_within_slowdown"):
        picked = recs[recs["objective"] == objective]
        assert set(zip(picked["workload"], picked["framework"])) == groups, objective
        # A setting: a locked clock, or the device's default.
        assert (picked["sm_clock_max_mhz"].notna() | picked["default_setting"]).all(), objective
    baseline = recs[recs["objective"] == "baseline"]
    assert (baseline["baseline"] == "default").all()  # the sweep ran the default setting


def test_the_summary_names_a_setting_for_every_group(sim_sweep):
    md = (sim_sweep["out"] / "report.md").read_text(encoding="utf-8")
    summary = md.split("## Summary", 1)[1].split("\n## ", 1)[0]
    for w in SWEEP_WORKLOADS:
        for f in SWEEP_FRAMEWORKS:
            line = next(x for x in summary.splitlines() if x.startswith(f"- {w} / {f}:"))
            assert re.search(r"least energy per iteration.* at (\d+ MHz|default)", line), line


def test_gemm_front_trades_time_for_energy(sim_sweep):
    front = pd.read_csv(sim_sweep["out"] / "front.csv")
    for fw in SWEEP_FRAMEWORKS:
        on = front[(front["workload"] == "gemm") & (front["framework"] == fw) & front["on_front"]]
        assert len(on) >= 2, on
        on = on.sort_values("time_per_iter_s")
        # Along a front, each slower point saves energy: compute-bound work at a lower clock.
        assert on["energy_per_iter_j"].is_monotonic_decreasing
        fastest, thriftiest = on.iloc[0], on.iloc[-1]
        assert thriftiest["energy_per_iter_j"] < 0.9 * fastest["energy_per_iter_j"]
        assert thriftiest["sm_clock_max_mhz"] < fastest["observed_sm_clock_mhz"]


def test_stencil_time_hardly_moves_with_the_clock(sim_sweep):
    front = pd.read_csv(sim_sweep["out"] / "front.csv")
    ok = front[(front["workload"] == "stencil") & (front["status"] == "ok")]
    # Per framework: memory-bound, its roof is bandwidth, not the SM clock. Across frameworks the
    # times differ by the bytes each compiled (the sim charges XLA's fused pass, TF's four ops).
    for _, t in ok.groupby("framework")["time_per_iter_s"]:
        assert len(t) >= 2 and t.max() < 1.05 * t.min()


def test_the_report_of_a_running_sweep_reports_what_is_stored(sim_sweep):
    run = sim_sweep["mid_run"]
    assert run.returncode == 0, run.stderr
    mid = sim_sweep["mid"]
    for name in FILES:
        assert (mid / name).is_file() and (mid / name).stat().st_size > 0, name
    assert png_size(mid / "pareto.png") == MID_SIZE
    read = int(re.search(r"Read (\d+) trials", (mid / "report.md").read_text()).group(1))
    assert read == len(pd.read_csv(mid / "trials.csv"))
    assert read >= sim_sweep["mid_rows_before"] >= 4
    if sim_sweep["mid_sweep_still_running"]:
        assert read < SWEEP_TRIALS


def test_the_report_says_where_each_sweeps_time_went(sim_sweep):
    md = (sim_sweep["out"] / "report.md").read_text()
    section = md.split("## Where the time went", 1)[1].split("\n## ", 1)[0]
    found = re.search(r": (\d+) trials in ([\d.]+) s; windows ([\d.]+) s \((\d+) %\); the biggest "
                      r"other phase: ([a-z ]+), ([\d.]+) s", section)
    assert found, section
    trials, wall, windows, pct = int(found[1]), float(found[2]), float(found[3]), int(found[4])
    assert trials == SWEEP_TRIALS
    assert 0 < windows < wall and abs(pct - 100 * windows / wall) <= 1.5  # printed rounded
