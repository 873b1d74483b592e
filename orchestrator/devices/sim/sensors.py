"""What the simulated board's power sensing sees and does: NVML's readings, the power-cap lag.

Pure functions over plain lists (JSON-ready, kept in a GPU's state dict by ``telemetry.py``) and
the model's operating points. Virtual time in s, energy in mJ, power in W, clocks in MHz.

**Readings.** A ``PowerSensor(period_s, window_s)`` updates at every multiple ``u = n * period_s``
of the GPU's virtual clock, to the mean power over ``[u - window_s, u]``, and holds that value
until its next update (Yang et al., SC'24, "Part-time Power Measurements": ~25 ms windows every
100 ms on GA100 and for Hopper's instant field, a 1 s window every 100 ms for Hopper's
``nvmlDeviceGetPowerUsage``, 10 ms every 20 ms on Volta and Pascal). Between accounted intervals
(a kernel call's phase, an idle period) power is constant, so the GPU's cumulative energy
``E(t)`` is piecewise linear and a reading is exactly ``(E(u) - E(u - window_s)) / window_s``.

A *track* keeps what one sensor needs for that: ``[n, reading_w, pending]`` where ``n`` is the
index of its latest update, ``reading_w`` the value it updated to, and ``pending`` the energies
``E(m * period_s - window_s)`` at the starts of the windows already open, of the updates
``m = n + 1, n + 2, ...`` in turn (at most ``ceil(window_s / period_s)`` of them; a flat list,
which the state store writes fastest). Advancing a track over one interval of
constant power is O(1) when no update or window start falls inside it (most kernel calls), and
O(window_s / period_s) otherwise, however long the interval. A track opened on a GPU with a
history the sim did not record assumes the power before was what it is now.

**Power-cap lag.** The power-cap controller acts on power filtered over
``sensors.power_cap_filter_s`` (``F``: ~1 s on Hopper, ~100 ms on GA100). The sim models that as
a leaky integrator of *demand over the cap*: ``over_s`` in ``[0, F]`` grows with the time the
board runs a kernel whose unthrottled power (``model.operating_point`` without the cap) exceeds
the cap, and drains at the same rate while it does not (idle, a kernel under the cap). While
``over_s < F`` such a kernel runs unthrottled, above the cap; once ``over_s`` reaches ``F`` it runs
at the model's steady capped point (``model.operating_point`` with the cap), with
``SW_POWER_CAP``. So after a load starts, or the cap is lowered under a running load, from a board
that has been under the cap for at least ``F``, the board draws more than the cap for ``F`` and
then drops to exactly what the model says today. A call that straddles the moment is split in
two phases (its work done at each point in proportion to the time), so the lag does not depend
on how long the calls are.
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

from orchestrator.devices.base import ClockEventReason, KernelWork
from orchestrator.devices.sim import model
from orchestrator.devices.sim.profile import GpuProfile, PowerSensor, Sensors

_EPS = 1e-9  # in update periods: an instant this close to an update counts as at it


def update_index(t_s: float, period_s: float) -> int:
    """The index of the latest update at or before ``t_s`` (updates at ``n * period_s``)."""
    return math.floor(t_s / period_s + _EPS)


def sensor_key(sensor: PowerSensor) -> str:
    """The name of a sensor's track in the state dict (``"<period_s>/<window_s>"``)."""
    return f"{sensor.period_s!r}/{sensor.window_s!r}"


def distinct_sensors(sensors: Sensors) -> tuple[PowerSensor, ...]:
    """The different sensors behind a board's readings (usage, instant, average), once each."""
    found: list[PowerSensor] = []
    for sensor in (sensors.power_usage, sensors.power_instant, sensors.power_average):
        if sensor is not None and sensor not in found:
            found.append(sensor)
    return tuple(found)


@functools.lru_cache(maxsize=64)
def tracked(profile: GpuProfile) -> tuple[tuple[str, PowerSensor], ...]:
    """``(sensor_key, sensor)`` of every distinct sensor of a board (cached per profile: called
    on every accounted interval, and a profile hashes by its key alone)."""
    return tuple((sensor_key(s), s) for s in distinct_sensors(profile.sensors))


def open_track(sensor: PowerSensor, t_s: float, energy_mj: float, power_w: float) -> list[Any]:
    """A track at ``t_s`` (cumulative energy ``energy_mj``), the power before it ``power_w``."""
    p, w = sensor.period_s, sensor.window_s
    n = update_index(t_s, p)
    pending = [
        energy_mj - power_w * (t_s - (m * p - w)) * 1e3
        for m in range(n + 1, update_index(t_s + w, p) + 1)
    ]
    return [n, float(power_w), pending]


def advance_track(
    track: list[Any], sensor: PowerSensor, t0_s: float, t1_s: float, e0_mj: float, power_w: float
) -> None:
    """Move a track from ``t0_s`` (energy ``e0_mj``) to ``t1_s`` at a constant ``power_w``."""
    p, w = sensor.period_s, sensor.window_s
    n, pending = track[0], track[2]
    known = n + len(pending)  # the last update whose window's start is recorded
    n_new = update_index(t1_s, p)
    m_hi = update_index(t1_s + w, p)  # the last update whose window has opened by t1
    if n_new <= n and m_hi <= known:
        return  # nothing happens inside this interval (most kernel calls)
    rate = power_w * 1e3  # mJ/s
    if n_new > n:
        k = n_new - n - 1
        if k < len(pending):
            e_start = pending[k]
        else:  # the window opened inside this interval
            e_start = e0_mj + rate * (n_new * p - w - t0_s)
        e_end = e0_mj + rate * (n_new * p - t0_s)
        track[0], track[1] = n_new, (e_end - e_start) / w / 1e3
        pending = pending[k + 1:]
        known = max(known, n_new)
    pending.extend(e0_mj + rate * (m * p - w - t0_s) for m in range(known + 1, m_hi + 1))
    track[2] = pending


def track_reading_w(track: list[Any]) -> float:
    """The value a track's sensor reads now (its latest update's window mean), in W."""
    return float(track[1])


# --- the power-cap controller's filter -----------------------------------------------------------
class Phase(NamedTuple):
    """Part of one kernel call at one operating point (``duration_s`` of it)."""

    op: model.OperatingPoint
    duration_s: float


_SW_POWER_CAP = int(ClockEventReason.SW_POWER_CAP)  # an int: IntFlag arithmetic costs ~1 us


def capped_call(
    profile: GpuProfile,
    work: KernelWork,
    over_s: float,
    *,
    max_clock_mhz: int | None,
    mem_clock_mhz: int | None,
    power_limit_w: float,
    offset_mhz: int,
    thermal_slowdown: bool,
    temperature_c: int | None = None,
) -> tuple[list[Phase], float]:
    """The phases one call runs in under the power-cap controller's lag, and ``over_s`` after.

    ``over_s`` is the controller's integrator before the call (see the module docstring). The
    steady state (``over_s`` at the filter length) is ``model.operating_point`` with the cap.
    """
    settings = dict(
        max_clock_mhz=max_clock_mhz,
        mem_clock_mhz=mem_clock_mhz,
        offset_mhz=offset_mhz,
        thermal_slowdown=thermal_slowdown,
        temperature_c=temperature_c,
    )
    capped = model.operating_point(profile, work, power_limit_w=power_limit_w, **settings)
    filter_s = profile.sensors.power_cap_filter_s
    if filter_s <= 0:
        return [Phase(capped, capped.duration_s)], 0.0
    if not int(capped.reasons) & _SW_POWER_CAP:  # the cap does not bite this kernel
        return [Phase(capped, capped.duration_s)], max(0.0, over_s - capped.duration_s)
    if over_s >= filter_s:
        return [Phase(capped, capped.duration_s)], filter_s
    free = model.operating_point(profile, work, power_limit_w=None, **settings)
    lag_s = filter_s - over_s
    if free.duration_s <= lag_s:
        return [Phase(free, free.duration_s)], over_s + free.duration_s
    rest = (1.0 - lag_s / free.duration_s) * capped.duration_s  # the work left, at the capped point
    return [Phase(free, lag_s), Phase(capped, rest)], filter_s


def drained(over_s: float, idle_s: float) -> float:
    """The controller's integrator after ``idle_s`` under the cap."""
    return max(0.0, over_s - idle_s)
