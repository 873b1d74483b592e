"""The drawing behind :func:`analysis.plots.plot_pareto` and :func:`analysis.plots.label_settings`.

Everything here takes finished frames (the settings with ``on_front``, the labels of
:func:`analysis.setting_labels.label_texts`) and only draws: marks per series, the legend's
entries for the kinds of mark, rings around recommended settings, titles and axes, and the
placement of labels clear of the data (:class:`analysis._labels.LabelPlacer`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from analysis._frame import OK, exclusion_reasons, numeric, truthy
from analysis._labels import LabelPlacer, darker
from analysis.plot_style import CLOCK, ENERGY, GRAY, TIME, plain_formatter, si_scale


@dataclass(frozen=True)
class PanelPoints:
    """The points of a Pareto panel in axis units, and what kind of mark each one gets."""

    x: np.ndarray  # time per iteration, in units of tunit
    y: np.ndarray  # energy per iteration, in units of eunit
    tf: float  # seconds per tunit
    ef: float  # joules per eunit
    tunit: str
    eunit: str
    usable: np.ndarray  # ok, valid and measured: may be on a front
    drawable: np.ndarray  # has both coordinates
    failed: np.ndarray  # a check failed (drawn as x)
    invalid: np.ndarray  # ok but its measurement flagged invalid (drawn as +)
    on_front: np.ndarray
    default: np.ndarray  # the device's default setting (a star)


def panel_points(front: pd.DataFrame) -> PanelPoints:
    """The points of ``front`` (settings with ``on_front``) as the panel draws them."""
    tf, tunit = si_scale(numeric(front[TIME]), "s")
    ef, eunit = si_scale(numeric(front[ENERGY]), "J")
    x, y = numeric(front[TIME]) / tf, numeric(front[ENERGY]) / ef
    usable = exclusion_reasons(front, needed=[TIME, ENERGY]).isna().to_numpy()
    drawable = np.isfinite(x) & np.isfinite(y)
    failed = np.array([s != OK for s in front["status"]], dtype=bool) & drawable
    default = truthy(front["default_setting"]) if "default_setting" in front \
        else np.zeros(len(front), bool)
    return PanelPoints(x, y, tf, ef, tunit, eunit, usable, drawable, failed,
                       ~usable & ~failed & drawable, truthy(front["on_front"]), default)


def draw_front_series(ax: Any, pts: PanelPoints, pos: np.ndarray, name: str, st: dict) -> Any:
    """Draws one series: its points, its front as a step line, failures, invalid, default.

    Returns:
        Its legend handle.
    """
    from matplotlib.lines import Line2D

    c, m, ls = st["color"], st["marker"], st["ls"]
    x, y = pts.x, pts.y
    u = pos[pts.usable[pos]]
    front, rest = u[pts.on_front[u]], u[~pts.on_front[u]]
    ax.scatter(x[rest], y[rest], s=28, marker=m, color=c, alpha=0.45, linewidths=0, zorder=3)
    ax.scatter(x[front], y[front], s=40, marker=m, color=c, edgecolors="black",
               linewidths=0.6, zorder=4)
    if len(front):
        order = np.argsort(x[front])
        ax.step(x[front][order], y[front][order], where="post", color=c, lw=1.4, ls=ls,
                zorder=2)
    f, iv = pos[pts.failed[pos]], pos[pts.invalid[pos]]
    ax.scatter(x[f], y[f], s=40, marker="x", color=c, linewidths=1.4, zorder=5)
    ax.scatter(x[iv], y[iv], s=55, marker="+", color=c, linewidths=1.4, zorder=5)
    d = u[pts.default[u]]
    ax.scatter(x[d], y[d], s=170, marker="*", color=c, edgecolors="black", linewidths=0.6,
               zorder=6)
    return Line2D([], [], color=c, marker=m, ls=ls, lw=1.4, mec="black", mew=0.6, label=name)


def front_mark_handles(pts: PanelPoints, recommended: bool) -> dict[str, Any]:
    """Legend entries, in gray, for the kinds of mark the panel shows (front, star, x, +)."""
    from matplotlib.lines import Line2D

    marks = [("Pareto front (step)", True, {"lw": 1.4}),
             ("device default setting", pts.default.any(), {"marker": "*", "ms": 12, "ls": ""}),
             ("failed a correctness check", pts.failed.any(),
              {"marker": "x", "ls": "", "mew": 1.4}),
             ("measurement flagged invalid", pts.invalid.any(),
              {"marker": "+", "ms": 9, "ls": "", "mew": 1.4}),
             ("recommended setting", recommended,
              {"marker": "o", "ms": 11, "ls": "", "mfc": "none", "mew": 1.2})]
    return {label: Line2D([], [], color=GRAY, label=label, **kw) for label, shown, kw in marks
            if shown}


def label_positions(front: pd.DataFrame, texts: pd.DataFrame) -> list[tuple[int, str, bool]]:
    """(position in ``front``, text, recommended) of the labels whose point is in ``front``."""
    where = front.index.get_indexer(texts["row"]) if len(texts) else np.array([], dtype=int)
    return [(int(i), t, bool(r)) for i, t, r in zip(where, texts["text"], texts["recommended"])
            if i >= 0]


def ring_recommended(ax: Any, pts: PanelPoints, texts: pd.DataFrame, front: pd.DataFrame,
                     name_of: np.ndarray, styles: dict) -> None:
    """A ring, in the series' colour, around each recommended setting of the panel."""
    for i, _, recommended in label_positions(front, texts):
        if not recommended:
            continue  # the default or the baseline alone: labelled, not ringed
        c = styles.get(name_of[i], {}).get("color", "black")
        ax.scatter([front[TIME].iat[i] / pts.tf], [front[ENERGY].iat[i] / pts.ef], s=190,
                   facecolors="none", edgecolors=c, linewidths=1.3, zorder=6)


def finish_panel(ax: Any, front: pd.DataFrame, pts: PanelPoints, title: str | None) -> None:
    """Axis labels, grid, limits, tick format and a title that says what is not shown."""
    ax.set_xlabel(f"Time per iteration ({pts.tunit})")
    ax.set_ylabel(f"Energy per iteration ({pts.eunit})")
    ax.grid(True, lw=0.4, alpha=0.5)
    ax.margins(0.08)
    x, y = pts.x[pts.drawable], pts.y[pts.drawable]
    _widen_flat_axes(ax, x, y)
    missing = int((~pts.drawable).sum())
    head = title if title is not None else _panel_title(front)
    if missing:
        head += f"\n{missing} setting(s) not drawn: no measurement (crash/timeout)"
    zoomed = _narrow_spans(x, y)
    if zoomed:
        head += f"\naxes zoomed in: {zoomed}"
    ax.set_title(head, fontsize=10)
    ax.xaxis.set_major_formatter(plain_formatter())
    ax.yaxis.set_major_formatter(plain_formatter())


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


def _panel_title(front: pd.DataFrame) -> str:
    """The workload, with its size, dtype and precision where the panel has one of each."""
    parts = []
    for c in ("workload", "size", "dtype", "precision"):
        if c in front.columns:
            vals = list(dict.fromkeys(str(v) for v in front[c]
                                      if v is not None and not pd.isna(v)))
            if len(vals) == 1:
                parts.append(vals[0])
    return parts[0] + (f" ({', '.join(parts[1:])})" if len(parts) > 1 else "") if parts else ""


def place_labels(ax: Any, front: pd.DataFrame, texts: pd.DataFrame, name_of: np.ndarray,
                 styles: dict) -> None:
    """Places the setting labels, then the clock of every other usable point that fits."""
    tf, _ = si_scale(numeric(front[TIME]), "s")
    ef, _ = si_scale(numeric(front[ENERGY]), "J")
    xs, ys = numeric(front[TIME]) / tf, numeric(front[ENERGY]) / ef
    ok = np.isfinite(xs) & np.isfinite(ys)
    disp = np.full((len(front), 2), np.nan)
    if ok.any():
        disp[ok] = ax.transData.transform(np.column_stack([xs[ok], ys[ok]]))
    placer = LabelPlacer(ax, disp[ok])
    labelled = _place_setting_labels(placer, front, texts, name_of, styles, (xs, ys, disp))
    usable = exclusion_reasons(front, needed=[TIME, ENERGY]).isna().to_numpy() & ok
    _place_clocks(placer, front, usable, labelled, name_of, styles, (xs, ys, disp))


def _place_setting_labels(placer: LabelPlacer, front: pd.DataFrame, texts: pd.DataFrame,
                          name_of: np.ndarray, styles: dict, where: tuple) -> set[int]:
    """Framed labels, merged where the same text sits at the same spot (two series' default
    settings that coincide: drawn once, in gray); returns the positions labelled."""
    xs, ys, disp = where
    items: list[tuple[int, Any, str]] = []
    labelled: set[int] = set()
    for i, text, _ in label_positions(front, texts):
        labelled.add(i)
        color = styles.get(name_of[i], {}).get("color", "black")
        twin = next((k for k, (j, _, t) in enumerate(items)
                     if t == text and np.hypot(*(disp[j] - disp[i])) < 12), None)
        if twin is None:
            items.append((i, color, text))
        else:
            items[twin] = (items[twin][0], GRAY, text)
    for i, color, text in items:
        placer.boxed(text, (xs[i], ys[i]), disp[i], color)
    return labelled


def _place_clocks(placer: LabelPlacer, front: pd.DataFrame, usable: np.ndarray,
                  labelled: set[int], name_of: np.ndarray, styles: dict, where: tuple) -> None:
    """The SM clock of each usable point not labelled already, where it fits: front points
    first (they matter most), then the rest, left to right; a clock that repeats one already
    written at that spot is left out."""
    xs, ys, disp = where
    front_pt = truthy(front["on_front"]) if "on_front" in front else np.zeros(len(front), bool)
    clk = numeric(front[CLOCK])
    written: list[tuple[str, np.ndarray]] = []
    for i in sorted(np.flatnonzero(usable & np.isfinite(clk)),
                    key=lambda j: (not front_pt[j], xs[j], ys[j])):
        text = f"{clk[i]:.0f}"
        if i in labelled or any(t == text and np.hypot(*(d - disp[i])) < 12 for t, d in written):
            continue
        color = darker(styles.get(name_of[i], {}).get("color", "0.3"))
        if placer.beside(text, (xs[i], ys[i]), disp[i], color,
                         1.0 if front_pt[i] else 0.7):
            written.append((text, disp[i]))
