"""The Hydra app behind ``dvfs sweep``: one job is one trial.

``dvfs sweep`` composes ``conf/`` with the user's overrides; with ``-m`` Hydra's sweeper expands
them into a grid and a launcher runs each job. Every job runs ``task``: validate the config,
pick the GPU, run the trial through a process-wide ``GpuSession`` (the backend, the guard's lease
and the compiled-kernel cache live as long as the process, so a sequential sweep compiles each
kernel once), write the rows to the store the moment they exist, and return the objective for a
sweeper (``objective``: energy per unit of work by default; infinity for a failed check).

Errors a user made (a typo in a key, an unsupported clock, an unknown workload) end the command
with one line on stderr and exit code 2, before any device setting is touched: Hydra is run with
``HYDRA_FULL_ERROR=1`` so that its composition errors reach ``run_sweep``, which prints them on
one line instead of a traceback.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.config import CONF_DIR, hydra_user_error, register_configs, validate_static
from orchestrator.errors import DvfsError, UserError


def run_sweep(argv: list[str]) -> int:
    """Run ``dvfs sweep`` with Hydra's command line; returns the exit code."""
    import hydra

    register_configs()
    os.environ.setdefault("HYDRA_FULL_ERROR", "1")
    saved = sys.argv
    sys.argv = ["dvfs sweep", *argv]
    try:
        hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")(task)()
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except Exception as e:  # noqa: BLE001 - converted to a one-line message or re-raised
        from orchestrator import interrupt

        if interrupt.terminated():  # SIGTERM, turned into some other error on its way up
            raise KeyboardInterrupt("SIGTERM") from e
        err = hydra_user_error(e) or (e if isinstance(e, DvfsError) else None)
        if err is None:
            raise
        print(f"dvfs sweep: error: {err}", file=sys.stderr)
        return getattr(err, "exit_code", 1)
    finally:
        from orchestrator.store import release_sweep_dirs

        sys.argv = saved
        close_session()
        release_sweep_dirs()
    return 0


# --- one process, one GPU session -------------------------------------------------------------
@dataclass
class GpuSession:
    """What a process keeps across the trials it runs: backend, device, guard and kernels."""

    machine_key: str
    backend: Any
    contexts: dict[str, Any] = field(default_factory=dict)  # device uuid -> TrialContext

    def close(self) -> None:
        for ctx in self.contexts.values():
            ctx.guard.close()
        self.contexts.clear()
        self.backend.close()


_session: GpuSession | None = None


def _machine_key(device_cfg: Any) -> str:
    from omegaconf import OmegaConf

    d = OmegaConf.to_container(device_cfg, resolve=True) if not isinstance(device_cfg, dict) else dict(device_cfg)
    for k in ("sm_clock_mhz", "mem_clock_mhz", "power_limit_w", "clock_offset_mhz", "gpus"):
        d.pop(k, None)  # a trial's settings and which GPU it runs on: contexts are per GPU
    return repr(sorted(d.items()))


def open_context(device_cfg: Any, sweep_id: str = "", device_uuid: str | None = None) -> Any:
    """The ``TrialContext`` of the GPU this process runs trials on (opened once, then reused).

    Args:
        device_cfg: the job's ``device`` config.
        sweep_id: stamped on every row.
        device_uuid: which GPU (a Ray worker names its own); default: the first of ``device.gpus``.
    """
    global _session
    from orchestrator.devices import journal_dir, open_backend, select_devices
    from orchestrator.guard import Journal, SettingsGuard
    from orchestrator.policy import load_policy
    from orchestrator.trial import TrialContext

    key = _machine_key(device_cfg)
    if _session is not None and _session.machine_key != key:
        close_session()
    if _session is None:
        _session = GpuSession(machine_key=key, backend=open_backend(device_cfg))
    backend = _session.backend
    if device_uuid is None:
        device_uuid = select_devices(backend, device_cfg.gpus)[0].identity.uuid
    ctx = _session.contexts.get(device_uuid)
    if ctx is None:
        device = backend.device(uuid=device_uuid)
        policy = load_policy(device_cfg.policy_file, device.identity.name)
        guard = SettingsGuard(device, Journal(journal_dir(device_cfg)), policy, observe_only=device_cfg.observe_only)
        guard.__enter__()
        ctx = TrialContext(device=device, guard=guard, kernels=_kernel_cache(), sweep_id=sweep_id)
        _session.contexts[device_uuid] = ctx
    ctx.sweep_id = sweep_id or ctx.sweep_id
    return ctx


def _kernel_cache() -> Any:
    from kernels import KernelCache

    return KernelCache()


def close_session() -> None:
    """Restore and release every GPU this process holds (also runs at exit via the guard)."""
    global _session
    if _session is not None:
        try:
            _session.close()
        finally:
            _session = None


# --- the task ---------------------------------------------------------------------------------
def store_dir_for(cfg: Any) -> Path:
    """Where this job's rows go: ``store_dir``, else the sweep dir (multirun) or the run dir."""
    if cfg.get("store_dir"):
        return Path(cfg.store_dir)
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hc = HydraConfig.get()
    return Path(hc.sweep.dir if hc.mode == RunMode.MULTIRUN else hc.run.dir)


def prepare(cfg: Any) -> tuple[dict[str, Any], Any]:
    """Validate a job before anything touches a device; returns (resolved config, request)."""
    from omegaconf import OmegaConf

    from orchestrator.trial import settings_request, validate_workload

    validate_static(cfg)
    validate_workload(cfg)
    resolved = OmegaConf.to_container(cfg, resolve=True)
    return resolved, settings_request(cfg.device)


def task(cfg: Any) -> float:
    """One Hydra job: one trial, stored, summarised; returns the objective."""
    from orchestrator.store import ResultStore, claim_sweep_dir
    from orchestrator.trial import objective, run_trial, trial_key

    logging.getLogger("jax").setLevel(logging.WARNING)  # "Unable to initialize backend 'tpu'"
    try:
        resolved, request = prepare(cfg)
        store_dir = store_dir_for(cfg)
        sweep_id = "/".join(store_dir.resolve().parts[-2:])
        claim_sweep_dir(store_dir)  # before any GPU: one sweep writes a directory at a time
        ctx = open_context(cfg.device, sweep_id)
        ctx.guard.check(request)  # policy and device support, before any change
        store = ResultStore(store_dir)  # a corrupt store is refused here, and left as it is
    except DvfsError as e:
        if isinstance(e, UserError):
            print(f"dvfs sweep: error: {e}", file=sys.stderr)
            close_session()
            sys.exit(2)
        raise
    with store:
        if store.get_meta("sweep") is None:
            store.put_meta("sweep", {"store_dir": str(store_dir), "started_at": time.time(), "config": resolved})
        key = trial_key(resolved, ctx.device.identity.uuid)
        stored = [r for r in store.rows() if r["trial_key"] == key] if store.has(key, 0) else []
        if len(stored) >= cfg.measure.repeats:
            if not cfg.quiet:
                print(f"{_label(cfg, request)}: already stored in {store_dir} (skipped)")
            return objective(stored, cfg.objective)
        rows = run_trial(ctx, cfg, resolved)
        for row in rows:
            store.put(row)
    if not cfg.quiet:
        print(summarise(rows, _label(cfg, request)))
    return objective(rows, cfg.objective)


def _label(cfg: Any, request: Any) -> str:
    return f"{cfg.workload.name}/{cfg.framework.name} {cfg.workload.dtype} [{request.describe()}]"


def summarise(rows: list[dict[str, Any]], label: str) -> str:
    """One line per repeat: status, throughput, power, energy, validity."""
    lines = []
    for r in rows:
        if r.get("iterations"):
            energy = (
                "no energy measured"  # device=cpu without a readable RAPL counter
                if r.get("energy_j") is None
                else f"{r['avg_power_w']:.0f} W avg, {r['energy_per_iter_j']:.4g} J/iter"
            )
            lines.append(
                f"{label} #{r['repeat']}: {r['status']}, {r['iterations']} iters in {r['time_s']:.3f} s, "
                f"{r['tflops'] or 0:.2f} TFLOP/s, {energy}, "
                f"SM {r['observed_sm_clock_mhz'] or 0:.0f} MHz"
                + ("" if r["valid"] else f", INVALID: {r['invalid_reason']}")
            )
        else:
            first = (r.get("error") or "").splitlines()[0] if r.get("error") else ""
            lines.append(f"{label} #{r['repeat']}: {r['status']}: {first}")
    return "\n".join(lines)
