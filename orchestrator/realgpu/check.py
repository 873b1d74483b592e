"""``dvfs check``: everything this project needs from a real GPU, measured in one observe-only
command of under five minutes, for the short leases real GPUs come in.

It opens one GPU through the same guard a sweep uses, in observe-only mode (``device.observe_only
=true`` is forced: nothing is ever set, and a setting asked for is refused in one line), and runs
three sections, each within what is left of ``--budget-s`` (285 s); a failing section is recorded
and the others still run:

- ``identity``: NVML name, UUID, PCI bus id, driver, architecture, supported clocks, power-limit
  range and one reading of every sensor (read-only queries through the NVML adapter);
- ``readings``: the energy counter's update period and each power reading's update period and
  semantics (instant or averaged), idle, under a JAX GEMM called back to back in a thread, and
  right after it stops (``orchestrator/realgpu/readings.py``);
- ``trials``: every workload at the device's preset (``gpu`` on a GPU) and the bfloat16 GEMM, in
  every framework this Python can import, as real trials (``run_trial``, one window each) stored
  in ``trials.sqlite``: ``dvfs report`` reads it, ``dvfs calibrate`` fits a profile from it. Each
  row says where its wall time went (``wall_s`` against ``phase_window_s``), and the board's
  simulated profile, where one is shipped, gives its steady-state figure beside each real one
  (``calibration.compare_real``: where they disagree, the sim is wrong).

It writes five files into ``--out`` (``check.json``, ``check.md``, ``trials.sqlite``, and the
same rows as a ``data/measured/`` run: ``rows.jsonl``, ``provenance.yaml``) and needs
neither Ray nor TensorFlow: on a GPU machine whose Python has JAX, nvidia-ml-py, pandas, pyarrow and
matplotlib, the pure-Python wheels :func:`lease_wheels` prepares (Hydra, OmegaConf, ANTLR's
runtime) are all it adds. ``device=sim`` runs it all over the simulated GPU (virtual time).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import platform
import time
import traceback
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orchestrator.devices import Device
    from orchestrator.measuring.trial import TrialContext

SECTIONS = ("identity", "readings", "trials")
KERNELS = ("stencil", "gemm", "selu", "conv3d", "mlp_train", "hessian")
BUDGET_S = 285.0  # the whole check, under five minutes with the start-up
TRIAL_RESERVE_S = 20.0  # no new trial starts with less than this left
FILES = ("check.json", "check.md", "trials.sqlite", "rows.jsonl", "provenance.yaml")
LEASE_REQUIREMENTS = ("hydra-core", "omegaconf", "antlr4-python3-runtime")
"""What a lent GPU's image lacks of what ``dvfs check`` imports: pure-Python distributions."""
LEASE_PYTHON = "3.12"


@dataclass
class CheckOptions:
    """What to check, where to write it and how long it may take."""

    out: Path
    overrides: list[str] = field(default_factory=list)  # Hydra overrides: device=sim ...
    sections: tuple[str, ...] = SECTIONS
    workloads: tuple[str, ...] = KERNELS
    window_s: float = 1.0
    counter_s: float = 2.5  # energy-counter polling per phase
    poll_s: float = 0.001
    power_s: float = 2.0  # power sampling per phase
    power_hz: float = 100.0
    load_ramp_s: float = 1.0  # a real load runs this long before its phase is measured
    budget_s: float = BUDGET_S
    started: float = field(default_factory=time.monotonic)

    def left_s(self) -> float:
        """Seconds left of the budget."""
        return self.budget_s - (time.monotonic() - self.started)


def frameworks_present() -> tuple[str, ...]:
    """The frameworks this Python can import (found, not imported: TensorFlow takes ~10 s)."""
    from kernels.frameworks import FRAMEWORK_MODULES, FRAMEWORKS

    present = []
    for name in FRAMEWORKS:
        with contextlib.suppress(ImportError, ValueError):
            if importlib.util.find_spec(FRAMEWORK_MODULES[name]) is not None:
                present.append(name)
    return tuple(present)


def trial_plan(workloads: tuple[str, ...], frameworks: tuple[str, ...]) -> list[tuple[str, ...]]:
    """(workload, framework, dtype) of every trial, most wanted first: each framework's
    workloads in float32, then its bfloat16 GEMM."""
    plan: list[tuple[str, ...]] = []
    for framework in frameworks:
        plan += [(w, framework, "float32") for w in workloads]
        plan.append(("gemm", framework, "bfloat16"))
    return plan


# --- sections -----------------------------------------------------------------------------------
def read_identity(device: Device) -> dict:
    """NVML identity, what may be set (read, never set) and one reading of every sensor."""
    ident, caps, settings = device.identity, device.capabilities(), device.settings()
    sm_mhz = caps.supported_sm_clocks_mhz()
    sensing = caps.power_sensing
    return {
        "index": ident.index, "name": ident.name, "uuid": ident.uuid,
        "pci_bus_id": ident.pci_bus_id, "driver_version": ident.driver_version,
        "architecture": ident.architecture, "backend": ident.backend,
        "mem_clocks_mhz": sorted(caps.mem_clocks_mhz), "sm_clocks_count": len(sm_mhz),
        "sm_clock_range_mhz": [sm_mhz[0], sm_mhz[-1]] if sm_mhz else None,
        "power_limit_min_w": caps.power_limit_min_w, "power_limit_max_w": caps.power_limit_max_w,
        "power_limit_default_w": caps.power_limit_default_w,
        "power_limit_w": settings.power_limit_w,
        "clock_offset_range_mhz": caps.clock_offset_range_mhz,
        "has_energy_counter": caps.has_energy_counter,
        "power_sensing": None if sensing is None else {
            "instant_reading": sensing.reading, "period_s": sensing.period_s,
            "window_s": sensing.window_s, "note": sensing.note,
        },
        "temperature_c": device.temperature_c(), "sm_clock_mhz": device.sm_clock_mhz(),
        "mem_clock_mhz": device.mem_clock_mhz(),
        "clock_event_reasons": device.clock_event_reasons().names(),
    }


def observe_readings(ctx: TrialContext, opts: CheckOptions) -> dict:
    """The counter's and the power readings' behaviour: idle, under a GEMM, just after it."""
    from kernels import KernelOptions
    from orchestrator.realgpu import readings as r
    device = ctx.device
    problems: list[str] = []
    phases: dict[str, dict] = {"energy_counter": {}, "power": {}}

    def measure_in(phase: r.Phase, after_step: bool = False) -> None:
        if not after_step:
            phases["energy_counter"][phase.name] = r.measure_counter_period(
                device, phase, opts.counter_s, opts.poll_s)
        phases["power"][phase.name] = r.sample_power(
            device, phase, opts.power_s, opts.power_hz, after_step=after_step)
        if not phase.alive():
            problems.append(f"{phase.name}: the load stopped early")

    measure_in(r.idle_phase(device))
    if device.identity.backend == "sim":
        load = r.simulated_load(device, "gemm")
    else:
        kernel = ctx.kernels.get(KernelOptions("gemm", framework="jax", preset="gpu"))
        load = r.kernel_thread_load(kernel, opts.load_ramp_s)
    with load as phase:
        measure_in(phase)
    measure_in(r.Phase("after_load", device.idle, "the load just ended: power falls to idle"),
               after_step=True)
    return {"phases": phases, "problems": problems}


def run_trials(ctx: TrialContext, opts: CheckOptions, frameworks: tuple[str, ...]) -> dict:
    """Every planned trial that fits the budget, stored; rows summarised beside the sim's."""
    from orchestrator.config import compose
    from orchestrator.jobs.job import JobSpec, record_sweep
    from orchestrator.measuring.trial import run_trial
    from orchestrator.results.store import ResultStore

    rows: list[dict] = []
    skipped: list[str] = []
    with ResultStore(opts.out) as store:
        for workload, framework, dtype in trial_plan(opts.workloads, frameworks):
            if opts.left_s() < TRIAL_RESERVE_S:
                skipped.append(f"{workload}/{framework}/{dtype}")
                continue
            cfg = compose([*opts.overrides, "device.observe_only=true", f"workload={workload}",
                           f"framework={framework}", f"workload.dtype={dtype}",
                           f"measure.window_s={opts.window_s}", "quiet=true",
                           f"store_dir={opts.out}"])
            job = JobSpec.from_config(cfg)
            if not rows:
                record_sweep(store, job)
            for row in run_trial(ctx, job):
                store.put(row)
                rows.append(row)
    problems = [f"out of time, not run: {', '.join(skipped)}"] if skipped else []
    problems += [f"{r['workload']}/{r['framework']}/{r['dtype']}: {r['status']}: "
                 f"{(r.get('error') or '').splitlines()[0] if r.get('error') else ''}"
                 for r in rows if r["status"] not in ("ok", "wrong", "nondeterministic")]
    return {"rows": [trial_summary(r) for r in rows], "beside_sim": beside_sim(rows),
            "problems": problems}


TRIAL_FIELDS = (
    "workload", "framework", "dtype", "status", "iterations", "time_per_iter_s", "rate",
    "rate_unit", "energy_per_iter_j", "avg_power_w", "observed_sm_clock_mhz", "temperature_c",
    "rel_error", "determinism_mismatches", "valid", "invalid_reason", "wall_s", "phase_build_s",
    "phase_window_s", "phase_check_run_s", "phase_compare_s", "bytes_to_host", "error",
)


def trial_summary(row: dict) -> dict:
    """What the summary shows of a row, and its wall time over its window and check run."""
    out = {k: row.get(k) for k in TRIAL_FIELDS}
    physical = (row.get("phase_window_s") or 0) + (row.get("phase_check_run_s") or 0)
    out["wall_over_window"] = row["wall_s"] / physical if physical and row.get("wall_s") else None
    return out


def board_profile(name: str) -> str | None:
    """The shipped simulated profile of a board, by its NVML name (None: none is shipped)."""
    from orchestrator.devices.sim.profile import available_profiles, load_profile

    for profile in available_profiles():
        if load_profile(profile).name == name:
            return profile
    return None


def beside_sim(rows: list[dict]) -> dict:
    """Each ok row beside the sim's steady state for its work on the board's profile."""
    from kernels.registry import WORKLOADS
    from orchestrator.devices.sim.calibration import compare_real
    from orchestrator.devices.sim.profile import load_profile

    ok = [r for r in rows if r["status"] == "ok" and r.get("avg_power_w")]
    profile_name = board_profile(ok[0]["device_name"]) if ok else None
    if profile_name is None:
        return {"profile": None, "rows": []}
    profile = load_profile(profile_name)
    out = []
    for row in ok:
        c = compare_real(profile, row, WORKLOADS[row["workload"]].peak(
            row["dtype"], row["precision"], row.get("framework")))
        out.append({"workload": row["workload"], "framework": row["framework"],
                    "dtype": row["dtype"], **{figure: list(getattr(c, figure)) for figure in
                                              ("ms_per_iter", "power_w", "j_per_iter",
                                               "sm_clock_mhz")}})
    return {"profile": profile_name, "rows": out}


# --- running -------------------------------------------------------------------------------------
def run_section(fn: Callable[[], dict]) -> dict:
    """Run one section; its result, never its exception (a failed section is a result)."""
    start = time.monotonic()
    try:
        data = fn()
    except Exception as e:  # noqa: BLE001 - one section's failure stops no other
        return {"status": "failed", "elapsed_s": time.monotonic() - start,
                "error": f"{type(e).__name__}: {e}",
                "traceback": "".join(traceback.format_exception(e, limit=8)), "data": None}
    problems = list(data.pop("problems", []))
    return {"status": "partial" if problems else "ok", "elapsed_s": time.monotonic() - start,
            "problems": problems, "data": data}


def run_check(opts: CheckOptions) -> dict:
    """Open the GPU observe-only, run every section asked for, return the report."""
    from orchestrator.config import compose, validate_static
    from orchestrator.measuring.session import GpuSession
    from orchestrator.results.provenance import git_commit, library_versions

    cfg = compose([*opts.overrides, "device.observe_only=true"])
    validate_static(cfg)
    started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    frameworks = frameworks_present()
    sections: dict[str, dict] = {}
    with GpuSession() as session:
        ctx = session.context(cfg.device, sweep_id="dvfs-check")  # no GPU: one line, exit 2
        opts.out.mkdir(parents=True, exist_ok=True)
        runs = {"identity": lambda: read_identity(ctx.device),
                "readings": lambda: observe_readings(ctx, opts),
                "trials": lambda: run_trials(ctx, opts, frameworks)}
        for name in SECTIONS:
            skip = "not asked for" if name not in opts.sections else None
            if skip is None and opts.left_s() < TRIAL_RESERVE_S:
                skip = f"no time left of the {opts.budget_s:.0f} s budget"
            sections[name] = (run_section(runs[name]) if skip is None
                              else {"status": "skipped", "error": skip, "data": None})
        ident = ctx.device.identity
    return {
        "tool": "dvfs check", "observe_only": True, "started_at": started_at,
        "elapsed_s": time.monotonic() - opts.started, "host": platform.node(),
        "python": platform.python_version(), "frameworks": list(frameworks),
        "versions": {k: v for f in (None, *frameworks) for k, v in library_versions(f).items()},
        "git_commit": git_commit(),
        "device": {"backend": ident.backend, "name": ident.name, "uuid": ident.uuid},
        "sections": sections,
    }


def write_measured(report: dict, out: Path, command: str) -> None:
    """The trials as a real-measurement run (``orchestrator.realgpu.measured``): ``rows.jsonl``
    (every stored row) and ``provenance.yaml``, so ``out`` can be committed under ``data/measured/``
    as it is, and ``scripts/sim_vs_real.py`` and ``dvfs calibrate`` read it."""
    import json

    import yaml

    from orchestrator.realgpu.check_summary import clean
    from orchestrator.results.store import ResultStore

    if not (out / "trials.sqlite").is_file():
        return
    with ResultStore(out) as store:  # as the writer it was: closing leaves no -wal, -shm files
        rows = store.rows()
    (out / "rows.jsonl").write_text("".join(json.dumps(clean(r)) + "\n" for r in rows))
    ident = (report["sections"]["identity"].get("data") or {})
    versions = report["versions"]
    provenance = {
        "board": report["device"]["name"], "profile": board_profile(report["device"]["name"]),
        "driver": ident.get("driver_version"), "backend": report["device"]["backend"],
        "libraries": {k: v for k, v in versions.items() if k in ("jax", "jaxlib", "tensorflow",
                                                                  "torch", "nvidia-ml-py",
                                                                  "numpy")},
        "frameworks": report["frameworks"], "python": report["python"],
        "preset": sorted({r.get("size") for r in rows if r.get("size")}),
        "window_s": sorted({(r.get("config") or {}).get("measure", {}).get("window_s")
                            for r in rows} - {None}),
        "date": report["started_at"][:10], "command": command, "host": report["host"],
        "observe_only": True, "rebuilt": False,
    }
    (out / "provenance.yaml").write_text(yaml.safe_dump(clean(provenance), sort_keys=False))


def lease_wheels(dest: Path, python_version: str = LEASE_PYTHON) -> list[Path]:
    """The pure-Python wheels a lent GPU's image lacks, for its Python, into ``dest``, and
    unpacked into ``dest/site`` (what the lease puts on ``PYTHONPATH``): each
    requirement at the version installed here, downloaded as a wheel for ``python_version``
    where one exists (``pip download --python-version``), else built from its source (ANTLR's
    runtime is published as a source archive only); each must be ``py3-none-any``.

    Raises:
        RuntimeError: pip failed, or a wheel is not pure Python.
    """
    import subprocess
    import sys
    from importlib.metadata import version

    dest.mkdir(parents=True, exist_ok=True)
    for name in LEASE_REQUIREMENTS:
        pin = f"{name}=={version(name)}"
        pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
        got = subprocess.run([*pip, "download", "--no-deps", "--only-binary=:all:",
                              "--python-version", python_version, "-d", str(dest), pin],
                             capture_output=True, text=True)
        if got.returncode != 0:
            got = subprocess.run([*pip, "wheel", "--no-deps", "-w", str(dest), pin],
                                 capture_output=True, text=True)
        if got.returncode != 0:
            raise RuntimeError(f"pip could not get {pin}: {got.stderr.strip()[-500:]}")
    wheels = sorted(dest.glob("*.whl"))
    impure = [w.name for w in wheels if not w.name.endswith("-py3-none-any.whl")]
    if impure:
        raise RuntimeError(f"not pure-Python wheels: {', '.join(impure)}")
    for wheel in wheels:  # a pure wheel unpacked is an importable tree, for any Python 3
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(dest / "site")
    return wheels


def main(argv: list[str]) -> int:
    """``dvfs check``; 0 when every section ran (ok or partial), 1 when one failed."""
    from orchestrator.realgpu.check_summary import write_summary

    parser = argparse.ArgumentParser(prog="dvfs check", description=__doc__.split("\n\n")[0])
    parser.add_argument("overrides", nargs="*", help="Hydra overrides (default device=nvml)")
    parser.add_argument("--out", type=Path, default=Path("dvfs_check"), help="output folder")
    parser.add_argument("--sections", default=",".join(SECTIONS), help="comma-separated")
    parser.add_argument("--workloads", default=",".join(KERNELS), help="comma-separated")
    parser.add_argument("--budget-s", type=float, default=BUDGET_S)
    parser.add_argument("--carry-wheels", "--lease-wheels", dest="lease_wheels", type=Path,
                        metavar="DIR", help="only put the wheels a machine without this "
                        "project's dependencies needs into DIR (unpacked into DIR/site), and stop")
    ns = parser.parse_args(argv)
    if ns.lease_wheels:
        for wheel in lease_wheels(ns.lease_wheels):
            print(wheel)
        return 0
    from kernels.registry import WORKLOADS
    from orchestrator.errors import UserError

    sections = tuple(s for s in ns.sections.split(",") if s)
    workloads = tuple(w for w in ns.workloads.split(",") if w)
    for what, asked, known in (("section", sections, SECTIONS), ("workload", workloads,
                                                                  tuple(WORKLOADS))):
        unknown = [a for a in asked if a not in known]
        if unknown:
            raise UserError(f"unknown {what}(s) {', '.join(unknown)}; known: {', '.join(known)}")
    overrides = list(ns.overrides)
    if not any(o.split("=", 1)[0] in ("device", "device.backend") for o in overrides):
        overrides.insert(0, "device=nvml")
    opts = CheckOptions(out=ns.out.resolve(), overrides=overrides,
                        sections=sections, workloads=workloads,
                        budget_s=ns.budget_s)
    report = run_check(opts)
    md = write_summary(report, opts.out)
    write_measured(report, opts.out, "dvfs check " + " ".join(argv))
    sections = report["sections"]
    print("dvfs check: " + ", ".join(f"{n} {s['status']}" for n, s in sections.items()))
    print(f"dvfs check: summary in {md}; trials in {opts.out / 'trials.sqlite'}")
    return 1 if any(s["status"] == "failed" for s in sections.values()) else 0
