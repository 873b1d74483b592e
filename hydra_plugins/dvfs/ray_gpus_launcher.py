"""``hydra/launcher=ray_gpus``: a multirun's jobs over one long-lived Ray actor per GPU.

A thin shell: the configuration schema and the ``Launcher`` Hydra discovers; the work is in
:mod:`orchestrator.launching.launch` (supervisor) and :mod:`orchestrator.measuring.worker` (the
per-GPU actor). Hydra imports every module under ``hydra_plugins`` when it starts, so this one
imports neither Ray nor anything heavy.

    dvfs sweep -m workload=gemm,stencil device.sm_clock_mhz=1065,1410       # local Ray, every GPU
    dvfs sweep -m hydra.launcher.address=auto ...                          # join a Ray cluster
    dvfs sweep -m hydra.launcher.placement=every ...                       # each job on every GPU
"""

# No `from __future__ import annotations`: Hydra's plugin scanner runs this module before it is in
# sys.modules, and dataclasses then cannot resolve string annotations.
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Sequence

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig


@dataclass
class RayGpusLauncherConf:
    """``hydra.launcher`` for ``ray_gpus`` (see ``docs/cluster.md``)."""

    _target_: str = "hydra_plugins.dvfs.ray_gpus_launcher.RayGpusLauncher"
    address: Optional[str] = (
        None  # null: start a local Ray; "auto", "host:port" or "ray://...": join
    )
    placement: Any = (
        "any"  # any: next free GPU; every: each job on every GPU; [GPU-...]: these GPUs
    )
    timeout_s: Optional[float] = None  # per-trial limit (then `timeout`); null: measure.timeout_s
    max_restarts: int = 5  # worker deaths in a row before its GPU is retired; -1: never
    start_timeout_s: float = 120.0  # a worker that has not started by then is given up
    lease_wait_s: Optional[float] = (
        None  # wait for a GPU another sweep holds; null: as long as it takes
    )
    retry: str = "not_measured"  # stored trials a re-run runs again: never|not_measured|failed
    queue_ahead: bool = True  # a busy GPU is sent its next trial: no driver round trip between
    num_cpus: float = 0.0  # CPUs each worker reserves (keep 0 unless Ray must spread CPU load)
    resources: Dict[str, float] = field(default_factory=dict)  # custom Ray resources per worker
    log_to_driver: bool = False  # show the workers' stdout/stderr here
    progress: bool = True  # the live progress line on stderr
    dashboard: bool = False  # a local Ray's web dashboard on 127.0.0.1:8265 (off unless asked)


ConfigStore.instance().store(
    group="hydra/launcher", name="ray_gpus", node=RayGpusLauncherConf, provider="dvfs"
)


class RayGpusLauncher(Launcher):
    """Runs each batch of jobs on the pool of per-GPU workers (``launching.launch``)."""

    def __init__(self, **params: Any) -> None:
        self.params = params
        self.config: Optional[DictConfig] = None
        self.hydra_context: Optional[HydraContext] = None
        self.task_function: Optional[TaskFunction] = None

    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        """Keep what Hydra hands over before the first batch: its context, task and config."""
        self.config = config
        self.hydra_context = hydra_context
        self.task_function = task_function

    def launch(
        self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
    ) -> Sequence[JobReturn]:
        """Run one batch on the per-GPU workers; a ``JobReturn`` per job, in the batch's order."""
        from orchestrator.launching.launch import launch_batch
        from orchestrator.launching.settings import LaunchSettings

        settings = LaunchSettings.from_mapping(self.params)
        return launch_batch(
            self.config, self.hydra_context, settings, job_overrides, initial_job_idx
        )
