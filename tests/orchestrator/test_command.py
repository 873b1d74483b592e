"""A user's program as a trial (``workload=command``): its statuses in this process on the sim
(crash, timeout, busy time for a program that declared nothing, the GPU put back), its result
against the default setting's, and ``examples/train_mlp.py`` through ``dvfs sweep`` as a user
runs it: a grid over three clocks and both frameworks on the ray_gpus launcher with a planted
threshold (and its resume), the stability search that finds that threshold (basic launcher),
and the same commands on ``device=cpu``."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import DVFS
from test_cpu_sweep import FakeRapl

from orchestrator.config import compose
from orchestrator.devices import journal_dir, open_backend
from orchestrator.errors import UserError
from orchestrator.jobs.job import JobSpec
from orchestrator.measuring.command import compare_results
from orchestrator.measuring.guard import SettingsGuard
from orchestrator.measuring.journal import Journal
from orchestrator.measuring.trial import TrialContext, run_trial
from orchestrator.results.store import ResultStore

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = str(ROOT / "examples" / "train_mlp.py")
STEPS = 60  # 59 in the window: 1.4 s of the A100's time at sim_scale 4096 (14 counter updates)
ARGV = f"workload.argv=[python,{EXAMPLE},--framework,${{framework.name}},--steps,{STEPS}]"
QUICK = ["measure=quick", "measure.settle_s=0", "quiet=true", "workload=command", ARGV,
         "workload.sim_scale=4096"]
PLANTED = "device.planted_thresholds={0:{train_step:1110}}"


def dvfs(tmp_path, *args, env=None, timeout=900):
    env = {**os.environ, "DVFS_SIM_STATE_DIR": str(tmp_path / "sim"), **(env or {})}
    return subprocess.run([*DVFS, *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=timeout)


def rows_of(directory: Path) -> list[dict]:
    with ResultStore(directory, readonly=True) as store:
        return store.rows()


# --- in this process: one trial of a small program ----------------------------------------------
@pytest.fixture
def program_trial(tmp_path):
    """program_trial(code, *overrides) -> (row, device): one trial of ``python -c code`` on a
    fresh simulated A100, its guard closed after."""
    opened = []

    def run(code: str, *overrides: str):
        cfg = compose(["workload=command", "workload.argv=[python]", "measure=quick",
                       "measure.settle_s=0", f"device.state_dir={tmp_path / 'sim'}", *overrides])
        cfg.workload.argv = ["python", "-c", code]
        job = JobSpec.from_config(cfg)
        backend = open_backend(cfg.device)
        device = backend.device(0)
        guard = SettingsGuard(device, Journal(journal_dir(cfg.device))).__enter__()
        opened.append((backend, guard))
        (row,) = run_trial(TrialContext(device=device, guard=guard, kernels=None), job)
        return row, device, journal_dir(cfg.device)

    yield run
    for backend, guard in opened:
        guard.close()
        backend.close()


def test_a_program_that_exits_non_zero_is_a_crash_with_its_output_and_the_gpu_put_back(
        program_trial):
    row, device, journal = program_trial("import sys; print('out of data'); sys.exit(3)",
                                         "device.sm_clock_mhz=1110")
    assert row["status"] == "crash" and row["failed_by"] == "setting"
    assert row["exit_code"] == 3 and not row["valid"]
    assert "exited with status 3" in row["error"] and "out of data" in row["error"]
    assert row["phase_compare_s"] > 0  # its reference run at the default setting came first
    assert device.settings().sm_clock_locked_mhz is None
    assert not list(journal.glob("*.json"))


def test_a_program_past_its_limit_is_stopped_and_is_a_timeout(program_trial):
    row, device, _ = program_trial("import time; time.sleep(60)", "workload.timeout_s=1",
                                   "measure.timeout_s=10")
    assert row["status"] == "timeout"
    assert "ran past workload.timeout_s=1 s and was stopped" in row["error"]
    assert 1 <= row["program_wall_s"] < 8 and row["exit_code"] < 0  # SIGTERM ended it


def test_a_program_that_never_uses_the_api_is_busy_on_the_sim_for_its_wall_time(program_trial):
    row, _, _ = program_trial("import time; time.sleep(1.2)")
    assert row["status"] == "ok" and row["valid"], row["invalid_reason"]
    assert row["work_source"] == "busy_wall_time"
    assert "never used the dvfs API" in row["work_note"]
    assert row["time_s"] == pytest.approx(row["program_wall_s"], rel=0.02)
    assert row["energy_counter_updates"] >= 10 and row["energy_j"] > 60 * row["time_s"]
    assert row["iterations"] == 1 and row["result"] is None and row["program_windows"] == []


def test_a_program_that_cannot_start_is_refused_in_one_line_before_any_device(tmp_path):
    with pytest.raises(UserError, match="no-such-program: no such program"):
        JobSpec.from_config(compose(["workload=command", "workload.argv=[no-such-program]"]))
    with pytest.raises(UserError, match=r"workload=command needs workload.argv=\[program"):
        JobSpec.from_config(compose(["workload=command"]))
    with pytest.raises(UserError, match="at most half of measure.timeout_s=600"):
        JobSpec.from_config(compose(["workload=command", "workload.argv=[python]",
                                     "workload.timeout_s=400"]))
    out = dvfs(tmp_path, "sweep", "workload=command", "workload.argv=[./train.py]",
               f"hydra.run.dir={tmp_path / 'run'}", timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        f"dvfs sweep: error: ./train.py: no such program (on PATH, or in {tmp_path})"]
    assert not (tmp_path / "sim").exists()  # no simulated machine was even made


def test_a_result_is_judged_entry_by_entry_against_the_default_settings():
    ok = compare_results({"loss": 1.0005, "name": "mlp"}, {"loss": 1.0, "name": "mlp"},
                         1e-3, 0.0)
    assert ok.ok and ok.rel_error == pytest.approx(5e-4) and ok.compared == 2
    moved = compare_results({"loss": 1.01}, {"loss": 1.0}, 1e-3, 0.0)
    assert not moved.ok and "loss=1.01 (default setting: 1)" in moved.reason
    assert compare_results(2.0, 1.0, 0.0, 1.0).ok  # within atol
    nan = compare_results({"loss": float("nan")}, {"loss": 1.0}, 1e6, 1e6)
    assert not nan.ok and nan.nonfinite == 1
    assert not compare_results({}, {"loss": 1.0}, 1e-3, 0.0).ok  # a key gone
    assert not compare_results("b", "a", 1e-3, 0.0).ok


# --- the worked example through `dvfs sweep` ------------------------------------------------------
@pytest.mark.slow
def test_the_example_over_three_clocks_and_two_frameworks_on_ray_with_a_planted_threshold(
        tmp_path):
    """Energy per sample and the reported loss in every row; below the planted threshold the
    loss moved (wrong), at and above it the loss is the default setting's; a second run of the
    same command resumes (nothing runs again)."""
    sweep = tmp_path / "grid"
    args = ["sweep", "-m", *QUICK, "framework=jax,pytorch", "device.sm_clock_mhz=810,1110,1410",
            PLANTED, f"hydra.sweep.dir={sweep}", "hydra.launcher.progress=false"]
    out = dvfs(tmp_path, *args)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "ray_gpus: starting 1 worker(s)" in out.stderr
    rows = rows_of(sweep)
    by = {(r["framework"], r["sm_clock_max_mhz"]): r for r in rows}
    assert sorted(by) == [(fw, c) for fw in ("jax", "pytorch") for c in (810, 1110, 1410)]
    for (framework, clock), r in by.items():
        assert r["workload"] == "train_mlp" and r["rate_unit"] == "samples/s" and r["valid"]
        assert r["items"] == (STEPS - 1) * 128 * 4096 and r["iterations"] == STEPS - 1
        assert r["energy_per_item_j"] == pytest.approx(r["energy_j"] / r["items"])
        assert r["program_windows"][0]["name"] == "train" and r["exit_code"] == 0
        assert r["work_source"] == {"jax": "xla_cost_analysis",
                                    "pytorch": "torch_dispatch_ops"}[framework]
        assert set(r["result"]) == {"loss", "accuracy"}
        assert r["status"] == ("wrong" if clock == 810 else "ok"), (framework, clock, r["error"])
        if clock > 810:
            assert r["result"] == r["reference_result"] and r["rel_error"] == 0
    assert "loss=" in by[("jax", 810)]["error"]
    # the same initial weights and data: both frameworks reach the same loss
    assert by[("jax", 1410)]["result"]["loss"] == pytest.approx(
        by[("pytorch", 1410)]["result"]["loss"], rel=1e-4)
    # a lower clock: less power, more time per sample on this compute-bound step
    jax_rows = [by[("jax", c)] for c in (1110, 1410)]
    assert jax_rows[0]["avg_power_w"] < jax_rows[1]["avg_power_w"]
    again = dvfs(tmp_path, *args)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "all 6 trial(s) already stored (resume)" in again.stderr
    assert len(rows_of(sweep)) == 6


@pytest.mark.slow
def test_the_stability_search_finds_the_clock_below_which_the_examples_loss_moves(tmp_path):
    sweep = tmp_path / "stability"
    out = dvfs(tmp_path, "sweep", "-m", "hydra/sweeper=stability", "hydra/launcher=basic",
               *QUICK, "framework=jax", PLANTED, "hydra.sweeper.confirm_iterations=100",
               f"hydra.sweep.dir={sweep}")
    assert out.returncode == 0, out.stderr[-3000:]
    with open(sweep / "thresholds.csv", newline="") as f:
        (found,) = list(csv.DictReader(f))
    assert (found["workload"], found["framework"]) == ("train_mlp", "jax")
    assert (float(found["stable_value"]), float(found["failing_value"])) == (1110, 1095)
    assert found["confirmed"] == "True" and int(found["iterations_at_stable"]) >= 100
    assert "stable at 1110 MHz" in out.stdout
    rows = rows_of(sweep)
    assert all(r["status"] in ("wrong", "crash") for r in rows if r["sm_clock_max_mhz"] < 1110)
    assert all(r["status"] == "ok" for r in rows if r["sm_clock_max_mhz"] >= 1110)


@pytest.mark.slow
def test_the_example_runs_on_the_cpu_with_the_same_commands(tmp_path):
    """device=cpu: real time, energy from the (here fake) RAPL counter; nothing to set, so each
    trial is its own reference."""
    sweep = tmp_path / "cpu"
    with FakeRapl(tmp_path / "powercap", watts=20.0, range_uj=262_143_328_850) as rapl:
        out = dvfs(tmp_path, "sweep", "-m", "hydra/launcher=basic", *QUICK,
                   "framework=jax,pytorch", "device=cpu",
                   f"device.powercap_root={tmp_path / 'powercap'}",
                   f"device.journal_dir={tmp_path / 'journal'}", f"hydra.sweep.dir={sweep}")
    assert out.returncode == 0, out.stderr[-3000:]
    rows = rows_of(sweep)
    assert sorted(r["framework"] for r in rows) == ["jax", "pytorch"]
    for r in rows:
        assert r["status"] == "ok" and r["backend"] == "cpu" and r["meter"] == "counter"
        assert r["items"] == (STEPS - 1) * 128  # no sim scale off the sim
        assert r["energy_j"] == rapl.energy_of(r["time_s"], rel=0.15)
        assert r["result"] == r["reference_result"] and r["phase_compare_s"] is None
        assert r["work_source"] is None  # nothing is charged off the sim


@pytest.mark.slow
def test_the_example_runs_on_its_own_and_prints_its_window(tmp_path):
    out = subprocess.run([sys.executable, EXAMPLE, "--steps", "20"], capture_output=True,
                         text=True, timeout=300, cwd=tmp_path,
                         env={**os.environ, "DVFS_DEVICE": "cpu",
                              "DVFS_POWERCAP_ROOT": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("jax: 19 steps, 2432 samples in ")
    assert "no energy reading" in out.stdout and "loss " in out.stdout
