"""The ``ray_gpus`` launcher's work: validate a batch of Hydra jobs, run it, return each result.

``hydra/launcher=ray_gpus`` hands each batch of Hydra jobs to :func:`launch_batch`, which

1. **validates every job first**: composes each job's config and types it (``jobs.JobSpec``:
   types, choices, workload x framework x size) on the driver, then has each GPU's worker check
   every job's settings against that GPU's policy and support (changing nothing). One bad value
   anywhere refuses the whole sweep with a one-line ``UserError`` (exit code 2) before any trial
   runs;
2. takes the process's **pool of workers** (``orchestrator.pool``), one Ray actor per GPU, created
   once and reused for every job and every later batch of the sweep (see
   :mod:`orchestrator.worker` for how a worker finds its GPU on one machine, on a cluster and on
   the simulated GPU);
3. hands the batch to the **supervisor** (``orchestrator.supervisor``), which schedules it,
   handles failures and stores rows as they finish, skipping stored trials (resume).

**Concurrent sweeps.** A worker holds its GPU's lease (the guard's per-GPU lock file) from its first
trial to the end of the sweep. A worker of a second sweep that finds the lease taken waits and
retries (showing ``waiting for lease`` on the progress line) until the first sweep releases the GPU
or ``lease_wait_s`` passes (default: wait as long as it takes), so two sweeps queue per GPU and
never run two trials on one GPU at once.

Each job returns a ``rows.JobResult`` as its Hydra ``JobReturn.return_value``: a float (the
``objective`` of its rows; for ``every``, the worst over the GPUs) that carries the trial's
outcome and keys, so sweepers (ours, Optuna) drive the launcher as they drive Hydra's own, and
ours reads each verdict from it. Ray is imported only inside functions.
"""

from __future__ import annotations

import copy
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.errors import UserError
from orchestrator.jobs import PER_JOB_KEYS, RETRY_POLICIES, JobSpec, machine_key
from orchestrator.pool import close_pool, get_pool
from orchestrator.progress import Progress
from orchestrator.rows import JobResult
from orchestrator.slot import selection_key
from orchestrator.supervisor import Supervisor

log = logging.getLogger(__name__)

PLACEMENTS = ("any", "every")


# --- settings ---------------------------------------------------------------------------------
@dataclass
class LaunchSettings:
    """How the ``ray_gpus`` launcher reaches the GPUs (the ``hydra.launcher`` keys)."""

    address: str | None = None  # None: a local Ray instance; "auto", "host:port", "ray://...": join
    placement: str | tuple[str, ...] = "any"  # "any", "every", or GPU UUIDs (any of those)
    timeout_s: float | None = None  # per-trial limit; None: each job's measure.timeout_s
    max_restarts: int = 5  # worker deaths in a row before a GPU is retired; -1: never retire
    start_timeout_s: float = 120.0  # a worker that does not start within this is given up
    lease_wait_s: float | None = None  # wait this long for a GPU another sweep holds; None: forever
    retry: str = "not_measured"  # which stored trials a re-run runs again (jobs.RETRY_POLICIES)
    num_cpus: float = 0.0  # CPUs each worker reserves (0: or four never start on two cores)
    resources: dict[str, float] = field(default_factory=dict)  # custom Ray resources per worker
    log_to_driver: bool = False  # forward workers' stdout/stderr to this terminal
    progress: bool = True  # the live progress line on stderr
    dashboard: bool = False  # a local Ray's web dashboard, on 127.0.0.1:8265 (off unless asked)

    @classmethod
    def from_mapping(cls, m: Any) -> LaunchSettings:
        """Build from ``hydra.launcher`` (a DictConfig or dict); refuses bad values.

        Raises:
            UserError: an unknown placement, a negative limit.
        """
        from omegaconf import DictConfig, ListConfig, OmegaConf

        d = OmegaConf.to_container(m, resolve=True) if isinstance(m, DictConfig) else dict(m)
        d = {
            k: OmegaConf.to_container(v, resolve=True)
            if isinstance(v, (DictConfig, ListConfig))
            else v
            for k, v in d.items()
        }
        d = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        placement = d.get("placement", "any")
        if isinstance(placement, (list, tuple)):
            uuids = tuple(str(u) for u in placement)
            if not uuids or not all(u.startswith(("GPU-", "MIG-")) for u in uuids):
                raise UserError(
                    f"hydra.launcher.placement={list(placement)} must be any, every or a list of "
                    f"GPU "
                    f"UUIDs (GPU-...; `dvfs devices` lists them)"
                )
            d["placement"] = uuids
        elif placement not in PLACEMENTS:
            raise UserError(
                f"hydra.launcher.placement={placement!r} is not one of: any, every, [GPU UUIDs]"
            )
        if d.get("address") in ("", "local", "none", "null"):
            d["address"] = None
        for key in ("timeout_s", "start_timeout_s", "lease_wait_s"):
            if d.get(key) is not None and float(d[key]) <= 0:
                raise UserError(f"hydra.launcher.{key}={d[key]} must be greater than 0")
        if d.get("retry", "not_measured") not in RETRY_POLICIES:
            raise UserError(
                f"hydra.launcher.retry={d['retry']!r} is not one of: {', '.join(RETRY_POLICIES)}"
            )
        if d.get("num_cpus") is not None and float(d["num_cpus"]) < 0:
            raise UserError(f"hydra.launcher.num_cpus={d['num_cpus']} must be 0 or more")
        d["resources"] = {str(k): float(v) for k, v in (d.get("resources") or {}).items()}
        return cls(**d)

    def pool_key(self) -> str:
        """What makes a pool of workers reusable by another batch (not limits or display)."""
        return repr((self.address, self.placement, self.num_cpus, sorted(self.resources.items())))


# --- jobs -------------------------------------------------------------------------------------
@dataclass
class Job:
    """One Hydra job of a batch, validated.

    Attributes:
        num: Hydra's job number.
        overrides: its overrides.
        spec: its validated, typed config and where its rows go.
        timeout_s: the per-trial limit (``hydra.launcher.timeout_s``, else ``measure.timeout_s``).
        what: the overrides that set this job apart from the rest of its batch.
    """

    num: int
    overrides: tuple[str, ...]
    spec: JobSpec
    timeout_s: float
    what: str = ""

    @property
    def store_dir(self) -> Path:
        """The store its rows go to."""
        assert self.spec.store_dir is not None
        return self.spec.store_dir

    @property
    def sweep_id(self) -> str:
        """Stamped on its rows."""
        return self.spec.sweep_id

    @property
    def label(self) -> str:
        """E.g. ``gemm/jax float32 [sm=1065 MHz]``."""
        return self.spec.label

    @property
    def repeats(self) -> int:
        """Windows per trial."""
        return self.spec.repeats

    @property
    def device(self) -> dict[str, Any]:
        """The resolved ``device`` section."""
        return self.spec.device

    @property
    def gpus_key(self) -> str:
        """Its ``device.gpus`` as a key: which GPUs of the pool may run it (``Slot.runs``)."""
        return selection_key(self.device.get("gpus"))


def prepare_jobs(
    configs: list[tuple[int, tuple[str, ...], Any, str]], settings: LaunchSettings
) -> list[Job]:
    """Validate every job of a batch on the driver; one bad job refuses them all.

    Args:
        configs: (job number, overrides, task config, sweep directory) per job.
        settings: the launcher's settings (for the per-trial limit).

    Raises:
        UserError: the first refused job (and how many more there are), on one line.
    """
    jobs: list[Job] = []
    errors: list[str] = []
    whats = distinct_overrides([o for _, o, _, _ in configs])
    for (num, overrides, cfg, sweep_dir), what in zip(configs, whats):
        try:
            spec = JobSpec.from_config(cfg, default_store_dir=sweep_dir)
        except UserError as e:
            errors.append(f"job #{num} ({what}): {e}")
            continue
        timeout_s = float(settings.timeout_s or spec.config.measure.timeout_s)
        jobs.append(Job(num, tuple(overrides), spec, timeout_s, what))
    if errors:
        more = f" (and {len(errors) - 1} more refused job(s))" if len(errors) > 1 else ""
        raise UserError(f"{errors[0]}{more}; nothing was run")
    keys = {machine_key(j.device) for j in jobs}
    if len(keys) > 1:
        raise UserError(
            "hydra/launcher=ray_gpus runs one machine per sweep, but these jobs differ in "
            f"{', '.join(_differing_device_keys(jobs))}: run them as separate sweeps (the same "
            "store_dir gathers them) or with hydra/launcher=basic"
        )
    return jobs


def distinct_overrides(job_overrides: list[Any]) -> list[str]:
    """Per job, the overrides not shared by every job of the batch (what a message should name)."""
    lists = [list(o) for o in job_overrides]
    common = set.intersection(*(set(o) for o in lists)) if len(lists) > 1 else set()
    return [" ".join(o for o in ov if o not in common) or "no overrides" for ov in lists]


def _differing_device_keys(jobs: list[Job]) -> list[str]:
    keys = sorted({k for j in jobs for k in j.device if k not in PER_JOB_KEYS})
    return [
        f"device.{k}"
        for k in keys
        if len({json.dumps(j.device.get(k), default=str) for j in jobs}) > 1
    ]


# --- Hydra ------------------------------------------------------------------------------------
def launch_batch(
    config: Any,
    hydra_context: Any,
    settings: LaunchSettings,
    job_overrides: Any,
    initial_job_idx: int,
) -> list[Any]:
    """What ``RayGpusLauncher.launch`` does: validate, run, and return a ``JobReturn`` per job.

    Args:
        config: the sweep's config (with its ``hydra`` node).
        hydra_context: Hydra's context (its config loader composes each job).
        settings: the launcher's settings.
        job_overrides: the batch: one list of overrides per job.
        initial_job_idx: the number of the batch's first job.
    """
    from hydra.core.utils import JobReturn, JobStatus, configure_log, setup_globals

    from orchestrator.sweep_lock import claim_sweep_dir

    setup_globals()
    configure_log(config.hydra.hydra_logging, config.hydra.verbose)
    sweep_dir = Path(str(config.hydra.sweep.dir))
    claim_sweep_dir(sweep_dir)  # at once, before composing every job: a second sweep learns now
    configs = _compose(config, hydra_context, job_overrides, initial_job_idx)
    jobs = prepare_jobs([(n, o, t, str(s.hydra.sweep.dir)) for n, o, t, s in configs], settings)
    results = run_jobs(jobs, settings)
    returns = []
    for (_, overrides, task_cfg, sweep_config), value in zip(configs, results, strict=True):
        ret = JobReturn(
            overrides=list(overrides),
            cfg=task_cfg,
            hydra_cfg=sweep_config,
            working_dir=str(sweep_dir),
            task_name=sweep_config.hydra.job.name,
            status=JobStatus.COMPLETED,
        )
        ret.return_value = value
        returns.append(ret)
    return returns


def _compose(
    config: Any, hydra_context: Any, job_overrides: Any, initial_job_idx: int
) -> list[tuple[int, tuple[str, ...], Any, Any]]:
    """Compose every job of the batch: (number, overrides, task config, sweep config) each.

    Raises:
        UserError: a job whose overrides do not compose (named by what sets it apart).
    """
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict, read_write

    from orchestrator.config import hydra_user_error

    configs = []
    whats = distinct_overrides(list(job_overrides))
    for i, overrides in enumerate(job_overrides):
        num = initial_job_idx + i
        try:
            sweep_config = hydra_context.config_loader.load_sweep_config(config, list(overrides))
        except Exception as e:  # noqa: BLE001 - a composition error names the job, or is re-raised
            err = hydra_user_error(e)
            if err is None:
                raise
            raise UserError(f"job #{num} ({whats[i]}): {err}; nothing was run") from e
        with open_dict(sweep_config):
            sweep_config.hydra.job.id = f"{sweep_config.hydra.job.name}_{num}"
            sweep_config.hydra.job.num = num
        HydraConfig.instance().set_config(sweep_config)
        task_cfg = copy.deepcopy(sweep_config)
        with read_write(task_cfg), open_dict(task_cfg):
            del task_cfg["hydra"]
        configs.append((num, tuple(overrides), task_cfg, sweep_config))
    return configs


def run_jobs(
    jobs: list[Job], settings: LaunchSettings, *, progress: Progress | None = None
) -> list[JobResult]:
    """Run validated jobs on the pool of this machine; returns each job's result.

    Raises:
        UserError: no usable GPU, a job refused by a GPU's policy or support, or a store
            directory another sweep is writing.
        StorageError: a row could not be stored (a full disk): the workers are closed, so every
            GPU is restored, and what was stored is kept.
    """
    from orchestrator.sweep_lock import claim_sweep_dir

    if not jobs:
        return []
    for store_dir in sorted({j.store_dir for j in jobs}):  # before any GPU: one sweep per dir
        claim_sweep_dir(store_dir)
    progress = progress or Progress(0, enabled=settings.progress)
    t0 = time.monotonic()
    selections = {j.gpus_key: j.device.get("gpus") for j in jobs}
    pool = get_pool(settings, jobs[0].device, list(selections.values()), progress.note)
    pool.check(jobs)
    live = [s for s in pool.slots if s.live and any(s.runs(j) for j in jobs)]
    if settings.placement == "every":
        progress.total = sum(1 for j in jobs for s in pool.slots if s.runs(j))
    else:
        progress.total = len(jobs)
    sup = Supervisor(pool, jobs, progress)
    try:
        results = sup.run()
    except BaseException:  # interrupted, or a row could not be stored: restore and stop now
        close_pool()
        raise
    dirs = " ".join(sorted({str(j.store_dir) for j in jobs}))
    counts = ", ".join(f"{n} {status}" for status, n in sorted(progress.by_status.items()))
    skipped = f", {progress.skipped} already stored" if progress.skipped else ""
    progress.finish(
        f"ray_gpus: {progress.done} trial(s) on {len(live)} GPU(s) "
        f"in {time.monotonic() - t0:.1f} s "
        f"({counts or 'none run'}{skipped}); results in {dirs}; report: dvfs report {dirs}"
    )
    return results


__all__ = [
    "Job",
    "LaunchSettings",
    "close_pool",
    "launch_batch",
    "prepare_jobs",
    "run_jobs",
]
