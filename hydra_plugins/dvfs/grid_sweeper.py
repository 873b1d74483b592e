"""``hydra/sweeper=basic`` (and ``grid``): Hydra's basic sweeper (the same grid, the same job
order), without composing every job before the launcher does.

Hydra's ``BasicSweeper`` checks a batch by composing each of its jobs in full
(``validate_batch_is_legal``: about 70 ms a job, 12 minutes for 10,000) and then hands it to the
launcher, which composes each job again. This sweeper takes the place of Hydra's ``basic`` (the
default) and checks the batch with :mod:`orchestrator.launching.compose` instead: the first job with
each distinct value is composed and validated (a bad value anywhere is still a one-line error before
any job runs); the ``ray_gpus`` launcher does that check itself, so for it the sweeper does not.

    dvfs sweep -m device.sm_clock_mhz='range(210,1411,15)' device.power_limit_w=400,300,200
    dvfs sweep -m hydra.sweeper._target_=hydra._internal.core_plugins.basic_sweeper.BasicSweeper
"""

# No `from __future__ import annotations`: Hydra's plugin scanner runs this module before it is in
# sys.modules, and dataclasses then cannot resolve string annotations.
from dataclasses import dataclass
from typing import Any, Dict, Optional, Sequence

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.config_store import ConfigStore

from orchestrator.launching.estimate import MAX_HOURS


@dataclass
class GridSweeperConf:
    """``hydra.sweeper`` for ``grid``: the keys of Hydra's basic sweeper."""

    _target_: str = "hydra_plugins.dvfs.grid_sweeper.GridSweeper"
    max_batch_size: Optional[int] = None  # jobs per batch handed to the launcher; null: all at once
    params: Optional[Dict[str, str]] = None  # swept overrides, as hydra.sweeper.params
    max_hours: float = MAX_HOURS  # a longer sweep is refused unless `dvfs sweep --yes`


# Hydra's default sweeper is ``basic``: this one takes its place (same keys, same grid) so that
# an experiment's ``override /hydra/sweeper: ...`` still wins, which an override of the default
# in conf/config.yaml would not let it do.
for _name in ("basic", "grid"):
    ConfigStore.instance().store(group="hydra/sweeper", name=_name, node=GridSweeperConf,
                                 provider="dvfs")


class GridSweeper(BasicSweeper):
    """Hydra's basic sweeper with a batch check that composes each distinct value once."""

    def validate_batch_is_legal(self, batch: Sequence[Sequence[str]]) -> None:
        """Compose the first job with each distinct override and estimate the batch's length;
        the ``ray_gpus`` launcher does both itself before anything runs, so for it there is
        nothing to do here.

        Raises:
            UserError: a value refused, naming its job; a batch longer than
                ``hydra.sweeper.max_hours`` without ``dvfs sweep --yes``.
        """
        import sys

        from orchestrator.launching import estimate
        from orchestrator.launching.batch import JobStream
        from orchestrator.launching.compose import composer_for

        if type(self.launcher).__name__ == "RayGpusLauncher":
            return
        jobs = JobStream(composer_for(self.config, self.hydra_context), batch)
        jobs.check()
        limit = estimate.max_hours(self.config.hydra.sweeper)
        estimate.check(estimate.Estimate.of(jobs.measures()), limit,  # one job at a time
                       lambda line: print(f"dvfs sweep: {line}", file=sys.stderr, flush=True))

    def __init__(self, max_batch_size: Optional[int] = None, params: Any = None,
                 max_hours: float = MAX_HOURS) -> None:
        """The basic sweeper's arguments, ``max_batch_size`` and ``params``; ``max_hours`` is
        read from the config by whoever runs the batch (``orchestrator.launching.estimate``)."""
        super().__init__(max_batch_size=max_batch_size, params=params)
