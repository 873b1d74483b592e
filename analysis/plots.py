"""Plots of a sweep: the energy/time Pareto front and the response to the SM clock.

Each function draws on matplotlib Axes it is given and a frame of trial rows; it creates no
figure and touches no global state, so it works under pyplot or in a headless report alike.
matplotlib is imported by the caller (this module imports only its types and helpers, lazily
where they are heavy).

Encoding, the same in every plot: one colour *and* one marker per series (framework, GPU, or
whatever varies within the panel), so a grayscale print still tells them apart; filled markers
for usable points; ``x`` for a setting whose correctness check failed, ``+`` for one whose
measurement was flagged invalid; a star for the device's default setting; a ring around a
recommended setting. Times and energies are drawn in the SI prefix that suits them (ms, mJ...),
named on the axis.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from analysis._frame import DEFAULT_GROUP, OK, exclusion_reasons, group_positions, numeric, truthy
from analysis._labels import LabelPlacer, darker
from analysis.pareto import pareto_front
from analysis.recommend import aggregate_repeats

TIME = "time_per_iter_s"
ENERGY = "energy_per_iter_j"
CLOCK = "sm_clock_max_mhz"
MEMORY_BOUND_FLOP_PER_BYTE = 10.0

MARKERS = ("o", "s", "^", "D", "v", "P", "h", "<", ">", "X")
HATCHES = ("//", "\\\\", "..", "xx", "--", "||")
LINESTYLES = ("-", (0, (5, 2)), "-.", (0, (1, 1.5)))  # solid, dashed, dash-dot, dotted
_PREFIXES = ((1.0, ""), (1e-3, "m"), (1e-6, "µ"), (1e-9, "n"))
_LABELLED = {
    "min_energy": "min energy",
    "min_energy_within_slowdown": "best ≤{pct:g} % slower",
    "min_edp": "min EDP",
}


def _colors() -> list:
    from matplotlib import colormaps

    return list(colormaps["tab10"].colors)


def si_scale(values: Sequence[float] | np.ndarray, unit: str) -> tuple[float, str]:
    """The SI prefix that shows ``values`` as numbers of at least 1.

    Args:
        values: The values, in the base unit.
        unit: The base unit (``"s"``, ``"J"``).

    Returns:
        ``(factor, label)``: divide by ``factor`` to get values in ``label`` (e.g. 1e-3, "ms").
    """
    v = np.abs(np.asarray(values, dtype=float))
    v = v[np.isfinite(v) & (v > 0)]
    if not len(v):
        return 1.0, unit
    typical = float(np.median(v))
    for factor, prefix in _PREFIXES:
        if typical >= factor:
            return factor, prefix + unit
    return _PREFIXES[-1][0], _PREFIXES[-1][1] + unit


def series_columns(df: pd.DataFrame, by: Sequence[str] = DEFAULT_GROUP,
                   exclude: Sequence[str] = ("workload",)) -> list[str]:
    """The grouping columns that vary within ``df``: they name its series."""
    cols = [c for c in by if c in df.columns and c not in exclude]
    varying = [c for c in cols if df[c].astype(str).nunique(dropna=False) > 1]
    if varying:
        return varying
    return [c for c in ("framework", "device_name") if c in cols][:1] or cols[:1]


def series_label(key: dict, columns: Sequence[str]) -> str:
    """A legend label for one series, e.g. ``"jax · A100-SXM4-40GB"``."""
    parts = [str(key[c]) for c in columns if key.get(c) is not None]
    return " · ".join(parts) if parts else "all trials"


def series_styles(labels: Sequence[str]) -> dict[str, dict[str, Any]]:
    """A colour, marker, line style and hatch per series label, stable for sorted labels.

    The line style tells series apart in grayscale, and where two series' lines coincide a
    dashed one drawn over a solid one still shows both.
    """
    colors = _colors()
    return {
        lab: {"color": colors[i % len(colors)], "marker": MARKERS[i % len(MARKERS)],
              "hatch": HATCHES[i % len(HATCHES)], "ls": LINESTYLES[i % len(LINESTYLES)]}
        for i, lab in enumerate(sorted(set(labels)))
    }


def _prepare(df: pd.DataFrame, by: Sequence[str]) -> pd.DataFrame:
    """Reduces repeats to settings and marks the front, unless that is done already."""
    agg = df if "n_repeats" in df.columns else aggregate_repeats(df, by)
    if "on_front" not in agg.columns:
        agg = pareto_front(agg, TIME, ENERGY, by)
    return agg


def plot_pareto(
    ax: Any,
    df: pd.DataFrame,
    *,
    by: Sequence[str] = DEFAULT_GROUP,
    styles: dict[str, dict[str, Any]] | None = None,
    recommendations: pd.DataFrame | None = None,
    series: Sequence[str] | None = None,
    legend: bool = True,
    labels: bool = True,
    title: str | None = None,
) -> dict[str, Any]:
    """Draws energy per iteration against time per iteration, with each series' Pareto front.

    Args:
        ax: The Axes.
        df: Trial rows (or settings from :func:`analysis.aggregate_repeats`) of one workload;
            repeats are reduced to their median first.
        by: The grouping columns; a front is drawn per group.
        styles: Colour/marker per series label (from :func:`series_styles`), to keep several
            panels consistent; default: one per series of this frame.
        recommendations: The frame of :func:`analysis.recommend`, to ring and label the
            recommended settings; None to mark only the default settings.
        series: The columns that name a series (default: the grouping columns that vary in
            ``df``); give the same to every panel of a figure so that names and colours agree.
        legend: Draw a legend on the Axes.
        labels: Label the default and recommended settings now (the layout should be final:
            see :func:`label_settings`).
        title: The panel title; default the workload.

    Returns:
        The legend handles drawn, by label, for a legend shared across panels.
    """
    from matplotlib.lines import Line2D

    agg = _prepare(df, by)
    scols = list(series) if series is not None else series_columns(agg, by)
    groups = group_positions(agg, list(by))
    names = [series_label(k, scols) for k, _ in groups]
    styles = styles or series_styles(names)
    tf, tunit = si_scale(numeric(agg[TIME]), "s")
    ef, eunit = si_scale(numeric(agg[ENERGY]), "J")
    x, y = numeric(agg[TIME]) / tf, numeric(agg[ENERGY]) / ef
    reason = exclusion_reasons(agg, needed=[TIME, ENERGY])
    usable = reason.isna().to_numpy()
    drawable = np.isfinite(x) & np.isfinite(y)
    failed = np.array([s != OK for s in agg["status"]]) & drawable
    invalid = ~usable & ~failed & drawable
    on_front = truthy(agg["on_front"])
    default = truthy(agg["default_setting"]) if "default_setting" in agg else np.zeros(len(agg), bool)
    handles: dict[str, Any] = {}
    for (key, pos), name in zip(groups, names):
        st = styles.get(name) or series_styles([name])[name]
        c, m, ls = st["color"], st["marker"], st.get("ls", "-")
        u = pos[usable[pos]]
        front = u[on_front[u]]
        rest = u[~on_front[u]]
        ax.scatter(x[rest], y[rest], s=28, marker=m, color=c, alpha=0.45, linewidths=0, zorder=3)
        ax.scatter(x[front], y[front], s=40, marker=m, color=c, edgecolors="black",
                   linewidths=0.6, zorder=4)
        if len(front):
            order = np.argsort(x[front])
            ax.step(x[front][order], y[front][order], where="post", color=c, lw=1.4, ls=ls,
                    zorder=2)
        f, iv = pos[failed[pos]], pos[invalid[pos]]
        ax.scatter(x[f], y[f], s=40, marker="x", color=c, linewidths=1.4, zorder=5)
        ax.scatter(x[iv], y[iv], s=55, marker="+", color=c, linewidths=1.4, zorder=5)
        d = u[default[u]]
        ax.scatter(x[d], y[d], s=170, marker="*", color=c, edgecolors="black", linewidths=0.6,
                   zorder=6)
        handles[name] = Line2D([], [], color=c, marker=m, ls=ls, lw=1.4, mec="black", mew=0.6,
                               label=name)
    gray = "0.25"
    handles["Pareto front (step)"] = Line2D([], [], color=gray, lw=1.4, label="Pareto front (step)")
    if default.any():
        handles["device default setting"] = Line2D([], [], color=gray, marker="*", ms=12, ls="",
                                                   label="device default setting")
    if failed.any():
        handles["failed a correctness check"] = Line2D(
            [], [], color=gray, marker="x", ls="", mew=1.4, label="failed a correctness check")
    if invalid.any():
        handles["measurement flagged invalid"] = Line2D(
            [], [], color=gray, marker="+", ms=9, ls="", mew=1.4, label="measurement flagged invalid")
    if recommendations is not None and len(recommendations):
        handles["recommended setting"] = Line2D([], [], color=gray, marker="o", ms=11, ls="",
                                                mfc="none", mew=1.2, label="recommended setting")
        _ring_recommended(ax, agg, recommendations, by, styles, scols, tf, ef)
    ax.set_xlabel(f"Time per iteration ({tunit})")
    ax.set_ylabel(f"Energy per iteration ({eunit})")
    ax.grid(True, lw=0.4, alpha=0.5)
    ax.margins(0.08)
    _widen_flat_axes(ax, x[drawable], y[drawable])
    missing = int((~drawable).sum())
    head = title if title is not None else _panel_title(agg)
    if missing:
        head += f"\n{missing} setting(s) not drawn: no measurement (crash/timeout)"
    zoomed = _narrow_spans(x[drawable], y[drawable])
    if zoomed:
        head += f"\naxes zoomed in: {zoomed}"
    ax.set_title(head, fontsize=10)
    ax.xaxis.set_major_formatter(_plain_formatter())
    ax.yaxis.set_major_formatter(_plain_formatter())
    if legend:
        ax.legend(handles=list(handles.values()), fontsize=8, loc="best", framealpha=0.9)
    if labels:
        label_settings(ax, agg, recommendations, by=by, styles=styles, series=scols)
    return handles


def _narrow_spans(x: np.ndarray, y: np.ndarray, under: float = 0.10) -> str:
    """Words for the axes whose values all lie within ``under`` of each other (an axis that
    does not start at zero makes a 2 % difference look like a large one), e.g.
    ``"times equal to 0.1 %, energies within 4.8 % of each other"``; "" when none."""
    parts = []
    for what, v in (("times", x), ("energies", y)):
        v = v[np.isfinite(v)]
        if len(v) >= 2 and np.min(v) > 0:
            spread = (np.max(v) - np.min(v)) / np.min(v)
            if spread < 0.001:
                parts.append(f"{what} equal to 0.1 %")
            elif spread < under:
                parts.append(f"{what} within {100 * spread:.1f} % of each other")
    return ", ".join(parts)


def _widen_flat_axes(ax: Any, x: np.ndarray, y: np.ndarray, spread: float = 1e-4) -> None:
    """An axis whose values are all equal (up to float noise) gets +-2 % around them, instead
    of ticks that print the noise (a memory-bound kernel's time does not move with the clock)."""
    for v, setter in ((x, ax.set_xlim), (y, ax.set_ylim)):
        v = v[np.isfinite(v)]
        if len(v) and np.min(v) > 0 and (np.max(v) - np.min(v)) / np.min(v) < spread:
            mid = float(np.mean(v))
            setter(mid * 0.98, mid * 1.02)


def _plain_formatter() -> Any:
    from matplotlib.ticker import ScalarFormatter

    f = ScalarFormatter(useOffset=False)
    f.set_scientific(False)
    return f


def _panel_title(agg: pd.DataFrame) -> str:
    parts = []
    for c in ("workload", "size", "dtype", "precision"):
        if c in agg.columns:
            vals = list(dict.fromkeys(str(v) for v in agg[c] if v is not None and not pd.isna(v)))
            if len(vals) == 1:
                parts.append(vals[0])
    return parts[0] + (f" ({', '.join(parts[1:])})" if len(parts) > 1 else "") if parts else ""


def _rec_points(agg: pd.DataFrame, recs: pd.DataFrame | None, by: Sequence[str],
                scols: Sequence[str]) -> list[tuple[int, str, str]]:
    """(row position in ``agg``, series name, label text) of each point worth a label.

    Those are the default setting, the baseline when it is not the default, and the
    recommendations of :data:`_LABELLED`; several at one point share one label.
    """
    out: list[tuple[int, str, str]] = []
    setting_cols = ["sm_clock_min_mhz", "sm_clock_max_mhz", "mem_clock_mhz", "power_limit_w",
                    "clock_offset_mhz", "default_setting"]
    for key, pos in group_positions(agg, list(by)):
        name = series_label(key, scols)
        sub = agg.iloc[pos]
        parts: dict[int, list[str]] = {}
        saving: dict[int, str] = {}
        base_i: int | None = None
        usable = exclusion_reasons(sub, needed=[TIME, ENERGY]).isna().to_numpy()
        if "default_setting" in sub:
            for p, ok in zip(pos[truthy(sub["default_setting"])], usable[truthy(sub["default_setting"])]):
                if ok:
                    clk = agg["observed_sm_clock_mhz"].iat[p] if "observed_sm_clock_mhz" in agg else None
                    parts[int(p)] = [f"default ({clk:.0f} MHz observed)" if _finite(clk) else "default"]
                    break
        if recs is not None and len(recs) and "objective" in recs:
            match = np.ones(len(recs), dtype=bool)
            for c, v in key.items():
                if c in recs.columns:
                    match &= np.array([_same(r, v) for r in recs[c]])
            for _, r in recs[match].iterrows():
                obj = r.get("objective")
                if obj != "baseline" and obj not in _LABELLED:
                    continue
                hit = np.ones(len(sub), dtype=bool)
                for c in setting_cols:
                    if c in sub.columns and c in recs.columns:
                        hit &= np.array([_same(a, r[c]) for a in sub[c]])
                if not hit.any():
                    continue
                i = int(pos[np.flatnonzero(hit)[0]])
                if obj == "baseline":
                    base_i = i
                    if str(r.get("baseline")) != "default":
                        parts.setdefault(i, []).insert(0, "baseline: highest clock")
                    continue
                parts.setdefault(i, []).append(
                    _LABELLED[obj].format(pct=float(r.get("max_slowdown_pct", 10.0))))
                if _finite(r.get("saving_pct")) and _finite(r.get("slowdown_pct")):
                    saving[i] = (f"\n{_pct(-float(r['saving_pct']))} energy, "
                                 f"{_pct(float(r['slowdown_pct']))} time")
        for i, ps in parts.items():
            clk = agg[CLOCK].iat[i]
            # Several objectives at one point: a line per two, so the label stays narrow.
            head = ",\n".join(", ".join(ps[k:k + 2]) for k in range(0, len(ps), 2))
            if not ps[0].startswith("default") and _finite(clk):
                head += f": {clk:.0f} MHz"
            out.append((i, name, head + ("" if i == base_i else saving.get(i, ""))))
    return out


def _pct(v: float) -> str:
    """A signed percentage, with a decimal only when it is under 1 %: ``−24 %``, ``+0.4 %``,
    ``±0 %`` (no ``−0.0 %`` from a rounding error)."""
    if abs(v) < 0.05:
        return "±0 %"
    text = f"{v:+.1f}" if abs(v) < 0.95 else f"{v:+.0f}"
    return text.replace("-", "−") + " %"


def _isnan(v: object) -> bool:
    return isinstance(v, float) and math.isnan(v)


def _finite(v: object) -> bool:
    try:
        return v is not None and math.isfinite(float(v))
    except (TypeError, ValueError):
        return False


def _same(a: object, b: object) -> bool:
    a_missing = a is None or _isnan(a) or a is pd.NA
    b_missing = b is None or _isnan(b) or b is pd.NA
    if a_missing or b_missing:
        return a_missing and b_missing
    return bool(a == b)


def _ring_recommended(ax: Any, agg: pd.DataFrame, recs: pd.DataFrame, by: Sequence[str],
                      styles: dict, scols: Sequence[str], tf: float, ef: float) -> None:
    for i, name, text in _rec_points(agg, recs, by, scols):
        if not any(lab.split("{")[0] in text for lab in _LABELLED.values()):
            continue  # the default or the baseline alone: labelled, not ringed
        c = styles.get(name, {}).get("color", "black")
        ax.scatter([agg[TIME].iat[i] / tf], [agg[ENERGY].iat[i] / ef], s=190, facecolors="none",
                   edgecolors=c, linewidths=1.3, zorder=6)


def label_settings(
    ax: Any,
    df: pd.DataFrame,
    recommendations: pd.DataFrame | None = None,
    *,
    by: Sequence[str] = DEFAULT_GROUP,
    styles: dict[str, dict[str, Any]] | None = None,
    series: Sequence[str] | None = None,
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
    """
    agg = _prepare(df, by)
    scols = list(series) if series is not None else series_columns(agg, by)
    groups = group_positions(agg, list(by))
    styles = styles or series_styles([series_label(k, scols) for k, _ in groups])
    name_of = np.empty(len(agg), dtype=object)
    for key, pos in groups:
        name_of[pos] = series_label(key, scols)
    tf, _ = si_scale(numeric(agg[TIME]), "s")
    ef, _ = si_scale(numeric(agg[ENERGY]), "J")
    xs, ys = numeric(agg[TIME]) / tf, numeric(agg[ENERGY]) / ef
    ok = np.isfinite(xs) & np.isfinite(ys)
    disp = np.full((len(agg), 2), np.nan)
    if ok.any():
        disp[ok] = ax.transData.transform(np.column_stack([xs[ok], ys[ok]]))
    placer = LabelPlacer(ax, disp[ok])

    # Setting labels, merged where the same text sits at the same spot.
    items: list[tuple[int, Any, str]] = []
    labelled: set[int] = set()
    for i, name, text in _rec_points(agg, recommendations, by, scols):
        labelled.add(i)
        color = styles.get(name, {}).get("color", "black")
        twin = next((k for k, (j, _, t) in enumerate(items)
                     if t == text and np.hypot(*(disp[j] - disp[i])) < 12), None)
        if twin is None:
            items.append((i, color, text))
        else:
            items[twin] = (items[twin][0], "0.25", text)
    for i, color, text in items:
        placer.boxed(text, (xs[i], ys[i]), disp[i], color)

    # The clock of every other usable point, where it fits: front points first (they matter
    # most), then the rest, left to right.
    usable = exclusion_reasons(agg, needed=[TIME, ENERGY]).isna().to_numpy() & ok
    front = truthy(agg["on_front"]) if "on_front" in agg else np.zeros(len(agg), bool)
    clk = numeric(agg[CLOCK])
    written: list[tuple[str, np.ndarray]] = []
    for i in sorted(np.flatnonzero(usable & np.isfinite(clk)),
                    key=lambda j: (not front[j], xs[j], ys[j])):
        text = f"{clk[i]:.0f}"
        if i in labelled or any(t == text and np.hypot(*(d - disp[i])) < 12 for t, d in written):
            continue
        color = darker(styles.get(name_of[i], {}).get("color", "0.3"))
        if placer.beside(text, (xs[i], ys[i]), disp[i], color, 1.0 if front[i] else 0.7):
            written.append((text, disp[i]))


def _work_unit(df: pd.DataFrame) -> tuple[str, str, str, str, float]:
    """(throughput column, its label, energy-per-work column, its label, energy scale)."""
    choices = [
        ("tflops", "energy_per_tflop_j", "Throughput (TFLOP/s)", "Energy per TFLOP (J/TFLOP)"),
        ("gbps", "energy_per_gb_j", "Throughput (GB/s)", "Energy per GB moved (J/GB)"),
    ]
    if "tflops" in df.columns and "gbps" in df.columns:
        # Arithmetic intensity below ~10 FLOP/byte (under the ridge point of current GPUs in
        # FP32): a memory-bound kernel, whose work is the bytes it moves.
        intensity = np.nanmedian(numeric(df["tflops"]) * 1e3 / numeric(df["gbps"])) \
            if np.isfinite(numeric(df["tflops"]) / numeric(df["gbps"])).any() else np.nan
        if np.isfinite(intensity) and intensity < MEMORY_BOUND_FLOP_PER_BYTE:
            choices.reverse()
    for rate, energy, rlabel, elabel in choices:
        if rate in df.columns and energy in df.columns and np.isfinite(numeric(df[rate])).any() \
                and np.isfinite(numeric(df[energy])).any():
            return rate, rlabel, energy, elabel, 1.0
    f, unit = si_scale(numeric(df[ENERGY]) if ENERGY in df else [], "J")
    return "throughput", "Throughput (iterations/s)", ENERGY, f"Energy per iteration ({unit})", f


def plot_clocks(
    axes: Sequence[Any],
    df: pd.DataFrame,
    *,
    by: Sequence[str] = DEFAULT_GROUP,
    styles: dict[str, dict[str, Any]] | None = None,
    thresholds: pd.DataFrame | None = None,
    series: Sequence[str] | None = None,
    legend: bool = True,
) -> dict[str, Any]:
    """Draws throughput, power and energy per unit of work against the SM clock limit.

    The work unit is the workload's: TFLOP for compute kernels, GB moved for memory-bound ones
    (median arithmetic intensity under :data:`MEMORY_BOUND_FLOP_PER_BYTE`), iterations when the
    rows carry neither. Lines join the medians of usable settings; small
    dots show every repeat; failed settings are crosses. Where a series had failures, the clock
    range up to its highest failing clock is shaded (hatched in the series' colour) and its
    lowest stable clock is a dashed line; series with the same range share one, in gray.
    Trials at the device's default setting are stars at their observed clock. Every y axis starts at zero.

    Args:
        axes: Three Axes: throughput, power, energy per work.
        df: Trial rows of one workload.
        by: The grouping columns; a line per group.
        styles: As for :func:`plot_pareto`.
        thresholds: The frame of :func:`analysis.thresholds` for these rows (computed if None).
        series: As for :func:`plot_pareto`.
        legend: Draw a legend on the last Axes.

    Returns:
        The legend handles drawn, by label.
    """
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    from analysis.thresholds import thresholds as find_thresholds

    ax_rate, ax_power, ax_energy = axes
    rate, rlabel, energy, elabel, escale = _work_unit(df)
    agg = aggregate_repeats(df, by)
    scols = list(series) if series is not None else series_columns(agg, by)
    groups = group_positions(agg, list(by))
    names = [series_label(k, scols) for k, _ in groups]
    styles = styles or series_styles(names)
    thr = thresholds if thresholds is not None else find_thresholds(df)
    raw_groups = {series_label(k, scols): p for k, p in group_positions(df, list(by))}
    reason = exclusion_reasons(agg, needed=[TIME, ENERGY])
    usable = reason.isna().to_numpy()
    clock = numeric(agg[CLOCK])
    default = truthy(agg["default_setting"])
    observed = numeric(agg["observed_sm_clock_mhz"])
    xs = np.where(default & ~np.isfinite(clock), observed, clock)
    metrics = [(ax_rate, rate, 1.0), (ax_power, "avg_power_w", 1.0), (ax_energy, energy, escale)]
    handles: dict[str, Any] = {}
    raw_clock = numeric(df[CLOCK]) if CLOCK in df else np.full(len(df), np.nan)
    raw_default = truthy(df["default_setting"]) if "default_setting" in df else np.zeros(len(df), bool)
    raw_x = np.where(raw_default & ~np.isfinite(raw_clock), numeric(df["observed_sm_clock_mhz"]),
                     raw_clock) if "observed_sm_clock_mhz" in df else raw_clock
    raw_ok = exclusion_reasons(df, needed=[TIME, ENERGY]).isna().to_numpy()
    for (key, pos), name in zip(groups, names):
        st = styles.get(name) or series_styles([name])[name]
        c, m, ls = st["color"], st["marker"], st.get("ls", "-")
        line = pos[usable[pos] & ~default[pos] & np.isfinite(xs[pos])]
        line = line[np.argsort(xs[line])]
        dflt = pos[usable[pos] & default[pos]]
        bad = pos[~usable[pos]]
        rp = raw_groups.get(name, np.array([], dtype=int))
        rp = rp[raw_ok[rp]]
        for ax, col, scale in metrics:
            v = numeric(agg[col]) / scale
            raw_v = numeric(df[col]) / scale
            ax.scatter(raw_x[rp], raw_v[rp], s=6, color=c, alpha=0.35, linewidths=0, zorder=2)
            ax.plot(xs[line], v[line], color=c, marker=m, ms=5, lw=1.3, ls=ls, zorder=3)
            ax.scatter(xs[dflt], v[dflt], s=150, marker="*", color=c, edgecolors="black",
                       linewidths=0.6, zorder=5)
            ax.scatter(xs[bad], v[bad], s=40, marker="x", color=c, linewidths=1.4, zorder=4)
        handles[name] = Line2D([], [], color=c, marker=m, lw=1.3, ls=ls, label=name)
    # Stability: per series, the range with failures and the lowest stable clock. Series with
    # the same range share one band and one line, in gray, named together in the legend.
    any_failure = False
    if len(thr) and "framework" in thr.columns:
        shared: dict[tuple[float, float], list[str]] = {}
        for key, tpos in group_positions(thr, [c for c in scols if c in thr.columns]):
            name = series_label(key, scols)
            t = thr.iloc[tpos]
            hf = numeric(t["failing_value"])
            if name not in styles or not np.isfinite(hf).any():
                continue
            ls_ = numeric(t["stable_value"])
            stable = float(np.nanmax(ls_)) if np.isfinite(ls_).any() else np.nan
            shared.setdefault((float(np.nanmax(hf)), stable), []).append(name)
        lo = np.nanmin(xs) if np.isfinite(xs).any() else 0.0
        for (top, stable), members in shared.items():
            any_failure = True
            st = styles[members[0]]
            color = st["color"] if len(members) == 1 else "0.45"
            who = ", ".join(members)
            for ax, _, _ in metrics:
                ax.axvspan(lo - 1e4, top, facecolor=color, alpha=0.12, edgecolor=color,
                           hatch=st["hatch"], lw=0, zorder=0)
            label = f"checks failed at ≤ {top:.0f} MHz ({who})"
            handles[label] = Patch(facecolor=color, alpha=0.25, hatch=st["hatch"],
                                   edgecolor=color, label=label)
            if np.isfinite(stable):
                for ax, _, _ in metrics:
                    ax.axvline(stable, color=color, ls="--", lw=1.0, zorder=1)
                lab = f"lowest stable {stable:.0f} MHz ({who})"
                handles[lab] = Line2D([], [], color=color, ls="--", label=lab)
    if default.any():
        handles["device default (at its observed clock)"] = Line2D(
            [], [], color="0.25", marker="*", ms=11, ls="", label="device default (at its observed clock)")
    if (~usable).any():
        handles["failed or invalid setting"] = Line2D(
            [], [], color="0.25", marker="x", ls="", mew=1.4, label="failed or invalid setting")
    workload = next((str(v) for v in agg["workload"] if not pd.isna(v)), "") \
        if "workload" in agg else ""
    for ax, title, ylabel in ((ax_rate, "throughput", rlabel), (ax_power, "mean power", "Power (W)"),
                              (ax_energy, "energy per unit of work", elabel)):
        ax.set_xlabel("SM clock limit (MHz)")
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0)
        ax.grid(True, lw=0.4, alpha=0.5)
        ax.set_title(f"{workload}: {title}" if workload else title.capitalize(), fontsize=10)
        if np.isfinite(xs).any():
            span = np.nanmax(xs) - np.nanmin(xs)
            pad = max(span * 0.04, 10.0)
            # Room left of the lowest clock, so a band of failures there can be seen.
            left = max(span * 0.10, 25.0) if any_failure else pad
            ax.set_xlim(np.nanmin(xs) - left, np.nanmax(xs) + pad)
        ax.set_ylim(top=ax.get_ylim()[1] * 1.05)
    if legend:
        ax_energy.legend(handles=list(handles.values()), fontsize=7, loc="best", framealpha=0.9)
    return handles
