"""``dvfs``: the command line.

    dvfs sweep [-m] [--yes] [OVERRIDES...] run one trial, or a grid with -m (Hydra multirun)
    dvfs devices [OVERRIDES...] [--json]   list the GPUs of a backend and what may be set
    dvfs restore [OVERRIDES...]            put back whatever a killed process left changed
    dvfs report DIR... [--out DIR]         plots, recommendations and thresholds of sweeps
    dvfs calibrate SOURCE... --profile BASE --out FILE
                                           a sim profile fitted to a real board's rows
    dvfs check [OVERRIDES...] [--out DIR]  everything needed from a real GPU, observe-only, < 5 min
    dvfs monitor [OVERRIDES...] -- CMD...  a command's time and energy per GPU, stored as a row
    dvfs --version                         the installed version (and the commit of a checkout)

``devices`` and ``restore`` take the same Hydra overrides as ``sweep`` (``device=sim
device.count=4``), so one vocabulary names a machine everywhere. Bad input is one line on stderr
and exit code 2; no traceback for a user's mistake. This module imports neither JAX, TensorFlow
nor Ray, so ``dvfs --help``, ``dvfs devices`` and ``dvfs report`` start fast.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from orchestrator.errors import DvfsError, UserError

if TYPE_CHECKING:
    from orchestrator.config import DeviceConfig
    from orchestrator.devices import Device

USAGE = """\
dvfs: GPU energy and stability experiments.

commands:
  sweep [-m] [--yes] [OVERRIDES...]
                                 run one trial, or a grid with -m (Hydra multirun syntax);
                                 --yes: run it even if it is expected to take more than
                                 hydra.sweeper.max_hours (24 h)
  devices [OVERRIDES...] [--json]
                                 list GPUs: identity, supported clocks, power-limit range, settings
  restore [OVERRIDES...]         restore devices a killed process left changed (from the journal)
  report DIR... [--out DIR]      energy Pareto fronts, optimal settings, thresholds, plots
  calibrate SOURCE... --profile BASE --out FILE [--anchors]
                                 fit a simulated GPU profile to a real board's measured rows
                                 (results stores or data/measured folders)
  check [OVERRIDES...] [--out DIR] [--carry-wheels DIR]
                                 one observe-only check of a GPU in under five minutes: its
                                 readings and every workload as trials (a store dvfs report reads)
  monitor [OVERRIDES...] -- COMMAND [ARG...]
                                 run a command at the current settings (observe-only): its time,
                                 energy and average power per GPU, stored as one row per GPU
  --version                      the installed version (and the git commit of a checkout)

examples:
  dvfs sweep -m workload=gemm,stencil framework=jax,tensorflow \\
      device.sm_clock_mhz=range(510,1411,150)
  dvfs devices device=sim device.count=4 --json
  dvfs report multirun/2026-12-02/15-00-00
  dvfs calibrate data/measured/2026-12-04_h200_gpu_check --profile h200_141gb --out h200.yaml
  dvfs monitor -- python examples/train_mlp.py --framework jax

`dvfs sweep --help` shows the configuration groups and every setting.
"""


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``dvfs`` console script; returns the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(USAGE, end="")
        return 0
    if args[0] in ("-V", "--version"):
        from orchestrator.results.provenance import git_commit, package_version

        commit = git_commit()
        print(f"dvfs {package_version()}" + (f" (git {commit[:12]})" if commit else ""))
        return 0
    command, rest = args[0], args[1:]
    commands = {"sweep": _sweep, "devices": _devices, "restore": _restore, "report": _report,
                "calibrate": _calibrate, "check": _check, "monitor": _monitor}
    if command not in commands:
        known = ", ".join(commands)
        print(f"dvfs: unknown command {command!r}; commands: {known}", file=sys.stderr)
        return 2
    from orchestrator import interrupt
    with interrupt.handling():
        try:
            code = commands[command](rest)
            interrupt.check()  # a signal whose KeyboardInterrupt Python dropped near the end
            return code
        except DvfsError as e:
            if interrupt.received():  # a signal mid-way, come out as another error
                return _interrupted(command)
            print(f"dvfs {command}: error: {e}", file=sys.stderr)
            return getattr(e, "exit_code", 1)
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM
            return _interrupted(command)


def _interrupted(command: str) -> int:
    """The one line and exit code (130 for Ctrl-C, 143 for SIGTERM) of an interrupted command:
    what was stopped and what was kept."""
    from orchestrator import interrupt
    how = "terminated (SIGTERM)" if interrupt.terminated() else "interrupted (Ctrl-C)"
    what = {
        "sweep": "; the trials in flight were stopped and not stored; every trial stored so "
        "far is kept: run the same command again to resume",
        "restore": "; run it again to finish putting the GPUs back (the journal still lists them)",
        "monitor": "; the command was stopped and its row kept (nothing was set: nothing to "
        "restore)",
    }
    print(f"dvfs {command}: {how}{what.get(command, '')}", file=sys.stderr)
    return interrupt.exit_code()


# --- sweep ------------------------------------------------------------------------------------
def _sweep(rest: list[str]) -> int:
    import os

    from orchestrator.app import run_sweep
    from orchestrator.launching.estimate import YES_ENV

    if "--yes" in rest:  # a sweep longer than hydra.sweeper.max_hours is meant
        rest = [a for a in rest if a != "--yes"]
        os.environ[YES_ENV] = "1"
    try:
        return run_sweep(rest)
    finally:
        if "orchestrator.launching.pool" in sys.modules:  # a sweep on Ray: end it here, not at exit
            from orchestrator.launching.pool import end_pool_and_ray

            end_pool_and_ray()


# --- devices ----------------------------------------------------------------------------------
def _split(rest: list[str], prog: str, description: str) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(prog=f"dvfs {prog}", description=description)
    parser.add_argument(
        "overrides", nargs="*", help="Hydra overrides, e.g. device=sim device.count=4"
    )
    if prog == "devices":
        parser.add_argument("--json", action="store_true", help="machine-readable output")
    ns = parser.parse_args(rest)  # argparse itself exits 2 on a bad flag
    return ns, ns.overrides


def _device_cfg(overrides: list[str]) -> tuple[DeviceConfig, str | None]:
    """The ``device`` config to use, and a note when we fell back to the simulated GPU."""
    from orchestrator.config import compose, validate_static
    from orchestrator.devices import backend_overrides

    overrides, note = backend_overrides(overrides)
    cfg = compose(overrides)
    validate_static(cfg)
    return cfg.device, note


def _devices(rest: list[str]) -> int:
    from orchestrator.devices import open_backend, select_devices

    ns, overrides = _split(rest, "devices", "List the GPUs of a backend and what may be set.")
    device_cfg, note = _device_cfg(overrides)
    with open_backend(device_cfg, join_existing=True) as backend:
        devices = select_devices(backend, device_cfg.gpus)
        listing = [_describe(d) for d in devices]
    if ns.json:
        listed = {"backend": device_cfg.backend, "note": note, "devices": listing}
        print(json.dumps(listed, indent=2))
        return 0
    if note:
        print(note)
    for d in listing:
        print(_format_device(d))
    if not listing:
        print("no GPUs")
    return 0


def _describe(device: Device) -> dict[str, Any]:
    caps = device.capabilities()
    clocks = caps.supported_sm_clocks_mhz() if caps.mem_clocks_mhz else ()  # device=cpu: none
    settings = device.settings()
    tele = device.telemetry()
    return {
        **asdict(device.identity),
        "sm_clock_min_mhz": clocks[0] if clocks else None,
        "sm_clock_max_mhz": clocks[-1] if clocks else None,
        "sm_clock_count": len(clocks),
        "mem_clocks_mhz": sorted(caps.mem_clocks_mhz),
        "power_limit_min_w": caps.power_limit_min_w,
        "power_limit_max_w": caps.power_limit_max_w,
        "power_limit_default_w": caps.power_limit_default_w,
        "clock_offset_range_mhz": (
            list(caps.clock_offset_range_mhz) if caps.clock_offset_range_mhz else None
        ),
        "has_energy_counter": caps.has_energy_counter,
        "has_power_sensor": caps.has_power_sensor,
        "energy_note": caps.energy_note,
        "power_limit_w": settings.power_limit_w,
        "clock_offset_mhz": settings.clock_offset_mhz,
        "sm_clock_mhz": tele.sm_clock_mhz,
        "mem_clock_mhz": tele.mem_clock_mhz,
        "power_w": tele.power_mw / 1000.0 if caps.has_power_sensor else None,
        "temperature_c": tele.temperature_c,
        "energy_j": None if tele.energy_mj is None else tele.energy_mj / 1000.0,
        "clock_event_reasons": tele.clock_event_reasons.names(),
    }


def _format_device(d: dict[str, Any]) -> str:
    if d["backend"] == "cpu":
        return _format_cpu(d)
    offset = d["clock_offset_range_mhz"]
    joules = d["energy_j"]
    energy = "no energy counter" if joules is None else f"energy counter {joules:.1f} J"
    lines = [
        f"[{d['index']}] {d['name']}  {d['uuid']}  pci {d['pci_bus_id']}  "
        f"({d['backend']}, driver {d['driver_version']}, {d['architecture']})",
        f"    SM clocks     {d['sm_clock_min_mhz']}-{d['sm_clock_max_mhz']} MHz "
        f"({d['sm_clock_count']} supported)"
        f"   memory {', '.join(map(str, d['mem_clocks_mhz']))} MHz",
        f"    power limit   {d['power_limit_min_w']:g}-{d['power_limit_max_w']:g} W "
        f"(default {d['power_limit_default_w']:g} W)"
        f"   clock offset {f'{offset[0]}..{offset[1]} MHz' if offset else 'unsupported'}",
        f"    now           SM {d['sm_clock_mhz']} MHz, memory {d['mem_clock_mhz']} MHz, "
        f"limit {d['power_limit_w']:g} W, {d['power_w']:.0f} W, {d['temperature_c']} C, {energy}",
    ]
    return "\n".join(lines)


def _format_cpu(d: dict[str, Any]) -> str:
    """The host CPU (``device=cpu``): identity, what it measures, nothing settable."""
    energy = (
        f"energy counter {d['energy_j']:.1f} J (RAPL)" if d["energy_j"] is not None
        else d["energy_note"] or "no energy counter"
    )
    temperature = f"{d['temperature_c']} C" if d["temperature_c"] else "no temperature sensor"
    return "\n".join([
        f"[{d['index']}] {d['name']}  {d['uuid']}  ({d['backend']}, kernel {d['driver_version']}, "
        f"{d['architecture']})",
        "    settings      none (the CPU is measured as it runs)",
        f"    now           {d['sm_clock_mhz']} MHz mean core clock, {temperature}, "
        f"no power sensor, {energy}",
    ])


# --- restore ----------------------------------------------------------------------------------
def _restore(rest: list[str]) -> int:
    from orchestrator.devices import journal_dir, open_backend
    from orchestrator.measuring.journal import Journal, restore_journal

    _, overrides = _split(rest, "restore", "Restore devices a killed process left changed.")
    device_cfg, _ = _device_cfg(overrides)
    directory = journal_dir(device_cfg)
    if not directory.exists() or not any(directory.glob("*.json")):
        print(f"nothing to restore (journal {directory} is empty)")
        return 0
    journal = Journal(directory)
    with open_backend(device_cfg, join_existing=True) as backend:
        actions = restore_journal(journal, lambda uuid: backend.device(uuid=uuid))
    for action in actions:
        print(action.describe())
    busy = [a for a in actions if a.skipped_reason]
    in_use = f", {len(busy)} in use" if busy else ""
    print(f"restored {len(actions) - len(busy)} device(s) from {directory}{in_use}")
    return 0


# --- report -----------------------------------------------------------------------------------
def _report(rest: list[str]) -> int:
    try:
        from analysis.report import main as report_main
    except ImportError as e:  # pragma: no cover - analysis ships with the package
        raise UserError(f"the analysis package is missing: {e}") from e
    return report_main(rest)


# --- calibrate --------------------------------------------------------------------------------
def _calibrate(rest: list[str]) -> int:
    from orchestrator.realgpu.calibrate import main as calibrate_main

    return calibrate_main(rest)


# --- check ------------------------------------------------------------------------------------
def _check(rest: list[str]) -> int:
    from orchestrator.realgpu.check import main as check_main

    return check_main(rest)


# --- monitor ----------------------------------------------------------------------------------
def _monitor(rest: list[str]) -> int:
    from orchestrator.measuring.monitor import main as monitor_main

    return monitor_main(rest)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
