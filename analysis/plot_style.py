"""How every plot of a sweep encodes a series, a setting and a unit.

The encoding, the same in every plot: one colour *and* one marker per series (framework, GPU, or
whatever varies within the panel), so a grayscale print still tells them apart; filled markers
for usable points; ``x`` for a setting whose correctness check failed, ``+`` for one whose
measurement was flagged invalid; a star for the device's default setting; a ring around a
recommended setting. Times and energies are drawn in the SI prefix that suits them (ms, mJ...),
named on the axis.

Kept apart from the drawing (:mod:`analysis.plots`) so that the report's tables can print a
column in the same prefix as the figure beside them, and several panels share one style.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from analysis._frame import DEFAULT_GROUP

TIME = "time_per_iter_s"
ENERGY = "energy_per_iter_j"
CLOCK = "sm_clock_max_mhz"

MARKERS = ("o", "s", "^", "D", "v", "P", "h", "<", ">", "X")
HATCHES = ("//", "\\\\", "..", "xx", "--", "||")
LINESTYLES = ("-", (0, (5, 2)), "-.", (0, (1, 1.5)))  # solid, dashed, dash-dot, dotted
GRAY = "0.25"
"""The colour of legend entries that name a kind of mark, not a series."""
_PREFIXES = ((1.0, ""), (1e-3, "m"), (1e-6, "µ"), (1e-9, "n"))


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


def style_of(styles: dict[str, dict[str, Any]], name: str) -> dict[str, Any]:
    """The style of series ``name``: its entry in ``styles``, else the first style of all.

    A panel given the styles of a whole figure finds its series there; a series the figure did
    not know still gets a colour, marker and line style rather than a KeyError.
    """
    st = styles.get(name) or series_styles([name])[name]
    return {**st, "ls": st.get("ls", "-")}


def plain_formatter() -> Any:
    """A tick formatter with neither an offset nor scientific notation.

    Ticks of values that hardly differ otherwise read ``+1.23e-3`` plus tiny offsets, which a
    reader cannot map back to a time or an energy.
    """
    from matplotlib.ticker import ScalarFormatter

    f = ScalarFormatter(useOffset=False)
    f.set_scientific(False)
    return f
