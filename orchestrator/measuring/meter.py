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
- ``polling``: the device's *instantaneous* power reading sampled at ``poll_hz`` and integrated
  over time. NVML's readings are not the power of the moment (``Device.capabilities()``'s
  ``power_sensing``): the instant one updates every ``period_s`` (100 ms on A100 and H100, 20 ms
  on V100) to the mean power over a short window before the update (~25 ms; 10 ms on V100), so
  only about a quarter of an A100's or H100's runtime is sampled at all (Yang et al., SC'24).
  The meter polls the instant field where the driver offers it (Hopper, Ampere and newer) and
  ``nvmlDeviceGetPowerUsage`` only where that is itself instant (GA100 and older); where the
  only reading is a one-second average (a Hopper-class GPU whose driver lacks the instant field)
  it refuses to poll, since integrating it would smear every change of power over a second.
  Energy is the integral of a step reconstruction: a new value seen at ``t_j`` (the previous
  sample at ``t_{j-1}``) is taken to have begun at ``(t_{j-1} + t_j) / 2 - age_s``, where
  ``age_s = (period_s + window_s) / 2`` is how far a reading lags the power it reports on
  average; it holds until the next new value. Equal consecutive values are one step, however
  many updates they span. The meter polls at ``poll_hz`` or ``POLLS_PER_UPDATE`` times per
  update of the reading, whichever is faster (a slower poll adds up to half its interval to
  where a change is placed). The error left is the sampling's own: a change of power between
  two windows is placed to within about half the gap between them (~37 ms on A100 and H100)
  plus half a poll interval; on the sim a 0.5 s idle, 1.5 s load window comes within 2.2%
  (``tests/orchestrator/test_meter_sensors.py``; ``docs/simulator.md`` has the figures).
- ``none``: a device with neither (a CPU whose RAPL counter cannot be read): the window measures
  time only, and the device's ``energy_note`` says why there are no joules.

Time is the device's own (``Device.now_s``): wall time on hardware, the virtual clock on the sim.
On the sim, whose clock moves only with kernel calls, the trial calls ``tick()`` after each call;
on hardware a background thread reads the counter every ``COUNTER_WATCH_S`` and samples power at
``poll_hz``, and ``tick()`` and ``counter_updates()`` cost nothing (the latter returns what the
thread has seen), so the loop that dispatches kernels, edge waits included, reads no sensor. An
NVML read is not free: on one H200 in a VM each took ~5 ms (the GPU check, now ``dvfs check``:
482 energy reads in 2.5 s), during which a GPU whose host waits for it runs nothing. The window
closes at the time its caller passes to ``stop(end_s=...)``, taken at its last synchronisation,
before the reader thread is joined and the closing sensors are read.
"""

from __future__ import annotations

import statistics
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, TypeVar

from orchestrator.devices.base import ClockEventReason, Device, PowerSensing

if TYPE_CHECKING:
    from collections.abc import Callable

MeterMethod = Literal["counter", "polling", "none"]
T = TypeVar("T")
COUNTER_MODULUS_MJ = 2**64
COUNTER_WATCH_S = 0.002  # how often the background thread reads the energy counter (hardware)
POLLS_PER_UPDATE = 4  # polling samples the power reading at least this often per update of it


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
    power_reading: str | None = None  # the reading the power figures come from (see _reading)

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


def _instant_reading(device: Device) -> str | None:
    """The name of the device's instantaneous power reading; None if it has none."""
    caps = device.capabilities()
    if not caps.has_power_sensor:
        return None
    sensing = caps.power_sensing
    return "usage" if sensing is None else sensing.reading


def choose_method(device: Device, method: str) -> MeterMethod:
    """The meter a device supports for ``measure.meter`` (``auto``: counter, else polling of an
    instantaneous power reading, else none); a method the device lacks is a one-line UserError."""
    from orchestrator.errors import UserError

    caps = device.capabilities()
    name = device.identity.name
    instant = _instant_reading(device)
    if method == "auto":
        if caps.has_energy_counter:
            return "counter"
        return "polling" if instant is not None else "none"
    if method == "counter" and not caps.has_energy_counter:
        why = caps.energy_note or "pre-Volta"
        raise UserError(f"measure.meter=counter: {name} has no energy counter ({why}); use auto")
    if method == "polling" and not caps.has_power_sensor:
        raise UserError(f"measure.meter=polling: {name} has no power sensor; use auto")
    if method == "polling" and instant is None:
        why = caps.power_sensing.note if caps.power_sensing else "no instant power reading"
        raise UserError(
            f"measure.meter=polling: {why}; integrating a 1 s average smears every change of "
            "power over a second: use measure.meter=counter (or auto)"
        )
    if method not in ("counter", "polling"):
        raise UserError(f"measure.meter={method!r} is not one of: auto, counter, polling")
    return method  # type: ignore[return-value]


def integrate_readings_j(
    samples: list[Sample], t0_s: float, t1_s: float, sensing: PowerSensing | None
) -> float:
    """Energy in J over ``[t0_s, t1_s]`` from polled power readings (see the module docstring).

    A step reconstruction: the first sample's value holds from the start; a new value seen at
    ``t_j`` (the sample before at ``t_{j-1}``) begins at ``(t_{j-1} + t_j) / 2 - age_s`` (where
    the change of power most likely was: its update halfway between the two samples, its window
    ``age_s`` behind) and holds until the next new value. ``sensing`` None: no lag.
    """
    age_s = 0.0 if sensing is None else sensing.age_s
    readings = [s for s in samples if s.power_mw is not None]
    steps: list[tuple[float, float]] = []  # (begins at, W)
    for k, s in enumerate(readings):
        watts = s.power_mw / 1000.0  # type: ignore[operator]
        if k == 0:
            steps.append((float("-inf"), watts))
        elif s.power_mw != readings[k - 1].power_mw:
            begins = (readings[k - 1].t_s + s.t_s) / 2 - age_s
            steps.append((max(begins, steps[-1][0]), watts))
    energy = 0.0
    for k, (start, watts) in enumerate(steps):
        end = steps[k + 1][0] if k + 1 < len(steps) else float("inf")
        overlap = min(end, t1_s) - max(start, t0_s)
        if overlap > 0:
            energy += watts * overlap
    return energy


class EnergyMeter:
    """Measures one window on one device.

    ``arm()`` begins watching the counter, ``counter_updates()`` says how often it has moved
    (so the caller can start on an edge and end on one), ``start()`` opens the window, ``tick()``
    follows each kernel call, ``stop()`` closes the window and returns the :class:`Measurement`.
    """

    def __init__(self, device: Device, *, method: str = "auto", poll_hz: float = 20.0) -> None:
        self.device = device
        self.method: MeterMethod = choose_method(device, method)
        caps = device.capabilities()
        self._has_power = caps.has_power_sensor
        self._sensing: PowerSensing | None = caps.power_sensing
        self._instant = _instant_reading(device) is not None
        self.period_s = 1.0 / poll_hz  # how often power is sampled
        sensing = self._sensing
        if self.method == "polling" and sensing is not None and sensing.period_s > 0:
            self.period_s = min(self.period_s, sensing.period_s / POLLS_PER_UPDATE)
        self._samples: list[Sample] = []
        self._lock = threading.Lock()
        self._next_t = 0.0
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._failed: BaseException | None = None  # what ended the background reader early
        self._background = device.identity.backend != "sim"
        self._last_energy: int | None = None
        self._updates = 0
        self._updates_at_start = 0
        self._edges_s: list[float] = []
        self._open = False
        self._armed = False
        self._pre: Sample | None = None  # hardware: the sensors, read before the start edge

    def _read(self, *, time_last: bool = False) -> Sample:
        """Read every sensor. The time is read first (closing a window: the reads fall after it)
        or last (opening one: they fall before it), so no sensor query lands inside a window."""
        d = self.device
        t_s = None if time_last else d.now_s()
        sample = Sample(
            t_s=0.0,
            power_mw=self._power_mw(),
            energy_mj=d.energy_mj() if self.method == "counter" else None,
            sm_clock_mhz=d.sm_clock_mhz(),
            reasons=int(d.clock_event_reasons()),
        )
        sample.t_s = d.now_s() if t_s is None else t_s
        return sample

    def _power_mw(self) -> int | None:
        if not self._has_power:
            return None
        return self.device.instant_power_mw() if self._instant else self.device.power_mw()

    def _reading(self) -> str | None:
        """Which reading the samples' power is: ``instant``, ``usage``, ``usage (1 s average)``
        (a counter meter on a GPU without an instant reading: its peak power is smeared)."""
        if not self._has_power:
            return None
        if not self._instant:
            return "usage (1 s average)"
        return "usage" if self._sensing is None else self._sensing.reading

    # --- watching the counter ----------------------------------------------------------------
    def arm(self) -> None:
        """Begin watching the energy counter (and, on hardware, start the background reader,
        after one reading of every sensor that ``start`` may use at the edge)."""
        if self.method == "counter":
            self._last_energy = self.device.energy_mj()
        self._updates = 0
        self._edges_s = []
        self._armed = True
        if self._background and self.method != "none":
            self._pre = self._read()
            self._stop.clear()
            self._thread = threading.Thread(target=self._poll, name="dvfs-meter", daemon=True)
            self._thread.start()

    def counter_updates(self) -> int:
        """Updates of the energy counter seen since ``arm()`` (0 without a counter): what the
        background reader has seen on hardware (no NVML read here), read now on the sim."""
        if self.method == "counter" and self._thread is None:
            self._watch_counter()
        self._raise_if_failed()
        with self._lock:
            return self._updates

    def last_edge_s(self) -> float | None:
        """When the latest counter update was seen (``Device.now_s``; None: none yet)."""
        with self._lock:
            return self._edges_s[-1] if self._edges_s else None

    @property
    def start_s(self) -> float:
        """When the open window began."""
        return self._samples[0].t_s

    def _watch_counter(self) -> None:
        value = self.device.energy_mj()
        with self._lock:
            if value != self._last_energy:
                self._updates += 1
                self._last_energy = value
                self._edges_s.append(self.device.now_s())

    # --- the window ----------------------------------------------------------------------------
    def start(self, at_s: float | None = None) -> None:
        """Open the window (the caller has synchronised the framework).

        Args:
            at_s: on hardware, the time the reader saw the counter edge the window opens on:
                the window begins there, at the energy the reader saw, and nothing is read now
                (the caller counts the calls that ran after it). None, or on the sim: now.
        """
        if not self._armed:
            self.arm()
        if at_s is not None and self._thread is not None and self._pre is not None:
            with self._lock:
                first = Sample(t_s=at_s, power_mw=self._pre.power_mw, energy_mj=self._last_energy,
                               sm_clock_mhz=self._pre.sm_clock_mhz, reasons=self._pre.reasons)
        else:
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

        try:
            while not self._stop.wait(wait_s()):
                if self.method == "counter":
                    self._watch_counter()
                if self._open and self.device.now_s() >= self._next_t:
                    self._take()
        except BaseException as e:  # noqa: BLE001 - kept, and raised in the caller's thread
            self._failed = e

    def _raise_if_failed(self) -> None:
        """Raise what ended the background reader (a lost GPU, an NVML error) in the caller's
        thread: a thread that dies prints to stderr and nothing stops, and a window measured
        without its reader would be stored with the samples and counter edges it never saw."""
        failed, self._failed = self._failed, None
        if failed is not None:
            raise failed

    def close(self) -> None:
        """Stop the background reader (``stop()`` does this too; safe to call twice). It never
        raises: it runs in ``finally`` blocks, where an error would hide the one on its way."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        self._armed = False

    def stop(self, end_s: float | None = None) -> Measurement:
        """Take the last reading and compute the window's energy and power.

        Args:
            end_s: when the window ended (``Device.now_s``), taken by the caller at its last
                synchronisation; None: now. The reader thread's join and the closing sensor
                reads (milliseconds each on some machines) then fall after the window.
        """
        self.close()
        self._raise_if_failed()
        if self.method == "counter":
            self._watch_counter()
        self._take()
        self._open = False
        if end_s is not None:
            self._samples[-1].t_s = min(end_s, self._samples[-1].t_s)
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
            energy_j = integrate_readings_j(samples, t0, t1, self._sensing)
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
            power_reading=self._reading(),
        )


def metered(device: Device, run: Callable[[EnergyMeter], T], *, method: str = "auto",
            poll_hz: float = 20.0) -> tuple[T, Measurement]:
    """What ``run(meter)`` returns, and its whole span measured by one meter of ``device``:
    armed and opened before it, closed at ``device.now_s()`` once it returns, its reader stopped
    whatever happens (a program's run: ``measuring.command``). A span with no counter edges to
    wait for is metered in this one call; ``run`` is handed the meter for the sim's ``tick()``.
    """
    meter = EnergyMeter(device, method=method, poll_hz=poll_hz)
    try:
        meter.arm()
        meter.start()
        done = run(meter)
        return done, meter.stop(end_s=device.now_s())
    finally:
        meter.close()
