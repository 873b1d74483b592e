"""The simulated GPU's sensors and its accounting of kernel calls (NVML's telemetry calls).

Power and energy readings (``nvmlDeviceGetTotalEnergyConsumption``, ``nvmlDeviceGetPowerUsage``,
``nvmlDeviceGetFieldValues``) and the sim's extensions that move a GPU's virtual time on: an
accounted kernel call (``simDeviceRecordKernelCall``), idle time (``simDeviceIdle``) and the
virtual clock (``simDeviceGetTimeS``). ``nvml.py`` re-exports every public name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pynvml as _real

from orchestrator.devices.base import ClockEventReason, Fault, KernelWork
from orchestrator.devices.sim import model
from orchestrator.devices.sim.driver import SimHandle, _gpu
from orchestrator.devices.sim.state import Machine

NVMLError = _real.NVMLError
NVML_ERROR_INVALID_ARGUMENT = _real.NVML_ERROR_INVALID_ARGUMENT
NVML_ERROR_NOT_SUPPORTED = _real.NVML_ERROR_NOT_SUPPORTED
NVML_SUCCESS = _real.NVML_SUCCESS
NVML_POWER_SCOPE_GPU = _real.NVML_POWER_SCOPE_GPU
NVML_VALUE_TYPE_UNSIGNED_INT = _real.NVML_VALUE_TYPE_UNSIGNED_INT
c_nvmlFieldValue_t = _real.c_nvmlFieldValue_t


@dataclass(frozen=True)
class SimCallResult:
    """What one accounted kernel call did on the simulated GPU."""

    duration_s: float
    energy_mj: float
    power_mw: int
    sm_clock_mhz: int
    fault: Fault

# --- telemetry --------------------------------------------------------------------------------
def nvmlDeviceGetTotalEnergyConsumption(handle: SimHandle) -> int:
    m, i = _gpu(handle)
    if not m.profiles[i].has_energy_counter:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    s = m.read(i)
    value = s["counter_mj"] if counter_period_s(m, i) > 0 else s["energy_mj"]
    return int(value)


def nvmlDeviceGetPowerUsage(handle: SimHandle) -> int:
    m, i = _gpu(handle)
    return int(round(m.read(i)["power_w"] * 1000))


# The field values the sim answers: NVML's power fields, in mW, at GPU scope.
_POWER_FIELD_IDS = frozenset({_real.NVML_FI_DEV_POWER_INSTANT, _real.NVML_FI_DEV_POWER_AVERAGE})


def nvmlDeviceGetFieldValues(handle: SimHandle, fieldIds: list[Any]) -> Any:
    """Field values as pynvml returns them: a ``c_nvmlFieldValue_t`` array, one per request.

    Each request is a field id, or a ``(fieldId, scopeId)`` pair as pynvml accepts. The sim knows
    ``NVML_FI_DEV_POWER_INSTANT`` and ``NVML_FI_DEV_POWER_AVERAGE`` at GPU scope
    (``NVML_POWER_SCOPE_GPU``): both hold the current modelled power in mW as an unsigned int.
    The average is the instant value for now: the board's one-second average is left to the
    issue that models it (a real GA100 answers NOT_SUPPORTED for the average). Any other field
    or scope gets ``NVML_ERROR_NOT_SUPPORTED`` in its own ``nvmlReturn``, as NVML reports a
    field the GPU does not offer; the call itself fails only as every call does (before
    ``nvmlInit``, a bad handle, a lost GPU). ``timestamp`` is the GPU's virtual clock in
    microseconds (NVML's is the host's wall clock), ``latencyUsec`` is 0.
    """
    m, i = _gpu(handle)
    s = m.read(i)
    values = (c_nvmlFieldValue_t * len(fieldIds))()
    for value, request in zip(values, fieldIds):
        try:
            field_id, scope_id = request
        except TypeError:
            field_id, scope_id = request, NVML_POWER_SCOPE_GPU
        value.fieldId, value.scopeId = int(field_id), int(scope_id)
        value.timestamp = int(round(float(s["time_s"]) * 1e6))
        value.latencyUsec = 0
        if value.fieldId in _POWER_FIELD_IDS and value.scopeId == NVML_POWER_SCOPE_GPU:
            value.valueType = NVML_VALUE_TYPE_UNSIGNED_INT
            value.value.uiVal = int(round(s["power_w"] * 1000))
            value.nvmlReturn = NVML_SUCCESS
        else:
            value.nvmlReturn = NVML_ERROR_NOT_SUPPORTED
    return values




# --- sim extensions -------------------------------------------------------------------------
def counter_period_s(m: Machine, i: int) -> float:
    """How often GPU ``i``'s energy counter updates: the machine's setting, else its profile's."""
    period = m.spec.energy_update_period_s
    return m.profiles[i].energy_counter_period_s if period is None else period


def _advance(m: Machine, i: int, s: dict[str, Any], duration_s: float, power: float) -> float:
    """Move a GPU's virtual time on by ``duration_s`` at ``power`` W; returns the energy in mJ."""
    p = m.profiles[i]
    t0, t1 = s["time_s"], s["time_s"] + duration_s
    energy = power * duration_s * 1e3
    s["energy_mj"] += energy
    period = counter_period_s(m, i)
    if period > 0 and math.floor(t1 / period) > math.floor(t0 / period):
        tick = math.floor(t1 / period) * period
        s["counter_mj"] = s["energy_mj"] - power * (t1 - tick) * 1e3
    s["time_s"] = t1
    s["temperature_c"] = model.temperature_after(p, s["temperature_c"], power, duration_s)
    return energy


def _threshold(m: Machine, i: int, kernel_class: str, framework: str) -> int:
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
    """Account one finished kernel call: time, energy, clocks, reasons, and its fault."""
    m, i = _gpu(handle)
    p = m.profiles[i]
    threshold = _threshold(m, i, work.kernel_class, work.framework)
    max_offset = model.max_stable_offset_mhz(p, m.gpus[i].uuid, work.kernel_class, device_index=i)

    def change(s: dict[str, Any]) -> SimCallResult:
        locked = s["locked_sm_mhz"]
        mem = s["locked_mem_mhz"]
        op = model.operating_point(
            p,
            work,
            max_clock_mhz=None if locked is None else locked[1],
            mem_clock_mhz=None if mem is None else mem[1],
            power_limit_w=s["power_limit_w"],
            offset_mhz=int(s["offset_mhz"]),
            thermal_slowdown=s["temperature_c"] >= p.slowdown_temp_c,
        )
        energy = _advance(m, i, s, op.duration_s, op.power_w)
        s.update(power_w=op.power_w, sm_clock_mhz=op.sm_clock_mhz, mem_clock_mhz=op.mem_clock_mhz, reasons=int(op.reasons))
        prob = model.fault_probability(p, op.sm_clock_mhz, threshold, offset_mhz=int(s["offset_mhz"]), max_stable_offset_mhz=max_offset)
        fault = Fault.NONE
        if prob.any > 0:
            fault = model.draw_fault(prob, model.call_uniform(m.spec.seed, m.gpus[i].uuid, s["calls"]))
        s["calls"] += 1
        return SimCallResult(op.duration_s, energy, int(round(op.power_w * 1000)), op.sm_clock_mhz, fault)

    return m.update(i, change)


def simDeviceIdle(handle: SimHandle, seconds: float) -> None:
    """Let the GPU sit idle for ``seconds`` of virtual time (at idle power and idle clocks)."""
    if not seconds >= 0:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)  # virtual time never runs backwards
    m, i = _gpu(handle)
    p = m.profiles[i]

    def change(s: dict[str, Any]) -> None:
        _advance(m, i, s, float(seconds), p.idle_power_w)
        s.update(power_w=p.idle_power_w, sm_clock_mhz=p.f_min_mhz, reasons=int(ClockEventReason.GPU_IDLE))

    m.update(i, change)


def simDeviceGetTimeS(handle: SimHandle) -> float:
    """The GPU's virtual clock in seconds."""
    m, i = _gpu(handle)
    return float(m.read(i)["time_s"])

