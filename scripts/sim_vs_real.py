"""Every real-GPU row of ``data/measured/`` beside the simulated GPU's figure for the same work.

    .venv/bin/python scripts/sim_vs_real.py

For each run (a folder of ``data/measured``) and each of its rows: time per iteration, power,
energy per iteration and SM clock, sim / real, with the ratio. The sim's figure is the model's
steady state (``calibration.compare_real``) for the work the row charged, on the profile the run's
provenance names, at the row's settings. Where the two disagree, the sim is wrong.
"""

from __future__ import annotations

from kernels.registry import WORKLOADS
from orchestrator.devices.sim.calibration import compare_real
from orchestrator.devices.sim.profile import load_profile
from orchestrator.realgpu import measured

FIGURES = (("ms_per_iter", "ms/iter", 3), ("power_w", "W", 0), ("j_per_iter", "J/iter", 3),
           ("sm_clock_mhz", "SM MHz", 0))


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


def main() -> None:
    """Print each measured run's table."""
    for run in measured.runs():
        rebuilt = " (rows rebuilt from printed figures)" if run.rebuilt else ""
        print(f"## {run.path.name}: {run.provenance['board']}, {run.provenance['date']}{rebuilt}")
        print(table(run))
        print()


if __name__ == "__main__":
    main()
