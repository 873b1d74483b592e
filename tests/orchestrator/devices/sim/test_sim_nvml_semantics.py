"""NVML's semantics on the simulated GPU: telemetry the model predicts, and every refusal.

Each test drives the stateful sim through its pynvml-shaped API and asserts where the GPU ended
up (its counter, clock, reasons), as a client of real NVML would observe it.
"""

from __future__ import annotations

import pynvml
import pytest
from support import isothermal_profile

from orchestrator.devices.base import ClockEventReason, KernelWork
from orchestrator.devices.sim import model
from orchestrator.devices.sim import nvml as sim
from orchestrator.devices.sim.profile import load_profile
from orchestrator.devices.sim.state import create_machine

A100 = load_profile("a100_sxm4_40gb")
# ~0.5 s at 1410 MHz: compute-bound; ~0.2 s: memory-bound
GEMM_S = 0.5
GEMM = KernelWork(
    flops=19.5e12 * GEMM_S, bytes_moved=1e8, peak="fp32", kernel_class="gemm", framework="jax"
)
STREAM = KernelWork(
    flops=1e9, bytes_moved=1555e9 * 0.2, peak="fp32", kernel_class="stencil", framework="jax"
)


@pytest.fixture
def open_machine(tmp_path, monkeypatch):
    """``open_machine(profiles, **spec)``: create a machine, nvmlInit it, shut down afterwards."""
    opened = []

    def open_(profiles="a100_sxm4_40gb", **spec):
        state = tmp_path / f"sim{len(opened)}"
        create_machine(state, profiles, **spec)
        monkeypatch.setenv("DVFS_SIM_STATE_DIR", str(state))
        sim.nvmlInit()
        opened.append(state)
        return sim.nvmlDeviceGetHandleByIndex(0)

    yield open_
    for _ in opened:
        sim.nvmlShutdown()


def test_the_energy_counter_is_model_power_times_time_over_a_long_window(open_machine, tmp_path):
    # a die held at the reference temperature: the model's steady state is then exact
    h = open_machine(isothermal_profile("a100_sxm4_40gb", tmp_path), energy_update_period_s=0.02)
    sim.nvmlDeviceSetPowerManagementLimit(h, 300_000)
    e0, t0 = sim.nvmlDeviceGetTotalEnergyConsumption(h), sim.simDeviceGetTimeS(h)
    # The cap bites GEMM, not STREAM. Its controller acts after the filter (100 ms on GA100): a
    # GEMM after an idle spell or a STREAM call (each longer than the filter) runs its first
    # filter's length unthrottled, the rest of its work at the capped point.
    filter_s = A100.sensors.power_cap_filter_s
    free = model.operating_point(A100, GEMM)
    capped = model.operating_point(A100, GEMM, power_limit_w=300.0)
    stream = model.operating_point(A100, STREAM, power_limit_w=300.0)
    assert capped.power_w < 300 < free.power_w and stream.power_w < 300
    assert min(stream.duration_s, 0.25) > filter_s
    lagged_mj = (free.power_w * filter_s + capped.power_w * (1 - filter_s / free.duration_s)
                 * capped.duration_s) * 1e3
    expected_mj = 0.0
    rested = True  # under the cap for at least the filter's length since the last GEMM
    for k in range(120):
        if k % 3:
            expected_mj += lagged_mj if rested else capped.energy_mj
            rested = False
            sim.simDeviceRecordKernelCall(h, GEMM)
        else:
            expected_mj += stream.energy_mj
            rested = True
            sim.simDeviceRecordKernelCall(h, STREAM)
        if k % 10 == 0:
            sim.simDeviceIdle(h, 0.25)
            expected_mj += A100.idle_power_w * 0.25 * 1e3
            rested = True
    window_s = sim.simDeviceGetTimeS(h) - t0
    assert window_s > 50
    assert sim.nvmlDeviceGetTotalEnergyConsumption(h) - e0 == pytest.approx(expected_mj, rel=1e-3)


def test_the_counter_holds_still_between_updates_and_catches_up_at_each(open_machine):
    h = open_machine(energy_update_period_s=0.1)
    sim.simDeviceIdle(h, 0.05)
    assert sim.nvmlDeviceGetTotalEnergyConsumption(h) == 0  # no update yet
    sim.simDeviceIdle(h, 0.04)
    assert sim.nvmlDeviceGetTotalEnergyConsumption(h) == 0
    sim.simDeviceIdle(h, 0.06)  # crosses t = 0.1 s
    assert sim.nvmlDeviceGetTotalEnergyConsumption(h) == pytest.approx(
        A100.idle_power_w * 0.1 * 1e3, abs=1
    )


def test_a_period_of_zero_gives_the_exact_counter(open_machine):
    h = open_machine(energy_update_period_s=0.0)
    sim.simDeviceIdle(h, 0.0123)
    assert sim.nvmlDeviceGetTotalEnergyConsumption(h) == int(A100.idle_power_w * 0.0123 * 1e3)


def test_a_power_cap_lowers_the_clock_nvml_reports_and_flags_sw_power_cap(open_machine, tmp_path):
    h = open_machine(isothermal_profile("a100_sxm4_40gb", tmp_path))
    sim.nvmlDeviceSetPowerManagementLimit(h, 250_000)
    expected = model.operating_point(A100, GEMM, power_limit_w=250.0)
    assert GEMM_S > 2 * A100.sensors.power_cap_filter_s  # the call ends past the cap's filter
    result = sim.simDeviceRecordKernelCall(h, GEMM)
    assert result.sm_clock_mhz == expected.sm_clock_mhz < 1410
    assert result.power_mw <= 250_000
    assert sim.nvmlDeviceGetClockInfo(h, sim.NVML_CLOCK_SM) == expected.sm_clock_mhz
    assert sim.nvmlDeviceGetPowerUsage(h) == result.power_mw
    assert sim.nvmlDeviceGetCurrentClocksEventReasons(h) & sim.nvmlClocksEventReasonSwPowerCap
    assert sim.nvmlDeviceGetCurrentClocksThrottleReasons(h) & ClockEventReason.SW_POWER_CAP


def test_a_locked_clock_inside_the_range_runs_at_the_supported_clock_at_or_below_it(open_machine):
    h = open_machine()
    sim.nvmlDeviceSetGpuLockedClocks(h, 1000, 1000)  # A100 clocks: 210 + 15 k
    assert sim.simDeviceRecordKernelCall(h, GEMM).sm_clock_mhz == 990
    sim.nvmlDeviceResetGpuLockedClocks(h)
    assert sim.simDeviceRecordKernelCall(h, GEMM).sm_clock_mhz == 1410


def test_locked_clocks_change_compute_bound_time_not_memory_bound_time(open_machine):
    h = open_machine()
    fast = [sim.simDeviceRecordKernelCall(h, w).duration_s for w in (GEMM, STREAM)]
    sim.nvmlDeviceSetGpuLockedClocks(h, 705, 705)
    slow = [sim.simDeviceRecordKernelCall(h, w).duration_s for w in (GEMM, STREAM)]
    assert slow[0] / fast[0] == pytest.approx(2.0, rel=1e-3)
    assert slow[1] / fast[1] == pytest.approx(1.0, abs=0.01)


def test_the_power_limit_getters_speak_milliwatts(open_machine):
    h = open_machine()
    assert sim.nvmlDeviceGetPowerManagementLimitConstraints(h) == [100_000, 400_000]
    assert sim.nvmlDeviceGetPowerManagementDefaultLimit(h) == 400_000
    sim.nvmlDeviceSetPowerManagementLimit(h, 275_000)
    assert (
        sim.nvmlDeviceGetPowerManagementLimit(h)
        == sim.nvmlDeviceGetEnforcedPowerLimit(h)
        == 275_000
    )


def test_identity_calls_answer_as_nvml_does(open_machine):
    h = open_machine(count=2)
    uuid = sim.nvmlDeviceGetUUID(h)
    assert sim.nvmlDeviceGetIndex(sim.nvmlDeviceGetHandleByUUID(uuid)) == 0
    assert sim.nvmlDeviceGetIndex(sim.nvmlDeviceGetHandleByPciBusId("00000000:08:00.0")) == 1
    assert sim.nvmlDeviceGetArchitecture(h) == pynvml.NVML_DEVICE_ARCH_AMPERE
    assert sim.nvmlDeviceGetSupportedMemoryClocks(h) == [1215]
    clocks = sim.nvmlDeviceGetSupportedGraphicsClocks(h, 1215)
    assert clocks[0] == 1410 and clocks[-1] == 210 and clocks == sorted(clocks, reverse=True)
    assert sim.nvmlDeviceGetMaxClockInfo(h, sim.NVML_CLOCK_SM) == 1410
    assert sim.nvmlDeviceGetMaxClockInfo(h, sim.NVML_CLOCK_MEM) == 1215
    assert sim.nvmlSystemGetDriverVersion().startswith("550.")


def test_setters_on_an_unprivileged_machine_raise_no_permission_and_change_nothing(open_machine):
    h = open_machine(privileged=False)
    setters = [
        lambda: sim.nvmlDeviceSetGpuLockedClocks(h, 900, 900),
        lambda: sim.nvmlDeviceResetGpuLockedClocks(h),
        lambda: sim.nvmlDeviceSetMemoryLockedClocks(h, 1215, 1215),
        lambda: sim.nvmlDeviceResetMemoryLockedClocks(h),
        lambda: sim.nvmlDeviceSetPowerManagementLimit(h, 200_000),
        lambda: sim.nvmlDeviceSetGpcClkVfOffset(h, 50),
    ]
    for setter in setters:
        with pytest.raises(pynvml.NVMLError_NoPermission):
            setter()
    assert sim.nvmlDeviceGetPowerManagementLimit(h) == 400_000
    assert sim.nvmlDeviceGetGpcClkVfOffset(h) == 0
    assert sim.simDeviceRecordKernelCall(h, GEMM).sm_clock_mhz == 1410


@pytest.mark.parametrize(
    "call",
    [
        lambda h: sim.nvmlDeviceSetGpuLockedClocks(h, 100, 900),  # below f_min
        lambda h: sim.nvmlDeviceSetGpuLockedClocks(h, 900, 2000),  # above f_max
        lambda h: sim.nvmlDeviceSetGpuLockedClocks(h, 1200, 900),  # min > max
        lambda h: sim.nvmlDeviceSetMemoryLockedClocks(h, 877, 877),  # not this board's
        lambda h: sim.nvmlDeviceSetPowerManagementLimit(h, 99_000),
        lambda h: sim.nvmlDeviceSetPowerManagementLimit(h, 401_000),
        lambda h: sim.nvmlDeviceSetGpcClkVfOffset(h, 5000),
    ],
)
def test_values_outside_the_supported_range_are_invalid_arguments(open_machine, call):
    h = open_machine()
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        call(h)


def test_graphics_clocks_for_an_unsupported_memory_clock_are_not_found(open_machine):
    h = open_machine()
    with pytest.raises(pynvml.NVMLError_NotFound):
        sim.nvmlDeviceGetSupportedGraphicsClocks(h, 877)


def test_pascal_has_no_energy_counter(open_machine):
    h = open_machine("p100_pcie_16gb")
    with pytest.raises(pynvml.NVMLError_NotSupported):
        sim.nvmlDeviceGetTotalEnergyConsumption(h)
    assert sim.nvmlDeviceGetPowerUsage(h) == 30_000  # idle; a meter samples this instead


@pytest.mark.parametrize("profile", ["v100_sxm2_16gb", "p100_pcie_16gb"])
def test_clock_offsets_are_not_supported_before_ampere(open_machine, profile):
    h = open_machine(profile)
    for call in (
        lambda: sim.nvmlDeviceGetGpcClkVfOffset(h),
        lambda: sim.nvmlDeviceSetGpcClkVfOffset(h, 0),
        lambda: sim.nvmlDeviceGetGpcClkMinMaxVfOffset(h),
    ):
        with pytest.raises(pynvml.NVMLError_NotSupported):
            call()


def test_an_offset_is_read_back_and_shifts_the_clock_of_the_next_call(open_machine):
    h = open_machine()
    assert tuple(sim.nvmlDeviceGetGpcClkMinMaxVfOffset(h)) == (-200, 1000)
    sim.nvmlDeviceSetGpuLockedClocks(h, 1200, 1200)
    sim.nvmlDeviceSetGpcClkVfOffset(h, 60)
    assert sim.nvmlDeviceGetGpcClkVfOffset(h) == 60
    assert sim.simDeviceRecordKernelCall(h, GEMM).sm_clock_mhz == 1260


def test_a_lost_gpu_raises_gpu_is_lost_on_every_call_until_it_is_brought_back(open_machine):
    h = open_machine()
    sim.simDeviceSetLost(h, True)
    for call in (
        lambda: sim.nvmlDeviceGetName(h),
        lambda: sim.nvmlDeviceGetTotalEnergyConsumption(h),
        lambda: sim.nvmlDeviceGetPowerUsage(h),
        lambda: sim.nvmlDeviceSetPowerManagementLimit(h, 300_000),
        lambda: sim.nvmlDeviceResetGpuLockedClocks(h),
        lambda: sim.simDeviceRecordKernelCall(h, GEMM),
    ):
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            call()
    sim.simDeviceSetLost(h, False)
    assert sim.nvmlDeviceGetName(h) == "NVIDIA A100-SXM4-40GB"
    assert sim.simDeviceRecordKernelCall(h, GEMM).sm_clock_mhz == 1410


def test_init_is_reference_counted(open_machine):
    open_machine()
    sim.nvmlInit()  # a second client in the same process
    sim.nvmlShutdown()
    assert sim.nvmlDeviceGetCount() == 1  # the first is still open


def test_shutting_down_more_often_than_initialising_is_uninitialized(tmp_path, monkeypatch):
    create_machine(tmp_path, "a100_sxm4_40gb")
    monkeypatch.setenv("DVFS_SIM_STATE_DIR", str(tmp_path))
    sim.nvmlInit()
    sim.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        sim.nvmlShutdown()
