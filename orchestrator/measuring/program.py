"""A user's program measured from inside: windows, charged steps, and the result it reports.

This is the room behind the public ``dvfs`` package (``import dvfs``), the API a user's own
training or inference script calls, in the spirit of Zeus's ``begin_window``/``end_window``::

    import dvfs

    step = dvfs.charged(train_step, items=batch)       # on the sim: charged its compiled work
    with dvfs.window("train", unit="samples"):          # time and energy of the process's GPUs
        for _ in range(steps):
            params, loss = step(params, x, y)
    dvfs.report_result({"loss": float(loss)})           # judged by a sweep against the default

**A window** measures time and energy of the GPUs the process uses with the meter a trial uses
(``orchestrator.measuring.meter.EnergyMeter``: the energy counter where the device has one,
polling an instantaneous power reading otherwise, sensor-aware), one meter per GPU, opened and
closed after the frameworks the program imported have finished their queued work (JAX: a tiny
computation on each device, blocked on, which runs after everything queued there; PyTorch:
``torch.cuda.synchronize`` per GPU it initialised). That is all a window costs the device at
each edge: a sync and a few sensor reads. A window is not aligned on the counter's updates (a
trial runs its kernel until the counter moves; a program cannot be made to): its energy is off
by at most one update of the counter, which each window reports (``counter_updates``), so a
window that spans N updates is within about 1/N. Its units of work are what the program says
(``items=``) or what its charged calls declared.

**The GPUs the process uses**: under a trial or ``dvfs monitor``, the ones they name
(``DVFS_GPUS``); else those of ``CUDA_VISIBLE_DEVICES`` (in PCI order, as the workers map
them); else every GPU. The backend: ``DVFS_DEVICE`` (``sim``, ``nvml``, ``cpu``), else NVML
where it finds a GPU, else the host CPU (RAPL). ``DVFS_DEVICE=sim`` runs a program on the
simulated GPU on its own (the machine of ``DVFS_SIM_STATE_DIR``, or the default one).

**On the simulated GPU** a program runs its kernels on the host, so the sim must be told their
GPU-sized work. :func:`charged` wraps a step (a jitted JAX function or a PyTorch function):
each call is charged the work its framework compiled, by the cost analysis the built-in kernels
use (``kernels.cost``: XLA's cost analysis of the jitted step at the call's shapes; PyTorch's
ATen ops counted on the first call of each shape), times ``sim_scale`` (``DVFS_SIM_SCALE``,
``workload.sim_scale``: a call then stands for one on arrays that many times larger; its items
are scaled alike, so energy per item stays per item). The sim's fault model reaches the call as
it reaches a built-in kernel: below a GPU's stability threshold a call's output (and the
tensors it updates in place, ``state=``) gets one flipped bit at the sim's fault rate, or the
call crashes (``SimulatedCrash``). A window in which nothing was charged is charged as busy for
its wall time (one memory-bound stretch: ``Device.charge_busy``), and says so (``busy_s``).
Elsewhere a charged call is the plain call, counted.

**Under a trial** (``workload=command``) or ``dvfs monitor``, the program writes what it
measured to the file ``DVFS_PROGRAM_FILE`` names, one JSON object a line: ``start``, each
``window``, each new ``work`` it was charged, its ``result`` and, at exit, the implicit window
of its whole run (from its first use of this API) and ``end``. :func:`read_report` reads it back.

Units: seconds (``time_s``, the device's clock: the virtual clock on the sim, wall time
elsewhere; ``wall_s``, the host's), joules, watts.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.devices.base import Device, Fault, KernelWork
from orchestrator.measuring.meter import EnergyMeter, Measurement

PROGRAM_FILE_ENV = "DVFS_PROGRAM_FILE"  # where a trial or `dvfs monitor` wants the records
DEVICE_ENV = "DVFS_DEVICE"  # sim | nvml | cpu: the backend of the process
GPUS_ENV = "DVFS_GPUS"  # comma-separated UUIDs: the GPUs the process uses
SIM_SCALE_ENV = "DVFS_SIM_SCALE"  # the sim: a charged call stands for this many times its data
METER_ENV = "DVFS_METER"  # measure.meter: auto, counter or polling
POLL_HZ_ENV = "DVFS_POLL_HZ"  # measure.poll_hz
POWERCAP_ENV = "DVFS_POWERCAP_ROOT"  # device.powercap_root (device=cpu)
SIM_STATE_ENV = "DVFS_SIM_STATE_DIR"  # the simulated machine (orchestrator.devices)
RUN_WINDOW = "(run)"  # the implicit window of a run under a trial: first use of the API to exit
BUSY_CHUNK_S = 0.025  # a busy stretch is charged in pieces this long, so meters see each update
MAX_RESULT_BYTES = 65_536  # a result is a number or a small map, not a data set
DEFAULT_UNIT = "items"


class SimulatedCrash(RuntimeError):
    """The simulated GPU crashed a charged call (below its stability threshold): the program
    ends as a process whose GPU kernel crashed would, and its trial records ``crash``."""


# --- what a window measured -------------------------------------------------------------------
@dataclass(frozen=True)
class GpuEnergy:
    """One GPU's share of a window."""

    uuid: str
    index: int
    name: str
    time_s: float  # the device's clock (virtual on the sim)
    energy_j: float | None  # None: the device measures no energy (energy_note says why)
    avg_power_w: float | None
    peak_power_w: float | None
    method: str  # counter, polling or none
    counter_updates: int | None  # energy-counter updates the window spanned
    counter_period_s: float | None
    sm_clock_mhz: float | None  # mean SM clock over the window's samples
    reasons: tuple[str, ...] = ()  # clock-event reasons seen (sw_power_cap, ...)
    energy_note: str | None = None


@dataclass(frozen=True)
class Window:
    """What one window measured: time and energy of its GPUs, and the work it covered.

    Attributes:
        name: the window's name.
        time_s: its length on the first GPU's clock (virtual on the sim; wall time elsewhere;
            the host's wall time when the process uses no GPU).
        energy_j: the energy of all its GPUs (None: none of them measures energy).
        gpus: each GPU's share.
        items: the units of work it covered (None: not said).
        unit: what an item is (``samples``, ``tokens``...).
        calls: the charged calls inside it.
        busy_s: seconds the sim charged as busy (nothing declared in it).
        wall_s: the host's wall time.
        implicit: the whole-run window of a program under a trial.
    """

    name: str
    time_s: float
    energy_j: float | None
    gpus: tuple[GpuEnergy, ...]
    items: float | None = None
    unit: str = DEFAULT_UNIT
    calls: int = 0
    busy_s: float = 0.0
    wall_s: float = 0.0
    implicit: bool = False
    begin_mono: float = 0.0  # time.monotonic() at its edges (one clock for every process)
    end_mono: float = 0.0

    @property
    def avg_power_w(self) -> float | None:
        """Mean power of all its GPUs together."""
        if self.energy_j is None or self.time_s <= 0:
            return None
        return self.energy_j / self.time_s

    @property
    def energy_per_item_j(self) -> float | None:
        """Joules per unit of work."""
        if self.energy_j is None or not self.items:
            return None
        return self.energy_j / self.items

    @property
    def rate(self) -> float | None:
        """Units of work per second (``unit``/s)."""
        return self.items / self.time_s if self.items is not None and self.time_s > 0 else None

    @property
    def energy_j_by_gpu(self) -> dict[int, float | None]:
        """Each GPU's energy by its index (Zeus's ``gpu_energy``)."""
        return {g.index: g.energy_j for g in self.gpus}

    def to_record(self) -> dict[str, Any]:
        """The window as one JSON object of the program's records."""
        return {"kind": "window", **asdict(self)}

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Window:
        """A window read back from the program's records."""
        fields = {k: v for k, v in record.items() if k not in ("kind", "gpus")}
        gpus = tuple(GpuEnergy(**{**g, "reasons": tuple(g.get("reasons") or ())})
                     for g in record.get("gpus") or ())
        return cls(gpus=gpus, **fields)


def gpu_energy(device: Device, m: Measurement) -> GpuEnergy:
    """One meter's measurement of one GPU, as a window's share of it."""
    ident = device.identity
    note = device.capabilities().energy_note if m.energy_j is None else None
    return GpuEnergy(
        uuid=ident.uuid, index=ident.index, name=ident.name, time_s=m.time_s,
        energy_j=m.energy_j, avg_power_w=m.avg_power_w, peak_power_w=m.peak_power_w,
        method=m.method, counter_updates=m.counter_updates, counter_period_s=m.counter_period_s,
        sm_clock_mhz=m.mean_sm_clock_mhz, reasons=tuple(m.reasons.names()),
        energy_note=note or (None if m.energy_j is not None else "no energy sensor"),
    )


# --- the frameworks' queued work ----------------------------------------------------------------
def sync_frameworks() -> None:
    """Wait for the work the frameworks this process imported have queued on their devices.

    JAX: on each local device, a tiny computation blocked on (a device runs its computations in
    the order they were queued, so it ends after everything before it: on a TPU v5e it waited
    out 26 ms of queued matrix products, and costs 0.53 ms with nothing queued, 2026-12-07; its
    one-element input stays on the device, so nothing is copied); nothing when JAX has not
    initialised a backend. PyTorch: ``torch.cuda.synchronize`` on each GPU, once CUDA is
    initialised. A framework the program did not import is not imported here.
    """
    jax = sys.modules.get("jax")
    if jax is not None and _jax_backends_initialised():
        step = _JAX_BARRIER.get("step")
        if step is None:
            step = _JAX_BARRIER["step"] = jax.jit(lambda v: v + 1)
        for device in jax.local_devices():
            held = _JAX_BARRIER.get(device)
            if held is None:
                held = _JAX_BARRIER[device] = jax.device_put(1, device)
            step(held).block_until_ready()
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and cuda.is_available() and cuda.is_initialized():
        for index in range(cuda.device_count()):
            cuda.synchronize(index)


_JAX_BARRIER: dict[Any, Any] = {}  # "step": the jitted barrier; each device: its input there


def _jax_backends_initialised() -> bool:
    """Whether JAX has a backend up (not one to start here: on a GPU it would take the memory
    JAX preallocates); True where this JAX cannot say."""
    bridge = sys.modules.get("jax._src.xla_bridge")
    probe = getattr(bridge, "backends_are_initialized", None)
    return True if probe is None else bool(probe())


# --- the records a program leaves for its trial -------------------------------------------------
class _Channel:
    """The records file of a program run by a trial or ``dvfs monitor`` (one JSON a line)."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)

    def write(self, record: dict[str, Any]) -> None:
        """Append one record, flushed at once (a killed program keeps what it wrote)."""
        line = json.dumps(record, default=_json_default)
        with self.path.open("a", encoding="utf-8") as f:
            f.write(line + "\n")


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):  # NumPy, JAX and PyTorch scalars
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON")


@functools.cache
def _channel() -> _Channel | None:
    path = os.environ.get(PROGRAM_FILE_ENV)
    return _Channel(path) if path else None


@dataclass
class ProgramReport:
    """What a program wrote to its records file (:func:`read_report`).

    Attributes:
        started: the program used this API (it wrote its ``start`` record).
        ended: it reached its exit (``end`` record): its totals are complete.
        windows: the windows it ended, in that order.
        run: the implicit window of its whole run (None: it did not end).
        result: what it reported (``has_result``: whether it reported anything).
        works: each work it was charged per call (name, FLOPs, bytes, launches, source...).
        calls: charged calls over the run (from ``end``).
        busy_s: seconds charged as busy over the run (from ``end``).
    """

    started: bool = False
    ended: bool = False
    windows: list[Window] = field(default_factory=list)
    run: Window | None = None
    result: Any = None
    has_result: bool = False
    works: list[dict[str, Any]] = field(default_factory=list)
    calls: int = 0
    busy_s: float = 0.0


def read_report(path: str | os.PathLike[str]) -> ProgramReport:
    """The records a program wrote (a missing file: it never used the API; a torn last line,
    written as it was killed, is left out)."""
    report = ProgramReport()
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return report
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        kind = record.get("kind")
        if kind == "start":
            report.started = True
        elif kind == "window":
            window = Window.from_record(record)
            if window.implicit:
                report.run = window
            else:
                report.windows.append(window)
        elif kind == "result":
            report.result, report.has_result = record.get("value"), True
        elif kind == "work":
            report.works.append({k: v for k, v in record.items() if k != "kind"})
        elif kind == "end":
            report.ended = True
            report.calls, report.busy_s = int(record["calls"]), float(record["busy_s"])
    return report


# --- the process: its GPUs and its open windows --------------------------------------------------
def _backend_kind() -> str:
    kind = os.environ.get(DEVICE_ENV)
    if kind:
        return kind
    from orchestrator.devices import nvml_available

    return "nvml" if nvml_available() else "cpu"


def _open_backend(kind: str) -> Any:
    """The backend of this process: the simulated machine ``DVFS_SIM_STATE_DIR`` names exactly
    (a trial's child joins its parent's GPUs, whatever their board), else ``open_backend``'s."""
    from orchestrator.config import DeviceConfig
    from orchestrator.devices import open_backend

    if kind == "sim" and os.environ.get(SIM_STATE_ENV):
        from orchestrator.devices.sim import nvml as sim_nvml
        from orchestrator.devices.sim.device import SimBackend

        return SimBackend(sim_nvml, "sim")
    return open_backend(DeviceConfig(backend=kind, powercap_root=os.environ.get(POWERCAP_ENV)))


def _process_devices(backend: Any, kind: str) -> list[Device]:
    """``DVFS_GPUS`` (UUIDs), else ``CUDA_VISIBLE_DEVICES`` on NVML, else every device."""
    named = [u for u in os.environ.get(GPUS_ENV, "").split(",") if u.strip()]
    if named:
        return [backend.device(uuid=u.strip()) for u in named]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if kind == "nvml" and visible is not None:
        from orchestrator.devices.mapping import gpu_uuid_for, node_devices

        every = node_devices(backend)
        return [backend.device(uuid=gpu_uuid_for(every, v.strip()))
                for v in visible.split(",") if v.strip()]
    return list(backend.devices())


@dataclass
class _Open:
    """A window being measured."""

    name: str
    devices: list[Device]
    meters: list[EnergyMeter]
    unit: str
    items: float | None  # said at the start (None: not yet)
    begin_mono: float
    begin_wall: float
    implicit: bool = False
    counted: float = 0.0  # items of the charged calls inside it
    calls: int = 0
    busy_s: float = 0.0


class _Process:
    """This process's GPUs, its open windows (of every monitor), what it charged the sim, and
    under a trial its records and its implicit whole-run window."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.backend = _open_backend(kind)
        self.devices = _process_devices(self.backend, kind)
        self.sim = kind == "sim"
        self.sim_scale = float(os.environ.get(SIM_SCALE_ENV) or 1.0) if self.sim else 1.0
        self.method = os.environ.get(METER_ENV) or "auto"
        self.poll_hz = float(os.environ.get(POLL_HZ_ENV) or 20.0)
        self.open: list[_Open] = []
        self.calls = 0
        self.busy_s = 0.0
        self._busy: list[tuple[float, float]] = []  # wall intervals charged as busy
        self._rng: Any = None
        self._run: _Open | None = None
        channel = _channel()
        if channel is not None:
            channel.write({"kind": "start", "pid": os.getpid(), "backend": kind,
                           "gpus": [d.identity.uuid for d in self.devices],
                           "sim_scale": self.sim_scale})
            self._run = self.begin(RUN_WINDOW, self.devices, None, DEFAULT_UNIT, implicit=True)
        atexit.register(self.finish)

    # --- windows ------------------------------------------------------------------------------
    def begin(self, name: str, devices: list[Device], items: float | None, unit: str, *,
              implicit: bool = False) -> _Open:
        """Open a window on ``devices``: the frameworks synchronised, a meter per GPU."""
        if not implicit:
            sync_frameworks()
        meters: list[EnergyMeter] = []
        try:
            for device in devices:
                meter = EnergyMeter(device, method=self.method, poll_hz=self.poll_hz)
                meters.append(meter)
                meter.arm()
                meter.start()
        except BaseException:
            for meter in meters:
                meter.close()
            raise
        opened = _Open(name, devices, meters, unit, items, time.monotonic(),
                       time.perf_counter(), implicit)
        self.open.append(opened)
        return opened

    def end(self, opened: _Open, items: float | None = None) -> Window:
        """Close a window: synchronised, busy time charged where nothing was, meters read."""
        try:
            sync_frameworks()
            if self.sim and opened.calls == 0:
                self._charge_busy(opened.devices, opened.begin_mono, time.monotonic())
            measured = [(d, m.stop(end_s=d.now_s())) for d, m in zip(opened.devices,
                                                                      opened.meters)]
        finally:
            for meter in opened.meters:
                meter.close()
            self.open = [o for o in self.open if o is not opened]
        return self._window(opened, measured, items)

    def _window(self, opened: _Open, measured: list[tuple[Device, Measurement]],
                items: float | None) -> Window:
        said = items if items is not None else opened.items
        if said is not None:
            said = float(said) * self.sim_scale
        gpus = tuple(gpu_energy(d, m) for d, m in measured)
        energies = [g.energy_j for g in gpus if g.energy_j is not None]
        wall = time.perf_counter() - opened.begin_wall
        window = Window(
            name=opened.name, time_s=gpus[0].time_s if gpus else wall,
            energy_j=sum(energies) if energies else None, gpus=gpus,
            items=said if said is not None else (opened.counted or None), unit=opened.unit,
            calls=opened.calls, busy_s=opened.busy_s, wall_s=wall, implicit=opened.implicit,
            begin_mono=opened.begin_mono, end_mono=time.monotonic(),
        )
        channel = _channel()
        if channel is not None:
            channel.write(window.to_record())
        return window

    # --- charged calls ------------------------------------------------------------------------
    def count(self, items: float | None) -> None:
        """A charged call off the sim: counted in every open window, nothing charged."""
        self.calls += 1
        for w in self.open:
            w.calls += 1
            w.counted += items or 0.0

    def charge(self, work: KernelWork, items: float | None) -> Fault:
        """A call on the sim: its work charged to the process's first GPU; its fault."""
        fault = self.devices[0].on_kernel_call(work)
        self.count(None if items is None else items * self.sim_scale)
        self._tick()
        return fault

    def _tick(self) -> None:
        for w in self.open:
            for meter in w.meters:
                meter.tick()

    def _charge_busy(self, devices: list[Device], begin: float, end: float) -> None:
        """Charge the part of ``[begin, end]`` (monotonic) not charged as busy before, in
        pieces, each followed by the open meters' ticks."""
        seconds = _uncovered_s(self._busy, begin, end)
        self._busy.append((begin, end))
        pieces = math.ceil(seconds / BUSY_CHUNK_S) if seconds > 0 else 0
        for _ in range(pieces):
            for device in devices:
                device.charge_busy(seconds / pieces)
            self._tick()
        self.busy_s += seconds
        for w in self.open:
            w.busy_s += seconds

    def charge_busy_call(self, seconds: float, items: float | None) -> None:
        """A charged call whose work could not be analysed: busy for its wall time."""
        now = time.monotonic()
        self._charge_busy(self.devices[:1], now - seconds, now)
        self.count(None if items is None else items * self.sim_scale)

    def rng(self) -> Any:
        """The generator of the bits the sim's corrupted calls flip (seeded: a run repeats)."""
        if self._rng is None:
            import numpy as np

            self._rng = np.random.default_rng(0)
        return self._rng

    def finish(self) -> None:
        """At exit: the whole-run window and the totals to the records; the backend closed."""
        channel = _channel()
        try:
            if self._run is not None and any(o is self._run for o in self.open):
                with contextlib.suppress(Exception):  # a framework already shut down, say:
                    self.end(self._run)  # the run's window is lost, never its totals
            if channel is not None:
                channel.write({"kind": "end", "calls": self.calls, "busy_s": self.busy_s})
        finally:
            with contextlib.suppress(Exception):
                self.backend.close()


def _uncovered_s(covered: list[tuple[float, float]], begin: float, end: float) -> float:
    """The length of ``[begin, end]`` outside every interval of ``covered``."""
    pieces = [(begin, end)]
    for lo, hi in covered:
        pieces = [part for a, b in pieces
                  for part in ((a, min(b, lo)), (max(a, hi), b)) if part[1] > part[0]]
    return sum(b - a for a, b in pieces)


_processes: dict[str, _Process] = {}


def _process(device: str | None = None) -> _Process:
    """The process's measured GPUs, opened at the first use of the API."""
    if _processes:
        proc = next(iter(_processes.values()))
        if device is not None and device != proc.kind:
            raise ValueError(f"this process measures device={proc.kind}; it cannot also "
                             f"measure device={device}")
        return proc
    kind = device or _backend_kind()
    proc = _processes[kind] = _Process(kind)
    return proc


# --- the public face ------------------------------------------------------------------------
class WindowHandle:
    """An open window of :meth:`Monitor.window`: count its work as it goes (:meth:`add`); its
    :class:`Window` is ``result`` once the block has ended."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.items: float | None = None
        self.result: Window | None = None

    def add(self, items: float) -> None:
        """Count ``items`` more units of work in this window."""
        self.items = (self.items or 0.0) + float(items)


class Monitor:
    """Measures named windows of this process's GPUs (``begin_window``/``end_window``, or the
    ``window`` context manager); windows may nest and overlap, each name open once at a time.

    Args:
        gpus: which of the process's GPUs, by index or UUID (None: all of them).
        device: the backend (``sim``, ``nvml``, ``cpu``); None: ``DVFS_DEVICE``, else NVML
            where it finds a GPU, else the host CPU. A process measures one backend.
    """

    def __init__(self, gpus: Sequence[int | str] | None = None, *,
                 device: str | None = None) -> None:
        self._proc = _process(device)
        chosen = self._proc.devices
        if gpus is not None:
            wanted = {str(g) for g in gpus}
            chosen = [d for d in chosen
                      if str(d.identity.index) in wanted or d.identity.uuid in wanted]
            if len(chosen) != len(wanted):
                raise ValueError(f"gpus={list(gpus)}: this process uses "
                                 f"{[d.identity.index for d in self._proc.devices]}")
        self.devices: list[Device] = list(chosen)
        self._open: dict[str, _Open] = {}

    def begin_window(self, name: str, *, items: float | None = None,
                     unit: str = DEFAULT_UNIT) -> None:
        """Open the window ``name`` (the frameworks' queued work finishes first).

        Args:
            name: the window's name (open once at a time).
            items: units of work it will cover, if known now (else at the end, or counted from
                the charged calls inside it).
            unit: what an item is (``samples``, ``tokens``): the rate is ``unit``/s.

        Raises:
            ValueError: a window of that name is already open.
        """
        if name in self._open:
            raise ValueError(f"window {name!r} is already open")
        self._open[name] = self._proc.begin(name, self.devices, items, unit)

    def end_window(self, name: str, *, items: float | None = None) -> Window:
        """Close the window ``name`` and return what it measured (the frameworks' queued work
        finishes first).

        Args:
            name: an open window.
            items: the units of work it covered (overrides what ``begin_window`` said).

        Raises:
            ValueError: no window of that name is open.
        """
        opened = self._open.pop(name, None)
        if opened is None:
            raise ValueError(f"no window {name!r} is open")
        return self._proc.end(opened, items)

    @contextlib.contextmanager
    def window(self, name: str, *, items: float | None = None,
               unit: str = DEFAULT_UNIT) -> Iterator[WindowHandle]:
        """A window around a block; ``handle.add(n)`` counts work inside it, ``handle.result``
        holds the :class:`Window` after it (ended even when the block raises)."""
        handle = WindowHandle(name)
        handle.items = None if items is None else float(items)
        self.begin_window(name, items=items, unit=unit)
        try:
            yield handle
        finally:
            handle.result = self.end_window(name, items=handle.items)


@functools.cache
def default_monitor() -> Monitor:
    """The monitor of the module-level calls (``dvfs.window``, ``dvfs.begin_window``...)."""
    return Monitor()


def begin_window(name: str, *, items: float | None = None, unit: str = DEFAULT_UNIT) -> None:
    """:meth:`Monitor.begin_window` on the process's default monitor."""
    default_monitor().begin_window(name, items=items, unit=unit)


def end_window(name: str, *, items: float | None = None) -> Window:
    """:meth:`Monitor.end_window` on the process's default monitor."""
    return default_monitor().end_window(name, items=items)


def window(name: str, *, items: float | None = None,
           unit: str = DEFAULT_UNIT) -> contextlib.AbstractContextManager[WindowHandle]:
    """:meth:`Monitor.window` on the process's default monitor."""
    return default_monitor().window(name, items=items, unit=unit)


def report_result(value: Any) -> Any:
    """Report the program's result (a number, or a small map of numbers and strings: a final
    loss, an accuracy, a checksum). Under a trial, the sweep compares it with the result at the
    device's default setting (``workload.result_rtol``/``result_atol``): past the tolerance the
    row is ``wrong``. The last call wins. Returns the value as recorded.

    Raises:
        TypeError: not a number or a map of JSON values.
        ValueError: more than 64 KiB as JSON.
    """
    recorded = _plain(value)
    text = json.dumps(recorded, default=_json_default)
    if len(text) > MAX_RESULT_BYTES:
        raise ValueError(f"a result is a number or a small map ({len(text)} bytes as JSON; "
                         f"at most {MAX_RESULT_BYTES})")
    channel = _channel()
    if channel is not None:
        channel.write({"kind": "result", "value": recorded})
    return recorded


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _plain_scalar(v) for k, v in value.items()}
    return _plain_scalar(value)


def _plain_scalar(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if hasattr(value, "item") and getattr(value, "size", 1) == 1:  # a 0-d array or a scalar
        return value.item()
    if isinstance(value, (list, tuple)):
        return [_plain_scalar(v) for v in value]
    raise TypeError(f"a result is a number, a string or a map of them, not "
                    f"{type(value).__name__}")


# --- charged calls ----------------------------------------------------------------------------
def charged(fn: Callable[..., Any] | None = None, *, name: str | None = None,
            items: float | None = None, state: Any = None,
            framework: str | None = None) -> Any:
    """Wrap a step so that the simulated GPU is charged its work and its faults reach it.

    On the sim each call is charged the work its framework compiled at the call's shapes
    (times ``sim_scale``), to the process's first GPU; below the GPU's stability threshold the
    call's output (and ``state``) may get a flipped bit, or the call raises
    :class:`SimulatedCrash`. Elsewhere the call runs as it is and is counted. Use as
    ``dvfs.charged(step)`` or as a decorator (``@dvfs.charged(items=batch)``).

    Args:
        fn: a jitted JAX function, any function of JAX arrays (analysed as ``jax.jit`` would
            compile it), or a PyTorch function (eager).
        name: the kernel class the sim's thresholds know it by (default: the function's name).
        items: units of work one call covers (counted in the open windows).
        state: what the call updates in place (a ``torch.nn.Module``, tensors, or a list of
            them: a PyTorch training step's model), which a corrupted call may hit too.
        framework: ``jax`` or ``pytorch`` (default: told from the function and its arguments).
    """
    if fn is None:
        return functools.partial(charged, name=name, items=items, state=state,
                                 framework=framework)
    return Charged(fn, name=name, items=items, state=state, framework=framework)


class Charged:
    """A step whose calls are charged (see :func:`charged`)."""

    def __init__(self, fn: Callable[..., Any], *, name: str | None = None,
                 items: float | None = None, state: Any = None,
                 framework: str | None = None) -> None:
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.name = name or getattr(fn, "__name__", None) or type(fn).__name__
        self.items = items
        self.state = state
        self.framework = framework
        self._works: dict[Any, KernelWork | None] = {}

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        return self if obj is None else functools.partial(self, obj)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the step: counted; on the sim also charged, and faulted below its threshold."""
        proc = _process()
        if not proc.sim:
            out = self.fn(*args, **kwargs)
            proc.count(self.items)
            return out
        return self._on_sim(proc, args, kwargs)

    def _on_sim(self, proc: _Process, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        from orchestrator.measuring import charge

        framework = self.framework or charge.framework_of(self.fn, args, kwargs)
        key = charge.signature(framework, args, kwargs)
        start = time.perf_counter()
        if key in self._works:
            work, out = self._works[key], self.fn(*args, **kwargs)
        else:
            out, work, record = charge.analyse(self.fn, framework, args, kwargs, self.name,
                                               proc.sim_scale)
            self._works[key] = work
            _record_work(record)
        if work is None:  # no work it could be told: busy for its wall time
            proc.charge_busy_call(time.perf_counter() - start, self.items)
            return out
        fault = proc.charge(work, self.items)
        if fault is Fault.CRASH:
            device = proc.devices[0]
            raise SimulatedCrash(f"{self.name}: the simulated GPU crashed the call at "
                                 f"{device.sm_clock_mhz()} MHz ({device.identity.uuid})")
        if fault is Fault.CORRUPT:
            return charge.corrupt(out, self.state, framework, proc.rng())
        return out


def _record_work(record: dict[str, Any]) -> None:
    channel = _channel()
    if channel is not None:
        channel.write({"kind": "work", **record})
