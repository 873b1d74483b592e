"""``dvfs calibrate``: a simulated twin of a real board, fitted to what it measured.

    dvfs calibrate SOURCE... --profile BASE --out board.yaml [--anchors]

Each SOURCE is a results store (a sweep directory, a multirun directory, a ``trials.sqlite``)
or a folder of ``data/measured/`` (``provenance.yaml`` and ``rows.jsonl``). Their ``ok`` rows of
one real board are fitted (``orchestrator.devices.sim.fit``): the achieved rates, the power terms
and the power controller's margin of BASE (a shipped profile's name or a profile file). The
command prints each row's measured figure, fitted figure and error, the terms it fitted (base
value -> fitted), the terms the rows could not determine (kept from BASE), and, with
``--anchors``, the published figures of BASE beside the fitted profile's; then writes the fitted
profile, which ``device.profile=/path/board.yaml`` loads. Measure a short sweep once on the real
board, then plan studies on its twin.

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
    from orchestrator.devices.sim.fit import FitResult

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
    ns = parser.parse_args(argv)
    rows = _real_rows([Path(s) for s in ns.sources])
    result = calibrate(rows, ns.profile, anchors=ns.anchors, key=Path(ns.out).stem)
    print(report(result))
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


def calibrate(rows: list[dict[str, Any]], base: str, *, anchors: bool = False,
              key: str = "fitted") -> FitResult:
    """Fit ``base`` (a profile name or file) to ``rows``; returns the ``fit.FitResult``."""
    import yaml

    from kernels.registry import WORKLOADS
    from orchestrator.devices.sim import calibration, fit
    from orchestrator.devices.sim.profile import (
        ProfileError,
        is_profile_file,
        load_profile,
        profile_dir,
    )

    try:
        load_profile(base)
    except ProfileError as e:
        raise UserError(f"--profile: {e}") from None
    path = Path(base).expanduser() if is_profile_file(base) else profile_dir() / f"{base}.yaml"
    base_raw = yaml.safe_load(path.read_text())
    chosen = [a for a in calibration.ANCHORS if a.profile == base] if anchors else []

    def peak_of(row: dict[str, Any]) -> str:
        spec = WORKLOADS.get(row["workload"])
        if spec is None:
            return "tf32" if row.get("work_kind") in ("matmul", "conv") else "fp32"
        return spec.peak(row.get("dtype", "float32"), row.get("precision", "default"),
                         row.get("framework"))

    return fit.fit(base_raw, rows, peak_of, key=key, anchors=chosen)


def report(result: FitResult) -> str:
    """The fit as text: each row measured / fitted (error), the terms, the anchors."""
    head = ["workload", *(f"{label} real / fitted" for _, label, _, _ in FIGURES)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in result.rows:
        cells = [row.workload]
        for figure, _, scale, digits in FIGURES:
            cells.append(f"{row.real[figure] * scale:.{digits}f} / "
                         f"{row.sim[figure] * scale:.{digits}f} ({row.error(figure):+.1%})")
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("fitted: " + ", ".join(
        f"{name} {old:g} -> {new:g}" for name, (old, new) in result.fitted.items()))
    if result.undetermined:
        lines.append("not determined by these rows (kept from the base): "
                     + ", ".join(result.undetermined))
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
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("\n".join(header) + "\n" + yaml.safe_dump(result.raw, sort_keys=False))
    except OSError as e:
        raise UserError(f"cannot write {out}: {e.strerror or e}") from None
