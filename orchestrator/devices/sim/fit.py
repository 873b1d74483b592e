"""Fitting a profile's terms to real measurements of one board: what ``dvfs calibrate`` does.

The simulated GPU is a twin of a board only where its terms match that board's measurements. A
profile's *fittable* terms are its achieved rates (``achieved:``, what real kernels reach of each
roof), its power terms (``power_w:`` clock, ALU and traffic), and the power controller's margin
under its limit (``power_limit_w.hold_below``). Each measured row (a trial on the real board:
its charged work, time per iteration, average power and observed SM clock) gives residuals of
the model *at the clock the board ran at* (smooth in every term, where the model's own choice of
clock is a step function of them)::

    time:  log(sim / real) / TOLERANCE["time"]
    power: log(sim / real) / TOLERANCE["power"]

and a row the board marked power-capped (``SW_POWER_CAP``) one more: the model's power there
against the controller's set point, ``limit * (1 - hold_below)``, which fits the margin. The
fitted profile is then judged on what a user of the sim sees, the model's steady state with its
own choice of clock under the row's limit (``RowFit``).

and each published anchor of the profile (``calibration.ANCHORS``; optional) a residual of zero
inside its accepted range and its distance outside it over the range's width, times
``ANCHOR_WEIGHT``: fitting to real rows must not move a published figure out of its range, and
where the two cannot both hold the table says so. ``scipy.optimize.least_squares`` (bounded,
trust-region) minimises the sum of squares from the base profile's values.

A term no row responds to (its column of the Jacobian is zero at the base: no row of that kind
of work, no row under a power cap...) is *undetermined* and kept from the base profile; so are
the V-f curve and the static terms (idle, leakage, context), which rows at one clock cannot
separate from the clock term. Everything here is pure: rows and a base profile's YAML in, a
fitted YAML mapping and the residuals out.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.devices.sim import calibration
from orchestrator.devices.sim.profile import GpuProfile, parse_profile

TOLERANCE = {"time": 0.15, "power": 0.10, "energy": 0.15, "clock": 0.10}
"""The agreement a fitted row is judged by (a fraction): the residual is the log ratio over it."""
HINGE_AT, HINGE_WEIGHT = 0.85, 10.0  # past 85% of its tolerance a figure costs 10x more
AT_CLOCK_WEIGHT = 0.5  # the physics at the board's clock, beside what the sim shows at its own
ANCHOR_WEIGHT = 10.0  # an anchor out of range by its own width costs as much as 10 tolerances


@dataclass(frozen=True)
class Term:
    """One fittable term: where it sits in the profile's YAML and the range it may take."""

    path: tuple[str, ...]  # e.g. ("achieved", "memory")
    low: float
    high: float
    default: float  # its value where the base profile does not give it

    @property
    def name(self) -> str:
        """The term as the YAML spells it: ``achieved.memory``."""
        return ".".join(self.path)


TERMS: tuple[Term, ...] = (
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


def get_term(raw: dict[str, Any], term: Term) -> float:
    """A term's value in a profile's YAML mapping (its default where absent)."""
    node: Any = raw
    for key in term.path:
        if not isinstance(node, dict) or key not in node:
            return term.default
        node = node[key]
    return float(node)


def with_terms(raw: dict[str, Any], values: dict[Term, float]) -> dict[str, Any]:
    """A copy of a profile's YAML mapping with each term set."""
    out = copy.deepcopy(raw)
    for term, value in values.items():
        node = out
        for key in term.path[:-1]:
            node = node.setdefault(key, {})
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
    undetermined: list[str]  # terms no row responds to, kept from the base
    rows: list[RowFit]
    anchors: list[calibration.AnchorResult]


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


def _residuals(profile: GpuProfile, rows: Sequence[dict[str, Any]], peaks: Sequence[str],
               anchors: Sequence[calibration.Anchor]) -> list[float]:
    out: list[float] = []
    for row, peak in zip(rows, peaks, strict=True):
        real = real_figures(row)
        at = calibration.step_at(profile, [calibration.Phase(calibration.row_work(row, peak))],
                                 int(real["clock_mhz"]))
        out += [AT_CLOCK_WEIGHT * math.log(at.time_s / real["time_s"]) / TOLERANCE["time"],
                AT_CLOCK_WEIGHT * math.log(at.power_w / real["power_w"]) / TOLERANCE["power"]]
        sim = row_figures(profile, row, peak)
        for figure, kind in (("time_s", "time"), ("power_w", "power"), ("energy_j", "energy"),
                             ("clock_mhz", "clock")):
            error = math.log(sim[figure] / real[figure]) / TOLERANCE[kind]
            out.append(error)
            if kind != "clock":  # a figure near its tolerance is pushed back inside it
                out.append(HINGE_WEIGHT * max(0.0, abs(error) - HINGE_AT))
        if "sw_power_cap" in [str(r).lower() for r in row.get("throttle_reasons") or ()]:
            limit = row.get("power_limit_w") or profile.power_limit_default_w
            target = limit * (1 - profile.power_cap_hold)
            out.append(math.log(at.power_w / target) / TOLERANCE["power"])
    for anchor in anchors:
        value = float(anchor.sim(profile))
        width = max(anchor.high - anchor.low, 1e-9)
        outside = max(anchor.low - value, 0.0, value - anchor.high)
        out.append(ANCHOR_WEIGHT * outside / width)
    return out


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
            ``avg_power_w``, ``energy_per_iter_j``, ``observed_sm_clock_mhz``, and their settings
            (``power_limit_w``, ``sm_clock_max_mhz``; None: the board's defaults).
        peak_of: the compute roof of a row (``KernelSpec.peak`` of its dtype and precision).
        key: the fitted profile's key.
        anchors: published anchors the fitted profile must keep in range.
        terms: the terms to fit.
    """
    peaks = [peak_of(r) for r in rows]
    base = {t: get_term(base_raw, t) for t in terms}

    def residuals(x: Sequence[float], free: Sequence[Term]) -> list[float]:
        values = dict(base) | dict(zip(free, x, strict=True))
        return _residuals(parse_profile(key, with_terms(base_raw, values), key), rows, peaks,
                          anchors)

    values, determined = _solve(terms, base, residuals)
    free = [t for t in terms if t in determined]
    raw = with_terms(base_raw, {t: _rounded(t, v) for t, v in values.items() if t in free})
    profile = parse_profile(key, raw, key)
    return FitResult(
        raw=raw, profile=profile,
        fitted={t.name: (base[t], _rounded(t, values[t])) for t in free},
        undetermined=[t.name for t in terms if t not in determined],
        rows=[RowFit(r["workload"], real_figures(r), row_figures(profile, r, p))
              for r, p in zip(rows, peaks, strict=True)],
        anchors=[calibration.AnchorResult(a, float(a.sim(profile))) for a in anchors],
    )


def _solve(terms: Sequence[Term], base: dict[Term, float],
           residuals: Callable[[Sequence[float], Sequence[Term]], list[float]],
           ) -> tuple[dict[Term, float], set[Term]]:
    """Least squares over the terms the residuals respond to; returns every term's value and
    the set fitted. Twice at most: a term may respond only once others moved (a power cap only
    once it bites)."""
    from scipy.optimize import least_squares

    values = {t: min(max(base[t], t.low), t.high) for t in terms}
    determined: set[Term] = set()
    for _ in range(2):
        found = _responding(terms, [values[t] for t in terms],
                            lambda x: residuals(x, terms)) - determined
        if not found:
            break
        determined |= found
        free = [t for t in terms if t in determined]
        x0 = [values[t] for t in free]
        solution = least_squares(
            residuals, x0, args=(free,), bounds=([t.low for t in free], [t.high for t in free]),
            x_scale=[max(abs(v), t.high / 100) for v, t in zip(x0, free, strict=True)],
            diff_step=1e-3, max_nfev=400 * max(1, len(free)),
        )
        values |= dict(zip(free, solution.x, strict=True))
    return values, determined


def _responding(terms: Sequence[Term], x0: list[float],
                residuals: Callable[[list[float]], list[float]]) -> set[Term]:
    """The terms some residual responds to: each nudged by 5% of its range, at the base."""
    at_base = residuals(x0)
    found = set()
    for i, term in enumerate(terms):
        step = 0.05 * (term.high - term.low)
        x = list(x0)
        x[i] = x0[i] + step if x0[i] + step <= term.high else x0[i] - step
        if any(abs(a - b) > 1e-6 for a, b in zip(residuals(x), at_base, strict=True)):
            found.add(term)
    return found


def _rounded(term: Term, value: float) -> float:
    """A fitted value to the digits it means (3 significant figures)."""
    return float(f"{value:.3g}")
