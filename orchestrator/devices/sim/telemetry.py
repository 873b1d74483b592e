"""The simulated GPU's sensors and its accounting of kernel calls (NVML's telemetry calls).

Power and energy readings (``nvmlDeviceGetTotalEnergyConsumption``, ``nvmlDeviceGetPowerUsage``,
``nvmlDeviceGetFieldValues``) and the sim's extensions that move a GPU's virtual time on: an
accounted kernel call (``simDeviceRecordKernelCall``), idle time (``simDeviceIdle``) and the
virtual clock (``simDeviceGetTimeS``). ``nvml.py`` re-exports every public name.

Readings are NVML's as each generation makes them (``GpuProfile.sensors``, computed by
``sensors.py``): a reading is the mean power over its sensor's window before the sensor's latest
update, exact in virtual time; the energy counter steps every ``counter_period_s``; the exact
energy (``energy_mj`` in the state) is ground truth that no NVML call returns. A power cap acts
after the controller's filter (``sensors.capped_call``). State keys this module adds to a GPU's
state dict, each created the first time it is needed: ``sensor_windows`` (one track per distinct
sensor) and ``cap_over_s`` (the cap controller's integrator).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pynvml as _real

from orchestrator.devices.base import ClockEventReason, Fault, KernelWork
from orchestrator.devices.sim import model, processes, sensors
from orchestrator.devices.sim.driver import SimHandle, gpu_of
from orchestrator.devices.sim.profile import PowerSensor
from orchestrator.devices.sim.state import Machine

NVMLError = _real.NVMLError
NVML_ERROR_INVALID_ARGUMENT = _real.NVML_ERROR_INVALID_ARGUMENT
NVML_ERROR_NOT_SUPPORTED = _real.NVML_ERROR_NOT_SUPPORTED
NVML_SUCCESS = _real.NVML_SUCCESS
NVML_POWER_SCOPE_GPU = _real.NVML_POWER_SCOPE_GPU
NVML_VALUE_TYPE_UNSIGNED_INT = _real.NVML_VALUE_TYPE_UNSIGNED_INT
NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = _real.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
c_nvmlFieldValue_t = _real.c_nvmlFieldValue_t

_TRACKS = "sensor_windows"  # state key: {sensors.sensor_key(sensor): track}
_CAP_OVER = "cap_over_s"  # state key: the power-cap controller's integrator (s)


@dataclass(frozen=True)
class SimCallResult:
    """What one accounted kernel call did on the simulated GPU."""

    duration_s: float
    energy_mj: float
    power_mw: int
    sm_clock_mhz: int
    fault: Fault

# --- telemetry --------------------------------------------------------------------------------
def _energy_counter_mj(m: Machine, i: int, s: dict[str, Any]) -> int:
    return int(s["counter_mj"] if counter_period_s(m, i) > 0 else s["energy_mj"])


def nvmlDeviceGetTotalEnergyConsumption(handle: SimHandle) -> int:
    """NVML's nvmlDeviceGetTotalEnergyConsumption: the energy counter in mJ, cumulative.

    The counter as of its latest update (every ``counter_period_s``; the exact energy when that
    is 0); ``NVMLError_NotSupported`` on a profile without one (Pascal).
    """
    m, i = gpu_of(handle)
    if not m.profiles[i].has_energy_counter:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return _energy_counter_mj(m, i, m.read(i))


def _reading_mw(s: dict[str, Any], sensor: PowerSensor) -> int:
    """What ``sensor`` reads now: its track's latest window mean (see ``sensors.py``), in mW.

    A GPU whose state has no track yet has not moved since the sim began keeping them: its
    power has been ``power_w`` all along, as far as the sim knows.
    """
    track = (s.get(_TRACKS) or {}).get(sensors.sensor_key(sensor))
    watts = s["power_w"] if track is None else sensors.track_reading_w(track)
    return int(round(watts * 1000))


def nvmlDeviceGetPowerUsage(handle: SimHandle) -> int:
    """The board's ``power_usage`` sensor in mW: instant on GA100 and before, a 1 s average on
    Hopper and non-GA100 Ampere (``GpuProfile.sensors``)."""
    m, i = gpu_of(handle)
    return _reading_mw(m.read(i), m.profiles[i].sensors.power_usage)


_POWER_FIELDS = {
    _real.NVML_FI_DEV_POWER_INSTANT: "power_instant",
    _real.NVML_FI_DEV_POWER_AVERAGE: "power_average",
}
_ENERGY_FIELD = _real.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION


def nvmlDeviceGetFieldValues(handle: SimHandle, fieldIds: list[Any]) -> Any:
    """Field values as pynvml returns them: a ``c_nvmlFieldValue_t`` array, one per request.

    Each request is a field id, or a ``(fieldId, scopeId)`` pair as pynvml accepts. The sim
    answers, per the board's profile (``GpuProfile.sensors``):

    - ``NVML_FI_DEV_POWER_INSTANT`` and ``NVML_FI_DEV_POWER_AVERAGE`` at GPU scope
      (``NVML_POWER_SCOPE_GPU``), in mW as an unsigned int: each the mean power over its
      sensor's window before the sensor's latest update (``sensors.py``). A board whose profile
      has no such sensor (GA100's average; both on Volta and Pascal) answers
      ``NVML_ERROR_NOT_SUPPORTED`` for it.
    - ``NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION``: the energy counter in mJ as an unsigned long
      long, the value ``nvmlDeviceGetTotalEnergyConsumption`` returns (the same ~100 ms steps);
      ``NVML_ERROR_NOT_SUPPORTED`` on a board without a counter. The field has no scope: its
      ``scopeId`` is ignored, as NVML ignores it for unscoped fields.

    Any other field or scope gets ``NVML_ERROR_NOT_SUPPORTED`` in its own ``nvmlReturn``, as
    NVML reports a field the GPU does not offer; the call itself fails only as every call does
    (before ``nvmlInit``, a bad handle, a lost GPU). ``timestamp`` is when the value was read,
    not when its sensor last updated: NVML's is the host's CPU time in microseconds since 1970,
    the sim's is the GPU's virtual clock in microseconds. ``latencyUsec`` is 0.
    """
    m, i = gpu_of(handle)
    p = m.profiles[i]
    s = m.read(i)
    now_us = int(round(float(s["time_s"]) * 1e6))
    values = (c_nvmlFieldValue_t * len(fieldIds))()
    for value, request in zip(values, fieldIds):
        try:
            field_id, scope_id = request
        except TypeError:
            field_id, scope_id = request, NVML_POWER_SCOPE_GPU
        value.fieldId, value.scopeId = int(field_id), int(scope_id)
        value.timestamp = now_us
        value.latencyUsec = 0
        value.nvmlReturn = NVML_ERROR_NOT_SUPPORTED
        if value.fieldId == _ENERGY_FIELD and p.has_energy_counter:
            value.valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
            value.value.ullVal = _energy_counter_mj(m, i, s)
            value.nvmlReturn = NVML_SUCCESS
        elif value.fieldId in _POWER_FIELDS and value.scopeId == NVML_POWER_SCOPE_GPU:
            sensor = getattr(p.sensors, _POWER_FIELDS[value.fieldId])
            if sensor is not None:
                value.valueType = NVML_VALUE_TYPE_UNSIGNED_INT
                value.value.uiVal = _reading_mw(s, sensor)
                value.nvmlReturn = NVML_SUCCESS
    return values


# --- sim extensions -------------------------------------------------------------------------
def counter_period_s(m: Machine, i: int) -> float:
    """How often GPU ``i``'s energy counter updates: the machine's setting, else its profile's."""
    period = m.spec.energy_update_period_s
    return m.profiles[i].energy_counter_period_s if period is None else period


def _advance(m: Machine, i: int, s: dict[str, Any], duration_s: float, power: float) -> float:
    """Move a GPU's virtual time on by ``duration_s`` at ``power`` W; returns the energy in mJ.

    Advances the exact energy, the energy counter (its latest update), every power sensor's track
    and the die temperature. O(1) unless a counter or sensor update falls inside the interval.
    """
    p = m.profiles[i]
    t0, t1 = s["time_s"], s["time_s"] + duration_s
    e0 = s["energy_mj"]
    energy = power * duration_s * 1e3
    s["energy_mj"] = e0 + energy
    period = counter_period_s(m, i)
    if period > 0 and sensors.update_index(t1, period) > sensors.update_index(t0, period):
        tick = sensors.update_index(t1, period) * period
        s["counter_mj"] = s["energy_mj"] - power * (t1 - tick) * 1e3
    tracks = s.get(_TRACKS) or {}
    for key, sensor in sensors.tracked(p):
        track = tracks.get(key)
        if track is None:
            track = tracks[key] = sensors.open_track(sensor, t0, e0, s["power_w"])
        sensors.advance_track(track, sensor, t0, t1, e0, power)
    s[_TRACKS] = tracks  # reassigned: the store sees a changed key, not only a mutated value
    s["time_s"] = t1
    s["temperature_c"] = model.temperature_after(p, s["temperature_c"], power, duration_s)
    return energy


def stability_threshold(m: Machine, i: int, kernel_class: str, framework: str) -> int:
    """GPU ``i``'s ground-truth stability threshold in MHz for a kernel class and framework."""
    return model.stability_threshold_mhz(
        m.profiles[i],
        m.gpus[i].uuid,
        kernel_class,
        framework,
        device_index=i,
        planted=m.spec.planted,
        scenario=m.spec.scenario,
    )


def simDeviceRecordKernelCall(handle: SimHandle, work: KernelWork) -> SimCallResult:
    """Account one finished kernel call: time, energy, clocks, reasons, and its fault.

    Under a power cap the call runs as the cap controller's lag has it (``sensors.capped_call``):
    unthrottled, above the cap, for the filter's length after a load starts or the cap is
    lowered, then at the model's capped point; a call across that moment runs in two phases.
    The result's power, clock and fault are the call's last phase (where the board is now).
    The calling process holds the GPU from its first call on (``processes.py``).
    """
    m, i = gpu_of(handle)
    p = m.profiles[i]
    threshold = stability_threshold(m, i, work.kernel_class, work.framework)
    max_offset = model.max_stable_offset_mhz(p, m.gpus[i].uuid, work.kernel_class, device_index=i)

    def change(s: dict[str, Any]) -> SimCallResult:
        locked = s["locked_sm_mhz"]
        mem = s["locked_mem_mhz"]
        phases, s[_CAP_OVER] = sensors.capped_call(
            p,
            work,
            s.get(_CAP_OVER, 0.0),
            max_clock_mhz=None if locked is None else locked[1],
            mem_clock_mhz=None if mem is None else mem[1],
            power_limit_w=s["power_limit_w"],
            offset_mhz=int(s["offset_mhz"]),
            thermal_slowdown=s["temperature_c"] >= p.slowdown_temp_c,
            temperature_c=round(s["temperature_c"]),  # leakage follows the die (whole degrees)
        )
        energy = duration = 0.0
        for phase in phases:
            energy += _advance(m, i, s, phase.duration_s, phase.op.power_w)
            duration += phase.duration_s
        op = phases[-1].op  # where the call ended: the point NVML reports now
        s.update(
            power_w=op.power_w,
            sm_clock_mhz=op.sm_clock_mhz,
            mem_clock_mhz=op.mem_clock_mhz,
            reasons=int(op.reasons),
        )
        prob = model.fault_probability(
            p, op.sm_clock_mhz, threshold,
            offset_mhz=int(s["offset_mhz"]), max_stable_offset_mhz=max_offset,
        )
        fault = Fault.NONE
        if prob.any > 0:
            uniform = model.call_uniform(m.spec.seed, m.gpus[i].uuid, s["calls"])
            fault = model.draw_fault(prob, uniform)
        s["calls"] += 1
        processes.hold_once(s)  # a process that runs kernels on a GPU holds a context there
        power_mw = int(round(op.power_w * 1000))
        return SimCallResult(duration, energy, power_mw, op.sm_clock_mhz, fault)

    return m.update(i, change)


BUSY_CLASS = "busy"
"""The kernel class of a busy stretch (:func:`simDeviceRecordBusy`): its faults reach nothing."""


def busy_work(p: Any, seconds: float, mem_clock_mhz: float | None = None) -> KernelWork:
    """One memory-bound call that keeps board ``p`` (a ``GpuProfile``) busy for ``seconds`` at
    a memory clock (None: its highest): the memory roof at its achieved rate, no FLOPs, so its
    time does not depend on the SM clock while its power follows the clock as a memory-bound
    kernel's does."""
    mem = p.mem_max_mhz if mem_clock_mhz is None else mem_clock_mhz
    bandwidth = p.memory_bandwidth_gbs * 1e9 * (mem / p.mem_max_mhz) * p.achieved.memory
    moved = max(0.0, seconds - p.launch_overhead_s) * bandwidth
    return KernelWork(flops=0.0, bytes_moved=moved, peak="fp32", kernel_class=BUSY_CLASS,
                      launches=1, kind="elementwise")


def simDeviceRecordBusy(handle: SimHandle, seconds: float) -> SimCallResult:
    """Account ``seconds`` of work whose size nobody declared (a user's program that charged
    none) as one busy call (:func:`busy_work`); its fault is drawn as any call's and reaches
    nothing (the caller has no output to corrupt)."""
    if not seconds >= 0:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    m, i = gpu_of(handle)
    locked = m.read(i)["locked_mem_mhz"]
    work = busy_work(m.profiles[i], float(seconds), None if locked is None else locked[1])
    return simDeviceRecordKernelCall(handle, work)


def simDeviceIdle(handle: SimHandle, seconds: float) -> None:
    """Let the GPU sit idle for ``seconds`` of virtual time (at idle power and idle clocks)."""
    if not seconds >= 0:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)  # virtual time never runs backwards
    m, i = gpu_of(handle)
    p = m.profiles[i]

    def change(s: dict[str, Any]) -> None:
        _advance(m, i, s, float(seconds), p.idle_power_w)
        if _CAP_OVER in s:
            s[_CAP_OVER] = sensors.drained(s[_CAP_OVER], float(seconds))
        idle = int(ClockEventReason.GPU_IDLE)
        s.update(power_w=p.idle_power_w, sm_clock_mhz=p.f_min_mhz, reasons=idle)

    m.update(i, change)


def simDeviceGetTimeS(handle: SimHandle) -> float:
    """The GPU's virtual clock in seconds."""
    m, i = gpu_of(handle)
    return float(m.read(i)["time_s"])


def simDeviceGetEnergyMj(handle: SimHandle) -> float:
    """Sim only: ground truth, the exact energy since the machine began, in mJ (a float).

    No NVML reading returns this: the counter steps every ``counter_period_s`` and the power
    readings see only their windows. Tests compare meters against it.
    """
    m, i = gpu_of(handle)
    return float(m.read(i)["energy_mj"])

