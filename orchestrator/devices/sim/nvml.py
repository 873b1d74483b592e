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

The surface is one module, as ``pynvml`` is, built from three rooms: ``driver.py`` (the
reference-counted session and the handle checks), ``telemetry.py`` (power, energy and field-value
readings, and the accounting of kernel calls and idle time) and this module (identity, settings,
clocks, health and events), which re-exports the other two.

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

import math
import re
import time
import types
from ctypes import c_int as _c_int
from dataclasses import dataclass
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

from orchestrator.devices.sim import driver as _driver
from orchestrator.devices.sim.driver import (  # noqa: F401 - the pynvml surface
    SimHandle,
    _gpu,
    _m,
    _setter,
    nvmlInit,
    nvmlInitWithFlags,
    nvmlShutdown,
    simMachineStateDir,
)
from orchestrator.devices.sim.telemetry import (  # noqa: F401 - the pynvml surface
    SimCallResult,
    _threshold,
    counter_period_s,
    nvmlDeviceGetFieldValues,
    nvmlDeviceGetPowerUsage,
    nvmlDeviceGetTotalEnergyConsumption,
    simDeviceGetEnergyMj,
    simDeviceGetTimeS,
    simDeviceIdle,
    simDeviceRecordKernelCall,
)
from orchestrator.devices.sim.monitoring import (  # noqa: F401 - the pynvml surface
    nvmlDeviceGetBrand,
    nvmlDeviceGetC2cModeInfoV,
    nvmlDeviceGetC2cModeInfoV1,
    nvmlDeviceGetComputeMode,
    nvmlDeviceGetComputeRunningProcesses,
    nvmlDeviceGetComputeRunningProcesses_v2,
    nvmlDeviceGetComputeRunningProcesses_v3,
    nvmlDeviceGetCudaComputeCapability,
    nvmlDeviceGetDecoderUtilization,
    nvmlDeviceGetEncoderUtilization,
    nvmlDeviceGetFanSpeed,
    nvmlDeviceGetFanSpeed_v2,
    nvmlDeviceGetGraphicsRunningProcesses,
    nvmlDeviceGetGraphicsRunningProcesses_v2,
    nvmlDeviceGetGraphicsRunningProcesses_v3,
    nvmlDeviceGetMemoryInfo,
    nvmlDeviceGetMigMode,
    nvmlDeviceGetMinorNumber,
    nvmlDeviceGetMPSComputeRunningProcesses,
    nvmlDeviceGetMPSComputeRunningProcesses_v2,
    nvmlDeviceGetMPSComputeRunningProcesses_v3,
    nvmlDeviceGetNumFans,
    nvmlDeviceGetPerformanceState,
    nvmlDeviceGetPersistenceMode,
    nvmlDeviceGetPowerState,
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

_ARCH = {
    "kepler": 2, "maxwell": 3, "pascal": 4, "volta": 5, "turing": 6, "ampere": 7, "ada": 8,
    "hopper": 9,
}


# --- system and handles -----------------------------------------------------------------------
def nvmlSystemGetDriverVersion() -> str:
    return _m().driver_version


def nvmlDeviceGetCount() -> int:
    return len(_m().gpus)


def _reachable(index: int) -> SimHandle:
    """A handle to GPU ``index``, which NVML refuses for a GPU that has fallen off the bus."""
    if _m().is_lost(index):
        raise NVMLError(NVML_ERROR_GPU_IS_LOST)
    return SimHandle(index)


def _index_in_range(index: int) -> int:
    m = _m()
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(m.gpus):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return index


def _index_of_uuid(uuid: str | bytes) -> int:
    uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
    for g in _m().gpus:
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
    for g in _m().gpus:
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
    return _gpu(handle)[1]


def nvmlDeviceGetName(handle: SimHandle) -> str:
    m, i = _gpu(handle)
    return m.profiles[i].name


def nvmlDeviceGetUUID(handle: SimHandle) -> str:
    m, i = _gpu(handle)
    return m.gpus[i].uuid


def nvmlDeviceGetPciInfo(handle: SimHandle) -> c_nvmlPciInfo_t:
    m, i = _gpu(handle)
    bus_id = m.gpus[i].pci_bus_id
    info = c_nvmlPciInfo_t()
    info.busIdLegacy = bus_id[4:].encode()
    info.busId = bus_id.encode()
    info.domain, info.bus, info.device = 0, int(bus_id.split(":")[1], 16), 0
    info.pciDeviceId = m.profiles[i].pci_device_id
    return info


def nvmlDeviceGetArchitecture(device: SimHandle) -> int:
    m, i = _gpu(device)
    return _ARCH[m.profiles[i].architecture]


# --- what may be set --------------------------------------------------------------------------
def nvmlDeviceGetSupportedMemoryClocks(handle: SimHandle) -> list[int]:
    m, i = _gpu(handle)
    return sorted(m.profiles[i].mem_clocks_mhz, reverse=True)


def nvmlDeviceGetSupportedGraphicsClocks(handle: SimHandle, memoryClockMHz: int) -> list[int]:
    m, i = _gpu(handle)
    p = m.profiles[i]
    if memoryClockMHz not in p.mem_clocks_mhz:
        raise NVMLError(NVML_ERROR_NOT_FOUND)
    return sorted(p.sm_clocks_mhz, reverse=True)


def nvmlDeviceGetMaxClockInfo(handle: SimHandle, type: int) -> int:
    m, i = _gpu(handle)
    p = m.profiles[i]
    return p.mem_max_mhz if type == NVML_CLOCK_MEM else p.f_max_mhz


def nvmlDeviceGetPowerManagementLimitConstraints(handle: SimHandle) -> list[int]:
    m, i = _gpu(handle)
    p = m.profiles[i]
    return [int(p.power_limit_min_w * 1000), int(p.power_limit_max_w * 1000)]


def nvmlDeviceGetPowerManagementDefaultLimit(handle: SimHandle) -> int:
    m, i = _gpu(handle)
    return int(m.profiles[i].power_limit_default_w * 1000)


def nvmlDeviceGetPowerManagementLimit(handle: SimHandle) -> int:
    m, i = _gpu(handle)
    return int(round(m.read(i)["power_limit_w"] * 1000))


def nvmlDeviceGetEnforcedPowerLimit(handle: SimHandle) -> int:
    return nvmlDeviceGetPowerManagementLimit(handle)


def nvmlDeviceGetGpcClkMinMaxVfOffset(
    device: SimHandle, minOffset: Any = _c_int(), maxOffset: Any = _c_int()  # noqa: B008 - as pynvml
) -> tuple[int, int] | int:
    """The offset range in MHz, as pynvml gives it: a tuple for ``c_int`` arguments (the default),
    else (references, e.g. ``byref(c_int())``) filled in and ``NVML_SUCCESS``."""
    m, i = _gpu(device)
    rng = m.profiles[i].clock_offset_range_mhz
    if rng is None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    is_reference = type(minOffset) is not _c_int or type(maxOffset) is not _c_int
    for out, value in ((minOffset, rng[0]), (maxOffset, rng[1])):
        getattr(out, "_obj", out).value = int(value)
    return NVML_SUCCESS if is_reference else (int(rng[0]), int(rng[1]))


def nvmlDeviceGetGpcClkVfOffset(device: SimHandle) -> int:
    m, i = _gpu(device)
    if m.profiles[i].clock_offset_range_mhz is None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return int(m.read(i)["offset_mhz"])


# --- setters ----------------------------------------------------------------------------------
def _set(handle: SimHandle, key: str, value: Any) -> None:
    m, i = _setter(handle)

    def change(s: dict[str, Any]) -> None:
        s[key] = value

    m.update(i, change, sync=True)


def nvmlDeviceSetGpuLockedClocks(
    handle: SimHandle, minGpuClockMHz: int, maxGpuClockMHz: int
) -> None:
    m, i = _setter(handle)
    p = m.profiles[i]
    if not p.f_min_mhz <= minGpuClockMHz <= maxGpuClockMHz <= p.f_max_mhz:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    _set(handle, "locked_sm_mhz", [int(minGpuClockMHz), int(maxGpuClockMHz)])


def nvmlDeviceResetGpuLockedClocks(handle: SimHandle) -> None:
    _setter(handle)
    _set(handle, "locked_sm_mhz", None)


def nvmlDeviceSetMemoryLockedClocks(
    handle: SimHandle, minMemClockMHz: int, maxMemClockMHz: int
) -> None:
    m, i = _setter(handle)
    mems = m.profiles[i].mem_clocks_mhz
    if not mems[0] <= minMemClockMHz <= maxMemClockMHz <= mems[-1]:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    _set(handle, "locked_mem_mhz", [int(minMemClockMHz), int(maxMemClockMHz)])


def nvmlDeviceResetMemoryLockedClocks(handle: SimHandle) -> None:
    _setter(handle)
    _set(handle, "locked_mem_mhz", None)


def nvmlDeviceSetPowerManagementLimit(handle: SimHandle, limit: int) -> None:
    m, i = _setter(handle)
    p = m.profiles[i]
    if not p.power_limit_min_w * 1000 <= limit <= p.power_limit_max_w * 1000:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    _set(handle, "power_limit_w", limit / 1000.0)


def nvmlDeviceSetGpcClkVfOffset(device: SimHandle, offset: int) -> None:
    m, i = _setter(device)
    rng = m.profiles[i].clock_offset_range_mhz
    if rng is None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    if not rng[0] <= offset <= rng[1]:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    _set(device, "offset_mhz", int(offset))


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
    m, i = _gpu(handle)
    s = m.read(i)
    p = m.profiles[i]
    if type in (NVML_CLOCK_SM, NVML_CLOCK_GRAPHICS):
        offset = int(s.get("offset_mhz", 0))
        return _within_lock(int(s["sm_clock_mhz"]), s["locked_sm_mhz"], p.sm_clocks_mhz, s, offset)
    if type == NVML_CLOCK_MEM:
        return _within_lock(int(s["mem_clock_mhz"]), s["locked_mem_mhz"], p.mem_clocks_mhz, s, 0)
    raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)


def nvmlDeviceGetCurrentClocksEventReasons(handle: SimHandle) -> int:
    m, i = _gpu(handle)
    return int(m.read(i)["reasons"])


nvmlDeviceGetCurrentClocksThrottleReasons = nvmlDeviceGetCurrentClocksEventReasons


def nvmlDeviceGetTemperature(handle: SimHandle, sensor: int) -> int:
    m, i = _gpu(handle)
    if sensor != NVML_TEMPERATURE_GPU:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return int(round(m.read(i)["temperature_c"]))


# --- health: temperature thresholds, ECC counters, events -------------------------------------
XID_GPU_FALLEN_OFF_BUS = 79  # the XID the driver logs when a GPU is lost
_EVENT_TYPES = nvmlEventTypeXidCriticalError | nvmlEventTypeDoubleBitEccError  # what the sim emits


def nvmlDeviceGetTemperatureThreshold(handle: SimHandle, threshold: int) -> int:
    """The slowdown temperature from the profile; the sim models no other threshold."""
    m, i = _gpu(handle)
    if not isinstance(threshold, int) or not 0 <= threshold < NVML_TEMPERATURE_THRESHOLD_COUNT:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    if threshold != NVML_TEMPERATURE_THRESHOLD_SLOWDOWN:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return int(round(m.profiles[i].slowdown_temp_c))


def nvmlDeviceGetEccMode(handle: SimHandle) -> list[int]:
    """``[current, pending]``: every simulated board (HBM) runs with ECC on."""
    _gpu(handle)
    return [NVML_FEATURE_ENABLED, NVML_FEATURE_ENABLED]


def _ecc(s: dict[str, Any]) -> dict[str, int]:
    return dict(s.get("ecc_errors") or {"corrected": 0, "uncorrected": 0})


def nvmlDeviceGetTotalEccErrors(handle: SimHandle, errorType: int, counterType: int) -> int:
    """ECC errors of one type (corrected or uncorrected), volatile or aggregate (equal here)."""
    m, i = _gpu(handle)
    if errorType not in (NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_MEMORY_ERROR_TYPE_UNCORRECTED):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    if counterType not in (NVML_VOLATILE_ECC, NVML_AGGREGATE_ECC):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    key = "uncorrected" if errorType == NVML_MEMORY_ERROR_TYPE_UNCORRECTED else "corrected"
    return int(_ecc(m.read(i))[key])


@dataclass
class SimEventSet:
    """An event set (NVML's is an opaque pointer): this process's registrations."""

    registered: dict[int, list[int]]  # GPU index -> [event mask, events seen so far]
    freed: bool = False


@dataclass(frozen=True)
class SimEventData:
    """One event, with the attributes of nvidia-ml-py's ``c_nvmlEventData_t``."""

    device: SimHandle
    eventType: int
    eventData: int  # the XID for nvmlEventTypeXidCriticalError
    gpuInstanceId: int = 0xFFFFFFFF
    computeInstanceId: int = 0xFFFFFFFF


def nvmlEventSetCreate() -> SimEventSet:
    _m()
    return SimEventSet(registered={})


def nvmlDeviceGetSupportedEventTypes(handle: SimHandle) -> int:
    _gpu(handle)
    return _EVENT_TYPES


def nvmlDeviceRegisterEvents(handle: SimHandle, eventTypes: int, eventSet: SimEventSet) -> None:
    """Deliver this GPU's events of ``eventTypes`` recorded from now on to ``eventSet``."""
    m, i = _gpu(handle)
    if not isinstance(eventSet, SimEventSet) or eventSet.freed:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    if int(eventTypes) & ~_EVENT_TYPES:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    if i in eventSet.registered:
        eventSet.registered[i][0] |= int(eventTypes)
    else:
        eventSet.registered[i] = [int(eventTypes), len(m.read(i).get("events", []))]


def nvmlEventSetWait_v2(eventSet: SimEventSet, timeoutms: int) -> SimEventData:
    """The next event of a registered GPU; waits up to ``timeoutms`` of wall time for one.

    Raises:
        NVMLError_Timeout: no event came in time.
    """
    m = _m()
    if not isinstance(eventSet, SimEventSet) or eventSet.freed:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    deadline = time.monotonic() + max(0, int(timeoutms)) / 1000.0
    while True:
        for i, reg in sorted(eventSet.registered.items()):
            events = m.read(i).get("events", [])
            while reg[1] < len(events):
                kind, data = events[reg[1]]
                reg[1] += 1
                if kind & reg[0]:
                    return SimEventData(
                        device=SimHandle(i), eventType=int(kind), eventData=int(data)
                    )
        if time.monotonic() >= deadline:
            raise NVMLError(NVML_ERROR_TIMEOUT)
        time.sleep(min(0.01, max(0.0, deadline - time.monotonic())))


nvmlEventSetWait = nvmlEventSetWait_v2


def nvmlEventSetFree(eventSet: SimEventSet) -> None:
    if not isinstance(eventSet, SimEventSet) or eventSet.freed:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    eventSet.freed = True
    eventSet.registered.clear()



def simDeviceSetLost(handle: SimHandle, lost: bool) -> None:
    """Make the GPU fall off the bus (every call raises GPU_IS_LOST) or bring it back."""
    m, i = _gpu(handle, allow_lost=True)

    def change(s: dict[str, Any]) -> None:
        if lost and not s["lost"]:
            _record_event(s, nvmlEventTypeXidCriticalError, XID_GPU_FALLEN_OFF_BUS)
        s["lost"] = bool(lost)

    m.update(i, change, sync=True)


def _record_event(s: dict[str, Any], kind: int, data: int) -> None:
    s["events"] = [*s.get("events", []), [int(kind), int(data)]]


def simDeviceInjectXid(handle: SimHandle, xid: int) -> None:
    """Sim only: the driver reports XID ``xid`` for this GPU (an XID critical-error event).

    Real NVML has no call that lists past XIDs; it delivers each as an event to the event sets
    registered for ``nvmlEventTypeXidCriticalError`` (see ``nvmlEventSetWait_v2``).
    """
    m, i = _gpu(handle, allow_lost=True)
    if not isinstance(xid, int) or isinstance(xid, bool) or xid <= 0:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    m.update(i, lambda s: _record_event(s, nvmlEventTypeXidCriticalError, xid), sync=True)


def simDeviceGetXidErrors(handle: SimHandle) -> list[int]:
    """Sim only: every XID this GPU has recorded, oldest first (ground truth for tests)."""
    m, i = _gpu(handle, allow_lost=True)
    events = m.read(i).get("events", [])
    return [int(data) for kind, data in events if kind == nvmlEventTypeXidCriticalError]


def simDeviceInjectEccErrors(
    handle: SimHandle, count: int, errorType: int = NVML_MEMORY_ERROR_TYPE_UNCORRECTED
) -> None:
    """Sim only: ``count`` memory errors of ``errorType`` (uncorrected by default) happen now.

    Both the volatile and the aggregate counters grow; an uncorrected error also emits a
    double-bit ECC event (``nvmlEventTypeDoubleBitEccError``), as a real board does.
    """
    m, i = _gpu(handle)
    if errorType not in (NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_MEMORY_ERROR_TYPE_UNCORRECTED):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    key = "uncorrected" if errorType == NVML_MEMORY_ERROR_TYPE_UNCORRECTED else "corrected"

    def change(s: dict[str, Any]) -> None:
        ecc = _ecc(s)
        ecc[key] += count
        s["ecc_errors"] = ecc
        if key == "uncorrected" and count:
            _record_event(s, nvmlEventTypeDoubleBitEccError, 0)

    m.update(i, change, sync=True)


def simDeviceSetTemperatureC(handle: SimHandle, celsius: float) -> None:
    """Sim only: the die is at ``celsius`` now (the thermal model carries on from there).

    At or above the profile's slowdown temperature the model slows the clock
    (``SW_THERMAL_SLOWDOWN``) and ``nvmlDeviceGetTemperatureThreshold`` says so; the model's own
    heating never gets there within a board's power range.
    """
    m, i = _gpu(handle)
    value = float(celsius)
    if not math.isfinite(value):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)

    def change(s: dict[str, Any]) -> None:
        s["temperature_c"] = value

    m.update(i, change, sync=True)


def simDeviceGetStabilityThresholdMhz(
    handle: SimHandle, kernel_class: str, framework: str = ""
) -> int:
    """Ground truth: the lowest clock at which this kernel class never faults on this GPU."""
    m, i = _gpu(handle)
    return _threshold(m, i, kernel_class, framework)


# --- the library's own lookups: function pointers, error strings, what is not simulated -------
_nvmlGetFunctionPointer_cache: dict[str, Any] = {}  # noqa: N816 - pynvml's name
_VERSION_SUFFIX = re.compile(r"_v\d+$")
_PYNVML_HELPERS = frozenset({"nvmlStructToFriendlyObject", "nvmlFriendlyObjectToStruct"})


def _simulated(name: str) -> Any:
    """The function this module offers for the NVML entry point ``name`` (None: not simulated).

    NVML's C symbols carry version suffixes that pynvml's Python names often drop
    (``nvmlDeviceGetHandleByIndex_v2``, ``nvmlDeviceGetMemoryInfo_v2``,
    ``nvmlDeviceGetComputeRunningProcesses_v3``, ``nvmlInit_v2``).
    """
    for candidate in (name, _VERSION_SUFFIX.sub("", name)):
        fn = globals().get(candidate)
        if isinstance(fn, types.FunctionType) and candidate.startswith("nvml"):
            return fn
    return None


def _nvmlGetFunctionPointer(name: str) -> Any:  # noqa: N802 - pynvml's name
    """The entry point ``name`` of the simulated library, as nvidia-ml-py looks its own up.

    Cached in ``_nvmlGetFunctionPointer_cache`` (a client may fill it, as gpustat does). The
    "pointer" is this module's Python function for that call, taking pynvml's arguments (not
    ctypes ones): clients look entry points up to learn what the driver offers.

    Raises:
        NVMLError_Uninitialized: ``nvmlInit`` has never succeeded in this process (the library
            is not loaded yet; after ``nvmlShutdown`` it stays loaded, as nvidia-ml-py's does).
        NVMLError_FunctionNotFound: the sim does not simulate that entry point.
    """
    if name in _nvmlGetFunctionPointer_cache:
        return _nvmlGetFunctionPointer_cache[name]
    if not _driver._loaded:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    fn = _simulated(name)
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

    Its constants, structs and pure-Python helpers are nvidia-ml-py's own; each of its NVML calls
    that the sim does not simulate raises ``NVMLError_FunctionNotFound`` (as on a driver that
    lacks that entry point), and never reaches a real driver.
    """
    if name.startswith("__") or not hasattr(_real, name):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_real, name)
    if isinstance(value, types.FunctionType) and name not in _PYNVML_HELPERS:
        value = _not_simulated(name)
    globals()[name] = value
    return value

