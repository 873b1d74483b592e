"""Instant and average power: the simulated ``nvmlDeviceGetFieldValues`` and the adapter's
``power_readings_mw`` over it (usage, instant and average, in mW; None where not offered)."""

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


@pytest.fixture
def backend(tmp_path, monkeypatch):
    """A one-GPU simulated A100 behind the NVML adapter."""
    monkeypatch.setenv("DVFS_SIM_STATE_DIR", str(tmp_path / "sim"))
    with open_backend({"backend": "sim", "state_dir": str(tmp_path / "sim")}) as b:
        yield b


def test_field_values_come_back_in_pynvmls_own_struct_array(backend):
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    values = sim.nvmlDeviceGetFieldValues(handle, POWER)
    assert isinstance(values, ctypes.Array) and len(values) == 2
    assert all(isinstance(v, pynvml.c_nvmlFieldValue_t) for v in values)
    assert [v.fieldId for v in values] == POWER
    assert all(v.scopeId == pynvml.NVML_POWER_SCOPE_GPU for v in values)
    assert all(v.nvmlReturn == pynvml.NVML_SUCCESS for v in values)
    assert all(v.valueType == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT for v in values)
    usage_mw = sim.nvmlDeviceGetPowerUsage(handle)
    assert [v.value.uiVal for v in values] == [usage_mw, usage_mw]


def test_field_values_follow_the_modelled_power_and_the_virtual_clock(backend):
    dev = backend.device(0)
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    idle_mw = sim.nvmlDeviceGetFieldValues(handle, POWER)[0].value.uiVal
    dev.on_kernel_call(GEMM)
    instant = sim.nvmlDeviceGetFieldValues(handle, [(pynvml.NVML_FI_DEV_POWER_INSTANT, 0)])[0]
    assert instant.value.uiVal == dev.power_mw() > idle_mw
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


def test_power_readings_give_usage_instant_and_average_in_mw(backend):
    dev = backend.device(0)
    idle = dev.power_readings_mw()
    assert set(idle) == {"usage", "instant", "average"}
    assert idle["usage"] == idle["instant"] == idle["average"] == dev.power_mw()
    dev.on_kernel_call(GEMM)
    busy = dev.power_readings_mw()
    assert busy["instant"] == dev.power_mw() > idle["instant"]


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
def test_a_reading_the_gpu_does_not_offer_is_none_and_the_others_come(backend, nvml, expected):
    with NvmlBackend(nvml, "sim") as other:
        readings = other.device(0).power_readings_mw()
    assert readings["usage"] == backend.device(0).power_mw()
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
