"""The supervisor of a multirun on Ray: one long-lived worker per GPU, results as they finish.

``hydra/launcher=ray_gpus`` hands each batch of Hydra jobs to :func:`launch_batch`, which

1. **validates every job first**: composes each job's config and runs ``prepare`` (types, choices,
   workload x framework x size) on the driver, then has each GPU's worker check every job's
   settings against that GPU's policy and support (changing nothing). One bad value anywhere
   refuses the whole sweep with a one-line ``UserError`` (exit code 2) before any trial runs;
2. keeps a **pool of workers**, one Ray actor per GPU (``num_gpus=1, num_cpus=0``), created once
   and reused for every job and every later batch of the sweep (see :mod:`orchestrator.worker`
   for how a worker finds its GPU on one machine, on a cluster and on the simulated GPU);
3. sends each job to an idle worker (``placement=any``), to every worker (``every``, one trial
   per GPU: a fleet survey), or to the next idle one of a list of GPU UUIDs, always among the
   GPUs the job's own ``device.gpus`` selects (so jobs pinned to different GPUs, as the stability
   sweeper's are, run side by side in one batch), and handles results
   **as they finish** (``ray.wait``): each row is written to the store on the driver at once, so
   a cluster needs no shared filesystem and a killed sweep loses only the trials in flight;
4. skips jobs whose trial key is already in the store (resume).

Failure semantics (the sweep always ends with a row for every job and GPU):

- the kernel raised, or a check failed: the trial's own row says so (``crash``, ``wrong``...); the
  worker goes on;
- the worker process died (SIGKILL, segfault, OOM, node lost: ``ActorDiedError`` and the other
  ``RayActorError``s): the trial is recorded as ``crash``, a new worker is started on the same
  GPU (same node), restores what the dead one left changed, and takes the next job;
- a trial ran past its limit (``hydra.launcher.timeout_s``, else the job's ``measure.timeout_s``):
  its worker is killed and replaced and the trial is recorded as ``timeout``;
- a GPU whose worker died ``max_restarts`` times in a row (or whose replacement did not start
  within ``start_timeout_s``) is retired: ``any`` jobs go to the other GPUs; its ``every`` jobs
  are recorded as ``device_error``.

**Concurrent sweeps.** A worker holds its GPU's lease (the guard's per-GPU lock file) from its first
trial to the end of the sweep. A worker of a second sweep that finds the lease taken waits and
retries (showing ``waiting for lease`` on the progress line) until the first sweep releases the GPU
or ``lease_wait_s`` passes (default: wait as long as it takes), so two sweeps queue per GPU and
never run two trials on one GPU at once.

Each job returns its objective (``objective`` of its rows; for ``every``, the worst over the GPUs)
as a Hydra ``JobReturn``, so sweepers (ours, Optuna) drive the launcher as they drive Hydra's own.
Ray is imported only inside functions.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from orchestrator.errors import UserError
from orchestrator.progress import Progress
from orchestrator.worker import (
    PER_JOB_KEYS,
    GpuPool,
    Slot,
    close_pool,
    first_line,
    get_pool,
    kill,
    machine_key,
    selection_key,
)

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
    """One Hydra job of a batch, validated."""

    num: int  # Hydra's job number
    overrides: tuple[str, ...]
    cfg: Any  # the job's task config (DictConfig, without the `hydra` node)
    resolved: dict[str, Any]  # the same, resolved to plain values (stored beside each row)
    store_dir: Path
    sweep_id: str
    timeout_s: float
    label: str  # e.g. ``gemm/jax float32 [sm=1065 MHz]``
    what: str = ""  # the overrides that set this job apart from the rest of its batch

    @property
    def repeats(self) -> int:
        return int(self.resolved["measure"]["repeats"])

    @property
    def device(self) -> dict[str, Any]:
        return self.resolved["device"]

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
    from orchestrator import inject
    from orchestrator.app import prepare

    jobs: list[Job] = []
    errors: list[str] = []
    whats = distinct_overrides([o for _, o, _, _ in configs])
    for (num, overrides, cfg, sweep_dir), what in zip(configs, whats):
        try:
            resolved, request = prepare(cfg)
            inject.validate(resolved["device"].get("inject"), resolved["device"]["backend"])
        except UserError as e:
            errors.append(f"job #{num} ({what}): {e}")
            continue
        store_dir = Path(resolved.get("store_dir") or sweep_dir)
        label = (
            f"{cfg.workload.name}/{cfg.framework.name} {cfg.workload.dtype} [{request.describe()}]"
        )
        timeout_s = float(settings.timeout_s or cfg.measure.timeout_s)
        jobs.append(
            Job(
                num,
                tuple(overrides),
                cfg,
                resolved,
                store_dir,
                sweep_id_for(store_dir),
                timeout_s,
                label,
                what,
            )
        )
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


def sweep_id_for(store_dir: Path) -> str:
    """The sweep id stamped on rows: the last two parts of the store directory (as ``app.task``)."""
    return "/".join(store_dir.resolve().parts[-2:])


def _differing_device_keys(jobs: list[Job]) -> list[str]:
    keys = sorted({k for j in jobs for k in j.device if k not in PER_JOB_KEYS})
    return [
        f"device.{k}"
        for k in keys
        if len({json.dumps(j.device.get(k), default=str) for j in jobs}) > 1
    ]


# --- rows the driver writes itself ------------------------------------------------------------
def failure_rows(job: Job, info: dict[str, Any], status: str, error: str) -> list[dict[str, Any]]:
    """Rows for a trial that returned none (its worker died, hung or never started)."""
    from orchestrator.devices.base import DeviceIdentity
    from orchestrator.trial import _base_row, _fail_rows, settings_request, trial_key

    identity = DeviceIdentity(**info["identity"])
    ctx = SimpleNamespace(device=SimpleNamespace(identity=identity), sweep_id=job.sweep_id)
    request = settings_request(job.cfg.device)
    base = _base_row(ctx, job.cfg, job.resolved, trial_key(job.resolved, identity.uuid), request)
    base["host"] = info.get("host", base["host"])
    rows: list[dict[str, Any]] = []
    _fail_rows(rows, base, job.repeats, status, error)
    return rows


# --- the supervisor ---------------------------------------------------------------------------
class Supervisor:
    """Runs one batch of jobs over a started pool (see the module docstring for the semantics).

    Args:
        pool: the started pool of workers.
        jobs: the batch, validated (``prepare_jobs``) and checked (``GpuPool.check``).
        progress: where counts and lines go.
    """

    def __init__(self, pool: GpuPool, jobs: list[Job], progress: Progress) -> None:
        self.pool = pool
        self.jobs = jobs
        self.progress = progress
        self.settings = pool.settings
        self.every = self.settings.placement == "every"
        self.pending: list[Job] = []  # placement any or a list: one queue, taken per GPU
        self.results: dict[tuple[int, str], float] = {}  # (job number, GPU uuid) -> objective
        self.retired: dict[str, dict[str, Any]] = {}  # GPU uuid -> label, host, reason, time
        self.stores: dict[Path, Any] = {}
        self.frameworks = tuple(sorted({j.cfg.framework.name for j in jobs}))

    # --- the loop ------------------------------------------------------------------------------
    def run(self) -> list[float]:
        """Run the batch to the end; returns each job's objective, in job order."""
        import ray

        try:
            self._plan()
            for slot in self.pool.slots:
                if slot.state == "identified":
                    self._acquire(slot)
                elif slot.state == "retired" and self.every:
                    self._fail_queue(slot)
                self._show(slot)
            while not self._finished():
                self._dispatch()
                refs = list(self.pool.inflight)
                if not refs:  # nothing runs and nothing can: what is left has no live GPU
                    self._fail_stranded()
                    break
                deadline = min((s.deadline for s in self.pool.slots), default=math.inf)
                wait_s = min(0.25, max(deadline - time.monotonic(), 0.0))
                ready, _ = ray.wait(refs, num_returns=1, timeout=wait_s)
                for ref in ready:
                    self._on_ready(ref)
                self._check_deadlines()
                self._show_waiting()
                self.progress.refresh()
        finally:
            for store in self.stores.values():
                store.close()
        return [
            max((v for (n, _), v in self.results.items() if n == j.num), default=math.inf)
            for j in self.jobs
        ]

    def _finished(self) -> bool:
        # A worker being replaced restores its GPU as it starts: wait for that too.
        if any(s.state in ("busy", "starting") for s in self.pool.slots):
            return False
        return all(not s.queue for s in self.pool.slots) if self.every else not self.pending

    def _plan(self) -> None:
        """Queue what is not stored yet; count what is (resume)."""
        from orchestrator.trial import objective, trial_key

        stored: dict[Path, tuple[set, dict[str, list]]] = {}
        for job in self.jobs:
            store = self._store(job)
            if job.store_dir not in stored:
                by_key: dict[str, list] = {}
                for row in store.iter_rows():
                    by_key.setdefault(row["trial_key"], []).append(row)
                stored[job.store_dir] = (store.keys(), by_key)
            keys, by_key = stored[job.store_dir]
            done = {}
            slots = [s for s in self.pool.slots if s.runs(job)]
            for slot in slots:
                k = trial_key(job.resolved, slot.uuid)
                if all((k, r) in keys for r in range(job.repeats)):
                    done[slot.uuid] = objective(by_key[k], job.resolved["objective"])
            if self.every:
                for slot in slots:
                    if slot.uuid in done:
                        self.results[(job.num, slot.uuid)] = done[slot.uuid]
                        self.progress.trial_skipped()
                    else:
                        slot.queue.append(job)
            elif done:
                uuid, value = next(iter(done.items()))
                self.results[(job.num, uuid)] = value
                self.progress.trial_skipped()
            else:
                self.pending.append(job)
        if self.progress.skipped:
            self.progress.note(
                f"ray_gpus: {self.progress.skipped} trial(s) already in the store, skipped (resume)"
            )

    def _store(self, job: Job) -> Any:
        from orchestrator.store import ResultStore

        store = self.stores.get(job.store_dir)
        if store is None:
            store = self.stores[job.store_dir] = ResultStore(job.store_dir)
            if store.get_meta("sweep") is None:
                store.put_meta(
                    "sweep",
                    {
                        "store_dir": str(job.store_dir),
                        "started_at": time.time(),
                        "config": job.resolved,
                    },
                )
            placement = self.settings.placement
            store.put_meta(
                "launcher",
                {
                    "name": "ray_gpus",
                    "address": self.settings.address,
                    "placement": list(placement) if isinstance(placement, tuple) else placement,
                    "gpus": [
                        {"uuid": s.uuid, "host": s.info["host"], "node_id": s.node_id}
                        for s in self.pool.slots
                    ],
                },
            )
        return store

    # --- sending work --------------------------------------------------------------------------
    def _call(
        self, slot: Slot, kind: str, ref: Any, state: str, deadline: float = math.inf
    ) -> None:
        self.pool.inflight[ref] = (slot, kind)
        slot.ref, slot.state, slot.deadline, slot.since = ref, state, deadline, time.monotonic()
        self._show(slot)

    def _acquire(self, slot: Slot) -> None:
        self._call(
            slot, "acquire", slot.actor.acquire.remote(self.settings.lease_wait_s), "acquiring"
        )

    def _dispatch(self) -> None:
        for slot in self.pool.slots:
            if slot.state != "idle":
                continue
            if self.every:
                if not slot.queue:
                    continue
                job = slot.queue.popleft()
            else:
                job = next((j for j in self.pending if slot.runs(j)), None)
                if job is None:
                    continue
                self.pending.remove(job)
            slot.job, slot.dispatched_at = job, time.time()
            ref = slot.actor.run.remote(job.resolved, job.sweep_id)
            self._call(slot, "run", ref, "busy", time.monotonic() + job.timeout_s)

    # --- results -------------------------------------------------------------------------------
    def _on_ready(self, ref: Any) -> None:
        import ray

        owner = self.pool.inflight.pop(ref, None)
        if owner is None:
            return
        slot, kind = owner
        slot.ref, slot.deadline = None, math.inf
        if kind == "run":
            self._on_trial(slot, ref)
            return
        try:
            value = ray.get(ref)
        except ray.exceptions.RayTaskError as e:  # our code raised; the GPU is unusable to it
            self._retire(slot, f"its worker failed to {kind}: {first_line(e)}")
            return
        except ray.exceptions.RayError as e:
            self._replace(slot, f"its worker died ({kind}): {first_line(e)}")
            return
        if kind == "identify":
            self._on_identify(slot, value)
        elif kind == "acquire":
            if not value["ok"]:
                self._retire(slot, value["error"])
                return
            for action in value["restored"]:
                self.progress.note(
                    f"ray_gpus: {slot.label}: {action} (left changed by a killed worker)"
                )
            self._call(slot, "warm", slot.actor.warm.remote(self.frameworks), "warming")
        else:  # warm
            slot.state = "idle"
            self._show(slot)

    def _on_trial(self, slot: Slot, ref: Any) -> None:
        import ray

        job, slot.job = slot.job, None
        assert job is not None
        try:
            result = ray.get(ref)
        except ray.exceptions.RayTaskError as e:  # our code raised in the worker, which lives on
            slot.state = "idle"
            self._record(
                slot,
                job,
                failure_rows(job, slot.info, "crash", f"the worker raised: {first_line(e)}"),
                {},
            )
        except ray.exceptions.RayError as e:  # the process is gone: ActorDiedError and the like
            where = f"pid {slot.info['pid']} on {slot.info['host']}"
            error = f"the worker process died ({where}): {first_line(e)}"
            self._record(
                slot, job, failure_rows(job, slot.info, "crash", error), {"died_at": time.time()}
            )
            self._replace(slot, "its worker died during a trial")
        else:
            if not result["rows"]:  # the GPU was unhealthy before the trial: nothing ran
                self._retire(slot, result["unhealthy"], requeue=job)
                return
            slot.state, slot.builds, slot.deaths_in_a_row = "idle", result["builds"], 0
            extra = {
                k: result[k] for k in ("trial_started_at", "trial_ended_at", "trial_s", "builds")
            }
            self._record(slot, job, result["rows"], extra)
            if result["unhealthy"]:  # it failed during this trial: no further trials
                self._retire(slot, result["unhealthy"])
                return
        self._show(slot)

    def _record(
        self, slot: Slot, job: Job, rows: list[dict[str, Any]], extra: dict[str, Any]
    ) -> None:
        """Write a trial's rows to the store now, count the trial, print its summary."""
        from orchestrator.app import summarise
        from orchestrator.trial import objective

        launch = {
            "launcher": "ray_gpus",
            "host": slot.info["host"],
            "node_id": slot.node_id,
            "worker_pid": slot.info["pid"],
            "ray_gpu_id": slot.info["ray_gpu_id"],
            "worker_restarts": slot.restarts,
            "job_num": job.num,
            "dispatched_at": slot.dispatched_at,
            **extra,
        }
        store = self._store(job)
        for row in rows:
            row["launch"] = launch
            store.put(row)
        self.results[(job.num, slot.uuid)] = objective(rows, job.resolved["objective"])
        if not job.resolved.get("quiet"):
            self.progress.log(summarise(rows, f"{slot.label} {job.label}"))
        status = next((r["status"] for r in rows if r.get("status") != "ok"), "ok")
        self.progress.trial_done(status, extra.get("trial_s"))

    def _check_deadlines(self) -> None:
        now = time.monotonic()
        for slot in self.pool.slots:
            if slot.deadline > now:
                continue
            self.pool.inflight.pop(slot.ref, None)
            slot.ref, slot.deadline = None, math.inf
            if slot.state == "busy":
                job, slot.job = slot.job, None
                kill(slot.actor)
                error = (
                    f"no result after {job.timeout_s:g} s (timeout_s): "
                    "the worker was killed and replaced"
                )
                self._record(
                    slot,
                    job,
                    failure_rows(job, slot.info, "timeout", error),
                    {"killed_at": time.time()},
                )
                self._replace(slot, "a trial timed out")
            else:
                self._replace(
                    slot, f"a new worker did not start within {self.settings.start_timeout_s:g} s"
                )

    # --- replacing and retiring ----------------------------------------------------------------
    def _replace(self, slot: Slot, why: str) -> None:
        """Kill the slot's worker and start another on the same GPU (same node)."""
        kill(slot.actor)
        slot.deaths_in_a_row += 1
        limit = self.settings.max_restarts
        if 0 <= limit < slot.deaths_in_a_row:
            self._retire(
                slot,
                f"{why}; its workers died {slot.deaths_in_a_row} times in a row "
                f"(max_restarts={limit})",
            )
            return
        self.progress.note(f"ray_gpus: {slot.label} ({slot.uuid}): {why}; starting a new worker")
        slot.restarts += 1
        self._spawn_for(slot)

    def _spawn_for(self, slot: Slot) -> None:
        slot.actor = self.pool.spawn(slot.node_id)
        deadline = time.monotonic() + self.settings.start_timeout_s
        self._call(slot, "identify", slot.actor.identify.remote(), "starting", deadline)

    def _on_identify(self, slot: Slot, info: dict[str, Any]) -> None:
        if info["uuid"] != slot.uuid:
            # Ray gave it another free GPU of the node: hold that one and try again.
            slot.parked.append(slot.actor)
            if len(slot.parked) > self.pool.node_gpus(slot.node_id):
                self._retire(slot, "no new worker landed on this GPU")
            else:
                self._spawn_for(slot)
            return
        for actor in slot.parked:
            kill(actor)
        slot.parked.clear()
        for action in info["restored"]:
            self.progress.note(
                f"ray_gpus: {slot.label}: {action} (left changed by a killed worker)"
            )
        info["multi_node"] = slot.info.get("multi_node")
        slot.info = info
        self._acquire(slot)

    def _retire(self, slot: Slot, reason: str, requeue: Job | None = None) -> None:
        """Take a GPU out of the sweep: end its worker, record or move the jobs it will not run.

        Args:
            slot: the GPU.
            reason: why, for the progress line and the rows of jobs it leaves unrun.
            requeue: a job it was given but did not start: back to the front of the queue for
                another GPU (``placement=every``: recorded as ``device_error`` with its queue).
        """
        if requeue is not None:
            if self.every:
                slot.queue.appendleft(requeue)
            else:
                self.pending.insert(0, requeue)
        self.pool.inflight.pop(slot.ref, None)
        slot.state, slot.retired_reason, slot.ref, slot.deadline = "retired", reason, None, math.inf
        for actor in [slot.actor, *slot.parked]:
            kill(actor)
        slot.parked.clear()
        self.progress.note(f"ray_gpus: {slot.label} ({slot.uuid}) retired: {reason}")
        self.retired[slot.uuid] = {"label": slot.label, "host": slot.info["host"], "reason": reason,
                                   "at": time.time()}
        for store in self.stores.values():  # the report names every retired GPU and why
            store.put_meta("retired_gpus", {**(store.get_meta("retired_gpus") or {}),
                                            slot.uuid: self.retired[slot.uuid]})
        if self.every:
            self._fail_queue(slot)
        else:
            self._fail_stranded()
        self._show(slot)

    def _fail_queue(self, slot: Slot) -> None:
        while slot.queue:
            job = slot.queue.popleft()
            error = f"not run: GPU retired ({slot.retired_reason})"
            self._record(slot, job, failure_rows(job, slot.info, "device_error", error), {})

    def _fail_stranded(self) -> None:
        """Record the queued jobs that no live GPU may run (every GPU they select is retired)."""
        for job in list(self.pending):
            slots = [s for s in self.pool.slots if s.runs(job)]
            if any(s.state != "retired" for s in slots):
                continue
            self.pending.remove(job)
            reasons = "; ".join(sorted({s.retired_reason or "retired" for s in slots}))
            error = f"not run: no GPU it may run on is left ({reasons})"
            self._record(slots[0], job, failure_rows(job, slots[0].info, "device_error", error), {})

    # --- showing -------------------------------------------------------------------------------
    def _show(self, slot: Slot) -> None:
        if slot.state == "busy" and slot.job is not None:
            cfg = slot.job.cfg
            clock = cfg.device.sm_clock_mhz
            activity = f"{cfg.workload.name}/{cfg.framework.name}" + (
                f"@{clock}" if clock is not None else ""
            )
        else:
            activity = {
                "identified": "starting",
                "acquiring": "taking GPU",
                "warming": f"loading {'+'.join(self.frameworks)}",
            }.get(slot.state, slot.state)
        self.progress.set_lane(slot.label, activity)

    def _show_waiting(self) -> None:
        now = time.monotonic()
        for slot in self.pool.slots:
            if slot.state == "acquiring" and now - slot.since > 1.0:
                self.progress.set_lane(slot.label, f"waiting for lease {now - slot.since:.0f} s")


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
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.utils import JobReturn, JobStatus, configure_log, setup_globals
    from omegaconf import open_dict, read_write

    from orchestrator.config import hydra_user_error
    from orchestrator.store import claim_sweep_dir

    setup_globals()
    configure_log(config.hydra.hydra_logging, config.hydra.verbose)
    sweep_dir = Path(str(config.hydra.sweep.dir))
    claim_sweep_dir(sweep_dir)  # at once, before composing every job: a second sweep learns now
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
    jobs = prepare_jobs([(n, o, t, str(s.hydra.sweep.dir)) for n, o, t, s in configs], settings)
    objectives = run_jobs(jobs, settings)
    returns = []
    for (_, overrides, task_cfg, sweep_config), value in zip(configs, objectives, strict=True):
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


def run_jobs(
    jobs: list[Job], settings: LaunchSettings, *, progress: Progress | None = None
) -> list[float]:
    """Run validated jobs on the pool of this machine; returns each job's objective.

    Raises:
        UserError: no usable GPU, a job refused by a GPU's policy or support, or a store
            directory another sweep is writing.
        StorageError: a row could not be stored (a full disk): the workers are closed, so every
            GPU is restored, and what was stored is kept.
    """
    from orchestrator.store import claim_sweep_dir

    if not jobs:
        return []
    for store_dir in sorted({j.store_dir for j in jobs}):  # before any GPU: one sweep per dir
        claim_sweep_dir(store_dir)
    progress = progress or Progress(0, enabled=settings.progress)
    t0 = time.monotonic()
    selections = {j.gpus_key: j.device.get("gpus") for j in jobs}
    pool = get_pool(settings, jobs[0].device, list(selections.values()), progress.note)
    pool.check(jobs)
    live = [s for s in pool.slots if s.state != "retired" and any(s.runs(j) for j in jobs)]
    if settings.placement == "every":
        progress.total = sum(1 for j in jobs for s in pool.slots if s.runs(j))
    else:
        progress.total = len(jobs)
    sup = Supervisor(pool, jobs, progress)
    try:
        objectives = sup.run()
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
    return objectives


__all__ = [
    "GpuPool",
    "Job",
    "LaunchSettings",
    "Supervisor",
    "close_pool",
    "failure_rows",
    "launch_batch",
    "prepare_jobs",
    "run_jobs",
]
