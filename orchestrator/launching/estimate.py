"""How long a sweep will take, said before it starts, and refused past a bound unless asked for.

A sweep that runs for days by accident (a window of an hour in a grid of 500 points) is found
out only when it does not end; on a real GPU it holds a locked clock all that time. So before the
first trial the launcher (``orchestrator.launching.launch``), Hydra's sequential launcher (through
the grid sweeper) and a single ``dvfs sweep`` estimate the whole sweep, print the figure when it is
longer than :data:`SAY_ABOVE_S`, and refuse one longer than ``hydra.sweeper.max_hours`` (default
:data:`MAX_HOURS`) unless ``dvfs sweep --yes`` says it is meant.

The figure is rough and errs short: each trial is its windows (``repeats`` x ``window_s``), the
check run after each window (``digest=after``: as many calls as the window, so as long again),
the energy counter's wait at each window's end, ``settle_s``, and :data:`TRIAL_OVERHEAD_S` for
the rest (applying the settings, warm-up, storing). A kernel's first compile, a slow first
trial on a real GPU (issue #28) and time lost to failures come on top.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from orchestrator.bounds import Bound
from orchestrator.errors import UserError

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from orchestrator.config import MeasureConfig

SAY_ABOVE_S = 300.0
"""A sweep expected to take longer than five minutes says how long before it starts."""

MAX_HOURS = 24.0
"""The longest sweep run without ``--yes`` (``hydra.sweeper.max_hours`` changes it)."""

MAX_HOURS_BOUND = Bound(0, 8760, "a year: a longer sweep is one no GPU lease outlasts", above=True,
                        unit=" h")

YES_ENV = "DVFS_YES"
"""Set to 1 by ``dvfs sweep --yes``: a sweep longer than the bound is meant."""

TRIAL_OVERHEAD_S = 1.0
"""A trial's time besides its windows, checks and settling: settings applied and read back,
warm-up calls, rows stored (about a second on the simulated GPU; a lower bound on hardware)."""


def trial_s(measure: MeasureConfig) -> float:
    """The expected seconds of one trial with this ``measure`` section."""
    check_s = measure.window_s if measure.digest == "after" else 0.0
    window_s = measure.window_s + check_s + measure.counter_edge_wait_s
    return measure.repeats * window_s + measure.settle_s + TRIAL_OVERHEAD_S


@dataclass(frozen=True)
class Estimate:
    """A sweep's expected length.

    Attributes:
        trials: how many trials it runs.
        total_trial_s: the sum of their expected seconds.
        gpus: how many run at once.
    """

    trials: int
    total_trial_s: float
    gpus: int = 1

    @classmethod
    def of(cls, measures: Iterable[MeasureConfig], gpus: int = 1) -> Estimate:
        """The estimate of one trial per ``measure`` section, ``gpus`` at a time."""
        times = [trial_s(m) for m in measures]
        return cls(len(times), sum(times), max(1, gpus))

    @property
    def seconds(self) -> float:
        """The expected wall time: the trials spread over the GPUs."""
        return self.total_trial_s / self.gpus

    def describe(self) -> str:
        """E.g. ``about 2 h 10 min (93 trials of ~84 s, 4 GPUs at once)``."""
        if self.trials == 1:
            return f"about {duration(self.seconds)}"
        each = self.total_trial_s / self.trials
        at_once = f", {self.gpus} GPUs at once" if self.gpus > 1 else ""
        return (f"about {duration(self.seconds)} ({self.trials} trials of ~{duration(each)}"
                f"{at_once})")


def duration(seconds: float) -> str:
    """``45 s``, ``12 min``, ``2 h 10 min``, ``31 days``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    minutes = seconds / 60
    if minutes < 90:
        return f"{minutes:.0f} min"
    hours = minutes / 60
    if hours < 48:
        return f"{int(hours)} h {int(minutes % 60)} min"
    days = hours / 24
    return f"{days:.0f} days" if days < 3650 else f"{days / 365:.0f} years"


def max_hours(sweeper: DictConfig | None) -> float:
    """``hydra.sweeper.max_hours`` from the ``hydra.sweeper`` node (:data:`MAX_HOURS` where the
    sweeper has no such key, e.g. Optuna's).

    Raises:
        UserError: a value out of its range.
    """
    value = sweeper.get("max_hours") if sweeper is not None else None
    if value is None:
        return MAX_HOURS
    MAX_HOURS_BOUND.check("hydra.sweeper.max_hours", value)
    return float(value)


def check(estimate: Estimate, limit_hours: float, say: Callable[[str], None],
          what: str = "this sweep") -> None:
    """Say a long estimate; refuse one past ``limit_hours`` unless ``--yes`` was given.

    Raises:
        UserError: the estimate exceeds the limit and ``--yes`` was not given (nothing ran).
    """
    if estimate.seconds <= SAY_ABOVE_S:
        return
    if estimate.seconds > limit_hours * 3600 and os.environ.get(YES_ENV) != "1":
        raise UserError(
            f"{what} would take {estimate.describe()}, more than hydra.sweeper.max_hours="
            f"{limit_hours:g}; nothing was run: if it is meant, run it with `dvfs sweep --yes` "
            f"or a larger hydra.sweeper.max_hours, else check measure.window_s and "
            f"measure.repeats"
        )
    say(f"{what} will take {estimate.describe()}")
