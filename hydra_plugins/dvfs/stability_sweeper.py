"""``hydra/sweeper=stability``: the stability threshold of each GPU and computation, by search.

A shell over :func:`orchestrator.search.plan.sweep`, which splits the command line into groups,
runs one threshold search per (group, GPU), sends each round to the launcher as one batch, reads
each job's verdict from its ``JobReturn.return_value`` and writes ``thresholds.csv`` to the sweep
directory (the algorithm: :mod:`orchestrator.search.algorithm`).

    dvfs sweep -m hydra/sweeper=stability workload=gemm,stencil framework=jax,tensorflow
    dvfs sweep -m hydra/sweeper=stability hydra.sweeper.setting=device.power_limit_w
    dvfs sweep -m hydra/sweeper=stability device.sm_clock_mhz='range(510,1411,15)'  # within these

Bad input is a one-line ``UserError`` (exit code 2) before any trial runs. Hydra imports this
module at start-up: it imports nothing heavy.
"""

# No `from __future__ import annotations`: Hydra's plugin scanner runs this module before it is in
# sys.modules, and dataclasses then cannot resolve string annotations.
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from hydra.plugins.launcher import Launcher
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

from orchestrator.launching.estimate import MAX_HOURS


@dataclass
class StabilitySweeperConf:
    """``hydra.sweeper`` for ``stability`` (the options: ``orchestrator.search.SearchOptions``)."""

    _target_: str = "hydra_plugins.dvfs.stability_sweeper.StabilitySweeper"
    setting: str = "device.sm_clock_mhz"  # sm_clock_mhz, power_limit_w: down; clock_offset_mhz: up
    confirm_iterations: int = 1000  # n clean iterations declare a value stable (rate < 3/n, 95 %)
    coarse_points: int = 8  # values of the first pass, spread over the whole supported range
    step: Optional[float] = None  # grid step of a power (W) or offset (MHz) search; null: default
    max_inconclusive: int = 2  # ok-but-invalid trials at one value before the search gives up
    confirm_trials: int = 3  # a confirmation spreads the iterations it needs over these trials
    params: Optional[Dict[str, str]] = None  # swept overrides: each combination is a group
    max_hours: float = MAX_HOURS  # a round of trials longer is refused unless `dvfs sweep --yes`


ConfigStore.instance().store(
    group="hydra/sweeper", name="stability", node=StabilitySweeperConf, provider="dvfs"
)


class StabilitySweeper(Sweeper):
    """Searches one ordered setting per group of overrides and per GPU (``orchestrator.search``)."""

    def __init__(self, params: Optional[Dict[str, str]] = None, **options: Any) -> None:
        """Keep the sweeper's config: ``params`` (swept overrides) and the search's options."""
        self.params = dict(params or {})
        options.pop("max_hours", None)  # read from the config by the launcher of each round
        self.options = options
        self.config: Optional[DictConfig] = None
        self.hydra_context: Optional[HydraContext] = None
        self.launcher: Optional[Launcher] = None

    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        """Instantiate the launcher the sweep's batches go to."""
        from hydra.core.plugins import Plugins

        self.hydra_context, self.config = hydra_context, config
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    def sweep(self, arguments: List[str]) -> Any:
        """Run every search to its end; returns the thresholds table (one row per search)."""
        from orchestrator.search.plan import sweep

        return sweep(self.config, self.hydra_context, self.launcher, self.params, self.options,
                     arguments)
