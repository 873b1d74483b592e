"""The report's two figures, each one PNG (and the Pareto one also SVG) of a given pixel size.

- :func:`pareto_figure`: energy vs time per iteration, one panel per workload, the Pareto front
  of each series, the default and recommended settings labelled, each point's SM clock;
- :func:`clocks_figure`: throughput, power and energy per unit of work against the SM clock, a
  row per workload, the clock ranges where checks failed shaded;
- :func:`boards_figure`: each board at its best and its default setting, per computation (only
  when the rows hold two boards or more).

Figures are made with matplotlib's object API on an Agg canvas (no pyplot, no global state);
matplotlib is imported only when a figure is drawn.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis._frame import DEFAULT_GROUP, group_positions, is_missing
from analysis.plot_style import series_columns, series_label, series_styles

DPI = 100


def _grid(n: int) -> tuple[int, int]:
    if n <= 3:
        return 1, n
    cols = 2 if n == 4 else 3
    return math.ceil(n / cols), cols


def _workloads(df: pd.DataFrame) -> list[object]:
    return list(dict.fromkeys(df["workload"].tolist()))


def _rows_of(df: pd.DataFrame, workload: object) -> pd.DataFrame:
    mask = np.array([(w == workload) or (is_missing(w) and is_missing(workload))
                     for w in df["workload"]])
    return df[mask]


def _figure(image_size: tuple[int, int]) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    w, h = image_size
    fig = Figure(figsize=(w / DPI, h / DPI), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _styles(df: pd.DataFrame) -> tuple[list[str], dict[str, dict[str, Any]]]:
    """The columns that name a series across the whole figure, and one style per series."""
    cols = series_columns(df, DEFAULT_GROUP)
    return cols, series_styles([series_label(k, cols)
                                for k, _ in group_positions(df, DEFAULT_GROUP)])


def pareto_figure(front: pd.DataFrame, recs: pd.DataFrame, texts: pd.DataFrame,
                  image_size: tuple[int, int], out: Path) -> tuple[Path, Path]:
    """Writes ``pareto.png`` and ``pareto.svg``: a Pareto panel per workload, one legend.

    Args:
        front: The settings with their front marked (:func:`analysis.pareto_front`), unique index.
        recs: :func:`analysis.recommend` of the settings.
        texts: :func:`analysis.setting_labels.label_texts` of ``front`` and ``recs``.
        image_size: (width, height) in pixels.
        out: The directory to write into.
    """
    from analysis import plots

    workloads = _workloads(front)
    fig = _figure(image_size)
    nrows, ncols = _grid(len(workloads))
    axes = np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False)).ravel()
    cols, styles = _styles(front)
    handles: dict[str, Any] = {}
    panels = []
    for ax, w in zip(axes, workloads):
        sub = _rows_of(front, w)
        handles.update(plots.plot_pareto(ax, sub, styles=styles, recommendations=recs,
                                         texts=texts, series=cols, legend=False, labels=False))
        panels.append((ax, sub))
    for ax in axes[len(workloads):]:
        ax.set_visible(False)
    fig.legend(handles=list(handles.values()), loc="outside lower center",
               ncols=min(len(handles), 5), fontsize=9, frameon=False)
    fig.suptitle("Energy vs time per iteration, one point per setting (lower left is better). "
                 "Small numbers: SM clock limit (MHz).\nChanges in the labels are against "
                 + _baseline_words(recs), fontsize=11)
    fig.draw_without_rendering()
    fig.set_layout_engine("none")  # freeze the layout, then place labels in display space
    for ax, sub in panels:
        plots.label_settings(ax, sub, recs, styles=styles, series=cols, texts=texts)
    png, svg = out / "pareto.png", out / "pareto.svg"
    fig.savefig(png, dpi=DPI)
    fig.savefig(svg)
    return png, svg


def _baseline_words(recs: pd.DataFrame) -> str:
    """What the savings are measured against, in words, for every group of ``recs``."""
    hows = {str(h) for h in recs.get("baseline", pd.Series(dtype=object)) if not is_missing(h)}
    if hows == {"default"}:
        return "the device's default setting (no clock locked)"
    if hows and "default" not in hows:
        return "the highest clock tested (no usable default-setting trial)"
    return "the device's default setting, or the highest clock where no default trial was usable"


def clocks_figure(df: pd.DataFrame, agg: pd.DataFrame, thr: pd.DataFrame,
                  image_size: tuple[int, int], out: Path) -> Path:
    """Writes ``clocks.png``: throughput, power and energy per work vs SM clock, a row a workload.

    Args:
        df: Every trial row.
        agg: :func:`analysis.aggregate_repeats` of the rows.
        thr: :func:`analysis.thresholds` of the rows.
        image_size: (width, height) in pixels.
        out: The directory to write into.
    """
    from analysis import plots

    workloads = _workloads(df)
    fig = _figure(image_size)
    axes = fig.subplots(len(workloads), 3, squeeze=False)
    cols, styles = _styles(df)
    for row, w in zip(axes, workloads):
        t = _rows_of(thr, w) if len(thr) else thr
        handles = plots.plot_clocks(row, _rows_of(df, w), styles=styles, settings=_rows_of(agg, w),
                                    thresholds=t, series=cols, legend=False)
        row[2].legend(handles=list(handles.values()), fontsize=7, loc="center left",
                      bbox_to_anchor=(1.02, 0.5), frameon=False)
    fig.suptitle("Response to the SM clock limit (medians of usable repeats; dots: every repeat)",
                 fontsize=12)
    png = out / "clocks.png"
    fig.savefig(png, dpi=DPI)
    return png


def boards_figure(boards: pd.DataFrame, agg: pd.DataFrame, image_size: tuple[int, int],
                  out: Path) -> Path:
    """Writes ``boards.png``: per computation, each board at its best setting (filled) and its
    default setting (hollow, joined to it), energy vs time per iteration.

    Args:
        boards: :func:`analysis.boards.compare_boards` (not empty).
        agg: :func:`analysis.aggregate_repeats` of the rows (where the default settings are).
        image_size: (width, height) in pixels.
        out: The directory to write into.
    """
    from analysis.boards import COMPUTATION
    from analysis.plot_style import plain_formatter, si_scale, style_of

    groups = group_positions(boards, COMPUTATION)
    fig = _figure(image_size)
    nrows, ncols = _grid(len(groups))
    axes = np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False)).ravel()
    styles = series_styles([str(n) for n in boards["device_name"]])
    defaults = agg[agg["default_setting"].astype(bool)] if "default_setting" in agg else agg[:0]
    for ax, (key, pos) in zip(axes, groups):
        sub = boards.iloc[pos]
        tf, tunit = si_scale(sub["time_per_iter_s"].to_numpy(dtype=float), "s")
        ef, eunit = si_scale(sub["energy_per_iter_j"].to_numpy(dtype=float), "J")
        for _, r in sub.iterrows():
            st = style_of(styles, str(r["device_name"]))
            t, e = float(r["time_per_iter_s"]) / tf, float(r["energy_per_iter_j"]) / ef
            ax.plot([t], [e], ls="none", marker=st["marker"], color=st["color"], ms=9,
                    label=str(r["device_name"]))
            ax.annotate(str(r["device_name"]), (t, e), xytext=(6, 4),
                        textcoords="offset points", fontsize=8)
            d = defaults[(defaults["device_name"] == r["device_name"]) & np.logical_and.reduce(
                [defaults[c].astype(str) == str(key[c]) for c in COMPUTATION])]
            if len(d) and not bool(r.get("default_setting")):
                dt = float(d["time_per_iter_s"].iat[0]) / tf
                de = float(d["energy_per_iter_j"].iat[0]) / ef
                ax.plot([dt, t], [de, e], color=st["color"], lw=0.8, ls=":")
                ax.plot([dt], [de], ls="none", marker=st["marker"], mfc="none",
                        color=st["color"], ms=9)
        ax.set_title(" / ".join(str(key[c]) for c in COMPUTATION if not is_missing(key[c])),
                     fontsize=10)
        ax.set_xlabel(f"time per iteration ({tunit})")
        ax.set_ylabel(f"energy per iteration ({eunit})")
        ax.xaxis.set_major_formatter(plain_formatter())
        ax.yaxis.set_major_formatter(plain_formatter())
        ax.margins(0.15)
    for ax in axes[len(groups):]:
        ax.set_visible(False)
    fig.suptitle("Boards side by side: each at its best setting (filled) and its default setting "
                 "(hollow); lower left is better",
                 fontsize=12)
    png = out / "boards.png"
    fig.savefig(png, dpi=DPI)
    return png
