"""The driver's pool of GPU workers: one Ray actor per GPU, and Ray's lifetime under them.

A ``GpuPool`` is the set of workers of one machine: it starts one ``worker.GpuWorker`` per GPU
the Ray cluster declares (``num_gpus=1, num_cpus=0``), learns which GPU each got (a ``WorkerInfo``),
keeps those that some job's ``device.gpus`` (and the launcher's placement)
selects (``launching.scheduling`` then checks each job's settings against each GPU, before
the supervisor, ``orchestrator.launching.supervisor``, sends any work). ``device.gpus`` is a job's
*route*, not part of the machine: jobs that name different GPUs (the stability sweeper pins each
search to its GPU by UUID) share one pool, and each slot (``orchestrator.launching.slot.Slot``)
knows which jobs' selections include its GPU.

**Early start.** On a local instance whose jobs may run on any GPU, the pool is ready when its
first worker is: the others join as they come up (``join``; the workers not joined yet are its
collaborator's, ``pool_join.EarlyStart``; ``orchestrator.launching.resume`` finds stored trials by
every GPU a store recorded, not only those joined so far).

**Calls.** Every call to a worker goes through the pool's ``calls`` (``launching/calls.py``: in
flight, the slot in that call's state), its answer comes back through ``take``, a call is given
up with ``cancel``; the
supervisor calls these, and never edits a slot's fields or the table of calls in flight.

**Lifetime.** A process keeps one pool for every batch of a sweep (``get_pool``); a later batch
that names a GPU the pool left out restarts it. Calls in flight belong to the pool, not to a
batch. ``dvfs sweep`` ends the pool and its Ray as its command ends (``end_pool_and_ray``); a
sweep run in-process (a test's, a notebook's) keeps them for the next one, and a local Ray started
here ends with the pool at exit (``close_pool``). Ray is imported lazily.
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from orchestrator import interrupt
from orchestrator.errors import DeviceLostError, UserError
from orchestrator.jobs.job import PER_JOB_KEYS, machine_key
from orchestrator.jobs.replies import WorkerInfo
from orchestrator.launching.calls import CallsInFlight
from orchestrator.launching.pool_join import EarlyStart
from orchestrator.launching.ray_calls import (
    first_line,
    hidden_from_ray,
    join_ray,
    keeping_sigterm_handler,
    kill,
)
from orchestrator.launching.scheduling import refuse_duplicates
from orchestrator.launching.settings import LaunchSettings
from orchestrator.launching.slot import Call, Slot, SlotState, selection_key
from orchestrator.measuring.worker import SIM_STATE_ENV, WORKER_ENV, GpuWorker

log = logging.getLogger(__name__)

LOCAL_ONLY_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # "0": Ray's single-machine, loopback mode
NICENESS_ENV = "RAY_worker_niceness"  # Ray nices its workers to 15; ours run the measurements
PRESTART_ENV = "RAY_prestart_worker_first_driver"  # "0": no idle workers started for nothing
CLOSE_WAIT_S = 15.0  # how long a closing pool waits for its workers to put their GPUs back


class GpuPool:
    """The workers of one machine (one ``device`` config) on a local Ray instance or a cluster.

    Args:
        settings: the launcher's settings (``orchestrator.launching.settings.LaunchSettings``).
        device: the sweep's resolved ``device`` config (its settings and ``gpus`` are ignored).
        selections: the ``device.gpus`` values of the jobs it will run; it keeps every GPU that
            one of them selects.
    """

    def __init__(
        self, settings: LaunchSettings, device: dict[str, Any], selections: list[Any]
    ) -> None:
        self.settings = settings
        self.device = {k: (None if k in PER_JOB_KEYS else v) for k, v in device.items()}
        self.selections = {selection_key(g): g for g in selections}
        self.key = settings.pool_key() + machine_key(device)
        self.slots: list[Slot] = []
        self.started_ray = False
        self.calls = CallsInFlight()  # across batches: a queued trial may outlive its batch
        self._actor_cls: Any = None
        self._node_gpus: dict[str | None, int] = {}
        self.expected = 0  # workers started: the slots there will be once all have joined
        self.early_start = EarlyStart(self.spawn, list(self.selections.values()),
                                      lambda: self.settings.start_timeout_s)
        self.join_error: str | None = None  # why the last worker to answer could not join

    def stop_queued(self, slot: Slot) -> None:
        """Have the slot's worker run no further trial, and stop the one it runs at its next
        chunk of kernel calls: Ray cannot take back a call an actor has received, nor interrupt
        a synchronous actor's running call (``ray.cancel`` only marks its answer cancelled), so
        the GPU is marked ``closing`` on its node's disk, which the worker reads before each
        trial and, while one runs, every 50 ms at most (``trial_trace.mark_closing``,
        ``interrupt.watch``). Done here for this machine's workers; a cluster node's worker runs
        its trials to their end before it closes."""
        import ray

        from orchestrator.devices import journal_dir
        from orchestrator.measuring.trial_trace import mark_closing

        if ray.is_initialized() and slot.node_id == ray.get_runtime_context().get_node_id():
            mark_closing(journal_dir(self.device), slot.uuid)

    def refs(self) -> list[Any]:
        """The object refs of every call in flight, and of every worker still joining."""
        return [*self.calls.refs, *self.early_start.refs()]

    def next_deadline(self) -> float:
        """The earliest deadline of a call in flight or a joining worker (inf: none)."""
        joining = self.early_start.deadlines()
        return min((*(s.deadline for s in self.slots), *joining), default=math.inf)

    def retire(self, slot: Slot, reason: str) -> None:
        """Take a GPU out of the sweep for good: forget its call, end its workers."""
        self.calls.forget(slot)
        for actor in slot.retire(reason):  # while workers join, held: none lands on this GPU
            self.early_start.hold(actor) if self.filling else kill(actor)

    def start_worker(self, slot: Slot, *, deadline: float, replacing: bool = True) -> None:
        """Start a new worker for the slot's GPU on its node and ask it which GPU it got.

        Args:
            slot: the GPU.
            deadline: ``time.monotonic()`` by which the worker must answer.
            replacing: it replaces a worker that died or hung (counted as a restart); False: one
                more try after a new worker landed on another GPU of the node (``Slot.park``).
        """
        actor = self.spawn(slot.node_id)  # on the slot's node, where its GPU is
        slot.new_worker(actor, restart=replacing)
        self.calls.send(slot, Call.IDENTIFY, deadline=deadline)

    # --- early start ---------------------------------------------------------------------------
    @property
    def early(self) -> bool:
        """Whether trials may start before every worker is up: a local instance (one node, no
        duplicate GPUs) whose jobs may run on any GPU (placement ``any``, no ``device.gpus``). On
        two cores, sixteen workers take ten seconds to boot; the first trial need not wait."""
        return (self.settings.address is None and self.settings.placement == "any"
                and list(self.selections) == [selection_key(None)])

    @property
    def filling(self) -> bool:
        """Whether workers of an early start are still to join (started or not yet)."""
        return self.early_start.filling

    def joining(self, ref: Any) -> bool:
        """Whether ``ref`` is the answer of a worker still joining the pool."""
        return self.early_start.owns(ref)

    def join(self, ref: Any) -> Slot | None:
        """Take a joining worker's answer: its new slot (IDENTIFIED), or None (it failed, or its
        GPU is already in the pool: it is held and another one starts; ``join_error`` says
        why it failed)."""
        slot = self._admit(ref, self.early_start.take(ref))
        self.early_start.release_held()
        return slot

    def expire_joining(self) -> int:
        """End the joining workers past their deadline; returns how many."""
        return self.early_start.expire()

    def _join_first(self, total: int, note: Callable[[str], None]) -> None:
        """Start the workers a few at a time (one per two cores, and one more as each comes up:
        sixteen booting at once on two cores all come up late, and the first up then loads its
        framework beside the others' boots); keep the first that answers, and the others as
        they answer (``join``), each within ``start_timeout_s`` of its start.

        Raises:
            UserError: no worker answered in time, or every one failed.
        """
        import ray

        self.early_start.begin(total, max(1, (os.cpu_count() or 1) // 2))
        errors = []
        while not self.slots and self.early_start.refs():
            ready, _ = ray.wait(self.early_start.refs(), num_returns=1,
                                timeout=max(self.next_deadline() - time.monotonic(), 0.0))
            if not ready:
                break
            slot = self.join(ready[0])
            if slot is None and self.join_error:
                errors.append(self.join_error)
            for action in slot.info.restored if slot else ():
                note(f"ray_gpus: {action} (left changed by a killed process)")
        if not self.slots:
            raise UserError(
                f"no worker could start on a GPU: {errors[0] if errors else 'none became free'}"
            )

    def _admit(self, ref: Any, actor: Any) -> Slot | None:
        """A slot for the worker that answered ``ref``, or None (it failed, or is held)."""
        import ray

        self.join_error = None
        info: WorkerInfo | None = None
        try:
            info = ray.get(ref)
        except ray.exceptions.RayError as e:
            if not isinstance(getattr(e, "cause", None), DeviceLostError):
                self.join_error = first_line(e)
                kill(actor)
                return None
        # Held, and another started in its place, where it holds a lost GPU (none lands there)
        # or Ray gave it a GPU the pool has (a retired one): the next lands elsewhere.
        if info is None or any(s.uuid == info.uuid for s in self.slots):
            self.early_start.hold_and_retry(actor)
            return None
        self._node_gpus[info.node_id] = self._node_gpus.get(info.node_id, 0) + 1
        slot = Slot(info, actor, selections=set(self.selections))
        self.slots.append(slot)
        self.slots.sort(key=lambda s: s.info.identity.index)
        return slot

    # --- Ray -----------------------------------------------------------------------------------
    def _ensure_ray(self) -> None:
        import ray

        if ray.is_initialized():
            return
        quiet = {"log_to_driver": self.settings.log_to_driver, "logging_level": logging.WARNING}
        with keeping_sigterm_handler(), interrupt.deferred():  # Ctrl-C: once Ray is up
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
            # One logical GPU per simulated GPU, one for the host CPU; real GPUs: Ray counts them
            # (TPU chips too, as its "TPU" resource).
            declared = {"sim": int(self.device.get("count") or 1), "cpu": 1}
            num_gpus = declared.get(self.device.get("backend"))
            with hidden_from_ray("CUDA_VISIBLE_DEVICES" if num_gpus is not None else None):
                try:
                    ray.init(
                        address="local",
                        num_gpus=num_gpus,
                        include_dashboard=bool(self.settings.dashboard),
                        dashboard_host="127.0.0.1",
                        **quiet,
                    )
                except (OSError, RuntimeError, ConnectionError) as e:  # no sockets, no /dev/shm
                    first = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
                    raise UserError(
                        f"Ray cannot start here ({first}): run the sweep without Ray, one trial "
                        "at a time in this process, with hydra/launcher=basic") from None
        else:
            join_ray(self.settings.address, **quiet)

    @property
    def _resource(self) -> str:
        """The Ray resource one worker's device is: ``TPU`` for a TPU chip, else ``GPU``."""
        return "TPU" if self.device.get("backend") == "tpu" else "GPU"

    def _worker_env(self) -> dict[str, str]:
        """Every worker's environment (on one machine also: where the sim and journal are)."""
        from orchestrator.devices import JOURNAL_ENV, sim_state_dir

        env = dict(WORKER_ENV)
        if self.settings.address is None:  # a user's workload module imports as it does here
            from kernels.registry import WORKLOAD_PATH_ENV

            paths = [os.getcwd(), *os.environ.get(WORKLOAD_PATH_ENV, "").split(os.pathsep)]
            env[WORKLOAD_PATH_ENV] = os.pathsep.join(p for p in paths if p)
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
        tpu = self._resource == "TPU"  # a TPU chip is Ray's "TPU" resource, not a GPU
        options: dict[str, Any] = {
            "num_gpus": 0 if tpu else 1,
            "num_cpus": self.settings.num_cpus,
            "max_restarts": 0,  # the supervisor replaces workers itself, and records why
        }
        if self.settings.resources or tpu:
            options["resources"] = {**({"TPU": 1} if tpu else {}),
                                    **(self.settings.resources or {})}
        if node_id is not None:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(
                node_id=node_id, soft=False
            )
        return self._actor_cls.options(**options).remote(self.device, env=self._worker_env())

    def node_alive(self, node_id: str | None) -> bool:
        """Whether Ray still counts the node alive (a worker on a lost node died with it)."""
        import ray

        try:
            return node_id is None or any(
                n.get("NodeID") == node_id and n.get("Alive") for n in ray.nodes()
            )
        except Exception:  # noqa: BLE001 - Ray itself is unreachable: no evidence of a loss
            return True

    def node_gpus(self, node_id: str | None) -> int:
        """How many GPUs the node had when the pool started."""
        return self._node_gpus.get(node_id, 1)

    # --- start, select, check ------------------------------------------------------------------
    def start(self, note: Callable[[str], None]) -> None:
        """Start one worker per GPU of the Ray cluster, learn each one's GPU, keep the selected.

        Args:
            note: prints a line for the user.

        Raises:
            UserError: no GPU in the cluster, none selected, or two workers on one GPU.
        """
        self._start_ray()  # first: Ray reads its loopback-only switch when first imported
        import ray

        total = int(ray.cluster_resources().get(self._resource, 0))
        if total <= 0:
            raise UserError(
                f"the Ray cluster at {self.settings.address} declares no GPUs: start its nodes "
                "with `ray start --num-gpus=N`"
            )
        note(f"ray_gpus: starting {total} worker(s), one per GPU")
        self.expected = total
        if self.early:
            self._join_first(total, note)
            return
        infos = self._identify_all([self.spawn() for _ in range(total)], note)
        for info, _ in infos:
            for action in info.restored:
                note(f"ray_gpus: {action} (left changed by a killed process)")
        refuse_duplicates([i for i, _ in infos])
        self._keep(infos, self._select([i for i, _ in infos]))

    def _start_ray(self) -> None:
        """Start or join Ray (and, on one machine, create the simulated machine first).

        A local instance is one machine: in Ray's single-machine mode its node address is
        127.0.0.1, so every server it starts listens on loopback only (``ray.init`` turns a
        ``_node_ip_address`` of 127.0.0.1 into the machine's public address). Ray reads the
        variable when it is first imported, and the processes ``ray.init`` starts inherit it; it
        is then taken out again, so that a later ``ray start`` of this process's children may
        still join a cluster. A user's own value wins.

        A local instance's workers also run at the driver's priority: Ray nices them to 15, and a
        worker is the sweep's real work (its trial's host-side dispatch is in the timed window).
        Beside any other busy process a nice-15 worker gets a few percent of a core: on a 2-core
        machine with two busy loops, a 25-minute test sweep ran at 6 % CPU and timed out.
        (Cluster nodes are started by ``ray start``: docs/cluster.md says to set it there.)

        Nor does a local instance start a worker per CPU when the driver connects: a sweep's
        only Ray workers are its GPUs' (one each), so the prestarted ones would mostly idle, each
        a Python process of ~100 MiB (128 of them on a 128-core node) and, on 2 cores, ~2
        CPU-seconds of each sweep's start.
        """
        wanted = (
            {LOCAL_ONLY_ENV: "0", NICENESS_ENV: "0", PRESTART_ENV: "0"}
            if self.settings.address is None
            else {}
        )
        added = [k for k in wanted if k not in os.environ]
        os.environ.update({k: wanted[k] for k in added})
        try:
            if self.settings.address is None and self.device.get("backend") == "sim":
                self._create_local_sim()
            self._ensure_ray()
        finally:
            for k in added:
                os.environ.pop(k, None)
        if self.started_ray:
            atexit.register(close_pool)  # after ray.init's own: runs before Ray shuts down

    def _identify_all(
        self, actors: list[Any], note: Callable[[str], None]
    ) -> list[tuple[WorkerInfo, Any]]:
        """Ask every new worker which GPU it got; end those that fail or do not answer in time."""
        import ray

        refs = {a.identify.remote(list(self.selections.values())): a for a in actors}
        ready, not_ready = ray.wait(
            list(refs), num_returns=len(refs), timeout=self.settings.start_timeout_s
        )
        infos: list[tuple[WorkerInfo, Any]] = []
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
        return infos

    def _keep(self, infos: list[tuple[WorkerInfo, Any]], wanted: dict[str, set[str]]) -> None:
        """A slot for every selected GPU, in host and index order; the other workers end."""
        multi_node = len({i.node_id for i, _ in infos}) > 1
        for info, actor in infos:
            self._node_gpus[info.node_id] = self._node_gpus.get(info.node_id, 0) + 1
            if info.uuid in wanted:
                self.slots.append(
                    Slot(info, actor, multi_node=multi_node, selections=wanted[info.uuid])
                )
            else:
                kill(actor)
        self.slots.sort(key=lambda s: (s.info.host, s.node_id or "", s.info.identity.index))

    def _create_local_sim(self) -> None:
        """On one machine, create (or check) the simulated machine once, as ``dvfs sweep`` does."""
        from orchestrator.devices import open_backend

        try:
            open_backend(self.device).close()
        except ValueError as e:  # the sim's MachineSpecError and ProfileError
            raise UserError(str(e)) from e

    def _select(self, infos: list[WorkerInfo]) -> dict[str, set[str]]:
        """GPU uuid -> the selections that pick it, for every GPU some selection picks.

        Raises:
            UserError: a placement UUID no worker found, or a ``device.gpus`` that picks no GPU.
        """
        placement = self.settings.placement
        found = sorted(i.uuid for i in infos)
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
            if isinstance(placement, tuple) and i.uuid not in placement:
                continue
            picked = {k for k, ok in zip(keys, i.selected) if ok}
            if picked:
                chosen[i.uuid] = picked
        for n, key in enumerate(keys):
            if any(key in picked for picked in chosen.values()):
                continue
            reasons = sorted({i.select_errors[n] for i in infos if i.select_errors[n]})
            why = f": {reasons[0]}" if reasons else (
                f" and placement={placement}; found: {', '.join(found)}"
            )
            raise UserError(f"no GPU is selected by device.gpus={self.selections[key]}{why}")
        return chosen

    def close(self) -> None:
        """Restore every GPU, release the leases, end the workers."""
        import ray

        if ray.is_initialized():
            for s in self.slots:  # stop the running trials, start no queued one
                if s.state is SlotState.BUSY or s.queued is not None:
                    self.stop_queued(s)
            refs = {s.actor.close.remote(): s for s in self.slots if s.live}
            if refs:
                _, late = ray.wait(list(refs), num_returns=len(refs), timeout=CLOSE_WAIT_S)
                for ref in late:
                    print(f"ray_gpus: {refs[ref].label}'s worker did not close within "
                          f"{CLOSE_WAIT_S:g} s and was killed: its GPU may still be set; "
                          f"`dvfs restore` (or the next sweep) puts it back", file=sys.stderr)
            for s in self.slots:
                for actor in [s.actor, *s.parked]:
                    kill(actor)
        self.early_start.end()
        self.slots.clear()
        self.calls.refs.clear()


_pool: GpuPool | None = None


def get_pool(
    settings: LaunchSettings, device: dict[str, Any], selections: list[Any],
    note: Callable[[str], None],
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
    if _pool is not None and (_pool.key != key or not wanted.keys() <= _pool.selections.keys()):
        close_pool()
    if _pool is None:
        pool = GpuPool(settings, device, list(wanted.values()))
        pool.start(note)
        _pool = pool
    _pool.settings = settings  # limits may change between batches; the workers stay
    return _pool


def end_pool_and_ray() -> None:
    """End the process's pool of workers, then its Ray (a local instance it started stops), as
    ``dvfs sweep`` ends and while its signal handling still holds.

    Left to the exit handlers, both ran after the command's signal handling: a Ctrl-C in the
    seconds after the sweep's summary (each worker putting its GPU back, Ray stopping) broke off
    the close with a traceback ("Exception ignored in atexit callback"), Ray's shutdown then ended
    the workers instead (their own handlers put the GPUs back, unwaited for), and the process
    exited 0. Here a signal waits for the close to end (``interrupt.deferred``), then stops the
    command as any other: its one line, 130 or 143.
    """
    with interrupt.deferred():
        close_pool()
        ray = sys.modules.get("ray")  # not imported: no pool was started, nothing to stop
        if ray is not None and ray.is_initialized():
            try:
                ray.shutdown()
            except Exception as e:  # noqa: BLE001 - as at exit: the command's own outcome stands
                log.warning("stopping Ray: %s", e)


def close_pool() -> None:
    """End the process's pool of workers (also runs at exit)."""
    global _pool
    pool, _pool = _pool, None
    if pool is not None:
        try:
            pool.close()
        except Exception as e:  # noqa: BLE001 - at exit, Ray may already be down
            log.debug("closing the worker pool: %s", e)
