"""What a device's energy and power readings do, observed: the energy counter's update period,
and each power reading's update period and how fast it follows a step in power.

The meter (``orchestrator/measuring/meter.py``) relies on these semantics: it aligns windows on
counter updates, and takes the instant reading for peaks. Boards differ (GA100's counter updates
every ~100 ms, Hopper's ``nvmlDeviceGetPowerUsage`` is a one-second average), so ``dvfs check``
observes them on each new board: it polls the readings while the GPU idles, while a kernel runs, and
right after the kernel stops (``after_load``: the step down shows which readings are instantaneous
and which are averages). Everything here only reads: a device's time passes by ``Phase.wait``
(a sleep on hardware; the simulated GPU's virtual clock, idle or with modelled calls).
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from orchestrator.devices.base import Device, KernelWork

SIM_LOAD_PRESET = "gpu"  # the size the simulated load models (as workload.sim_size)


@dataclass(frozen=True)
class Phase:
    """A state of the GPU while a section samples it, and how device time passes in it."""

    name: str  # "idle" or "load"
    wait: Callable[[float], None]  # let this many seconds of device time pass
    detail: str  # what the GPU is doing, for the summary
    alive: Callable[[], bool] = lambda: True  # False once a load has stopped early


def idle_phase(device: Device) -> Phase:
    """The GPU with nothing to do: waits sleep on hardware and advance the sim's clock."""
    return Phase("idle", device.idle, "nothing running")


@contextlib.contextmanager
def kernel_thread_load(kernel: object, ramp_s: float) -> Iterator[Phase]:
    """A built kernel called back to back in a thread of this process while the phase lasts (a
    real GPU: each call waits on the device, which releases the interpreter, so the readings can
    be polled meanwhile); ``ramp_s`` lets clocks and power reach the load's level first."""
    import threading
    import time

    stop = threading.Event()
    failed: list[BaseException] = []

    def loop() -> None:
        try:
            while not stop.is_set():
                kernel.call_device()  # type: ignore[attr-defined]
        except BaseException as e:  # noqa: BLE001 - reported by the phase's alive()
            failed.append(e)

    thread = threading.Thread(target=loop, name="dvfs-check-load", daemon=True)
    thread.start()
    try:
        time.sleep(ramp_s)
        yield Phase("load", time.sleep, f"{kernel} called back to back",
                    alive=lambda: thread.is_alive() and not failed)
    finally:
        stop.set()
        thread.join(timeout=60)


@contextlib.contextmanager
def simulated_load(device: Device, workload: str) -> Iterator[Phase]:
    """A kernel on the simulated GPU: each wait runs modelled calls back to back.

    The calls are modelled at the ``gpu`` preset, as a sweep's ``workload.sim_size`` does
    (milliseconds each: a tiny kernel would take thousands of state updates per simulated
    second).
    """
    from kernels import get_spec

    preset = SIM_LOAD_PRESET
    spec = get_spec(workload)
    counts = spec.counts(preset=preset, dtype="float32")
    work = KernelWork(
        flops=float(counts.flops), bytes_moved=float(counts.bytes_moved),
        peak=spec.peak("float32"), kernel_class=workload, framework="jax",
    )

    def wait(seconds: float) -> None:
        end_s = device.now_s() + seconds
        while device.now_s() < end_s:
            device.on_kernel_call(work)

    yield Phase("load", wait, f"simulated {workload} calls ({preset} preset), back to back")


# --- what the readings do ----------------------------------------------------------------
def interval_stats(values_s: list[float]) -> dict[str, float] | None:
    """Median, min and max of some intervals in s; None when there are none."""
    if not values_s:
        return None
    return {
        "median_s": statistics.median(values_s), "min_s": min(values_s), "max_s": max(values_s),
        "count": len(values_s),
    }


def measure_counter_period(device: Device, phase: Phase, duration_s: float, poll_s: float) -> dict:
    """Poll the energy counter every ``poll_s`` for ``duration_s`` and time its updates.

    Returns:
        ``updates`` (changes seen), ``interval_s`` (stats of the time between changes: the
        update period, resolved to one poll), ``polls``, ``mean_poll_s`` and ``counter_power_w``
        (energy between the first and last update over their time apart).
    """
    start_s = now_s = device.now_s()
    last_mj = device.energy_mj()
    changes: list[tuple[float, int]] = []
    polls = 0
    while now_s - start_s < duration_s:
        phase.wait(poll_s)
        energy_mj = device.energy_mj()
        now_s = device.now_s()
        polls += 1
        if energy_mj != last_mj:
            changes.append((now_s, energy_mj))
            last_mj = energy_mj
    intervals = [b[0] - a[0] for a, b in zip(changes, changes[1:])]
    power_w = None
    if len(changes) >= 2 and changes[-1][0] > changes[0][0]:
        power_w = (changes[-1][1] - changes[0][1]) / (changes[-1][0] - changes[0][0]) / 1000.0
    return {
        "phase": phase.name, "detail": phase.detail, "duration_s": now_s - start_s,
        "poll_s": poll_s, "polls": polls, "mean_poll_s": (now_s - start_s) / max(polls, 1),
        "updates": len(changes), "interval_s": interval_stats(intervals),
        "counter_power_w": power_w,
    }


def sample_power(
    device: Device, phase: Phase, duration_s: float, rate_hz: float, *, after_step: bool = False
) -> dict:
    """Sample every power reading at ``rate_hz`` for ``duration_s``; how each moves.

    Returns:
        Per reading (``usage``, ``instant``, ``average``): ``supported``, ``samples``, mean/min/max
        W, ``changes`` and ``update_interval_s`` (stats of the time between changes, resolved to
        one sample interval); with ``after_step`` (the power has just stepped, at the start),
        ``settle_s`` and ``semantics`` too (see ``settle_s``).
    """
    interval_s = 1.0 / rate_hz
    samples: dict[str, list[tuple[float, int]]] = {}
    start_s = now_s = device.now_s()
    next_s, count = start_s, 0
    while now_s - start_s < duration_s:
        readings = device.power_readings_mw()
        now_s = device.now_s()
        count += 1
        for key, value_mw in readings.items():
            samples.setdefault(key, [])
            if value_mw is not None:
                samples[key].append((now_s, value_mw))
        next_s += interval_s
        phase.wait(max(0.0, next_s - device.now_s()))
        now_s = device.now_s()
    return {
        "phase": phase.name, "detail": phase.detail, "duration_s": now_s - start_s,
        "rate_hz": rate_hz, "samples": count, "sample_interval_s": (now_s - start_s) / count,
        "readings": {
            key: _describe_series(series, start_s if after_step else None)
            for key, series in samples.items()
        },
    }


INSTANT_SETTLE_S = 0.3  # a reading that settles after a step faster than this is instantaneous


def settle_s(series: list[tuple[float, int]], start_s: float) -> float | None:
    """How long after ``start_s`` a reading came to stay within 10% of the step it made (from
    its first to its last value); None when it did not move by 5% of its first value."""
    if len(series) < 2:
        return None
    first, last = series[0][1], series[-1][1]
    if abs(first - last) < 0.05 * max(abs(first), 1):
        return None
    band = 0.1 * abs(first - last)
    settled_at = series[-1][0]
    for t_s, value in reversed(series):
        if abs(value - last) > band:
            break
        settled_at = t_s
    return settled_at - start_s


def _describe_series(series: list[tuple[float, int]], step_at_s: float | None = None) -> dict:
    """What one power reading did over a sampling run (values in mW in, W out); after a step
    at ``step_at_s``, also how long it took to settle and what that says it is."""
    if not series:
        return {"supported": False}
    watts = [v / 1000.0 for _, v in series]
    change_s = [t for (t, v), (_, prev) in zip(series[1:], series) if v != prev]
    described = {
        "supported": True, "samples": len(series), "mean_w": statistics.fmean(watts),
        "min_w": min(watts), "max_w": max(watts), "changes": len(change_s),
        "update_interval_s": interval_stats([b - a for a, b in zip(change_s, change_s[1:])]),
    }
    if step_at_s is not None:
        settled = settle_s(series, step_at_s)
        described["settle_s"] = settled
        described["semantics"] = (
            None if settled is None
            else "instant" if settled <= INSTANT_SETTLE_S else f"average (~{settled:.1f} s)"
        )
    return described
