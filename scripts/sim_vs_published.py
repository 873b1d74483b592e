#!/usr/bin/env python
"""Every published anchor of the simulated GPU beside the sim's figure for the same setting.

Two tables. *Fitted*: the anchors (``orchestrator/devices/sim/calibration.py``), published
power, energy, time, rate and voltage figures for real boards (papers, traces, ``nvidia-smi -q``
dumps, measured GEMM rates) that the shipped profiles' terms were fitted to; each names the
profile, a kernel comparable to the published one, and the range the sim's figure must fall in
(the published range, widened by the stated margin where the published kernel or board differs).
*Held out*: published figures no fit reads (``orchestrator/devices/sim/held_out.py``), each with
its tolerance: how the sim does on figures it never saw; a known miss says why. The script exits
1 if a fitted anchor is out of its range or a held-out figure that is not a known miss is out.

Usage::

    .venv/bin/python scripts/sim_vs_published.py [--markdown]
"""

from __future__ import annotations

import argparse
import sys

from orchestrator.devices.sim.calibration import ANCHORS, AnchorResult, evaluate
from orchestrator.devices.sim.held_out import HELD_OUT

COLUMNS = ("source", "board", "sim profile", "kernel", "setting", "figure", "published",
           "accepted", "sim", "")


def _fmt(value: float, scale: float | None = None) -> str:
    """Three decimals for figures below 2 (voltages, clock ratios), one above."""
    return f"{value:.3f}" if abs(value if scale is None else scale) < 2 else f"{value:.1f}"


def _cells(r: AnchorResult) -> list[str]:
    a = r.anchor
    scale = max(abs(a.low), abs(a.high))
    accepted = f"{_fmt(a.low, scale)} to {_fmt(a.high, scale)}"
    if a.margin:
        accepted += f" ({a.margin})"
    mark = "ok" if r.ok else "OUT (known miss)" if a.known_miss else "OUT"
    return [a.source, a.board, a.profile, a.kernel, a.setting, a.figure, a.published, accepted,
            _fmt(r.value, scale), mark]


def markdown(results: list[AnchorResult]) -> str:
    """The table as GitHub markdown (what docs/simulator.md holds)."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(_cells(r)) + " |" for r in results]
    return "\n".join(lines)


def plain(results: list[AnchorResult]) -> str:
    """The table for a terminal (margins left out: --markdown has them)."""
    rows = [list(COLUMNS)]
    for r in results:
        cells = _cells(r)
        cells[7] = cells[7].split(" (")[0]
        rows.append(cells)
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows)


def main(argv: list[str] | None = None) -> int:
    """Print every fitted anchor and every held-out figure beside the sim's figure; exit status
    1 if a fitted anchor is out of its range or a held-out figure (not a known miss) is out."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--markdown", action="store_true", help="print markdown tables")
    args = parser.parse_args(argv)
    table = markdown if args.markdown else plain
    fitted, held = evaluate(ANCHORS), evaluate(HELD_OUT)
    print("Fitted: the figures the shipped profiles' terms were fitted to\n")
    print(table(fitted))
    bad = [r for r in fitted if not r.ok]
    print(f"\n{len(fitted) - len(bad)} of {len(fitted)} anchors inside their accepted range")
    print("\nHeld out: published figures no fit reads\n")
    print(table(held))
    misses = [r for r in held if not r.ok]
    unknown = [r for r in misses if not r.anchor.known_miss]
    print(f"\n{len(held) - len(misses)} of {len(held)} held-out figures inside their tolerance")
    for r in misses:
        print(f"- {r.anchor.board} {r.anchor.kernel}: {r.anchor.known_miss or 'not known'}")
    return 1 if bad or unknown else 0


if __name__ == "__main__":
    sys.exit(main())
