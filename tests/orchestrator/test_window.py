"""The measurement window on the simulated GPU: counter-aligned energy, on-device checks, and a
dispatch loop that leaves the host out of the timed calls."""

from __future__ import annotations

import math
import statistics

import pytest

from kernels import get_spec
from orchestrator.config import compose, validate_static
from orchestrator.devices.base import KernelWork
from orchestrator.devices.sim import model
from orchestrator.devices.sim.profile import load_profile
from orchestrator.errors import UserError
from orchestrator.measuring.window import CHUNKS_PER_WINDOW, _chunk

A100 = "a100_sxm4_40gb"
TRACED = ("dispatch", "dispatch_checked", "sync", "fetch", "call_device", "to_numpy", "call")


class TracedKernel:
    """A real built kernel that logs every call that queues, waits or copies."""

    def __init__(self, kernel, events):
        self._kernel = kernel
        self._events = events

    def __getattr__(self, name):
        attr = getattr(self._kernel, name)
        if name not in TRACED:
            return attr

        def traced(*args, **kwargs):
            self._events.append(name)
            return attr(*args, **kwargs)

        return traced


class TracingCache:
    """A kernel cache whose kernels log their calls into ``events``."""

    def __init__(self, inner):
        self.inner = inner
        self.events: list[str] = []

    def get(self, *args, **kwargs):
        return TracedKernel(self.inner.get(*args, **kwargs), self.events)


def _model_power_w(workload: str, clock_mhz: int, kind: str, temperature_c: int | None = None
                   ) -> float:
    """Ground truth: the model's board power for the sim-size call at a locked clock, for the
    kind of work the call was charged as (the row's ``work_kind``: its achieved rate), with the
    die at ``temperature_c`` (leakage follows it)."""
    spec = get_spec(workload)
    counts = spec.counts(preset="gpu", dtype="float32")
    work = KernelWork(counts.flops, counts.bytes_moved, spec.peak("float32"), workload, "jax",
                      kind=kind)
    profile = load_profile(A100)
    limit_w = profile.power_limit_default_w
    return model.operating_point(profile, work, clock_mhz, None, limit_w,
                                 temperature_c=temperature_c).power_w


def test_a_2_s_window_on_a_100_ms_counter_is_within_half_a_percent_of_the_model_at_every_phase(run):
    errors = []
    for phase_s in [i * 0.0125 for i in range(8)]:  # where in a counter period the trial begins
        rows, _ = run(
            "device.sm_clock_mhz=1200", "measure.window_s=2",
            before=lambda device, phase_s=phase_s: device.idle(phase_s),
        )
        (row,) = rows
        assert row["status"] == "ok" and row["valid"] and row["window_aligned"], row
        assert row["work_kind"] == "matmul"  # XLA's dot: the GEMM's achieved rate applies
        # the die warms by a degree or so over the window: the truth at its mean temperature
        die_c = round((row["temperature_start_c"] + row["temperature_c"]) / 2)
        truth_w = _model_power_w("gemm", 1200, row["work_kind"], die_c)
        errors.append(row["energy_j"] / (truth_w * row["time_s"]) - 1)
    assert max(abs(e) for e in errors) <= 0.005, errors
    assert abs(statistics.mean(errors)) <= 0.002, errors


def test_each_row_records_the_counter_period_it_observed(run):
    rows, _ = run("measure.window_s=1")  # the A100 profile's counter: 100 ms
    (row,) = rows
    assert row["energy_counter_period_s"] == pytest.approx(0.1, abs=0.01)
    assert 9 <= row["energy_counter_updates"] <= 12  # 1 s, ending on the update after it


def test_a_window_too_short_for_the_counter_is_invalid_and_says_so(run):
    rows, _ = run("measure.window_s=0.2", "measure.min_counter_updates=10")
    (row,) = rows
    assert not row["valid"]
    assert "energy-counter updates" in row["invalid_reason"]
    assert "lengthen measure.window_s" in row["invalid_reason"]


def test_the_timed_window_queues_bare_calls_and_checks_them_in_a_run_after_it(run, kernel_cache):
    cache = TracingCache(kernel_cache)
    # An exact counter (period 0) moves on every call, so each edge wait is one call and what is
    # left is the window's own loop.
    rows, _ = run(
        "workload=stencil", "measure.warmup_iters=0", "device.energy_update_period_s=0",
        "measure.min_counter_updates=0", kernels=cache,
    )
    (row,) = rows
    events = cache.events
    first_checked = events.index("dispatch_checked")
    window = events[:first_checked]
    # The window only queues calls and waits for the device now and then: no host copy, no
    # per-call wait (the edge waits at both ends included).
    assert set(window) == {"dispatch", "sync"}
    assert window.count("dispatch") >= row["iterations"] > 100
    # ~1/32 of the window each, in whole calls (so a little more than 32 chunks), plus 2 edges.
    chunk_s = _chunk(row["time_per_iter_s"], 0.5, 10**9) * row["time_per_iter_s"]
    assert window.count("sync") <= max(CHUNKS_PER_WINDOW, math.ceil(row["time_s"] / chunk_s)) + 4
    check_run = events[first_checked:]
    assert check_run.count("dispatch_checked") == row["checked_iters"] == row["iterations"]
    assert "dispatch" not in check_run and "call_device" not in check_run


@pytest.mark.parametrize("digest", ["after", "inline", "host"])
def test_every_digest_mode_checks_every_call_it_counts(run, digest):
    rows, _ = run("workload=stencil", f"measure.digest={digest}")
    (row,) = rows
    assert row["status"] == "ok" and row["digest"] == digest
    assert row["determinism_mismatches"] == 0
    assert row["checked_iters"] == row["iterations"]
    if digest == "after":
        assert row["check_time_s"] > 0  # a separate run, recorded beside the window
    else:
        assert row["check_time_s"] is None  # checked inside the window


@pytest.mark.parametrize("digest", ["after", "inline"])
def test_sim_faults_below_the_threshold_reach_the_on_device_checks(run, digest):
    rows, _ = run(
        "device.planted_thresholds={0: {gemm: 1065}}", "device.sm_clock_mhz=1035",
        "measure.min_iters=40", f"measure.digest={digest}",
    )
    (row,) = rows
    assert row["status"] in ("wrong", "nondeterministic"), row["status"]
    assert row["determinism_mismatches"] > 0 or row["rel_error"] > 3e-5


def test_a_check_run_can_be_shorter_than_the_window(run):
    rows, _ = run("workload=stencil", "measure.check_iters=7")
    (row,) = rows
    assert row["checked_iters"] == 7 < row["iterations"]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("measure.digest=blake", "measure.digest='blake' is not one of: after, inline, host"),
        ("measure.check_iters=0", "measure.check_iters=0 must be between 1"),
        ("measure.counter_edge_wait_s=-1",
         "measure.counter_edge_wait_s=-1 must be between 0 and 60 s"),
    ],
)
def test_bad_window_settings_are_one_line_errors(override, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        validate_static(compose([override]))
