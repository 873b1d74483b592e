"""Energy over a measurement window.

Two ways to get joules, chosen per device:

- ``counter``: the device's cumulative energy counter (NVML: mJ since driver load, Volta and
  newer) read at the start and the end of the window. Exact up to the counter's update period
  (~20-100 ms on real GPUs), so a window must span many updates; the count of updates seen is
  recorded for the validity verdict. The counter is an unsigned 64-bit mJ value; a reading below
  the previous one is a wrap-around and is unwrapped.
- ``polling``: power sampled at ``poll_hz`` and integrated over time. Each sample stands for the
  interval since the previous one (NVML's power reading is an average over the recent past, the
  simulated GPU's is the power of the last kernel call), so energy is ``sum(p_i * (t_i - t_{i-1}))``.

Time is the device's own (``Device.now_s``): wall time on hardware, the virtual clock on the sim.
Samples are taken by ``tick()``, which the trial calls after every kernel call and which samples
when the device's clock has passed the next sampling instant; on real hardware a background
thread also ticks, so a long kernel call does not starve the sampler.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from orchestrator.devices.base import ClockEventReason, Device

COUNTER_MODULUS_MJ = 2**64
COUNTER_WATCH_S = 0.005  # how often the background thread reads the energy counter (real GPUs)


@dataclass
class Sample:
    """One reading during a window."""

    t_s: float  # device time
    power_mw: int
    energy_mj: int | None
    sm_clock_mhz: int
    reasons: int  # ClockEventReason bits


@dataclass
class Measurement:
    """What one window measured."""

    time_s: float  # window length in device time
    energy_j: float
    avg_power_w: float
    peak_power_w: float
    method: str  # "counter" or "polling"
    samples: list[Sample] = field(default_factory=list)
    counter_updates: int | None = None  # times the energy counter changed during the window

    @property
    def mean_sm_clock_mhz(self) -> float | None:
        """Mean SM clock over the samples taken while the kernel ran."""
        clocks = [s.sm_clock_mhz for s in self.samples[1:]] or [s.sm_clock_mhz for s in self.samples]
        return sum(clocks) / len(clocks) if clocks else None

    @property
    def reasons(self) -> ClockEventReason:
        """Every clock-event reason seen during the window."""
        bits = 0
        for s in self.samples[1:] or self.samples:
            bits |= s.reasons
        return ClockEventReason(bits)


class EnergyMeter:
    """Measures one window on one device: ``start()``, ``tick()`` after each call, ``stop()``."""

    def __init__(self, device: Device, *, method: str = "auto", poll_hz: float = 20.0) -> None:
        caps = device.capabilities()
        if method == "auto":
            method = "counter" if caps.has_energy_counter else "polling"
        if method == "counter" and not caps.has_energy_counter:
            from orchestrator.errors import UserError

            raise UserError(
                f"measure.meter=counter: {device.identity.name} has no energy counter "
                f"(pre-Volta); use measure.meter=polling or auto"
            )
        self.device = device
        self.method = method
        self.period_s = 1.0 / poll_hz
        self._samples: list[Sample] = []
        self._lock = threading.Lock()
        self._next_t = 0.0
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._background = device.identity.backend == "nvml"
        self._last_energy: int | None = None
        self._updates = 0

    def _read(self) -> Sample:
        d = self.device
        energy = d.energy_mj() if self.method == "counter" else None
        return Sample(
            t_s=d.now_s(),
            power_mw=d.power_mw(),
            energy_mj=energy,
            sm_clock_mhz=d.sm_clock_mhz(),
            reasons=int(d.clock_event_reasons()),
        )

    def start(self) -> None:
        """Take the first reading (the caller has synchronised the framework)."""
        first = self._read()
        self._samples = [first]
        self._last_energy = first.energy_mj
        self._updates = 0
        self._next_t = first.t_s + self.period_s
        if self._background:
            self._stop.clear()
            self._thread = threading.Thread(target=self._poll, name="dvfs-power-poll", daemon=True)
            self._thread.start()

    def tick(self) -> None:
        """Watch the energy counter, and sample if the clock has passed the next sampling instant.

        The counter is read on every tick (cheap) so that the count of its updates is exact
        however slowly power is sampled; a sample of every sensor is taken at ``poll_hz``.
        """
        if self.method == "counter":
            self._watch_counter()
        if self.device.now_s() >= self._next_t:
            self._take()

    def _watch_counter(self) -> None:
        value = self.device.energy_mj()
        with self._lock:
            if value != self._last_energy:
                self._updates += 1
                self._last_energy = value

    def _take(self) -> None:
        sample = self._read()
        with self._lock:
            self._samples.append(sample)
            while self._next_t <= sample.t_s:
                self._next_t += self.period_s

    def _poll(self) -> None:
        watch_s = COUNTER_WATCH_S if self.method == "counter" else float("inf")
        while not self._stop.wait(min(watch_s, max(0.0, self._next_t - self.device.now_s()))):
            if self.method == "counter":
                self._watch_counter()
            if self.device.now_s() >= self._next_t:
                self._take()

    def stop(self) -> Measurement:
        """Take the last reading and compute the window's energy and power."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        if self.method == "counter":
            self._watch_counter()
        self._take()
        samples = list(self._samples)
        t0, t1 = samples[0].t_s, samples[-1].t_s
        duration = max(t1 - t0, 0.0)
        powers = [s.power_mw / 1000.0 for s in samples[1:]] or [samples[0].power_mw / 1000.0]
        if self.method == "counter":
            start, end = samples[0].energy_mj, samples[-1].energy_mj
            assert start is not None and end is not None
            energy_j = ((end - start) % COUNTER_MODULUS_MJ) / 1000.0
            updates = self._updates
        else:
            energy_j = sum(
                b.power_mw / 1000.0 * (b.t_s - a.t_s) for a, b in zip(samples, samples[1:])
            )
            updates = None
        return Measurement(
            time_s=duration,
            energy_j=energy_j,
            avg_power_w=energy_j / duration if duration > 0 else 0.0,
            peak_power_w=max(powers),
            method=self.method,
            samples=samples,
            counter_updates=updates,
        )

