"""The drawing behind :func:`analysis.plots.plot_clocks`.

It takes finished frames (trial rows for the dots, their settings for the lines, the
thresholds for the shaded ranges) and only draws: a series' lines on the three panels, the
clock ranges where checks failed, the legend's entries for the kinds of mark, and the axes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from analysis._frame import exclusion_reasons, group_positions, numeric, truthy
from analysis.plot_style import CLOCK, ENERGY, GRAY, TIME, series_label, si_scale

MEMORY_BOUND_FLOP_PER_BYTE = 10.0
"""Arithmetic intensity under which a kernel's work is the bytes it moves, not its FLOPs:
under the ridge point of current GPUs in FP32."""


def work_unit(df: pd.DataFrame) -> tuple[str, str, str, str, float]:
    """(throughput column, its label, energy-per-work column, its label, energy scale).

    TFLOP for compute kernels, GB moved for memory-bound ones (median arithmetic intensity
    under :data:`MEMORY_BOUND_FLOP_PER_BYTE`), iterations when the rows carry neither.
    """
    choices = [
        ("tflops", "energy_per_tflop_j", "Throughput (TFLOP/s)", "Energy per TFLOP (J/TFLOP)"),
        ("gbps", "energy_per_gb_j", "Throughput (GB/s)", "Energy per GB moved (J/GB)"),
    ]
    if "tflops" in df.columns and "gbps" in df.columns:
        tflops, gbps = numeric(df["tflops"]), numeric(df["gbps"])
        intensity = np.nanmedian(tflops * 1e3 / gbps) if np.isfinite(tflops / gbps).any() \
            else np.nan
        if np.isfinite(intensity) and intensity < MEMORY_BOUND_FLOP_PER_BYTE:
            choices.reverse()
    for rate, energy, rlabel, elabel in choices:
        if rate in df.columns and energy in df.columns and np.isfinite(numeric(df[rate])).any() \
                and np.isfinite(numeric(df[energy])).any():
            return rate, rlabel, energy, elabel, 1.0
    f, unit = si_scale(numeric(df[ENERGY]) if ENERGY in df else [], "J")
    return "throughput", "Throughput (iterations/s)", ENERGY, f"Energy per iteration ({unit})", f


def clock_axis(df: pd.DataFrame) -> np.ndarray:
    """Each row's place on the clock axis: its asked SM clock, or for a default-setting row
    (no clock asked) the clock it was observed at."""
    clock = numeric(df[CLOCK]) if CLOCK in df else np.full(len(df), np.nan)
    if "observed_sm_clock_mhz" not in df:
        return clock
    default = truthy(df["default_setting"]) if "default_setting" in df \
        else np.zeros(len(df), bool)
    return np.where(default & ~np.isfinite(clock), numeric(df["observed_sm_clock_mhz"]), clock)


@dataclass(frozen=True)
class ClockPoints:
    """The settings and the trial rows of a clock figure, placed on the clock axis."""

    xs: np.ndarray  # settings: clock
    usable: np.ndarray  # settings: ok, valid, measured
    default: np.ndarray  # settings: the device's default setting
    raw_x: np.ndarray  # trial rows: clock
    raw_ok: np.ndarray  # trial rows: usable

    @classmethod
    def of(cls, settings: pd.DataFrame, rows: pd.DataFrame) -> ClockPoints:
        """The points of ``settings`` (repeats reduced) and of the ``rows`` they reduce."""
        return cls(clock_axis(settings),
                   exclusion_reasons(settings, needed=[TIME, ENERGY]).isna().to_numpy(),
                   truthy(settings["default_setting"]), clock_axis(rows),
                   exclusion_reasons(rows, needed=[TIME, ENERGY]).isna().to_numpy())


def draw_clock_series(metrics: Sequence[tuple[Any, str, float]], settings: pd.DataFrame,
                rows: pd.DataFrame, pts: ClockPoints, pos: np.ndarray, raw_pos: np.ndarray,
                name: str, st: dict) -> Any:
    """Draws one series on each (Axes, column, scale) of ``metrics``: a dot per usable repeat,
    a line through the medians, a star at the default setting, a cross per failed setting.

    Returns:
        Its legend handle.
    """
    from matplotlib.lines import Line2D

    c, m, ls = st["color"], st["marker"], st["ls"]
    xs = pts.xs
    line = pos[pts.usable[pos] & ~pts.default[pos] & np.isfinite(xs[pos])]
    line = line[np.argsort(xs[line])]
    dflt = pos[pts.usable[pos] & pts.default[pos]]
    bad = pos[~pts.usable[pos]]
    rp = raw_pos[pts.raw_ok[raw_pos]]
    for ax, col, scale in metrics:
        v = numeric(settings[col]) / scale
        raw_v = numeric(rows[col]) / scale
        ax.scatter(pts.raw_x[rp], raw_v[rp], s=6, color=c, alpha=0.35, linewidths=0, zorder=2)
        ax.plot(xs[line], v[line], color=c, marker=m, ms=5, lw=1.3, ls=ls, zorder=3)
        ax.scatter(xs[dflt], v[dflt], s=150, marker="*", color=c, edgecolors="black",
                   linewidths=0.6, zorder=5)
        ax.scatter(xs[bad], v[bad], s=40, marker="x", color=c, linewidths=1.4, zorder=4)
    return Line2D([], [], color=c, marker=m, lw=1.3, ls=ls, label=name)


def failure_ranges(thr: pd.DataFrame, scols: Sequence[str],
                   styles: dict) -> dict[tuple[float, float], list[str]]:
    """(highest failing clock, lowest stable clock) -> the series that share that range.

    Only series drawn (in ``styles``) with a failure count; series with the same range share
    one band and one line, named together in the legend.
    """
    shared: dict[tuple[float, float], list[str]] = {}
    if not len(thr) or "framework" not in thr.columns:
        return shared
    for key, tpos in group_positions(thr, [c for c in scols if c in thr.columns]):
        name = series_label(key, scols)
        t = thr.iloc[tpos]
        hf = numeric(t["failing_value"])
        if name not in styles or not np.isfinite(hf).any():
            continue
        ls_ = numeric(t["stable_value"])
        stable = float(np.nanmax(ls_)) if np.isfinite(ls_).any() else np.nan
        shared.setdefault((float(np.nanmax(hf)), stable), []).append(name)
    return shared


def draw_failure_ranges(axes: Sequence[Any], ranges: dict[tuple[float, float], list[str]],
                        styles: dict, lo: float) -> dict[str, Any]:
    """Shades each range with failures (hatched, in its series' colour, gray when shared) and
    draws its lowest stable clock as a dashed line; returns the legend handles."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles: dict[str, Any] = {}
    for (top, stable), members in ranges.items():
        st = styles[members[0]]
        color = st["color"] if len(members) == 1 else "0.45"
        who = ", ".join(members)
        for ax in axes:
            ax.axvspan(lo - 1e4, top, facecolor=color, alpha=0.12, edgecolor=color,
                       hatch=st["hatch"], lw=0, zorder=0)
        label = f"checks failed at ≤ {top:.0f} MHz ({who})"
        handles[label] = Patch(facecolor=color, alpha=0.25, hatch=st["hatch"],
                               edgecolor=color, label=label)
        if np.isfinite(stable):
            for ax in axes:
                ax.axvline(stable, color=color, ls="--", lw=1.0, zorder=1)
            lab = f"lowest stable {stable:.0f} MHz ({who})"
            handles[lab] = Line2D([], [], color=color, ls="--", label=lab)
    return handles


def clock_mark_handles(pts: ClockPoints) -> dict[str, Any]:
    """Legend entries, in gray, for the star and the cross where the figure shows them."""
    from matplotlib.lines import Line2D

    handles: dict[str, Any] = {}
    if pts.default.any():
        label = "device default (at its observed clock)"
        handles[label] = Line2D([], [], color=GRAY, marker="*", ms=11, ls="", label=label)
    if (~pts.usable).any():
        label = "failed or invalid setting"
        handles[label] = Line2D([], [], color=GRAY, marker="x", ls="", mew=1.4, label=label)
    return handles


def finish_clock_axes(panels: Sequence[tuple[Any, str, str]], settings: pd.DataFrame,
                      xs: np.ndarray, any_failure: bool) -> None:
    """Labels, titles and limits of each (Axes, title, y label): every y axis from zero, and
    room left of the lowest clock where a band of failures must be seen."""
    workload = next((str(v) for v in settings["workload"] if not pd.isna(v)), "") \
        if "workload" in settings else ""
    for ax, title, ylabel in panels:
        ax.set_xlabel("SM clock limit (MHz)")
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0)
        ax.grid(True, lw=0.4, alpha=0.5)
        ax.set_title(f"{workload}: {title}" if workload else title.capitalize(), fontsize=10)
        if np.isfinite(xs).any():
            span = np.nanmax(xs) - np.nanmin(xs)
            pad = max(span * 0.04, 10.0)
            left = max(span * 0.10, 25.0) if any_failure else pad
            ax.set_xlim(np.nanmin(xs) - left, np.nanmax(xs) + pad)
        ax.set_ylim(top=ax.get_ylim()[1] * 1.05)
