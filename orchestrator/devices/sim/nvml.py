"""A simulated NVML: nvidia-ml-py's ``pynvml`` API over the GPU model.

Same function names, arguments, return types, constants and error classes as ``pynvml`` for every
call the adapter makes, so a program written against ``pynvml`` runs unchanged with this module in
its place. The constants, structs and ``NVMLError`` subclasses are *imported from* nvidia-ml-py
rather than copied: this is the one module besides the NVML adapter allowed to import ``pynvml``,
because sharing its types is what makes ``except pynvml.NVMLError_NoPermission`` catch our errors.

Semantics follow NVML's: every call before ``nvmlInit`` raises ``NVMLError_Uninitialized``;
``nvmlInit``/``nvmlShutdown`` are reference-counted; setters raise ``NVMLError_NoPermission``
when the machine is not privileged; values outside the supported range raise
``NVMLError_InvalidArgument`` (a locked clock inside the range runs at the nearest supported clock
at or below it, as NVML rounds); offsets on Volta/Pascal and the energy counter on Pascal raise
``NVMLError_NotSupported``; a GPU marked lost raises ``NVMLError_GpuIsLost`` on every call.
Field values (``nvmlDeviceGetFieldValues``) answer the instant and average power fields and mark
every other field ``NVML_ERROR_NOT_SUPPORTED`` in its own return code, as NVML does.

The surface is one module, as ``pynvml`` is, built from several rooms: ``driver.py`` (the
reference-counted session and the handle checks), ``settings.py`` (what may be set, and setting
it), ``telemetry.py`` (power, energy and field-value readings, and the accounting of kernel calls
and idle time), ``health.py`` (temperature thresholds, ECC counters, events, a lost GPU),
``monitoring.py`` (what monitoring clients ask beyond the adapter), ``processes.py`` (the
processes that hold each GPU: NVML's running-process calls), ``entry_points.py`` (the C entry
points ``_nvmlGetFunctionPointer`` hands out: C's arguments, C's return codes, so nvidia-ml-py's
own wrappers and C-style callers such as nvitop run over the sim) and this module (handles,
identity, the clocks a GPU runs at, the library's own lookups), which re-exports the others.

The machine lives in a state directory (``$DVFS_SIM_STATE_DIR``, see ``state.py``). Calls named
``sim*`` are extensions real NVML has no counterpart for: accounting a kernel call (virtual time,
energy, fault), idling, reading the virtual clock, losing a GPU and reading its ground truth.

Health, as NVML reports it: ECC error counters (``nvmlDeviceGetEccMode``,
``nvmlDeviceGetTotalEccErrors``: the sim has no driver reload, so its volatile and aggregate
counters are equal), the slowdown temperature (``nvmlDeviceGetTemperatureThreshold``) and events
(``nvmlEventSetCreate``, ``nvmlDeviceRegisterEvents``, ``nvmlEventSetWait_v2``): XID critical
errors and double-bit (uncorrected) ECC errors. An event set belongs to the process that created
it and sees only the events recorded after its registration, as NVML's do. Faults are injected
with sim-only calls: ``simDeviceInjectXid``, ``simDeviceInjectEccErrors``,
``simDeviceSetTemperatureC``; ``simDeviceGetXidErrors`` lists every XID a GPU has recorded
(ground truth, where real NVML only delivers XIDs as events). ``simDeviceSetLost(h, True)`` also
records XID 79 (GPU has fallen off the bus), as the driver does.
"""

from __future__ import annotations

import types
from typing import Any

import pynvml as _real

from orchestrator.devices.base import ClockEventReason

# Share nvidia-ml-py's constants, structs and error classes (never its functions: an NVML call
# this module does not simulate must not reach a real driver).
_SHARED_PREFIXES = (
    "NVML_", "NVMLError", "nvmlClocksEventReason", "nvmlClocksThrottleReason", "c_nvml",
    "nvmlClockOffset", "nvmlPciInfo",
)
globals().update(
    {
        name: value
        for name, value in vars(_real).items()
        if name.startswith(_SHARED_PREFIXES)
        or (isinstance(value, type) and issubclass(value, Exception))
    }
)
NVMLError = _real.NVMLError
NVML_CLOCK_GRAPHICS = _real.NVML_CLOCK_GRAPHICS
NVML_CLOCK_MEM = _real.NVML_CLOCK_MEM
NVML_CLOCK_SM = _real.NVML_CLOCK_SM
NVML_ERROR_GPU_IS_LOST = _real.NVML_ERROR_GPU_IS_LOST
NVML_ERROR_INVALID_ARGUMENT = _real.NVML_ERROR_INVALID_ARGUMENT
NVML_ERROR_NO_PERMISSION = _real.NVML_ERROR_NO_PERMISSION
NVML_ERROR_NOT_FOUND = _real.NVML_ERROR_NOT_FOUND
NVML_ERROR_NOT_SUPPORTED = _real.NVML_ERROR_NOT_SUPPORTED
NVML_ERROR_UNINITIALIZED = _real.NVML_ERROR_UNINITIALIZED
NVML_TEMPERATURE_GPU = _real.NVML_TEMPERATURE_GPU
NVML_TEMPERATURE_THRESHOLD_SLOWDOWN = _real.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
NVML_TEMPERATURE_THRESHOLD_COUNT = _real.NVML_TEMPERATURE_THRESHOLD_COUNT
NVML_MEMORY_ERROR_TYPE_CORRECTED = _real.NVML_MEMORY_ERROR_TYPE_CORRECTED
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = _real.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
NVML_VOLATILE_ECC = _real.NVML_VOLATILE_ECC
NVML_AGGREGATE_ECC = _real.NVML_AGGREGATE_ECC
NVML_FEATURE_ENABLED = _real.NVML_FEATURE_ENABLED
NVML_ERROR_TIMEOUT = _real.NVML_ERROR_TIMEOUT
nvmlEventTypeNone = _real.nvmlEventTypeNone
nvmlEventTypeXidCriticalError = _real.nvmlEventTypeXidCriticalError
nvmlEventTypeDoubleBitEccError = _real.nvmlEventTypeDoubleBitEccError
c_nvmlPciInfo_t = _real.nvmlPciInfo_t
c_nvmlFieldValue_t = _real.c_nvmlFieldValue_t
NVML_SUCCESS = _real.NVML_SUCCESS
NVML_POWER_SCOPE_GPU = _real.NVML_POWER_SCOPE_GPU
NVML_VALUE_TYPE_UNSIGNED_INT = _real.NVML_VALUE_TYPE_UNSIGNED_INT
NVML_FI_DEV_POWER_INSTANT = _real.NVML_FI_DEV_POWER_INSTANT
NVML_FI_DEV_POWER_AVERAGE = _real.NVML_FI_DEV_POWER_AVERAGE

from orchestrator.devices.sim.driver import (  # noqa: F401 - the pynvml surface
    SimHandle,
    current_machine,
    gpu_of,
    library_loaded,
    nvmlInit,
    nvmlInitWithFlags,
    nvmlShutdown,
    setter_of,
)
from orchestrator.devices.sim.entry_points import entry_point
from orchestrator.devices.sim.health import (  # noqa: F401 - the pynvml surface
    XID_GPU_FALLEN_OFF_BUS,
    SimEventData,
    SimEventSet,
    nvmlDeviceGetEccMode,
    nvmlDeviceGetSupportedEventTypes,
    nvmlDeviceGetTemperatureThreshold,
    nvmlDeviceGetTotalEccErrors,
    nvmlDeviceRegisterEvents,
    nvmlEventSetCreate,
    nvmlEventSetFree,
    nvmlEventSetWait,
    nvmlEventSetWait_v2,
    simDeviceGetXidErrors,
    simDeviceInjectEccErrors,
    simDeviceInjectXid,
    simDeviceSetLost,
    simDeviceSetTemperatureC,
)
from orchestrator.devices.sim.memory import simDeviceSetAllocatedBytes  # noqa: F401
from orchestrator.devices.sim.monitoring import (  # noqa: F401 - the pynvml surface
    nvmlDeviceGetBrand,
    nvmlDeviceGetC2cModeInfoV,
    nvmlDeviceGetC2cModeInfoV1,
    nvmlDeviceGetComputeMode,
    nvmlDeviceGetCudaComputeCapability,
    nvmlDeviceGetCurrentDriverModel,
    nvmlDeviceGetDecoderUtilization,
    nvmlDeviceGetDisplayActive,
    nvmlDeviceGetDriverModel,
    nvmlDeviceGetDriverModel_v1,
    nvmlDeviceGetDriverModel_v2,
    nvmlDeviceGetEncoderUtilization,
    nvmlDeviceGetFanSpeed,
    nvmlDeviceGetFanSpeed_v2,
    nvmlDeviceGetMemoryInfo,
    nvmlDeviceGetMigMode,
    nvmlDeviceGetMinorNumber,
    nvmlDeviceGetNumFans,
    nvmlDeviceGetPendingDriverModel,
    nvmlDeviceGetPerformanceState,
    nvmlDeviceGetPersistenceMode,
    nvmlDeviceGetPowerState,
    nvmlDeviceGetProcessUtilization,
    nvmlDeviceGetSerial,
    nvmlDeviceGetTemperatureV,
    nvmlDeviceGetTemperatureV1,
    nvmlDeviceGetUtilizationRates,
    nvmlDeviceSetPersistenceMode,
    nvmlMemory_v2,
    nvmlSystemGetCudaDriverVersion,
    nvmlSystemGetCudaDriverVersion_v2,
    nvmlSystemGetNVMLVersion,
    nvmlTemperature_v1,
)
from orchestrator.devices.sim.processes import (  # noqa: F401 - the pynvml surface
    nvmlDeviceGetComputeRunningProcesses,
    nvmlDeviceGetComputeRunningProcesses_v2,
    nvmlDeviceGetComputeRunningProcesses_v3,
    nvmlDeviceGetGraphicsRunningProcesses,
    nvmlDeviceGetGraphicsRunningProcesses_v2,
    nvmlDeviceGetGraphicsRunningProcesses_v3,
    nvmlDeviceGetMPSComputeRunningProcesses,
    nvmlDeviceGetMPSComputeRunningProcesses_v2,
    nvmlDeviceGetMPSComputeRunningProcesses_v3,
    simReleaseProcess,
)
from orchestrator.devices.sim.settings import (  # noqa: F401 - the pynvml surface
    nvmlDeviceGetEnforcedPowerLimit,
    nvmlDeviceGetGpcClkMinMaxVfOffset,
    nvmlDeviceGetGpcClkVfOffset,
    nvmlDeviceGetMaxClockInfo,
    nvmlDeviceGetPowerManagementDefaultLimit,
    nvmlDeviceGetPowerManagementLimit,
    nvmlDeviceGetPowerManagementLimitConstraints,
    nvmlDeviceGetSupportedGraphicsClocks,
    nvmlDeviceGetSupportedMemoryClocks,
    nvmlDeviceResetGpuLockedClocks,
    nvmlDeviceResetMemoryLockedClocks,
    nvmlDeviceSetGpcClkVfOffset,
    nvmlDeviceSetGpuLockedClocks,
    nvmlDeviceSetMemoryLockedClocks,
    nvmlDeviceSetPowerManagementLimit,
)
from orchestrator.devices.sim.telemetry import (  # noqa: F401 - the pynvml surface
    SimCallResult,
    counter_period_s,
    nvmlDeviceGetFieldValues,
    nvmlDeviceGetPowerUsage,
    nvmlDeviceGetTotalEnergyConsumption,
    simDeviceGetEnergyMj,
    simDeviceGetTimeS,
    simDeviceIdle,
    simDeviceRecordBusy,
    simDeviceRecordKernelCall,
    stability_threshold,
)

_ARCH = {
    "kepler": 2, "maxwell": 3, "pascal": 4, "volta": 5, "turing": 6, "ampere": 7, "ada": 8,
    "hopper": 9,
}


# --- system and handles -----------------------------------------------------------------------
def nvmlSystemGetDriverVersion() -> str:
    """NVML's nvmlSystemGetDriverVersion: the driver version string the machine was made with."""
    return current_machine().driver_version


def nvmlDeviceGetCount() -> int:
    """NVML's nvmlDeviceGetCount: how many GPUs the driver sees, lost ones included."""
    return len(current_machine().gpus)


def _reachable(index: int) -> SimHandle:
    """A handle to GPU ``index``, which NVML refuses for a GPU that has fallen off the bus."""
    if current_machine().is_lost(index):
        raise NVMLError(NVML_ERROR_GPU_IS_LOST)
    return SimHandle(index)


def _index_in_range(index: int) -> int:
    m = current_machine()
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(m.gpus):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return index


def _index_of_uuid(uuid: str | bytes) -> int:
    uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
    for g in current_machine().gpus:
        if g.uuid == uuid:
            return g.index
    raise NVMLError(NVML_ERROR_NOT_FOUND)


def nvmlDeviceGetHandleByIndex(index: int) -> SimHandle:
    """GPU ``index``'s handle; ``NVMLError_GpuIsLost`` for a GPU that has fallen off the bus."""
    return _reachable(_index_in_range(index))


def nvmlDeviceGetHandleByUUID(uuid: str | bytes) -> SimHandle:
    """The handle of the GPU with this UUID; ``NVMLError_GpuIsLost`` as by index."""
    return _reachable(_index_of_uuid(uuid))


def nvmlDeviceGetHandleByPciBusId(pciBusId: str | bytes) -> SimHandle:
    """The handle of the GPU at this PCI bus id; ``NVMLError_GpuIsLost`` as by index."""
    bus = (pciBusId.decode() if isinstance(pciBusId, bytes) else pciBusId).upper()
    if bus.count(":") not in (1, 2) or "." not in bus:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    for g in current_machine().gpus:
        full = g.pci_bus_id.upper()
        # NVML accepts "domain:bus:device.function" with a 4- or 8-digit domain, or
        # "bus:device.function".
        if bus in (full, full[4:], full[9:]):
            return _reachable(g.index)
    raise NVMLError(NVML_ERROR_NOT_FOUND)


def simDeviceGetHandleByIndex(index: int) -> SimHandle:
    """Sim only: GPU ``index``'s handle even when it is lost (to bring it back, or inspect it)."""
    return SimHandle(_index_in_range(index))


def simDeviceGetHandleByUUID(uuid: str | bytes) -> SimHandle:
    """Sim only: the handle of the GPU with this UUID even when it is lost."""
    return SimHandle(_index_of_uuid(uuid))


# --- identity -------------------------------------------------------------------------------
def nvmlDeviceGetIndex(handle: SimHandle) -> int:
    """NVML's nvmlDeviceGetIndex: the GPU's index in the driver's enumeration order."""
    return gpu_of(handle)[1]


def nvmlDeviceGetName(handle: SimHandle) -> str:
    """NVML's nvmlDeviceGetName: the profile's product name (``NVIDIA A100-SXM4-40GB``)."""
    m, i = gpu_of(handle)
    return m.profiles[i].name


def nvmlDeviceGetUUID(handle: SimHandle) -> str:
    """NVML's nvmlDeviceGetUUID: the GPU's "GPU-..." UUID, fixed when the machine was made."""
    m, i = gpu_of(handle)
    return m.gpus[i].uuid


def nvmlDeviceGetPciInfo(handle: SimHandle) -> c_nvmlPciInfo_t:
    """NVML's nvmlDeviceGetPciInfo: the GPU's PCI identity, a ``c_nvmlPciInfo_t``.

    The bus id in both forms (8-digit domain, and the legacy 4-digit one), the bus number and the
    profile's PCI device id; domain and device are 0.
    """
    m, i = gpu_of(handle)
    bus_id = m.gpus[i].pci_bus_id
    info = c_nvmlPciInfo_t()
    info.busIdLegacy = bus_id[4:].encode()
    info.busId = bus_id.encode()
    info.domain, info.bus, info.device = 0, int(bus_id.split(":")[1], 16), 0
    info.pciDeviceId = m.profiles[i].pci_device_id
    return info


def nvmlDeviceGetArchitecture(device: SimHandle) -> int:
    """NVML's nvmlDeviceGetArchitecture: the profile architecture's ``NVML_DEVICE_ARCH_*`` code."""
    m, i = gpu_of(device)
    return _ARCH[m.profiles[i].architecture]


_LIMITED = int(  # reasons that hold a clock below a locked minimum
    ClockEventReason.SW_POWER_CAP
    | ClockEventReason.HW_SLOWDOWN
    | ClockEventReason.SW_THERMAL_SLOWDOWN
)


def _within_lock(
    clock: int, locked: Any, supported: tuple[int, ...], s: dict[str, Any], offset: int
) -> int:
    """The clock a GPU runs at the moment a lock applies, from what its state last recorded.

    A lock applies at once, not at the next kernel call: a clock above the locked maximum drops
    to it; an idle GPU, or a resident one that no power cap or thermal limit holds down, runs at
    least at the locked minimum (the supported clocks at or below each bound, as NVML rounds).
    """
    if locked is None:
        return clock
    lo, hi = (_at_or_below(supported, int(v)) + offset for v in locked)
    clock = min(clock, hi)
    idle = int(s.get("reasons", 0)) & int(ClockEventReason.GPU_IDLE)
    if idle or not int(s.get("reasons", 0)) & _LIMITED:
        clock = max(clock, lo)
    return clock


def _at_or_below(supported: tuple[int, ...], mhz: int) -> int:
    below = [c for c in supported if c <= mhz]
    return max(below) if below else min(supported)


def nvmlDeviceGetClockInfo(handle: SimHandle, type: int) -> int:
    """The current clock in MHz; a locked clock shows at once (see ``_within_lock``)."""
    m, i = gpu_of(handle)
    s = m.read(i)
    p = m.profiles[i]
    if type in (NVML_CLOCK_SM, NVML_CLOCK_GRAPHICS):
        offset = int(s.get("offset_mhz", 0))
        return _within_lock(int(s["sm_clock_mhz"]), s["locked_sm_mhz"], p.sm_clocks_mhz, s, offset)
    if type == NVML_CLOCK_MEM:
        return _within_lock(int(s["mem_clock_mhz"]), s["locked_mem_mhz"], p.mem_clocks_mhz, s, 0)
    raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)


def nvmlDeviceGetCurrentClocksEventReasons(handle: SimHandle) -> int:
    """NVML's nvmlDeviceGetCurrentClocksEventReasons: why the clock is where it is, as a bit mask.

    The ``ClockEventReason`` bits the model recorded at the GPU's last kernel call or idle.
    """
    m, i = gpu_of(handle)
    return int(m.read(i)["reasons"])


nvmlDeviceGetCurrentClocksThrottleReasons = nvmlDeviceGetCurrentClocksEventReasons


def nvmlDeviceGetTemperature(handle: SimHandle, sensor: int) -> int:
    """NVML's nvmlDeviceGetTemperature: the die temperature in whole degrees C (GPU sensor only)."""
    m, i = gpu_of(handle)
    if sensor != NVML_TEMPERATURE_GPU:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return int(round(m.read(i)["temperature_c"]))


def simDeviceGetStabilityThresholdMhz(
    handle: SimHandle, kernel_class: str, framework: str = ""
) -> int:
    """Ground truth: the lowest clock at which this kernel class never faults on this GPU."""
    m, i = gpu_of(handle)
    return stability_threshold(m, i, kernel_class, framework)


# --- the library's own lookups: function pointers, error strings, what is not simulated -------
_nvmlGetFunctionPointer_cache: dict[str, Any] = {}  # noqa: N816 - pynvml's name
_LIBRARY = frozenset({"_nvmlGetFunctionPointer", "_LoadNvmlLibrary", "nvmlLib"})


def _library_free(module: types.ModuleType) -> frozenset[str]:
    """The functions of nvidia-ml-py that never reach the C library, directly or through another
    of its functions: its pure-Python helpers (``nvmlExceptionClass``, ``_nvmlCheckReturn``,
    ``nvmlStructToFriendlyObject``...), which a client gets from here as they are."""
    own = {n: f for n, f in vars(module).items()
           if isinstance(f, types.FunctionType) and f.__module__ == module.__name__}

    def names(fn: types.FunctionType) -> set[str]:
        found: set[str] = set()
        for f in (fn, *(c.cell_contents for c in fn.__closure__ or ())):
            if isinstance(f, types.FunctionType):
                code = f.__code__
                found |= set(code.co_names)
                found |= {n for c in code.co_consts if isinstance(c, types.CodeType)
                          for n in c.co_names}
        return found

    reaches = {n for n, f in own.items() if names(f) & _LIBRARY}
    while True:  # a function that calls one that reaches the library reaches it too
        more = {n for n, f in own.items() if n not in reaches and names(f) & reaches}
        if not more:
            return frozenset(own) - reaches
        reaches |= more


_PYNVML_HELPERS = _library_free(_real)


def _nvmlGetFunctionPointer(name: str) -> Any:  # noqa: N802 - pynvml's name
    """The C entry point ``name`` of the simulated library, as nvidia-ml-py looks its own up.

    The entry point takes the C function's arguments and returns its ``nvmlReturn_t`` code, as
    the real library's does (``entry_points.py``), so nvidia-ml-py's own wrappers and clients that
    call NVML as C is called (nvitop) run over it. Cached in ``_nvmlGetFunctionPointer_cache``
    (a client may fill it, as gpustat does).

    Raises:
        NVMLError_Uninitialized: ``nvmlInit`` has never succeeded in this process (the library
            is not loaded yet; after ``nvmlShutdown`` it stays loaded, as nvidia-ml-py's does).
        NVMLError_FunctionNotFound: the sim does not offer that entry point.
    """
    if name in _nvmlGetFunctionPointer_cache:
        return _nvmlGetFunctionPointer_cache[name]
    if not library_loaded():
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    fn = entry_point(name, globals())
    if fn is None:
        raise NVMLError(_real.NVML_ERROR_FUNCTION_NOT_FOUND)
    _nvmlGetFunctionPointer_cache[name] = fn
    return fn


def nvmlErrorString(result: int) -> str:
    """NVML's text for a return code."""
    return _real.NVMLError._errcode_to_string.get(int(result), "Unknown Error")


def _not_simulated(name: str) -> Any:
    def call(*args: Any, **kwargs: Any) -> Any:
        raise NVMLError(_real.NVML_ERROR_FUNCTION_NOT_FOUND)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"Not simulated: NVMLError_FunctionNotFound, as {name} on a driver without it."
    return call


def __getattr__(name: str) -> Any:
    """Every other name nvidia-ml-py has, so a client written against it finds it here too.

    Its constants, structs, ctypes names and pure-Python helpers (``_PYNVML_HELPERS``) are
    nvidia-ml-py's own; each of its functions that would call the C library, and that the sim
    does not simulate, raises ``NVMLError_FunctionNotFound`` (as on a driver that lacks that
    entry point), and never reaches a real driver.
    """
    if name.startswith("__") or not hasattr(_real, name):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_real, name)
    if (isinstance(value, types.FunctionType) and value.__module__ == _real.__name__
            and name not in _PYNVML_HELPERS):
        value = _not_simulated(name)
    globals()[name] = value
    return value
