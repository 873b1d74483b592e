"""One trial on the simulated GPU: energy, correctness below and above the threshold, validity."""

from __future__ import annotations

import time

import pytest
from support import signal_in_a_gc_callback

from orchestrator.config import compose
from orchestrator.jobs.job import JobSpec
from orchestrator.measuring.phases import PHASES
from orchestrator.measuring.trial import run_trial
from orchestrator.results.rows import objective


def test_counter_energy_equals_model_power_times_time(run):
    rows, _ = run("measure.window_s=10", "device.energy_update_period_s=0.02")
    (row,) = rows
    assert row["status"] == "ok" and row["valid"], row
    assert row["meter"] == "counter"
    # A compute-bound kernel at a fixed clock draws constant model power: energy = P x t.
    assert row["energy_j"] == pytest.approx(row["peak_power_w"] * row["time_s"], rel=5e-3)
    # Every update of the 20 ms counter is counted, however slowly power is sampled (20 Hz).
    assert abs(row["energy_counter_updates"] - row["time_s"] / 0.02) <= 2


def test_polling_at_20_hz_is_within_3_percent_over_2_s(run):
    rows, _ = run(
        "measure.window_s=2", "measure.meter=polling", "measure.poll_hz=20", "workload=stencil"
    )
    (row,) = rows
    assert row["meter"] == "polling"
    assert row["energy_j"] == pytest.approx(row["peak_power_w"] * row["time_s"], rel=0.03)


def test_below_the_planted_threshold_the_checks_fail_and_above_they_pass(run):
    planted = "device.planted_thresholds={0: {gemm: 1065}}"
    above, _ = run(planted, "device.sm_clock_mhz=1200", "measure.min_iters=40")
    below, _ = run(planted, "device.sm_clock_mhz=900", "measure.min_iters=40")
    assert above[0]["status"] == "ok"
    assert above[0]["determinism_mismatches"] == 0
    assert below[0]["status"] in ("wrong", "nondeterministic", "crash")
    assert below[0]["status"] != "ok"


def test_a_power_cap_below_the_draw_makes_a_clocked_trial_invalid(run):
    rows, _ = run("device.sm_clock_mhz=1410", "device.power_limit_w=150")
    (row,) = rows
    assert not row["valid"]
    assert "sw_power_cap" in row["invalid_reason"]
    assert "sw_power_cap" in row["throttle_reasons"]
    assert row["observed_sm_clock_mhz"] < 1410 - 30


def test_a_kernel_that_raises_is_a_crash_row_and_the_device_is_restored(run):
    class Exploding:
        builds = 0

        def get(self, *a, **k):
            raise RuntimeError("CUDA_ERROR_ILLEGAL_ADDRESS")

    rows, ctx = run("device.power_limit_w=250", "measure.repeats=2")
    ctx.kernels = Exploding()
    cfg = compose(
        ["workload.size=tiny", "measure=quick", "device.power_limit_w=250", "measure.repeats=2"]
    )
    crashed = run_trial(ctx, JobSpec.from_config(cfg))
    assert [r["status"] for r in crashed] == ["crash", "crash"]
    assert "CUDA_ERROR_ILLEGAL_ADDRESS" in crashed[0]["error"]
    assert ctx.device.settings().power_limit_w == 400
    assert objective(crashed, "energy_per_work") == float("inf")


def test_repeats_give_one_row_each_with_the_same_key(run):
    rows, _ = run("measure.repeats=3")
    assert [r["repeat"] for r in rows] == [0, 1, 2]
    assert len({r["trial_key"] for r in rows}) == 1
    assert all(r["status"] == "ok" for r in rows)
    assert objective(rows, "edp") > 0


def test_each_row_says_where_its_wall_time_went_and_a_trials_rows_add_up(run):
    t0 = time.perf_counter()
    rows, _ = run("measure.repeats=2")
    elapsed = time.perf_counter() - t0
    first, last = rows
    trial_own = ("build", "settings", "warmup")
    for row in rows:
        phases = {name: row[f"phase_{name}_s"] for name in PHASES}
        assert all(v is None or v >= 0 for v in phases.values()), phases
        assert row["wall_s"] == pytest.approx(sum(v for v in phases.values() if v is not None))
        for name in ("edge_wait", "window", "check_run", "compare"):  # each repeat's own
            assert phases[name] is not None, name
        assert phases["window"] > 0 and phases["check_run"] > 0
    assert all(first[f"phase_{name}_s"] is not None for name in trial_own)
    assert all(last[f"phase_{name}_s"] is None for name in trial_own)  # counted once
    assert last["phase_restore_s"] is not None and first["phase_restore_s"] is None
    # The phases are the trial's own seconds: they fit inside the time the call took (which
    # also composed the config and opened the machine).
    assert 0 < first["wall_s"] + last["wall_s"] <= elapsed


def test_rows_record_the_die_temperature_at_the_windows_start_and_end(run):
    # A 10 s GEMM window on a cool simulated A100 (time constant 40 s) warms the die, so the
    # repeat after it starts hotter: the bias a back-to-back sweep carries into its next trial.
    first, second = run("measure.window_s=10", "measure.repeats=2")[0]
    assert first["temperature_start_c"] + 3 <= first["temperature_c"]
    assert second["temperature_start_c"] >= first["temperature_c"] - 1
    assert second["temperature_start_c"] > first["temperature_start_c"]


def _signal_inside_a_gc_callback(signum) -> None:
    import gc

    with signal_in_a_gc_callback(signum) as gc_signal:
        gc_signal.arm()
        gc.collect()
    assert gc_signal.sent == [signum]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the drop itself
@pytest.mark.parametrize("name", ["SIGINT", "SIGTERM"])
def test_a_signal_whose_interrupt_python_dropped_still_stops_the_trial(run, name):
    import signal

    from orchestrator import interrupt
    signum = getattr(signal, name)
    with interrupt.handling():
        with pytest.raises(KeyboardInterrupt, match=name):
            run("device.sm_clock_mhz=1065", before=lambda _: _signal_inside_a_gc_callback(signum))
        assert interrupt.received() == signum
    with interrupt.handling():  # a new command: the signal is forgotten
        assert interrupt.received() is None


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the drop itself
def test_a_ctrl_c_dropped_mid_window_after_the_guard_put_the_gpu_back_stores_no_row(run):
    """Ctrl-C inside the window, in a gc callback: the guard's handler puts the GPU back at once
    (mid-window), then the KeyboardInterrupt is dropped. The trial must not return rows measured
    partly at the default clock."""
    import signal

    from orchestrator import interrupt
    calls = []

    def ctrl_c_on_the_first_call():
        calls.append(1)
        _signal_inside_a_gc_callback(signal.SIGINT)

    with interrupt.handling():
        with pytest.raises(KeyboardInterrupt, match="SIGINT"):
            run("device.sm_clock_mhz=1065", on_kernel_calls=ctrl_c_on_the_first_call)
    assert calls == [1]


def test_a_job_is_validated_once_however_many_hands_it_passes_through(tmp_path, monkeypatch):
    # Two jobs made as a launcher makes them and run by one worker (in this process, as a Ray
    # actor runs them): each job's workload and fault are checked once, when it is made; the
    # worker, the trial and every getter of the spec (counts, peak, size, footprint) check
    # nothing again. The only other check of the spec's options is the kernel build's own, once
    # per kernel built (the second job finds its kernel in the cache).
    from kernels.spec import KernelSpec
    from orchestrator.jobs import checks
    from orchestrator.jobs.job import JobSpec
    from orchestrator.measuring.worker import GpuWorker

    calls = {"workload": 0, "inject": 0, "spec": 0}

    def counted(name, fn):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(checks, "validate_workload", counted("workload", checks.validate_workload))
    monkeypatch.setattr(checks, "validate_inject", counted("inject", checks.validate_inject))
    monkeypatch.setattr(KernelSpec, "validate", counted("spec", KernelSpec.validate))
    base = ["workload.size=tiny", "measure=quick", f"device.state_dir={tmp_path / 'sim'}",
            f"device.journal_dir={tmp_path / 'journal'}"]
    made = [JobSpec.from_config(compose([*base, f"device.sm_clock_mhz={mhz}"]), tmp_path)
            for mhz in (1005, 1410)]
    assert (calls["workload"], calls["inject"]) == (2, 2)
    checks_of_the_jobs = calls["spec"]
    worker = GpuWorker(made[0].config.device, ray_gpu_id=0)
    try:
        assert worker.acquire().ok
        replies = [worker.run(job, "test") for job in made]
    finally:
        worker.close()
    assert [r["status"] for reply in replies for r in reply.rows] == ["ok", "ok"]
    assert (calls["workload"], calls["inject"]) == (2, 2)  # one per job, none in the worker
    assert calls["spec"] - checks_of_the_jobs == replies[-1].builds == 1  # the build's own
