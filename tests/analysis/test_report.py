"""The report: every file, images of the asked size, one self-contained HTML, and the CLI."""

from __future__ import annotations

import sqlite3
import struct

import pytest

from analysis.report import main, write_report
from orchestrator.results.store import SCHEMA_VERSION, STORE_FILENAME, ResultStore

SIZE = (1200, 750)


def png_size(path) -> tuple[int, int]:
    data = path.read_bytes()[:24]
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


@pytest.fixture(scope="module")
def report(tmp_path_factory, make_rows):
    root = tmp_path_factory.mktemp("report")
    with ResultStore(root / "sweep") as store:
        store.put_meta("sweep", {"workload": ["gemm", "stencil"], "measure": {"repeats": 2}})
        store.put_meta("versions", {"jax": "0.10.2", "tensorflow": "2.21.0", "numpy": "2.4.6"})
        # 2 workloads x 2 frameworks x 8 clocks (+ the default setting), 2 repeats each.
        for row in make_rows(repeats=2):
            store.put(row)
    files = write_report(root / "sweep", root / "out", max_slowdown=0.10, image_size=SIZE)
    return root, files


def test_every_file_is_written_and_not_empty(report):
    _, files = report
    assert set(files) == {"pareto.png", "pareto.svg", "clocks.png", "report.md", "report.html",
                          "trials.csv", "front.csv", "recommendations.csv", "thresholds.csv"}
    for path in files.values():
        assert path.is_file() and path.stat().st_size > 0


def test_pngs_have_the_asked_pixel_size(report):
    _, files = report
    assert png_size(files["pareto.png"]) == SIZE
    assert png_size(files["clocks.png"]) == SIZE


def test_html_is_one_self_contained_file_with_images_and_tables(report):
    _, files = report
    html = files["report.html"].read_text(encoding="utf-8")
    assert html.count("data:image/png;base64,") == 2
    assert 'src="pareto.png"' not in html and "<table" in html
    for heading in ("Recommended settings", "Stability thresholds", "Library versions",
                    "Failed and invalid trials", "Devices", "Sweep configuration"):
        assert heading in html


def test_markdown_summarises_config_devices_savings_thresholds_and_versions(report):
    _, files = report
    md = files["report.md"].read_text(encoding="utf-8")
    assert "| measure.repeats | 2 |" in md
    assert "GPU-sim-0001" in md and "A100-SXM4-40GB" in md
    assert "min_energy_within_slowdown" in md and "energy saved (%)" in md
    assert "| 1185 | 1050 |" in md  # jax gemm: stable from 1185 MHz, fails at 1050 MHz
    assert "status=wrong" in md and "observed SM clock 600 MHz" in md
    assert "| jax | 0.10.2 |" in md and "| numpy | 2.4.6 |" in md
    assert "![" in md and "(pareto.png)" in md


def test_csvs_hold_every_trial_and_every_setting(report):
    import pandas as pd

    _, files = report
    assert len(pd.read_csv(files["trials.csv"])) == 2 * 2 * 9 * 2
    front = pd.read_csv(files["front.csv"])
    assert len(front) == 2 * 2 * 9 and front["on_front"].any()
    assert front.loc[front["status"] == "wrong", "on_front"].eq(False).all()


def test_main_writes_a_report_and_returns_0(report, capsys):
    root, _ = report
    assert main([str(root / "sweep"), "--out", str(root / "cli"), "--size", "640x400"]) == 0
    assert png_size(root / "cli" / "pareto.png") == (640, 400)
    assert "report.html" in capsys.readouterr().out


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("dvfs report: ")
    return err


def test_main_on_a_directory_without_a_store_exits_2(tmp_path, capsys):
    assert main([str(tmp_path)]) == 2
    assert str(tmp_path) in one_line_error(capsys)


def test_main_on_an_empty_store_exits_2(tmp_path, capsys):
    ResultStore(tmp_path).close()
    assert main([str(tmp_path)]) == 2
    assert "no trials" in one_line_error(capsys)


def test_main_on_a_newer_schema_exits_2(tmp_path, capsys):
    with ResultStore(tmp_path) as store:
        store.put({"trial_key": "a", "repeat": 0, "status": "ok"})
    with sqlite3.connect(tmp_path / STORE_FILENAME) as conn:
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    assert main([str(tmp_path)]) == 2
    assert f"version {SCHEMA_VERSION + 1}" in one_line_error(capsys)


def test_main_refuses_a_bad_option(tmp_path, capsys):
    assert main([str(tmp_path), "--size", "big"]) == 2
    assert main([str(tmp_path), "--max-slowdown", "-1"]) == 2


def test_a_sweep_that_has_just_started_still_gets_a_report(tmp_path):
    base = {"status": "ok", "valid": True, "workload": "gemm", "framework": "jax"}
    with ResultStore(tmp_path / "sweep") as store:  # left open: the sweep is still writing
        store.put({**base, "trial_key": "a", "repeat": 0, "time_per_iter_s": 0.10,
                   "energy_per_iter_j": 2.0, "sm_clock_max_mhz": 900})
        store.put({**base, "trial_key": "b", "repeat": 0, "time_per_iter_s": 0.08,
                   "energy_per_iter_j": 2.5, "sm_clock_max_mhz": 1200})
        store.put({**base, "trial_key": "c", "repeat": 0, "status": "crash", "valid": False,
                   "sm_clock_max_mhz": 600, "error": "Xid 79"})
        files = write_report(tmp_path / "sweep", tmp_path / "out", image_size=(640, 400))
    assert png_size(files["pareto.png"]) == (640, 400)
    md = files["report.md"].read_text(encoding="utf-8")
    assert "status=crash" in md and "1200 MHz" in md and "thresholds.csv" in files


def _report_md(tmp_path, rows) -> str:
    with ResultStore(tmp_path / "sweep") as store:
        for row in rows:
            store.put(row)
    files = write_report(tmp_path / "sweep", tmp_path / "out", image_size=(1000, 700))
    return files["report.md"].read_text(encoding="utf-8")


def test_a_sweep_on_the_simulated_gpu_says_so_first_and_names_what_it_planted(tmp_path, make_rows):
    rows = make_rows(repeats=1, workloads=("gemm",))
    for r in rows:
        r["config"] = {**r["config"], "device": {"backend": "sim", "scenario": "seed_claims"}}
    md = _report_md(tmp_path, rows)
    first = md.split("## Summary")[0]  # before any finding
    assert f"{len(rows)} of {len(rows)} trials ran on a simulated GPU" in first
    assert "A100-SXM4-40GB" in first and "not from hardware" in first
    assert "planted in the simulated GPUs (scenario seed_claims)" in first


def test_a_sweep_on_real_gpus_has_no_simulator_note(tmp_path, make_rows):
    rows = make_rows(repeats=1, workloads=("gemm",))
    for r in rows:
        r["backend"] = "nvml"
    md = _report_md(tmp_path, rows)
    assert "simulated" not in md and "planted" not in md


def test_not_measured_trials_are_listed_apart_and_a_later_attempt_replaces_one(tmp_path, make_rows):
    import csv

    rows = make_rows(repeats=1, workloads=("gemm",), frameworks=("jax",),
                     jax_fails_below_mhz=None)
    for r in rows:  # one job per setting, as real rows hash their settings
        r["config_hash"] = f"h-{r['trial_key']}"
    retried, unmeasured = rows[0], rows[1]
    earlier = {**retried, "attempt": 1, "status": "not_measured", "failed_by": "circumstances",
               "error": "the worker process died; not measured", "valid": False}
    rows[0] = {**retried, "attempt": 2}
    rows[1] = {**unmeasured, "status": "not_measured", "failed_by": "circumstances",
               "error": "not run: GPU 0 is lost", "valid": False}
    md = _report_md(tmp_path, [earlier, *rows])
    nm = md.split("## Not measured")[1]
    assert "1 trial row(s) measured nothing" in nm and "not run: GPU 0 is lost" in nm
    assert "the worker process died" not in md  # attempt 2 measured it: the old one is history
    assert "not_measured" not in md.split("## Failed and invalid trials")[1].split("## Not")[0]
    with open(tmp_path / "out" / "trials.csv", newline="") as f:
        stored = list(csv.DictReader(f))
    assert len(stored) == len(rows)  # each trial's latest attempt
    assert {(r["trial_key"], r["attempt"]) for r in stored if r["trial_key"] == retried[
        "trial_key"]} == {(retried["trial_key"], "2")}


def test_out_of_memory_trials_are_listed_apart_from_the_failures(tmp_path, make_rows):
    rows = make_rows(repeats=1, workloads=("gemm",), frameworks=("jax",),
                     jax_fails_below_mhz=None)
    rows[1] = {**rows[1], "status": "out_of_memory", "failed_by": "memory", "valid": False,
               "error": "not run: gpu: needs 20 GiB of device memory (...), 15 GiB free"}
    md = _report_md(tmp_path, rows)
    oom = md.split("## Out of memory")[1].split("\n## ")[0]
    assert "1 trial row(s) did not fit" in oom and "needs 20 GiB" in oom
    assert "out_of_memory" not in md.split("## Failed and invalid trials")[1].split("\n## ")[0]
