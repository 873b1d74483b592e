"""``dvfs report`` on bad input, through the ``dvfs`` command as a user runs it: one line on
stderr, exit code 2, no traceback, no report written."""

from __future__ import annotations

import sqlite3

import pytest
from report_support import dvfs_cli

from orchestrator.results.store import SCHEMA_VERSION, STORE_FILENAME, ResultStore


def refused(run, *needles: str) -> None:
    assert run.returncode == 2, (run.stdout, run.stderr)
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    assert lines[0].startswith("dvfs report: error: "), lines[0]
    assert "Traceback" not in run.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def newer_store(path):
    with ResultStore(path) as store:
        store.put({"trial_key": "a", "repeat": 0, "status": "ok"})
    with sqlite3.connect(path / STORE_FILENAME) as conn:
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")


@pytest.mark.parametrize(
    "make, needles",
    [
        pytest.param(lambda p: None, ["no results store", "{sweep}"], id="no-store"),
        pytest.param(lambda p: ResultStore(p).close(), ["no trials stored yet", "{sweep}"],
                     id="empty-store"),
        pytest.param(newer_store, [f"version {SCHEMA_VERSION + 1}", "upgrade", "{sweep}"],
                     id="newer-schema"),
        pytest.param(lambda p: (p / STORE_FILENAME).write_bytes(b"not a database at all" * 10),
                     ["{sweep}"], id="not-a-database"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, make, needles):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    make(sweep)
    run = dvfs_cli("report", str(sweep), cwd=tmp_path)
    refused(run, *(n.format(sweep=sweep) for n in needles))
    assert not (sweep / "report").exists()


def test_a_path_that_does_not_exist_is_one_line_and_exit_2(tmp_path):
    refused(dvfs_cli("report", str(tmp_path / "nope"), cwd=tmp_path), "no such file or directory")


@pytest.mark.parametrize("args", [[], ["DIR", "--size", "big"], ["DIR", "--max-slowdown", "-1"],
                                  ["DIR", "--bogus"]])
def test_bad_options_are_one_line_and_exit_2(tmp_path, args):
    run = dvfs_cli("report", *[str(tmp_path) if a == "DIR" else a for a in args], cwd=tmp_path)
    refused(run)


def test_an_out_that_is_a_file_is_one_line_and_exit_2(tmp_path):
    with ResultStore(tmp_path / "sweep") as store:
        store.put({"trial_key": "a", "repeat": 0, "status": "ok", "workload": "gemm",
                   "framework": "jax", "valid": True, "time_per_iter_s": 0.1,
                   "energy_per_iter_j": 2.0, "sm_clock_max_mhz": 900})
    (tmp_path / "taken").write_text("a file")
    refused(dvfs_cli("report", str(tmp_path / "sweep"), "--out", str(tmp_path / "taken"),
                     cwd=tmp_path), "cannot write the report", "taken")
