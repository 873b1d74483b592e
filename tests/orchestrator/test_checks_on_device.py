"""A trial's checks stay on the device: no output reaches the host, the reference is computed
once per kernel whatever the sweep's settings, and the comparison runs after the restore."""

from __future__ import annotations

import os

import pytest

from kernels import KernelCache
from orchestrator.config import compose
from orchestrator.devices import CPU_ONLY_ENV, journal_dir, open_backend
from orchestrator.jobs.job import JobSpec
from orchestrator.measuring.guard import SettingsGuard
from orchestrator.measuring.journal import Journal
from orchestrator.measuring.memory import held_samples
from orchestrator.measuring.trial import TrialContext, run_trial

FINGERPRINT_BYTES = 8  # two uint32 words per checked call
ERROR_SUMS_BYTES = 8  # two float32 numbers per compared output


# Real calls at the cpu preset take tens of ms on 2 cores: a short window, no edge waits.
SHORT = ("measure.check_iters=4", "measure.window_s=0.02", "measure.meter=polling")


def host_bytes_of_checks(row) -> int:
    """What the checks may bring to the host: fingerprints and error sums, nothing else."""
    return FINGERPRINT_BYTES * row["checked_iters"] + ERROR_SUMS_BYTES * row["outputs_compared"]


@pytest.mark.slow
def test_a_sweep_at_a_large_preset_copies_no_output_and_computes_the_reference_once(run):
    cache = KernelCache()
    rows = []
    for clock in (1410, 1110, 810):
        trial_rows, ctx = run("workload=stencil", "workload.size=cpu", *SHORT,
                              "measure.repeats=2", f"device.sm_clock_mhz={clock}", kernels=cache)
        rows += trial_rows
    (kernel,) = cache._kernels.values()
    assert cache.builds == 1 and kernel.reference_builds == 1
    assert kernel.output_bytes == 4 * 256**3  # the cpu preset: a 64 MiB output
    for row in rows:
        assert row["status"] == "ok", row.get("error")
        assert row["outputs_sampled"] == 3  # calls 1, 2 and 4, the last of the 4 checked
        assert row["outputs_compared"] == 1  # ... bitwise equal: compared once
        assert row["bytes_to_host"] == host_bytes_of_checks(row)
        assert row["bytes_to_host"] < 1024 < kernel.output_bytes


def test_on_the_host_cpu_a_trial_copies_no_output_either(tmp_path, monkeypatch):
    for name, _ in CPU_ONLY_ENV.items():  # device=cpu hides the GPUs process-wide: undone after
        monkeypatch.setenv(name, os.environ.get(name, ""))
    cfg = compose(["device=cpu", f"device.state_dir={tmp_path}", "workload=gemm",
                   "workload.size=cpu", "measure=quick", "measure.check_iters=3"])
    backend = open_backend(cfg.device)
    device = backend.device(0)
    try:
        with SettingsGuard(device, Journal(journal_dir(cfg.device))) as guard:
            ctx = TrialContext(device=device, guard=guard, kernels=KernelCache())
            (row,) = run_trial(ctx, JobSpec.from_config(cfg))
    finally:
        backend.close()
    assert row["status"] == "ok", row.get("error")
    assert row["bytes_to_host"] == host_bytes_of_checks(row)
    assert row["phase_compare_s"] > 0


def test_bitwise_equal_samples_are_compared_once_and_a_corrupted_one_beside_them(run):
    """Samples with equal fingerprints hold equal bits; the one the sim corrupted differs."""
    import numpy as np

    from kernels import KernelOptions, build_kernel
    from orchestrator.devices.base import Fault
    from orchestrator.measuring.window import _Recorder

    kernel = build_kernel(KernelOptions("gemm", "jax", preset="tiny"))
    recorder = _Recorder(kernel, "after", {1, 2, 4}, np.random.default_rng(0))
    for call in range(1, 6):
        recorder.dispatch(lambda call=call: Fault.CORRUPT if call == 2 else Fault.NONE)
    checks = recorder.finish()
    assert checks.calls == 5
    assert len(checks.sampled) == 2 and checks.identical == 2  # calls 1, 4, 5 alike; 2 not
    good, corrupted = checks.sampled
    assert isinstance(corrupted, np.ndarray)  # the sim's flipped copy, on the host
    assert not np.array_equal(kernel.fetch([good])[0], corrupted)
    assert len(kernel.compare(checks.sampled)) == 2


class ClockAtCompare(KernelCache):
    """A kernel cache whose kernels note the device's SM clock lock whenever they compare."""

    def __init__(self, device_of):
        super().__init__()
        self.device_of = device_of
        self.clocks: list[int] = []

    def get(self, *args, **kwargs):
        return _Noting(super().get(*args, **kwargs), self)


class _Noting:
    def __init__(self, kernel, cache):
        self._kernel, self._cache = kernel, cache

    def compare(self, outputs):
        self._cache.clocks.append(self._cache.device_of().settings().sm_clock_locked_mhz)
        return self._kernel.compare(outputs)

    def __getattr__(self, name):
        return getattr(self._kernel, name)


def test_the_comparison_runs_once_the_guard_has_put_the_device_back(run):
    devices = []
    cache = ClockAtCompare(lambda: devices[-1])
    seen_in_window = []
    (row,), ctx = run("device.sm_clock_mhz=810", "measure.repeats=1", kernels=cache,
                      before=devices.append,
                      on_kernel_calls=lambda: seen_in_window.append(devices[-1].sm_clock_mhz()))
    assert row["status"] == "ok" and row["outputs_compared"] == 1
    assert seen_in_window == [810]
    assert len(cache.clocks) == 1 and cache.clocks[0] != 810  # compared at the default clock


@pytest.mark.parametrize(
    ("samples", "output_bytes", "budget", "windows", "held"),
    [
        (4, 2**30, 8 * 2**30, 1, 4),  # 5 GiB of 8: all held
        (4, 2**30, 8 * 2**30, 2, 3),  # 2 windows x 4 GiB
        (4, 2**30, 2**30, 1, 0),  # the last alone
        (4, 2**30, 0, 1, 0),  # over budget: the last is held all the same
        (4, 0, 0, 3, 4),  # a stand-in kernel that says nothing of its output
        (4, 2**30, float("inf"), 2, 4),  # free memory unknown and no cap: no bound
    ],
)
def test_held_samples_fit_the_budget_and_say_when_fewer(samples, output_bytes, budget, windows,
                                                        held):
    got, note = held_samples(samples, output_bytes, budget, windows)
    assert got == held
    assert (note is None) == (held == samples)
    if note is not None:
        assert f"{held + 1} of {samples + 1} sampled outputs" in note
        assert "measure.held_outputs_gib" in note


def test_a_trial_over_the_budget_holds_fewer_samples_and_its_row_says_so(run):
    # 42 KB of budget, 16 KiB outputs (the tiny 3-d stencil): calls 1 and the last
    (row,), _ = run("workload=stencil", "measure.held_outputs_gib=0.00004")
    assert row["status"] == "ok"
    assert row["outputs_sampled"] == 2
    assert "sampled outputs held per window" in row["samples_note"]
