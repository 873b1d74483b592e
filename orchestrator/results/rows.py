"""What a trial's row is: its columns, its status, its validity, and what it tells a sweeper.

One row per repeat of a trial. Every row is built here, whether a trial measured it
(``trial.run_trial``) or the driver wrote it for a trial that returned none (``failure_rows``: a
worker that died, hung, never started, or a GPU retired before the job), so the two kinds cannot
drift apart. The columns themselves are declared once, in ``results/columns.py`` (``TrialRow``,
``ROW_COLUMNS``); every row built here starts from that declaration.

Three rules live here because everything downstream must agree on them:

- ``fails_setting``: which statuses count against the setting a trial ran at. A wrong or
  nondeterministic output, a crash or a timeout of the kernel are the setting's failures; a
  ``device_error`` says the device failed while the trial ran (lost, XID, ECC, too hot), which is
  no evidence about the clock. The stability search (``outcome_of``) and ``analysis.thresholds``
  both use it.
- ``failed_by``: who failed, in every row that is not ok: ``setting`` (the above), ``device``
  (``device_error``) or ``circumstances``: ``not_measured``, a trial that measured nothing
  because of what happened around it (its GPU was unhealthy before it began, its worker died
  from outside before its first kernel call or its node was lost). A not-measured row is a
  record, not a result: a re-run measures it again (``launching.resume``), the search takes it
  as no evidence, and the report lists it as not measured, apart from every failure.
- ``out_of_memory``: the workload at its size did not fit the device's free memory (refused
  before anything was set, or the framework ran out of device or host memory in the trial);
  ``failed_by`` is ``memory``. It says nothing about the setting: the search takes it as no
  evidence, the report lists it apart, and a re-run does not run it again at the same size
  (a smaller ``workload.size``, or ``auto``, is a new trial).
- ``validity``: whether a measured window shows what was asked (the clock locked, no thermal
  throttling, enough energy-counter updates). An invalid row is kept and flagged, never mixed
  into a front.

``JobResult`` is what a Hydra job returns (``JobReturn.return_value``): a float, so Optuna or any
sweeper minimises it as an objective, that also carries the trial's ``Outcome`` and keys, so the
stability sweeper reads each job's verdict without composing jobs or scanning stores.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import numpy as np

from orchestrator.results.columns import LaunchFacts, TrialRow

if TYPE_CHECKING:
    from kernels.compare import OutputErrors
    from orchestrator.devices.base import DeviceIdentity
    from orchestrator.jobs.job import JobSpec
    from orchestrator.jobs.request import SettingsRequest
    from orchestrator.measuring.window import Checks, Window

SCHEMA_VERSION = 2  # 2: rows carry ``attempt`` and ``failed_by``


class Status(StrEnum):
    """A row's ``status``: what happened to the trial at its setting."""

    OK = "ok"
    WRONG = "wrong"
    NONDETERMINISTIC = "nondeterministic"
    CRASH = "crash"
    TIMEOUT = "timeout"
    DEVICE_ERROR = "device_error"
    NOT_MEASURED = "not_measured"
    INTERRUPTED = "interrupted"  # `dvfs monitor`: the user stopped the command (what ran is kept)
    OUT_OF_MEMORY = "out_of_memory"  # the size did not fit the device's (or host's) free memory


SETTING_FAILURES = frozenset(
    {Status.WRONG, Status.NONDETERMINISTIC, Status.CRASH, Status.TIMEOUT}
)


def fails_setting(status: str | None) -> bool:
    """True when a row's status counts against its setting (see the module docstring)."""
    return status in SETTING_FAILURES


def failed_by(status: str | None) -> str | None:
    """Who failed in a row of this status: ``setting``, ``device``, ``circumstances``, or None
    (ok, or no status yet)."""
    if status in SETTING_FAILURES:
        return "setting"
    if status == Status.DEVICE_ERROR:
        return "device"
    if status in (Status.NOT_MEASURED, Status.INTERRUPTED):
        return "circumstances"
    if status == Status.OUT_OF_MEMORY:
        return "memory"
    return None


def attempt_of(row: Mapping[str, Any]) -> int:
    """A row's attempt number (rows stored before attempts existed were the first)."""
    return int(row.get("attempt") or 1)


def base_row(
    job: JobSpec, identity: DeviceIdentity, *, sweep_id: str, host: str | None = None,
    attempt: int = 1,
) -> dict[str, Any]:
    """The row of ``job``'s ``attempt`` on the GPU ``identity`` before anything is measured
    (repeat 0)."""
    from orchestrator.results.provenance import git_commit, library_versions

    cfg, request = job.config, job.request
    sm = request.sm_clock_mhz
    sim = identity.backend == "sim"
    row = TrialRow(
        schema_version=SCHEMA_VERSION, sweep_id=sweep_id, trial_key=job.trial_key(identity.uuid),
        repeat=0, attempt=int(attempt), host=host or socket.gethostname(),
        started_at=time.time(), ended_at=None,
        device_index=identity.index, device_uuid=identity.uuid, device_name=identity.name,
        driver_version=identity.driver_version, backend=identity.backend,
        framework=cfg.framework.name, framework_version=None, workload=job.workload_name,
        size=cfg.workload.size, sim_size=cfg.workload.sim_size if sim else None,
        dtype=cfg.workload.dtype, precision=cfg.framework.precision,
        sm_clock_min_mhz=sm[0] if sm else None, sm_clock_max_mhz=sm[1] if sm else None,
        mem_clock_mhz=request.mem_clock_mhz, power_limit_w=request.power_limit_w,
        clock_offset_mhz=request.clock_offset_mhz, default_setting=request.is_default,
        digest=cfg.measure.digest, config=job.resolved, versions=library_versions(),
        git_commit=git_commit(), config_hash=job.config_hash,
    )
    return asdict(row)


def fail_rows(
    rows: list[dict[str, Any]], base: Mapping[str, Any], repeats: int, status: str, error: str
) -> None:
    """Mark the repeat in flight (and those not reached) as failed with ``status``."""
    failed = {"status": status, "failed_by": failed_by(status), "error": error, "valid": False}
    if rows and rows[-1].get("status") is None:
        rows[-1].update(failed, ended_at=time.time())
    while len(rows) < repeats:
        rows.append(dict(base, repeat=len(rows), ended_at=time.time(), **failed))


def add_launch(rows: Iterable[dict[str, Any]], facts: LaunchFacts) -> None:
    """Stamp how the launcher ran a trial on each of its rows (the ``launch`` column): the one
    thing the driver adds to a row a worker filled."""
    for row in rows:
        row["launch"] = facts


def failure_rows(
    job: JobSpec, identity: DeviceIdentity, status: str, error: str, *,
    sweep_id: str, host: str | None = None, attempt: int = 1,
) -> list[dict[str, Any]]:
    """Rows for a trial that returned none: its worker died, hung or never started, or its GPU
    was retired before it ran. One row per repeat, each with ``status`` and ``error``."""
    rows: list[dict[str, Any]] = []
    base = base_row(job, identity, sweep_id=sweep_id, host=host, attempt=attempt)
    fail_rows(rows, base, job.repeats, status, error)
    return rows


# --- filling a measured row -------------------------------------------------------------------
def fill_measured(row: dict[str, Any], window: Window, counts: Any, job: JobSpec) -> None:
    """The window's time, energy and observations, the rates per unit of work, and the verdict."""
    meas = window.measurement
    n, t, energy = window.iterations, meas.time_s, meas.energy_j
    row.update(
        iterations=n,
        time_s=t,
        time_per_iter_s=t / n if n else None,
        throughput=n / t if t > 0 else None,
        energy_j=energy,
        energy_per_iter_j=energy / n if n and energy is not None else None,
        avg_power_w=meas.avg_power_w,
        peak_power_w=meas.peak_power_w,
        observed_sm_clock_mhz=meas.mean_sm_clock_mhz,
        throttle_reasons=meas.reasons.names(),
        meter=meas.method,
        energy_counter_updates=meas.counter_updates,
        energy_counter_period_s=meas.counter_period_s,
        window_aligned=window.aligned,
    )
    tflop = counts.flops * n / 1e12
    gb = counts.bytes_moved * n / 1e9
    if t > 0:
        row["tflops"] = tflop / t
        row["gbps"] = gb / t
    if energy is not None:
        row["energy_per_tflop_j"] = energy / tflop if tflop > 0 else None
        row["energy_per_gb_j"] = energy / gb if gb > 0 else None
    reason = validity(meas, job.request, job.config.measure)
    row["valid"] = reason is None
    row["invalid_reason"] = reason


def validity(meas: Any, request: SettingsRequest, measure: Any) -> str | None:
    """Why a window does not show what was asked (None: it does).

    Invalid when the observed SM clock fell more than ``measure.clock_tolerance_mhz`` below the
    clock asked (naming the throttle reasons that fired), when a counter-metered window spanned
    fewer than ``measure.min_counter_updates`` energy-counter updates, or when any thermal
    throttle reason fired during the window.

    Args:
        meas: the window's ``meter.Measurement``.
        request: the settings the trial asked for.
        measure: the job's ``measure`` config.
    """
    reasons = []
    asked = request.sm_clock_mhz
    observed = meas.mean_sm_clock_mhz
    names = meas.reasons.names()
    if asked is not None and observed is not None and (
        observed < asked[0] - measure.clock_tolerance_mhz
    ):
        fired = [r for r in names if r not in ("applications_clocks_setting", "gpu_idle")]
        reasons.append(
            f"observed SM clock {observed:.0f} MHz is below the {asked[0]} MHz asked"
            + (f" ({', '.join(fired)})" if fired else "")
        )
    if meas.method == "counter" and (meas.counter_updates or 0) < measure.min_counter_updates:
        reasons.append(
            f"the window spanned {meas.counter_updates} energy-counter updates "
            f"(< {measure.min_counter_updates}): lengthen measure.window_s"
        )
    thermal = [r for r in names if "thermal" in r]
    if thermal:
        reasons.append(f"thermal throttling during the window ({', '.join(thermal)})")
    return "; ".join(reasons) or None


def fill_rate(row: dict[str, Any], unit: str, items: int | None) -> None:
    """The throughput in the workload's own unit (``rate``, ``rate_unit``), and for samples/s or
    tokens/s the energy per sample or token."""
    rate = {"TFLOP/s": row.get("tflops"), "GB/s": row.get("gbps")}.get(unit)
    if items is not None:
        per_call, energy = row.get("throughput"), row.get("energy_per_iter_j")
        rate = per_call * items if per_call is not None else None
        row["energy_per_item_j"] = energy / items if energy is not None and items else None
    row.update(rate_unit=unit, rate=rate, items_per_call=items)


def fill_checks(
    row: dict[str, Any], checks: Checks, errors: Sequence[OutputErrors], job: JobSpec,
    workload: str,
) -> None:
    """The correctness checks of a window (its fingerprints, and ``errors``: its sampled
    outputs' errors against the reference), and the status they give (``workload``: the
    workload's own name, which chooses the tolerance)."""
    from kernels.checks import check_errors

    cfg = job.config
    result = check_errors(
        errors, checks.digests, cfg.workload.dtype, cfg.framework.precision, workload,
        arithmetic=row.get("check_arithmetic") or "tf32",
    )
    row.update(
        rel_error=float(result.rel_error),
        max_abs_error=float(result.max_abs_error),
        nonfinite_count=int(result.nonfinite_count),
        determinism_mismatches=int(result.determinism_mismatches),
        status=result.verdict.value,
        failed_by=failed_by(result.verdict.value),
        checked_iters=checks.calls,
        check_time_s=checks.time_s,
        outputs_compared=result.outputs_compared,
        outputs_sampled=result.outputs_compared + checks.identical,
    )


# --- what rows tell a sweeper -----------------------------------------------------------------
def objective(rows: Sequence[Mapping[str, Any]], name: str) -> float:
    """What a job returns to a sweeper: lower is better; a failed check, a measurement flagged
    invalid (the device did not run at the setting asked), or an energy objective on a device
    that measured no energy (``device=cpu`` without RAPL) is infinity."""
    ok = [r for r in rows if r.get("status") == Status.OK and r.get("valid")]
    if len(ok) < len(rows) or not ok:
        return float("inf")
    t = float(np.median([r["time_per_iter_s"] for r in ok]))
    if name == "time_per_work":
        return t
    energies = [r["energy_per_iter_j"] for r in ok]
    if any(e is None for e in energies):
        return float("inf")
    e = float(np.median(energies))
    return {"energy_per_work": e, "edp": e * t, "ed2p": e * t * t}[name]


@dataclass(frozen=True)
class Outcome:
    """What one trial said about its setting.

    Attributes:
        passed: True (every repeat ok and valid), False (a repeat failed the setting:
            ``fails_setting``), None (no evidence: ok but invalid, a device error, or no row).
        iterations: kernel calls the trial ran and checked (all repeats).
        status: ``ok`` or the first status that was not.
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


def _first_line(text: Any) -> str | None:
    lines = str(text or "").strip().splitlines()
    return lines[0] if lines else None


def outcome_of(rows: Sequence[Mapping[str, Any]]) -> Outcome:
    """The outcome of one trial from its rows (one per repeat)."""
    if not rows:
        return Outcome(None, 0, "missing", "the trial stored no row")
    iterations = sum(checked_calls(r) for r in rows)
    failed = [r for r in rows if fails_setting(r.get("status"))]
    if failed:
        first = failed[0]
        return Outcome(False, iterations, str(first["status"]), _first_line(first.get("error")))
    other = [r for r in rows if r.get("status") != Status.OK]
    if other:  # a device error or nothing measured: no evidence about the setting either way
        status = str(other[0].get("status"))
        return Outcome(None, iterations, status, _first_line(other[0].get("error")) or status)
    invalid = [r for r in rows if r.get("valid") is not True]
    if invalid:
        why = invalid[0].get("invalid_reason") or "no reason recorded"
        return Outcome(None, iterations, Status.OK.value, f"invalid: {why}")
    return Outcome(True, iterations, Status.OK.value)


class JobResult(float):
    """A job's objective (a float any sweeper can minimise) carrying its trial's outcome and keys.

    Attributes:
        outcome: ``outcome_of`` the job's rows.
        trial_keys: the trial keys of its rows, distinct, in row order (one per GPU it ran on).
    """

    outcome: Outcome
    trial_keys: tuple[str, ...]

    def __new__(
        cls, value: float, outcome: Outcome, trial_keys: Iterable[str] = ()
    ) -> JobResult:
        """A result of objective ``value``."""
        self = super().__new__(cls, value)
        self.outcome = outcome
        self.trial_keys = tuple(dict.fromkeys(trial_keys))
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return (JobResult, (float(self), self.outcome, self.trial_keys))

    def __repr__(self) -> str:
        return f"JobResult({float(self)!r}, {self.outcome!r}, {self.trial_keys!r})"

    @classmethod
    def of(cls, rows: Sequence[Mapping[str, Any]], objective_name: str) -> JobResult:
        """The result of one trial's rows."""
        return cls(objective(rows, objective_name), outcome_of(rows),
                   (str(r["trial_key"]) for r in rows))

    @classmethod
    def combine(cls, results: Sequence[JobResult]) -> JobResult:
        """One job's result over the GPUs it ran on (``placement=every``): the worst objective;
        the first failing outcome, else the first inconclusive one, else a pass; every key."""
        if not results:
            return cls.missing()
        value = max(float(r) for r in results)
        outcomes = [r.outcome for r in results]
        worst = next((o for o in outcomes if o.passed is False), None) or next(
            (o for o in outcomes if o.passed is None), None
        )
        iterations = sum(o.iterations for o in outcomes)
        outcome = Outcome(
            worst.passed if worst else True, iterations,
            worst.status if worst else Status.OK.value, worst.reason if worst else None,
        )
        return cls(value, outcome, (k for r in results for k in r.trial_keys))

    @classmethod
    def missing(cls) -> JobResult:
        """A job that stored nothing."""
        return cls(float("inf"), outcome_of([]))
