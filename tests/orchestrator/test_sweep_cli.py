"""`dvfs sweep` end to end, in subprocesses, as a user runs it."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest
from support import BRIEF_TRIAL, DVFS

from orchestrator.results.store import ResultStore

QUICK = ["workload.size=tiny", "measure=quick", "measure.settle_s=0"]


def env_for(tmp_path):
    return dict(os.environ, DVFS_SIM_STATE_DIR=str(tmp_path / "sim"), PYTHONUNBUFFERED="1")


def dvfs(tmp_path, *args, timeout=300):
    return subprocess.run(
        [*DVFS, *args],
        cwd=tmp_path,
        env=env_for(tmp_path),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_a_plain_sweep_runs_one_trial_and_prints_a_summary(tmp_path):
    out = dvfs(
        tmp_path, "sweep", *QUICK, f"hydra.run.dir={tmp_path / 'run'}", "device.sm_clock_mhz=1200"
    )
    assert out.returncode == 0, out.stderr
    assert "gemm/jax float32 [sm=1200 MHz] #0: ok" in out.stdout
    with ResultStore(tmp_path / "run", readonly=True) as store:
        (row,) = store.rows()
    assert row["sm_clock_max_mhz"] == 1200 and row["status"] == "ok"
    assert row["observed_sm_clock_mhz"] == pytest.approx(1200, abs=1)


@pytest.mark.slow
def test_on_the_sim_a_trial_computes_the_tiny_preset_unless_told_and_says_so(tmp_path):
    # No workload.size: the sim computes tiny (its figures come from sim_size, the gpu preset).
    # Brief trials: a gemm of the cpu preset computes for real at each call of the window.
    out = dvfs(tmp_path, "sweep", "measure=quick", "measure.settle_s=0", *BRIEF_TRIAL,
               f"hydra.run.dir={tmp_path / 'run'}")
    assert out.returncode == 0, out.stderr
    assert "size tiny computed, gpu modelled" in out.stdout
    told = dvfs(tmp_path, "sweep", "measure=quick", "measure.settle_s=0", *BRIEF_TRIAL,
                "workload.size=cpu", f"hydra.run.dir={tmp_path / 'told'}")
    assert told.returncode == 0, told.stderr
    assert "size cpu computed, gpu modelled" in told.stdout
    for run, size in (("run", "tiny"), ("told", "cpu")):
        with ResultStore(tmp_path / run, readonly=True) as store:
            (row,) = store.rows()
        assert (row["size"], row["sim_size"]) == (size, "gpu")
        assert row["energy_per_iter_j"] > 0


@pytest.mark.parametrize(
    "override, message",
    [
        (  # within every GPU's bound (5 GHz), not within this one's table
            "device.sm_clock_mhz=3000",
            "SM clock 3000 MHz is not supported by NVIDIA A100-SXM4-40GB; "
            "supported: 210-1410 MHz",
        ),
        ("device.sm_clock_mhz=99999", "device.sm_clock_mhz=99999 must be between 1 and 5000 MHz"),
        (
            "device.power_limit_w=5000",
            "power limit 5000 W is out of range for NVIDIA A100-SXM4-40GB: 100-400 W",
        ),
        ("workload=nope", "Could not find 'workload/nope'"),
        ("workload.name=nope", "unknown workload 'nope'"),
        ("measure.window_s=-1", "measure.window_s=-1 must be greater than 0 and at most 3600 s"),
        ("measure.windw_s=2", "Key 'windw_s' not in 'MeasureConfig'"),
        ("device.profile=a99", "a99"),
        ("device.gpus=[5]", "no GPU with index 5"),
    ],
)
@pytest.mark.slow
def test_bad_input_is_one_line_exit_2_and_touches_no_device(tmp_path, override, message):
    out = dvfs(
        tmp_path, "sweep", *QUICK, f"hydra.run.dir={tmp_path / 'run'}", override, timeout=120
    )
    assert out.returncode == 2, (out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert message in lines[0]
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "run" / "trials.sqlite").exists()
    journal = tmp_path / "sim" / "journal"
    assert not journal.exists() or not list(journal.glob("*.json"))


GRID = [
    "sweep", "-m", "hydra/launcher=basic", *QUICK, "measure.window_s=2",
    "device.sm_clock_mhz=range(900,1411,30)",
]


def wait_for_rows(sweep_dir, n, proc, timeout_s=240):
    """Wait until a running sweep has stored ``n`` rows (it must still be running)."""
    deadline = time.time() + timeout_s
    stored = 0
    while time.time() < deadline and stored < n:
        time.sleep(0.5)
        if (sweep_dir / "trials.sqlite").exists():
            with ResultStore(sweep_dir, readonly=True) as store:
                stored = len(store)
    assert stored >= n, proc.stderr.read() if proc.poll() is not None else "too slow"


@pytest.mark.slow
def test_a_sweep_killed_midway_resumes_into_the_same_directory(tmp_path):
    sweep_dir = tmp_path / "sweep"
    args = [*DVFS, *GRID, f"hydra.sweep.dir={sweep_dir}"]
    proc = subprocess.Popen(
        args,
        cwd=tmp_path,
        env=env_for(tmp_path),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    wait_for_rows(sweep_dir, 4, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    with ResultStore(sweep_dir, readonly=True) as store:  # opens, every finished trial there
        first = store.rows()
    assert 4 <= len(first) < 18
    assert all(r["status"] == "ok" for r in first)

    restore = dvfs(tmp_path, "restore")
    assert restore.returncode == 0, restore.stderr
    rerun = subprocess.run(
        args, cwd=tmp_path, env=env_for(tmp_path), capture_output=True, text=True, timeout=300
    )
    assert rerun.returncode == 0, rerun.stderr
    assert rerun.stdout.count("already stored") == len(first)
    with ResultStore(sweep_dir, readonly=True) as store:
        rows = store.rows()
    keys = [(r["trial_key"], r["repeat"]) for r in rows]
    assert len(rows) == 18 and len(set(keys)) == 18
    assert sorted(r["sm_clock_max_mhz"] for r in rows) == list(range(900, 1411, 30))


@pytest.mark.slow
def test_a_second_sweep_into_a_running_sweeps_directory_is_refused_and_sigterm_restores(tmp_path):
    """The same command twice at once: the second is one line and exit 2, touching nothing; then
    SIGTERM stops the first, which restores its GPU (no journal entry, no `dvfs restore`) and
    exits 143, and the same command resumes it."""
    sweep_dir = tmp_path / "sweep"
    args = [*DVFS, *GRID, f"hydra.sweep.dir={sweep_dir}"]
    first = subprocess.Popen(args, cwd=tmp_path, env=env_for(tmp_path), stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    wait_for_rows(sweep_dir, 3, first)

    second = subprocess.run(args, cwd=tmp_path, env=env_for(tmp_path), capture_output=True,
                            text=True, timeout=120)
    assert second.returncode == 2, second.stderr
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1 and "is being written by another sweep" in lines[0], second.stderr
    assert f"pid {first.pid} on" in lines[0] and "Traceback" not in second.stderr
    assert second.stdout.count("#0: ok") == 0  # it ran no trial

    first.send_signal(signal.SIGTERM)
    _, err = first.communicate(timeout=60)
    assert first.returncode == 143, err
    assert "dvfs sweep: terminated (SIGTERM); the trials in flight were stopped" in err
    assert "every trial stored so far is kept" in err
    assert not list((tmp_path / "sim" / "journal").glob("*.json"))  # restored by itself
    from orchestrator.devices.sim.state import Machine

    gpu = Machine(tmp_path / "sim").read(0)
    assert gpu["locked_sm_mhz"] is None and gpu["power_limit_w"] == 400

    rerun = subprocess.run(args, cwd=tmp_path, env=env_for(tmp_path), capture_output=True,
                           text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    with ResultStore(sweep_dir, readonly=True) as store:
        rows = store.rows()
    assert sorted(r["sm_clock_max_mhz"] for r in rows) == list(range(900, 1411, 30))
