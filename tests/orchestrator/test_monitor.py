"""`dvfs monitor [OVERRIDES] -- CMD`: a command measured at the settings it finds, on a simulated
A100, in subprocesses as a user runs it: one row stored (and read by `dvfs report`), a Ctrl-C
that keeps the row and restores nothing, the program's own windows and result, its exit status,
and the mistakes refused in one line."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from support import DVFS

from orchestrator.results.store import ResultStore

ROOT = Path(__file__).resolve().parents[2]


def env_for(tmp_path):
    return {**os.environ, "DVFS_SIM_STATE_DIR": str(tmp_path / "sim")}


def dvfs(tmp_path, *args, timeout=300):
    return subprocess.run([*DVFS, *args], cwd=tmp_path, env=env_for(tmp_path),
                          capture_output=True, text=True, timeout=timeout)


def rows_of(directory):
    with ResultStore(directory, readonly=True) as store:
        return store.rows()


def sim_settings(tmp_path):
    """The simulated GPU's settings as its driver holds them, and the guard's journal."""
    from orchestrator.devices.sim.state import Machine

    (machine,) = [Machine(p.parent) for p in (tmp_path / "sim").rglob("machine.json")]
    state = machine.read(0)
    journal = list((machine.state_dir / "journal").glob("*.json"))
    return state["locked_sm_mhz"], state["locked_mem_mhz"], state["power_limit_w"], journal


def test_a_monitored_command_prints_its_time_energy_and_power_and_stores_one_row(tmp_path):
    store = tmp_path / "store"
    out = dvfs(tmp_path, "monitor", "device=sim", f"store_dir={store}", "--",
               "python", "-c", "import time; time.sleep(1.2); print(42)")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[0] == "42"  # the command's own output passes through
    said = re.fullmatch(r"dvfs monitor: python -c 'import time; time\.sleep\(1\.2\); "
                        r"print\(42\)' exited 0 after (\d+\.\d+) s", lines[1])
    assert said, lines[1]
    gpu = re.fullmatch(r"  gpu0 NVIDIA A100-SXM4-40GB: (\d+\.\d+) s \(simulated GPU time\), "
                       r"\S+ J, \S+ W average", lines[2])
    assert gpu, lines[2]
    # at least the command's sleep; how much more is the machine's load (a Python start)
    assert float(said[1]) >= 1.2 and float(gpu[1]) >= 1.2
    assert float(gpu[1]) == pytest.approx(float(said[1]), rel=0.05)  # as the row holds them
    (row,) = rows_of(store)
    assert (row["status"], row["exit_code"], row["workload"]) == ("ok", 0, "python")
    assert row["time_s"] == pytest.approx(row["program_wall_s"], rel=0.05)
    assert row["energy_j"] == pytest.approx(row["avg_power_w"] * row["time_s"])
    assert f"{row['energy_j']:.4g} J, {row['avg_power_w']:.4g} W average" in lines[2]
    assert row["work_source"] == "busy_wall_time" and row["valid"]
    assert row["config"]["device"]["observe_only"] is True
    locked_sm, locked_mem, limit_w, journal = sim_settings(tmp_path)
    assert (locked_sm, locked_mem, limit_w, journal) == (None, None, 400.0, [])
    report = dvfs(tmp_path, "report", str(store), "--out", str(tmp_path / "report"))
    assert report.returncode == 0, report.stderr
    assert "python" in (tmp_path / "report" / "report.md").read_text()


def test_a_ctrl_c_stops_the_command_keeps_its_row_and_restores_nothing(tmp_path):
    store, started = tmp_path / "store", tmp_path / "started"
    code = (f"import pathlib, time\npathlib.Path({str(started)!r}).touch()\n"
            "try:\n    time.sleep(60)\nfinally:\n    print('stopped cleanly', flush=True)")
    proc = subprocess.Popen([*DVFS, "monitor", "device=sim", f"store_dir={store}", "--",
                             "python", "-c", code], cwd=tmp_path, env=env_for(tmp_path),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not started.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)  # to dvfs alone: it stops the command itself
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "stopped cleanly" in stdout  # the command got SIGINT and ran its finally block
    assert stderr.strip().splitlines()[-1] == (
        "dvfs monitor: interrupted (Ctrl-C); the command was stopped and its row kept "
        "(nothing was set: nothing to restore)")
    assert "was stopped (SIGINT) after" in stdout
    (row,) = rows_of(store)
    assert (row["status"], row["failed_by"], row["exit_code"]) == ("interrupted",
                                                                   "circumstances", -2)
    assert row["time_s"] >= 0.5 and row["energy_j"] > 0
    locked_sm, locked_mem, limit_w, journal = sim_settings(tmp_path)
    assert (locked_sm, locked_mem, limit_w, journal) == (None, None, 400.0, [])


def test_a_monitored_program_that_uses_the_api_leaves_its_windows_and_result(tmp_path):
    store = tmp_path / "store"
    out = dvfs(tmp_path, "monitor", "device=sim", "workload.sim_scale=4096",
               f"store_dir={store}", "--", "python", str(ROOT / "examples" / "train_mlp.py"),
               "--steps", "30")
    assert out.returncode == 0, out.stderr
    (row,) = rows_of(store)
    assert row["workload"] == "train_mlp" and row["status"] == "ok"
    assert [w["name"] for w in row["program_windows"]] == ["train"]
    assert set(row["result"]) == {"loss", "accuracy"}
    assert row["work_source"] == "xla_cost_analysis" and row["iterations"] == 30
    train = row["program_windows"][0]
    assert row["time_s"] > train["time_s"]  # the whole run: the first (compiling) step too
    assert row["items"] == 30 * 128 * 4096  # the run's charged calls' samples


def test_a_failing_command_is_a_crash_row_and_its_status_is_monitors(tmp_path):
    store = tmp_path / "store"
    out = dvfs(tmp_path, "monitor", "device=sim", f"store_dir={store}", "--",
               "python", "-c", "raise SystemExit(3)")
    assert out.returncode == 3
    (row,) = rows_of(store)
    assert (row["status"], row["exit_code"]) == ("crash", 3)
    assert row["error"] == "the command exited with status 3"


@pytest.mark.parametrize("args, message", [
    (["device=sim", "device.sm_clock_mhz=1110", "--", "python", "-c", "pass"],
     "dvfs monitor: error: dvfs monitor sets nothing (it measures the command at the current "
     "settings): drop device.sm_clock_mhz, or use dvfs sweep"),
    (["device=sim", "python"],
     "dvfs monitor: error: dvfs monitor needs the command after --: dvfs monitor [OVERRIDES] "
     "-- python train.py"),
    (["device=sim", "--", "no-such-program"],
     "dvfs monitor: error: no-such-program: no such program (on PATH, or in {cwd})"),
])
def test_a_bad_monitor_command_is_one_line_exit_2_before_anything_runs(tmp_path, args, message):
    out = dvfs(tmp_path, "monitor", f"store_dir={tmp_path / 'store'}", *args)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert out.stderr.strip().splitlines() == [message.format(cwd=tmp_path)]
    assert not (tmp_path / "store").exists() and not (tmp_path / "sim").exists()
