"""A simulated GPU's health as NVML reports it: temperature thresholds, ECC counters, XID events.

NVML's own calls (``nvmlDeviceGetTemperatureThreshold``, ``nvmlDeviceGetTotalEccErrors``, the
event-set calls) read what the GPU's state holds; the ``simDevice*`` calls make it happen: a GPU
falls off the bus (XID 79), the driver logs an XID, memory errors happen, the die heats up.
Events are kept in the state file in the order they happened, so an event set registered in any
process sees them (``nvmlEventSetWait_v2`` polls). ``orchestrator.devices.sim.nvml`` re-exports
every public name here as part of its pynvml surface.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from pynvml import (
    NVML_AGGREGATE_ECC,
    NVML_ERROR_INVALID_ARGUMENT,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_ERROR_TIMEOUT,
    NVML_FEATURE_ENABLED,
    NVML_MEMORY_ERROR_TYPE_CORRECTED,
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
    NVML_TEMPERATURE_THRESHOLD_COUNT,
    NVML_TEMPERATURE_THRESHOLD_SLOWDOWN,
    NVML_VOLATILE_ECC,
    NVMLError,
    nvmlEventTypeDoubleBitEccError,
    nvmlEventTypeXidCriticalError,
)

from orchestrator.devices.sim.driver import SimHandle, current_machine, gpu_of

XID_GPU_FALLEN_OFF_BUS = 79  # the XID the driver logs when a GPU is lost
_EVENT_TYPES = nvmlEventTypeXidCriticalError | nvmlEventTypeDoubleBitEccError  # what the sim emits


def nvmlDeviceGetTemperatureThreshold(handle: SimHandle, threshold: int) -> int:
    """The slowdown temperature from the profile; the sim models no other threshold."""
    m, i = gpu_of(handle)
    if not isinstance(threshold, int) or not 0 <= threshold < NVML_TEMPERATURE_THRESHOLD_COUNT:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    if threshold != NVML_TEMPERATURE_THRESHOLD_SLOWDOWN:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return int(round(m.profiles[i].slowdown_temp_c))


def nvmlDeviceGetEccMode(handle: SimHandle) -> list[int]:
    """``[current, pending]``: every simulated board (HBM) runs with ECC on."""
    gpu_of(handle)
    return [NVML_FEATURE_ENABLED, NVML_FEATURE_ENABLED]


def _ecc(s: dict[str, Any]) -> dict[str, int]:
    return dict(s.get("ecc_errors") or {"corrected": 0, "uncorrected": 0})


def nvmlDeviceGetTotalEccErrors(handle: SimHandle, errorType: int, counterType: int) -> int:
    """ECC errors of one type (corrected or uncorrected), volatile or aggregate (equal here)."""
    m, i = gpu_of(handle)
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
    """NVML's nvmlEventSetCreate: a new, empty event set owned by this process."""
    current_machine()
    return SimEventSet(registered={})


def nvmlDeviceGetSupportedEventTypes(handle: SimHandle) -> int:
    """NVML's nvmlDeviceGetSupportedEventTypes: the events the sim emits (XID, double-bit ECC)."""
    gpu_of(handle)
    return _EVENT_TYPES


def nvmlDeviceRegisterEvents(handle: SimHandle, eventTypes: int, eventSet: SimEventSet) -> None:
    """Deliver this GPU's events of ``eventTypes`` recorded from now on to ``eventSet``."""
    m, i = gpu_of(handle)
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
    m = current_machine()
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
    """NVML's nvmlEventSetFree: release an event set; freeing it twice is ``INVALID_ARGUMENT``."""
    if not isinstance(eventSet, SimEventSet) or eventSet.freed:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    eventSet.freed = True
    eventSet.registered.clear()



def simDeviceSetLost(handle: SimHandle, lost: bool) -> None:
    """Make the GPU fall off the bus (every call raises GPU_IS_LOST) or bring it back."""
    m, i = gpu_of(handle, allow_lost=True)

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
    m, i = gpu_of(handle, allow_lost=True)
    if not isinstance(xid, int) or isinstance(xid, bool) or xid <= 0:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    m.update(i, lambda s: _record_event(s, nvmlEventTypeXidCriticalError, xid), sync=True)


def simDeviceGetXidErrors(handle: SimHandle) -> list[int]:
    """Sim only: every XID this GPU has recorded, oldest first (ground truth for tests)."""
    m, i = gpu_of(handle, allow_lost=True)
    events = m.read(i).get("events", [])
    return [int(data) for kind, data in events if kind == nvmlEventTypeXidCriticalError]


def simDeviceInjectEccErrors(
    handle: SimHandle, count: int, errorType: int = NVML_MEMORY_ERROR_TYPE_UNCORRECTED
) -> None:
    """Sim only: ``count`` memory errors of ``errorType`` (uncorrected by default) happen now.

    Both the volatile and the aggregate counters grow; an uncorrected error also emits a
    double-bit ECC event (``nvmlEventTypeDoubleBitEccError``), as a real board does.
    """
    m, i = gpu_of(handle)
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
    m, i = gpu_of(handle)
    value = float(celsius)
    if not math.isfinite(value):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)

    def change(s: dict[str, Any]) -> None:
        s["temperature_c"] = value

    m.update(i, change, sync=True)
