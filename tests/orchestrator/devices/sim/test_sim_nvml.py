"""The simulated NVML as an NVML client sees it, and the GPU model behind it."""

from __future__ import annotations

import multiprocessing as mp

import pynvml
import pytest

from orchestrator.devices.base import Fault, KernelWork
from orchestrator.devices.sim import model
from orchestrator.devices.sim import nvml as sim
from orchestrator.devices.sim.profile import load_profile
from orchestrator.devices.sim.state import Machine, MachineSpecError, create_machine

GEMM = KernelWork(
    flops=2 * 8192**3,
    bytes_moved=3 * 4 * 8192**2,
    peak="fp32",
    kernel_class="gemm",
    framework="jax",
)
STENCIL = KernelWork(
    flops=3 * 2**28, bytes_moved=8 * 2**28, peak="fp32", kernel_class="stencil", framework="jax"
)


@pytest.fixture
def machine(tmp_path, monkeypatch):
    """An initialised two-GPU A100 machine; NVML shut down afterwards."""
    state = tmp_path / "sim"
    monkeypatch.setenv("DVFS_SIM_STATE_DIR", str(state))
    create_machine(state, "a100_sxm4_40gb", count=2, energy_update_period_s=0.02)
    sim.nvmlInit()
    yield state
    sim.nvmlShutdown()


def survey(nvml):
    """A third-party NVML client written only against pynvml's API."""
    out = []
    nvml.nvmlInit()
    try:
        for i in range(nvml.nvmlDeviceGetCount()):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            clocks = nvml.nvmlDeviceGetSupportedGraphicsClocks(
                h, nvml.nvmlDeviceGetSupportedMemoryClocks(h)[0]
            )
            nvml.nvmlDeviceSetGpuLockedClocks(h, clocks[-1], clocks[len(clocks) // 2])
            nvml.nvmlDeviceResetGpuLockedClocks(h)
            try:
                energy = nvml.nvmlDeviceGetTotalEnergyConsumption(h)
            except nvml.NVMLError_NotSupported:
                energy = None
            out.append((
                nvml.nvmlDeviceGetName(h),
                nvml.nvmlDeviceGetUUID(h),
                energy,
                nvml.nvmlDeviceGetPciInfo(h).busId,
            ))
    finally:
        nvml.nvmlShutdown()
    return out


def test_a_pynvml_client_runs_unchanged_over_the_sim(machine):
    rows = survey(sim)
    assert [r[0] for r in rows] == ["NVIDIA A100-SXM4-40GB"] * 2
    assert all(r[1].startswith("GPU-") and r[2] == 0 for r in rows)
    assert rows[0][3] == "00000000:07:00.0"  # nvidia-ml-py 13 decodes char fields


def test_the_error_classes_are_nvidia_ml_pys_own(machine):
    h = sim.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        sim.nvmlDeviceSetGpuLockedClocks(h, 100, 5000)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        sim.nvmlDeviceGetHandleByIndex(7)
    with pytest.raises(pynvml.NVMLError_NotFound):
        sim.nvmlDeviceGetHandleByUUID("GPU-nope")
    assert sim.NVMLError_NoPermission is pynvml.NVMLError_NoPermission
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):  # unsimulated: never reaches a driver
        sim.nvmlDeviceGetBAR1MemoryInfo(h)


def test_calls_before_init_are_uninitialized(tmp_path, monkeypatch):
    monkeypatch.setenv("DVFS_SIM_STATE_DIR", str(tmp_path))
    create_machine(tmp_path, "a100_sxm4_40gb")
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        sim.nvmlDeviceGetCount()


def test_energy_counter_is_quantised_to_its_update_period(machine):
    h = sim.nvmlDeviceGetHandleByIndex(0)
    seen = set()
    for _ in range(40):
        sim.simDeviceRecordKernelCall(h, STENCIL)  # ~1.4 ms each: many calls per 20 ms update
        seen.add(sim.nvmlDeviceGetTotalEnergyConsumption(h))
    elapsed = sim.simDeviceGetTimeS(h)
    assert len(seen) <= int(elapsed / 0.02) + 2
    assert len(seen) >= 2


def test_compute_bound_time_scales_with_clock_and_memory_bound_barely(machine):
    p = load_profile("a100_sxm4_40gb")
    t = lambda work, f: model.operating_point(p, work, max_clock_mhz=f).duration_s  # noqa: E731
    assert t(GEMM, 705) / t(GEMM, 1410) == pytest.approx(2.0, rel=0.01)
    assert t(STENCIL, 705) / t(STENCIL, 1410) < 1.1


def test_faults_are_zero_above_the_threshold_rise_below_and_crash_far_below():
    p = load_profile("a100_sxm4_40gb")
    T = 1065
    assert model.fault_probability(p, T, T).any == 0.0
    assert model.fault_probability(p, 1410, T).any == 0.0
    near, mid, far = (model.fault_probability(p, f, T) for f in (1050, 990, 600))
    assert 0 < near.any < mid.any < far.any
    assert near.crash == 0 and mid.crash == 0 and far.crash > 0.9


def test_faults_are_reproducible_with_the_seed(tmp_path, monkeypatch):
    def draws(state):
        monkeypatch.setenv("DVFS_SIM_STATE_DIR", str(state))
        create_machine(state, "a100_sxm4_40gb", seed=3, planted={0: {"gemm": 1200}})
        sim.nvmlInit()
        try:
            h = sim.nvmlDeviceGetHandleByIndex(0)
            sim.nvmlDeviceSetGpuLockedClocks(h, 1170, 1170)
            return [sim.simDeviceRecordKernelCall(h, GEMM).fault for _ in range(50)]
        finally:
            sim.nvmlShutdown()

    a, b = draws(tmp_path / "a"), draws(tmp_path / "b")
    assert a == b
    assert Fault.CORRUPT in a and Fault.NONE in a


def test_the_seed_claims_scenario_plants_1065_for_jax_and_510_for_tensorflow(tmp_path, monkeypatch):
    monkeypatch.setenv("DVFS_SIM_STATE_DIR", str(tmp_path))
    create_machine(tmp_path, "a100_sxm4_40gb", scenario="seed_claims")
    sim.nvmlInit()
    try:
        h = sim.nvmlDeviceGetHandleByIndex(0)
        assert sim.simDeviceGetStabilityThresholdMhz(h, "gemm", "jax") == 1065
        assert sim.simDeviceGetStabilityThresholdMhz(h, "stencil", "tensorflow") == 510
    finally:
        sim.nvmlShutdown()


def test_seeded_thresholds_differ_between_chips_and_lie_inside_the_band(tmp_path):
    p = load_profile("a100_sxm4_40gb")
    machine = create_machine(tmp_path, "a100_sxm4_40gb", count=8)
    values = {model.stability_threshold_mhz(p, g.uuid, "gemm") for g in machine.gpus}
    assert len(values) > 4
    lo = p.f_min_mhz + 0.2 * (p.f_max_mhz - p.f_min_mhz)
    hi = p.f_min_mhz + 0.6 * (p.f_max_mhz - p.f_min_mhz)
    assert all(lo - 15 <= v <= hi + 15 for v in values)


def test_a_different_machine_in_the_same_directory_is_refused(tmp_path):
    create_machine(tmp_path, "a100_sxm4_40gb", count=2)
    create_machine(tmp_path, "a100_sxm4_40gb", count=2)  # the same spec re-opens
    with pytest.raises(MachineSpecError, match="already holds a different simulated machine"):
        create_machine(tmp_path, "h100_sxm5_80gb")


def _hammer(state: str, n: int) -> float:
    import os

    os.environ["DVFS_SIM_STATE_DIR"] = state
    sim.nvmlInit()
    h = sim.nvmlDeviceGetHandleByIndex(0)
    total = 0.0
    for k in range(n):
        total += sim.simDeviceRecordKernelCall(h, STENCIL).energy_mj
        if k % 10 == 0:
            sim.nvmlDeviceSetPowerManagementLimit(h, 300_000 if k % 20 else 400_000)
    sim.nvmlShutdown()
    return total


def test_concurrent_processes_see_one_consistent_gpu(tmp_path):
    state = tmp_path / "sim"
    create_machine(state, "a100_sxm4_40gb", energy_update_period_s=0.0)
    with mp.get_context("spawn").Pool(2) as pool:
        totals = pool.starmap(_hammer, [(str(state), 150), (str(state), 150)])
    s = Machine(state).read(0)
    assert s["calls"] == 300
    assert s["energy_mj"] == pytest.approx(sum(totals), rel=1e-9)
