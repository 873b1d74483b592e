"""Frameworks side by side: throughput, energy per item and memory at matched settings, with the
study's published figures beside ours.

The study this project was built from compares JAX, TensorFlow and PyTorch training the same
models on the same GPU. :func:`framework_table` puts our trials the same way: per workload (and
size, dtype, precision, GPU model), each framework's median throughput in the workload's unit,
energy per item (J per sample or token), largest peak device memory and NVML's used memory, over
the settings *every* framework of that workload ran with an ``ok`` result (so a framework that
only ran at low clocks is not compared with one that ran at the default). Beside each row, where
the study published a figure for that workload and framework, it is given as theirs
(:data:`STUDY_FIGURES`, with the framework's version and the board), never mixed into ours.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from analysis._frame import DEFAULT_GROUP, OK, SETTING_COLUMNS, is_missing


@dataclass(frozen=True)
class PublishedFigure:
    """One figure the study published, for one workload in one framework.

    Attributes:
        workload: our workload that computes what theirs did.
        framework: ``"jax"``, ``"tensorflow"`` or ``"pytorch"``.
        value: the figure, in ``unit``.
        unit: e.g. ``"samples/s"``.
        version: the framework and version they ran, e.g. ``"PyTorch 1.13"``.
        board: the GPU they ran on.
        what: what they measured, in a few words.
    """

    workload: str
    framework: str
    value: float
    unit: str
    version: str
    board: str
    what: str

    def label(self) -> str:
        """``"312 samples/s (theirs: PyTorch 1.13, A100, ResNet-50 training)"``."""
        return (f"{self.value:g} {self.unit} (theirs: {self.version}, {self.board}, "
                f"{self.what})")


STUDY_FIGURES: tuple[PublishedFigure, ...] = (
    PublishedFigure("resnet50_train", "jax", 345, "samples/s", "JAX 0.4.12", "A100",
                    "ResNet-50 training"),
    PublishedFigure("resnet50_train", "tensorflow", 287, "samples/s", "TensorFlow 2.10", "A100",
                    "ResNet-50 training"),
    PublishedFigure("resnet50_train", "pytorch", 312, "samples/s", "PyTorch 1.13", "A100",
                    "ResNet-50 training"),
)
"""The study's published throughput per framework (ResNet-50 training on an A100). Its other
figures are not of a workload we run as they did: TensorFlow's BERT at 12.4 seq/s (batch and
board not given beside it), and ViT-Large's memory (45.1 GB in JAX, 48.2 GB in TensorFlow; we
run ViT-B/16)."""

GROUP: list[str] = [c for c in DEFAULT_GROUP if c != "framework"]
"""What makes trials of different frameworks comparable: the same computation on one GPU model
(the report's groups, less the framework)."""


def matched_rows(df: pd.DataFrame, group: Sequence[str] = GROUP) -> pd.DataFrame:
    """The ``ok`` rows at settings every framework of their group ran ``ok``.

    Args:
        df: trial rows (with ``framework``, ``status`` and the group and setting columns).
        group: the columns within which frameworks are matched.

    Returns:
        The rows kept, with ``n_matched``: how many settings their group matched (a group of
        one framework keeps all its settings).
    """
    ok = df[df["status"] == OK]
    settings = [c for c in SETTING_COLUMNS if c in ok.columns]
    keys = [c for c in group if c in ok.columns]
    kept = []
    for _, g in ok.groupby(keys, sort=False, dropna=False):
        setting = g[settings].apply(_setting_key, axis=1) if settings else pd.Series("", g.index)
        common = set.intersection(*(set(s) for _, s in setting.groupby(g["framework"])))
        chosen = g[setting.isin(common)]
        kept.append(chosen.assign(n_matched=len(common)))
    return pd.concat(kept) if kept else ok.assign(n_matched=pd.Series(dtype=int))


def _setting_key(row: pd.Series) -> str:
    return "|".join("-" if is_missing(v) else str(v) for v in row)


def framework_table(
    df: pd.DataFrame, published: Sequence[PublishedFigure] = STUDY_FIGURES
) -> pd.DataFrame:
    """Each framework's throughput, energy per item and memory at matched settings, with the
    published figure for it where there is one.

    Args:
        df: trial rows (:func:`analysis.load`'s frame).
        published: the figures to put beside ours.

    Returns:
        One row per group (:data:`GROUP`) and framework: ``rate`` (median) and ``rate_unit``,
        ``energy_per_item_j`` (median), ``peak_memory_bytes``, ``peak_memory_per_item_bytes``
        and ``memory_used_after_bytes`` (largest), ``memory_source``, ``n_matched`` (settings),
        ``trials`` and ``published`` (the study's figure, labelled as theirs; None where it has
        none).
    """
    rows = matched_rows(df)
    theirs = {(p.workload, p.framework): p.label() for p in published}
    keys = [c for c in GROUP if c in rows.columns] + ["framework"]
    out = []
    for key, g in rows.groupby(keys, sort=False, dropna=False):
        numbers = {c: pd.to_numeric(g[c] if c in g else pd.Series(dtype=float), errors="coerce")
                   for c in (
            "rate", "energy_per_item_j", "peak_memory_bytes", "peak_memory_per_item_bytes",
            "memory_used_after_bytes")}
        named = dict(zip(keys, key, strict=True))
        out.append({
            **named,
            "rate": numbers["rate"].median(),
            "rate_unit": g["rate_unit"].iloc[0] if "rate_unit" in g else None,
            "energy_per_item_j": numbers["energy_per_item_j"].median(),
            "peak_memory_bytes": numbers["peak_memory_bytes"].max(),
            "peak_memory_per_item_bytes": numbers["peak_memory_per_item_bytes"].max(),
            "memory_used_after_bytes": numbers["memory_used_after_bytes"].max(),
            "memory_source": g["memory_source"].iloc[0] if "memory_source" in g else None,
            "n_matched": int(g["n_matched"].iloc[0]),
            "trials": len(g),
            "published": theirs.get((named.get("workload"), named["framework"])),
        })
    return pd.DataFrame(out)
