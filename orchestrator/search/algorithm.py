"""The threshold search: a pure state machine over one ordered setting's values.

Given the outcomes so far, :class:`ThresholdSearch` proposes the next batch of trials, so it is
tested without Hydra, Ray or a device. Values are indices into a tuple ordered riskiest first
(index 0), safest last; the search looks for the riskiest value that is still stable.

1. **coarse**: ``coarse_points`` values spread evenly over the whole range, safest to riskiest,
   in one batch (so a failure above a pass, non-monotone behaviour, is seen, not skipped);
2. **bisect** between the highest failing value (the safest one with any failure) and the
   passing value just above it, one trial per round, until they are one supported step apart;
3. **confirm**: repeat trials at the candidate until it has ``n`` clean iterations in total
   (a trial's iterations are its kernel calls, every one checked): the iterations still needed
   are spread over ``confirm_trials`` trials, each asked for its share (``measure.min_iters``),
   run in one batch. Any failure there makes the candidate a failing value and the search goes
   back to step 2 one value up. A value is declared stable only once confirmed: with ``n``
   clean iterations and none faulty, the per-iteration fault rate is below ``3 / n`` at 95 %
   confidence (the rule of three; the exact Clopper-Pearson bound, ``1 - 0.05 ** (1 / n)``, is
   a little lower, so ``3 / n`` is safe). A value whose fault rate is ``10 / n`` passes ``n``
   iterations with probability ``(1 - 10 / n) ** n < e ** -10``.

Each trial's verdict is an :class:`orchestrator.results.rows.Outcome`: passed (every repeat ``ok``
and valid), failed (a status that fails the setting,
:func:`orchestrator.results.rows.fails_setting`), or no evidence (ok but invalid, a
``device_error``, no row), which is retried up to ``max_inconclusive`` times per value.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from orchestrator.results.rows import Outcome

CONFIDENCE = 0.95
"""The confidence of the fault-rate bound (the rule of three holds at 95 %)."""

RULE_OF_THREE = 3.0
"""``n`` clean iterations bound the per-iteration fault rate by ``3 / n`` at 95 % confidence."""

CONFIRM_TRIALS = 3
"""A confirmation spreads the iterations it still needs over this many trials, by default."""

Role = Literal["coarse", "bisect", "confirm", "retry"]
"""Why the search asked for a trial (``retry``: after an inconclusive trial)."""



@dataclass(frozen=True)
class Probe:
    """One trial the search asks for.

    Attributes:
        index: the value's position, 0 the riskiest.
        value: the setting's value.
        role: why: ``coarse``, ``bisect``, ``confirm`` or ``retry`` (after an inconclusive trial).
        attempt: how many trials at this value came before this one (0 for the first).
        min_iterations: a confirmation trial's share of the iterations still needed (None:
            the job's own ``measure.min_iters``).
    """

    index: int
    value: float
    role: Role
    attempt: int
    min_iterations: int | None = None


@dataclass
class ValueStats:
    """Everything the search saw at one value."""

    trials: int = 0
    passes: int = 0
    failures: int = 0
    inconclusive: int = 0
    iterations: int = 0  # all trials
    clean_iterations: int = 0  # passing trials only
    statuses: Counter = field(default_factory=Counter)  # failing statuses
    reasons: list[str] = field(default_factory=list)  # why trials failed or were inconclusive

    @property
    def failing(self) -> bool:
        """At least one trial failed the value."""
        return self.failures > 0

    @property
    def passing(self) -> bool:
        """At least one clean trial and no failure."""
        return self.passes > 0 and self.failures == 0


@dataclass(frozen=True)
class SearchResult:
    """Where one search ended. Values are the setting's (MHz or W); None when there is none.

    Attributes:
        stable_value: the riskiest value declared stable (confirmed with ``n`` clean
            iterations and no failure there or at any safer value tested).
        candidate_value: the riskiest passing value above every failure, confirmed or not.
        failing_value: the safest value at which a trial failed.
        lowest_passing_value: the riskiest value with a clean trial and no failure (below
            ``failing_value`` when the behaviour is non-monotone).
        confirmed: ``stable_value`` is set.
        non_monotone: a failure at a safer value than some passing value.
        steps_between: supported steps from ``failing_value`` to ``candidate_value``.
        iterations_at_stable: clean iterations at the candidate (all its passing trials).
        trials_at_stable: trials at the candidate.
        fault_rate_bound: ``3 / iterations_at_stable``: the 95 % upper bound on the candidate's
            per-iteration fault rate.
        iterations_at_failing, trials_at_failing, failures_at_failing: the same at the failing
            value; ``failure_statuses``: e.g. ``"wrong×2, crash×1"``.
        trials_used: trials the search ran; ``grid_size``: values a full grid would have run.
        values_tested: distinct values with a trial.
        note: what a reader must know (no failure seen, non-monotone, gave up on a value...).
    """

    stable_value: float | None
    candidate_value: float | None
    failing_value: float | None
    lowest_passing_value: float | None
    confirmed: bool
    non_monotone: bool
    steps_between: int | None
    iterations_at_stable: int
    trials_at_stable: int
    fault_rate_bound: float | None
    iterations_at_failing: int
    trials_at_failing: int
    failures_at_failing: int
    failure_statuses: str | None
    trials_used: int
    grid_size: int
    values_tested: int
    note: str | None


def fault_rate_bound(clean_iterations: int) -> float | None:
    """The 95 % upper bound on a per-iteration fault rate after ``n`` clean iterations (3/n)."""
    return None if clean_iterations <= 0 else min(1.0, RULE_OF_THREE / clean_iterations)


def coarse_indices(n_values: int, points: int) -> list[int]:
    """``points`` indices spread evenly over ``range(n_values)``, both ends included."""
    if n_values <= 0:
        return []
    points = max(1, min(points, n_values))
    if points == 1:
        return [n_values - 1]
    return sorted({round(i * (n_values - 1) / (points - 1)) for i in range(points)})


class ThresholdSearch:
    """The search of one setting on one GPU for one computation.

    Call :meth:`propose` for a batch, run it, :meth:`record` each probe's outcome, and repeat
    until :meth:`propose` returns an empty batch; then :meth:`result`.

    Args:
        values: the setting's values, riskiest first, safest last (at least one).
        confirm_iterations: ``n``: clean iterations a value needs to be declared stable.
        coarse_points: values of the coarse pass.
        max_inconclusive: inconclusive trials at one value before the search stops asking for it.
        confirm_trials: trials a confirmation spreads the iterations it still needs over.
    """

    def __init__(
        self,
        values: Sequence[float],
        confirm_iterations: int,
        coarse_points: int = 8,
        max_inconclusive: int = 2,
        confirm_trials: int = CONFIRM_TRIALS,
    ) -> None:
        """A search not yet started (see the class's arguments).

        Raises:
            ValueError: no value, or ``confirm_iterations`` under 1.
        """
        if not values:
            raise ValueError("a search needs at least one value")
        if confirm_iterations < 1:
            raise ValueError("confirm_iterations must be 1 or more")
        self.values = tuple(values)
        self.n = int(confirm_iterations)
        self.coarse_points = int(coarse_points)
        self.max_inconclusive = int(max_inconclusive)
        self.confirm_trials = max(1, int(confirm_trials))
        self.stats = [ValueStats() for _ in self.values]
        self.history: list[tuple[Probe, Outcome]] = []
        self._pending: list[Probe] = []
        self._started = False
        self._done = False
        self._note: str | None = None

    # --- the loop ------------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        """True once the search asks for nothing more."""
        return self._done

    def propose(self) -> list[Probe]:
        """The next batch of trials (empty once the search is done).

        Raises:
            RuntimeError: the previous batch has outcomes still to record.
        """
        if self._pending:
            raise RuntimeError(
                f"record the outcomes of {len(self._pending)} probe(s) before proposing more"
            )
        if self._done:
            return []
        if not self._started:
            self._started = True
            coarse = coarse_indices(len(self.values), self.coarse_points)
            wanted = [(i, "coarse", None) for i in reversed(coarse)]
        else:
            wanted = self._decide()
        batch: list[Probe] = []
        seen: Counter = Counter()
        for index, role, min_iterations in wanted:
            attempt = self.stats[index].trials + seen[index]
            seen[index] += 1
            batch.append(Probe(index, self.values[index], role, attempt, min_iterations))  # type: ignore[arg-type]
        self._pending = list(batch)
        if not batch:
            self._done = True
        return batch

    def record(self, probe: Probe, outcome: Outcome) -> None:
        """Account one outcome of the last batch.

        Raises:
            ValueError: the probe was not proposed (or was already recorded).
        """
        try:
            self._pending.remove(probe)
        except ValueError:
            raise ValueError(
                f"{probe} was not proposed, or its outcome is already recorded"
            ) from None
        s = self.stats[probe.index]
        s.trials += 1
        s.iterations += max(0, int(outcome.iterations))
        if outcome.passed is True:
            s.passes += 1
            s.clean_iterations += max(0, int(outcome.iterations))
        elif outcome.passed is False:
            s.failures += 1
            s.statuses[outcome.status] += 1
        else:
            s.inconclusive += 1
        if outcome.passed is not True and outcome.reason:
            s.reasons.append(outcome.reason)
        self.history.append((probe, outcome))

    # --- the decision --------------------------------------------------------------------------
    def _bracket(self) -> tuple[int, int | None]:
        """(highest failing index or -1, lowest passing index above it or None)."""
        failing = max((i for i, s in enumerate(self.stats) if s.failing), default=-1)
        safer = range(failing + 1, len(self.values))
        above = next((i for i in safer if self.stats[i].passes), None)
        return failing, above

    def _finish(self, note: str | None = None) -> list[tuple[int, str, int | None]]:
        self._done = True
        if note and not self._note:
            self._note = note
        return []

    def _fmt(self, index: int) -> str:
        return f"{self.values[index]:g}"

    def _may_retry(self, index: int) -> bool:
        """Fewer than ``max_inconclusive`` inconclusive trials at the value so far."""
        return self.stats[index].inconclusive < self.max_inconclusive

    def _decide(self) -> list[tuple[int, str, int | None]]:
        """The next batch as (index, role, min_iterations), or [] once finished."""
        top = len(self.values) - 1
        failing, candidate = self._bracket()
        if failing == top:
            return self._finish(
                f"fails at the safest value searched ({self._fmt(top)}): the check fails where "
                "the device runs at its default, so no threshold is reported; check its "
                "tolerance first (framework.precision, the rows' check_arithmetic)")
        if candidate is None:
            # Nothing above the failures passed cleanly yet: retry an inconclusive value, safest
            # first.
            retry = [i for i in range(top, failing, -1) if self._may_retry(i)]
            if not retry:
                why = next((r for s in self.stats for r in s.reasons), "no valid measurement")
                return self._finish(f"no valid passing trial above the failures ({why})")
            return [(retry[0], "retry", None)]
        between = [
            i for i in range(failing + 1, candidate) if self._may_retry(i)
        ]
        if between:
            middle = (failing + candidate) / 2
            return [(min(between, key=lambda i: (abs(i - middle), -i)), "bisect", None)]
        s = self.stats[candidate]
        if s.clean_iterations >= self.n:
            skipped = candidate - failing - 1
            note = None
            if failing >= 0 and skipped:
                note = (f"{skipped} value(s) between {self._fmt(failing)} and "
                        f"{self._fmt(candidate)} gave no valid measurement")
            return self._finish(note)
        if s.inconclusive >= self.max_inconclusive:
            return self._finish(
                f"unconfirmed: {s.inconclusive} inconclusive trial(s) at {self._fmt(candidate)} "
                f"({s.reasons[-1] if s.reasons else 'invalid measurements'})"
            )
        remaining = self.n - s.clean_iterations
        per_trial = max(1.0, s.clean_iterations / s.passes)  # what a trial gives unasked
        trials = max(1, min(self.confirm_trials, math.ceil(remaining / per_trial)))
        return [(candidate, "confirm", math.ceil(remaining / trials))] * trials

    # --- the answer ----------------------------------------------------------------------------
    def result(self) -> SearchResult:
        """Where the search stands (final once :attr:`done`)."""
        failing, candidate = self._bracket()
        passing = [i for i, s in enumerate(self.stats) if s.passing]
        lowest_passing = min(passing) if passing else None
        non_monotone = failing >= 0 and lowest_passing is not None and lowest_passing < failing
        at_c = self.stats[candidate] if candidate is not None else ValueStats()
        at_f = self.stats[failing] if failing >= 0 else ValueStats()
        confirmed = self._done and candidate is not None and at_c.clean_iterations >= self.n
        notes = []
        if non_monotone:
            notes.append(
                f"non-monotone: a failure at {self._fmt(failing)} is safer than a pass at "
                f"{self._fmt(lowest_passing)}"  # type: ignore[arg-type]
            )
        if self._note:
            notes.append(self._note)
        if candidate is not None and failing < 0:
            notes.append(
                f"no failure seen down to {self._fmt(candidate)}, the riskiest value searched"
            )
        if not self._done:
            notes.append("search not finished")
        return SearchResult(
            stable_value=self.values[candidate] if confirmed else None,  # type: ignore[index]
            candidate_value=self.values[candidate] if candidate is not None else None,
            failing_value=self.values[failing] if failing >= 0 else None,
            lowest_passing_value=None if lowest_passing is None else self.values[lowest_passing],
            confirmed=confirmed,
            non_monotone=non_monotone,
            steps_between=candidate - failing if candidate is not None and failing >= 0 else None,
            iterations_at_stable=at_c.clean_iterations,
            trials_at_stable=at_c.trials,
            fault_rate_bound=fault_rate_bound(at_c.clean_iterations),
            iterations_at_failing=at_f.iterations,
            trials_at_failing=at_f.trials,
            failures_at_failing=at_f.failures,
            failure_statuses=", ".join(f"{k}×{v}" for k, v in sorted(at_f.statuses.items()))
            or None,
            trials_used=sum(s.trials for s in self.stats),
            grid_size=len(self.values),
            values_tested=sum(1 for s in self.stats if s.trials),
            note="; ".join(notes) or None,
        )


def run_search(search: ThresholdSearch, trial: Callable[[Probe], Outcome]) -> SearchResult:
    """Drive one search to the end with a function that runs a trial (tests, simulations)."""
    while batch := search.propose():
        for probe in batch:
            search.record(probe, trial(probe))
    return search.result()


