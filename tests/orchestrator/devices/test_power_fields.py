"""Instant and average power: the simulated ``nvmlDeviceGetFieldValues`` and the adapter's
``power_readings_mw`` over it (usage, instant and average, in mW; None where not offered), per
each generation's sensors (GA100: no average field; Hopper: both)."""

from __future__ import annotations

import ctypes

import pynvml
import pytest

from orchestrator.devices import open_backend
from orchestrator.devices.base import KernelWork
from orchestrator.devices.nvml import NvmlBackend
from orchestrator.devices.sim import nvml as sim
from orchestrator.errors import DeviceLostError

GEMM = KernelWork(flops=2 * 8192**3, bytes_moved=3 * 4 * 8192**2, peak="fp32", kernel_class="gemm")
POWER = [pynvml.NVML_FI_DEV_POWER_INSTANT, pynvml.NVML_FI_DEV_POWER_AVERAGE]


def open_sim(tmp_path, monkeypatch, profile="a100_sxm4_40gb"):
    monkeypatch.setenv("DVFS_SIM_STATE_DIR", str(tmp_path / "sim"))
    return open_backend({"backend": "sim", "state_dir": str(tmp_path / "sim"), "profile": profile})


@pytest.fixture
def backend(tmp_path, monkeypatch):
    """A one-GPU simulated A100 behind the NVML adapter."""
    with open_sim(tmp_path, monkeypatch) as b:
        yield b


@pytest.fixture
def hopper(tmp_path, monkeypatch):
    """A one-GPU simulated H100 behind the NVML adapter (both power fields offered)."""
    with open_sim(tmp_path, monkeypatch, "h100_sxm5_80gb") as b:
        yield b


def run_for(dev, seconds):
    end = dev.now_s() + seconds
    while dev.now_s() < end:
        dev.on_kernel_call(GEMM)


def test_field_values_come_back_in_pynvmls_own_struct_array(hopper):
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    values = sim.nvmlDeviceGetFieldValues(handle, POWER)
    assert isinstance(values, ctypes.Array) and len(values) == 2
    assert all(isinstance(v, pynvml.c_nvmlFieldValue_t) for v in values)
    assert [v.fieldId for v in values] == POWER
    assert all(v.scopeId == pynvml.NVML_POWER_SCOPE_GPU for v in values)
    assert all(v.nvmlReturn == pynvml.NVML_SUCCESS for v in values)
    assert all(v.valueType == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT for v in values)
    idle_mw = sim.nvmlDeviceGetPowerUsage(handle)  # idle since load: every reading agrees
    assert [v.value.uiVal for v in values] == [idle_mw, idle_mw]


def test_a_ga100_has_no_average_field_and_its_usage_is_the_instant_sensor(backend):
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    run_for(backend.device(0), 0.35)
    instant, average = sim.nvmlDeviceGetFieldValues(handle, POWER)
    assert average.nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED
    assert instant.nvmlReturn == pynvml.NVML_SUCCESS
    assert instant.value.uiVal == sim.nvmlDeviceGetPowerUsage(handle)


def test_the_energy_field_is_the_energy_counter(backend):
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    run_for(backend.device(0), 0.35)
    (energy,) = sim.nvmlDeviceGetFieldValues(handle, [pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION])
    assert energy.nvmlReturn == pynvml.NVML_SUCCESS
    assert energy.valueType == pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
    assert energy.value.ullVal == sim.nvmlDeviceGetTotalEnergyConsumption(handle) > 0


def test_the_energy_field_is_not_supported_without_a_counter(tmp_path, monkeypatch):
    with open_sim(tmp_path, monkeypatch, "p100_pcie_16gb"):
        handle = sim.nvmlDeviceGetHandleByIndex(0)
        fields = [pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, *POWER]
        codes = [v.nvmlReturn for v in sim.nvmlDeviceGetFieldValues(handle, fields)]
    # Pascal: no counter and no 1 s average; the instant field answers on every architecture.
    assert codes == [pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_SUCCESS,
                     pynvml.NVML_ERROR_NOT_SUPPORTED]


def test_field_values_follow_the_modelled_power_and_the_virtual_clock(hopper):
    dev = hopper.device(0)
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    idle_mw = sim.nvmlDeviceGetFieldValues(handle, POWER)[0].value.uiVal
    run_for(dev, 1.5)  # past the 1 s average's window
    busy_mw = sim.simDeviceRecordKernelCall(handle, GEMM).power_mw
    instant = sim.nvmlDeviceGetFieldValues(handle, [(pynvml.NVML_FI_DEV_POWER_INSTANT, 0)])[0]
    assert instant.value.uiVal == busy_mw > idle_mw
    # the time the value was read, not when its sensor last updated
    assert instant.timestamp == pytest.approx(dev.now_s() * 1e6, abs=1)


def test_a_field_or_scope_the_sim_does_not_offer_is_not_supported_in_its_own_return_code(backend):
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    values = sim.nvmlDeviceGetFieldValues(
        handle,
        [
            pynvml.NVML_FI_DEV_ECC_CURRENT,
            (pynvml.NVML_FI_DEV_POWER_INSTANT, pynvml.NVML_POWER_SCOPE_MODULE),
            pynvml.NVML_FI_DEV_POWER_INSTANT,
        ],
    )
    assert [v.nvmlReturn for v in values] == [
        pynvml.NVML_ERROR_NOT_SUPPORTED,
        pynvml.NVML_ERROR_NOT_SUPPORTED,
        pynvml.NVML_SUCCESS,
    ]


def test_field_values_fail_as_every_call_does_before_init_and_on_a_lost_gpu(backend):
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    sim.simDeviceSetLost(handle, True)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        sim.nvmlDeviceGetFieldValues(handle, POWER)
    sim.simDeviceSetLost(handle, False)
    backend.close()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        sim.nvmlDeviceGetFieldValues(handle, POWER)


def test_power_readings_give_usage_instant_and_average_in_mw(hopper):
    dev = hopper.device(0)
    idle = dev.power_readings_mw()
    assert set(idle) == {"usage", "instant", "average"}
    assert idle["usage"] == idle["instant"] == idle["average"] == dev.power_mw()
    run_for(dev, 1.5)
    busy = dev.power_readings_mw()
    assert busy["instant"] > idle["instant"]
    assert busy["usage"] == busy["average"] == pytest.approx(busy["instant"], abs=1)


class _NoAverage:
    """The simulated NVML, but the average field is not offered (as on a GA100)."""

    def __getattr__(self, name):
        return getattr(sim, name)

    def nvmlDeviceGetFieldValues(self, handle, fieldIds):
        values = sim.nvmlDeviceGetFieldValues(handle, fieldIds)
        for v in values:
            if v.fieldId == pynvml.NVML_FI_DEV_POWER_AVERAGE:
                v.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return values


class _NoFieldValues:
    """The simulated NVML under a driver that predates field values."""

    def __getattr__(self, name):
        return getattr(sim, name)

    def nvmlDeviceGetFieldValues(self, handle, fieldIds):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)


@pytest.mark.parametrize(
    ("nvml", "expected"),
    [(_NoAverage(), {"instant"}), (_NoFieldValues(), set())],
    ids=["field-not-supported", "driver-without-field-values"],
)
def test_a_reading_the_gpu_does_not_offer_is_none_and_the_others_come(hopper, nvml, expected):
    with NvmlBackend(nvml, "sim") as other:
        readings = other.device(0).power_readings_mw()
    assert readings["usage"] == hopper.device(0).power_mw()
    assert {k for k in ("instant", "average") if readings[k] is not None} == expected


def test_a_lost_gpu_in_a_fields_return_code_is_a_lost_device(backend):
    class LostInField(_NoAverage):
        def nvmlDeviceGetFieldValues(self, handle, fieldIds):
            values = sim.nvmlDeviceGetFieldValues(handle, fieldIds)
            values[0].nvmlReturn = pynvml.NVML_ERROR_GPU_IS_LOST
            return values

    with NvmlBackend(LostInField(), "sim") as other:
        dev = other.device(0)
        with pytest.raises(DeviceLostError, match="fallen off the bus"):
            dev.power_readings_mw()


class _OldDriver:
    """The simulated NVML under a driver that predates the power fields: it marks an id it
    does not know INVALID_ARGUMENT in the field's own return code."""

    def __getattr__(self, name):
        return getattr(sim, name)

    def nvmlDeviceGetFieldValues(self, handle, fieldIds):
        values = sim.nvmlDeviceGetFieldValues(handle, fieldIds)
        for v in values:
            if v.fieldId in POWER:
                v.nvmlReturn = pynvml.NVML_ERROR_INVALID_ARGUMENT
        return values


@pytest.mark.parametrize(
    ("profile", "reading", "period_s", "window_s"),
    [
        ("a100_sxm4_40gb", "usage", 0.1, 0.025),  # GA100: nvmlDeviceGetPowerUsage is instant
        ("h100_sxm5_80gb", "instant", 0.1, 0.025),  # Hopper: the field; usage is a 1 s average
        ("h200_141gb", "instant", 0.1, 0.025),
        ("v100_sxm2_16gb", "usage", 0.02, 0.01),
    ],
)
def test_the_adapter_names_the_instant_reading_of_each_generation(
    tmp_path, monkeypatch, profile, reading, period_s, window_s
):
    with open_sim(tmp_path, monkeypatch, profile) as b:
        dev = b.device(0)
        sensing = dev.capabilities().power_sensing
        run_for(dev, 1.5)
        readings = dev.power_readings_mw()
        instant_mw = dev.instant_power_mw()
    assert (sensing.reading, sensing.period_s, sensing.window_s) == (reading, period_s, window_s)
    assert instant_mw == readings[reading]


@pytest.mark.parametrize("nvml", [_OldDriver(), _NoFieldValues()], ids=["old-driver", "no-fields"])
def test_a_hopper_without_the_instant_field_has_no_instant_reading_and_says_why(
    tmp_path, monkeypatch, nvml
):
    from orchestrator.errors import DeviceNotSupportedError

    with open_sim(tmp_path, monkeypatch, "h100_sxm5_80gb"), NvmlBackend(nvml, "sim") as other:
        dev = other.device(0)
        caps = dev.capabilities()
        assert caps.power_sensing.reading is None
        assert "1 s average" in caps.power_sensing.note
        assert caps.energy_note is None  # it still has the counter
        with pytest.raises(DeviceNotSupportedError, match="1 s average"):
            dev.instant_power_mw()

