"""Plots of a sweep: the energy/time Pareto front and the response to the SM clock.

Each function draws on matplotlib Axes it is given and finished frames: the settings with their
front (:func:`analysis.pareto_front`), the labels (:func:`analysis.setting_labels.label_texts`),
the thresholds (:func:`analysis.thresholds`). The report computes each of those once and hands
them over; a caller with only trial rows (a notebook) may pass just those, and the function
computes what is missing by calling the same compute step. Nothing here creates a figure or
touches global state, so it works under pyplot or in a headless report alike; matplotlib is
imported only inside the functions that draw.

The encoding (a colour and a marker per series, ``x`` for a failed check, ``+`` for an invalid
measurement, a star for the default setting, a ring for a recommended one) is
:mod:`analysis.plot_style`'s; the drawing itself is in ``analysis._pareto_draw`` and
``analysis._clock_draw``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from analysis._clock_draw import (
    ClockPoints,
    clock_mark_handles,
    draw_clock_series,
    draw_failure_ranges,
    failure_ranges,
    finish_clock_axes,
    work_unit,
)
from analysis._frame import DEFAULT_GROUP, group_positions
from analysis._pareto_draw import (
    draw_front_series,
    finish_panel,
    front_mark_handles,
    panel_points,
    place_labels,
    ring_recommended,
)
from analysis.pareto import pareto_front
from analysis.plot_style import (
    ENERGY,
    TIME,
    series_columns,
    series_label,
    series_styles,
    style_of,
)
from analysis.recommend import aggregate_repeats, as_settings
from analysis.setting_labels import label_texts


def _front_of(df: pd.DataFrame, by: Sequence[str]) -> pd.DataFrame:
    """``df`` if it is a front already, else the front of its settings (unique index: labels
    name their point by index)."""
    front = df if "on_front" in df.columns else pareto_front(as_settings(df, by), TIME, ENERGY, by)
    return front if front.index.is_unique else front.reset_index(drop=True)


def _series(df: pd.DataFrame, by: Sequence[str],
            series: Sequence[str] | None) -> tuple[list[str], list[tuple[str, np.ndarray]]]:
    """The columns that name a series, and (name, row positions) per group of ``df``."""
    scols = list(series) if series is not None else series_columns(df, by)
    return scols, [(series_label(k, scols), pos) for k, pos in group_positions(df, list(by))]


def _names(n: int, groups: list[tuple[str, np.ndarray]]) -> np.ndarray:
    """The series name of each of ``n`` rows."""
    name_of = np.empty(n, dtype=object)
    for name, pos in groups:
        name_of[pos] = name
    return name_of


def plot_pareto(
    ax: Any,
    df: pd.DataFrame,
    *,
    by: Sequence[str] = DEFAULT_GROUP,
    styles: dict[str, dict[str, Any]] | None = None,
    recommendations: pd.DataFrame | None = None,
    texts: pd.DataFrame | None = None,
    series: Sequence[str] | None = None,
    legend: bool = True,
    labels: bool = True,
    title: str | None = None,
) -> dict[str, Any]:
    """Draws energy per iteration against time per iteration, with each series' Pareto front.

    Args:
        ax: The Axes.
        df: The front of one workload's settings (:func:`analysis.pareto_front` of
            :func:`analysis.aggregate_repeats`); trial rows or settings without ``on_front``
            are reduced and their front marked first.
        by: The grouping columns; a front is drawn per group.
        styles: Colour/marker per series label (from :func:`analysis.plot_style.series_styles`),
            to keep several panels consistent; default: one per series of this frame.
        recommendations: The frame of :func:`analysis.recommend`, to ring and label the
            recommended settings; None to mark only the default settings.
        texts: The labels (:func:`analysis.setting_labels.label_texts` of ``df`` and
            ``recommendations``); computed when None.
        series: The columns that name a series (default: the grouping columns that vary in
            ``df``); give the same to every panel of a figure so that names and colours agree.
        legend: Draw a legend on the Axes.
        labels: Label the default and recommended settings now (the layout should be final:
            see :func:`label_settings`).
        title: The panel title; default the workload.

    Returns:
        The legend handles drawn, by label, for a legend shared across panels.
    """
    front = _front_of(df, by)
    texts = label_texts(front, recommendations, by) if texts is None else texts
    scols, groups = _series(front, by, series)
    styles = styles or series_styles([name for name, _ in groups])
    pts = panel_points(front)
    handles = {name: draw_front_series(ax, pts, pos, name, style_of(styles, name))
               for name, pos in groups}
    recommended = recommendations is not None and len(recommendations) > 0
    handles.update(front_mark_handles(pts, recommended))
    if recommended:
        ring_recommended(ax, pts, texts, front, _names(len(front), groups), styles)
    finish_panel(ax, front, pts, title)
    if legend:
        ax.legend(handles=list(handles.values()), fontsize=8, loc="best", framealpha=0.9)
    if labels:
        label_settings(ax, front, recommendations, by=by, styles=styles, series=scols,
                       texts=texts)
    return handles


def label_settings(
    ax: Any,
    df: pd.DataFrame,
    recommendations: pd.DataFrame | None = None,
    *,
    by: Sequence[str] = DEFAULT_GROUP,
    styles: dict[str, dict[str, Any]] | None = None,
    series: Sequence[str] | None = None,
    texts: pd.DataFrame | None = None,
) -> None:
    """Labels the default and recommended settings of a Pareto panel, and each point's clock.

    The setting labels come first: each is tried at 48 offsets around its point (six distances,
    eight directions) and put where it overlaps no label already placed, covers the fewest points
    and stays inside the Axes (never outside the figure); a line joins it to its point. Labels
    with the same text at the same spot (two series' default settings that coincide) are drawn
    once, in gray. Then every other usable point gets its SM clock in MHz, in small type, beside
    it where there is room (points off the front fainter); a clock that fits nowhere, or repeats
    one already written at that spot, is left out. Call it once the figure's layout is final
    (after ``fig.draw_without_rendering()``), since it measures text in display space.

    Args:
        ax: The Axes that :func:`plot_pareto` drew on.
        df: The same frame.
        recommendations: The frame of :func:`analysis.recommend`, or None.
        by: The grouping columns.
        styles: As for :func:`plot_pareto`.
        series: As for :func:`plot_pareto`.
        texts: As for :func:`plot_pareto`.
    """
    front = _front_of(df, by)
    texts = label_texts(front, recommendations, by) if texts is None else texts
    _, groups = _series(front, by, series)
    styles = styles or series_styles([name for name, _ in groups])
    place_labels(ax, front, texts, _names(len(front), groups), styles)


def plot_clocks(
    axes: Sequence[Any],
    df: pd.DataFrame,
    *,
    by: Sequence[str] = DEFAULT_GROUP,
    styles: dict[str, dict[str, Any]] | None = None,
    settings: pd.DataFrame | None = None,
    thresholds: pd.DataFrame | None = None,
    series: Sequence[str] | None = None,
    legend: bool = True,
) -> dict[str, Any]:
    """Draws throughput, power and energy per unit of work against the SM clock limit.

    The work unit is the workload's: TFLOP for compute kernels, GB moved for memory-bound ones
    (median arithmetic intensity under 10 FLOP/byte), iterations when the rows carry neither.
    Lines join the medians of usable settings; small dots show every repeat; failed settings
    are crosses.
    Where a series had failures, the clock range up to its highest failing clock is shaded
    (hatched in the series' colour) and its lowest stable clock is a dashed line; series with
    the same range share one, in gray. Trials at the device's default setting are stars at
    their observed clock. Every y axis starts at zero.

    Args:
        axes: Three Axes: throughput, power, energy per work.
        df: Trial rows of one workload.
        by: The grouping columns; a line per group.
        styles: As for :func:`plot_pareto`.
        settings: :func:`analysis.aggregate_repeats` of these rows (computed if None).
        thresholds: The frame of :func:`analysis.thresholds` for these rows (computed if None).
        series: As for :func:`plot_pareto`.
        legend: Draw a legend on the last Axes.

    Returns:
        The legend handles drawn, by label.
    """
    from analysis.thresholds import thresholds as find_thresholds

    agg = aggregate_repeats(df, by) if settings is None else settings
    thr = find_thresholds(df) if thresholds is None else thresholds
    ax_rate, ax_power, ax_energy = axes
    rate, rlabel, energy, elabel, escale = work_unit(df)
    metrics = [(ax_rate, rate, 1.0), (ax_power, "avg_power_w", 1.0), (ax_energy, energy, escale)]
    scols, groups = _series(agg, by, series)
    styles = styles or series_styles([name for name, _ in groups])
    raw_groups = {series_label(k, scols): p for k, p in group_positions(df, list(by))}
    pts = ClockPoints.of(agg, df)
    handles = {name: draw_clock_series(
        metrics, agg, df, pts, pos, raw_groups.get(name, np.array([], dtype=int)), name,
        style_of(styles, name)) for name, pos in groups}
    ranges = failure_ranges(thr, scols, styles)
    lo = np.nanmin(pts.xs) if np.isfinite(pts.xs).any() else 0.0
    handles.update(draw_failure_ranges(axes, ranges, styles, lo))
    handles.update(clock_mark_handles(pts))
    finish_clock_axes([(ax_rate, "throughput", rlabel), (ax_power, "mean power", "Power (W)"),
                             (ax_energy, "energy per unit of work", elabel)], agg, pts.xs,
                            bool(ranges))
    if legend:
        ax_energy.legend(handles=list(handles.values()), fontsize=7, loc="best", framealpha=0.9)
    return handles
