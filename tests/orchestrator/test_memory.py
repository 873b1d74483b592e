"""A trial fits the memory of its device: out of memory is its own outcome, refused before any
setting or caught in the trial, never a crash and never evidence against the setting;
``workload.size=auto`` picks the largest size that fits; a worker's arrays do not pile up."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from kernels import KernelCache
from kernels.registry import get_spec
from orchestrator.config import compose
from orchestrator.devices import CPU_ONLY_ENV, journal_dir, open_backend
from orchestrator.devices.base import MemoryInfo
from orchestrator.jobs.job import JobSpec
from orchestrator.launching.resume import resume_of
from orchestrator.measuring.guard import SettingsGuard
from orchestrator.measuring.journal import Journal
from orchestrator.measuring.memory import (
    HostPeak,
    OutOfMemory,
    is_out_of_memory,
    plan_trial,
)
from orchestrator.measuring.trial import TrialContext, run_trial
from orchestrator.results.rows import Status, failed_by, fails_setting, outcome_of

PROFILES = Path(__file__).resolve().parents[2] / "conf" / "device" / "profile"
FAST = ("measure.check_iters=3", "measure.window_s=0.02")


def small_board(tmp_path: Path, gib: int = 1) -> Path:
    """A V100 profile whose board has ``gib`` GiB (the sim reads the "NNGB" of its name)."""
    text = (PROFILES / "v100_sxm2_16gb.yaml").read_text()
    path = tmp_path / f"v100_{gib}gb.yaml"
    path.write_text(text.replace("name: Tesla V100-SXM2-16GB", f"name: Tesla V100-SXM2-{gib}GB"))
    return path


def test_a_board_too_small_for_the_sim_size_refuses_before_any_setting(run, tmp_path):
    # gemm at sim_size=gpu: 8192^3, 0.5 GiB of inputs, a 0.25 GiB output and a 0.5 GiB
    # reference: more than a 1 GiB board has
    rows, ctx = run("workload=gemm", f"device.profile={small_board(tmp_path)}",
                    "device.sm_clock_mhz=900", *FAST)
    (row,) = rows
    assert row["status"] == Status.OUT_OF_MEMORY and row["failed_by"] == "memory"
    assert "needs" in row["error"] and "GiB free" in row["error"]
    assert "\n" not in row["error"]  # one line, no traceback
    assert row.get("phase_settings_s") is None  # the guard was never asked to set anything
    assert row.get("phase_build_s") is None  # ... nor was the kernel built


def test_the_same_board_runs_a_size_that_fits(run, tmp_path):
    rows, _ = run("workload=gemm", f"device.profile={small_board(tmp_path, 16)}", *FAST)
    assert rows[0]["status"] == Status.OK, rows[0].get("error")
    assert rows[0]["footprint_bytes"] > 2**30  # the gpu preset's, which the sim models
    assert rows[0]["device_free_bytes"] > rows[0]["footprint_bytes"]


def test_out_of_memory_is_no_evidence_and_leaves_the_searchs_threshold_unchanged():
    from orchestrator.search.algorithm import ThresholdSearch, run_search

    clocks = list(range(600, 1411, 30))  # riskiest first
    row_of = {True: {"status": "ok", "valid": True, "checked_iters": 2000},
              False: {"status": "wrong", "valid": False, "checked_iters": 2000}}

    def trial(probe, oom_first=False):
        if oom_first and probe.attempt == 0:  # the first trial at each clock ran out of memory
            return outcome_of([{"status": Status.OUT_OF_MEMORY, "checked_iters": 0}])
        return outcome_of([row_of[probe.value >= 960]])

    plain = run_search(ThresholdSearch(clocks, 4000), trial)
    with_oom = run_search(ThresholdSearch(clocks, 4000, max_inconclusive=3),
                          lambda p: trial(p, oom_first=True))
    assert not fails_setting(Status.OUT_OF_MEMORY)
    assert failed_by(Status.OUT_OF_MEMORY) == "memory"
    assert outcome_of([{"status": Status.OUT_OF_MEMORY}]).passed is None  # no evidence
    assert plain.stable_value == with_oom.stable_value == 960
    assert plain.failing_value == with_oom.failing_value == 930


def test_a_rerun_does_not_retry_out_of_memory_at_the_same_size():
    rows = [{"repeat": 0, "status": Status.OUT_OF_MEMORY, "attempt": 1}]
    for policy in ("never", "not_measured", "failed"):
        assert not resume_of(rows, 1, policy).run
    assert resume_of([{"repeat": 0, "status": "crash", "attempt": 1}], 1, "failed").run


@pytest.fixture
def cpu_ctx(tmp_path, monkeypatch):
    """A trial context on the host CPU (device=cpu hides the GPUs process-wide: undone)."""
    for name in CPU_ONLY_ENV:
        monkeypatch.setenv(name, os.environ.get(name, ""))
    opened = []

    def make(*overrides):
        cfg = compose(["device=cpu", f"device.state_dir={tmp_path}", "measure=quick", *FAST,
                       *overrides])
        backend = open_backend(cfg.device)
        guard = SettingsGuard(backend.device(0), Journal(journal_dir(cfg.device))).__enter__()
        opened.append(guard)
        return TrialContext(device=backend.device(0), guard=guard, kernels=KernelCache()), cfg

    yield make
    for guard in opened:
        guard.close()


def test_a_memory_error_on_the_cpu_is_out_of_memory_not_a_crash(cpu_ctx, monkeypatch):
    from kernels.build import BuiltKernel

    def no_memory(self):
        raise MemoryError("Unable to allocate 64.0 GiB for an array")

    monkeypatch.setattr(BuiltKernel, "reference", no_memory)
    ctx, cfg = cpu_ctx("workload=selu", "workload.size=tiny")
    (row,) = run_trial(ctx, JobSpec.from_config(cfg))
    assert row["status"] == Status.OUT_OF_MEMORY, row.get("error")
    assert "MemoryError" in row["error"] and "planned" in row["error"]


@pytest.mark.parametrize("text, oom", [
    ("RESOURCE_EXHAUSTED: Error allocating device buffer: 1.00G", True),
    ("OOM when allocating tensor with shape[8192,8192]", True),
    ("CUDA out of memory. Tried to allocate 2.00 GiB", True),
    ("INVALID_ARGUMENT: shapes do not match", False),
])
def test_frameworks_out_of_memory_errors_are_told_apart(text, oom):
    assert is_out_of_memory(RuntimeError(text)) is oom
    assert is_out_of_memory(MemoryError())


@dataclass
class _Identity:
    backend: str = "tpu"


class _Device:
    """A device with a given amount of free memory (the plan reads nothing else)."""

    def __init__(self, free_gib: float, backend: str = "tpu"):
        self.identity = _Identity(backend)
        self._free = int(free_gib * 2**30)

    def memory_info(self):
        return MemoryInfo(16 * 2**30, self._free)


def test_auto_picks_the_largest_size_that_fits_and_says_so():
    cfg = compose(["workload=gemm", "workload.size=auto", "device.backend=cpu"])
    spec = get_spec("gemm")
    plan = plan_trial(_Device(12), spec, cfg)  # gpu needs 2.5 GiB
    assert plan.preset == "gpu" and "size=auto chose gpu" in plan.note
    plan = plan_trial(_Device(1.0), spec, cfg)  # cpu needs about 0.16 GiB
    assert plan.preset == "cpu"
    assert plan.footprint.device <= 0.9 * 2**30
    with pytest.raises(OutOfMemory, match="no size of gemm fits"):
        plan_trial(_Device(0.00001), spec, cfg)


def test_the_plan_reads_the_work_at_the_size_the_device_is_charged():
    # Off the sim: the counts of the size auto chose; on the sim: those of sim_size, which the
    # sim charges, while the host computes the smallest preset. Read once, for that size alone.
    spec = get_spec("gemm")
    cfg = compose(["workload=gemm", "workload.size=auto", "device.backend=cpu"])
    plan = plan_trial(_Device(1.0), spec, cfg)
    assert plan.preset == "cpu" and plan.counts == spec.counts("cpu", "float32")
    assert plan.peak == spec.peak("float32", cfg.framework.precision, cfg.framework.name)
    assert plan.counts_s >= 0.0
    sim = compose(["workload=gemm", "workload.sim_size=gpu"])
    plan = plan_trial(_Device(12, backend="sim"), spec, sim)
    assert (plan.preset, plan.sim_preset) == ("tiny", "gpu")
    assert plan.counts == spec.counts("gpu", "float32")


def test_a_fixed_size_that_does_not_fit_is_refused_in_one_line():
    cfg = compose(["workload=gemm", "workload.size=gpu", "device.backend=cpu"])
    with pytest.raises(OutOfMemory) as e:
        plan_trial(_Device(1.0), get_spec("gemm"), cfg)
    assert "gpu: needs 1.5 GiB of device memory" in str(e.value) and "GiB free" in str(e.value)
    assert "\n" not in str(e.value)


def test_held_samples_are_bounded_by_a_share_of_free_memory():
    cfg = compose(["workload=gemm", "workload.size=gpu", "measure.held_outputs_share=0.1"])
    plan = plan_trial(_Device(12), get_spec("gemm"), cfg)
    assert plan.footprint.held <= 0.1 * 12 * 2**30 + plan.footprint.output
    assert plan.footprint.samples < cfg.measure.reference_samples


@pytest.mark.slow
def test_a_workers_device_arrays_do_not_grow_over_a_sweep_of_workloads(run):
    import jax

    def live_bytes():
        return sum(a.nbytes for a in jax.live_arrays())

    cache = KernelCache()  # the worker's: other tests' kernels live in another cache
    before = live_bytes()
    grown = []
    for workload in ("stencil", "gemm", "selu", "conv3d", "hessian", "stencil"):
        (row,), _ = run(f"workload={workload}", *FAST, kernels=cache)
        assert row["status"] == Status.OK, row.get("error")
        resident = [k for k in cache._kernels.values() if k.resident]
        assert [k.workload for k in resident] == [workload]  # the others' arrays released
        grown.append((live_bytes() - before, resident[0].device_bytes))
    for extra, own in grown:  # what the worker holds is the current kernel's, never a sum
        assert extra <= own + 64 * 2**10
    assert grown[-1][0] <= grown[0][0] + 64 * 2**10  # stencil again: no more than the first time
    assert cache.builds == 5  # compiled functions kept: stencil was not built twice


def test_the_host_peak_is_recorded_on_every_row(run):
    rows, _ = run("workload=selu", "measure.repeats=2", *FAST)
    assert all(r["host_peak_bytes"] and r["host_peak_bytes"] > 2**20 for r in rows)
    peak = HostPeak()
    peak.start()
    assert peak.peak_bytes() > 0


def test_a_kernels_arrays_come_back_after_release():
    from kernels import KernelOptions

    cache = KernelCache()
    kernel = cache.get(KernelOptions("gemm", framework="jax", preset="tiny"))
    first = kernel.call()
    kernel.compare([kernel.call_device()])
    cache.release_others(None)
    assert not kernel.resident and kernel.device_bytes == 0
    again = kernel.call()
    assert (first == again).all() and kernel.resident


@pytest.mark.parametrize("arithmetic, gemm, stencil", [
    ("tf32", 1e-3, 1e-5),  # an Ampere or later GPU, JAX or TensorFlow
    ("float32", 3e-5, 1e-5),  # PyTorch, a V100, a CPU: the fp32 column
    ("bfloat16", 1e-2, 1e-5),  # a TPU: one bf16 pass for matmuls, elementwise stays fp32
])
def test_the_default_precisions_tolerance_follows_the_devices_arithmetic(arithmetic, gemm,
                                                                         stencil):
    from kernels.checks import tolerance_for

    assert tolerance_for("float32", "default", "gemm", arithmetic) == gemm
    assert tolerance_for("float32", "default", "stencil", arithmetic) == stencil
    assert tolerance_for("float32", "highest", "gemm", arithmetic) == 3e-5  # unchanged
    model = tolerance_for("float32", "default", "bert_train", arithmetic)
    assert model == {"tf32": 3e-4, "float32": 1e-6, "bfloat16": 2.4e-3}[arithmetic]


@pytest.mark.parametrize("profile, framework, arithmetic", [
    ("a100_sxm4_40gb", "jax", "tf32"), ("h100_sxm5_80gb", "jax", "tf32"),
    ("a100_sxm4_40gb", "pytorch", "float32"), ("v100_sxm2_16gb", "jax", "float32"),
])
def test_a_rows_check_arithmetic_is_the_boards(run, profile, framework, arithmetic):
    rows, ctx = run("workload=selu", f"device.profile={profile}", f"framework={framework}",
                    *FAST)
    assert ctx.device.float32_matmul_default(framework) == arithmetic
    assert ctx.device.float32_matmul_default("tensorflow") == (  # as JAX's, without its import
        ctx.device.float32_matmul_default("jax"))
    assert rows[0]["check_arithmetic"] == arithmetic
