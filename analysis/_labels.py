"""Placing text on a plot without hiding the data: the geometry behind the Pareto labels.

A :class:`LabelPlacer` works in display space (pixels) on one Axes whose layout is final. It
knows the data points (as pixel positions) and the boxes already taken (tick labels, the title,
labels placed so far), and puts each new label at the candidate position that costs least:

- never outside the figure; not over the point it labels; not over other points;
- its connecting line not through other points or labels;
- not over labels already placed; preferably inside the Axes; preferably close.

Two kinds: a framed label joined to its point by a line (:meth:`LabelPlacer.boxed`), and a small
bare text beside a point, drawn only where it fits (:meth:`LabelPlacer.beside`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

_DIRECTIONS = [(1, 1), (1, -1), (-1, 1), (-1, -1), (0, 1), (0, -1), (1, 0), (-1, 0)]
_DISTANCES_PT = (22, 40, 62, 90, 125, 170)
_BESIDE = (((4, 2), "left", "bottom"), ((4, -2), "left", "top"),
           ((-4, 2), "right", "bottom"), ((-4, -2), "right", "top"))


def renderer_of(fig: Any) -> Any:
    """The figure's renderer (an Agg canvas is attached when the figure has none)."""
    if not hasattr(fig.canvas, "get_renderer"):
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        FigureCanvasAgg(fig)
    return fig.canvas.get_renderer()


def darker(color: Any, amount: float = 0.35) -> tuple[float, float, float]:
    """A colour mixed with black, for text that must read on white (and in grayscale)."""
    from matplotlib.colors import to_rgb

    return tuple(c * (1.0 - amount) for c in to_rgb(color))


def area(a: Any, b: Any) -> float:
    """The area of the intersection of two boxes, in px²."""
    w = min(a.x1, b.x1) - max(a.x0, b.x0)
    h = min(a.y1, b.y1) - max(a.y0, b.y0)
    return max(w, 0.0) * max(h, 0.0)


def _nearest_point(bb: Any, p: np.ndarray) -> np.ndarray:
    """The point of box ``bb`` nearest to ``p`` (where a line from ``p`` meets it)."""
    return np.array([min(max(p[0], bb.x0), bb.x1), min(max(p[1], bb.y0), bb.y1)])


def _points_near_segment(pts: np.ndarray, a: np.ndarray, b: np.ndarray, tol: float = 5.0) -> int:
    """How many points lie within ``tol`` px of the segment from ``a`` to ``b``, ``a``'s own
    neighbourhood excluded."""
    ab = b - a
    length2 = float(ab @ ab)
    if not len(pts) or length2 < 1e-9:
        return 0
    t = np.clip(((pts - a) @ ab) / length2, 0.0, 1.0)
    d = np.hypot(*(pts - (a + t[:, None] * ab)).T)
    return int(((d < tol) & (np.hypot(*(pts - a).T) > tol)).sum())


def _in_box(pts: np.ndarray, bb: Any, margin: float = 0.0) -> np.ndarray:
    return ((pts[:, 0] > bb.x0 - margin) & (pts[:, 0] < bb.x1 + margin) &
            (pts[:, 1] > bb.y0 - margin) & (pts[:, 1] < bb.y1 + margin))


def _text_box(ann: Any, renderer: Any) -> Any:
    """The display box of an annotation's text and frame, without its line
    (``Annotation.get_window_extent`` includes the line, which makes far spots look crowded)."""
    from matplotlib.text import Text

    ann.update_positions(renderer)  # where the text goes is worked out at draw time
    return Text.get_window_extent(ann, renderer).padded(5)


def _framed(ax: Any, text: str, xy: tuple[float, float], off: tuple[float, float],
            color: Any) -> Any:
    ha = "left" if off[0] > 0 else "right" if off[0] < 0 else "center"
    va = "bottom" if off[1] > 0 else "top" if off[1] < 0 else "center"
    return ax.annotate(
        text, xy=xy, xytext=off, textcoords="offset points", ha=ha, va=va, fontsize=7.5,
        bbox={"boxstyle": "round,pad=0.25", "fc": "white", "ec": color, "lw": 0.8, "alpha": 0.92},
        arrowprops={"arrowstyle": "-", "color": color, "lw": 0.8, "shrinkA": 0, "shrinkB": 4},
        zorder=8, annotation_clip=False,
    )


class LabelPlacer:
    """Places labels on one Axes, each clear of the data and of the labels before it.

    Args:
        ax: The Axes (its figure's layout final).
        points_px: The data points in display pixels, shape (n, 2).
    """

    def __init__(self, ax: Any, points_px: np.ndarray) -> None:
        self.ax = ax
        self.renderer = renderer_of(ax.figure)
        self.ax_box = ax.get_window_extent(self.renderer)
        self.fig_box = ax.figure.bbox
        self.pts = np.asarray(points_px, dtype=float).reshape(-1, 2)
        # Tick labels and the title are obstacles: a label may leave the Axes, not cover them.
        self.placed: list[Any] = [
            t.get_window_extent(self.renderer)
            for t in [*ax.get_xticklabels(), *ax.get_yticklabels(), ax.title]
            if t.get_visible() and t.get_text()]

    def _cost(self, bb: Any, anchor: np.ndarray, dist: float) -> float:
        size = bb.width * bb.height
        end = _nearest_point(bb, anchor)
        along = anchor + np.linspace(0.1, 1.0, 12)[:, None] * (end - anchor)
        through = sum(int(_in_box(along, p).sum()) for p in self.placed)
        own = bool(_in_box(anchor[None, :], bb, 6).any())
        return (1e6 * (size - area(bb, self.fig_box) > 0) + 1e5 * own
                + 5000 * int(_in_box(self.pts, bb, 4).sum())
                + 2000 * _points_near_segment(self.pts, anchor, end) + 3000 * through
                + 500 * sum(area(bb, p) for p in self.placed)
                + 20 * (size - area(bb, self.ax_box)) + 2 * dist)

    def boxed(self, text: str, xy: tuple[float, float], anchor: np.ndarray, color: Any) -> Any:
        """A framed label joined to its point, at the cheapest of 48 offsets (six distances,
        eight directions); always placed.

        Args:
            text: The label.
            xy: The point, in data coordinates.
            anchor: The point, in display pixels.
            color: The frame's and line's colour.

        Returns:
            The annotation.
        """
        best: tuple[float, tuple[float, float]] | None = None
        for dist in _DISTANCES_PT:
            for dx, dy in _DIRECTIONS:
                off = (dx * dist, dy * dist * 0.8)
                ann = _framed(self.ax, text, xy, off, color)
                bb = _text_box(ann, self.renderer)
                ann.remove()
                cost = self._cost(bb, anchor, dist)
                if best is None or cost < best[0]:
                    best = (cost, off)
        assert best is not None
        ann = _framed(self.ax, text, xy, best[1], color)
        self.placed.append(_text_box(ann, self.renderer))
        return ann

    def beside(self, text: str, xy: tuple[float, float], anchor: np.ndarray, color: Any,
               alpha: float = 1.0) -> Any | None:
        """Small bare text at one of four spots beside a point, the first that covers no other
        point and no placed label and stays inside the Axes; None where none does."""
        others = ~((np.abs(self.pts - anchor) < 0.5).all(axis=1))
        for off, ha, va in _BESIDE:
            t = self.ax.annotate(text, xy=xy, xytext=off, textcoords="offset points",
                                 fontsize=6.5, color=color, alpha=alpha, ha=ha, va=va, zorder=7)
            bb = t.get_window_extent(self.renderer).padded(1)
            if not (_in_box(self.pts, bb) & others).any() \
                    and area(bb, self.ax_box) == bb.width * bb.height \
                    and not any(area(bb, p) > 0 for p in self.placed):
                self.placed.append(bb)
                return t
            t.remove()
        return None
