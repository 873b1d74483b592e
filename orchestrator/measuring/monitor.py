"""``dvfs monitor [OVERRIDES] -- CMD ...``: a command measured as it runs, at the settings it finds.

Observe-only: nothing is set, so nothing is restored (no guard, no journal entry); a setting
asked for (``device.sm_clock_mhz=...``) is refused in one line, exit code 2, before anything
runs. The command runs as a trial's program does (``orchestrator.measuring.command``: its own
process group, ``python`` the Python dvfs runs on, its windows and result through the ``dvfs``
API read back), while one meter per GPU (``device.gpus``, or every GPU of the backend: a real
GPU where NVML finds one, else the simulated one) measures its whole run. On the simulated GPU
the virtual clock moves with what the command charges; a command that never uses the API is
charged as busy for its wall time, and its row says so.

Then it prints, per GPU, the time, the energy and the average power, and stores one row per GPU
(workload ``command``, named for the script; ``exit_code``, ``program_wall_s``, its windows and
its result) in ``store_dir`` (default ``outputs/monitor/<date>/<time>``), which ``dvfs report``
reads. Its status is ``ok``, ``crash`` (a non-zero exit: its output's tail is the error) or
``interrupted``: a Ctrl-C (or SIGTERM) stops the command with SIGINT to its process group and
the row of what ran until then is kept. ``dvfs monitor`` exits with the command's status
(128 + the signal for one killed by a signal; 130 after a Ctrl-C).
"""

from __future__ import annotations

import hashlib
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from orchestrator import interrupt
from orchestrator.errors import UserError
from orchestrator.jobs.job import JobSpec, record_sweep
from orchestrator.measuring import command
from orchestrator.measuring.meter import EnergyMeter
from orchestrator.results.rows import Status, base_row, failed_by

USAGE = """\
usage: dvfs monitor [OVERRIDES...] -- COMMAND [ARG...]

Run COMMAND at the GPUs' current settings (observe-only: nothing is set), print its time,
energy and average power per GPU, and store one row per GPU (dvfs report reads the store).

  dvfs monitor -- python train.py --epochs 3
  dvfs monitor device=sim workload.sim_scale=1024 -- python examples/train_mlp.py
  dvfs monitor store_dir=runs/baseline workload.label=baseline -- ./run.sh

OVERRIDES are dvfs sweep's (device=..., device.gpus=[0], measure.meter=..., store_dir=...,
workload.label=...); a setting (device.sm_clock_mhz=...) is refused.
"""


def split_command(rest: list[str]) -> tuple[list[str], list[str]]:
    """``[OVERRIDES...] -- COMMAND...`` split in two.

    Raises:
        UserError: no ``--``, or nothing after it.
    """
    if "--" not in rest:
        raise UserError("dvfs monitor needs the command after --: "
                        "dvfs monitor [OVERRIDES] -- python train.py")
    at = rest.index("--")
    if not rest[at + 1:]:
        raise UserError("dvfs monitor: no command after --")
    return rest[:at], rest[at + 1:]


def monitor_job(overrides: list[str], argv: list[str]) -> tuple[JobSpec, str | None]:
    """The job a monitored run is stored as (observe-only; validated, nothing touched), and
    the note of a fallback to the simulated GPU.

    Raises:
        UserError: a bad override, a setting asked for, a command that cannot start.
    """
    from orchestrator.config import SETTINGS_KEYS, compose
    from orchestrator.devices import backend_overrides

    overrides, note = backend_overrides(overrides)
    cfg = compose(["workload=command", *overrides, "device.observe_only=true"])
    asked = [f"device.{k}" for k in SETTINGS_KEYS if cfg.device[k] is not None]
    if asked:
        raise UserError(f"dvfs monitor sets nothing (it measures the command at the current "
                        f"settings): drop {', '.join(asked)}, or use dvfs sweep")
    cfg.workload.argv = list(argv)
    default_dir = None
    if not cfg.store_dir:
        default_dir = Path("outputs") / "monitor" / time.strftime("%Y-%m-%d/%H-%M-%S")
    return JobSpec.from_config(cfg, default_dir), note


def main(rest: list[str]) -> int:
    """``dvfs monitor``; returns the command's exit status (the CLI adds 130 after a Ctrl-C)."""
    if rest[:1] in (["-h"], ["--help"]):
        print(USAGE, end="")
        return 0
    overrides, argv = split_command(rest)
    job, note = monitor_job(overrides, argv)
    if note:
        print(note, file=sys.stderr)
    run = run_monitored(job)
    code = run.exit_code
    if code is None:
        return 127
    return 128 - code if code < 0 else code


def run_monitored(job: JobSpec) -> command.ProgramRun:
    """Run the job's command under one meter per GPU, its output passed through; store a row
    per GPU and print them (a Ctrl-C on the way is raised once they are)."""
    from orchestrator.devices import open_backend, select_devices
    from orchestrator.results.store import ResultStore

    cfg = job.config
    with open_backend(cfg.device) as backend, ResultStore(job.store_dir) as store:
        devices = select_devices(backend, cfg.device.gpus)
        meters = [EnergyMeter(d, method=cfg.measure.meter, poll_hz=cfg.measure.poll_hz)
                  for d in devices]
        try:
            start_c = [float(d.temperature_c()) for d in devices]
            for meter in meters:
                meter.arm()
                meter.start()
            run = command.run_program(
                cfg.workload.argv or (), cwd=cfg.workload.cwd, timeout_s=None, capture=False,
                env=command.program_env(devices[0], cfg, [d.identity.uuid for d in devices]))
            with interrupt.deferred():  # a second Ctrl-C now would lose the row
                busy_s = command.charge_undeclared(run, devices, meters)
                wholes = [m.stop(end_s=d.now_s()) for d, m in zip(devices, meters)]
                rows = [monitor_row(job, d, whole, run, busy_s, c)
                        for d, whole, c in zip(devices, wholes, start_c)]
                record_sweep(store, job)
                for row in rows:
                    store.put(row)
                print(summary(job, run, rows), flush=True)
        finally:
            for meter in meters:
                meter.close()
    return run


def monitor_row(job: JobSpec, device: Any, whole: Any, run: command.ProgramRun, busy_s: float,
                start_c: float) -> dict[str, Any]:
    """One GPU's row of a monitored run: its whole run, its windows, how it ended."""
    row = base_row(job, device.identity, sweep_id=job.sweep_id)
    started = time.time() - run.wall_s
    # an observation, not a trial to resume: every run is a row of its own
    row["trial_key"] = hashlib.sha256(
        f"{row['trial_key']}:{started!r}".encode()).hexdigest()[:24]
    command.fill_span(row, command.run_span(run, device, whole, busy_s), job)
    command.fill_run(row, run, run.report.windows)
    note = None if not busy_s else (
        f"the command charged the simulated GPU nothing (it never used the dvfs API): charged "
        f"as busy for its wall time, {busy_s:.2f} s")
    command.fill_work(row, run.report, note)
    status, error = Status.OK, None
    if run.stopped_by is not None:
        status, error = Status.INTERRUPTED, f"stopped by {run.stopped_by} after {run.wall_s:.1f} s"
    elif run.failure is not None:
        status, error = Status.CRASH, f"the command {run.failure}"
    row.update(status=status, failed_by=failed_by(status), error=error, started_at=started,
               ended_at=time.time(), phase_window_s=run.wall_s, wall_s=run.wall_s,
               temperature_start_c=start_c, temperature_c=float(device.temperature_c()))
    return row


def summary(job: JobSpec, run: command.ProgramRun, rows: list[dict[str, Any]]) -> str:
    """What a monitored run printed: how the command ended, each GPU's time, energy, power."""
    shown = " ".join(shlex.join(str(a) for a in job.config.workload.argv or ()).split())
    if len(shown) > 60:
        shown = shown[:57] + "..."
    lines = [f"dvfs monitor: {shown} {run.failure or 'exited 0'} after {run.wall_s:.2f} s"]
    for row in rows:
        clock = " (simulated GPU time)" if row["backend"] == "sim" else ""
        energy = ("no energy reading: " + str(row.get("energy_note"))) if row["energy_j"] is None \
            else f"{row['energy_j']:.4g} J, {row['avg_power_w']:.4g} W average"
        lines.append(f"  gpu{row['device_index']} {row['device_name']}: "
                     f"{row['time_s']:.3f} s{clock}, {energy}")
    lines.append(f"dvfs monitor: {len(rows)} row(s) in {job.store_dir} "
                 f"(dvfs report {job.store_dir})")
    return "\n".join(lines)
