"""Every real-GPU row of ``data/measured/`` beside the simulated GPU's figure for the same work.

    .venv/bin/python scripts/sim_vs_real.py [--loo]

For each run (a folder of ``data/measured``) and each of its rows: time per iteration, power,
energy per iteration and SM clock, sim / real, with the ratio. The sim's figure is the model's
steady state (``calibration.compare_real``) for the work the row charged, on the profile the run's
provenance names, at the row's settings. Where the two disagree, the sim is wrong.

Then what the profile was fitted to and what it was not: the published anchors its terms were
fitted to beside these rows (``calibration.ANCHORS``), and the published figures held out of every
fit (``held_out.HELD_OUT``). With ``--loo``, and where the run's folder keeps the profile as it was
before it was fitted to the run (``before_fit.yaml``), each row is also scored out of sample:
predicted by the fit that made the shipped profile (``fit.SHARED_TERMS`` and the profile's anchors
of the same board) from that base to the other rows. In-sample agreement alone proves nothing.
"""

from __future__ import annotations

import argparse

from kernels.registry import WORKLOADS
from orchestrator.devices.sim import calibration
from orchestrator.devices.sim.calibration import compare_real
from orchestrator.devices.sim.held_out import HELD_OUT
from orchestrator.devices.sim.profile import load_profile
from orchestrator.realgpu import measured

FIGURES = (("ms_per_iter", "ms/iter", 3), ("power_w", "W", 0), ("j_per_iter", "J/iter", 3),
           ("sm_clock_mhz", "SM MHz", 0))
BASE = "before_fit.yaml"  # a run's profile as it was before it was fitted to the run


def table(run: measured.MeasuredRun) -> str:
    """A Markdown table of one run: each figure as ``sim / real (ratio)``."""
    profile = load_profile(run.provenance["profile"])
    head = ["workload", *(f"{label} sim / real" for _, label, _ in FIGURES)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in run.rows:
        peak = WORKLOADS[row["workload"]].peak(row["dtype"], row["precision"], row.get("framework"))
        c = compare_real(profile, row, peak)
        cells = [c.workload]
        for name, _, digits in FIGURES:
            sim, real = getattr(c, name)
            cells.append(f"{sim:.{digits}f} / {real:.{digits}f} ({c.ratio(name):.2f})")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def fitted_anchors(profile_key: str) -> list[calibration.Anchor]:
    """The anchors the shipped fit of a profile read beside its real rows: those of its board's
    shared terms (not the operand-type GEMM rates, fitted apart)."""
    return [a for a in calibration.ANCHORS if a.profile == profile_key and "GEMM" not in a.kernel]


def provenance_lines(profile_key: str) -> list[str]:
    """Which published figures the profile was fitted to, and which no fit read."""
    fitted = [a for a in calibration.ANCHORS if a.profile == profile_key]
    held = [a for a in HELD_OUT if a.profile == profile_key]
    lines = [f"Fitted to these rows and {len(fitted)} published anchors "
             "(scripts/sim_vs_published.py prints them):"]
    lines += [f"- {a.source}, {a.board}: {a.kernel}, {a.setting}, {a.figure}" for a in fitted]
    lines.append(f"Held out of every fit: {len(held)} published figures of this board:")
    lines += [f"- {a.source}, {a.board}: {a.kernel}, {a.setting}, {a.figure} {a.published}"
              for a in held]
    return lines


def loo_lines(run: measured.MeasuredRun) -> list[str]:
    """Each row beside the fit, from the run's before-fit profile, of the other rows."""
    import yaml

    from orchestrator.devices.sim import fit
    from orchestrator.realgpu import calibrate

    base = run.path / BASE
    if not base.is_file():
        return [f"No {BASE} in {run.path.name}: no base that has not seen these rows to score "
                "them out of sample from."]
    anchors = fitted_anchors(run.provenance["profile"])
    loo = fit.leave_one_out(yaml.safe_load(base.read_text()), run.rows, calibrate.peak_of,
                            anchors=anchors, terms=fit.SHARED_TERMS)
    failing = calibrate.outside(loo)
    return ["Leave one out: each row predicted by the fit of the other rows (from "
            f"{BASE}, the shipped fit's terms and {len(anchors)} anchors)",
            *calibrate.row_table(loo, "predicted"), "",
            "out of sample, outside the tolerances (time 15%, power 10%, energy 15%): "
            + (", ".join(failing) if failing else "none")]


def main(argv: list[str] | None = None) -> None:
    """Print each measured run's table, what its profile was fitted to, and (``--loo``) each
    row out of sample."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loo", action="store_true",
                        help="score each row by the fit of the others (about 20 s a run)")
    args = parser.parse_args(argv)
    for run in measured.runs():
        rebuilt = " (rows rebuilt from printed figures)" if run.rebuilt else ""
        print(f"## {run.path.name}: {run.provenance['board']}, {run.provenance['date']}{rebuilt}")
        print(table(run))
        print()
        print("\n".join(provenance_lines(run.provenance["profile"])))
        print()
        if args.loo:
            print("\n".join(loo_lines(run)))
            print()


if __name__ == "__main__":
    main()
