"""``dvfs calibrate``: a simulated twin of a real board, fitted to what it measured.

    dvfs calibrate SOURCE... --profile BASE --out board.yaml [--anchors] [--no-loo]

Each SOURCE is a results store (a sweep directory, a multirun directory, a ``trials.sqlite``)
or a folder of ``data/measured/`` (``provenance.yaml`` and ``rows.jsonl``). Their ``ok`` rows of
one real board are fitted (``orchestrator.devices.sim.fit``): the achieved rates, the power terms
(per operand type where the rows have several), the power controller's margin of BASE (a shipped
profile's name or a profile file) and, when the rows span clocks or power limits, the terms only
such rows show (context, leakage, the V-f curve's knee and floor). The command prints each row's
measured figure, fitted figure and error (in sample), then each row beside the fit made without
it (leave one out: out of sample; ``--no-loo`` skips it), the terms it fitted (base value ->
fitted), the terms the rows did not determine and why (kept from BASE), and, with ``--anchors``,
the published figures of BASE beside the fitted profile's; then writes the fitted profile, which
``device.profile=/path/board.yaml`` loads. Measure a short sweep once on the real board, then
plan studies on its twin. The out-of-sample figures mean something only from a BASE that has not
already been fitted to these rows.

Bad input (a source with no rows, rows of the simulated GPU, rows of several boards, too few rows
to fit anything) is one line and exit 2, before anything is fitted.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.errors import UserError

if TYPE_CHECKING:
    from orchestrator.devices.sim.fit import FitResult, RowFit

MIN_ROWS = 2  # fewer cannot separate a time term from a power term
FIGURES = (("time_s", "ms/iter", 1e3, 3), ("power_w", "W", 1.0, 0), ("energy_j", "J/iter", 1.0, 3),
           ("clock_mhz", "SM MHz", 1.0, 0))


def main(argv: list[str]) -> int:
    """Run ``dvfs calibrate``; returns the exit code (errors raise ``UserError``: exit 2)."""
    parser = argparse.ArgumentParser(
        prog="dvfs calibrate",
        description="Fit a simulated GPU profile to a real board's measured rows.",
    )
    parser.add_argument("sources", nargs="+", help="results stores or data/measured folders")
    parser.add_argument("--profile", required=True, help="the base profile (name or YAML file)")
    parser.add_argument("--out", required=True, help="where to write the fitted profile (YAML)")
    parser.add_argument("--anchors", action="store_true",
                        help="keep BASE's published anchors in range while fitting")
    parser.add_argument("--no-loo", action="store_true",
                        help="skip the leave-one-out fits (one more fit per row)")
    ns = parser.parse_args(argv)
    rows = _real_rows([Path(s) for s in ns.sources])
    result = calibrate(rows, ns.profile, anchors=ns.anchors, key=Path(ns.out).stem)
    loo = None if ns.no_loo else leave_one_out(rows, ns.profile, anchors=ns.anchors)
    print(report(result, loo))
    write_profile(result, Path(ns.out), ns.profile, len(rows))
    print(f"wrote {ns.out}: run it with device=sim device.profile={Path(ns.out).resolve()}")
    return 0


def _real_rows(sources: list[Path]) -> list[dict[str, Any]]:
    """The ``ok`` rows of every source, checked: one real board, enough of them to fit."""
    from orchestrator.realgpu import measured
    from orchestrator.results.store import ResultStore, find_stores

    rows: list[dict[str, Any]] = []
    for source in sources:
        if (source / "provenance.yaml").is_file():
            rows += measured.load(source).rows
            continue
        stores = find_stores(source)  # raises StoreNotFoundError (a UserError) if absent
        if not stores:
            raise UserError(f"{source}: no results store and no measured run (provenance.yaml)")
        for path in stores:
            with ResultStore(path, readonly=True) as store:
                rows += store.rows()
    fit_rows = [r for r in rows if r.get("status") == "ok" and _fittable(r)]
    if any(r.get("backend") == "sim" for r in fit_rows):
        raise UserError("the rows are the simulated GPU's: calibrate fits a real board's "
                        "measurements (device=nvml), not the sim's own figures")
    boards = sorted({str(r.get("device_name")) for r in fit_rows})
    if len(boards) > 1:
        raise UserError(f"rows of {len(boards)} boards ({', '.join(boards)}): a profile is one "
                        "board's; pass the stores of one board")
    if len(fit_rows) < MIN_ROWS:
        raise UserError(f"{len(fit_rows)} ok row(s) with time, power, clock and charged work in "
                        f"{len(rows)} row(s): calibrate needs at least {MIN_ROWS}")
    return fit_rows


def _fittable(row: dict[str, Any]) -> bool:
    """A row with every figure the fit reads, each a positive number."""
    keys = ("time_per_iter_s", "avg_power_w", "energy_per_iter_j", "observed_sm_clock_mhz",
            "charged_flops", "charged_bytes", "charged_launches")
    values = [row.get(k) for k in keys]
    return all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in values)


def _base(base: str, anchors: bool) -> tuple[dict[str, Any], list[Any]]:
    """A base profile's YAML mapping (a name or a file) and its anchors (if asked)."""
    import yaml

    from orchestrator.devices.sim import calibration
    from orchestrator.devices.sim.profile import (
        ProfileError,
        is_profile_file,
        load_profile,
        profile_dir,
    )

    try:
        profile = load_profile(base)
    except ProfileError as e:
        raise UserError(f"--profile: {e}") from None
    path = Path(base).expanduser() if is_profile_file(base) else profile_dir() / f"{base}.yaml"
    # The published anchors of the board: those of every shipped profile of its name.
    chosen = [a for a in calibration.ANCHORS
              if load_profile(a.profile).name == profile.name] if anchors else []
    return yaml.safe_load(path.read_text()), chosen


def peak_of(row: dict[str, Any]) -> str:
    """A row's compute roof: its workload's (dtype, precision, framework), else by its kind."""
    from kernels.registry import WORKLOADS

    spec = WORKLOADS.get(row["workload"])
    if spec is None:
        return "tf32" if row.get("work_kind") in ("matmul", "conv") else "fp32"
    return spec.peak(row.get("dtype", "float32"), row.get("precision", "default"),
                     row.get("framework"))


def calibrate(rows: list[dict[str, Any]], base: str, *, anchors: bool = False,
              key: str = "fitted") -> FitResult:
    """Fit ``base`` (a profile name or file) to ``rows``; returns the ``fit.FitResult``."""
    from orchestrator.devices.sim import fit

    base_raw, chosen = _base(base, anchors)
    return fit.fit(base_raw, rows, peak_of, key=key, anchors=chosen)


def leave_one_out(rows: list[dict[str, Any]], base: str, *,
                  anchors: bool = False) -> list[RowFit]:
    """Each row beside the fit of ``base`` to the other rows (``fit.leave_one_out``)."""
    from orchestrator.devices.sim import fit

    base_raw, chosen = _base(base, anchors)
    return fit.leave_one_out(base_raw, rows, peak_of, anchors=chosen)


def row_table(rows: list[RowFit], fitted: str = "fitted") -> list[str]:
    """Rows as a Markdown table: each figure measured / fitted (error)."""
    head = ["workload", *(f"{label} real / {fitted}" for _, label, _, _ in FIGURES)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [row.workload]
        for figure, _, scale, digits in FIGURES:
            cells.append(f"{row.real[figure] * scale:.{digits}f} / "
                         f"{row.sim[figure] * scale:.{digits}f} ({row.error(figure):+.1%})")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def outside(rows: list[RowFit]) -> list[str]:
    """Each row with a figure outside the fit's tolerance: ``workload (figure +x%, ...)``."""
    from orchestrator.devices.sim.fit import TOLERANCE

    kinds = {"time_s": "time", "power_w": "power", "energy_j": "energy"}
    out = []
    for row in rows:
        bad = [f"{kind} {row.error(figure):+.0%}" for figure, kind in kinds.items()
               if abs(row.error(figure)) > TOLERANCE[kind]]
        if bad:
            out.append(f"{row.workload} ({', '.join(bad)})")
    return out


def report(result: FitResult, loo: list[RowFit] | None = None) -> str:
    """The fit as text: each row measured / fitted (error) in sample and, given ``loo``, out of
    sample; the terms fitted, those the rows did not determine and why; the anchors."""
    lines = ["In sample: each row beside the fit of every row", *row_table(result.rows), ""]
    if loo is not None:
        lines += ["Leave one out: each row beside the fit of the other rows",
                  *row_table(loo, "predicted"), ""]
        failing = outside(loo)
        lines.append("out of sample, outside the tolerances (time 15%, power 10%, energy 15%): "
                     + (", ".join(failing) if failing else "none"))
        lines.append("")
    lines.append("fitted: " + ", ".join(
        f"{name} {old:g} -> {new:g}" for name, (old, new) in result.fitted.items()))
    if result.undetermined:
        lines.append("not determined by these rows (kept from the base):")
        lines += [f"  {name}: {result.why.get(name, 'no row responds to it')}"
                  for name in result.undetermined]
    for a in result.anchors:
        mark = "ok" if a.ok else "OUT OF RANGE"
        lines.append(f"anchor {a.anchor.source}, {a.anchor.kernel}, {a.anchor.figure}: "
                     f"{a.value:.1f} in [{a.anchor.low:g}, {a.anchor.high:g}] {mark}")
    return "\n".join(lines)


def write_profile(result: FitResult, out: Path, base: str, n_rows: int) -> None:
    """Write the fitted profile's YAML, headed by where it came from."""
    import yaml

    header = [
        f"# Fitted by `dvfs calibrate` from {n_rows} measured row(s), base profile {base}.",
        "# Fitted terms (base -> fitted): "
        + ", ".join(f"{k} {a:g} -> {b:g}" for k, (a, b) in result.fitted.items()),
    ]
    if result.undetermined:
        header.append("# Kept from the base (no row determined them): "
                      + ", ".join(result.undetermined))
    raw = dict(result.raw)  # each fitted term's provenance says so; the base's others stay
    raw["provenance"] = dict(raw.get("provenance") or {}) | {
        name: f"fitted: dvfs calibrate, {n_rows} measured row(s), base {base}"
        for name in result.fitted}
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("\n".join(header) + "\n" + yaml.safe_dump(raw, sort_keys=False))
    except OSError as e:
        raise UserError(f"cannot write {out}: {e.strerror or e}") from None
