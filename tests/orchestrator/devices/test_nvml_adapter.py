"""The NVML adapter over the simulated NVML: the same code that runs over nvidia-ml-py."""

from __future__ import annotations

import pytest
from support import isothermal_profile

from orchestrator.devices import open_backend, select_devices
from orchestrator.devices.base import ClockEventReason, KernelWork
from orchestrator.errors import (
    DeviceLostError,
    DeviceNotFoundError,
    DeviceNotSupportedError,
    DevicePermissionError,
    InvalidSettingError,
)

GEMM_8192 = KernelWork(
    flops=2 * 8192**3, bytes_moved=3 * 4 * 8192**2, peak="fp32", kernel_class="gemm"
)


def run_for(dev, work, seconds):
    """Run ``work`` for at least ``seconds`` of the device's time (past a sensor's update and the
    power-cap filter: the A100's power reading updates every 100 ms, its cap acts after ~100 ms)."""
    end = dev.now_s() + seconds
    while dev.now_s() < end:
        dev.on_kernel_call(work)


def sim(tmp_path, **kw):
    cfg = {
        "backend": "sim",
        "state_dir": str(tmp_path / "sim"),
        "profile": "a100_sxm4_40gb",
        "count": 1,
    }
    cfg.update(kw)
    return open_backend(cfg)


def test_identity_comes_from_nvml_and_devices_resolve_by_uuid_and_pci(tmp_path):
    with sim(tmp_path, count=2) as backend:
        a, b = backend.devices()
        assert a.identity.name == "NVIDIA A100-SXM4-40GB"
        assert a.identity.architecture == "ampere"
        assert a.identity.backend == "sim"
        assert a.identity.uuid.startswith("GPU-") and a.identity.uuid != b.identity.uuid
        assert backend.device(uuid=b.identity.uuid).identity.index == 1
        assert backend.device(pci_bus_id=b.identity.pci_bus_id).identity.uuid == b.identity.uuid
        assert [
            d.identity.uuid for d in select_devices(backend, [b.identity.uuid])
        ] == [b.identity.uuid]


def test_capabilities_match_the_a100_datasheet(tmp_path):
    with sim(tmp_path) as backend:
        caps = backend.device(0).capabilities()
        clocks = caps.supported_sm_clocks_mhz()
        assert clocks[0] == 210 and clocks[-1] == 1410
        assert all(b - a == 15 for a, b in zip(clocks, clocks[1:]))
        assert (
            caps.power_limit_min_w, caps.power_limit_max_w, caps.power_limit_default_w
        ) == (100, 400, 400)
        assert caps.has_energy_counter


def test_setters_take_effect_and_resets_return_the_device_to_where_it_started(tmp_path):
    with sim(tmp_path) as backend:
        dev = backend.device(0)
        before = (dev.settings().power_limit_w, dev.settings().clock_offset_mhz)
        dev.on_kernel_call(GEMM_8192)
        assert dev.sm_clock_mhz() == 1410
        dev.set_locked_sm_clocks(900, 900)
        dev.set_power_limit_w(250)
        dev.on_kernel_call(GEMM_8192)
        assert dev.sm_clock_mhz() == 900
        assert dev.settings().power_limit_w == 250
        assert dev.settings().sm_clock_locked_mhz == (900, 900)
        dev.reset_locked_sm_clocks()
        dev.set_power_limit_w(before[0])
        dev.on_kernel_call(GEMM_8192)
        assert (dev.settings().power_limit_w, dev.settings().clock_offset_mhz) == before
        assert dev.sm_clock_mhz() == 1410
    # A second process (a new backend over the same state) sees the same GPU.
    with sim(tmp_path) as backend:
        assert backend.device(0).settings().power_limit_w == before[0]


def test_power_cap_below_the_kernels_draw_lowers_the_clock_and_reports_the_reason(tmp_path):
    with sim(tmp_path) as backend:
        dev = backend.device(0)
        run_for(dev, GEMM_8192, 0.3)
        uncapped_w = dev.power_mw() / 1000
        assert dev.clock_event_reasons() & ClockEventReason.SW_POWER_CAP == 0
        dev.set_power_limit_w(round(uncapped_w * 0.6))
        run_for(dev, GEMM_8192, 0.3)  # past the cap's filter and the next power reading
        assert dev.sm_clock_mhz() < 1410
        assert dev.power_mw() / 1000 <= uncapped_w * 0.6 + 1
        assert ClockEventReason.SW_POWER_CAP in dev.clock_event_reasons()
        assert "sw_power_cap" in dev.clock_event_reasons().names()


def test_energy_counter_equals_model_power_times_time(tmp_path):
    board = isothermal_profile("a100_sxm4_40gb", tmp_path)  # its power holds as the load runs
    with sim(tmp_path, energy_update_period_s=0.0, profile=board) as backend:
        dev = backend.device(0)
        e0, t0 = dev.energy_mj(), dev.now_s()
        for _ in range(200):
            dev.on_kernel_call(GEMM_8192)
        elapsed = dev.now_s() - t0
        power_w = dev.power_mw() / 1000  # the A100's reading: the last 25 ms of a steady load
        energy_j = (dev.energy_mj() - e0) / 1000
        assert elapsed > 5
        assert energy_j == pytest.approx(power_w * elapsed, rel=1e-3)


def test_no_permission_names_root_and_observe_only(tmp_path):
    with sim(tmp_path, privileged=False) as backend:
        dev = backend.device(0)
        with pytest.raises(DevicePermissionError, match="needs root.*observe_only=true"):
            dev.set_locked_sm_clocks(900, 900)
        with pytest.raises(DevicePermissionError):
            dev.set_power_limit_w(300)


def test_invalid_argument_names_the_allowed_values(tmp_path):
    with sim(tmp_path) as backend:
        dev = backend.device(0)
        with pytest.raises(InvalidSettingError, match="210-1410 MHz"):
            dev.set_locked_sm_clocks(5000, 5000)
        with pytest.raises(InvalidSettingError, match="100-400 W"):
            dev.set_power_limit_w(1000)


def test_not_supported_names_the_call_and_the_gpu(tmp_path):
    with sim(tmp_path, profile="v100_sxm2_16gb") as backend:
        dev = backend.device(0)
        assert dev.capabilities().clock_offset_range_mhz is None
        with pytest.raises(DeviceNotSupportedError, match="clock offsets"):
            dev.set_clock_offset_mhz(100)
    with sim(tmp_path / "p100", profile="p100_pcie_16gb") as backend:
        dev = backend.device(0)
        assert not dev.capabilities().has_energy_counter
        with pytest.raises(
            DeviceNotSupportedError, match="nvmlDeviceGetTotalEnergyConsumption.*GPU 0"
        ):
            dev.energy_mj()
        assert dev.telemetry().energy_mj is None


def test_a_lost_gpu_is_a_device_lost_error(tmp_path):
    with sim(tmp_path) as backend:
        dev = backend.device(0)
        backend.nvml.simDeviceSetLost(dev._handle, True)
        with pytest.raises(DeviceLostError, match="fallen off the bus"):
            dev.power_mw()
        backend.nvml.simDeviceSetLost(dev._handle, False)
        assert dev.power_mw() > 0


def test_a_device_index_that_does_not_exist_lists_the_valid_ones(tmp_path):
    with sim(tmp_path, count=2) as backend:
        with pytest.raises(DeviceNotFoundError, match="index 5.*valid indices: 0, 1"):
            backend.device(5)
        with pytest.raises(DeviceNotFoundError, match="UUID"):
            backend.device(uuid="GPU-00000000-0000-0000-0000-000000000000")
