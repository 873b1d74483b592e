"""One trial: one device, one setting, one kernel, measured and checked.

The sequence, for each trial:

1. apply the requested settings through the guard (which has already refused anything outside
   the policy or the device's support);
2. settle: let the device sit idle for ``measure.settle_s`` so clocks and power follow the setting;
3. build the kernel (cached per process: the JIT compile happens once per GPU, never inside a
   window) and warm it up;
4. for each repeat, one window (``orchestrator/measuring/window.py``): queue calls asynchronously
   until both ``measure.window_s`` of device time and ``measure.min_iters`` calls have passed,
   starting and ending on energy-counter updates; then a check run right after the window
   (``measure.digest=after``, the default) leaves each checked call's on-device fingerprint
   (bitwise determinism) and a few sampled outputs, held on the device (always the last);
5. judge validity: did the device run at the clock asked for, which throttle reasons fired,
   did the window span enough energy-counter updates;
6. put the device back to its default setting (the guard restores it in any case), then compare
   the held samples with the float64 reference on the device (``kernels.compare``) and judge
   correctness (``ok`` / ``wrong`` / ``nondeterministic``): no output is copied to the host,
   and no check is computed at the setting under test.

Each phase's wall time goes in the rows (``phase_<name>_s``,
``orchestrator.measuring.phases.PHASES``: the build, settings and warm-up on the first repeat, the
restore on the last, each repeat's edge waits, window, check run and comparison on its own row), so
a sweep can say what share of its time its windows took (``analysis.phases``).

On the simulated GPU the kernel really runs on the CPU, and the device's model accounts each call
at ``workload.sim_size`` (by default the ``gpu`` preset): the sim's clock, energy and roofline
describe the GPU-sized problem while the CPU computes a small one, so outputs and checks stay real
and fast. Each call is charged the work its framework compiled at that size
(``kernels.cost``: XLA's cost analysis for JAX and TF+XLA, one kernel per op for TF graphs), so
the frameworks differ in bytes moved and kernels launched; the row records it
(``charged_flops``, ``charged_bytes``, ``charged_launches``, ``charged_transcendentals``,
``work_kind``, ``work_source``, and ``work_note``
when a source failed and the analytic counts were charged). On other devices nothing is
charged, and the same columns record the compiled work at the size that ran. Faults the sim
draws below a device's stability threshold corrupt the real output (one flipped bit in one
element) or crash the call, so the checks see them as they would on hardware.
On ``device=cpu`` (the host measured as a device) time is wall time and energy comes from RAPL
where it can be read; where it cannot, the row measures time only and ``energy_note`` says why.

A user's program (``workload=command``) is a trial too: the same base row, health check,
failure rows and restore, around what ``orchestrator.measuring.command`` measures of it (its
reference run, the setting, one run per repeat) instead of steps 2-6.

A failure inside a trial is a result, not an exception out of the sweep: a crash is a ``crash``
row, a device lost during the trial a ``device_error`` row. Before anything else a trial asks
``Device.health()``: on a GPU that is lost, reported an XID or uncorrected ECC errors, or is at
its slowdown temperature, it runs nothing and returns ``not_measured`` rows whose error names the
GPU and why (a re-run measures them once the GPU is back). The answer is sticky per ``Device``,
so the GPU takes no further trials in this process. ``TrialContext.on_kernel_calls`` is told
just before the trial's first kernel call (the worker's trace of what it was doing, read if it
dies: ``orchestrator.measuring.trial_trace``).
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from orchestrator import interrupt
from orchestrator.config import AUTO_SIZE, COMMAND
from orchestrator.devices.base import Device, KernelWork
from orchestrator.errors import DeviceError, DeviceLostError, UserError
from orchestrator.measuring.command import measure_program
from orchestrator.measuring.guard import SettingsGuard
from orchestrator.measuring.memory import (
    HostPeak,
    OutOfMemory,
    Plan,
    held_budget,
    held_samples,
    is_out_of_memory,
    oom_reason,
    plan_trial,
)
from orchestrator.measuring.phases import fill_phases, timed
from orchestrator.measuring.thermal import steady_start
from orchestrator.measuring.window import (
    Checks,
    KernelCalls,
    SimulatedCrash,
    measure_window,
)
from orchestrator.results.rows import (
    Status,
    base_row,
    fail_rows,
    failed_by,
    fill_checks,
    fill_measured,
    fill_rate,
)

if TYPE_CHECKING:
    from kernels.spec import KernelOptions, Peak, WorkCounts
    from orchestrator.config import DvfsConfig
    from orchestrator.jobs.job import JobSpec


@dataclass
class TrialContext:
    """What a process keeps across trials on one GPU: the guard and the compiled kernels."""

    device: Device
    guard: SettingsGuard
    kernels: Any  # kernels.KernelCache (or a test's stand-in with the same get())
    sweep_id: str = ""
    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(0))
    on_kernel_calls: Callable[[], None] | None = None  # called before a trial's first call
    # the size workload.size=auto chose per (workload, framework, dtype): kept for the sweep
    sizes: dict[tuple[str, str, str], str] = field(default_factory=dict)


def run_trial(ctx: TrialContext, job: JobSpec, attempt: int = 1) -> list[dict[str, Any]]:
    """Run one trial (all its repeats); always returns one row per repeat, never raises for
    a failure of the kernel or the device.

    Args:
        ctx: the GPU's guard and kernel cache.
        job: the validated job.
        attempt: which attempt at this trial it is (1 unless a re-run runs it again).
    """
    program = job.config.workload.name == COMMAND  # a user's program, not a kernel
    device = ctx.device
    base = base_row(job, device.identity, sweep_id=ctx.sweep_id, attempt=attempt)
    rows: list[dict[str, Any]] = []
    phases: dict[str, float] = {}  # the trial's own phases (wall s); each repeat's go on its row
    health = device.health()  # an unhealthy GPU takes no further trials (sticky per Device)
    if not health.ok:  # nothing measured: the circumstances, not the setting
        fail_rows(rows, base, job.repeats, Status.NOT_MEASURED, f"not run: {health.reason}")
        return rows
    held: list[Held] = []  # each window's checks, compared once the device is back
    plan: Plan | None = None
    host_peak = None if program else HostPeak()  # a program's memory is its own process's
    if host_peak is not None:
        host_peak.start()
    try:
        interrupt.check()  # a SIGTERM whose KeyboardInterrupt Python dropped stops the sweep here
        if program:  # its reference run, the setting and its runs: measuring.command
            measure_program(ctx, job, base, rows, phases)
        else:
            plan = _plan(ctx, job, base)  # before anything is set: refused if too big
            with timed(phases, "settings"):
                ctx.guard.apply(job.request)
                device.idle(job.config.measure.settle_s)
            _measure(ctx, job, base, rows, phases, held, plan)
        interrupt.check()  # ... or here: the guard may have put the GPU back mid-window
    except OutOfMemory as e:  # refused before anything was set
        fail_rows(rows, base, job.repeats, Status.OUT_OF_MEMORY, f"not run: {e}")
    except SimulatedCrash as e:
        fail_rows(rows, base, job.repeats, Status.CRASH, str(e))
    except DeviceLostError as e:
        fail_rows(rows, base, job.repeats, Status.DEVICE_ERROR, str(e))
        device.health()  # while it is still lost: the sticky answer retires the GPU
    except UserError:
        raise
    except DeviceError as e:
        fail_rows(rows, base, job.repeats, Status.DEVICE_ERROR, str(e))
    except Exception as e:  # noqa: BLE001 - a failure of the trial is its row, not the sweep's
        fail_rows(rows, base, job.repeats, *_failure(e, plan, program))
    finally:
        try:
            with timed(phases, "restore"):
                ctx.guard.restore()
        except DeviceError as e:  # the journal keeps the entry; `dvfs restore` finishes the job
            for row in rows:
                row["error"] = (row.get("error") or "") + f" | restore failed: {e}"
    _compare_held(held, job, plan)  # at the device's own setting, not the one under test
    fill_phases(rows, phases)
    if host_peak is not None:
        _fill_host_peak(rows, host_peak)
    return rows


def _failure(e: Exception, plan: Plan | None, program: bool) -> tuple[Status, str]:
    """The status and error of a trial that raised: a kernel out of memory (device or host) is
    its own status, anything else a crash (a program's memory is its child process's: its
    trial raising is a crash); the trial fails its rows with them as with any other failure."""
    if not program and is_out_of_memory(e):
        return Status.OUT_OF_MEMORY, oom_reason(e, plan)
    return Status.CRASH, f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}"


def _plan(ctx: TrialContext, job: JobSpec, base: dict[str, Any]) -> Plan:
    """The sizes the kernel computes and the sim models, and the memory plan
    (``measuring.memory``), recorded in ``base``; every other kernel's arrays are released
    first, so the free memory read is what this trial may take.

    Raises:
        OutOfMemory: the size (or, for ``auto``, every size) does not fit.
    """
    cfg, device, spec = job.config, ctx.device, job.workload_spec
    remembered = ctx.sizes.get((spec.name, cfg.framework.name, cfg.workload.dtype))
    preset = remembered if cfg.workload.size == AUTO_SIZE else cfg.workload.size
    options = kernel_options(spec.name, cfg, preset) if preset else None
    base.update(size_requested=cfg.workload.size,
                check_arithmetic=device.float32_matmul_default(cfg.framework.name))
    cache, own = ctx.kernels, 0
    if hasattr(cache, "release_others"):  # a test's stand-in cache holds no arrays of its own
        cache.release_others(options)  # this kernel's arrays stay, to be used again
        own = cache.resident_bytes(options) if options is not None else 0
    device.model_allocation(0, cfg.framework.name)  # the sim: the process holds its arrays no more
    try:
        plan = plan_trial(device, spec, cfg, preset, own)
    except OutOfMemory as e:
        base["footprint_note"] = str(e)
        raise
    if cfg.workload.size == AUTO_SIZE:  # the sweep's later trials compute the same size
        ctx.sizes[(spec.name, cfg.framework.name, cfg.workload.dtype)] = plan.preset
    base.update(size=plan.preset, footprint_bytes=plan.footprint.device,
                footprint_note=plan.note, device_free_bytes=plan.free)
    return plan


def _fill_host_peak(rows: list[dict[str, Any]], peak: HostPeak) -> None:
    """The trial's peak host memory on each of its rows (the process's since it started where
    ``/proc/self/clear_refs`` could not reset it: the note says so)."""
    value = peak.peak_bytes()
    for row in rows:
        row["host_peak_bytes"] = value
        if value is not None and not peak.reset:
            row["footprint_note"] = ((row.get("footprint_note") or "") +
                                     "; host peak since the process started (clear_refs refused)")


class Held(NamedTuple):
    """A finished window's checks, held (its samples on the device) until the comparison."""

    row: dict[str, Any]
    checks: Checks
    kernel: Any  # the BuiltKernel that made the samples: it compares them
    workload: str  # the workload's own name (it chooses the tolerance)


def _compare_held(held: list[Held], job: JobSpec, plan: Plan | None = None) -> None:
    """Compare each finished window's held samples with the reference, on the device, and
    judge its row; a window whose trial failed later is still judged (its row has no status)."""
    for row, checks, kernel, workload in held:
        if row.get("status") is not None:
            continue
        before = kernel.bytes_to_host
        try:
            with timed(row, "phase_compare_s"):
                fill_checks(row, checks, kernel.compare(checks.sampled), job, workload)
        except DeviceError as e:
            row.update(status=Status.DEVICE_ERROR, failed_by=failed_by(Status.DEVICE_ERROR),
                       error=f"comparison failed: {e}", valid=False)
        except Exception as e:  # noqa: BLE001 - a failed comparison fails its row, not the sweep
            status = Status.OUT_OF_MEMORY if is_out_of_memory(e) else Status.CRASH
            row.update(status=status, failed_by=failed_by(status), valid=False,
                       error=f"comparison failed: {oom_reason(e, plan)}")
        checks.sampled.clear()  # the device memory goes back at once
        row["bytes_to_host"] = (row.get("bytes_to_host") or 0) + kernel.bytes_to_host - before


def kernel_options(workload: str, cfg: DvfsConfig, preset: str | None = None) -> KernelOptions:
    """The kernel a job's config asks for: its workload by name, framework, size (``preset``
    where given: the one ``auto`` chose), dtype, precision, seed and the framework's compile
    switches (TensorFlow's ``xla``, PyTorch's ``compile`` and ``deterministic``)."""
    from kernels import KernelOptions

    fw = cfg.framework
    return KernelOptions(
        workload, framework=fw.name, preset=preset or cfg.workload.size, dtype=cfg.workload.dtype,
        precision=fw.precision, seed=int(cfg.seed), xla=bool(fw.xla),
        compile=bool(fw.compile), deterministic=bool(fw.deterministic),
    )


def _measure(
    ctx: TrialContext, job: JobSpec, base: dict[str, Any], rows: list[dict[str, Any]],
    phases: dict[str, float], held: list[Held], plan: Plan,
) -> None:
    """Build and warm the kernel at the plan's sizes, then one window and its check run per
    repeat (rows appended, their checks into ``held``; the wall time of the build and the
    warm-up into ``phases``, each repeat's into its row)."""
    from orchestrator.results.provenance import library_versions

    wall = time.perf_counter()
    cfg, device, spec = job.config, ctx.device, job.workload_spec
    used_before = device.memory_used_bytes()
    kernel = ctx.kernels.get(kernel_options(spec.name, cfg, plan.preset))
    base["framework_version"] = kernel.framework_version
    base["versions"] = library_versions(cfg.framework.name)
    preset = plan.sim_preset or plan.preset  # the size the device is charged (sim) or ran
    # The analytic counts stay the useful work of a call (throughput, energy per TFLOP);
    # the compiled work is what the device is charged (on the sim) or what it ran. The
    # workload's figures at that size were read once, by the plan: its counts, roof and
    # modelled footprint.
    counts = plan.counts
    work = _charged_work(kernel, (spec.name, counts, plan.peak), preset, cfg, base)
    in_use = plan.footprint.modelled or int(counts.bytes_moved)  # a kernel without a footprint
    memory = _memory_model(device, in_use, cfg) if plan.sim_preset else None
    getattr(kernel, "reset_peak_memory", lambda: None)()  # a stand-in kernel keeps no figures
    m = cfg.measure
    phases["build"] = plan.counts_s + time.perf_counter() - wall  # the counts: read by the plan
    if ctx.on_kernel_calls is not None:
        ctx.on_kernel_calls()
    with timed(phases, "steady"):  # leakage follows the die: start where measure says
        base["steady_note"] = steady_start(device, KernelCalls(kernel, device, work, None), m)
    with timed(phases, "warmup"):
        if m.warmup_iters:
            KernelCalls(kernel, device, work, None).run(m.warmup_iters)
    with timed(phases, "compare"):  # the reference, computed once per kernel (and so per sweep)
        kernel.reference()
    budget = held_budget(plan.free, m)  # the held samples' device memory
    samples, samples_note = held_samples(
        m.reference_samples, getattr(kernel, "output_bytes", 0), budget, m.repeats)
    base.update(samples_note=samples_note)
    for repeat in range(m.repeats):
        row = dict(base, repeat=repeat, started_at=time.time())
        rows.append(row)
        row["temperature_start_c"] = device.temperature_c()  # leakage, and so power, follow it
        bytes_before = kernel.bytes_to_host
        window = measure_window(kernel, device, work, m, ctx.rng, samples)
        row.update({f"phase_{name}_s": s for name, s in window.phases.items()})
        fill_measured(row, window, counts, job)
        fill_rate(row, spec.unit, spec.items(preset))
        if window.measurement.method == "none":
            row["energy_note"] = device.capabilities().energy_note or "no energy sensor"
        row["temperature_c"] = device.temperature_c()
        row.update(device.window_readings())  # a TPU's runtime metrics, where libtpu has them
        _fill_memory(row, kernel, memory, (used_before, device.memory_used_bytes()))
        row.update(bytes_to_host=kernel.bytes_to_host - bytes_before, ended_at=time.time())
        held.append(Held(row, window.checks, kernel, spec.name))


def _memory_model(device: Device, in_use: int, cfg: DvfsConfig) -> int:
    """The simulated GPU's in-use peak of the workload at ``sim_size`` (``in_use``: its
    footprint, or, a kernel without one, the bytes one call moves); the sim records what the
    process would hold for it (``devices.sim.memory``)."""
    device.model_allocation(in_use, cfg.framework.name)
    return in_use


def _fill_memory(
    row: dict[str, Any], kernel: Any, modelled: int | None, used: tuple[int | None, ...]
) -> None:
    """Peak device memory (the sim's model, else the framework's own figure) and NVML's used
    memory before the kernel was built and after the window."""
    hook = getattr(kernel, "peak_memory", None)
    peak, source = hook() if hook is not None else (None, "the kernel reports no memory")
    row.update(framework_peak_bytes=peak, memory_source=source,
               memory_used_before_bytes=used[0], memory_used_after_bytes=used[1])
    if modelled is not None:
        row.update(peak_memory_bytes=modelled, memory_source="sim model: footprint at sim_size")
    else:
        row["peak_memory_bytes"] = peak


def _charged_work(
    kernel: Any, workload: tuple[str, WorkCounts, Peak], preset: str, cfg: DvfsConfig,
    base: dict[str, Any],
) -> KernelWork:
    """The work each call is charged (recorded in ``base``): what the framework compiled at
    ``preset``; the analytic counts and one launch for a kernel that cannot say (a stand-in).
    ``workload`` is its name, analytic counts and compute roof at ``preset``, read once (by the
    plan: ``measuring.memory.Plan``)."""
    from kernels.cost import CompiledWork

    name, counts, peak = workload

    hook = getattr(kernel, "compiled_work", None)
    compiled = hook(preset) if hook is not None else CompiledWork(
        float(counts.flops), float(counts.bytes_moved), 1, "analytic",
        note="the kernel reports no compiled work",
    )
    base.update(
        charged_flops=compiled.flops,
        charged_bytes=compiled.bytes_moved,
        charged_launches=compiled.launches,
        charged_transcendentals=compiled.transcendentals,
        work_kind=compiled.kind,
        work_source=compiled.source,
        work_note=compiled.note,
    )
    return KernelWork(
        flops=float(compiled.flops),
        bytes_moved=float(compiled.bytes_moved),
        peak=peak,
        kernel_class=name,
        framework=cfg.framework.name,
        launches=int(compiled.launches),
        transcendentals=float(compiled.transcendentals),
        kind=compiled.kind,
    )
