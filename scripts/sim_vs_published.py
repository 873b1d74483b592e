#!/usr/bin/env python
"""Every published anchor of the simulated GPU beside the sim's figure for the same setting.

The anchors (``orchestrator/devices/sim/calibration.py``) are published power, energy, time and
voltage figures for real boards (papers, traces, ``nvidia-smi -q`` dumps); each names the shipped
profile it was fitted to, a kernel comparable to the published one, and the range the sim's
figure must fall in (the published range, widened by the stated margin where the published
kernel or board differs). The script prints the table and exits 1 if a row is out of range.

Usage::

    .venv/bin/python scripts/sim_vs_published.py [--markdown]
"""

from __future__ import annotations

import argparse
import sys

from orchestrator.devices.sim.calibration import AnchorResult, evaluate

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
    return [a.source, a.board, a.profile, a.kernel, a.setting, a.figure, a.published, accepted,
            _fmt(r.value, scale), "ok" if r.ok else "OUT"]


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
    """Print every anchor beside the sim's figure; exit status 1 if one is out of its range."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--markdown", action="store_true", help="print a markdown table")
    args = parser.parse_args(argv)
    results = evaluate()
    print(markdown(results) if args.markdown else plain(results))
    bad = [r for r in results if not r.ok]
    print(f"\n{len(results) - len(bad)} of {len(results)} anchors inside their accepted range")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
