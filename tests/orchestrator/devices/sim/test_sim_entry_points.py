"""The sim's C entry points, checked by nvidia-ml-py's own wrappers.

nvidia-ml-py's ``pynvml.nvmlDeviceGetX`` looks its C symbol up with ``_nvmlGetFunctionPointer`` and
calls it with ctypes arguments. Pointing that lookup at the sim runs nvidia-ml-py's real calling
code over the sim's entry points: each must answer what the sim's own Python call answers, the
same errors included. The NOT_SUPPORTED answers per generation are checked against NVIDIA's.
"""

from __future__ import annotations

import ctypes
import types

import pynvml
import pytest

from orchestrator.devices.sim import nvml as sim
from orchestrator.devices.sim.entry_points import C_SIGNATURES
from orchestrator.devices.sim.state import STATE_ENV, create_machine

BOARDS = ["a100_sxm4_40gb", "h200_141gb", "v100_sxm2_16gb", "p100_pcie_16gb"]
FIELDS = [pynvml.NVML_FI_DEV_POWER_INSTANT, pynvml.NVML_FI_DEV_POWER_AVERAGE,
          pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION]
CALLS = [  # (name, arguments after the handle)
    ("nvmlDeviceGetName", ()), ("nvmlDeviceGetUUID", ()), ("nvmlDeviceGetSerial", ()),
    ("nvmlDeviceGetPciInfo", ()), ("nvmlDeviceGetIndex", ()), ("nvmlDeviceGetMinorNumber", ()),
    ("nvmlDeviceGetArchitecture", ()), ("nvmlDeviceGetBrand", ()),
    ("nvmlDeviceGetComputeMode", ()), ("nvmlDeviceGetPerformanceState", ()),
    ("nvmlDeviceGetPersistenceMode", ()), ("nvmlDeviceGetDisplayActive", ()),
    ("nvmlDeviceGetPowerUsage", ()), ("nvmlDeviceGetEnforcedPowerLimit", ()),
    ("nvmlDeviceGetPowerManagementLimit", ()), ("nvmlDeviceGetPowerManagementDefaultLimit", ()),
    ("nvmlDeviceGetPowerManagementLimitConstraints", ()),
    ("nvmlDeviceGetTotalEnergyConsumption", ()), ("nvmlDeviceGetCurrentClocksEventReasons", ()),
    ("nvmlDeviceGetSupportedEventTypes", ()), ("nvmlDeviceGetFanSpeed", ()),
    ("nvmlDeviceGetNumFans", ()), ("nvmlDeviceGetGpcClkVfOffset", ()),
    ("nvmlDeviceGetGpcClkMinMaxVfOffset", ()), ("nvmlDeviceGetCudaComputeCapability", ()),
    ("nvmlDeviceGetMigMode", ()), ("nvmlDeviceGetEncoderUtilization", ()),
    ("nvmlDeviceGetEccMode", ()), ("nvmlDeviceGetUtilizationRates", ()),
    ("nvmlDeviceGetMemoryInfo", ()), ("nvmlDeviceGetC2cModeInfoV", ()),
    ("nvmlDeviceGetDriverModel", ()), ("nvmlDeviceGetSupportedMemoryClocks", ()),
    ("nvmlDeviceGetComputeRunningProcesses", ()), ("nvmlDeviceGetGraphicsRunningProcesses", ()),
    ("nvmlDeviceGetClockInfo", (pynvml.NVML_CLOCK_SM,)),
    ("nvmlDeviceGetMaxClockInfo", (pynvml.NVML_CLOCK_MEM,)),
    ("nvmlDeviceGetTemperature", (pynvml.NVML_TEMPERATURE_GPU,)),
    ("nvmlDeviceGetTemperatureV", (pynvml.NVML_TEMPERATURE_GPU,)),
    ("nvmlDeviceGetTemperatureThreshold", (pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN,)),
    ("nvmlDeviceGetTotalEccErrors",
     (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC)),
    ("nvmlDeviceGetFieldValues", (FIELDS,)),
    ("nvmlDeviceGetProcessUtilization", (0,)),
]


def plain(value):
    """A comparable form of an NVML answer: structs as dicts, bytes as text, handles dropped."""
    if isinstance(value, ctypes.Array):
        return [plain(v) for v in value]
    if isinstance(value, (ctypes.Structure, ctypes.Union)):
        return {f[0]: plain(getattr(value, f[0])) for f in value._fields_ if f[0] != "value"
                } | ({"value": value.value.ullVal or value.value.uiVal}
                     if hasattr(value, "valueType") else {})
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, bytes):
        return value.decode()
    if type(value).__name__ == "nvmlFriendlyObject":
        return plain(vars(value))
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def outcome(call, *args):
    try:
        return "ok", plain(call(*args))
    except pynvml.NVMLError as e:
        return "error", type(e).__name__


@pytest.fixture
def over_the_sim(tmp_path, monkeypatch):
    """Every board; nvidia-ml-py's lookup answered by the sim's entry points."""
    create_machine(tmp_path, BOARDS)
    monkeypatch.setenv(STATE_ENV, str(tmp_path))
    sim.nvmlInit()
    monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer", sim._nvmlGetFunctionPointer)
    yield
    sim.nvmlShutdown()


@pytest.mark.parametrize("index", range(len(BOARDS)), ids=BOARDS)
def test_nvidia_ml_pys_own_wrappers_answer_as_the_sims_calls(over_the_sim, index):
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)  # an opaque pointer, made as C makes it
    assert isinstance(handle, pynvml.c_nvmlDevice_t)
    theirs = sim.nvmlDeviceGetHandleByIndex(index)
    sim.simDeviceSetAllocatedBytes(theirs, 2**30)  # this process holds it: a process to list
    for name, args in CALLS:
        assert outcome(getattr(pynvml, name), handle, *args) == outcome(
            getattr(sim, name), theirs, *args), name
    assert pynvml.nvmlDeviceGetComputeRunningProcesses(handle)[0].usedGpuMemory == 2**30
    mem = sim.nvmlDeviceGetSupportedMemoryClocks(theirs)[0]
    clocks = pynvml.nvmlDeviceGetSupportedGraphicsClocks(handle, mem)
    assert clocks == sim.nvmlDeviceGetSupportedGraphicsClocks(theirs, mem) and len(clocks) > 10
    uuid, bus = sim.nvmlDeviceGetUUID(theirs), sim.nvmlDeviceGetPciInfo(theirs).busId
    for found in (pynvml.nvmlDeviceGetHandleByUUID(uuid),
                  pynvml.nvmlDeviceGetHandleByPciBusId(bus)):
        assert pynvml.nvmlDeviceGetIndex(found) == index


def test_system_calls_and_a_setter_through_nvidia_ml_py(over_the_sim):
    assert pynvml.nvmlSystemGetDriverVersion() == sim.nvmlSystemGetDriverVersion()
    assert pynvml.nvmlSystemGetNVMLVersion() == sim.nvmlSystemGetNVMLVersion()
    assert pynvml.nvmlSystemGetCudaDriverVersion_v2() == sim.nvmlSystemGetCudaDriverVersion_v2()
    assert pynvml.nvmlDeviceGetCount() == len(BOARDS)
    assert pynvml.nvmlErrorString(pynvml.NVML_ERROR_NOT_SUPPORTED) == "Not Supported"
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    pynvml.nvmlDeviceSetPowerManagementLimit(h, 250_000)
    assert sim.nvmlDeviceGetPowerManagementLimit(sim.nvmlDeviceGetHandleByIndex(0)) == 250_000
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceSetPowerManagementLimit(h, 10)
    events = pynvml.nvmlEventSetCreate()
    pynvml.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, events)
    sim.simDeviceInjectXid(sim.nvmlDeviceGetHandleByIndex(0), 48)
    data = pynvml.nvmlEventSetWait_v2(events, 0)
    assert (data.eventType, data.eventData) == (pynvml.nvmlEventTypeXidCriticalError, 48)
    assert pynvml.nvmlDeviceGetIndex(data.device) == 0
    pynvml.nvmlEventSetFree(events)


def test_every_c_symbol_nvidia_ml_py_calls_for_a_simulated_function_is_offered():
    """A simulated function whose C symbol the sim did not offer would answer a Python caller
    and refuse a C-style one."""
    wanted = set()
    for name, fn in vars(sim).items():
        real = getattr(pynvml, name, None)
        if name.startswith("nvml") and isinstance(fn, types.FunctionType) and real is not None:
            for f in (real, *(c.cell_contents for c in real.__closure__ or ())):
                if isinstance(f, types.FunctionType):
                    wanted |= {c for c in f.__code__.co_consts
                               if isinstance(c, str) and c.startswith("nvml") and " " not in c}
    offered = set(C_SIGNATURES) | {"nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetTemperatureV",
                                   "nvmlDeviceGetFieldValues", "nvmlDeviceGetProcessUtilization",
                                   "nvmlErrorString"}
    assert len(wanted) > 60
    assert wanted - offered == set()


def test_entry_points_answer_c_codes_and_size_as_nvml_does(over_the_sim):
    get = sim._nvmlGetFunctionPointer
    h = sim.nvmlDeviceGetHandleByIndex(1)
    sim.simDeviceSetAllocatedBytes(h, 2**30)
    count = ctypes.c_uint(0)
    procs = get("nvmlDeviceGetComputeRunningProcesses_v3")
    assert procs(h, ctypes.byref(count), None) == pynvml.NVML_ERROR_INSUFFICIENT_SIZE
    assert count.value == 1  # the size, asked with a NULL array
    assert procs(sim.nvmlDeviceGetHandleByIndex(0), ctypes.byref(count), None) == 0  # none
    small = ctypes.create_string_buffer(4)
    name = get("nvmlDeviceGetName")
    assert name(h, small, ctypes.c_uint(4)) == pynvml.NVML_ERROR_INSUFFICIENT_SIZE
    assert name(h, None, ctypes.c_uint(4)) == pynvml.NVML_ERROR_INVALID_ARGUMENT
    memory = pynvml.c_nvmlMemory_v2_t()
    memory.version = 7
    v2 = get("nvmlDeviceGetMemoryInfo_v2")
    assert v2(h, ctypes.byref(memory)) == pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    power = ctypes.c_uint()
    usage = get("nvmlDeviceGetPowerUsage")
    assert usage(ctypes.c_void_p(12), ctypes.byref(power)) == pynvml.NVML_ERROR_INVALID_ARGUMENT
    sim.nvmlShutdown()
    try:
        assert usage(h, ctypes.byref(power)) == pynvml.NVML_ERROR_UNINITIALIZED  # not raised
    finally:
        sim.nvmlInit()


# NVIDIA's answers, per generation (sources: the NVML API reference and nvml.h, 12.9.40):
# - nvmlDeviceGetPowerUsage: "For Fermi or newer fully supported devices": every board.
# - nvmlDeviceGetTotalEnergyConsumption (and its field): "For Volta or newer fully supported
#   devices": NOT_SUPPORTED on Pascal (rust-nvml/nvml-wrapper#54 met it on a Pascal GPU).
# - NVML_FI_DEV_POWER_AVERAGE: "supported on Ampere (except GA100) or newer architectures".
# - NVML_FI_DEV_POWER_INSTANT: "Current GPU power, supported on all architectures".
SUPPORTED = {  # (board, what) -> NVIDIA says it is supported
    **{(b, "power usage"): True for b in BOARDS},
    **{(b, "energy counter"): b != "p100_pcie_16gb" for b in BOARDS},
    **{(b, "average field"): b == "h200_141gb" for b in BOARDS},
    **{(b, "instant field"): True for b in BOARDS},
}


@pytest.mark.parametrize(("board", "what"), list(SUPPORTED))
def test_not_supported_answers_are_nvidias_for_each_generation(over_the_sim, board, what):
    h = pynvml.nvmlDeviceGetHandleByIndex(BOARDS.index(board))
    field = {"energy counter": pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION,
             "average field": pynvml.NVML_FI_DEV_POWER_AVERAGE,
             "instant field": pynvml.NVML_FI_DEV_POWER_INSTANT}.get(what)
    if field is None:
        supported = outcome(pynvml.nvmlDeviceGetPowerUsage, h)[0] == "ok"
    else:
        (value,) = pynvml.nvmlDeviceGetFieldValues(h, [field])
        assert value.nvmlReturn in (pynvml.NVML_SUCCESS, pynvml.NVML_ERROR_NOT_SUPPORTED)
        supported = value.nvmlReturn == pynvml.NVML_SUCCESS
    if what == "energy counter":
        assert (outcome(pynvml.nvmlDeviceGetTotalEnergyConsumption, h)[0] == "ok") == supported
    assert supported == SUPPORTED[board, what]
