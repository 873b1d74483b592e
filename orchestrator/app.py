"""The Hydra app behind ``dvfs sweep``: one job is one trial.

``dvfs sweep`` composes ``conf/`` with the user's overrides; with ``-m`` Hydra's sweeper expands
them into a grid and a launcher runs each job. Every job runs ``task``: validate the config,
pick the GPU, run the trial through the sweep's ``session.GpuSession`` (the backend, the guard's
lease and the compiled-kernel cache live as long as the sweep, so a sequential sweep compiles each
kernel once), write the rows to the store the moment they exist, and return a ``rows.JobResult``:
the objective for a sweeper (``objective``: energy per unit of work by default; infinity for a
failed check), carrying the trial's outcome for the stability sweeper.

Errors a user made (a typo in a key, an unsupported clock, an unknown workload) end the command
with one line on stderr and exit code 2, before any device setting is touched: Hydra is run with
``HYDRA_FULL_ERROR=1`` so that its composition errors reach ``run_sweep``, which prints them on
one line instead of a traceback.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from orchestrator.config import CONF_DIR, DvfsConfig, register_configs
from orchestrator.errors import DvfsError, UserError, hydra_user_error
from orchestrator.jobs.job import JobSpec, record_sweep
from orchestrator.launching import estimate
from orchestrator.launching.resume import resume_trials
from orchestrator.measuring.session import GpuSession
from orchestrator.progress import summarise
from orchestrator.results.rows import JobResult


def run_sweep(argv: list[str]) -> int:
    """Run ``dvfs sweep`` with Hydra's command line; returns the exit code."""
    import hydra

    from orchestrator import interrupt
    from orchestrator.launching.sweep_lock import release_sweep_dirs

    register_configs()
    os.environ.setdefault("HYDRA_FULL_ERROR", "1")
    saved = sys.argv
    sys.argv = ["dvfs sweep", *argv]
    session = GpuSession()

    def job(cfg: DvfsConfig) -> JobResult:
        return task(cfg, session)

    with interrupt.handling():  # the CLI's, or ours when called as a function
        try:
            hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")(job)()
            interrupt.check()  # a signal whose KeyboardInterrupt Python dropped
        except SystemExit as e:
            if (stop := interrupt.stopped()) is not None:  # a signal, turned into Hydra's exit
                raise stop from e
            return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except Exception as e:  # noqa: BLE001 - converted to a one-line message or re-raised
            if (stop := interrupt.stopped()) is not None:  # a signal, turned into another error
                raise stop from e
            err = hydra_user_error(e) or (e if isinstance(e, DvfsError) else None)
            if err is None:
                raise
            print(f"dvfs sweep: error: {err}", file=sys.stderr)
            return getattr(err, "exit_code", 1)
        finally:
            sys.argv = saved
            session.close()
            release_sweep_dirs()
    return 0


def _single_run() -> bool:
    """Whether this is ``dvfs sweep`` without ``-m`` (Hydra's run mode: one job)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.get().mode == RunMode.RUN


def _say(line: str) -> None:
    print(f"dvfs sweep: {line}", file=sys.stderr, flush=True)


def default_store_dir() -> Path:
    """Where a job's rows go unless it sets ``store_dir``: the sweep dir (multirun) or the run
    dir."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hc = HydraConfig.get()
    return Path(hc.sweep.dir if hc.mode == RunMode.MULTIRUN else hc.run.dir)


def task(cfg: DvfsConfig, session: GpuSession) -> JobResult:
    """One Hydra job: one trial, stored, summarised; returns its result (objective and outcome).

    Args:
        cfg: the job's config, as Hydra composed it (a DictConfig that the schema types).
        session: the process's GPUs and kernels, kept across the jobs of the sweep.
    """
    from orchestrator.launching.sweep_lock import claim_sweep_dir
    from orchestrator.measuring.trial import run_trial
    from orchestrator.results.store import ResultStore

    logging.getLogger("jax").setLevel(logging.WARNING)  # "Unable to initialize backend 'tpu'"
    try:
        job = JobSpec.from_config(cfg, None if cfg.store_dir else default_store_dir())
        if _single_run():  # a multirun's launcher or sweeper checks the whole sweep
            from hydra.core.hydra_config import HydraConfig

            estimate.check(estimate.Estimate.of([job.config.measure]),
                           estimate.max_hours(HydraConfig.get().sweeper), _say,
                           what="this trial")
        claim_sweep_dir(job.store_dir)  # before any GPU: one sweep writes a directory at a time
        ctx = session.context(job.config.device, sweep_id=job.sweep_id)
        ctx.guard.check(job.request)  # policy and device support, before any change
        store = ResultStore(job.store_dir)  # a corrupt store is refused here, and left as it is
        if _single_run():  # the multirun launchers say it as they start
            _say(f"results in {job.store_dir}")
    except DvfsError as e:
        if isinstance(e, UserError):
            print(f"dvfs sweep: error: {e}", file=sys.stderr)
            session.close()
            sys.exit(2)
        raise
    with store:
        record_sweep(store, job)
        key = job.trial_key(ctx.device.identity.uuid)
        resume = resume_trials(store, [key], job.repeats)[key]  # not-measured trials run again
        if not resume.run:
            if not job.quiet:
                print(f"{job.label}: already stored in {job.store_dir} (skipped)")
            return JobResult.of(resume.rows, job.objective_name)
        rows = run_trial(ctx, job, attempt=resume.attempt)
        for row in rows:
            store.put(row)
    if not job.quiet:
        print(summarise(rows, job.label))
    return JobResult.of(rows, job.objective_name)
