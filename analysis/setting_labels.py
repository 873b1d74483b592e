"""What the Pareto figure writes beside its points: the default and the recommended settings.

:func:`label_texts` is a frame -> frame step, as the rest of :mod:`analysis`: it decides which
settings get a label and what the label says (which objectives the setting wins, its clock, its
change in energy and time against the baseline), and leaves where the label goes to the drawing
(:func:`analysis.plots.label_settings`). The report computes it once and hands it to both the
panel that rings the recommended points and the pass that places the labels.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from analysis._format import signed_pct
from analysis._frame import (
    DEFAULT_GROUP,
    SETTING_COLUMNS,
    exclusion_reasons,
    group_positions,
    truthy,
)

TIME = "time_per_iter_s"
ENERGY = "energy_per_iter_j"
CLOCK = "sm_clock_max_mhz"
LABELLED = {
    "min_energy": "min energy",
    "min_energy_within_slowdown": "best ≤{pct:g} % slower",
    "min_edp": "min EDP",
}
"""The objectives of :func:`analysis.recommend` that the figure names, and how."""
COLUMNS = ["row", "text", "recommended"]


def _isnan(v: object) -> bool:
    return isinstance(v, float) and math.isnan(v)


def _finite(v: object) -> bool:
    try:
        return v is not None and math.isfinite(float(v))
    except (TypeError, ValueError):
        return False


def _same(a: object, b: object) -> bool:
    """Equal cells, where two missing values (None, NaN, NA) are equal too."""
    a_missing = a is None or _isnan(a) or a is pd.NA
    b_missing = b is None or _isnan(b) or b is pd.NA
    if a_missing or b_missing:
        return a_missing and b_missing
    return bool(a == b)


def _matching(frame: pd.DataFrame, values: pd.Series | dict, columns: Sequence[str]) -> np.ndarray:
    """Rows of ``frame`` equal to ``values`` in every listed column both have."""
    hit = np.ones(len(frame), dtype=bool)
    for c in columns:
        if c in frame.columns and c in values:
            hit &= np.array([_same(a, values[c]) for a in frame[c]])
    return hit


def _default_label(front: pd.DataFrame, pos: np.ndarray) -> dict[int, list[str]]:
    """The group's first usable default-setting point, labelled with its observed clock."""
    sub = front.iloc[pos]
    if "default_setting" not in sub:
        return {}
    usable = exclusion_reasons(sub, needed=[TIME, ENERGY]).isna().to_numpy()
    default = truthy(sub["default_setting"])
    for p in pos[default & usable]:
        clk = front["observed_sm_clock_mhz"].iat[p] if "observed_sm_clock_mhz" in front else None
        return {int(p): [f"default ({clk:.0f} MHz observed)" if _finite(clk) else "default"]}
    return {}


def _group_labels(front: pd.DataFrame, key: dict, pos: np.ndarray,
                  recs: pd.DataFrame | None) -> list[tuple[int, str, bool]]:
    """(position in ``front``, text, recommended) of the labelled points of one group."""
    parts = _default_label(front, pos)
    saving: dict[int, str] = {}
    base_i: int | None = None
    sub = front.iloc[pos]
    if recs is not None and len(recs) and "objective" in recs:
        for _, r in recs[_matching(recs, key, list(key))].iterrows():
            obj = r.get("objective")
            hit = _matching(sub, r, SETTING_COLUMNS)
            if (obj != "baseline" and obj not in LABELLED) or not hit.any():
                continue
            i = int(pos[np.flatnonzero(hit)[0]])
            if obj == "baseline":
                base_i = i
                if str(r.get("baseline")) != "default":
                    parts.setdefault(i, []).insert(0, "baseline: highest clock")
                continue
            parts.setdefault(i, []).append(
                LABELLED[obj].format(pct=float(r.get("max_slowdown_pct", 10.0))))
            if _finite(r.get("saving_pct")) and _finite(r.get("slowdown_pct")):
                saving[i] = (f"\n{signed_pct(-float(r['saving_pct']))} energy, "
                             f"{signed_pct(float(r['slowdown_pct']))} time")
    out = []
    stems = [lab.split("{")[0] for lab in LABELLED.values()]
    for i, ps in parts.items():
        clk = front[CLOCK].iat[i] if CLOCK in front else None
        # Several objectives at one point: a line per two, so the label stays narrow.
        head = ",\n".join(", ".join(ps[k:k + 2]) for k in range(0, len(ps), 2))
        if not ps[0].startswith("default") and _finite(clk):
            head += f": {clk:.0f} MHz"
        recommended = any(stem in head for stem in stems)
        out.append((i, head + ("" if i == base_i else saving.get(i, "")), recommended))
    return out


def label_texts(front: pd.DataFrame, recommendations: pd.DataFrame | None = None,
                by: Sequence[str] = DEFAULT_GROUP) -> pd.DataFrame:
    """The label of each point of a Pareto panel worth one, in the order they are placed.

    Those are the default setting, the baseline when it is not the default, and the
    recommendations of :data:`LABELLED`; several at one point share one label.

    Args:
        front: Settings (from :func:`analysis.aggregate_repeats`, usually with the columns of
            :func:`analysis.pareto_front`), with a unique index.
        recommendations: The frame of :func:`analysis.recommend`, or None for the default
            settings alone.
        by: The grouping columns.

    Returns:
        One row per label: ``row`` (the index label of the point in ``front``), ``text`` and
        ``recommended`` (the point wins an objective of :data:`LABELLED`: it gets a ring).
    """
    rows = []
    for key, pos in group_positions(front, list(by)):
        for i, text, recommended in _group_labels(front, key, pos, recommendations):
            rows.append((front.index[i], text, recommended))
    return pd.DataFrame(rows, columns=COLUMNS)
