"""A trial's thermal start, on the simulated A100 whose leakage follows its die temperature."""

from __future__ import annotations

import pytest

from kernels import get_spec
from orchestrator.config import compose, validate_static
from orchestrator.devices.base import KernelWork
from orchestrator.errors import UserError

GEMM = get_spec("gemm").counts(preset="gpu", dtype="float32")
HEAT = KernelWork(GEMM.flops, GEMM.bytes_moved, get_spec("gemm").peak("float32"), "gemm", "jax",
                  kind="matmul")
LOCKED = "device.sm_clock_mhz=1200"  # below any power cap: power follows the die alone


def heat(seconds: float):
    """A ``before`` hook: run GPU-sized GEMMs for ``seconds`` of device time."""

    def before(device):
        end = device.now_s() + seconds
        while device.now_s() < end:
            device.on_kernel_call(HEAT)

    return before


def test_a_hot_board_draws_more_for_the_same_trial(run):
    (cold,), _ = run(LOCKED)
    (hot,), _ = run(LOCKED, before=heat(120))
    assert hot["temperature_start_c"] >= cold["temperature_start_c"] + 15
    assert hot["observed_sm_clock_mhz"] == cold["observed_sm_clock_mhz"]
    assert hot["avg_power_w"] > cold["avg_power_w"] * 1.01  # leakage, nothing else, rose
    assert hot["time_per_iter_s"] == pytest.approx(cold["time_per_iter_s"], rel=1e-6)


def test_a_drift_start_measures_the_board_where_its_temperature_holds(run):
    (cold,), _ = run(LOCKED)
    (steady,), _ = run(LOCKED, "measure.steady_start=drift", "measure.steady_drift_c=1",
                       "measure.steady_interval_s=20")
    assert steady["steady_note"] is None
    assert steady["phase_steady_s"] > 0
    assert steady["temperature_start_c"] >= cold["temperature_start_c"] + 15
    assert abs(steady["temperature_c"] - steady["temperature_start_c"]) <= 1
    assert steady["avg_power_w"] > cold["avg_power_w"]


def test_a_cooldown_start_lets_a_hot_board_cool_first(run):
    (row,), _ = run(LOCKED, "measure.steady_start=cooldown", "measure.cooldown_c=40",
                    before=heat(120))
    assert row["steady_note"] is None
    assert row["temperature_start_c"] <= 41  # the warm-up call after it may add a degree


def test_a_start_that_runs_out_of_time_is_measured_and_says_so(run):
    (row,), _ = run(LOCKED, "measure.steady_start=cooldown", "measure.cooldown_c=1",
                    "measure.steady_timeout_s=5")
    assert row["status"] == "ok"
    assert row["steady_note"].startswith("not cooled: ")
    assert "measure.cooldown_c=1" in row["steady_note"]


def test_the_default_start_takes_the_board_as_it_comes(run):
    (row,), _ = run(LOCKED, before=heat(60))
    assert row["steady_note"] is None
    assert row["phase_steady_s"] < 0.01
    assert row["temperature_start_c"] > 40  # still hot from what ran before


def test_an_unknown_start_is_one_line_naming_the_choices():
    with pytest.raises(UserError, match="measure.steady_start='warm' is not one of: none, drift"):
        validate_static(compose(["measure.steady_start=warm"]))
