"""``scripts/chaos.py`` in its short form: 10 faults, each of 10 kinds once, on 2 sim GPUs (every
fault kind needs two at most: a lost GPU beside one that goes on; the full run uses 4).

One chaos run (a few minutes) serves the module: each fault kind has its own test of what that
fault must leave behind (its rows, the GPUs' settings, the journal), one test reads what the run
left on disk and in the process table itself (the stores, each simulated GPU's state, the
guard's journal, the processes), never the script's own verdict, and one holds the script's
ledger to the same targets: nothing lost, nothing stored twice, nothing left changed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from support import REPO

pytestmark = pytest.mark.slow

FAULTS = 10
SEED = 3
GPUS = 2


@pytest.fixture(scope="module")
def chaos(tmp_path_factory):
    """The short chaos run's result (``--json``), and its printed summary."""
    root = tmp_path_factory.mktemp("chaos")
    out = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "chaos.py"), "--faults", str(FAULTS),
         "--seed", str(SEED), "--gpus", str(GPUS), "--dir", str(root / "work"),
         "--json", str(root / "chaos.json")],
        capture_output=True, text=True, timeout=1800,
    )
    assert (root / "chaos.json").exists(), out.stdout[-3000:] + out.stderr[-3000:]
    result = json.loads((root / "chaos.json").read_text())
    result["stdout"], result["returncode"] = out.stdout, out.returncode
    return result


def faults_of(chaos, kind):
    found = [f for f in chaos["faults"] if f["kind"] == kind]
    if not found and kind in chaos["totals"]["kinds_not_run"]:
        pytest.skip(f"{kind} was not run here: {chaos['totals']['kinds_not_run'][kind]}")
    assert found, f"no {kind} fault in the run"
    return found


def rows_with(chaos, status):
    """How many rows of every sweep have this status."""
    return sum(s["statuses"].get(status, 0) for s in chaos["sweeps"])


def _processes_of(state_dir: Path) -> list[int]:
    """Live processes whose environment names this run's simulated machine."""
    marker = f"DVFS_SIM_STATE_DIR={state_dir}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            try:
                if marker in (proc / "environ").read_bytes().split(b"\0"):
                    found.append(int(proc.name))
            except OSError:  # gone meanwhile, or not ours to read
                pass
    return found


def test_what_the_run_left_behind_holds_every_trial_once_and_no_gpu_changed(chaos):
    from analysis import load
    from orchestrator.devices.sim.profile import load_profile
    from orchestrator.devices.sim.state import Machine
    from orchestrator.results.store import ResultStore
    from orchestrator.testing.chaos import (
        MAIN_CLOCKS,
        MAIN_WORKLOADS,
        SIDE_CLOCKS,
        SIDE_WORKLOADS,
    )

    root = Path(chaos["root"])
    grids = {"main": (MAIN_WORKLOADS, MAIN_CLOCKS), "side": (SIDE_WORKLOADS, SIDE_CLOCKS)}
    for sweep in chaos["sweeps"]:
        workloads, clocks = grids[sweep["role"]]
        with ResultStore(root / "stores" / Path(sweep["dir"]).name, readonly=True) as store:
            rows = store.rows()
        measured = Counter((r["workload"], int(r["sm_clock_max_mhz"])) for r in rows
                           if r["status"] != "not_measured")
        assert measured == Counter({(w, c): 1 for w in workloads for c in clocks}), sweep["dir"]
        # what a report reads (each trial's latest attempt, a not-measured trial its job
        # measured since on another GPU left out) holds no trial that measured nothing
        latest = load(root / "stores" / Path(sweep["dir"]).name)
        assert "not_measured" not in set(latest["status"]), sweep["dir"]
    machine = Machine(root / "sim")
    for i, gpu in enumerate(machine.gpus):
        s = machine.read(i)
        default_w = load_profile(gpu.profile).power_limit_default_w
        assert (s["locked_sm_mhz"], s["locked_mem_mhz"], s["offset_mhz"], s["lost"]) \
            == (None, None, 0, False), f"gpu {i}"
        assert abs(s["power_limit_w"] - default_w) < 0.5, f"gpu {i}"
    assert sorted((root / "sim" / "journal").glob("*.json")) == []
    assert _processes_of(root / "sim") == []


def test_the_run_meets_every_target_and_says_so(chaos):
    t = chaos["totals"]
    assert chaos["returncode"] == 0, chaos["stdout"][-3000:]
    assert chaos["targets_met"] is True
    assert t["faults"] == FAULTS and len(t["faults_by_kind"]) + len(t["kinds_not_run"]) == 10
    assert t["expected"] == t["stored_once"] > 0
    assert t["lost"] == t["duplicated"] == t["unexpected"] == t["not_measured_open"] == 0
    assert t["unexplained_failed_rows"] == []
    assert t["failed_rows"] <= t["failed_rows_faults_could_make"]
    assert t["gpus_left_changed"] == [] and t["journal_entries_left"] == []
    assert t["overlapping_trials"] == 0 and t["processes_left"] == 0
    assert t["faults_without_effect"] == []
    summary = chaos["stdout"]
    assert f"measured exactly once {t['stored_once']} | lost 0 | duplicated 0" in summary
    assert "left not measured 0" in summary
    assert "targets met" in summary


def test_a_killed_driver_is_restored_by_dvfs_restore_and_resumed(chaos):
    for f in faults_of(chaos, "driver_sigkill"):
        assert f["driver_rc"] == -9 and f["workers_gone"]
        assert f["clean_after_restore"] in (True, None)  # None: another sweep held the GPUs
        assert f["restore"].startswith(("nothing to restore", "restored"))
    # resumed, not started over
    assert chaos["totals"]["driver_starts"] > len(chaos["sweeps"])


def test_a_terminated_driver_restores_every_gpu_itself_and_exits_143(chaos):
    for f in faults_of(chaos, "driver_sigterm"):
        assert f["driver_rc"] == 143
        assert f["journal_left_by_driver"] == 0  # before `dvfs restore` ran
        assert f["ok"]


def test_a_ctrl_c_in_the_drivers_terminal_restores_every_gpu_and_exits_130_in_time(chaos):
    from orchestrator.testing.chaos import STOP_BOUND_S

    for f in faults_of(chaos, "driver_sigint"):
        assert f["driver_rc"] == 130
        assert f["journal_left_by_driver"] == 0  # before `dvfs restore` ran
        assert f["stop_s"] is not None and f["stop_s"] <= STOP_BOUND_S
        assert f["ok"]
    assert "driver_sigint: exited" in chaos["stdout"]


def test_a_killed_worker_is_replaced_and_its_trial_at_most_is_a_crash(chaos):
    kills = faults_of(chaos, "worker_sigkill")
    assert all(f["ok"] for f in kills)
    could_crash = len(kills) + sum(f["kind"] == "kernel_crash" for f in chaos["faults"])
    assert rows_with(chaos, "crash") <= could_crash


def test_a_worker_killed_outside_its_kernel_calls_leaves_no_crash_and_a_resume_measures(chaos):
    kills = faults_of(chaos, "worker_idle")
    assert all(f["ok"] for f in kills)  # replaced, and no crash row names the killed worker
    # whatever a kill cost was measured by a resume since (a job whose row was never written,
    # the driver killed before the worker's replacement reported, is simply run again)
    t = chaos["totals"]
    assert t["not_measured_open"] == 0 and t["not_measured_retried"] <= t["not_measured_rows"]
    assert t["rows_by_status"].get("not_measured", 0) == t["not_measured_rows"]


def test_a_hung_kernel_is_a_timeout_row_and_the_sweep_goes_on(chaos):
    hangs = faults_of(chaos, "kernel_hang")
    assert all(f["fired"] and f["ok"] for f in hangs)
    assert rows_with(chaos, "timeout") == len(hangs)


def test_a_kernel_that_kills_its_process_is_a_crash_row(chaos):
    crashes = faults_of(chaos, "kernel_crash")
    assert all(f["fired"] and f["ok"] for f in crashes)
    assert rows_with(chaos, "crash") >= len(crashes)


def test_a_lost_gpu_is_retired_then_reset_and_restored(chaos):
    for f in faults_of(chaos, "gpu_lost"):
        assert f["ok"]
        assert f["restore"].startswith(("nothing to restore", "restored"))
    assert rows_with(chaos, "device_error") <= len(faults_of(chaos, "gpu_lost"))
    assert not [g for g in chaos["totals"]["gpus_left_changed"] if "lost" in g]


def test_a_full_disk_stops_the_sweep_in_one_line_and_a_resume_loses_nothing(chaos):
    for f in faults_of(chaos, "disk_full"):
        assert f["driver_rc"] == 4 and f["journal_left_by_driver"] == 0 and f["ok"]


def test_a_second_sweep_into_the_same_directory_is_refused_and_another_one_queues(chaos):
    for f in faults_of(chaos, "two_sweeps"):
        assert f["same_dir_rc"] == 2 and f["ok"]
    sides = [s for s in chaos["sweeps"] if s["role"] == "side"]
    assert sides
    for s in sides:  # it ran to its end: each of its jobs stored once, none left unmeasured
        assert s["stored_once"] == s["expected"] and not s["lost"], s
        assert not s["not_measured_open"], s
        # It shares the GPUs, so a fault struck while it queues may fail one of its trials (a
        # lost GPU's trial is a device_error whichever sweep it belongs to) or stop one that a
        # resume then measures; such a row is a fault's (the ledger test holds every failed row
        # to a fault's sign), never a queueing's.
        allowed = {"ok", "timeout", "crash", "device_error", "not_measured"}
        assert set(s["statuses"]) <= allowed, s["statuses"]
        assert s["statuses"].get("ok", 0) >= s["expected"] - sum(
            1 for f in chaos["faults"] if f["kind"] in ("kernel_hang", "kernel_crash", "gpu_lost")
        ), s["statuses"]
    assert chaos["totals"]["overlapping_trials"] == 0  # the two sweeps queued per GPU


def test_a_signal_that_lands_in_the_drivers_own_exit_is_a_miss_struck_again():
    """A signal in the driver's last moments (after its command closed its workers and Ray, while
    Python tears its modules down with the default handlers back) kills it as it kills any
    program: nothing was left to stop, so the fault struck nothing and is struck again. A driver
    that dies of the signal mid-sweep (no summary said) is judged, and fails."""
    import signal

    from orchestrator.testing.chaos import had_ended

    said = ("ray_gpus: starting 2 worker(s), one per GPU\n"
            "ray_gpus: 9 trial(s) on 2 GPU(s) in 20.1 s (9 ok); results in d; "
            "report: dvfs report d\n")
    stopped = said + "dvfs sweep: interrupted (Ctrl-C); the trials in flight were stopped\n"
    assert had_ended(0, signal.SIGINT, "")
    assert had_ended(-signal.SIGINT, signal.SIGINT, said)
    assert had_ended(-signal.SIGTERM, signal.SIGTERM, said)
    assert not had_ended(-signal.SIGINT, signal.SIGINT, said.splitlines()[0])  # mid-sweep
    assert not had_ended(130, signal.SIGINT, stopped)  # it handled the signal: judged
    assert not had_ended(-signal.SIGINT, signal.SIGINT, stopped)
    assert not had_ended(-signal.SIGKILL, signal.SIGINT, said)  # not the signal it was sent
    assert not had_ended(None, signal.SIGINT, said)  # still running
