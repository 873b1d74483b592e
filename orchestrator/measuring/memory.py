"""A trial's memory: what it needs on the device and the host, which size fits, what ran out.

Before a trial changes anything, its workload's **footprint** on the device is compared with
the device's free memory (``Device.memory_info``):

- the inputs (from the workload's shapes), one output, and the compiled program's own
  temporaries (XLA's ``memory_analysis()`` on the JAX path; an estimate elsewhere:
  ``kernels.cost.kernel_memory``);
- the float64 reference, held on the device as two float32 arrays (``kernels.compare``): two
  float32 values per output element;
- the held samples: at most ``measure.reference_samples + 1`` outputs per window, within
  ``measure.held_outputs_share`` of the free device memory (and ``measure.held_outputs_gib``
  where set) over all of the trial's windows.

The **host** needs the inputs as drawn (float64) and rounded, and the float64 reference with
its working set (the workload's modelled footprint in float64 where it has one, else the
output twice). On the CPU the device is the host, so both count against the same memory.

A size that does not fit (with :data:`MARGIN` spare) is refused in one line before the guard
changes anything (:class:`OutOfMemory`: the row's status is ``out_of_memory``). With
``workload.size=auto`` the largest preset that fits is chosen, and the row records it (``size``;
``size_requested`` says ``auto``). On the simulated GPU the device footprint is the one at
``workload.sim_size`` (the problem the sim models) against the simulated board's memory, and
``auto`` computes ``tiny`` on the host.

A framework that runs out of memory anyway (XLA's ``RESOURCE_EXHAUSTED``, TensorFlow's
``ResourceExhaustedError``, PyTorch's ``OutOfMemoryError``, Python's ``MemoryError``) gives the
same status (:func:`is_out_of_memory`), never ``crash``: running out of memory says nothing
about the setting under test.

The trial's **peak host memory** (:class:`HostPeak`) is the process's ``VmHWM`` after the
trial, reset at its start by writing ``5`` to ``/proc/self/clear_refs`` (Linux 4.0+). Where the
reset is not permitted (another kernel, a sandbox) the figure is the process's peak since it
started, and the row's ``footprint_note`` says so.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.config import AUTO_SIZE

if TYPE_CHECKING:
    from kernels.spec import KernelSpec, Peak, Sized, WorkCounts
    from orchestrator.config import DvfsConfig, MeasureConfig
    from orchestrator.devices.base import Device, MemoryInfo

MARGIN = 0.10
"""The share of free memory a trial leaves spare: a size fits when footprint <= 0.9 x free."""

GIB = 2**30


class OutOfMemory(Exception):
    """A trial refused before it ran: its workload at its size does not fit (one line)."""


@dataclass(frozen=True)
class Footprint:
    """What one trial needs, in bytes (see the module docstring)."""

    preset: str  # the size the kernel computes
    inputs: int
    output: int
    temporaries: int
    reference: int  # the reference on the device: (hi, lo) float32
    held: int  # the held samples of every window
    host: int  # host memory beyond the process: inputs as drawn and rounded, the reference
    source: str  # where the temporaries come from: xla_memory_analysis or estimate
    samples: int  # samples held per window besides the last (measure.reference_samples or fewer)
    modelled: int | None  # the workload's own modelled device memory at `preset` (None: none)

    @property
    def device(self) -> int:
        """The device bytes the trial needs."""
        return self.inputs + self.output + self.temporaries + self.reference + self.held

    def parts(self) -> str:
        """Its parts in GiB: ``inputs 0.5, output 0.25, ...``."""
        named = (("inputs", self.inputs), ("output", self.output),
                 ("temporaries", self.temporaries), ("reference", self.reference),
                 ("held samples", self.held))
        return ", ".join(f"{name} {gib(b)}" for name, b in named)


def gib(n: float) -> str:
    """Bytes as GiB to 3 significant digits."""
    return f"{n / GIB:.3g}"


@dataclass(frozen=True)
class Plan:
    """The trial's sizes, memory and work, decided before anything is set: the measurement
    builds the kernel at ``preset``, charges the sim at ``sim_preset``, models its memory from
    the footprint and counts its work from ``counts`` and ``peak``, each read here once."""

    preset: str  # the size the kernel computes (the one workload.size=auto chose)
    sim_preset: str | None  # the size the simulated GPU models and charges (workload.sim_size)
    footprint: Footprint  # at sim_preset where there is one, else at preset
    free: int | None  # the device's free bytes before the trial (None: it does not say)
    note: str  # for the row: the chosen size and the parts
    counts: WorkCounts  # the workload's analytic counts of one call, at the footprint's size
    peak: Peak  # its compute roof in the job's dtype, precision and framework
    counts_s: float  # the seconds reading them took: the trial's build phase holds them


def held_budget(free: int | None, m: MeasureConfig) -> float:
    """The device memory the held samples of a trial may take."""
    budget = float("inf") if free is None else m.held_outputs_share * free
    if m.held_outputs_gib is not None:
        budget = min(budget, m.held_outputs_gib * GIB)
    return budget


def held_samples(reference_samples: int, output_bytes: int, budget_bytes: float,
                 windows: int) -> tuple[int, str | None]:
    """How many of calls 1, 2, 4, ... each window holds for the reference check (the last call
    is held besides), so that ``windows`` windows' sampled outputs fit ``budget_bytes`` of
    device memory; and, when fewer than asked, why (for the row). The last is always held; an
    output of unknown size (0 bytes: a stand-in kernel), or no bound (an infinite budget: the
    device's free memory unknown and no cap), holds what is asked."""
    if output_bytes <= 0 or math.isinf(budget_bytes):
        return int(reference_samples), None
    fit = int(budget_bytes // output_bytes) // max(windows, 1) - 1
    held = max(0, min(int(reference_samples), fit))
    if held == reference_samples:
        return held, None
    return held, (
        f"{held + 1} of {reference_samples + 1} sampled outputs held per window: "
        f"{windows} window(s) of {output_bytes / 2**30:.2f} GiB outputs within "
        f"{budget_bytes / 2**30:.3g} GiB (measure.held_outputs_share of the free device memory, "
        f"at most measure.held_outputs_gib)"
    )


def footprint(spec: KernelSpec, sized: Sized, cfg: DvfsConfig, host: int,
              free: int | None) -> Footprint:
    """The footprint of ``spec`` on the device at ``sized`` (the preset it computes, or the sim's
    ``sim_size``), its held samples bounded by the share of ``free``; ``host`` is what the host
    needs for the preset it computes (:func:`host_bytes`, counted once by the caller)."""
    from kernels.cost import kernel_memory

    m = cfg.measure
    itemsize = _itemsize(sized.dtype)
    mem = kernel_memory(spec, sized, cfg.framework.name, cfg.framework.precision)
    has_ref = spec.reference_fn is not None
    reference = mem.output // itemsize * 8 if has_ref else 0
    samples, _ = held_samples(m.reference_samples, mem.output, held_budget(free, m), m.repeats)
    held = (samples + 1) * m.repeats * mem.output
    return Footprint(sized.preset, mem.inputs, mem.output, mem.temporaries, reference, held,
                     host, mem.source, samples, mem.modelled)


KERNEL_REFERENCE_FACTOR = 3.0
"""A kernel's inputs and float64 reference hold up to this many times (its inputs in float64 +
its largest array in float64): measured at the ``cpu`` preset (VmHWM over drawing the inputs,
rounding them and computing the reference), 2.7x for the stencil, the most of the six."""
MODEL_REFERENCE_FACTOR = 10.0
"""A model's inputs and float64 reference (a NumPy forward and backward pass) hold up to this
many times its modelled float64 footprint: measured at the ``cpu`` preset (VmHWM), 2.5x for
BERT, 2.9x for ViT and 10x for ResNet-50 (0.57 GiB: its convolutions make im2col copies)."""


def host_bytes(spec: KernelSpec, sized: Sized) -> int:
    """Host memory a kernel at ``sized`` needs beyond the process: its inputs as drawn
    (float64) and rounded, and the float64 reference with its working set (the factors
    above: measured, not modelled)."""
    itemsize = _itemsize(sized.dtype)
    sizes = [math.prod(int(n) for n in s) for s in sized.shapes]
    elements = sum(sizes)
    drawn = elements * (8 + itemsize)
    if spec.reference_fn is None:
        return drawn
    if sized.reference:  # its modelled footprint in float64
        return int(drawn + MODEL_REFERENCE_FACTOR * sized.reference)
    largest = max(sizes, default=0)
    return int(KERNEL_REFERENCE_FACTOR * (elements * 8 + largest * 8))


def _itemsize(dtype: str) -> int:
    from kernels.spec import ITEMSIZE

    return ITEMSIZE[dtype]


def plan_trial(device: Device, spec: KernelSpec, cfg: DvfsConfig, preset: str | None = None,
               own_bytes: int = 0) -> Plan:
    """The trial's plan: the preset the kernel computes, the one the sim models, the memory,
    and the work the measurement counts at the size the device is charged (:func:`_work_at`).

    Args:
        device: the trial's device.
        spec: the workload.
        cfg: the job's config.
        preset: the size to check (None: ``workload.size``; ``auto`` tries each, largest first).
        own_bytes: device bytes this process already holds for this very kernel (its arrays,
            kept from the previous trial): free for it.

    Raises:
        OutOfMemory: the size asked (or every size, for ``auto``) does not fit.
    """
    from orchestrator.devices.cpu import host_memory

    size, sim = preset or cfg.workload.size, device.identity.backend == "sim"
    info = device.memory_info()
    if info is not None and own_bytes and not sim:
        info = type(info)(info.total_bytes, info.free_bytes + int(own_bytes))
    free = None if info is None else info.free_bytes
    host = host_memory()
    if sim:  # the host computes a small problem; the board holds the one sim_size models
        computed = spec.presets[0] if size == AUTO_SIZE else size
        tries = [(computed, cfg.workload.sim_size or computed)]
    else:  # the size asked, or for auto each, largest first: the first that fits
        tries = [(p, p) for p in (reversed(spec.presets) if size == AUTO_SIZE else [size])]
    refusal = None
    for preset, board in tries:
        # The workload at the size the host computes and the one the board holds, asked once.
        sized = spec.at(preset, cfg.workload.dtype)
        on_board = sized if board == preset else spec.at(board, cfg.workload.dtype)
        host_need = host_bytes(spec, sized)
        if not sim and host is not None and host_need > (1 - MARGIN) * host.free_bytes:
            refusal = refusal or OutOfMemory(  # skipped before any compile
                f"{preset}: needs {gib(host_need)} GiB of host memory (the inputs and the "
                f"float64 reference), {gib(host.free_bytes)} GiB available (a {MARGIN:.0%} "
                "margin kept)")
            continue
        fp = footprint(spec, on_board, cfg, host_need, free)
        try:
            _check(fp, device, info, host)
        except OutOfMemory as e:
            if sim:  # its one size: refused as it is
                raise
            refusal = refusal or e
            continue
        return Plan(preset, (cfg.workload.sim_size or None) if sim else None, fp, free,
                    _note(fp, size, info), *_work_at(spec, cfg, board))
    if size == AUTO_SIZE:
        raise OutOfMemory(f"workload.size=auto: no size of {spec.name} fits; {refusal}")
    raise OutOfMemory(str(refusal))


def _work_at(spec: KernelSpec, cfg: DvfsConfig, board: str) -> tuple[WorkCounts, Peak, float]:
    """The work the measurement counts per call at ``board``, the size the device is charged
    (the sim's ``sim_size``, else the size computed): the workload's analytic counts there, its
    compute roof, and the seconds reading them took. Read for the size chosen alone, once its
    memory is known to fit (a workload without ``count_fn`` compiles to count: ``auto``
    compiles no other size for them); the trial's build phase holds the seconds, as it did when
    the measurement read them."""
    dtype, fw = cfg.workload.dtype, cfg.framework
    start = time.perf_counter()
    peak = spec.peak(dtype, fw.precision, fw.name)
    counts = spec.counts(board, dtype)
    return counts, peak, time.perf_counter() - start


def _check(fp: Footprint, device: Device, info: MemoryInfo | None,
           host: MemoryInfo | None) -> None:
    """Refuse ``fp`` where it needs more than ``1 - MARGIN`` of what is free (on the CPU the
    device is the host: both needs count against the host's memory)."""
    if device.identity.backend == "cpu":
        host_need, device_need = fp.device + fp.host, None
    else:
        host_need, device_need = fp.host, fp.device
    if device_need is not None and info is not None and (
            device_need > (1 - MARGIN) * info.free_bytes):
        raise OutOfMemory(
            f"{fp.preset}: needs {gib(device_need)} GiB of device memory ({fp.parts()}), "
            f"{gib(info.free_bytes)} GiB free (a {MARGIN:.0%} margin kept)")
    if host is not None and host_need > (1 - MARGIN) * host.free_bytes:
        raise OutOfMemory(
            f"{fp.preset}: needs {gib(host_need)} GiB of host memory (the inputs and the "
            f"float64 reference; on the device {fp.parts()}), {gib(host.free_bytes)} GiB "
            f"available (a {MARGIN:.0%} margin kept)")


def _note(fp: Footprint, size: str, info: MemoryInfo | None) -> str:
    chosen = f"size=auto chose {fp.preset}: " if size == AUTO_SIZE else ""
    free = f"; {gib(info.free_bytes)} GiB free" if info is not None else ""
    return (f"{chosen}needs {gib(fp.device)} GiB ({fp.parts()}; temporaries from "
            f"{fp.source}){free}; host {gib(fp.host)} GiB")


_OOM_NAMES = ("OutOfMemoryError", "ResourceExhaustedError", "MemoryError")
_OOM_TEXT = ("RESOURCE_EXHAUSTED", "Out of memory", "out of memory", "OOM when allocating")


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it was raised from) is a framework's out-of-memory error:
    ``MemoryError``, XLA's ``RESOURCE_EXHAUSTED``, TensorFlow's ``ResourceExhaustedError``,
    PyTorch's ``OutOfMemoryError``."""
    seen: BaseException | None = exc
    for _ in range(5):
        if seen is None:
            return False
        if isinstance(seen, MemoryError) or type(seen).__name__ in _OOM_NAMES:
            return True
        if any(t in str(seen)[:2000] for t in _OOM_TEXT):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def oom_reason(exc: BaseException, plan: Plan | None) -> str:
    """One line for an out-of-memory row: the error's first line and what the trial needed."""
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
    needed = f" (planned: {plan.note})" if plan is not None else ""
    return f"{type(exc).__name__}: {first}{needed}"


class HostPeak:
    """The process's peak resident memory over a span (``VmHWM``, reset through
    ``/proc/self/clear_refs`` where permitted; see the module docstring)."""

    def __init__(self, proc: Path = Path("/proc/self")) -> None:
        self._proc = proc
        self.reset = False

    def start(self) -> None:
        """Start the span: reset the high-water mark where the kernel lets this process."""
        try:
            (self._proc / "clear_refs").write_text("5")
            self.reset = True
        except OSError:
            self.reset = False

    def peak_bytes(self) -> int | None:
        """The peak resident bytes (since :meth:`start` where it could reset); where ``/proc``
        has no ``VmHWM`` (a gVisor sandbox), ``getrusage``'s ``ru_maxrss``, the process's peak
        since it started (``reset`` is then False)."""
        try:
            for line in (self._proc / "status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        except (OSError, ValueError, IndexError):
            pass
        self.reset = False
        try:
            import resource

            return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # kB on Linux
        except (ImportError, OSError, ValueError):
            return None
