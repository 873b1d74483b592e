"""What a worker answers the driver: small frozen dataclasses across the process boundary.

A ``GpuWorker`` (``measuring/worker.py``, a Ray actor) answers ``identify`` with a
:class:`WorkerInfo`, ``acquire`` with an :class:`AcquireReply` and ``run`` with a
:class:`TrialReply`; the launcher (``launching/``) reads their attributes, never dict keys. They
live below both, so the launcher names them without importing the worker.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchestrator.devices.base import DeviceIdentity
    from orchestrator.measuring.trial_trace import TrialTrace


@dataclass(frozen=True)
class WorkerInfo:
    """What ``identify`` answers: the worker's GPU, node and process, and what selects the GPU.

    Attributes:
        uuid: the GPU's UUID (the worker's name for it from now on).
        identity: the GPU's identity (stamped on the rows the driver writes for it).
        ray_gpu_id: the GPU id Ray gave the process, as text.
        node_id: the Ray node it runs on (None outside Ray).
        host: the node's host name.
        pid: the worker's process id.
        selected: per ``device.gpus`` value asked about: does it select this GPU.
        select_errors: per value: why it selects nothing on this node (None: it is valid).
        sim_state_dir: the simulated machine it joined (None off the sim).
        restored: what it restored that a dead predecessor had left changed.
        dead_trace: what a dead predecessor on this GPU was doing when it died (None: it was
            between trials, or there was none).
    """

    uuid: str
    identity: DeviceIdentity
    ray_gpu_id: str
    node_id: str | None
    host: str
    pid: int
    selected: tuple[bool, ...] = ()
    select_errors: tuple[str | None, ...] = ()
    sim_state_dir: str | None = None
    restored: tuple[str, ...] = ()
    dead_trace: TrialTrace | None = None


@dataclass(frozen=True)
class AcquireReply:
    """What ``acquire`` answers: the lease is taken (``ok``), or why not (``error``).

    Attributes:
        ok: the worker holds its GPU's lease.
        waited_s: how long it waited for another sweep to let the GPU go.
        restored: what it restored that a dead predecessor had left changed.
        error: why the lease was not free in time (``ok`` False).
    """

    ok: bool
    waited_s: float = 0.0
    restored: tuple[str, ...] = ()
    error: str | None = None


@dataclass(frozen=True)
class TrialReply:
    """What ``run`` answers: one trial's rows, the worker's counters and its GPU's health.

    Attributes:
        rows: one row per repeat; empty when the GPU was unhealthy before the trial (nothing ran).
        unhealthy: why the GPU is unusable (before the trial with no rows, during it with rows);
            None: healthy.
        pid: the worker's process id.
        trial_started_at: Unix seconds the trial began (None: nothing ran).
        trial_ended_at: Unix seconds it ended.
        trial_s: its duration (a monotonic clock's).
        builds: kernels the worker's cache has built so far.
        trials: trials the worker has run so far.
    """

    rows: list[dict[str, Any]] = field(default_factory=list)
    unhealthy: str | None = None
    pid: int = 0
    trial_started_at: float | None = None
    trial_ended_at: float | None = None
    trial_s: float | None = None
    builds: int = 0
    trials: int = 0

    @property
    def ran(self) -> bool:
        """The trial ran (it has rows); False: the GPU was unhealthy before it started."""
        return bool(self.rows)

    def timing(self) -> dict[str, Any]:
        """The trial's timestamps and the worker's build counter, as stored in each row's
        ``launch`` block (the overlap and build-count checks read them there)."""
        return {
            "trial_started_at": self.trial_started_at,
            "trial_ended_at": self.trial_ended_at,
            "trial_s": self.trial_s,
            "builds": self.builds,
        }
