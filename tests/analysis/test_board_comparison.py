"""Boards side by side: each board at its own best setting, and the report's section for it."""

from __future__ import annotations

import pandas as pd
import pytest

from analysis.boards import compare_boards, sweep_objective
from analysis.recommend import aggregate_repeats
from analysis.report import write_report
from orchestrator.results.store import ResultStore

FAST = "H100-SXM5-80GB"  # the second board: half the time, 70 % of the energy at every clock


def two_boards(make_rows, objective: str | None = None) -> pd.DataFrame:
    a100 = make_rows(frameworks=("jax",), repeats=2)
    h100 = [dict(r, device_name=FAST, device_uuid="GPU-sim-0002", trial_key=r["trial_key"] + "h",
                 time_per_iter_s=r["time_per_iter_s"] / 2,
                 energy_per_iter_j=r["energy_per_iter_j"] * 0.7)
            for r in make_rows(frameworks=("jax",), repeats=2, seed=1)]
    rows = pd.DataFrame(a100 + h100)
    if objective:
        rows["config"] = [dict(c, objective=objective) for c in rows["config"]]
    return rows


def best_by_hand(rows: pd.DataFrame, board: str, workload: str, score) -> pd.Series:
    s = aggregate_repeats(rows)
    s = s[(s["device_name"] == board) & (s["workload"] == workload) & (s["status"] == "ok")
          & s["valid"].astype(bool)]
    return s.loc[score(s).idxmin()]


@pytest.mark.parametrize("objective, score", [
    ("energy_per_work", lambda s: s["energy_per_iter_j"]),
    ("time_per_work", lambda s: s["time_per_iter_s"]),
    ("edp", lambda s: s["energy_per_iter_j"] * s["time_per_iter_s"]),
])
def test_each_board_is_taken_at_the_setting_best_on_it_for_the_sweeps_objective(
    make_rows, objective, score
):
    rows = two_boards(make_rows, objective)
    assert sweep_objective(rows) == objective
    table = compare_boards(rows)
    assert len(table) == 4 and set(table["objective"]) == {objective}  # 2 workloads x 2 boards
    for _, r in table.iterrows():
        want = best_by_hand(rows, r["device_name"], r["workload"], score)
        assert r["sm_clock_max_mhz"] == want["sm_clock_max_mhz"] or (
            pd.isna(r["sm_clock_max_mhz"]) and pd.isna(want["sm_clock_max_mhz"]))
        assert r["energy_per_iter_j"] == pytest.approx(want["energy_per_iter_j"])


def test_a_failing_setting_is_never_a_boards_best(make_rows):
    """JAX gemm fails its check below 1065 MHz on the synthetic A100, where energy is least."""
    table = compare_boards(two_boards(make_rows))
    gemm = table[(table["workload"] == "gemm") & (table["device_name"] == "A100-SXM4-40GB")]
    assert gemm["sm_clock_max_mhz"].iat[0] >= 1065


def test_ratios_are_against_the_best_board_of_each_computation(make_rows):
    table = compare_boards(two_boards(make_rows))
    for _, sub in table.groupby("workload"):
        fast = sub[sub["device_name"] == FAST].iloc[0]
        slow = sub[sub["device_name"] != FAST].iloc[0]
        assert fast["energy_vs_best"] == 1.0
        assert slow["energy_vs_best"] == pytest.approx(
            slow["energy_per_iter_j"] / fast["energy_per_iter_j"])
        assert slow["energy_vs_best"] > 1.0
        assert min(sub["time_vs_best"]) == 1.0


def test_one_board_is_no_comparison(make_rows):
    assert compare_boards(pd.DataFrame(make_rows(repeats=1))).empty


@pytest.mark.slow
def test_the_report_compares_boards_only_when_there_are_two(tmp_path, make_rows):
    for name, rows in (("two", two_boards(make_rows)),
                       ("one", pd.DataFrame(make_rows(frameworks=("jax",), repeats=1)))):
        with ResultStore(tmp_path / name) as store:
            for row in rows.to_dict("records"):
                store.put(row)
        files = write_report(tmp_path / name, tmp_path / f"{name}-out", image_size=(800, 500))
        md = files["report.md"].read_text()
        if name == "two":
            assert "## Boards side by side" in md and FAST in md.split("## Boards")[1]
            assert {"boards.png", "boards.csv"} <= set(files)
            assert md.count("](boards.png)") == 1
        else:
            assert "Boards side by side" not in md and "boards.png" not in files
