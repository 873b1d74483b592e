"""Stability thresholds by search: the lowest setting at which a kernel still computes right.

One search covers one ordered setting, on one GPU, for one computation (one group of the other
overrides: workload x framework x precision ...). The setting's values are the device's own
supported ones, ordered from the safest (the SM clock's maximum, the default power limit, a zero
clock offset) to the riskiest; the search looks for the riskiest value that is still stable.

The algorithm (:class:`ThresholdSearch`, a pure state machine: given the outcomes so far it
proposes the next batch of trials, so it is tested without Hydra, Ray or a device):

1. **coarse**: ``coarse_points`` values spread evenly over the whole range, safest to riskiest,
   in one batch (so a failure above a pass, non-monotone behaviour, is seen, not skipped);
2. **bisect** between the highest failing value (the safest one with any failure) and the
   passing value just above it, one trial per round, until they are one supported step apart;
3. **confirm**: repeat trials at the candidate until it has ``n`` clean iterations in total
   (a trial's iterations are its kernel calls, every one checked): the iterations still needed
   are spread over ``confirm_trials`` trials, each asked for its share (``measure.min_iters``),
   run in one batch. Any failure there makes the
   candidate a failing value and the search goes back to step 2 one value up. A value is
   declared stable only once confirmed: with ``n`` clean iterations and none faulty, the
   per-iteration fault rate is below ``3 / n`` at 95 % confidence (the rule of three; the exact
   Clopper-Pearson bound, ``1 - 0.05 ** (1 / n)``, is a little lower, so ``3 / n`` is safe).
   A value whose fault rate is ``10 / n`` passes ``n`` iterations with probability
   ``(1 - 10 / n) ** n < e ** -10``.

A trial passes when every repeat is ``ok`` and valid (ran at the setting asked: an invalid
measurement may not have, and its pass could put the threshold too low); it fails on any other
status, whatever its validity; an ``ok`` but invalid trial is inconclusive and is retried up to
``max_inconclusive`` times per value.

The rest of the module plans a sweep from plain data (which setting, which values on which GPU)
and turns finished searches into the ``thresholds`` table; the Hydra sweeper
(``hydra_plugins/dvfs/stability_sweeper.py``) composes the jobs, launches them and reads their rows.
Units: MHz for clocks and offsets, W for power limits.
"""

from __future__ import annotations

import csv
import json
import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from orchestrator.errors import UserError

CONFIDENCE = 0.95
"""The confidence of the fault-rate bound (the rule of three holds at 95 %)."""

RULE_OF_THREE = 3.0
"""``n`` clean iterations bound the per-iteration fault rate by ``3 / n`` at 95 % confidence."""

CONFIRM_TRIALS = 3
"""A confirmation spreads the iterations it still needs over this many trials, by default."""

THRESHOLDS_CSV = "thresholds.csv"
"""The thresholds table's file name in the sweep directory."""

Role = Literal["coarse", "bisect", "confirm", "retry"]


# --- the settings a search can walk -----------------------------------------------------------
@dataclass(frozen=True)
class OrderedSetting:
    """A device setting with an order from safe to risky.

    Attributes:
        key: the config key (``device.sm_clock_mhz``).
        column: the trial-row column that records it.
        riskier: ``"lower"`` when lower values are riskier (clocks, power), ``"higher"`` for offsets.
        unit: ``"MHz"`` or ``"W"``.
    """

    key: str
    column: str
    riskier: Literal["lower", "higher"]
    unit: str

    @property
    def name(self) -> str:
        """The key without its ``device.`` prefix (``sm_clock_mhz``)."""
        return self.key.split(".", 1)[1]


SETTINGS: dict[str, OrderedSetting] = {
    s.key: s
    for s in (
        OrderedSetting("device.sm_clock_mhz", "sm_clock_max_mhz", "lower", "MHz"),
        OrderedSetting("device.power_limit_w", "power_limit_w", "lower", "W"),
        OrderedSetting("device.clock_offset_mhz", "clock_offset_mhz", "higher", "MHz"),
    )
}
"""The ordered settings: the SM clock and the power limit downward, the clock offset upward."""

DEFAULT_POWER_STEP_W = 10.0  # the grid step of a power-limit search (NVML takes any mW value)


def ordered_setting(key: str) -> OrderedSetting:
    """The setting named by ``hydra.sweeper.setting``.

    Raises:
        UserError: the key is not an ordered setting this sweeper can search.
    """
    setting = SETTINGS.get(str(key))
    if setting is None:
        known = ", ".join(f"{k} ({'down' if s.riskier == 'lower' else 'up'}ward)" for k, s in SETTINGS.items())
        raise UserError(f"hydra.sweeper.setting={key} is not an ordered setting the stability sweeper can search; one of: {known}")
    return setting


@dataclass(frozen=True)
class SearchOptions:
    """What ``hydra/sweeper=stability`` is asked to do (its config keys, checked).

    Attributes:
        setting: the ordered setting to search (a key of :data:`SETTINGS`).
        confirm_iterations: ``n``: clean iterations a value needs before it is declared stable.
        coarse_points: values of the first, coarse pass (spread over the whole range).
        step: grid step of a power-limit (W) or clock-offset (MHz) search; None: 10 W, or the
            device's SM clock step for offsets. SM clocks always use the device's own table.
        max_inconclusive: ok-but-invalid trials at one value before the search gives up on it.
        confirm_trials: trials a confirmation spreads its iterations over.
    """

    setting: str = "device.sm_clock_mhz"
    confirm_iterations: int = 1000
    coarse_points: int = 8
    step: float | None = None
    max_inconclusive: int = 2
    confirm_trials: int = CONFIRM_TRIALS

    def validated(self) -> SearchOptions:
        """The options, checked.

        Raises:
            UserError: an unknown setting, a confirmation count under 1, fewer than 2 coarse
                points, a step that is not positive.
        """
        ordered_setting(self.setting)
        if not isinstance(self.confirm_iterations, int) or self.confirm_iterations < 1:
            raise UserError(
                f"hydra.sweeper.confirm_iterations={self.confirm_iterations} must be 1 or more "
                "(clean iterations a value needs before it is declared stable)"
            )
        if not isinstance(self.coarse_points, int) or self.coarse_points < 2:
            raise UserError(f"hydra.sweeper.coarse_points={self.coarse_points} must be 2 or more")
        if self.step is not None and not self.step > 0:
            raise UserError(f"hydra.sweeper.step={self.step} must be greater than 0")
        if not isinstance(self.max_inconclusive, int) or self.max_inconclusive < 1:
            raise UserError(f"hydra.sweeper.max_inconclusive={self.max_inconclusive} must be 1 or more")
        if not isinstance(self.confirm_trials, int) or self.confirm_trials < 1:
            raise UserError(f"hydra.sweeper.confirm_trials={self.confirm_trials} must be 1 or more")
        return self

    @property
    def ordered(self) -> OrderedSetting:
        """The setting searched."""
        return ordered_setting(self.setting)


# --- the search: a pure state machine ---------------------------------------------------------
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


@dataclass(frozen=True)
class Outcome:
    """What one trial said about its value.

    Attributes:
        passed: True (every repeat ok and valid), False (any repeat not ok), None (ok but the
            measurement is invalid, or no row came back: inconclusive).
        iterations: kernel calls the trial ran and checked (all repeats).
        status: ``ok`` or the first failing status.
        reason: why it failed or is inconclusive (the row's error or invalid reason).
    """

    passed: bool | None
    iterations: int
    status: str
    reason: str | None = None


def checked_calls(row: Mapping[str, Any]) -> int:
    """The calls of a trial whose outputs were checked (``checked_iters``; rows stored before it
    existed checked every timed call, so ``iterations``)."""
    checked = row.get("checked_iters")
    return int(row.get("iterations") or 0) if checked is None else int(checked)


def outcome_of(rows: Sequence[Mapping[str, Any]]) -> Outcome:
    """The outcome of one trial from its stored rows (one per repeat)."""
    if not rows:
        return Outcome(None, 0, "missing", "the trial stored no row")
    iterations = sum(checked_calls(r) for r in rows)
    bad = [r for r in rows if r.get("status") != "ok"]
    if bad:
        first = str(bad[0].get("error") or "").strip().splitlines()
        return Outcome(False, iterations, str(bad[0].get("status")), first[0] if first else None)
    invalid = [r for r in rows if r.get("valid") is not True]
    if invalid:
        return Outcome(None, iterations, "ok", f"invalid: {invalid[0].get('invalid_reason') or 'no reason recorded'}")
    return Outcome(True, iterations, "ok")


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
            raise RuntimeError(f"record the outcomes of {len(self._pending)} probe(s) before proposing more")
        if self._done:
            return []
        if not self._started:
            self._started = True
            wanted = [(i, "coarse", None) for i in reversed(coarse_indices(len(self.values), self.coarse_points))]
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
            raise ValueError(f"{probe} was not proposed, or its outcome is already recorded") from None
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
        above = next((i for i in range(failing + 1, len(self.values)) if self.stats[i].passes), None)
        return failing, above

    def _finish(self, note: str | None = None) -> list[tuple[int, str, int | None]]:
        self._done = True
        if note and not self._note:
            self._note = note
        return []

    def _fmt(self, index: int) -> str:
        return f"{self.values[index]:g}"

    def _decide(self) -> list[tuple[int, str, int | None]]:
        """The next batch as (index, role, min_iterations), or [] once finished."""
        top = len(self.values) - 1
        failing, candidate = self._bracket()
        if failing == top:
            return self._finish(f"fails at the safest value searched ({self._fmt(top)})")
        if candidate is None:
            # Nothing above the failures passed cleanly yet: retry an inconclusive value, safest first.
            retry = [i for i in range(top, failing, -1) if self.stats[i].inconclusive < self.max_inconclusive]
            if not retry:
                why = next((r for s in self.stats for r in s.reasons), "no valid measurement")
                return self._finish(f"no valid passing trial above the failures ({why})")
            return [(retry[0], "retry", None)]
        between = [
            i for i in range(failing + 1, candidate) if self.stats[i].inconclusive < self.max_inconclusive
        ]
        if between:
            middle = (failing + candidate) / 2
            return [(min(between, key=lambda i: (abs(i - middle), -i)), "bisect", None)]
        s = self.stats[candidate]
        if s.clean_iterations >= self.n:
            skipped = candidate - failing - 1
            note = None
            if failing >= 0 and skipped:
                note = f"{skipped} value(s) between {self._fmt(failing)} and {self._fmt(candidate)} gave no valid measurement"
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
            notes.append(f"no failure seen down to {self._fmt(candidate)}, the riskiest value searched")
        if not self._done:
            notes.append("search not finished")
        return SearchResult(
            stable_value=self.values[candidate] if confirmed else None,  # type: ignore[index]
            candidate_value=self.values[candidate] if candidate is not None else None,
            failing_value=self.values[failing] if failing >= 0 else None,
            lowest_passing_value=self.values[lowest_passing] if lowest_passing is not None else None,
            confirmed=confirmed,
            non_monotone=non_monotone,
            steps_between=candidate - failing if candidate is not None and failing >= 0 else None,
            iterations_at_stable=at_c.clean_iterations,
            trials_at_stable=at_c.trials,
            fault_rate_bound=fault_rate_bound(at_c.clean_iterations),
            iterations_at_failing=at_f.iterations,
            trials_at_failing=at_f.trials,
            failures_at_failing=at_f.failures,
            failure_statuses=", ".join(f"{k}×{v}" for k, v in sorted(at_f.statuses.items())) or None,
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


# --- the search space: the device's own values --------------------------------------------------
def _number(v: float) -> float | int:
    return int(v) if float(v).is_integer() else float(v)


def request_with(base: Any, setting: OrderedSetting, value: float) -> Any:
    """A ``SettingsRequest``: the job's other settings plus the searched one at ``value``."""
    if setting.name == "sm_clock_mhz":
        return replace(base, sm_clock_mhz=(int(value), int(value)))
    if setting.name == "power_limit_w":
        return replace(base, power_limit_w=float(value))
    return replace(base, clock_offset_mhz=int(value))


def _grid(lo: float, hi: float, step: float, anchor: float) -> list[float]:
    """Values from ``lo`` to ``hi`` on a ``step`` grid through ``anchor`` (both ends included)."""
    k_lo = math.ceil((lo - anchor) / step - 1e-9)
    k_hi = math.floor((hi - anchor) / step + 1e-9)
    vals = {round(anchor + k * step, 6) for k in range(k_lo, k_hi + 1)} | {lo, hi}
    return sorted(v for v in vals if lo <= v <= hi)


def search_values(
    setting: OrderedSetting,
    caps: Any,
    check: Callable[[Any], None],
    base_request: Any,
    *,
    step: float | None = None,
    explicit: Sequence[float] | None = None,
    device_label: str = "the GPU",
) -> tuple[float, ...]:
    """The values one GPU supports for the setting, riskiest first.

    Args:
        setting: what is searched.
        caps: the GPU's ``DeviceCapabilities``.
        check: refuses a ``SettingsRequest`` the GPU or its policy does not allow (raises
            ``UserError``); typically ``Policy.check`` bound to the GPU.
        base_request: the job's other settings (the memory clock changes the SM clock table).
        step: the grid step of a power or offset search (see :class:`SearchOptions`).
        explicit: values the user gave (``device.sm_clock_mhz=range(...)``); each must pass
            ``check``. None: every value the device supports and the policy allows.
        device_label: names the GPU in messages.

    Raises:
        UserError: an explicit value the device does not support, or no value at all.
    """
    if explicit is not None:
        values = sorted({_number(v) for v in explicit})
        for v in values:
            check(request_with(base_request, setting, v))
    else:
        if setting.name == "sm_clock_mhz":
            candidates: list[float] = list(caps.supported_sm_clocks_mhz(base_request.mem_clock_mhz))
        elif setting.name == "power_limit_w":
            lo, hi = float(caps.power_limit_min_w), float(caps.power_limit_default_w)
            candidates = _grid(lo, hi, step or DEFAULT_POWER_STEP_W, hi)
        else:
            if caps.clock_offset_range_mhz is None:
                check(request_with(base_request, setting, 0))  # the guard's own message
                raise UserError(f"{device_label} does not support clock offsets")
            sm = caps.supported_sm_clocks_mhz(base_request.mem_clock_mhz)
            default_step = min((b - a for a, b in zip(sm, sm[1:])), default=15) or 15
            candidates = _grid(0, float(caps.clock_offset_range_mhz[1]), step or default_step, 0)
        if not candidates:
            raise UserError(
                f"{device_label} offers no value of {setting.key} to search "
                f"(a device without settings, such as device=cpu, cannot be searched)"
            )
        values = []
        for v in candidates:
            try:
                check(request_with(base_request, setting, v))
            except UserError:
                continue  # outside the policy
            values.append(_number(v))
    if not values:
        raise UserError(f"no value of {setting.key} is allowed on {device_label} (check device.policy_file)")
    return tuple(values if setting.riskier == "lower" else reversed(values))


# --- a sweep: many searches, one per (group, GPU) ----------------------------------------------
@dataclass(frozen=True)
class GpuInfo:
    """One GPU as the planner needs it."""

    index: int
    uuid: str
    name: str
    caps: Any  # DeviceCapabilities


def discover_gpus(device_cfg: Any) -> list[GpuInfo]:
    """The GPUs ``device.gpus`` selects, with their capabilities (read only; nothing is set).

    Raises:
        UserError: no such GPU, an unknown backend or profile, no driver.
    """
    from orchestrator.devices import open_backend, select_devices

    backend = open_backend(device_cfg)
    try:
        return [
            GpuInfo(d.identity.index, d.identity.uuid, d.identity.name, d.capabilities())
            for d in select_devices(backend, device_cfg.gpus)
        ]
    finally:
        backend.close()


@dataclass
class Target:
    """One search: a group of overrides on one GPU.

    Attributes:
        group: the swept overrides that make the group (``{"workload": "gemm", ...}``).
        overrides: every override of the group's jobs (common ones and the group's).
        labels: the computation, for the table (workload, framework, dtype, precision).
        gpu: the GPU.
        search: its state machine.
        store_dir: where its jobs store their rows (and where its table row goes).
        base_seed: the group's ``seed`` (of the kernel's random inputs).
        max_iters: the group's ``measure.max_iters`` (a confirmation trial asks for no more).
    """

    group: dict[str, str]
    overrides: list[str]
    labels: dict[str, Any]
    gpu: GpuInfo
    search: ThresholdSearch
    store_dir: str = ""
    base_seed: int = 0
    max_iters: int | None = None

    def job_overrides(self, setting: OrderedSetting, probe: Probe) -> list[str]:
        """The overrides of the job that runs ``probe``, pinned to this GPU by its UUID.

        The first trial at a value is exactly the trial a grid sweep would run there (same
        trial key: a grid already in the store is reused). A repeated trial at a value runs on
        fresh random inputs (``seed`` + attempt), which also gives it a trial key of its own, so
        it is a new trial, never a resumed one.
        """
        extra = []
        if probe.attempt:
            extra.append(f"seed={self.base_seed + probe.attempt}")
        if probe.min_iterations is not None:
            m = probe.min_iterations if self.max_iters is None else min(probe.min_iterations, self.max_iters)
            extra.append(f"measure.min_iters={m}")
        return [*self.overrides, f"device.gpus=[{self.gpu.uuid}]", f"{setting.key}={_number(probe.value)}", *extra]

    def trial_record(self, probe: Probe) -> dict[str, Any]:
        """What the store's ``search_trials`` meta item keeps about one trial."""
        return {"role": probe.role, "attempt": probe.attempt, "value": _number(probe.value),
                "device_uuid": self.gpu.uuid, "group": " ".join(f"{k}={v}" for k, v in self.group.items())}

    @property
    def label(self) -> str:
        what = "/".join(str(self.labels[k]) for k in ("workload", "framework") if self.labels.get(k) is not None)
        extra = " ".join(f"{k}={v}" for k, v in self.group.items() if k not in ("workload", "framework"))
        return f"gpu{self.gpu.index} {what}" + (f" {extra}" if extra else "")


def next_batch(targets: Iterable[Target]) -> list[tuple[Target, Probe]]:
    """Every search's next proposals, as one batch, ordered by GPU (so a process that serves
    several GPUs switches between them once per batch)."""
    batch = [(t, p) for t in targets for p in t.search.propose()]
    return sorted(batch, key=lambda tp: tp[0].gpu.index)


def run_sweep(targets: list[Target], run_batch: Callable[[list[tuple[Target, Probe]]], list[Outcome]]) -> int:
    """Run every search to its end; ``run_batch`` runs a batch and returns each trial's outcome.

    Returns:
        The number of trials run.
    """
    total = 0
    while batch := next_batch(targets):
        outcomes = run_batch(batch)
        for (target, probe), outcome in zip(batch, outcomes, strict=True):
            target.search.record(probe, outcome)
        total += len(batch)
    return total


TABLE_COLUMNS = [
    "device_index", "device_uuid", "device_name", "workload", "framework", "dtype", "precision",
    "group", "setting", "unit", "riskier", "stable_value", "failing_value", "candidate_value",
    "lowest_passing_value", "confirmed", "non_monotone", "steps_between", "iterations_at_stable",
    "trials_at_stable", "fault_rate_bound", "confidence", "iterations_at_failing",
    "trials_at_failing", "failures_at_failing", "failure_statuses", "trials_used", "grid_size",
    "values_tested", "confirm_iterations", "note",
]
"""The ``thresholds`` table: one row per GPU x group.

``stable_value`` is the lowest stable clock or power limit (the highest stable offset);
``failing_value`` the highest failing clock or power (the lowest failing offset).
"""


def thresholds_table(targets: Sequence[Target], options: SearchOptions) -> list[dict[str, Any]]:
    """One row per search (see :data:`TABLE_COLUMNS`)."""
    setting = options.ordered
    rows = []
    for t in targets:
        r = t.search.result()
        row = {
            "device_index": t.gpu.index,
            "device_uuid": t.gpu.uuid,
            "device_name": t.gpu.name,
            **{k: t.labels.get(k) for k in ("workload", "framework", "dtype", "precision")},
            "group": " ".join(f"{k}={v}" for k, v in t.group.items()) or None,
            "setting": setting.key,
            "unit": setting.unit,
            "riskier": setting.riskier,
            "confidence": CONFIDENCE,
            "confirm_iterations": options.confirm_iterations,
        }
        for k in TABLE_COLUMNS:
            if k not in row:
                row[k] = getattr(r, k)
        rows.append({k: row[k] for k in TABLE_COLUMNS})
    return rows


def write_thresholds(store_dir: str | Path, rows: list[dict[str, Any]], options: SearchOptions, trials: int) -> Path:
    """Write the table to ``thresholds.csv`` and to the store's ``thresholds`` meta item.

    Returns:
        The CSV file written.
    """
    from orchestrator.store import ResultStore

    path = Path(store_dir) / THRESHOLDS_CSV
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".csv.tmp")
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=TABLE_COLUMNS)
        writer.writeheader()
        writer.writerows({k: ("" if v is None else v) for k, v in r.items()} for r in rows)
    tmp.replace(path)
    with ResultStore(store_dir) as store:
        store.put_meta(
            "thresholds",
            {
                "sweeper": "stability",
                "options": json.loads(json.dumps(options.__dict__)),
                "confidence": CONFIDENCE,
                "trials": trials,
                "rows": rows,
            },
        )
    return path


SEARCH_TRIALS_META = "search_trials"
"""The store's meta item that maps each trial key of a stability sweep to its search phase."""


def record_trials(store_dir: str | Path, trials: Mapping[str, Mapping[str, Any]]) -> None:
    """Add trials to the store's ``search_trials`` meta item (trial key -> role, attempt, value...).

    The rows themselves are the trial's own; this item is how ``analysis.thresholds`` learns
    which phase of the search asked for each (``roles=``).
    """
    from orchestrator.store import ResultStore

    with ResultStore(store_dir) as store:
        item = store.get_meta(SEARCH_TRIALS_META) or {"trials": {}}
        item["trials"].update({k: dict(v) for k, v in trials.items()})
        item["roles"] = {k: v["role"] for k, v in item["trials"].items()}
        store.put_meta(SEARCH_TRIALS_META, item)


def describe(row: Mapping[str, Any], label: str) -> str:
    """One line of the report for one row of the table."""
    unit, key = row["unit"], str(row["setting"]).split(".", 1)[1]

    def v(x: Any) -> str:
        return f"{x:g} {unit}"

    bound = row["fault_rate_bound"]
    failing = (
        f"; fails at {v(row['failing_value'])} ({row['failure_statuses']} in {row['trials_at_failing']} trial(s))"
        if row["failing_value"] is not None else ""
    )
    if row["stable_value"] is not None:
        head = (
            f"{key} stable at {v(row['stable_value'])}: {row['iterations_at_stable']} clean iterations in "
            f"{row['trials_at_stable']} trial(s), fault rate < {bound:.2g}/iteration ({CONFIDENCE:.0%})"
        )
    elif row["candidate_value"] is not None:
        head = f"{key} unconfirmed at {v(row['candidate_value'])} ({row['iterations_at_stable']} clean iterations)"
    else:
        head = f"{key}: no stable value"
    tail = f"; {row['trials_used']} trials (a grid: {row['grid_size']})"
    note = f"; {row['note']}" if row["note"] else ""
    return f"stability: {label} {row['device_uuid']}: {head}{failing}{tail}{note}"
