"""The worker: one long-lived process per GPU (a Ray actor) that runs that GPU's trials.

A ``GpuWorker`` owns one GPU for as long as it lives: its NVML handle, the guard's lease on it and a
cache of built kernels (a ``session.GpuSession`` over the backend it opened), so a sweep compiles
each kernel once per GPU, not once per point. It runs one trial at a time (a Ray actor executes
one call at a time) and returns each trial's rows as plain dicts inside a typed reply; the driver
(``orchestrator.launching.pool`` and ``orchestrator.launching.supervisor``) stores them. Every reply
that crosses the process boundary is a small frozen dataclass defined here (``WorkerInfo``,
``AcquireReply``, ``TrialReply``), so the driver reads attributes that a type checker knows, never
dict keys.

**Which GPU, which machine** (``orchestrator.devices.mapping``). Ray's GPU id (a CUDA ordinal in
PCI bus order, or a UUID) is resolved to the node's GPU once, and from then on the worker names
its GPU by UUID only. On the simulated GPU a worker joins its node's simulated machine (the
``DVFS_SIM_STATE_DIR`` of its process), as each real node has its own GPUs.

**Lifecycle.** ``identify`` (cheap; no lease) -> ``check`` (every job's settings against this GPU's
policy and support, changing nothing) -> ``acquire`` (restore what a killed predecessor left
changed, then take the GPU's lease, waiting while another sweep holds it) -> ``warm`` (import the
frameworks) -> ``run`` (one trial) ... -> ``close``. No Ray nor framework import at import time.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.config import DeviceConfig, to_device_config
from orchestrator.devices import SIM_STATE_ENV
from orchestrator.devices.base import DeviceIdentity
from orchestrator.devices.mapping import gpu_uuid_for, node_device_config, node_devices
from orchestrator.errors import DeviceLostError
from orchestrator.jobs.replies import AcquireReply, TrialReply, WorkerInfo
from orchestrator.measuring.journal import Journal
from orchestrator.measuring.trial_trace import clear_closing, closing

if TYPE_CHECKING:
    from orchestrator.jobs.job import JobSpec
    from orchestrator.measuring.session import GpuSession
    from orchestrator.measuring.trial import TrialContext

# Set in every worker before any framework initialises a device (see DESIGN: "Rules").
WORKER_ENV = {
    "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
    "TF_FORCE_GPU_ALLOW_GROWTH": "true",
    "TF_CPP_MIN_LOG_LEVEL": "2",
    "CUBLAS_WORKSPACE_CONFIG": ":4096:8",  # PyTorch's deterministic cuBLAS, before CUDA starts
}
STOPPING = "not run: the sweep is stopping"  # a reply to a driver that marked the GPU closing

def _ray_node_id() -> str | None:
    """The Ray node this process runs on (None outside Ray)."""
    import ray

    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None


def _import_frameworks(names: tuple[str, ...]) -> None:
    """Import each framework (``jax``, ``tensorflow``, ``pytorch``) the way a kernel build will."""
    from kernels.frameworks import import_jax, import_tensorflow, import_torch

    importers = {"jax": import_jax, "tensorflow": import_tensorflow, "pytorch": import_torch}
    for name in names:
        importers[name]()


class GpuWorker:
    """The process that owns one GPU and runs its trials (made a Ray actor by ``pool.GpuPool``).

    Args:
        device_cfg: the sweep's ``device`` config (a plain mapping, as the driver sends it, is
            typed here: ``devices.mapping.node_device_config``).
        ray_gpu_id: which GPU; default: the one Ray assigned (``ray.get_gpu_ids()``).
        env: variables this process must have before anything reads them (the driver's
            ``pool.GpuPool._worker_env``: ``WORKER_ENV``, where the sim and journal are), set over
            what the process inherited. The driver sends them here rather than as Ray's
            ``runtime_env``: an actor with a runtime env starts through Ray's ``setup_worker.py``,
            a second Python start that imports Ray before the worker's own
            (``scripts/bench_pool_start.py`` measures what it adds to each worker's start).
            Without ``env`` (a worker made in-process), ``WORKER_ENV`` fills only what is unset.
    """

    def __init__(
        self, device_cfg: DeviceConfig | Mapping[str, Any], ray_gpu_id: str | int | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        os.environ.update(env or {})
        for key, value in WORKER_ENV.items():
            os.environ.setdefault(key, value)
        from orchestrator.devices import open_backend

        if ray_gpu_id is None:
            import ray

            backend = dict(device_cfg).get("backend") if hasattr(device_cfg, "keys") else getattr(
                device_cfg, "backend", None)
            ids = (ray.get_runtime_context().get_accelerator_ids().get("TPU") or []
                   if backend == "tpu" else ray.get_gpu_ids())
            if not ids:
                raise RuntimeError("this worker holds no GPU: create it with num_gpus=1")
            ray_gpu_id = ids[0]
        self._cfg = node_device_config(device_cfg)
        self._ray_gpu_id = ray_gpu_id
        self._backend = open_backend(self._cfg, join_existing=True)
        self._session: GpuSession | None = None  # from acquire on
        self._ctx: TrialContext | None = None
        self._trials = 0
        self._lost: str | None = None  # its GPU fell off the bus: identify says so, nothing runs
        try:
            self.uuid = gpu_uuid_for(node_devices(self._backend), ray_gpu_id)
        except DeviceLostError as e:  # alive, it holds the lost GPU: Ray places no other there
            self._lost = str(e)
            return
        self._device = self._backend.device(uuid=self.uuid)

    # --- who am I ------------------------------------------------------------------------------
    def identify(self, selections: list[Any] = ()) -> WorkerInfo:
        """This worker's GPU, node and process, and which ``device.gpus`` values select the GPU.

        First restores the GPU if a dead process (a killed earlier worker) left it changed, so
        a replaced worker puts its GPU back before anything else; ``restored`` says what it did,
        and ``dead_trace`` what the dead worker's trial was doing
        (``orchestrator.measuring.trial_trace``).

        Args:
            selections: ``device.gpus`` values (None: every GPU) to answer for, on this node: an
                index or PCI bus id means this node's GPU of that number.
        """
        from orchestrator.measuring import trial_trace
        if self._lost is not None:
            raise DeviceLostError(self._lost)
        restored = self._restore_dead_owner()
        dead_trace = trial_trace.take_trace(self._journal(), self.uuid)
        selected, select_errors = self._selected(selections)
        sim = self._cfg.backend == "sim"
        return WorkerInfo(
            uuid=self.uuid,
            identity=DeviceIdentity(**asdict(self._device.identity)),
            ray_gpu_id=str(self._ray_gpu_id),
            node_id=_ray_node_id(),
            host=socket.gethostname(),
            pid=os.getpid(),
            selected=selected,
            select_errors=select_errors,
            sim_state_dir=os.environ.get(SIM_STATE_ENV) if sim else None,
            restored=tuple(restored),
            dead_trace=dead_trace,
        )

    def _selected(self, selections: list[Any]) -> tuple[tuple[bool, ...], tuple[str | None, ...]]:
        """Per ``device.gpus`` value: does it select this GPU, and why it selects none here."""
        from orchestrator.devices import select_devices
        from orchestrator.errors import DvfsError

        selected: list[bool] = []
        errors: list[str | None] = []
        for gpus in selections:
            try:
                chosen = select_devices(self._backend, gpus)
            except DvfsError as e:
                selected.append(False)
                errors.append(str(e))
            else:
                selected.append(any(d.identity.uuid == self.uuid for d in chosen))
                errors.append(None)
        return tuple(selected), tuple(errors)

    def check(self, device_cfgs: list[DeviceConfig | Mapping[str, Any]]) -> list[str | None]:
        """Every job's settings against this GPU's policy and support; changes nothing.

        Args:
            device_cfgs: each job's resolved ``device`` config (a plain mapping is typed first).

        Returns:
            One entry per job: None, or the one-line reason it is refused on this GPU.
        """
        from orchestrator.errors import UserError
        from orchestrator.jobs.policy import load_policy
        from orchestrator.jobs.request import settings_request
        from orchestrator.measuring.guard import SettingsGuard

        guards: dict[tuple[str | None, bool], SettingsGuard] = {}
        errors: list[str | None] = []
        name = self._device.identity.name
        journal = Journal(self._journal())
        for d in map(to_device_config, device_cfgs):
            key = (d.policy_file, bool(d.observe_only))
            try:
                if key not in guards:  # not entered: no lease, no journal entry, no change
                    guards[key] = SettingsGuard(
                        self._device, journal, load_policy(key[0], name), observe_only=key[1]
                    )
                guards[key].check(settings_request(d))
                errors.append(None)
            except UserError as e:
                errors.append(str(e))
        return errors

    # --- take the GPU --------------------------------------------------------------------------
    def acquire(self, lease_wait_s: float | None = None) -> AcquireReply:
        """Restore what a dead predecessor left changed, then take the GPU's lease.

        Waits while another live process (another sweep) holds the lease; never fails for that
        before ``lease_wait_s`` has passed (None: wait as long as it takes). The GPU's session is
        this worker's backend, which joined the node's machine (a session of its own would open
        the job's machine spec, not the node's).
        """
        from orchestrator.errors import DeviceBusyError, UnrestoredDeviceError
        from orchestrator.measuring.session import GpuSession

        if self._session is None:
            self._session = GpuSession(backend=self._backend)
        t0 = time.monotonic()
        restored = self._restore_dead_owner()
        delay_s = 0.05
        while True:
            try:
                self._ctx = self._session.context(self._cfg, device_uuid=self.uuid)
                break
            except UnrestoredDeviceError:  # its owner died between our look and our lease
                restored += self._restore_dead_owner()
            except DeviceBusyError as e:
                if lease_wait_s is not None and time.monotonic() - t0 >= lease_wait_s:
                    error = f"{e} (waited {lease_wait_s:g} s: hydra.launcher.lease_wait_s)"
                    return AcquireReply(ok=False, error=error)
                time.sleep(delay_s)
                delay_s = min(delay_s * 1.5, 1.0)
        clear_closing(self._journal(), self.uuid)  # an earlier sweep's mark
        return AcquireReply(ok=True, waited_s=time.monotonic() - t0, restored=tuple(restored))

    def warm(self, frameworks: tuple[str, ...] = ()) -> float:
        """Import the sweep's frameworks now (seconds each), so no trial's time limit pays it.

        Returns:
            The seconds the imports took.
        """
        t0 = time.monotonic()
        _import_frameworks(frameworks)
        return time.monotonic() - t0

    def _restore_dead_owner(self) -> list[str]:
        """Restore this GPU's journal entry if its owner is dead (a killed earlier worker)."""
        from orchestrator.measuring.journal import restore_journal

        journal = _OneGpuJournal(self._journal(), self.uuid)
        actions = restore_journal(journal, lambda uuid: self._backend.device(uuid=uuid))
        return [a.describe() for a in actions if not a.skipped_reason]

    # --- trials --------------------------------------------------------------------------------
    def run(self, job: JobSpec, sweep_id: str, attempt: int = 1) -> TrialReply:
        """Run one trial (``trial.run_trial``) and return its rows, this worker's counters and
        its GPU's health after the trial.

        A GPU that is already unhealthy (``Device.health``) runs nothing: the reply has no rows
        and says why (``unhealthy``), so that the supervisor retires the GPU and gives the job
        to another one. ``unhealthy`` beside rows means the GPU failed during this trial. While
        the trial runs, the worker keeps its trace on the node
        (``orchestrator.measuring.trial_trace``); a stopping driver marks the GPU closing, and the
        trial stops at its next chunk of calls.

        Args:
            job: the validated job (sent as is: a ``JobSpec`` pickles).
            sweep_id: stamped on every row.
            attempt: which attempt at the trial this is (stamped on every row).
        """
        from kernels.registry import adopt_workload
        from orchestrator import interrupt
        from orchestrator.measuring import inject, trial_trace
        from orchestrator.measuring.trial import run_trial

        if self._ctx is None:
            raise RuntimeError("GpuWorker.run before acquire")
        if job.workload_spec is not None:  # a user's workload, loaded on the driver: known here
            adopt_workload(job.workload_spec)
        ctx, where = self._ctx, self._journal()
        if closing(where, self.uuid):  # a queued trial of a sweep that stopped
            return TrialReply(unhealthy=STOPPING, pid=os.getpid())
        before = ctx.device.health()
        if not before.ok:
            return TrialReply(unhealthy=before.reason, pid=os.getpid())
        ctx.sweep_id = sweep_id
        trace = trial_trace.begin(where, self.uuid, job.trial_key(self.uuid))
        ctx.on_kernel_calls = lambda: trial_trace.kernel_calls(where, self.uuid, trace)
        inject.arm(job.inject, ctx.device, sweep_id=sweep_id,
                   workload=job.workload_name)
        started_at, t0 = time.time(), time.perf_counter()
        try:
            with interrupt.watch(lambda: STOPPING if closing(where, self.uuid) else None):
                rows = run_trial(ctx, job, attempt=attempt)
        except KeyboardInterrupt:  # its driver stops: the GPU was put back, nothing is kept
            return TrialReply(unhealthy=STOPPING, pid=os.getpid())
        finally:
            inject.disarm(ctx.device)
            ctx.on_kernel_calls = None
            trial_trace.end(where, self.uuid)
        trial_s = time.perf_counter() - t0
        self._trials += 1
        after = ctx.device.health()
        return TrialReply(
            rows=rows,
            unhealthy=None if after.ok else after.reason,
            pid=os.getpid(),
            trial_started_at=started_at,
            trial_ended_at=started_at + trial_s,
            trial_s=trial_s,
            builds=int(getattr(ctx.kernels, "builds", 0)),
            trials=self._trials,
        )

    def _journal(self) -> Path:
        """This node's journal directory: the guard's journal, trial traces, closing marks."""
        from orchestrator.devices import journal_dir

        return journal_dir(self._cfg)

    def close(self) -> None:
        """Restore the GPU and release its lease (the process may then be killed)."""
        session, self._session, self._ctx = self._session, None, None
        if session is not None:
            try:
                session.close()
            finally:
                self._backend.close()
                clear_closing(self._journal(), self.uuid)


class _OneGpuJournal(Journal):
    """A view of a node's journal that lists one GPU's entry only."""

    def __init__(self, directory: Path, uuid: str) -> None:
        super().__init__(directory)
        self._uuid = uuid

    def uuids(self) -> list[str]:
        """The node journal's entries, this GPU's only."""
        return [u for u in super().uuids() if u == self._uuid]
