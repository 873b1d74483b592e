"""The ``ray_gpus`` launcher's work: validate a batch of Hydra jobs, run it, return each result.

``hydra/launcher=ray_gpus`` hands each batch of Hydra jobs to :func:`launch_batch`, which

1. **checks the batch first** (``orchestrator.launching.batch.JobStream``): composes the first job
   with each distinct override (every value of every swept key; ``orchestrator.launching.compose``
   composes a job from cached parts in well under a millisecond), then has each GPU's worker check
   those jobs' settings against that GPU's policy and support (changing nothing). A bad value
   anywhere refuses the whole sweep with a one-line ``UserError`` (exit code 2) before any trial
   runs. A re-run whose every trial is stored ends here, without starting Ray (resume);
2. takes the process's **pool of workers** (``orchestrator.launching.pool``), one Ray actor per GPU,
   created once and reused for every job and every later batch of the sweep (see
   :mod:`orchestrator.measuring.worker` for how a worker finds its GPU on one machine, on a cluster
   and on the simulated GPU);
3. hands the batch to the **supervisor** (``orchestrator.launching.supervisor``), which takes its
   jobs as the GPUs need them (a 10,000-job grid starts as fast as a 30-job one and holds only the
   jobs in flight), schedules them, handles failures and stores rows as they finish, skipping stored
   trials (resume, one keyed store query per chunk of jobs).

**Boards side by side.** A batch over several simulated machines (``device.profile=a,b,c``)
runs machine by machine (:func:`run_machines`): each machine's jobs on a pool of their own, into
the same stores. Real GPUs are one machine per host, so there a batch is one machine.

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

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.errors import UserError
from orchestrator.launching import estimate
from orchestrator.launching.batch import JobStream, differing_device_keys, one_machine_message
from orchestrator.launching.pool import close_pool, get_pool
from orchestrator.launching.resume import already_stored
from orchestrator.launching.scheduling import gpus_at_once, refusals
from orchestrator.launching.settings import LaunchSettings
from orchestrator.launching.supervisor import Supervisor
from orchestrator.progress import Progress
from orchestrator.results.rows import JobResult

if TYPE_CHECKING:
    from hydra.core.utils import JobReturn
    from hydra.types import HydraContext
    from omegaconf import DictConfig

log = logging.getLogger(__name__)

# --- Hydra ------------------------------------------------------------------------------------
def launch_batch(
    config: DictConfig,
    hydra_context: HydraContext,
    settings: LaunchSettings,
    job_overrides: Sequence[Sequence[str]],
    initial_job_idx: int,
) -> list[JobReturn]:
    """What ``RayGpusLauncher.launch`` does: check, run, and return a ``JobReturn`` per job.

    Args:
        config: the sweep's config (with its ``hydra`` node).
        hydra_context: Hydra's context (its config loader composes the jobs).
        settings: the launcher's settings.
        job_overrides: the batch: one list of overrides per job.
        initial_job_idx: the number of the batch's first job.
    """
    from hydra.core.utils import JobReturn, JobStatus, configure_log, setup_globals

    from orchestrator.launching.compose import composer_for
    from orchestrator.launching.sweep_lock import claim_sweep_dir

    setup_globals()
    configure_log(config.hydra.hydra_logging, config.hydra.verbose)
    sweep_dir = Path(str(config.hydra.sweep.dir))
    claim_sweep_dir(sweep_dir)  # at once, before composing any job: a second sweep learns now
    stream = JobStream(composer_for(config, hydra_context), job_overrides, initial_job_idx,
                       settings.timeout_s)
    stream.check()
    results = run_machines(stream, settings, limit_hours=estimate.max_hours(config.hydra.sweeper))
    returns = []
    for overrides, value in zip(stream.overrides, results, strict=True):
        # The job's config is not kept: a 10,000-job sweep would hold 10,000 of them, and
        # sweepers read only the return value (the rows hold each job's resolved config).
        ret = JobReturn(overrides=list(overrides), working_dir=str(sweep_dir),
                        task_name=str(config.hydra.job.name), status=JobStatus.COMPLETED)
        ret.return_value = value
        returns.append(ret)
    return returns


def run_jobs(
    jobs: JobStream, settings: LaunchSettings, *, progress: Progress | None = None,
    limit_hours: float = estimate.MAX_HOURS,
) -> list[JobResult]:
    """Run a checked batch on the pool of this machine; returns each job's result, in order.

    Args:
        limit_hours: a batch expected to take longer is refused
        (``orchestrator.launching.estimate``).

    Raises:
        UserError: no usable GPU, a job refused by a GPU's policy or support, or a store
            directory another sweep is writing.
        StorageError: a row could not be stored (a full disk): the workers are closed, so every
            GPU is restored, and what was stored is kept.
    """
    from orchestrator.launching.sweep_lock import claim_sweep_dir

    if not jobs.total:
        return []
    for store_dir in jobs.store_dirs:  # before any GPU: one sweep per dir
        claim_sweep_dir(store_dir)
    progress = progress or Progress(jobs.total, enabled=settings.progress)
    t0 = time.monotonic()
    stored = already_stored(jobs, settings, progress)
    if stored is not None:  # a re-run of a finished sweep: no GPU is needed
        progress.finish(f"ray_gpus: all {jobs.total} trial(s) already stored (resume); "
                        f"results in {' '.join(map(str, jobs.store_dirs))}")
        return stored
    dirs = " ".join(map(str, jobs.store_dirs))
    progress.note(f"ray_gpus: {jobs.total} job(s); results in {dirs}")
    pool = get_pool(settings, jobs.first.device, jobs.selections, progress.note)
    refused = refusals(pool.slots, jobs.samples)
    if refused:
        raise UserError(f"{refused[0]}; nothing was run")
    gpus = gpus_at_once(jobs.selections, pool.expected)
    measures = jobs.measures()
    if settings.placement == "every":
        progress.total = jobs.total * gpus
        measures = measures * gpus
    estimate.check(estimate.Estimate.of(measures, gpus), limit_hours,
                   lambda line: progress.note(f"ray_gpus: {line}"))
    sup = Supervisor(pool, jobs, progress)
    try:
        results = sup.run()
    except BaseException:  # interrupted, a row not stored, a job refused: restore and stop now
        close_pool()
        raise
    live = [s for s in pool.slots if s.live and any(s.runs(j) for j in jobs.samples)]
    counts = ", ".join(f"{n} {status}" for status, n in sorted(progress.by_status.items()))
    skipped = f", {progress.skipped} already stored" if progress.skipped else ""
    progress.finish(
        f"ray_gpus: {progress.done} trial(s) on {len(live)} GPU(s) "
        f"in {time.monotonic() - t0:.1f} s "
        f"({counts or 'none run'}{skipped}); results in {dirs}; report: dvfs report {dirs}"
    )
    return results


def run_machines(
    jobs: JobStream, settings: LaunchSettings, *, limit_hours: float = estimate.MAX_HOURS,
) -> list[JobResult]:
    """Run a checked batch machine by machine; returns each job's result, in order.

    A batch over several simulated machines (``device.profile=a100_sxm4_40gb,h100_sxm5_80gb``:
    boards side by side) runs each machine's jobs on a pool of its own, one machine after the
    other, into the same stores; each machine's state is its own (``devices.sim_state_dir``).
    Real GPUs are one machine per host, and a cluster's nodes each join the simulated machine
    they have, so there a batch must be one machine.

    Raises:
        UserError: a batch over several machines on real GPUs, the CPU or a Ray cluster; as
            :func:`run_jobs`.
    """
    firsts = jobs.machine_firsts
    if len(firsts) <= 1:
        return run_jobs(jobs, settings, limit_hours=limit_hours)
    keys = differing_device_keys(firsts)
    if any(j.device.get("backend") != "sim" for j in firsts):
        raise UserError(one_machine_message(firsts))
    if settings.address is not None:
        raise UserError(
            "hydra/launcher=ray_gpus on a Ray cluster runs one machine per sweep (each node's "
            "workers join the simulated machine the node has), but these jobs differ in "
            f"{', '.join(keys)}: run them on a local Ray instance (hydra.launcher.address=null), "
            "as separate sweeps or with hydra/launcher=basic"
        )
    parts, t0 = jobs.by_machine(), time.monotonic()
    results: dict[int, JobResult] = {}
    for n, part in enumerate(parts, 1):
        progress = Progress(part.total, enabled=settings.progress)
        which = " ".join(f"{k}={part.first.device.get(k.removeprefix('device.'))}" for k in keys)
        progress.note(f"ray_gpus: machine {n} of {len(parts)} ({which}): {part.total} job(s)")
        _fit_local_ray(part.first.device)
        done = run_jobs(part, settings, progress=progress, limit_hours=limit_hours)
        results.update(zip(part.nums, done, strict=True))
    dirs = " ".join(map(str, jobs.store_dirs))
    progress.finish(f"ray_gpus: {jobs.total} job(s) on {len(parts)} machines in "
                    f"{time.monotonic() - t0:.1f} s; results in {dirs}; report: dvfs report {dirs}")
    return [results[num] for num in jobs.nums]


def _fit_local_ray(device: dict[str, Any]) -> None:
    """Stop a local Ray instance that declares another number of GPUs than this machine has
    (it was started for another machine): the next pool starts one that fits, since a local
    instance declares one logical GPU per simulated GPU (``pool.GpuPool``)."""
    import ray

    if ray.is_initialized() and ray.cluster_resources().get("GPU", 0) != device.get("count", 1):
        close_pool()
        ray.shutdown()


__all__ = [
    "LaunchSettings",
    "close_pool",
    "launch_batch",
    "run_jobs",
    "run_machines",
]
