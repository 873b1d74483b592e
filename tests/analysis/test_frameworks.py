"""Frameworks side by side at matched settings, with the study's figures labelled as theirs."""

from __future__ import annotations

import pandas as pd
import pytest

from analysis import STUDY_FIGURES, framework_table
from analysis._doc import Doc
from analysis._sections import ReportData, memory

RATES = {"jax": 300.0, "tensorflow": 250.0, "pytorch": 280.0}


def _rows(clocks_by_framework, failed=()):
    """ResNet-50 rows: samples/s that fall with the clock, one repeat per setting."""
    rows = []
    for framework, clocks in clocks_by_framework.items():
        for clock in clocks:
            scale = 1.0 if clock is None else clock / 1410
            rows.append({
                "workload": "resnet50_train", "size": "tiny", "dtype": "float32",
                "precision": "default", "device_name": "A100-SXM4-40GB",
                "framework": framework, "sm_clock_max_mhz": clock,
                "default_setting": clock is None,
                "status": "wrong" if (framework, clock) in failed else "ok",
                "rate": RATES[framework] * scale, "rate_unit": "samples/s",
                "energy_per_item_j": 0.5 / scale, "peak_memory_bytes": 30 * 2**30,
                "peak_memory_per_item_bytes": 30 * 2**30 / 256,
                "memory_used_after_bytes": 31 * 2**30,
                "memory_source": "sim model: footprint at sim_size",
            })
    return pd.DataFrame(rows)


def test_each_framework_is_taken_only_at_the_settings_every_framework_ran():
    df = _rows({"jax": [None, 810, 1110], "tensorflow": [None, 810, 1110],
                "pytorch": [None, 1110]})
    table = framework_table(df).set_index("framework")
    assert list(table.index) == ["jax", "tensorflow", "pytorch"]
    assert (table["n_matched"] == 2).all() and (table["trials"] == 2).all()
    # The median of the default (the full rate) and 1110 MHz, never 810 MHz.
    for framework, rate in RATES.items():
        assert table.loc[framework, "rate"] == pytest.approx(rate * (1 + 1110 / 1410) / 2)


def test_a_setting_a_framework_failed_at_is_not_matched():
    df = _rows({"jax": [None, 1110], "pytorch": [None, 1110]}, failed={("jax", 1110)})
    table = framework_table(df).set_index("framework")
    assert (table["n_matched"] == 1).all()
    assert table.loc["pytorch", "rate"] == RATES["pytorch"]


def test_the_studys_figures_stand_beside_ours_labelled_as_theirs():
    table = framework_table(_rows({f: [None] for f in RATES})).set_index("framework")
    assert table.loc["pytorch", "published"] == (
        "312 samples/s (theirs: PyTorch 1.13, A100, ResNet-50 training)")
    assert table.loc["jax", "published"].startswith("345 samples/s (theirs: JAX 0.4.12")
    assert table.loc["tensorflow", "published"].startswith("287 samples/s (theirs: TensorFlow")
    assert {p.framework for p in STUDY_FIGURES} == {"jax", "tensorflow", "pytorch"}
    # Ours are ours: the published figure is a label, never a number in our columns.
    assert table.loc["pytorch", "rate"] == RATES["pytorch"]


def test_a_workload_the_study_did_not_publish_has_no_published_figure():
    df = _rows({"pytorch": [None]}).assign(workload="bert_train")
    assert framework_table(df)["published"].isna().all()


def test_the_report_shows_theirs_beside_ours_and_a_dash_where_they_published_nothing():
    df = pd.concat([_rows({f: [None, 1110] for f in RATES}),
                    _rows({"pytorch": [None]}).assign(workload="bert_train")])
    doc = Doc()
    memory(doc, ReportData(df, [], pd.DataFrame(), pd.DataFrame(), pd.DataFrame(), 0.1, {}))
    text = doc.markdown()
    assert "## Frameworks side by side" in text
    (line,) = [ln for ln in text.splitlines() if ln.startswith("| resnet50_train | pytorch |")]
    assert "| 2 |" in line and line.endswith("| 312 samples/s (theirs: PyTorch 1.13, A100, "
                                             "ResNet-50 training) |")
    (bert,) = [ln for ln in text.splitlines() if ln.startswith("| bert_train |")]
    assert bert.endswith("| - |") and "nan" not in bert
