"""Fitting a profile's terms to real measurements of one board: what ``dvfs calibrate`` does.

The simulated GPU is a twin of a board only where its terms match that board's measurements. A
profile's *fittable* terms (``TERMS``) are its achieved rates (``achieved:``, what real kernels
reach of each roof, per operand type where the rows have several), its power terms
(``power_w:`` clock, SM, ALU per operand type, traffic), the power controller's margin under its
limit (``power_limit_w.hold_below``) and, when the rows span clocks or power limits, the terms
only such rows show (``ACROSS_SETTINGS``: context, leakage, idle, the V-f curve's knee and
floor). Each measured row (a trial on the real board: its charged work, time per iteration,
average power, observed SM clock and die temperature) gives residuals of the model *at the clock
the board ran at and the temperature its die was at* (smooth in every term, where the model's
own choice of clock is a step function of them)::

    time:  log(sim / real) / TOLERANCE["time"]
    power: log(sim / real) / TOLERANCE["power"]

and a row the board marked power-capped (``SW_POWER_CAP``) one more: the model's power there
against the controller's set point, ``limit * (1 - hold_below)``, which fits the margin. The
fitted profile is then judged on what a user of the sim sees, the model's steady state with its
own choice of clock under the row's limit (``RowFit``), and each published anchor of the
profile (``calibration.ANCHORS``; optional) adds a residual of zero inside its accepted range
and its distance outside it over the range's width, times ``ANCHOR_WEIGHT``: fitting to real
rows must not move a published figure out of its range, and where the two cannot both hold the
table says so. ``scipy.optimize.least_squares`` (bounded, trust-region) minimises the sum of
squares, first over the smooth residuals, then over all of them.

Which terms the rows determine (``determine``): each term's column of the Jacobian (its effect
on every smooth residual), taken in the order of ``TERMS``; a term is fitted only if its column
leaves the span of the columns already taken by more than ``INDEPENDENT`` (each at unit length).
A term no residual responds to (no row of that kind of work, no row under a power cap...) and a
term the rows cannot tell from those already taken (``context`` and ``idle`` both add a constant
while a kernel runs) are *undetermined*: kept from the base, and the result says why. The
``ACROSS_SETTINGS`` terms are candidates only when some row ran under a locked clock or a limit
other than the board's default: rows of one setting per workload cannot separate them from the
clock term. A fit across settings starts from ``staged_start`` (rates from time alone, the power
terms linear at each V-f curve of a grid, the margin from the capped rows), near the global
optimum rather than the base's.

A fit is scored on rows it did not see (``leave_one_out``): each row predicted by the fit of the
same base to the other rows. A base that already carries a fit of these rows (the shipped H200,
fitted to the real H200's rows) scores nothing out of sample: start from one that does not.
Everything here is pure: rows and a base profile's YAML in, a fitted YAML mapping and the
residuals out.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.devices.sim import calibration
from orchestrator.devices.sim.profile import OPERANDS, GpuProfile, parse_profile

TOLERANCE = {"time": 0.15, "power": 0.10, "energy": 0.15, "clock": 0.10}
"""The agreement a fitted row is judged by (a fraction): the residual is the log ratio over it."""
HINGE_AT, HINGE_WEIGHT = 0.85, 10.0  # past 85% of its tolerance a figure costs 10x more
AT_CLOCK_WEIGHT = 0.5  # the physics at the board's clock, beside what the sim shows at its own
ANCHOR_WEIGHT = 10.0  # an anchor out of range by its own width costs as much as 10 tolerances
INDEPENDENT = 0.05
"""A term's unit Jacobian column must leave the span of those already taken by this much (about
3 degrees) for the rows to determine it apart from them."""
KNEE_RANGE = (0.4, 0.9)
"""Where a fitted V-f knee may lie, as fractions of f_max: published boards put it at 0.55-0.77
(an A100 at 0.745, Hopper at 0.70; flat V_min below), widened both ways. Rows at a few clocks
cannot place a knee that falls between two of them; the bound keeps it where real ones are."""
FLOOR_RANGE = 0.5
"""The lowest fitted V_min, as a fraction of V_max (published V_max / V_min is about 1.25-1.4)."""
MAX_EVALUATIONS = 25
"""Residual evaluations per free term a least-squares stage may take (a fit's time is mostly
these; the anchors' decode steps cost the most)."""
GRID = 12
"""Knee and floor values tried on each axis when the V-f curve is fitted (``staged_start``)."""


@dataclass(frozen=True)
class Term:
    """One fittable term: where it sits in the profile's YAML and the range it may take."""

    path: tuple[str, ...]  # e.g. ("achieved", "memory")
    low: float
    high: float
    default: float = 0.0  # its value where the base profile does not give it (and no fallback)
    fallback: tuple[str, ...] | None = None  # where absent: the value of this term instead
    high_from: tuple[str, ...] | None = None  # the upper bound: the base's value of this path
    across_settings: bool = False  # shows only across clocks or limits (``ACROSS_SETTINGS``)
    within_clocks: bool = False  # a clock: within ``KNEE_RANGE`` of the base's highest clock

    @property
    def name(self) -> str:
        """The term as the YAML spells it: ``achieved.memory``."""
        return ".".join(self.path)


def _operand_terms() -> tuple[Term, ...]:
    """Each operand type's own achieved share and ALU power, falling back to the shared ones."""
    rates = [Term(("achieved", f"matmul_{o}"), 0.05, 1.0, 1.0, fallback=("achieved", "matmul"))
             for o in OPERANDS]
    alus = [Term(("power_w", f"alu_{o}"), 0.0, 1500.0, fallback=("power_w", "alu"))
            for o in OPERANDS]
    return (*rates, *alus)


ACROSS_SETTINGS: tuple[Term, ...] = (
    Term(("power_w", "context"), 0.0, 300.0, across_settings=True),
    Term(("power_w", "leakage"), 0.0, 500.0, across_settings=True),
    Term(("vf_curve", "knee_mhz"), 0.0, 5000.0, across_settings=True, within_clocks=True),
    Term(("vf_curve", "v_min"), 0.3, 2.0, high_from=("vf_curve", "v_max"), across_settings=True),
    Term(("power_w", "idle"), 0.0, 300.0, across_settings=True),
)
"""The terms only rows across clocks or power limits show: a constant while a kernel is resident
(context; idle, which only a row of the idle board tells from it), static power that follows V
(leakage), and where V leaves its floor and how low that floor is against V_max (the V-f curve's
shape; V_max itself is the scale the terms are given at)."""

SHARED_TERMS: tuple[Term, ...] = (
    Term(("achieved", "matmul"), 0.05, 1.0, 1.0),
    Term(("achieved", "conv"), 0.05, 1.0, 1.0),
    Term(("achieved", "elementwise"), 0.05, 1.0, 1.0),
    Term(("achieved", "memory"), 0.3, 1.0, 1.0),
    Term(("achieved", "transcendental_flops"), 1.0, 200.0, 1.0),
    Term(("achieved", "launch_overhead_s"), 0.0, 2e-4, 5e-6),
    Term(("power_w", "clock"), 0.0, 1500.0, 0.0),
    Term(("power_w", "sm"), 0.0, 1500.0, 0.0),
    Term(("power_w", "alu"), 0.0, 1500.0, 0.0),
    Term(("power_w", "l2"), 0.0, 1000.0, 0.0),
    Term(("power_w", "hbm"), 0.0, 1000.0, 0.0),
    Term(("power_limit_w", "hold_below"), 0.0, 0.15, 0.0),
)
"""The terms every operand type shares: the rates by kind of work, the power terms, the margin
(the shipped H200 profile was fitted on these, to its six float32 rows and four anchors)."""

TERMS: tuple[Term, ...] = (*SHARED_TERMS, *_operand_terms(), *ACROSS_SETTINGS)
"""Every fittable term, in the order the rows may claim them (a shared term before an operand's
own, the settings-spanning terms last)."""


def _lookup(raw: dict[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = raw
    for key in path:
        if not isinstance(node, dict) or node.get(key) is None:
            return None
        node = node[key]
    return node


def get_term(raw: dict[str, Any], term: Term) -> float:
    """A term's value in a profile's YAML mapping (where absent: its fallback's, else default)."""
    value = _lookup(raw, term.path)
    if value is None and term.fallback is not None:
        value = _lookup(raw, term.fallback)
    return term.default if value is None else float(value)


def bounds(raw: dict[str, Any], term: Term, profile: GpuProfile) -> tuple[float, float]:
    """The range a term may take when fitted from a base profile (its YAML mapping and the
    profile parsed from it)."""
    low, high = term.low, term.high
    if term.high_from is not None:
        top = _lookup(raw, term.high_from)
        high = min(high, float(top)) if top is not None else high
    if term.within_clocks:
        low = max(low, profile.f_min_mhz, KNEE_RANGE[0] * profile.f_max_mhz)
        high = min(high, KNEE_RANGE[1] * profile.f_max_mhz)
    if term.path == ("vf_curve", "v_min"):
        low = max(low, FLOOR_RANGE * high)
    return low, max(high, low)


def spans_settings(rows: Sequence[dict[str, Any]]) -> bool:
    """Whether some row ran under a locked clock or a power limit: rows across settings."""
    return any(r.get("sm_clock_max_mhz") is not None or r.get("power_limit_w") is not None
               for r in rows)


def with_terms(raw: dict[str, Any], values: dict[Term, float]) -> dict[str, Any]:
    """A copy of a profile's YAML mapping with each term set (the mappings on a term's path are
    copied, the rest shared: a fit makes thousands of these)."""
    out = dict(raw)
    copied: set[tuple[str, ...]] = set()
    for term, value in values.items():
        node = out
        for depth, key in enumerate(term.path[:-1]):
            prefix = term.path[:depth + 1]
            if prefix not in copied:
                node[key] = copy.copy(node.get(key) or {})
                copied.add(prefix)
            node = node[key]
        node[term.path[-1]] = float(value)
    return out


@dataclass(frozen=True)
class RowFit:
    """One measured row beside the fitted profile's figures."""

    workload: str
    real: dict[str, float]  # time_s, power_w, energy_j, clock_mhz
    sim: dict[str, float]

    def error(self, figure: str) -> float:
        """sim / real - 1 for one figure."""
        return self.sim[figure] / self.real[figure] - 1


@dataclass(frozen=True)
class FitResult:
    """A fit: the profile's mapping, each row's fit, the anchors, and what the data left alone."""

    raw: dict[str, Any]  # the fitted profile's YAML mapping
    profile: GpuProfile
    fitted: dict[str, tuple[float, float]]  # term -> (base value, fitted value)
    undetermined: list[str]  # terms the rows did not determine, kept from the base
    rows: list[RowFit]
    anchors: list[calibration.AnchorResult]
    why: dict[str, str] = field(default_factory=dict)  # undetermined term -> why


def row_figures(profile: GpuProfile, row: dict[str, Any], peak: str) -> dict[str, float]:
    """The model's steady state for a measured row: time, power, energy, clock."""
    c = calibration.compare_real(profile, row, peak)
    return {"time_s": c.ms_per_iter[0] / 1e3, "power_w": c.power_w[0],
            "energy_j": c.j_per_iter[0], "clock_mhz": c.sm_clock_mhz[0]}


def real_figures(row: dict[str, Any]) -> dict[str, float]:
    """What the real board measured for a row."""
    return {"time_s": float(row["time_per_iter_s"]), "power_w": float(row["avg_power_w"]),
            "energy_j": float(row["energy_per_iter_j"]),
            "clock_mhz": float(row["observed_sm_clock_mhz"])}


def _capped(row: dict[str, Any]) -> bool:
    return "sw_power_cap" in [str(r).lower() for r in row.get("throttle_reasons") or ()]


def _at_clock(profile: GpuProfile, row: dict[str, Any], peak: str) -> calibration.StepPoint:
    """The model at the clock a row ran at and the die temperature it recorded."""
    return calibration.step_at(profile, [calibration.Phase(calibration.row_work(row, peak))],
                               int(real_figures(row)["clock_mhz"]),
                               calibration.row_temperature_c(row))


def _residuals(profile: GpuProfile, rows: Sequence[dict[str, Any]], peaks: Sequence[str],
               anchors: Sequence[calibration.Anchor], smooth: bool = False,
               time_only: bool = False) -> list[float]:
    """The residuals of a profile over the rows and anchors; ``smooth``: only the physics at
    each row's own clock (smooth in every term) and the cap's set point, not the model's own
    choice of clock (a step function of the terms); ``time_only``: only the time at each row's
    clock (which no power term moves)."""
    out: list[float] = []
    weight = 1.0 if smooth else AT_CLOCK_WEIGHT
    for row, peak in zip(rows, peaks, strict=True):
        real = real_figures(row)
        at = _at_clock(profile, row, peak)
        out.append(weight * math.log(at.time_s / real["time_s"]) / TOLERANCE["time"])
        if time_only:
            continue
        out.append(weight * math.log(at.power_w / real["power_w"]) / TOLERANCE["power"])
        if _capped(row):
            limit = row.get("power_limit_w") or profile.power_limit_default_w
            target = limit * (1 - profile.power_cap_hold)
            out.append(math.log(at.power_w / target) / TOLERANCE["power"])
        if smooth:
            continue
        sim = row_figures(profile, row, peak)
        for figure, kind in (("time_s", "time"), ("power_w", "power"), ("energy_j", "energy"),
                             ("clock_mhz", "clock")):
            error = math.log(sim[figure] / real[figure]) / TOLERANCE[kind]
            out.append(error)
            if kind != "clock":  # a figure near its tolerance is pushed back inside it
                out.append(HINGE_WEIGHT * max(0.0, abs(error) - HINGE_AT))
    for anchor in anchors:
        value = float(anchor.sim(profile))
        width = max(anchor.high - anchor.low, 1e-9)
        outside = max(anchor.low - value, 0.0, value - anchor.high)
        out.append(ANCHOR_WEIGHT * outside / width)
    return out


@dataclass
class _Problem:
    """What a fit minimises: the residuals of a base profile with some terms set, over the rows.

    An operand's own term the base lacks (``following``) follows its shared term (``alu_bf16``
    follows ``alu``) until it is moved itself: only then is it written into the profile.
    """

    base_raw: dict[str, Any]
    rows: Sequence[dict[str, Any]]
    peaks: list[str]
    anchors: Sequence[calibration.Anchor]
    key: str
    terms: Sequence[Term]
    following: dict[Term, Term] = field(init=False)
    trials: int = 0  # profiles evaluated so far

    def __post_init__(self) -> None:
        by_path = {t.path: t for t in self.terms}
        self.following = {t: by_path[t.fallback] for t in self.terms
                          if t.fallback in by_path and _lookup(self.base_raw, t.path) is None}

    def follow(self, values: dict[Term, float], moved: set[Term]) -> dict[Term, float]:
        """``values`` with each following term not ``moved`` at its shared term's value."""
        return values | {t: values[s] for t, s in self.following.items() if t not in moved}

    def profile(self, values: dict[Term, float], moved: set[Term]) -> GpuProfile:
        """The base with the terms at ``values`` (following terms not moved: unwritten)."""
        written = {t: v for t, v in values.items() if t not in self.following or t in moved}
        # A key of its own per trial profile: profiles hash by key, and the model memoises its
        # operating points on them (one key for all would collide in that cache).
        self.trials += 1
        return parse_profile(f"{self.key}~{self.trials}", with_terms(self.base_raw, written),
                             self.key)

    def residuals(self, values: dict[Term, float], moved: set[Term], smooth: bool = False,
                  time_only: bool = False) -> list[float]:
        """The residuals of ``profile(values, moved)`` (``_residuals``' modes)."""
        return _residuals(self.profile(values, moved), self.rows, self.peaks, self.anchors,
                          smooth, time_only)


def fit(
    base_raw: dict[str, Any],
    rows: Sequence[dict[str, Any]],
    peak_of: Callable[[dict[str, Any]], str],
    *,
    key: str = "fitted",
    anchors: Sequence[calibration.Anchor] = (),
    terms: Sequence[Term] = TERMS,
) -> FitResult:
    """Fit ``terms`` of a base profile (its YAML mapping) to measured rows of one board.

    Args:
        base_raw: the base profile's YAML mapping (what is not fitted is kept from it).
        rows: measured rows: ``charged_flops``, ``charged_bytes``, ``charged_launches`` (and
            ``charged_transcendentals``, ``work_kind`` where known), ``time_per_iter_s``,
            ``avg_power_w``, ``energy_per_iter_j``, ``observed_sm_clock_mhz``, their settings
            (``power_limit_w``, ``sm_clock_max_mhz``; None: the board's defaults) and, where
            recorded, the die's ``temperature_c``.
        peak_of: the compute roof of a row (``KernelSpec.peak`` of its dtype and precision).
        key: the fitted profile's key.
        anchors: published anchors the fitted profile must keep in range.
        terms: the terms that may be fitted (those the rows determine are: module docstring).
    """
    why = {t.name: "the rows are all at the board's default settings: it shows only across "
           "clocks or power limits" for t in terms if t.across_settings
           and not spans_settings(rows)}
    candidates = [t for t in terms if t.name not in why]
    problem = _Problem(base_raw, rows, [peak_of(r) for r in rows], anchors, key, candidates)
    base = {t: get_term(base_raw, t) for t in candidates}
    base_profile = parse_profile(key, base_raw, key)
    ranges = {t: bounds(base_raw, t, base_profile) for t in candidates}
    values, determined, unresolved = _solve(problem, candidates, base, ranges)

    def base_start(term: Term) -> float:
        return min(max(base[term], ranges[term][0]), ranges[term][1])

    why |= unresolved
    across = spans_settings(rows)  # a tied term keeps what the staged start gave it
    tied = {t for t in candidates if t not in determined and t not in problem.following
            and across and _tied(why.get(t.name)) and values[t] != base_start(t)}
    for t in tied:
        partner = why[t.name].removeprefix(CONFOUNDED).split(" (")[0].strip()
        why[t.name] = (f"set with {partner} by the staged start: the rows fix only what the two "
                       "add up to, not each")
    free = [t for t in candidates if t in determined or t in tied]
    raw = with_terms(base_raw, {t: _rounded(t, v) for t, v in values.items() if t in free})
    profile = parse_profile(key, raw, key)
    return FitResult(
        raw=raw, profile=profile,
        fitted={t.name: (base[t], _rounded(t, values[t])) for t in free},
        undetermined=[t.name for t in terms if t not in determined and t not in tied],
        rows=[RowFit(r["workload"], real_figures(r), row_figures(profile, r, p))
              for r, p in zip(rows, problem.peaks, strict=True)],
        anchors=[calibration.AnchorResult(a, float(a.sim(profile))) for a in anchors],
        why={t.name: why[t.name] for t in terms if t.name in why},
    )


def leave_one_out(
    base_raw: dict[str, Any],
    rows: Sequence[dict[str, Any]],
    peak_of: Callable[[dict[str, Any]], str],
    *,
    anchors: Sequence[calibration.Anchor] = (),
    terms: Sequence[Term] = TERMS,
) -> list[RowFit]:
    """Each row beside the prediction of the fit made without it (from the same base).

    The figures a row is judged by out of sample: a fit that only reproduces its own rows scores
    well in sample and badly here. A row whose kind of work no other row has is predicted with
    the base's value of that rate (no other row determines it).
    """
    out = []
    for i, row in enumerate(rows):
        others = [r for j, r in enumerate(rows) if j != i]
        result = fit(base_raw, others, peak_of, key=f"loo{i}", anchors=anchors, terms=terms)
        out.append(RowFit(row["workload"], real_figures(row),
                          row_figures(result.profile, row, peak_of(row))))
    return out


# --- the solver -------------------------------------------------------------------------------
def _solve(problem: _Problem, terms: Sequence[Term], base: dict[Term, float],
           ranges: dict[Term, tuple[float, float]],
           ) -> tuple[dict[Term, float], set[Term], dict[str, str]]:
    """Least squares over the terms the rows determine; returns every term's value, the set
    fitted, and why each other term was not. Across settings the fit starts from each of
    ``staged_start``'s best V-f curves (the shared terms) and keeps the one that ends with the
    lowest cost; which terms the rows determine is judged there, not at the base."""
    start = {t: min(max(base[t], ranges[t][0]), ranges[t][1]) for t in terms}
    if not any(t.across_settings for t in terms):
        return _rounds(problem, terms, start, start, [], ranges)[:3]
    staged = [t for t in terms if t not in problem.following]  # TERMS' order: reproducible
    ends = [_rounds(problem, terms, values, start, staged, ranges)
            for values in staged_start(problem, staged, dict(start), ranges)]
    return min(ends, key=lambda end: end[3])[:3]


def _rounds(problem: _Problem, terms: Sequence[Term], values: dict[Term, float],
            start: dict[Term, float], staged: Sequence[Term],
            ranges: dict[Term, tuple[float, float]],
            ) -> tuple[dict[Term, float], set[Term], dict[str, str], float]:
    """The fit from ``values``: each round judges which terms the rows determine there, fits
    the smooth residuals, then all of them, every undetermined term at its ``start`` value (a
    term the staged start set and the rows cannot tell from one fitted keeps its value: the
    pair's sum is what the rows fix). Twice at most: a term may respond only once others moved
    (a power cap only once it bites). Returns the values, the terms fitted, why each other one
    was not, and the final cost."""
    determined: set[Term] = set()
    why: dict[str, str] = {}
    cost = math.inf
    for _ in range(2):
        point = problem.follow(values, determined)
        chosen, why = determine(problem, terms, point, ranges, determined)
        if chosen <= determined:
            break
        determined |= chosen
        free = [t for t in terms if t in determined]
        point = point | {t: start[t] for t in terms if t not in determined
                         and not (t in staged and _tied(why.get(t.name)))}
        point = _least_squares(problem, free, problem.follow(point, determined), ranges,
                               smooth=True)[0]
        values, cost = _least_squares(problem, free, point, ranges, smooth=False)
    return problem.follow(values, determined), determined, why, cost


CONFOUNDED = "the rows cannot tell it from"


def _tied(reason: str | None) -> bool:
    return reason is not None and reason.startswith(CONFOUNDED)


def _least_squares(problem: _Problem, free: Sequence[Term], point: dict[Term, float],
                   ranges: dict[Term, tuple[float, float]], smooth: bool,
                   time_only: bool = False) -> tuple[dict[Term, float], float]:
    """Bounded least squares of the ``free`` terms from ``point``: the point reached, its cost."""
    from scipy.optimize import least_squares

    x0 = [min(max(point[t], ranges[t][0]), ranges[t][1]) for t in free]

    def residuals(x: Sequence[float]) -> list[float]:
        return problem.residuals(point | dict(zip(free, x, strict=True)), set(free), smooth,
                                 time_only)

    solution = least_squares(
        residuals, x0,
        bounds=([ranges[t][0] for t in free], [ranges[t][1] for t in free]),
        x_scale=[max(abs(v), ranges[t][1] / 100) for v, t in zip(x0, free, strict=True)],
        diff_step=1e-3, ftol=1e-6, xtol=1e-6, max_nfev=MAX_EVALUATIONS * max(1, len(free)),
    )
    return point | dict(zip(free, solution.x, strict=True)), float(solution.cost)


STARTS = 3
"""V-f curves ``staged_start`` offers the fit (the best of the grid with distinct knees)."""


def staged_start(problem: _Problem, free: Sequence[Term], point: dict[Term, float],
                 ranges: dict[Term, tuple[float, float]]) -> list[dict[Term, float]]:
    """Where a fit across settings starts, near its global optimum rather than the base's: the
    ``STARTS`` best.

    Three stages, each settled by the rows alone: the achieved rates from the time at each
    row's clock (no power term moves it); the power terms, linear in the model at a given V-f
    curve, by non-negative least squares at every knee and floor of a grid (a few clocks cannot
    always place the knee: the best few, each at another knee, go on); the controller's margin
    from the capped rows (their power is its set point).
    """
    rates = [t for t in free if t.path[0] == "achieved"]
    if rates:
        point = _least_squares(problem, rates, point, ranges, smooth=True, time_only=True)[0]
    starts = _power_grid(problem, free, point, ranges)
    hold = next((t for t in free if t.path == ("power_limit_w", "hold_below")), None)
    capped = [r for r in problem.rows if _capped(r)]
    if hold is not None and capped:
        default = problem.profile(point, set(free)).power_limit_default_w
        margins = [1 - float(r["avg_power_w"]) / (r.get("power_limit_w") or default)
                   for r in capped]
        margin = min(max(sum(margins) / len(margins), ranges[hold][0]), ranges[hold][1])
        starts = [s | {hold: margin} for s in starts]
    return starts


def _power_grid(problem: _Problem, free: Sequence[Term], point: dict[Term, float],
                ranges: dict[Term, tuple[float, float]]) -> list[dict[Term, float]]:
    """The free power terms by non-negative least squares of the rows' power at their clocks
    (relative errors), at each knee and floor of a grid where those are free: for each knee its
    best floor, the ``STARTS`` best knees first."""
    import numpy as np
    from scipy.optimize import nnls

    # idle is a constant while a kernel runs, as context is: no kernel row tells them apart, and
    # idle is what the board reads with nothing running (kept from the base, not moved here).
    linear = [t for t in free if t.path[0] == "power_w" and t.path != ("power_w", "idle")]
    shape = [next((t for t in free if t.path == ("vf_curve", name)), None)
             for name in ("knee_mhz", "v_min")]
    axes = [[{}] if t is None else [{t: float(v)} for v in np.linspace(*_grid_range(t, ranges),
                                                                        GRID)]
            for t in shape]
    measured = np.array([real_figures(r)["power_w"] for r in problem.rows])
    best: dict[float, tuple[float, dict[Term, float]]] = {}  # knee -> its best floor's fit
    for i, knee in enumerate(axes[0]):
        for floor in axes[1]:
            values = point | knee | floor | {t: 0.0 for t in linear}
            if not linear:
                return [point | knee | floor]
            profile = problem.profile(values, set(free))
            fixed = _powers(problem, profile)
            columns = [_powers(problem, _with_power(profile, t.path[-1])) - fixed
                       for t in linear]
            a = np.stack(columns, axis=1) / measured[:, None]
            coefficients, norm = nnls(a, (measured - fixed) / measured)
            if i not in best or norm < best[i][0]:
                best[i] = (norm, values | {t: min(float(c), ranges[t][1])
                                           for t, c in zip(linear, coefficients, strict=True)})
    ranked = sorted(best.values(), key=lambda b: b[0])
    return [values for _, values in ranked[:STARTS]]


def _grid_range(term: Term, ranges: dict[Term, tuple[float, float]]) -> tuple[float, float]:
    """The part of a V-f term's range the grid covers (its whole range)."""
    return ranges[term]


def _powers(problem: _Problem, profile: GpuProfile) -> Any:
    """The model's power for every row at its own clock and die temperature."""
    import numpy as np

    return np.array([_at_clock(profile, row, peak).power_w
                     for row, peak in zip(problem.rows, problem.peaks, strict=True)])


def _with_power(profile: GpuProfile, name: str) -> GpuProfile:
    """A profile whose power term ``name`` is 1 W more (the model is linear in each)."""
    import dataclasses

    value = getattr(profile.power, name)
    value = profile.power.alu if value is None else value  # an operand's term was following
    return dataclasses.replace(profile, power=dataclasses.replace(profile.power,
                                                                  **{name: value + 1.0}))


def determine(problem: _Problem, terms: Sequence[Term], point: dict[Term, float],
              ranges: dict[Term, tuple[float, float]], taken: set[Term],
              ) -> tuple[set[Term], dict[str, str]]:
    """The terms the residuals determine at ``point``, and why each other one is not.

    Each term is nudged by 5% of its range; its column (the change of every smooth residual) is
    taken, in ``terms``' order after the ``taken`` ones, if it leaves the span of the columns
    taken so far by more than ``INDEPENDENT`` at unit length.
    """
    import numpy as np

    at_point = np.asarray(problem.residuals(point, taken, smooth=True))
    columns = {}
    for term in terms:
        low, high = ranges[term]
        step = 0.05 * (high - low)
        value = point[term] + step if point[term] + step <= high else point[term] - step
        moved = problem.residuals(point | {term: value}, taken | {term}, smooth=True)
        columns[term] = np.asarray(moved) - at_point
    units: list[Any] = []  # the taken columns at unit length
    owner: list[Term] = []
    chosen, why = set(), {}
    for term in sorted(terms, key=lambda t: t not in taken):
        column = columns[term]
        if np.max(np.abs(column)) <= 1e-6:
            why[term.name] = "no row (or anchor) responds to it"
            continue
        unit = column / np.linalg.norm(column)
        if units and term not in taken:
            span = np.stack(units, axis=1)
            weights = np.linalg.lstsq(span, unit, rcond=None)[0]
            if np.linalg.norm(unit - span @ weights) <= INDEPENDENT:
                like = owner[int(np.argmax(np.abs(weights)))]
                why[term.name] = f"{CONFOUNDED} {like.name} (and the others fitted)"
                continue
        units.append(unit)
        owner.append(term)
        chosen.add(term)
    return chosen, why


def _rounded(term: Term, value: float) -> float:
    """A fitted value to the digits it means (3 significant figures)."""
    return float(f"{value:.3g}")
