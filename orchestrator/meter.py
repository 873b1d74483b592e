"""Energy over a measurement window.

Three ways to get joules, chosen per device (``measure.meter=auto`` picks the first that exists):

- ``counter``: the device's cumulative energy counter (NVML: mJ since driver load, Volta and
  newer; RAPL on a CPU) read at the start and the end of the window. The counter moves in steps,
  one every update period (about 100 ms on Ampere and Hopper), so a window read at arbitrary
  instants is off by up to one step at each end. The window therefore starts right after an update
  and ends on one (:meth:`EnergyMeter.counter_updates` tells the caller when the counter has
  moved; the trial keeps the kernel running while it waits, so the device is in the same steady
  state at both edges). Then the energy between the two readings is the energy between the two
  edges, with no quantisation left. Updates are counted (a window must span several, or it is
  flagged) and their times kept, so each row records the update period it observed. The counter
  is an unsigned 64-bit value; a reading below the previous one is a wrap-around and is unwrapped.
- ``polling``: power sampled at ``poll_hz`` and integrated over time. Each sample stands for the
  interval since the previous one (NVML's power reading is an average over the recent past, the
  simulated GPU's is the power of the last kernel call), so energy is
  ``sum(p_i * (t_i - t_{i-1}))``.
- ``none``: a device with neither (a CPU whose RAPL counter cannot be read): the window measures
  time only, and the device's ``energy_note`` says why there are no joules.

Time is the device's own (``Device.now_s``): wall time on hardware, the virtual clock on the sim.
On the sim, whose clock moves only with kernel calls, the trial calls ``tick()`` after each call;
on hardware a background thread reads the counter every ``COUNTER_WATCH_S`` and samples power at
``poll_hz``, and ``tick()`` costs nothing, so the loop that dispatches kernels does no host work
for the meter.
"""

from __future__ import annotations

import statistics
import threading
from dataclasses import dataclass, field
from typing import Literal

from orchestrator.devices.base import ClockEventReason, Device

MeterMethod = Literal["counter", "polling", "none"]
COUNTER_MODULUS_MJ = 2**64
COUNTER_WATCH_S = 0.002  # how often the background thread reads the energy counter (hardware)


@dataclass
class Sample:
    """One reading during a window."""

    t_s: float  # device time
    power_mw: int | None  # None: the device has no power sensor
    energy_mj: int | None
    sm_clock_mhz: int
    reasons: int  # ClockEventReason bits


@dataclass
class Measurement:
    """What one window measured."""

    time_s: float  # window length in device time
    energy_j: float | None  # None: the device measures no energy (method "none")
    avg_power_w: float | None
    peak_power_w: float | None  # None: no power sensor
    method: MeterMethod
    samples: list[Sample] = field(default_factory=list)
    counter_updates: int | None = None  # times the energy counter changed during the window
    counter_period_s: float | None = None  # median interval between the updates observed

    @property
    def mean_sm_clock_mhz(self) -> float | None:
        """Mean SM clock over the samples taken while the kernel ran."""
        clocks = [s.sm_clock_mhz for s in self.samples[1:] or self.samples]
        return sum(clocks) / len(clocks) if clocks else None

    @property
    def reasons(self) -> ClockEventReason:
        """Every clock-event reason seen during the window."""
        bits = 0
        for s in self.samples[1:] or self.samples:
            bits |= s.reasons
        return ClockEventReason(bits)


def choose_method(device: Device, method: str) -> MeterMethod:
    """The meter a device supports for ``measure.meter`` (``auto``: counter, else polling, else
    none); a method the device lacks is a one-line UserError."""
    from orchestrator.errors import UserError

    caps = device.capabilities()
    name = device.identity.name
    if method == "auto":
        if caps.has_energy_counter:
            return "counter"
        return "polling" if caps.has_power_sensor else "none"
    if method == "counter" and not caps.has_energy_counter:
        why = caps.energy_note or "pre-Volta"
        raise UserError(f"measure.meter=counter: {name} has no energy counter ({why}); use auto")
    if method == "polling" and not caps.has_power_sensor:
        raise UserError(f"measure.meter=polling: {name} has no power sensor; use auto")
    if method not in ("counter", "polling"):
        raise UserError(f"measure.meter={method!r} is not one of: auto, counter, polling")
    return method  # type: ignore[return-value]


class EnergyMeter:
    """Measures one window on one device.

    ``arm()`` begins watching the counter, ``counter_updates()`` says how often it has moved
    (so the caller can start on an edge and end on one), ``start()`` opens the window, ``tick()``
    follows each kernel call, ``stop()`` closes the window and returns the :class:`Measurement`.
    """

    def __init__(self, device: Device, *, method: str = "auto", poll_hz: float = 20.0) -> None:
        self.device = device
        self.method: MeterMethod = choose_method(device, method)
        self.period_s = 1.0 / poll_hz
        self._has_power = device.capabilities().has_power_sensor
        self._samples: list[Sample] = []
        self._lock = threading.Lock()
        self._next_t = 0.0
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._background = device.identity.backend != "sim"
        self._last_energy: int | None = None
        self._updates = 0
        self._updates_at_start = 0
        self._edges_s: list[float] = []
        self._open = False
        self._armed = False

    def _read(self, *, time_last: bool = False) -> Sample:
        """Read every sensor. The time is read first (closing a window: the reads fall after it)
        or last (opening one: they fall before it), so no sensor query lands inside a window."""
        d = self.device
        t_s = None if time_last else d.now_s()
        sample = Sample(
            t_s=0.0,
            power_mw=d.power_mw() if self._has_power else None,
            energy_mj=d.energy_mj() if self.method == "counter" else None,
            sm_clock_mhz=d.sm_clock_mhz(),
            reasons=int(d.clock_event_reasons()),
        )
        sample.t_s = d.now_s() if t_s is None else t_s
        return sample

    # --- watching the counter ----------------------------------------------------------------
    def arm(self) -> None:
        """Begin watching the energy counter (and, on hardware, start the background reader)."""
        if self.method == "counter":
            self._last_energy = self.device.energy_mj()
        self._updates = 0
        self._edges_s = []
        self._armed = True
        if self._background and self.method != "none":
            self._stop.clear()
            self._thread = threading.Thread(target=self._poll, name="dvfs-meter", daemon=True)
            self._thread.start()

    def counter_updates(self) -> int:
        """Updates of the energy counter seen since ``arm()`` (read now; 0 without a counter)."""
        if self.method == "counter":
            self._watch_counter()
        return self._updates

    def _watch_counter(self) -> None:
        value = self.device.energy_mj()
        with self._lock:
            if value != self._last_energy:
                self._updates += 1
                self._last_energy = value
                self._edges_s.append(self.device.now_s())

    # --- the window ----------------------------------------------------------------------------
    def start(self) -> None:
        """Open the window now (the caller has synchronised the framework)."""
        if not self._armed:
            self.arm()
        first = self._read(time_last=True)
        with self._lock:
            if self.method == "counter":
                if first.energy_mj != self._last_energy:  # moved since the caller last looked
                    self._updates += 1
                    self._edges_s.append(first.t_s)
                self._last_energy = first.energy_mj
            self._samples = [first]
            self._updates_at_start = self._updates
            self._next_t = first.t_s + self.period_s
        self._open = True

    def tick(self) -> None:
        """After a kernel call on the sim: watch the counter, sample at ``poll_hz``. On hardware
        the background thread does both and this returns at once."""
        if self._background or not self._open:
            return
        if self.method == "counter":
            self._watch_counter()
        if self.method != "none" and self.device.now_s() >= self._next_t:
            self._take()

    def _take(self) -> None:
        sample = self._read()
        with self._lock:
            self._samples.append(sample)
            while self._next_t <= sample.t_s:
                self._next_t += self.period_s

    def _poll(self) -> None:
        watch_s = COUNTER_WATCH_S if self.method == "counter" else 0.01

        def wait_s() -> float:
            if not self._open:
                return watch_s
            return min(watch_s, max(0.0, self._next_t - self.device.now_s()))

        while not self._stop.wait(wait_s()):
            if self.method == "counter":
                self._watch_counter()
            if self._open and self.device.now_s() >= self._next_t:
                self._take()

    def close(self) -> None:
        """Stop the background reader (``stop()`` does this too; safe to call twice)."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        self._armed = False

    def stop(self) -> Measurement:
        """Take the last reading and compute the window's energy and power."""
        self.close()
        if self.method == "counter":
            self._watch_counter()
        self._take()
        self._open = False
        samples = list(self._samples)
        t0, t1 = samples[0].t_s, samples[-1].t_s
        duration = max(t1 - t0, 0.0)
        powers = [s.power_mw / 1000.0 for s in samples[1:] or samples[:1] if s.power_mw is not None]
        energy_j: float | None
        updates = period = None
        if self.method == "counter":
            start, end = samples[0].energy_mj, samples[-1].energy_mj
            assert start is not None and end is not None
            energy_j = ((end - start) % COUNTER_MODULUS_MJ) / 1000.0
            updates = self._updates - self._updates_at_start
            gaps = [b - a for a, b in zip(self._edges_s, self._edges_s[1:])]
            period = statistics.median(gaps) if gaps else None
        elif self.method == "polling":
            energy_j = sum(
                (b.power_mw or 0) / 1000.0 * (b.t_s - a.t_s) for a, b in zip(samples, samples[1:])
            )
        else:
            energy_j = None
        return Measurement(
            time_s=duration,
            energy_j=energy_j,
            avg_power_w=None if energy_j is None else energy_j / duration if duration > 0 else 0.0,
            peak_power_w=max(powers) if powers else None,
            method=self.method,
            samples=samples,
            counter_updates=updates,
            counter_period_s=period,
        )
