"""The measurement window: time the kernel on the device, then check what it computed.

A window times the device, not the host. Judged by what each line would cost on an H200:

- **Dispatch is asynchronous.** Calls are queued back to back (``BuiltKernel.dispatch``) and the
  loop waits for the device only at the end of a chunk of calls, sized to about 1/32 of the window
  (at most ``MAX_CHUNK`` calls, which also bounds the outputs in flight), because that is where it
  must know the elapsed time. Per call the host does nothing but queue the call (and, on the
  simulated GPU, account it: the sim's clock is virtual, so its bookkeeping costs the window
  nothing).
- **Windows sit on energy-counter edges.** With a counter, the kernel runs until the counter has
  just moved, the window opens, and at its end the kernel runs on until the counter moves again
  (each wait bounded by ``measure.counter_edge_wait_s``): the energy read is then the energy
  between two updates, with no quantisation at either end (see ``orchestrator/measuring/meter.py``).
  On hardware the edge waits ask the meter's reader thread, never NVML itself: one NVML read took
  ~5 ms on an H200, and a host that reads after each call leaves the GPU idle that long; the
  window ends at its last synchronisation, before the closing reads.
- **Checks stay on the device.** Each checked call's output is reduced on the device to an 8-byte
  fingerprint (``kernels/fingerprint.py``), and only fingerprints reach the host, after the calls.
  The few sampled outputs for the float64 reference check (calls 1, 2, 4, ... and the last) stay
  on the device, held until the trial compares them there (``kernels/compare.py``) once the guard
  has put the device back: a check is not computed by the setting under test. How many are held
  is bounded by ``measure.held_outputs_share`` of the device's free memory (and
  ``measure.held_outputs_gib`` where set) over all of a trial's windows
  (``measuring.memory.held_samples``); fewer samples, never an out-of-memory crash, and the row
  says so.

Even an on-device fingerprint is a pass over the output unless XLA fuses it into the kernel's own
loop; measured on a CPU it makes the stencil 3.7x slower. So by default (``measure.digest=after``)
the window times bare calls, and a check run of ``measure.check_iters`` calls (by default as many
as the window made) at the same setting follows at once, with the fingerprint fused into the same
compiled step; both are recorded. ``inline`` fingerprints the timed calls themselves (every timed
call checked, at that cost), and ``host`` is the old way, for debugging only: every call
synchronised, copied to the host and hashed there (BLAKE2b), inside the window.

Faults of the simulated GPU: a call it crashes raises :class:`SimulatedCrash`; a call it corrupts
gets one flipped bit in its output, and the fingerprint (computed on the host from the corrupted
copy, by the same arithmetic) and the reference check both see it. A corrupted call of a bare
timed window is seen by nothing, as on hardware: detection is the check run's job.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from orchestrator import interrupt
from orchestrator.config import MeasureConfig
from orchestrator.devices.base import Device, Fault, KernelWork
from orchestrator.measuring import inject
from orchestrator.measuring.meter import EnergyMeter, Measurement
from orchestrator.measuring.phases import timed

DigestMode = Literal["after", "inline", "host"]  # orchestrator.config.DIGESTS validates it
CHUNKS_PER_WINDOW = 32  # a chunk of calls lasts about this fraction of the window
MAX_CHUNK = 64  # calls queued between two synchronisations, at most
EDGE_CHUNK_S = 0.001  # while waiting for a counter edge, synchronise about this often


class SimulatedCrash(RuntimeError):
    """The simulated GPU crashed a kernel call (the trial records ``crash``)."""


def flip_random_bit(out: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A copy of ``out`` with one bit flipped in one element (what unstable silicon does)."""
    corrupted = np.array(out, copy=True)
    flat = corrupted.reshape(-1).view(np.uint8)
    byte = int(rng.integers(flat.size))
    flat[byte] ^= np.uint8(1 << int(rng.integers(8)))
    return corrupted


def sample_indices(reference_samples: int) -> set[int]:
    """The calls (counted from 1) whose outputs are compared with the reference: 1, 2, 4, ..."""
    return {2**i for i in range(int(reference_samples))}


@dataclass
class Checks:
    """What the checked calls left for the checks: fingerprints in call order, sampled outputs."""

    digests: list[str] = field(default_factory=list)
    sampled: list[Any] = field(default_factory=list)  # device handles (host arrays: sim, host)
    identical: int = 0  # sampled outputs not kept: bitwise equal to one kept (by fingerprint)
    time_s: float | None = None  # device time of a separate check run (None: checked in-window)

    @property
    def calls(self) -> int:
        """How many calls were checked."""
        return len(self.digests)


class _Recorder:
    """Collects the fingerprints and sampled outputs of checked calls, on the device until
    ``finish`` (mode ``after``/``inline``) or on the host at once (mode ``host``)."""

    def __init__(self, kernel: Any, mode: DigestMode, keep_at: set[int], rng: np.random.Generator):
        self.kernel = kernel
        self.mode = mode
        self.keep_at = keep_at
        self.rng = rng
        self.calls = 0
        self._fingerprints: list[Any] = []  # device handles, or host arrays of corrupted calls
        self._sampled: dict[int, Any] = {}  # call number -> device handle or host array
        self._last: Any = None
        self._digests: list[str] = []

    def dispatch(self, fault_of: Any) -> Any:
        """Queue one checked call; ``fault_of()`` accounts it on the device and says its fault.

        Returns:
            The call's device handle, to synchronise on (None in mode ``host``, which already did).
        """
        from kernels import numpy_fingerprint, output_digest

        if self.mode == "host":
            out = self.kernel.to_numpy(self.kernel.call_device())
            fault = fault_of()
            if fault is Fault.CORRUPT:
                out = flip_random_bit(out, self.rng)
            self.calls += 1
            self._digests.append(output_digest(out))
            self._keep(out)
            return None
        handle, fingerprint = self.kernel.dispatch_checked()
        fault = fault_of()
        self.calls += 1
        out = handle
        if fault is Fault.CORRUPT:  # the sim only: its virtual clock hides this host work
            out = flip_random_bit(self.kernel.fetch([handle])[0], self.rng)
            fingerprint = numpy_fingerprint(out)
        self._fingerprints.append(fingerprint)
        self._keep(out)
        return handle

    def _keep(self, out: Any) -> None:
        if self.calls in self.keep_at:
            self._sampled[self.calls] = out
        self._last = out

    def flush(self) -> None:
        """Bring the fingerprints queued so far to the host (a few bytes each)."""
        from kernels import fingerprint_hex

        fingerprints = self._fingerprints
        pending = [(i, f) for i, f in enumerate(fingerprints) if not isinstance(f, np.ndarray)]
        fetched = self.kernel.fetch([f for _, f in pending]) if pending else []
        for (i, _), host in zip(pending, fetched):
            self._fingerprints[i] = host
        self._digests.extend(fingerprint_hex(f) for f in self._fingerprints)
        self._fingerprints = []

    def finish(self) -> Checks:
        """Fingerprints on the host, sampled outputs where they are (call after the calls).

        Samples whose fingerprints are equal hold the same bits (a flipped bit always changes
        the fingerprint), so their errors are equal too: only the first of each is kept for the
        comparison, which on a deterministic device is one output of the four or five held.
        """
        self.flush()
        if self.calls and self.calls not in self._sampled:
            self._sampled[self.calls] = self._last
        distinct: dict[str, Any] = {}
        for call, output in sorted(self._sampled.items()):
            distinct.setdefault(self._digests[call - 1], output)
        return Checks(digests=list(self._digests), sampled=list(distinct.values()),
                      identical=len(self._sampled) - len(distinct))


class KernelCalls:
    """Queues one kernel's calls on one device: the sim's accounting, injected faults, chunks."""

    def __init__(self, kernel: Any, device: Device, work: KernelWork, meter: EnergyMeter | None):
        self.kernel = kernel
        self.device = device
        self.work = work
        self.meter = meter

    def _account(self) -> Fault:
        fault = self.device.on_kernel_call(self.work)
        if fault is Fault.CRASH:
            ident = self.device.identity
            raise SimulatedCrash(
                f"kernel call crashed on {ident.name} {ident.uuid} "
                f"(simulated fault at {self.device.sm_clock_mhz()} MHz)"
            )
        if self.meter is not None:
            self.meter.tick()
        return fault

    def run(self, count: int, recorder: _Recorder | None = None) -> None:
        """Queue ``count`` calls, then wait for the device once (and see whether to stop:
        ``interrupt.check``, a flag, or a throttled look at a worker's closing mark)."""
        last = None
        for _ in range(count):
            inject.on_kernel_call(self.device)  # test and chaos only (measuring/inject.py)
            if recorder is None:
                last = self.kernel.dispatch()
                self._account()  # a bare call's corruption is seen by nothing, as on hardware
            else:
                last = recorder.dispatch(self._account)
        if last is not None:
            self.kernel.sync(last)
        interrupt.check()  # a dropped Ctrl-C, or a stopping driver: stop at a chunk's end


def _chunk(per_call_s: float, window_s: float, left: int) -> int:
    """Calls in the next chunk: about 1/32 of the window, at most MAX_CHUNK and what is left."""
    wanted = int(window_s / CHUNKS_PER_WINDOW / per_call_s) if per_call_s > 0 else MAX_CHUNK
    return max(1, min(wanted, MAX_CHUNK, left))


def _edge_chunk(per_call_s: float | None) -> int:
    if not per_call_s or per_call_s <= 0:
        return 1
    return max(1, min(MAX_CHUNK, int(EDGE_CHUNK_S / per_call_s)))


@dataclass
class Edge:
    """How an edge wait ended: the counter moved (``found``, seen at ``at_s``), ``made`` calls,
    ``after`` of them finished after the edge was seen (on hardware the reader thread sees it,
    a few milliseconds before the loop asks; on the sim, at once: 0)."""

    found: bool
    at_s: float | None
    made: int
    after: int


def _await_edge(calls: KernelCalls, meter: EnergyMeter, per_call_s: float | None, wait_s: float,
                recorder: _Recorder | None) -> Edge:
    """Keep the kernel running until the energy counter moves."""
    device = calls.device
    seen = meter.counter_updates()
    deadline = device.now_s() + wait_s
    made = 0
    synced: list[tuple[float, int]] = []  # (when a chunk was done, calls done by then)
    while True:
        k = _edge_chunk(per_call_s)
        calls.run(k, recorder)
        made += k
        synced.append((device.now_s(), made))
        if meter.counter_updates() > seen:
            at_s = meter.last_edge_s()
            by_edge = max((n for t, n in synced if at_s is not None and t <= at_s), default=0)
            return Edge(True, at_s, made, made - by_edge)
        if device.now_s() >= deadline:
            return Edge(False, None, made, 0)


@dataclass
class Window:
    """One measured window."""

    measurement: Measurement
    iterations: int  # calls inside the window
    checks: Checks  # what the checked calls (in the window or the check run) left
    aligned: bool | None  # both ends on counter edges; None: no counter
    phases: dict[str, float] = field(default_factory=dict)  # wall s: edge_wait, window, check_run


def measure_window(kernel: Any, device: Device, work: KernelWork, m: MeasureConfig,
                   rng: np.random.Generator, samples: int | None = None) -> Window:
    """Time one window of calls and check them (``m`` is the ``measure`` config; ``samples``
    of calls 1, 2, 4, ... are held for the reference check, by default
    ``m.reference_samples``)."""
    mode: DigestMode = m.digest
    keep_at = sample_indices(m.reference_samples if samples is None else samples)
    meter = EnergyMeter(device, method=m.meter, poll_hz=m.poll_hz)
    meter.arm()  # its reader runs from here: nothing below until the first call takes time
    calls = KernelCalls(kernel, device, work, meter)
    in_window = None if mode == "after" else _Recorder(kernel, mode, keep_at, rng)
    aligned: bool | None = None
    phases = {"edge_wait": 0.0}
    try:
        n = 0  # calls inside the window
        if meter.method == "counter":
            with timed(phases, "edge_wait"):
                edge = _await_edge(calls, meter, None, m.counter_edge_wait_s, None)
            aligned = edge.found
            meter.start(at_s=edge.at_s)
            n = edge.after if edge.at_s == meter.start_s else 0  # ran after the window opened
        else:
            meter.start()
        wall = time.perf_counter()
        t0 = meter.start_s
        per_call_s = 0.0
        while True:
            k = 1 if per_call_s == 0 else _chunk(per_call_s, m.window_s, m.max_iters - n)
            calls.run(k, in_window)
            n += k
            elapsed = device.now_s() - t0
            per_call_s = elapsed / n
            if (elapsed >= m.window_s and n >= m.min_iters) or n >= m.max_iters:
                break
        phases["window"] = time.perf_counter() - wall
        end_s = None
        if meter.method == "counter":
            with timed(phases, "edge_wait"):
                edge = _await_edge(calls, meter, per_call_s, m.counter_edge_wait_s, in_window)
            aligned = bool(aligned and edge.found)
            n += edge.made - edge.after  # those after the edge ran outside the window
            end_s = edge.at_s if edge.found else None
        measurement = meter.stop(end_s=device.now_s() if end_s is None else end_s)
    finally:
        meter.close()
    with timed(phases, "check_run"):
        if in_window is not None:
            checks = in_window.finish()
        else:
            checks = check_run(kernel, device, work, m.check_iters or n, keep_at, rng)
    return Window(measurement=measurement, iterations=n, checks=checks, aligned=aligned,
                  phases=phases)


def check_run(kernel: Any, device: Device, work: KernelWork, count: int, keep_at: set[int],
              rng: np.random.Generator) -> Checks:
    """``count`` checked calls at the current setting, right after a bare timed window."""
    recorder = _Recorder(kernel, "after", keep_at, rng)
    calls = KernelCalls(kernel, device, work, None)
    t0 = device.now_s()
    done = 0
    while done < count:
        k = min(MAX_CHUNK, count - done)
        calls.run(k, recorder)
        recorder.flush()  # outside any timed window: keeps the handles in flight bounded
        done += k
    checks = recorder.finish()
    checks.time_s = device.now_s() - t0
    return checks
