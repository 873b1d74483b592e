"""A user's program as a trial (``workload=command``): run once under the trial's setting, judged
by its own result.

``dvfs sweep workload=command workload.argv=[python,train.py,...]`` makes each trial:

1. **The reference**, once per process and program (and GPU): the program run at the device's
   default setting (before the trial's setting is applied), its result kept. A trial at the
   default setting is its own reference. A program that fails there fails every trial of it,
   as ``crash``, saying so.
2. **The run**: the guard applies the setting (and restores it afterwards, whatever happens: a
   program killed or crashed leaves nothing changed, since only the trial's process sets
   anything), then the program runs once per repeat as a child process in a process group of its
   own, with ``DVFS_PROGRAM_FILE`` pointing at its records (``orchestrator.measuring.program``:
   the ``dvfs`` API writes its windows, its charged work and its result there), ``DVFS_DEVICE``
   and ``DVFS_GPUS`` naming the trial's GPU (and ``CUDA_VISIBLE_DEVICES`` on NVML), and
   ``DVFS_SIM_SCALE`` (``workload.sim_scale``). ``python`` as the program is the Python dvfs runs
   on. Past ``workload.timeout_s`` the group is stopped (SIGTERM, then SIGKILL) and the row is
   ``timeout``; a non-zero exit (a signal, a Python exception, the sim's ``SimulatedCrash``) is
   ``crash`` with the tail of its output; a Ctrl-C (or a stopping sweep) stops the program with
   SIGINT and stores nothing of the trial.
3. **The row**: the program's windows (``workload.window`` names which; by default the outermost
   ones, each not inside another), summed: time, energy, power, clocks and counter updates of the
   trial's GPU, the units of work they covered (``items``, ``rate`` in ``<unit>/s``,
   ``energy_per_item_j``), the charged calls (``iterations``: a step is an iteration; a program
   that charges none is one iteration). A program that marked no window is measured over its
   whole run: on hardware by the trial's own meter around the process; on the sim by the whole-run
   window the program's API kept (it saw every charged call), or, for a program that never used
   the API, by the trial's meter while the trial charges the sim as busy for the run's wall time
   (``work_source=busy_wall_time``; ``work_note`` says so). Its validity is a trial's (the clock
   asked for, thermal throttling, enough counter updates).
4. **The verdict**: its result against the reference: every numeric entry within
   ``workload.result_atol + workload.result_rtol * |reference|``, every other entry equal, every
   number finite; else ``wrong`` (``rel_error``, ``max_abs_error`` say by how much). So
   ``hydra/sweeper=stability`` finds the clock below which the program's own result moves.

The program runs where ``workload.cwd`` says (by default where ``dvfs`` was started, resolved
when the job is made, so a Ray worker runs it there too; on a cluster, the program must be at that
path on every node, as a workload must be installed on every node).
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator import interrupt
from orchestrator.devices.base import ClockEventReason, Device
from orchestrator.measuring import program
from orchestrator.measuring.meter import EnergyMeter, Measurement, metered
from orchestrator.measuring.phases import timed
from orchestrator.results.rows import Status, failed_by, validity

if TYPE_CHECKING:
    from orchestrator.config import DvfsConfig
    from orchestrator.jobs.job import JobSpec
    from orchestrator.measuring.trial import TrialContext

POLL_S = 0.05  # how often the wait for the program looks at Ctrl-C and the clock
STOP_GRACE_S = 5.0  # after SIGINT (or SIGTERM), how long a program has to end before SIGKILL
TAIL_CHARS = 2000  # the end of a failed program's output kept in its row's error
BUSY_MARK = "busy_wall_time"


# --- running the program ------------------------------------------------------------------------
@dataclass
class ProgramRun:
    """One run of a program.

    Attributes:
        exit_code: its exit status (negative: the signal that ended it; None: it could not
            start).
        wall_s: start to exit, host seconds.
        timed_out: it ran past its limit and was stopped.
        stopped_by: the Ctrl-C (or the stopping sweep) that stopped it, to raise again.
        output_tail: the end of its stdout and stderr.
        report: what it wrote through the ``dvfs`` API.
    """

    exit_code: int | None
    wall_s: float
    timed_out: bool = False
    stopped_by: KeyboardInterrupt | None = None
    output_tail: str = ""
    report: program.ProgramReport = field(default_factory=program.ProgramReport)

    @property
    def failure(self) -> str | None:
        """Why the run failed (None: it exited 0)."""
        if self.timed_out:
            return "ran past its limit and was stopped"
        if self.stopped_by is not None:
            return f"was stopped ({self.stopped_by})"
        if self.exit_code == 0:
            return None
        if self.exit_code is None:
            return "could not start"
        if self.exit_code < 0:
            return f"was killed by {signal.Signals(-self.exit_code).name}"
        return f"exited with status {self.exit_code}"


def program_argv(argv: Sequence[Any]) -> list[str]:
    """The argv to run: ``python`` (or ``python3``) is the Python dvfs runs on, so the program
    sees the same packages (the ``dvfs`` API among them)."""
    args = [str(a) for a in argv]
    if args and args[0] in ("python", "python3"):
        args[0] = sys.executable
    return args


def run_program(argv: Sequence[str], *, cwd: str | None, env: dict[str, str],
                timeout_s: float | None, capture: bool = True,
                on_poll: Callable[[], None] | None = None) -> ProgramRun:
    """Run a program to its end (or its limit, or a Ctrl-C) in a process group of its own, with
    its records file and no standard input (a background group that read the terminal would be
    stopped).

    Args:
        argv: what to run (:func:`program_argv` resolves ``python``).
        cwd: where.
        env: added to this process's environment.
        timeout_s: its limit (None: none).
        capture: its output goes to a file whose tail is kept (else to this process's).
        on_poll: called every ``POLL_S`` while it runs.
    """
    with tempfile.TemporaryDirectory(prefix="dvfs-program-") as tmp:
        records, log = Path(tmp) / "records.jsonl", Path(tmp) / "output.log"
        full_env = {**os.environ, **env, program.PROGRAM_FILE_ENV: str(records)}
        start = time.perf_counter()
        with log.open("wb") as out:
            try:
                proc = subprocess.Popen(
                    program_argv(argv), cwd=cwd, env=full_env,
                    stdout=out if capture else None, stderr=subprocess.STDOUT if capture else None,
                    stdin=subprocess.DEVNULL, process_group=0)
            except OSError as e:
                return ProgramRun(None, time.perf_counter() - start, output_tail=str(e))
            timed_out, stopped_by = _wait(proc, start, timeout_s, on_poll)
        run = ProgramRun(proc.returncode, time.perf_counter() - start, timed_out, stopped_by,
                         _tail(log), program.read_report(records))
    return run


def _wait(proc: subprocess.Popen[bytes], start: float, timeout_s: float | None,
          on_poll: Callable[[], None] | None) -> tuple[bool, KeyboardInterrupt | None]:
    """Wait for the program; stop it past its limit or at a Ctrl-C. Nothing of its process
    group outlives it."""
    try:
        while True:
            try:
                proc.wait(timeout=POLL_S)
                return False, None
            except subprocess.TimeoutExpired:
                pass
            interrupt.check()
            if on_poll is not None:
                on_poll()
            if timeout_s is not None and time.perf_counter() - start > timeout_s:
                _stop(proc, signal.SIGTERM)
                return True, None
    except KeyboardInterrupt as e:
        _stop(proc, signal.SIGINT)  # a Python program runs its finally blocks and writes
        return False, e
    finally:
        _signal_group(proc, signal.SIGKILL)  # whatever it started and left behind


def _signal_group(proc: subprocess.Popen[bytes], signum: int) -> None:
    try:
        os.killpg(proc.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _stop(proc: subprocess.Popen[bytes], first: int) -> None:
    """Stop the program: ``first`` to its group, then SIGTERM, then SIGKILL, each after
    ``STOP_GRACE_S`` (a second Ctrl-C while it ends is the CLI's to handle)."""
    for signum in (first, signal.SIGTERM, signal.SIGKILL):
        _signal_group(proc, signum)
        try:
            proc.wait(timeout=STOP_GRACE_S)
            return
        except subprocess.TimeoutExpired:
            continue


def _tail(log: Path) -> str:
    with log.open("rb") as f:
        f.seek(max(0, log.stat().st_size - TAIL_CHARS))
        return f.read().decode("utf-8", errors="replace").strip()


def program_env(device: Device, cfg: DvfsConfig, uuids: Sequence[str]) -> dict[str, str]:
    """What a run adds to the program's environment: where its GPUs are and how to measure."""
    backend = device.identity.backend
    env = {
        program.DEVICE_ENV: backend,
        program.GPUS_ENV: ",".join(uuids),
        program.SIM_SCALE_ENV: repr(float(cfg.workload.sim_scale)),
        program.METER_ENV: str(cfg.measure.meter),
        program.POLL_HZ_ENV: repr(float(cfg.measure.poll_hz)),
        **{str(k): str(v) for k, v in (cfg.workload.env or {}).items()},
    }
    if backend == "nvml":
        env["CUDA_VISIBLE_DEVICES"] = ",".join(uuids)
    if cfg.device.powercap_root:
        env[program.POWERCAP_ENV] = str(cfg.device.powercap_root)
    return env


# --- what a run measured --------------------------------------------------------------------
@dataclass
class Span:
    """Figures of one GPU over the windows a row sums (or the whole run)."""

    time_s: float = 0.0
    energy_j: float | None = 0.0
    peak_power_w: float | None = None
    method: str = "none"
    counter_updates: int | None = None
    counter_period_s: float | None = None
    clock_time: float = 0.0  # sum of clock x time, for the mean clock
    clock_seen_s: float = 0.0
    reason_names: set[str] = field(default_factory=set)
    items: float | None = None
    unit: str = program.DEFAULT_UNIT
    calls: int = 0
    busy_s: float = 0.0
    energy_note: str | None = None

    @property
    def mean_sm_clock_mhz(self) -> float | None:
        """The SM clock over the span, weighted by time."""
        return self.clock_time / self.clock_seen_s if self.clock_seen_s > 0 else None

    @property
    def reasons(self) -> ClockEventReason:
        """Every clock-event reason seen."""
        bits = ClockEventReason.NONE
        for name in self.reason_names:
            bits |= ClockEventReason[name.upper()]
        return bits

    @property
    def avg_power_w(self) -> float | None:
        """Mean power."""
        if self.energy_j is None or self.time_s <= 0:
            return None
        return self.energy_j / self.time_s

    def add(self, gpu: program.GpuEnergy, *, items: float | None = None, calls: int = 0,
            busy_s: float = 0.0, unit: str | None = None) -> None:
        """Add one window's share of this GPU."""
        first = self.time_s == 0 and self.method == "none"
        self.time_s += gpu.time_s
        self.energy_j = None if self.energy_j is None or gpu.energy_j is None else (
            self.energy_j + gpu.energy_j)
        if gpu.peak_power_w is not None:
            self.peak_power_w = max(self.peak_power_w or 0.0, gpu.peak_power_w)
        if first:
            self.method, self.counter_period_s, self.unit = gpu.method, gpu.counter_period_s, (
                unit or self.unit)
        if gpu.counter_updates is not None:
            self.counter_updates = (self.counter_updates or 0) + gpu.counter_updates
        if gpu.sm_clock_mhz is not None:
            self.clock_time += gpu.sm_clock_mhz * gpu.time_s
            self.clock_seen_s += gpu.time_s
        self.reason_names |= set(gpu.reasons)
        if items is not None:
            self.items = (self.items or 0.0) + items
        self.calls += calls
        self.busy_s += busy_s
        self.energy_note = self.energy_note or gpu.energy_note


def outermost(windows: Sequence[program.Window]) -> list[program.Window]:
    """The windows not inside another (by their edges on the host's monotonic clock)."""
    return [w for w in windows if not any(
        o is not w and o.begin_mono <= w.begin_mono and w.end_mono <= o.end_mono
        and (o.begin_mono, -o.end_mono) < (w.begin_mono, -w.end_mono) for o in windows)]


def chosen_windows(report: program.ProgramReport, name: str | None) -> list[program.Window]:
    """The windows a row sums: those named ``name``, else the outermost ones."""
    if name:
        return [w for w in report.windows if w.name == name]
    return outermost(report.windows)


def window_span(windows: Sequence[program.Window], uuid: str) -> Span:
    """One GPU's figures over ``windows``."""
    span = Span()
    for w in windows:
        for gpu in w.gpus:
            if gpu.uuid == uuid:
                span.add(gpu, items=w.items, calls=w.calls, busy_s=w.busy_s, unit=w.unit)
    return span


def run_span(run: ProgramRun, device: Device, whole: Measurement, busy_s: float) -> Span:
    """One GPU's figures over a program's whole run: on the sim, the whole-run window its API
    kept where it used the API (it saw every charged call); else the trial's own meter."""
    report, uuid = run.report, device.identity.uuid
    if device.identity.backend == "sim" and report.run is not None:
        span = window_span([report.run], uuid)
        if span.time_s > 0 or span.calls:
            return span
    span = Span()
    span.add(program.gpu_energy(device, whole), calls=report.calls, busy_s=busy_s + report.busy_s)
    return span


# --- the result against the reference -----------------------------------------------------------
@dataclass(frozen=True)
class ResultCheck:
    """A result compared with the reference result."""

    ok: bool
    rel_error: float | None = None
    max_abs_error: float | None = None
    nonfinite: int = 0
    compared: int = 0
    reason: str | None = None


def _entries(value: Any) -> dict[str, Any]:
    return {str(k): v for k, v in value.items()} if isinstance(value, dict) else {"": value}


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def compare_results(value: Any, reference: Any, rtol: float, atol: float) -> ResultCheck:
    """Each entry of ``value`` (a number or a map) against ``reference``'s: numbers within
    ``atol + rtol * |ref|`` and finite, anything else equal."""
    got, want = _entries(value), _entries(reference)
    nonfinite = sum(1 for v in got.values() if _number(v) and not math.isfinite(v))
    rel = abs_err = 0.0
    failures: list[str] = []
    for key, ref in want.items():
        shown = key or "result"
        if key not in got:
            failures.append(f"{shown} missing")
            continue
        v = got[key]
        if _number(ref) and _number(v):
            diff = abs(v - ref) if math.isfinite(v) else math.inf
            abs_err = max(abs_err, diff)
            rel = max(rel, diff / abs(ref) if ref else (0.0 if diff == 0 else math.inf))
            if not diff <= atol + rtol * abs(ref):
                failures.append(f"{shown}={v:.6g} (default setting: {ref:.6g})")
        elif v != ref:
            failures.append(f"{shown}={v!r} (default setting: {ref!r})")
    if nonfinite and not failures:
        failures.append(f"{nonfinite} non-finite value(s)")
    reason = None
    if failures:
        reason = (f"the result moved past workload.result_rtol={rtol:g}, result_atol={atol:g}: "
                  + "; ".join(failures[:5]))
    return ResultCheck(not failures, rel, abs_err, nonfinite, len(want), reason)


# --- the trial ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Reference:
    """The program's run at the device's default setting: its result, or why it failed."""

    failure: str | None
    result: Any = None
    has_result: bool = False


_references: dict[str, Reference] = {}  # per process: the program (and GPU) -> its reference


def _reference_key(job: JobSpec, uuid: str) -> str:
    w = job.config.workload
    return json.dumps([program_argv(w.argv or ()), w.cwd, dict(w.env or {}),
                       float(w.sim_scale), uuid], sort_keys=True, default=str)


def _as_reference(run: ProgramRun) -> Reference:
    failure = run.failure
    if failure is not None:
        return Reference(f"the program {failure} at the device's default setting (its "
                         f"reference run){_tail_note(run)}")
    return Reference(None, run.report.result, run.report.has_result)


def _tail_note(run: ProgramRun) -> str:
    return f"\n{run.output_tail}" if run.output_tail else ""


@dataclass
class _Measured:
    run: ProgramRun
    span: Span
    temperature_start_c: float
    temperature_c: float
    note: str | None = None  # how the span was measured, where a row must say it


def measure_program(ctx: TrialContext, job: JobSpec, base: dict[str, Any],
                    rows: list[dict[str, Any]], phases: dict[str, float]) -> None:
    """A program's trial inside ``trial.run_trial`` (which makes its base row, asks the GPU's
    health, fails its rows on an exception and restores the setting, as for a kernel): the
    reference (where needed), the setting, then one run and one row per repeat (the module
    docstring says what a row holds)."""
    device = ctx.device
    key = _reference_key(job, device.identity.uuid)
    reference = _references.get(key)
    if reference is None and not job.request.is_default:
        with timed(phases, "compare"):  # at the device's own setting, before the trial's
            reference = _references[key] = _as_reference(_run_once(device, job.config).run)
    with timed(phases, "settings"):
        ctx.guard.apply(job.request)
        device.idle(job.config.measure.settle_s)
    if ctx.on_kernel_calls is not None:
        ctx.on_kernel_calls()
    for repeat in range(job.repeats):
        row = dict(base, repeat=repeat, started_at=time.time())
        rows.append(row)
        wall = time.perf_counter()
        measured = _run_once(device, job.config)
        row["phase_window_s"] = time.perf_counter() - wall
        if reference is None:  # the default setting: this run is the reference
            reference = _references[key] = _as_reference(measured.run)
        fill_program_row(row, measured, reference, job)


def _run_once(device: Device, cfg: DvfsConfig) -> _Measured:
    """Run the program once on ``device`` as ``cfg`` says, metered around it in one call of the
    meter (``meter.metered``); on the sim, a program that never used the API is charged as busy
    for its wall time. A run needs the trial's device and config and nothing else of the trial
    (not its guard, kernel cache or job), as :func:`_run_charged` within it."""
    m = cfg.measure
    start_c = float(device.temperature_c())
    (run, busy_s), whole = metered(device, lambda meter: _run_charged(device, cfg, meter),
                                   method=m.meter, poll_hz=m.poll_hz)
    note = None
    if busy_s:
        note = (f"the program charged the simulated GPU nothing (it never used the dvfs API): "
                f"charged as busy for its wall time, {busy_s:.2f} s")
    elif run.report.busy_s:
        note = (f"the program charged the simulated GPU no step for {run.report.busy_s:.2f} s "
                "of its run (windows, or a run, in which it charged nothing): charged as busy "
                "for that wall time")
    return _Measured(run, run_span(run, device, whole, busy_s), start_c,
                     float(device.temperature_c()), note)


def _run_charged(device: Device, cfg: DvfsConfig, meter: EnergyMeter) -> tuple[ProgramRun, float]:
    """One run of the program under the trial's meter, and the busy seconds the sim was charged
    for it (:func:`charge_undeclared`); a Ctrl-C that stopped it is raised again, uncharged."""
    run = run_program(cfg.workload.argv or (), cwd=cfg.workload.cwd,
                      env=program_env(device, cfg, [device.identity.uuid]),
                      timeout_s=cfg.workload.timeout_s)
    if run.stopped_by is not None:
        raise run.stopped_by
    return run, charge_undeclared(run, [device], [meter])


def charge_undeclared(run: ProgramRun, devices: Sequence[Device],
                      meters: Sequence[EnergyMeter]) -> float:
    """On the sim, a run that never used the API (nothing told the sim of its work) is charged
    as busy for its wall time, in pieces the meters see; returns the seconds charged."""
    if run.report.started or not devices or devices[0].identity.backend != "sim":
        return 0.0
    pieces = max(1, math.ceil(run.wall_s / program.BUSY_CHUNK_S))
    for _ in range(pieces):
        for device in devices:
            device.charge_busy(run.wall_s / pieces)
        for meter in meters:
            meter.tick()
    return run.wall_s


def fill_program_row(row: dict[str, Any], measured: _Measured, reference: Reference | None,
                     job: JobSpec) -> None:
    """A program's row: its figures (:func:`fill_span`), its verdict and its result."""
    run = measured.run
    chosen = chosen_windows(run.report, job.config.workload.window)
    status, error, check = judge(run, reference, job)  # the run's own verdict, before its row
    span = window_span(chosen, row["device_uuid"]) if chosen else measured.span
    fill_span(row, span, job)
    fill_run(row, run, chosen or ([run.report.run] if run.report.run else []))
    fill_work(row, run.report, measured.note)
    row.update(temperature_start_c=measured.temperature_start_c,
               temperature_c=measured.temperature_c, ended_at=time.time())
    row.update(status=status, failed_by=failed_by(status), error=error,
               reference_result=None if reference is None else reference.result)
    if check is not None:
        row.update(rel_error=check.rel_error, max_abs_error=check.max_abs_error,
                   nonfinite_count=check.nonfinite, outputs_compared=check.compared)
    if status in (Status.CRASH, Status.TIMEOUT):
        row["valid"] = False


def fill_span(row: dict[str, Any], span: Span, job: JobSpec | None) -> None:
    """Time, energy, power, clocks, rates and validity of a span (``job`` None: no validity
    verdict, as for ``dvfs monitor``'s rows, which ask for no setting)."""
    n = span.calls or 1  # a program that charges no step is one iteration
    t, energy, items = span.time_s, span.energy_j, span.items
    row.update(
        iterations=n, time_s=t, time_per_iter_s=t / n, throughput=n / t if t > 0 else None,
        energy_j=energy, energy_per_iter_j=None if energy is None else energy / n,
        avg_power_w=span.avg_power_w, peak_power_w=span.peak_power_w,
        observed_sm_clock_mhz=span.mean_sm_clock_mhz, throttle_reasons=sorted(span.reason_names),
        meter=span.method, energy_counter_updates=span.counter_updates,
        energy_counter_period_s=span.counter_period_s,
        window_aligned=False if span.method == "counter" else None,
        items=items, rate_unit=f"{span.unit}/s",
        rate=items / t if items is not None and t > 0 else None,
        items_per_call=round(items / span.calls) if items and span.calls else None,
        energy_per_item_j=energy / items if energy is not None and items else None,
        checked_iters=n,
    )
    if energy is None:
        row["energy_note"] = span.energy_note or "no energy sensor"
    if job is not None:
        reason = validity(span, job.request, job.config.measure)
        row.update(valid=reason is None, invalid_reason=reason)


def fill_run(row: dict[str, Any], run: ProgramRun, windows: Sequence[program.Window]) -> None:
    """The run itself: exit status, wall time, result, and the windows the row sums."""
    row.update(
        exit_code=run.exit_code, program_wall_s=run.wall_s,
        result=run.report.result if run.report.has_result else None,
        program_windows=[
            {"name": w.name, "time_s": w.time_s, "energy_j": w.energy_j, "items": w.items,
             "calls": w.calls, "busy_s": w.busy_s} for w in windows],
    )


def fill_work(row: dict[str, Any], report: program.ProgramReport, note: str | None) -> None:
    """What the sim was charged per call (the first step the program charged), and how."""
    work = report.works[0] if report.works else None
    notes = [n for n in (note, work.get("note") if work else None) if n]
    if len(report.works) > 1:
        notes.append("steps charged: " + ", ".join(str(w.get("name")) for w in report.works))
    row.update(
        charged_flops=work.get("flops") if work else None,
        charged_bytes=work.get("bytes_moved") if work else None,
        charged_launches=work.get("launches") if work else None,
        charged_transcendentals=work.get("transcendentals") if work else None,
        work_kind=work.get("work_kind") if work else None,
        work_source=(work.get("source") if work else None) or (BUSY_MARK if note else None),
        work_note="; ".join(notes) or None,
    )


def judge(run: ProgramRun, reference: Reference | None,
          job: JobSpec) -> tuple[str, str | None, ResultCheck | None]:
    """The row's status, its error, and the result's check (None: nothing compared)."""
    failure = run.failure
    if run.timed_out:
        return Status.TIMEOUT, (f"the program ran past workload.timeout_s="
                                f"{job.config.workload.timeout_s:g} s and was stopped"
                                f"{_tail_note(run)}"), None
    if failure is not None:
        return Status.CRASH, f"the program {failure}{_tail_note(run)}", None
    if reference is None or reference.failure is not None:
        return Status.CRASH, reference.failure if reference else "no reference run", None
    if not reference.has_result:
        return Status.OK, None, None
    if not run.report.has_result:
        return Status.WRONG, "the program reported no result (it did at the default setting)", None
    w = job.config.workload
    check = compare_results(run.report.result, reference.result, w.result_rtol, w.result_atol)
    return (Status.OK if check.ok else Status.WRONG), check.reason, check
