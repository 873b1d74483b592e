"""A trial's thermal start: measure as the board comes, warm it until its temperature holds, or
let it cool first.

Leakage power rises with the die's temperature (on the simulated GPU it doubles every 40 C), so a
window's energy depends on what ran before it: a trial that follows a hot one starts hot, one
that follows an idle pause starts cool, and back-to-back trials of a sweep bias each other by the
order they run in. Every row records the temperature at its window's start and end
(``temperature_start_c``, ``temperature_c``), so the bias is visible; ``measure.steady_start``
removes it, at a cost:

- ``none`` (the default): measure as the board comes. A steady start costs up to a board's
  thermal time constant (tens of seconds on a real GPU) per trial, an order of magnitude more
  than a 1 s window, and a sweep should cost its windows; the rows' temperatures say how far each
  window was from steady.
- ``drift``: run the kernel until the die's temperature has moved by at most
  ``measure.steady_drift_c`` over the last ``measure.steady_interval_s`` of load (NVML reports
  whole degrees, so the drift is judged over an interval, not between two readings): each window
  then measures what sustained work at the setting costs, as a long training run sees it.
- ``cooldown``: idle until the die is at or below ``measure.cooldown_c`` (Zeus's profiler does
  this between its measurements): every window starts from the same cool state, as a job that
  starts on an idle GPU does.

Both waits are bounded by ``measure.steady_timeout_s``; a trial that reached it is measured all
the same and its row says so (``steady_note``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchestrator.config import MeasureConfig
from orchestrator.devices.base import Device

if TYPE_CHECKING:
    from orchestrator.measuring.window import KernelCalls

COOLDOWN_STEP_S = 1.0  # idle in steps of this long between two temperature readings
DRIFT_CHUNK = 8  # kernel calls between two looks at the clock while warming


def steady_start(device: Device, calls: KernelCalls, m: MeasureConfig) -> str | None:
    """Bring the die to the thermal start ``m.steady_start`` asks for (``m``: the measure
    config; ``calls``: the kernel's :class:`~orchestrator.measuring.window.KernelCalls`).

    Returns:
        None when it got there; else why not, for the row's ``steady_note``.
    """
    if m.steady_start == "drift":
        return _warm_until_steady(device, calls, m.steady_drift_c, m.steady_interval_s,
                                  m.steady_timeout_s)
    if m.steady_start == "cooldown":
        return _cool_down(device, m.cooldown_c, m.steady_timeout_s)
    return None


def _warm_until_steady(device: Device, calls: KernelCalls, drift_c: float, interval_s: float,
                       timeout_s: float) -> str | None:
    """Run the kernel until the temperature moved at most ``drift_c`` over ``interval_s``."""
    start = device.now_s()
    readings = [(start, device.temperature_c())]  # (device time, whole degrees)
    while True:
        calls.run(DRIFT_CHUNK)
        now = device.now_s()
        readings.append((now, device.temperature_c()))
        past = [t for when, t in readings if when <= now - interval_s]
        if past and abs(readings[-1][1] - past[-1]) <= drift_c:
            return None
        if now - start >= timeout_s:
            return (f"not steady: {readings[0][1]} C to {readings[-1][1]} C in {now - start:.0f} s"
                    f" of load, still drifting (measure.steady_timeout_s={timeout_s:g})")
        readings = [r for r in readings if r[0] >= now - 2 * interval_s]


def _cool_down(device: Device, target_c: float, timeout_s: float) -> str | None:
    """Idle until the temperature is at or below ``target_c``."""
    start = device.now_s()
    while device.temperature_c() > target_c:
        if device.now_s() - start >= timeout_s:
            return (f"not cooled: {device.temperature_c()} C after {timeout_s:g} s idle, above "
                    f"measure.cooldown_c={target_c:g}")
        device.idle(COOLDOWN_STEP_S)
    return None
