"""The worker: one long-lived process per GPU (a Ray actor) that runs that GPU's trials.

A ``GpuWorker`` owns one GPU for as long as it lives: its NVML handle, the guard's lease on it and a
cache of built kernels, so a sweep compiles each kernel once per GPU, not once per point. It runs
one trial at a time (a Ray actor executes one call at a time) and returns each trial's rows as
plain dicts; the driver stores them.

**Which GPU.** Ray gives a ``num_gpus=1`` actor one GPU id and sets ``CUDA_VISIBLE_DEVICES`` to it.
An id that is a UUID (``GPU-...``, when the node's ``CUDA_VISIBLE_DEVICES`` listed UUIDs) names the
GPU directly. A number is a CUDA ordinal in PCI bus order (the worker runs with
``CUDA_DEVICE_ORDER=PCI_BUS_ID``), so it is resolved to the node's GPUs sorted by PCI bus id, and
from then on the worker names its GPU by UUID only: NVML's own index is never trusted to match
CUDA's. On the simulated GPU the local Ray instance declares one logical GPU per simulated GPU, and
the same rule maps logical GPU ``k`` to the ``k``-th simulated GPU in PCI order. On ``device=cpu``
it declares one logical GPU, which stands for the host CPU (the backend's one device, index 0).

**Which machine.** On the simulated GPU a worker uses the simulated machine of its node: the
``DVFS_SIM_STATE_DIR`` of its process (passed by the driver for a local Ray instance, inherited
from ``ray start`` on a cluster node), joining the machine already there. So each node of a
cluster has its own simulated GPUs, as each real node has its own GPUs.

**Lifecycle.** ``identify`` (cheap; no lease) -> ``check`` (every job's settings against this GPU's
policy and support, changing nothing) -> ``acquire`` (restore what a killed predecessor left
changed, then take the GPU's lease, waiting while another sweep holds it; import the frameworks)
-> ``run`` (one trial) ... -> ``close``.

**The pool.** A ``GpuPool`` is the set of workers of one machine: it starts one worker per GPU
the Ray cluster declares (``num_gpus=1, num_cpus=0``), learns which GPU each got, keeps those
that some job's ``device.gpus`` (and the launcher's placement) selects, and checks every job
against every GPU it may run on before the supervisor (``orchestrator.launch``) sends any work.
``device.gpus`` is a job's *route*, not part of the machine: jobs that name different GPUs (the
stability sweeper pins each search to its GPU by UUID) share one pool, and each slot knows which
jobs' selections include its GPU. A process keeps one pool and reuses it for every batch of a
sweep (``get_pool``); a later batch that names a GPU the pool left out restarts it.

This module imports neither Ray nor a framework at import time.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import math
import os
import signal
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from orchestrator.errors import UserError
from orchestrator.guard import Journal

log = logging.getLogger(__name__)

# Set in every worker before any framework initialises a device (see DESIGN: "Rules").
WORKER_ENV = {
    "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
    "TF_FORCE_GPU_ALLOW_GROWTH": "true",
    "TF_CPP_MIN_LOG_LEVEL": "2",
}
SIM_STATE_ENV = "DVFS_SIM_STATE_DIR"
LOCAL_ONLY_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # "0": Ray's single-machine, loopback mode


def pci_order_key(pci_bus_id: str) -> tuple[int, ...]:
    """Sort key of a PCI bus id ``DDDDDDDD:BB:DD.F`` (CUDA's PCI_BUS_ID order)."""
    text = pci_bus_id.strip().lower()
    parts = text.replace(".", ":").split(":")
    try:
        return tuple(int(p, 16) for p in parts)
    except ValueError:
        return (1 << 62,)


def gpu_uuid_for(devices: list[Any], ray_gpu_id: Any) -> str:
    """The UUID of the GPU behind one Ray GPU id on this node.

    Args:
        devices: every ``Device`` of the node's backend.
        ray_gpu_id: what ``ray.get_gpu_ids()`` gave this process: a CUDA ordinal (PCI bus order)
            or a GPU UUID.

    Raises:
        DeviceNotFoundError: no such GPU on this node.
    """
    from orchestrator.errors import DeviceNotFoundError

    text = str(ray_gpu_id)
    if text.startswith(("GPU-", "MIG-")):
        if any(d.identity.uuid == text for d in devices):
            return text
        raise DeviceNotFoundError(f"Ray gave this worker GPU {text}, which NVML does not list here")
    ordered = sorted(devices, key=lambda d: pci_order_key(d.identity.pci_bus_id))
    k = int(float(text))
    if not 0 <= k < len(ordered):
        raise DeviceNotFoundError(
            f"Ray gave this worker GPU {k}, but this node has {len(ordered)} GPU(s): declare no "
            f"more GPUs to Ray (ray start --num-gpus) than the node has"
        )
    return ordered[k].identity.uuid


def node_device_cfg(device_cfg: Any) -> Any:
    """The job's ``device`` config as this node sees it (its own simulated machine)."""
    from omegaconf import DictConfig, OmegaConf

    cfg = OmegaConf.create(
        device_cfg if isinstance(device_cfg, dict) else OmegaConf.to_container(device_cfg)
    )
    assert isinstance(cfg, DictConfig)
    if cfg.get("backend") == "sim" and os.environ.get(SIM_STATE_ENV):
        cfg.state_dir = os.environ[SIM_STATE_ENV]
    for key in PER_JOB_KEYS:
        if key in cfg:
            cfg[key] = None  # the machine, not a job's settings or route: one session for all
    return cfg


class GpuWorker:
    """The process that owns one GPU and runs its trials (made a Ray actor by ``launch``).

    Args:
        device_cfg: the sweep's ``device`` config, as a plain dict.
        ray_gpu_id: which GPU; default: the one Ray assigned (``ray.get_gpu_ids()``).
    """

    def __init__(self, device_cfg: dict[str, Any], ray_gpu_id: Any = None) -> None:
        for key, value in WORKER_ENV.items():
            os.environ.setdefault(key, value)
        from orchestrator.devices import open_backend

        if ray_gpu_id is None:
            import ray

            ids = ray.get_gpu_ids()
            if not ids:
                raise RuntimeError("this worker holds no GPU: create it with num_gpus=1")
            ray_gpu_id = ids[0]
        self._cfg = node_device_cfg(device_cfg)
        self._ray_gpu_id = ray_gpu_id
        self._backend = open_backend(self._cfg, join_existing=True)
        self.uuid = gpu_uuid_for(list(self._backend.devices()), ray_gpu_id)
        self._device = self._backend.device(uuid=self.uuid)
        self._ctx: Any = None
        self._trials = 0

    # --- who am I ------------------------------------------------------------------------------
    def identify(self, selections: list[Any] = ()) -> dict[str, Any]:
        """This worker's GPU, node and process, and which ``device.gpus`` values select the GPU.

        First restores the GPU if a dead process (a killed earlier worker) left it changed, so
        a replaced worker puts its GPU back before anything else; ``restored`` says what it did.

        Args:
            selections: ``device.gpus`` values (None: every GPU) to answer for, on this node: an
                index or PCI bus id means this node's GPU of that number.
        """
        from orchestrator.devices import select_devices
        from orchestrator.errors import DvfsError

        restored = self._restore_dead_owner()
        selected: list[bool] = []
        select_errors: list[str | None] = []
        for gpus in selections:
            try:
                chosen = select_devices(self._backend, gpus)
            except DvfsError as e:
                selected.append(False)
                select_errors.append(str(e))
            else:
                selected.append(any(d.identity.uuid == self.uuid for d in chosen))
                select_errors.append(None)
        node_id = None
        try:
            import ray

            if ray.is_initialized():
                node_id = ray.get_runtime_context().get_node_id()
        except ImportError:  # pragma: no cover - ray is a dependency
            pass
        return {
            "uuid": self.uuid,
            "identity": asdict(self._device.identity),
            "ray_gpu_id": str(self._ray_gpu_id),
            "node_id": node_id,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "selected": selected,
            "select_errors": select_errors,
            "sim_state_dir": os.environ.get(SIM_STATE_ENV)
            if self._cfg.get("backend") == "sim"
            else None,
            "restored": restored,
        }

    def check(self, device_cfgs: list[dict[str, Any]]) -> list[str | None]:
        """Every job's settings against this GPU's policy and support; changes nothing.

        Args:
            device_cfgs: each job's resolved ``device`` config.

        Returns:
            One entry per job: None, or the one-line reason it is refused on this GPU.
        """
        from orchestrator.devices import journal_dir
        from orchestrator.errors import UserError
        from orchestrator.guard import SettingsGuard
        from orchestrator.policy import load_policy
        from orchestrator.trial import settings_request

        guards: dict[tuple[Any, bool], SettingsGuard] = {}
        errors: list[str | None] = []
        name = self._device.identity.name
        journal = Journal(journal_dir(self._cfg))
        for d in device_cfgs:
            key = (d.get("policy_file"), bool(d.get("observe_only")))
            try:
                if key not in guards:  # not entered: no lease, no journal entry, no change
                    guards[key] = SettingsGuard(
                        self._device, journal, load_policy(key[0], name), observe_only=key[1]
                    )
                guards[key].check(settings_request(_Attrs(d)))
                errors.append(None)
            except UserError as e:
                errors.append(str(e))
        return errors

    # --- take the GPU --------------------------------------------------------------------------
    def acquire(self, lease_wait_s: float | None = None) -> dict[str, Any]:
        """Restore what a dead predecessor left changed, then take the GPU's lease.

        Waits while another live process (another sweep) holds the lease; never fails for that
        before ``lease_wait_s`` has passed (None: wait as long as it takes).

        Returns:
            ``{"ok": True, "waited_s", "restored": [...]}``, or ``{"ok": False, "error"}`` when
            the lease was not free in time.
        """
        from orchestrator import app
        from orchestrator.errors import DeviceBusyError, UnrestoredDeviceError

        # The process's GPU session is this worker's backend, which joined the node's machine
        # (``open_context`` would otherwise open the job's machine spec, not the node's).
        if app._session is None:
            app._session = app.GpuSession(
                machine_key=app._machine_key(self._cfg), backend=self._backend
            )
        t0 = time.monotonic()
        restored = self._restore_dead_owner()
        delay_s = 0.05
        while True:
            try:
                self._ctx = app.open_context(self._cfg, "", device_uuid=self.uuid)
                break
            except UnrestoredDeviceError:  # its owner died between our look and our lease
                restored += self._restore_dead_owner()
            except DeviceBusyError as e:
                if lease_wait_s is not None and time.monotonic() - t0 >= lease_wait_s:
                    return {
                        "ok": False,
                        "error": f"{e} (waited {lease_wait_s:g} s: hydra.launcher.lease_wait_s)",
                    }
                time.sleep(delay_s)
                delay_s = min(delay_s * 1.5, 1.0)
        return {"ok": True, "waited_s": time.monotonic() - t0, "restored": restored}

    def warm(self, frameworks: tuple[str, ...] = ()) -> dict[str, Any]:
        """Import the sweep's frameworks now (seconds each), so no trial's time limit pays it."""
        from kernels import _frameworks

        t0 = time.monotonic()
        for name in frameworks:
            {"jax": _frameworks.import_jax, "tensorflow": _frameworks.import_tensorflow}[name]()
        return {"import_s": time.monotonic() - t0}

    def _restore_dead_owner(self) -> list[str]:
        """Restore this GPU's journal entry if its owner is dead (a killed earlier worker)."""
        from orchestrator.devices import journal_dir
        from orchestrator.guard import restore_journal

        journal = _OneGpuJournal(journal_dir(self._cfg), self.uuid)
        actions = restore_journal(journal, lambda uuid: self._backend.device(uuid=uuid))
        return [a.describe() for a in actions if not a.skipped_reason]

    # --- trials --------------------------------------------------------------------------------
    def run(self, resolved: dict[str, Any], sweep_id: str) -> dict[str, Any]:
        """Run one trial and return its rows (plain dicts), this worker's counters and its GPU's
        health after the trial.

        A GPU that is already unhealthy (``Device.health``) runs nothing: the answer is
        ``{"unhealthy": reason, "rows": []}``, so that the supervisor retires the GPU and gives
        the job to another one. ``unhealthy`` beside rows means the GPU failed during this trial.

        Args:
            resolved: the job's resolved config.
            sweep_id: stamped on every row.
        """
        from omegaconf import OmegaConf

        from orchestrator import inject
        from orchestrator.trial import run_trial

        if self._ctx is None:
            raise RuntimeError("GpuWorker.run before acquire")
        ctx = self._ctx
        before = ctx.device.health()
        if not before.ok:
            return {"rows": [], "unhealthy": before.reason, "pid": os.getpid()}
        ctx.sweep_id = sweep_id
        cfg = OmegaConf.create(resolved)
        inject.arm(
            resolved["device"].get("inject"),
            ctx.device,
            sweep_id=sweep_id,
            workload=cfg.workload.name,
        )
        started_at = time.time()
        t0 = time.perf_counter()
        try:
            rows = run_trial(ctx, cfg, resolved)
        finally:
            inject.disarm(ctx.device)
        trial_s = time.perf_counter() - t0
        self._trials += 1
        after = ctx.device.health()
        return {
            "unhealthy": None if after.ok else after.reason,
            "rows": rows,
            "trial_started_at": started_at,
            "trial_ended_at": started_at + trial_s,
            "trial_s": trial_s,
            "builds": int(getattr(ctx.kernels, "builds", 0)),
            "trials": self._trials,
            "pid": os.getpid(),
        }

    def close(self) -> None:
        """Restore the GPU and release its lease (the process may then be killed)."""
        from orchestrator.app import close_session

        close_session()
        self._ctx = None


class _Attrs:
    """Attribute access over a plain dict (``settings_request`` reads ``cfg.sm_clock_mhz``...)."""

    def __init__(self, d: dict[str, Any]) -> None:
        self._d = d

    def __getattr__(self, name: str) -> Any:
        return self._d.get(name)


class _OneGpuJournal(Journal):
    """A view of a node's journal that lists one GPU's entry only."""

    def __init__(self, directory: Any, uuid: str) -> None:
        super().__init__(directory)
        self._uuid = uuid

    def uuids(self) -> list[str]:
        return [u for u in super().uuids() if u == self._uuid]


# --- the pool: one worker per GPU -------------------------------------------------------------
SETTING_KEYS = ("sm_clock_mhz", "mem_clock_mhz", "power_limit_w", "clock_offset_mhz", "inject")
ROUTING_KEYS = ("gpus",)  # which of the machine's GPUs a job may run on
PER_JOB_KEYS = (*SETTING_KEYS, *ROUTING_KEYS)  # device keys the jobs of one pool may differ in


def machine_key(device: dict[str, Any]) -> str:
    """The part of a resolved ``device`` config that names the machine (not a job's settings or
    the GPUs it may run on)."""
    return json.dumps(
        {k: v for k, v in device.items() if k not in PER_JOB_KEYS}, sort_keys=True, default=str
    )


def selection_key(gpus: Any) -> str:
    """One ``device.gpus`` value as a key (None, the default, selects every GPU)."""
    return json.dumps(gpus, default=str)


@dataclass
class Slot:
    """One GPU of the pool and the worker that owns it."""

    uuid: str
    info: dict[str, Any]  # the worker's identify(): identity, node, host, pid, Ray GPU id
    actor: Any
    state: str = "identified"  # identified | starting | acquiring | warming | idle | busy | retired
    ref: Any = None  # the call in flight
    job: Any = None  # the job of the trial in flight (orchestrator.launch.Job)
    deadline: float = math.inf  # time.monotonic() by which the call in flight must be back
    since: float = 0.0  # time.monotonic() the current state began
    dispatched_at: float | None = None  # Unix seconds the trial in flight was sent
    deaths_in_a_row: int = 0
    restarts: int = 0  # workers started after the first one
    builds: int = 0  # kernels the worker has built (its cache's counter)
    parked: list[Any] = field(default_factory=list)  # replacements that landed on another GPU
    queue: deque = field(default_factory=deque)  # placement=every: this GPU's jobs
    retired_reason: str | None = None
    selections: set[str] = field(default_factory=set)  # selection_key()s of device.gpus that pick it

    def runs(self, job: Any) -> bool:
        """True if the job's ``device.gpus`` selects this GPU (the job may run here)."""
        return job.gpus_key in self.selections

    @property
    def label(self) -> str:
        """``gpu2`` (one node) or ``gpu2@host`` (a cluster); ``cpu0`` for the host CPU."""
        identity = self.info["identity"]
        name = f"{'cpu' if identity.get('backend') == 'cpu' else 'gpu'}{identity['index']}"
        return f"{name}@{self.info['host']}" if self.info.get("multi_node") else name

    @property
    def node_id(self) -> str | None:
        return self.info.get("node_id")


class GpuPool:
    """The workers of one machine (one ``device`` config) on a local Ray instance or a cluster.

    Args:
        settings: the launcher's settings (``orchestrator.launch.LaunchSettings``).
        device: the sweep's resolved ``device`` config (its settings and ``gpus`` are ignored).
        selections: the ``device.gpus`` values of the jobs it will run; it keeps every GPU that
            one of them selects.
    """

    def __init__(self, settings: Any, device: dict[str, Any], selections: list[Any]) -> None:
        self.settings = settings
        self.device = {k: (None if k in PER_JOB_KEYS else v) for k, v in device.items()}
        self.selections = {selection_key(g): g for g in selections}
        self.key = settings.pool_key() + machine_key(device)
        self.slots: list[Slot] = []
        self.inflight: dict[
            Any, tuple[Slot, str]
        ] = {}  # object ref -> (slot, call), across batches
        self.started_ray = False
        self._actor_cls: Any = None
        self._node_gpus: dict[str | None, int] = {}

    # --- Ray ---------------------------------------------------------------------------------
    def _ensure_ray(self) -> None:
        import ray

        if ray.is_initialized():
            return
        quiet = {"log_to_driver": self.settings.log_to_driver, "logging_level": logging.WARNING}
        with _keeping_sigterm_handler():
            self._init_ray(quiet)
        self.started_ray = True

    def _init_ray(self, quiet: dict[str, Any]) -> None:
        """Start a local Ray instance, or join the cluster at ``address``.

        A local instance listens on loopback only (see ``start``), its web dashboard is off (on,
        with ``hydra.launcher.dashboard=true``, at 127.0.0.1:8265), and every call to it needs the
        token Ray keeps in ``~/.ray/auth_token`` (token authentication, Ray's default for a local
        instance since 2.59; ``RAY_AUTH_MODE=disabled`` in the user's environment turns it off,
        nothing here does).
        """
        import ray

        if self.settings.address is None:
            # One logical GPU per simulated GPU, one for the host CPU; real GPUs: Ray counts them.
            declared = {"sim": int(self.device.get("count") or 1), "cpu": 1}
            ray.init(
                address="local",
                num_gpus=declared.get(self.device.get("backend")),
                include_dashboard=bool(self.settings.dashboard),
                dashboard_host="127.0.0.1",
                **quiet,
            )
        else:
            join_ray(self.settings.address, **quiet)

    def _worker_env(self) -> dict[str, str]:
        """Every worker's environment (on one machine also: where the sim and journal are)."""
        from orchestrator.devices import JOURNAL_ENV, sim_state_dir

        env = dict(WORKER_ENV)
        if self.settings.address is None:
            if self.device.get("backend") == "sim":
                env[SIM_STATE_ENV] = str(sim_state_dir(self.device))
            if os.environ.get(JOURNAL_ENV):
                env[JOURNAL_ENV] = os.environ[JOURNAL_ENV]
        return env

    def spawn(self, node_id: str | None = None) -> Any:
        """Start a worker (on ``node_id`` if given); Ray picks which free GPU it gets."""
        import ray

        if self._actor_cls is None:
            self._actor_cls = ray.remote(GpuWorker)
        options: dict[str, Any] = {
            "num_gpus": 1,
            "num_cpus": self.settings.num_cpus,
            "max_restarts": 0,  # the supervisor replaces workers itself, and records why
            "runtime_env": {"env_vars": self._worker_env()},
        }
        if self.settings.resources:
            options["resources"] = dict(self.settings.resources)
        if node_id is not None:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(
                node_id=node_id, soft=False
            )
        return self._actor_cls.options(**options).remote(self.device)

    def node_gpus(self, node_id: str | None) -> int:
        """How many GPUs the node had when the pool started."""
        return self._node_gpus.get(node_id, 1)

    # --- start, select, check ----------------------------------------------------------------
    def start(self, note: Callable[[str], None]) -> None:
        """Start one worker per GPU of the Ray cluster, learn each one's GPU, keep the selected.

        Args:
            note: prints a line for the user.

        Raises:
            UserError: no GPU in the cluster, none selected, or two workers on one GPU.
        """
        # A local instance is one machine: in Ray's single-machine mode its node address is
        # 127.0.0.1, so every server it starts listens on loopback only (``ray.init`` turns a
        # ``_node_ip_address`` of 127.0.0.1 into the machine's public address). Ray reads the
        # variable when it is first imported, and the processes ``ray.init`` starts inherit it;
        # it is then taken out again, so that a later ``ray start`` of this process's children
        # may still join a cluster. A user's own value wins.
        local_only = self.settings.address is None and LOCAL_ONLY_ENV not in os.environ
        if local_only:
            os.environ[LOCAL_ONLY_ENV] = "0"
        try:
            import ray

            if self.settings.address is None and self.device.get("backend") == "sim":
                self._create_local_sim()
            self._ensure_ray()
        finally:
            if local_only:
                os.environ.pop(LOCAL_ONLY_ENV, None)
        if self.started_ray:
            atexit.register(close_pool)  # after ray.init's own: runs before Ray shuts down
        total = int(ray.cluster_resources().get("GPU", 0))
        if total <= 0:
            raise UserError(
                f"the Ray cluster at {self.settings.address} declares no GPUs: start its nodes "
                f"with "
                f"`ray start --num-gpus=N`"
            )
        note(f"ray_gpus: starting {total} worker(s), one per GPU")
        actors = [self.spawn() for _ in range(total)]
        refs = {a.identify.remote(list(self.selections.values())): a for a in actors}
        ready, not_ready = ray.wait(
            list(refs), num_returns=len(refs), timeout=self.settings.start_timeout_s
        )
        infos: list[tuple[dict[str, Any], Any]] = []
        errors: list[str] = []
        for ref in ready:
            try:
                infos.append((ray.get(ref), refs[ref]))
            except ray.exceptions.RayError as e:
                errors.append(first_line(e))
                kill(refs[ref])
        for ref in not_ready:
            kill(refs[ref])
        if not_ready:
            note(
                f"ray_gpus: {len(not_ready)} GPU(s) were not free within "
                f"{self.settings.start_timeout_s:g} s"
            )
        if not infos:
            raise UserError(
                f"no worker could start on a GPU: {errors[0] if errors else 'none became free'}"
            )
        for info, _ in infos:
            for action in info["restored"]:
                note(f"ray_gpus: {action} (left changed by a killed process)")
        self._refuse_duplicates([i for i, _ in infos])
        wanted = self._select([i for i, _ in infos])
        multi_node = len({i["node_id"] for i, _ in infos}) > 1
        now = time.monotonic()
        for info, actor in infos:
            self._node_gpus[info["node_id"]] = self._node_gpus.get(info["node_id"], 0) + 1
            info["multi_node"] = multi_node
            if info["uuid"] in wanted:
                slot = Slot(uuid=info["uuid"], info=info, actor=actor, since=now)
                slot.selections = wanted[info["uuid"]]
                self.slots.append(slot)
            else:
                kill(actor)
        self.slots.sort(
            key=lambda s: (s.info["host"], s.node_id or "", s.info["identity"]["index"])
        )

    def _create_local_sim(self) -> None:
        """On one machine, create (or check) the simulated machine once, as ``dvfs sweep`` does."""
        from orchestrator.devices import open_backend

        try:
            open_backend(self.device).close()
        except ValueError as e:  # the sim's MachineSpecError and ProfileError
            raise UserError(str(e)) from e

    @staticmethod
    def _refuse_duplicates(infos: list[dict[str, Any]]) -> None:
        seen: dict[str, dict[str, Any]] = {}
        for info in infos:
            other = seen.setdefault(info["uuid"], info)
            if other is not info:
                raise UserError(
                    f"two workers see GPU {info['uuid']} (hosts {other['host']} and "
                    f"{info['host']}, sim state {other.get('sim_state_dir')} and "
                    f"{info.get('sim_state_dir')}): on a "
                    f"simulated cluster give each node its own DVFS_SIM_STATE_DIR and device.seed"
                )

    def _select(self, infos: list[dict[str, Any]]) -> dict[str, set[str]]:
        """GPU uuid -> the selections that pick it, for every GPU some selection picks.

        Raises:
            UserError: a placement UUID no worker found, or a ``device.gpus`` that picks no GPU.
        """
        placement = self.settings.placement
        found = sorted(i["uuid"] for i in infos)
        if isinstance(placement, tuple):
            missing = [u for u in placement if u not in found]
            if missing:
                raise UserError(
                    f"hydra.launcher.placement names GPU(s) no worker found: {', '.join(missing)}; "
                    f"found: {', '.join(found)}"
                )
        keys = list(self.selections)
        chosen: dict[str, set[str]] = {}
        for i in infos:
            if isinstance(placement, tuple) and i["uuid"] not in placement:
                continue
            picked = {k for k, ok in zip(keys, i["selected"]) if ok}
            if picked:
                chosen[i["uuid"]] = picked
        for n, key in enumerate(keys):
            if any(key in picked for picked in chosen.values()):
                continue
            reasons = sorted({i["select_errors"][n] for i in infos if i["select_errors"][n]})
            raise UserError(
                f"no GPU is selected by device.gpus={self.selections[key]}"
                + (
                    f": {reasons[0]}"
                    if reasons
                    else f" and placement={placement}; found: {', '.join(found)}"
                )
            )
        return chosen

    def check(self, jobs: list[Any]) -> None:
        """Every job's settings against each GPU it may run on (policy, support), before anything
        runs.

        Raises:
            UserError: the first refused (job, GPU), on one line.
        """
        import ray

        unique: dict[str, dict[str, Any]] = {}
        for j in jobs:
            unique.setdefault(json.dumps(j.device, sort_keys=True, default=str), j.device)
        cfgs = list(unique.values())
        live = [s for s in self.slots if s.state != "retired"]
        refused: dict[str, list[tuple[Slot, str]]] = {}
        for slot, ref in [(s, s.actor.check.remote(cfgs)) for s in live]:
            try:
                errs = ray.get(ref)
            except ray.exceptions.RayActorError:
                continue  # a worker being replaced; the supervisor sees to it
            for key, err in zip(unique, errs):
                if err is not None:
                    refused.setdefault(key, []).append((slot, err))
        for j in jobs:
            hits = refused.get(json.dumps(j.device, sort_keys=True, default=str), [])
            for slot, err in hits:
                if slot.runs(j):
                    raise UserError(
                        f"job #{j.num} ({j.what}) on {slot.label} ({slot.uuid}): {err}; "
                        f"nothing was run"
                    )

    def close(self) -> None:
        """Restore every GPU, release the leases, end the workers."""
        import ray

        if ray.is_initialized():
            live = [s.actor for s in self.slots if s.state != "retired"]
            refs = [a.close.remote() for a in live]
            if refs:
                ray.wait(refs, num_returns=len(refs), timeout=15)
            for s in self.slots:
                for actor in [s.actor, *s.parked]:
                    kill(actor)
        self.slots.clear()
        self.inflight.clear()


def join_ray(address: str, **init_kwargs: Any) -> None:
    """Connect this process to a running Ray cluster (``auto``, ``host:port`` or ``ray://...``).

    A cluster started by ``ray start`` uses token authentication (Ray 2.60); ``ray.init`` turns
    it on for ``address="auto"`` when it finds the token (``~/.ray/auth_token``,
    ``RAY_AUTH_TOKEN_PATH`` or ``RAY_AUTH_TOKEN``) but not for an explicit address, which then
    fails with ``InvalidAuthToken``: turn it on the same way for every address.
    """
    import ray

    try:
        from ray._private.authentication.authentication_token_setup import (
            maybe_enable_token_auth_if_token_available,
        )
    except ImportError:  # another Ray version: nothing to do
        pass
    else:
        if not address.startswith("ray://"):
            maybe_enable_token_auth_if_token_available(warn_if_disabled=False)
    ray.init(address=address, **init_kwargs)


@contextlib.contextmanager
def _keeping_sigterm_handler() -> Iterator[None]:
    """Keep this process's SIGTERM handler across ``ray.init``.

    ``ray.init`` replaces it (Python's with ``sys.exit``, then its core worker's C++ handler, which
    prints a stack and aborts): ``dvfs sweep`` handles SIGTERM itself, closing the workers (each
    restores its GPU) and keeping every stored row.
    """
    main = threading.current_thread() is threading.main_thread()
    handler = signal.getsignal(signal.SIGTERM) if main else None
    try:
        yield
    finally:
        if main and handler is not None:
            signal.signal(signal.SIGTERM, handler)


def kill(actor: Any) -> None:
    """End a worker now (SIGKILL: what it was doing is lost; its lease is freed by the OS)."""
    import ray

    try:
        ray.kill(actor, no_restart=True)
    except Exception:  # noqa: BLE001 - already gone, or Ray is down
        pass


def first_line(e: BaseException) -> str:
    """The first line of what went wrong in a worker (the cause of a RayTaskError)."""
    cause = getattr(e, "cause", None)
    text = f"{type(cause).__name__}: {cause}" if isinstance(cause, BaseException) else str(e)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[0][:500] if lines else type(e).__name__


_pool: GpuPool | None = None


def get_pool(
    settings: Any, device: dict[str, Any], selections: list[Any], note: Callable[[str], None]
) -> GpuPool:
    """The process's pool for this machine and these settings (started once, then reused).

    Args:
        settings: the launcher's settings.
        device: the batch's resolved ``device`` config.
        selections: the batch's ``device.gpus`` values; a pool that lacks a GPU one of them picks
            is restarted with every selection it had and the new ones.
        note: prints a line for the user.
    """
    global _pool
    key = settings.pool_key() + machine_key(device)
    wanted = {selection_key(g): g for g in selections}
    if _pool is not None and _pool.key == key and not wanted.keys() <= _pool.selections.keys():
        note("ray_gpus: this batch names GPUs the workers were not started for; restarting them")
        wanted = {**_pool.selections, **wanted}
        close_pool()
    if _pool is not None and _pool.key != key:
        close_pool()
    if _pool is None:
        pool = GpuPool(settings, device, list(wanted.values()))
        pool.start(note)
        _pool = pool
    _pool.settings = settings  # limits may change between batches; the workers stay
    return _pool


def close_pool() -> None:
    """End the process's pool of workers (also runs at exit)."""
    global _pool
    pool, _pool = _pool, None
    if pool is not None:
        try:
            pool.close()
        except Exception as e:  # noqa: BLE001 - at exit, Ray may already be down
            log.debug("closing the worker pool: %s", e)
