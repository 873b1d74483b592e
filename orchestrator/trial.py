"""One trial: one device, one setting, one kernel, measured and checked.

The sequence, for each trial:

1. apply the requested settings through the guard (which has already refused anything outside
   the policy or the device's support);
2. settle: let the device sit idle for ``measure.settle_s`` so clocks and power follow the setting;
3. build the kernel (cached per process: the JIT compile happens once per GPU, never inside a
   window) and warm it up;
4. for each repeat, one window (``orchestrator/window.py``): queue calls asynchronously until both
   ``measure.window_s`` of device time and ``measure.min_iters`` calls have passed, starting and
   ending on energy-counter updates; then check: each checked call's on-device fingerprint
   (bitwise determinism) and a few sampled outputs against the float64 reference (always the
   last), from a check run right after the window (``measure.digest=after``, the default);
5. judge: correctness (``ok`` / ``wrong`` / ``nondeterministic``) and validity (did the device
   run at the clock asked for, which throttle reasons fired, did the window span enough
   energy-counter updates);
6. put the device back to its default setting (the guard restores it in any case).

On the simulated GPU the kernel really runs on the CPU, and the device's model accounts each call
at ``workload.sim_size`` (by default the ``gpu`` preset): the sim's clock, energy and roofline
describe the GPU-sized problem while the CPU computes a small one, so outputs and checks stay real
and fast. Each call is charged the work its framework compiled at that size
(``kernels.cost``: XLA's cost analysis for JAX and TF+XLA, one kernel per op for TF graphs), so
the frameworks differ in bytes moved and kernels launched; the row records it
(``charged_flops``, ``charged_bytes``, ``charged_launches``, ``work_source``, and ``work_note``
when a source failed and the analytic counts were charged). On other devices nothing is
charged, and the same columns record the compiled work at the size that ran. Faults the sim
draws below a device's stability threshold corrupt the real output (one flipped bit in one
element) or crash the call, so the checks see them as they would on hardware.
On ``device=cpu`` (the host measured as a device) time is wall time and energy comes from RAPL
where it can be read; where it cannot, the row measures time only and ``energy_note`` says why.

A failure inside a trial is a result, not an exception out of the sweep: a crash is a ``crash``
row, a lost device a ``device_error`` row. Before anything else a trial asks ``Device.health()``:
on a GPU that is lost, reported an XID or uncorrected ECC errors, or is at its slowdown
temperature, it runs nothing and returns ``device_error`` rows whose error names the GPU and why.
The answer is sticky per ``Device``, so the GPU takes no further trials in this process.
"""

from __future__ import annotations

import hashlib
import json
import platform
import socket
import subprocess
import time
import traceback
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from orchestrator.config import parse_sm_clock
from orchestrator.devices.base import Device, KernelWork
from orchestrator.errors import DeviceError, DeviceLostError, UserError
from orchestrator.guard import SettingsGuard, SettingsRequest
from orchestrator.window import Checks, KernelCalls, SimulatedCrash, Window, measure_window

SCHEMA_VERSION = 1

# Config keys that do not change what a trial measures (kept out of the trial key).
_NON_IDENTITY_KEYS = ("store_dir", "quiet", "objective")


def settings_request(device_cfg: Any) -> SettingsRequest:
    """The settings a trial's ``device`` config asks for."""
    return SettingsRequest(
        sm_clock_mhz=parse_sm_clock(device_cfg.sm_clock_mhz),
        mem_clock_mhz=None if device_cfg.mem_clock_mhz is None else int(device_cfg.mem_clock_mhz),
        power_limit_w=None if device_cfg.power_limit_w is None else float(device_cfg.power_limit_w),
        clock_offset_mhz=(
            None if device_cfg.clock_offset_mhz is None else int(device_cfg.clock_offset_mhz)
        ),
    )


def job_identity(cfg: dict[str, Any]) -> dict[str, Any]:
    """The part of a resolved job config that defines what is measured."""
    ident = {k: v for k, v in cfg.items() if k not in _NON_IDENTITY_KEYS}
    device = dict(ident.get("device", {}))
    for k in ("state_dir", "journal_dir", "gpus", "policy_file"):
        device.pop(k, None)
    ident["device"] = device
    return ident


def trial_key(cfg: dict[str, Any], device_uuid: str) -> str:
    """A stable key: hash of the resolved job config (what is measured) and the GPU's UUID."""
    blob = json.dumps({"job": job_identity(cfg), "uuid": device_uuid}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def config_hash(cfg: dict[str, Any]) -> str:
    """Hash of the job config alone (the same point on every GPU shares it)."""
    blob = json.dumps(job_identity(cfg), sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


@lru_cache(maxsize=1)
def git_commit() -> str | None:
    """The commit of the checkout this package runs from, if any."""
    root = Path(__file__).resolve().parents[1]
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def library_versions(framework: str | None = None) -> dict[str, str]:
    """Versions that matter for a result (the framework only if already imported)."""
    import importlib.metadata as md
    import sys

    versions = {"python": platform.python_version(), "dvfs-orchestrator": "0.1.0"}
    for dist in ("numpy", "nvidia-ml-py", "ray", "hydra-core"):
        try:
            versions[dist] = md.version(dist)
        except md.PackageNotFoundError:
            pass
    if framework == "jax" and "jax" in sys.modules:
        versions["jax"] = sys.modules["jax"].__version__
    if framework == "tensorflow" and "tensorflow" in sys.modules:
        versions["tensorflow"] = sys.modules["tensorflow"].__version__
    return versions


def validate_workload(cfg: Any) -> Any:
    """Check workload x framework x size x dtype x precision against the kernel registry."""
    from kernels import get_spec
    from kernels.spec import KernelOptionError

    if cfg.framework.name not in ("jax", "tensorflow"):
        raise UserError(f"framework={cfg.framework.name!r} is not one of: jax, tensorflow")
    try:
        spec = get_spec(cfg.workload.name)
        spec.validate(cfg.workload.size, cfg.workload.dtype, cfg.framework.precision)
        if cfg.workload.sim_size is not None:
            spec.validate(cfg.workload.sim_size, cfg.workload.dtype, cfg.framework.precision)
    except KernelOptionError as e:
        raise UserError(str(e)) from e
    return spec


@dataclass
class TrialContext:
    """What a process keeps across trials on one GPU: the guard and the compiled kernels."""

    device: Device
    guard: SettingsGuard
    kernels: Any  # kernels.KernelCache (or any object with the same get())
    sweep_id: str = ""
    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(0))


def run_trial(ctx: TrialContext, cfg: Any, resolved: dict[str, Any]) -> list[dict[str, Any]]:
    """Run one trial (all its repeats); always returns one row per repeat, never raises for
    a failure of the kernel or the device.

    Args:
        ctx: the GPU's guard and kernel cache.
        cfg: the job's config (DictConfig or DvfsConfig), already validated.
        resolved: the same config as a plain dict (stored beside each row).
    """
    device = ctx.device
    ident = device.identity
    spec = validate_workload(cfg)
    request = settings_request(cfg.device)
    key = trial_key(resolved, ident.uuid)
    m = cfg.measure
    base = _base_row(ctx, cfg, resolved, key, request)
    rows: list[dict[str, Any]] = []
    health = device.health()  # an unhealthy GPU takes no further trials (sticky per Device)
    if not health.ok:
        _fail_rows(rows, base, m.repeats, "device_error", f"not run: {health.reason}")
        return rows
    try:
        ctx.guard.apply(request)
        device.idle(m.settle_s)
        kernel = ctx.kernels.get(
            cfg.workload.name,
            framework=cfg.framework.name,
            preset=cfg.workload.size,
            dtype=cfg.workload.dtype,
            precision=cfg.framework.precision,
            seed=int(cfg.seed),
            xla=bool(cfg.framework.xla),
        )
        base["framework_version"] = kernel.framework_version
        base["versions"] = library_versions(cfg.framework.name)
        sim_sized = ident.backend == "sim" and bool(cfg.workload.sim_size)
        preset = cfg.workload.sim_size if sim_sized else cfg.workload.size
        # The analytic counts stay the useful work of a call (throughput, energy per TFLOP);
        # the compiled work is what the device is charged (on the sim) or what it ran.
        counts = spec.counts(preset=preset, dtype=cfg.workload.dtype)
        compiled = _compiled_work(kernel, counts, preset)
        base.update(
            charged_flops=compiled.flops,
            charged_bytes=compiled.bytes_moved,
            charged_launches=compiled.launches,
            work_source=compiled.source,
            work_note=compiled.note,
        )
        work = KernelWork(
            flops=float(compiled.flops),
            bytes_moved=float(compiled.bytes_moved),
            peak=spec.peak(cfg.workload.dtype, cfg.framework.precision),
            kernel_class=cfg.workload.name,
            framework=cfg.framework.name,
            launches=int(compiled.launches),
        )
        if m.warmup_iters:
            KernelCalls(kernel, device, work, None).run(m.warmup_iters)
        reference = kernel.reference()
        for repeat in range(m.repeats):
            row = dict(base, repeat=repeat, started_at=time.time())
            rows.append(row)
            window = measure_window(kernel, device, work, m, ctx.rng)
            _fill_measured(row, window, counts, cfg, request)
            if window.measurement.method == "none":
                row["energy_note"] = device.capabilities().energy_note or "no energy sensor"
            row["temperature_c"] = device.temperature_c()
            _fill_checks(row, window.checks, reference, cfg)
            row["ended_at"] = time.time()
    except SimulatedCrash as e:
        _fail_rows(rows, base, m.repeats, "crash", str(e))
    except DeviceLostError as e:
        _fail_rows(rows, base, m.repeats, "device_error", str(e))
        device.health()  # while it is still lost: the sticky answer retires the GPU
    except UserError:
        raise
    except DeviceError as e:
        _fail_rows(rows, base, m.repeats, "device_error", str(e))
    except Exception as e:  # noqa: BLE001 - a kernel that raised is a crashed trial, not a crashed sweep
        error = f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}"
        _fail_rows(rows, base, m.repeats, "crash", error)
    finally:
        try:
            ctx.guard.restore()
        except DeviceError as e:  # the journal keeps the entry; `dvfs restore` finishes the job
            for row in rows:
                row["error"] = (row.get("error") or "") + f" | restore failed: {e}"
    return rows


def _compiled_work(kernel: Any, counts: Any, preset: str) -> Any:
    """The kernel's compiled work at ``preset`` (``kernels.CompiledWork``); the analytic counts
    and one launch for a kernel that cannot say (a test's stand-in)."""
    from kernels.cost import CompiledWork

    hook = getattr(kernel, "compiled_work", None)
    if hook is not None:
        return hook(preset)
    return CompiledWork(
        float(counts.flops), float(counts.bytes_moved), 1, "analytic",
        note="the kernel reports no compiled work",
    )


def _base_row(
    ctx: TrialContext, cfg: Any, resolved: dict[str, Any], key: str, request: SettingsRequest
) -> dict[str, Any]:
    ident = ctx.device.identity
    sm = request.sm_clock_mhz
    return {
        "schema_version": SCHEMA_VERSION,
        "sweep_id": ctx.sweep_id,
        "trial_key": key,
        "repeat": 0,
        "host": socket.gethostname(),
        "started_at": time.time(),
        "ended_at": None,
        "device_index": ident.index,
        "device_uuid": ident.uuid,
        "device_name": ident.name,
        "driver_version": ident.driver_version,
        "backend": ident.backend,
        "framework": cfg.framework.name,
        "framework_version": None,
        "workload": cfg.workload.name,
        "size": cfg.workload.size,
        "sim_size": cfg.workload.sim_size if ident.backend == "sim" else None,
        "dtype": cfg.workload.dtype,
        "precision": cfg.framework.precision,
        "sm_clock_min_mhz": sm[0] if sm else None,
        "sm_clock_max_mhz": sm[1] if sm else None,
        "mem_clock_mhz": request.mem_clock_mhz,
        "power_limit_w": request.power_limit_w,
        "clock_offset_mhz": request.clock_offset_mhz,
        "default_setting": request.is_default,
        "observed_sm_clock_mhz": None,
        "avg_power_w": None,
        "peak_power_w": None,
        "temperature_c": None,
        "throttle_reasons": [],
        "iterations": None,
        "time_s": None,
        "time_per_iter_s": None,
        "throughput": None,
        "tflops": None,
        "gbps": None,
        "energy_j": None,
        "energy_per_iter_j": None,
        "energy_per_tflop_j": None,
        "energy_per_gb_j": None,
        "rel_error": None,
        "max_abs_error": None,
        "nonfinite_count": None,
        "determinism_mismatches": None,
        "status": None,
        "error": None,
        "valid": False,
        "invalid_reason": None,
        "meter": None,
        "energy_counter_updates": None,
        "energy_counter_period_s": None,
        "window_aligned": None,
        "energy_note": None,
        "charged_flops": None,
        "charged_bytes": None,
        "charged_launches": None,
        "work_source": None,
        "work_note": None,
        "digest": cfg.measure.digest,
        "checked_iters": None,
        "check_time_s": None,
        "config": resolved,
        "versions": library_versions(),
        "git_commit": git_commit(),
        "config_hash": config_hash(resolved),
    }


def _fill_measured(
    row: dict[str, Any], window: Window, counts: Any, cfg: Any, request: SettingsRequest
) -> None:
    meas = window.measurement
    n = window.iterations
    t = meas.time_s
    energy = meas.energy_j
    m = cfg.measure
    row.update(
        iterations=n,
        time_s=t,
        time_per_iter_s=t / n if n else None,
        throughput=n / t if t > 0 else None,
        energy_j=energy,
        energy_per_iter_j=energy / n if n and energy is not None else None,
        avg_power_w=meas.avg_power_w,
        peak_power_w=meas.peak_power_w,
        observed_sm_clock_mhz=meas.mean_sm_clock_mhz,
        throttle_reasons=meas.reasons.names(),
        meter=meas.method,
        energy_counter_updates=meas.counter_updates,
        energy_counter_period_s=meas.counter_period_s,
        window_aligned=window.aligned,
    )
    tflop = counts.flops * n / 1e12
    gb = counts.bytes_moved * n / 1e9
    if t > 0:
        row["tflops"] = tflop / t
        row["gbps"] = gb / t
    if energy is not None:
        row["energy_per_tflop_j"] = energy / tflop if tflop > 0 else None
        row["energy_per_gb_j"] = energy / gb if gb > 0 else None
    reasons = []
    asked = request.sm_clock_mhz
    observed = meas.mean_sm_clock_mhz
    if asked is not None and observed is not None and observed < asked[0] - m.clock_tolerance_mhz:
        ignored = ("applications_clocks_setting", "gpu_idle")
        fired = [r for r in meas.reasons.names() if r not in ignored]
        reasons.append(
            f"observed SM clock {observed:.0f} MHz is below the {asked[0]} MHz asked"
            + (f" ({', '.join(fired)})" if fired else "")
        )
    if meas.method == "counter" and (meas.counter_updates or 0) < m.min_counter_updates:
        reasons.append(
            f"the window spanned {meas.counter_updates} energy-counter updates "
            f"(< {m.min_counter_updates}): lengthen measure.window_s"
        )
    thermal = [r for r in meas.reasons.names() if "thermal" in r]
    if thermal:
        reasons.append(f"thermal throttling during the window ({', '.join(thermal)})")
    row["valid"] = not reasons
    row["invalid_reason"] = "; ".join(reasons) or None


def _fill_checks(row: dict[str, Any], checks: Checks, reference: np.ndarray, cfg: Any) -> None:
    from kernels import check_outputs

    result = check_outputs(
        checks.sampled,
        reference,
        cfg.workload.dtype,
        cfg.framework.precision,
        cfg.workload.name,
        digests=checks.digests,
    )
    row.update(
        rel_error=float(result.rel_error),
        max_abs_error=float(result.max_abs_error),
        nonfinite_count=int(result.nonfinite_count),
        determinism_mismatches=int(result.determinism_mismatches),
        status=result.verdict.value,
        checked_iters=checks.calls,
        check_time_s=checks.time_s,
    )


def _fail_rows(
    rows: list[dict[str, Any]], base: dict[str, Any], repeats: int, status: str, error: str
) -> None:
    """Mark the repeat in flight (and those not reached) as failed."""
    if rows and rows[-1].get("status") is None:
        rows[-1].update(status=status, error=error, ended_at=time.time(), valid=False)
    while len(rows) < repeats:
        rows.append(
            dict(base, repeat=len(rows), status=status, error=error, ended_at=time.time(),
                 valid=False)
        )


def objective(rows: list[dict[str, Any]], name: str) -> float:
    """What the Hydra task returns to a sweeper: lower is better; a failed check, a measurement
    flagged invalid (the device did not run at the setting asked), or an energy objective on a
    device that measured no energy (``device=cpu`` without RAPL) is infinity."""
    ok = [r for r in rows if r.get("status") == "ok" and r.get("valid")]
    if len(ok) < len(rows) or not ok:
        return float("inf")
    t = float(np.median([r["time_per_iter_s"] for r in ok]))
    if name == "time_per_work":
        return t
    energies = [r["energy_per_iter_j"] for r in ok]
    if any(e is None for e in energies):
        return float("inf")
    e = float(np.median(energies))
    return {"energy_per_work": e, "edp": e * t, "ed2p": e * t * t}[name]
