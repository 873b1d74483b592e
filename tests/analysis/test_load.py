"""Loading stores into a frame and exporting it."""

from __future__ import annotations

import pandas as pd
import pytest

from analysis import ROW_COLUMNS, EmptyStoreError, export, load
from orchestrator.errors import UserError
from orchestrator.results.store import ResultStore, StoreNotFoundError


def write(sweep_dir, rows):
    with ResultStore(sweep_dir) as store:
        for r in rows:
            store.put(r)


def test_load_reads_many_stores_and_says_where_each_row_came_from(tmp_path, make_rows):
    rows = make_rows(workloads=("gemm",), frameworks=("jax",), clocks=[900, 1410], repeats=1,
                     with_default=False)
    write(tmp_path / "multirun" / "0", rows[:1])
    write(tmp_path / "multirun" / "1", rows[1:])
    df = load([tmp_path / "multirun", tmp_path / "multirun" / "0"])  # 0 is found twice: once
    assert len(df) == 2
    assert sorted(df["sweep_dir"]) == [str(tmp_path / "multirun" / "0"),
                                       str(tmp_path / "multirun" / "1")]
    assert list(df.columns[: len(ROW_COLUMNS)]) == ROW_COLUMNS
    assert df["throttle_reasons"].iat[0] == []


def test_load_fills_missing_columns_and_can_drop_invalid_rows(tmp_path):
    write(tmp_path, [{"trial_key": "a", "repeat": 0, "status": "ok", "valid": True},
                     {"trial_key": "b", "repeat": 0, "status": "ok", "valid": False}])
    df = load(tmp_path)
    assert set(ROW_COLUMNS) <= set(df.columns) and df["energy_j"].isna().all()
    assert load(tmp_path, include_invalid=False)["trial_key"].tolist() == ["a"]


def test_an_empty_store_and_a_missing_one_are_clear_errors(tmp_path):
    ResultStore(tmp_path / "empty").close()
    with pytest.raises(EmptyStoreError, match="no trials stored yet"):
        load(tmp_path / "empty")
    (tmp_path / "nothing").mkdir()
    with pytest.raises(StoreNotFoundError, match=str(tmp_path / "nothing")):
        load(tmp_path / "nothing")


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_export_writes_the_table_by_suffix(tmp_path, make_rows, suffix):
    write(tmp_path / "s", make_rows(workloads=("gemm",), frameworks=("jax",), clocks=[900],
                                    repeats=2, with_default=True))
    df = load(tmp_path / "s")
    path = export(df, tmp_path / f"out{suffix}")
    back = pd.read_csv(path) if suffix == ".csv" else pd.read_parquet(path)
    assert len(back) == len(df) and list(back.columns) == list(df.columns)
    assert back["config"].iat[0].startswith("{")  # dicts as JSON text
    with pytest.raises(UserError, match=".csv or .parquet"):
        export(df, tmp_path / "out.xlsx")


def test_import_analysis_stays_light():
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    code = ("import sys, analysis, analysis.plots, analysis.report; "
            "print(sorted(m for m in ('matplotlib', 'jax', 'tensorflow', 'ray') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"


def _trial(key, attempt, status, started_at, config_hash="h1", gpu="GPU-a"):
    return {"trial_key": key, "repeat": 0, "attempt": attempt, "status": status,
            "started_at": started_at, "config_hash": config_hash, "device_uuid": gpu,
            "workload": "gemm", "framework": "jax"}


def test_load_gives_each_trials_latest_attempt_unless_asked_for_all(tmp_path):
    write(tmp_path, [
        _trial("k1", 1, "not_measured", 1.0), _trial("k1", 2, "ok", 2.0),  # retried, same GPU
        _trial("k2", 1, "crash", 1.0, "h2"),
        # placement=any: the job measured nothing on GPU a, then was measured on GPU b
        _trial("k3a", 1, "not_measured", 1.0, "h3", "GPU-a"), _trial("k3b", 1, "ok", 2.0, "h3"),
        # and one measured nothing after its last measurement: it stays
        _trial("k4a", 1, "ok", 1.0, "h4"), _trial("k4b", 1, "not_measured", 2.0, "h4", "GPU-b"),
    ])
    latest = load(tmp_path)
    assert sorted(zip(latest["trial_key"], latest["attempt"], latest["status"])) == [
        ("k1", 2, "ok"), ("k2", 1, "crash"), ("k3b", 1, "ok"), ("k4a", 1, "ok"),
        ("k4b", 1, "not_measured")]
    assert len(load(tmp_path, attempts="all")) == 7
    with pytest.raises(UserError, match="attempts='first'"):
        load(tmp_path, attempts="first")


def test_rows_from_before_attempts_read_as_first_attempts_with_who_failed(tmp_path):
    write(tmp_path, [{"trial_key": "old", "repeat": 0, "status": "crash"}])
    df = load(tmp_path)
    assert (df["attempt"].iat[0], df["failed_by"].iat[0]) == (1, "setting")
