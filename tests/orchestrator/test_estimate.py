"""A sweep's expected length: said before it starts when long, refused past its bound unless
``--yes``, through ``dvfs sweep`` as a user meets it (one trial, the basic launcher, ray_gpus)."""

from __future__ import annotations

import os
import subprocess

import pytest
from support import DVFS, REPO

from orchestrator.config import MeasureConfig
from orchestrator.errors import UserError
from orchestrator.launching import estimate

QUICK = ["workload.size=tiny", "measure=quick", "quiet=true"]


def run(*args: str, cwd=REPO, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([*DVFS, *args], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


def test_a_trial_is_its_windows_checks_edge_waits_settling_and_overhead():
    m = MeasureConfig(window_s=10.0, repeats=3, settle_s=2.0, counter_edge_wait_s=0.5)
    assert estimate.trial_s(m) == 3 * (10 + 10 + 0.5) + 2 + estimate.TRIAL_OVERHEAD_S
    inline = MeasureConfig(window_s=10.0, digest="inline", counter_edge_wait_s=0.0, settle_s=0)
    assert estimate.trial_s(inline) == 10 + estimate.TRIAL_OVERHEAD_S  # checked in the window


def test_the_trials_spread_over_the_gpus_and_the_figure_reads_plainly():
    e = estimate.Estimate.of([MeasureConfig(window_s=3600.0)] * 81, gpus=4)
    assert e.seconds == pytest.approx(81 * estimate.trial_s(MeasureConfig(window_s=3600.0)) / 4)
    assert e.describe().startswith("about 40 h ") and "81 trials of ~2 h 0 min" in e.describe()
    assert "4 GPUs at once" in e.describe()
    assert estimate.duration(45) == "45 s" and estimate.duration(3e9).endswith("years")


def test_a_short_sweep_says_nothing_a_long_one_says_how_long_a_too_long_one_is_refused(
    monkeypatch
):
    said: list[str] = []
    monkeypatch.delenv(estimate.YES_ENV, raising=False)
    estimate.check(estimate.Estimate(10, 200.0), 24, said.append)
    assert said == []
    estimate.check(estimate.Estimate(10, 3600.0), 24, said.append)
    assert said == ["this sweep will take about 60 min (10 trials of ~6 min)"]
    with pytest.raises(UserError, match=r"about 2 h 0 min .*more than hydra.sweeper.max_hours=1;"
                                         r" nothing was run.*dvfs sweep --yes"):
        estimate.check(estimate.Estimate(2, 7200.0), 1, said.append)
    monkeypatch.setenv(estimate.YES_ENV, "1")  # what `dvfs sweep --yes` sets
    estimate.check(estimate.Estimate(2, 7200.0), 1, said.append)
    assert said[-1].startswith("this sweep will take about 2 h 0 min")


def test_max_hours_has_a_bound_too():
    assert estimate.max_hours({"max_hours": 48}) == 48 and estimate.max_hours({}) == 24
    with pytest.raises(UserError, match="hydra.sweeper.max_hours=0 must be greater than 0"):
        estimate.max_hours({"max_hours": 0})


def one_error(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [ln for ln in proc.stderr.splitlines() if "error:" in ln]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    return errors[0]


def test_one_trial_of_days_is_refused_before_any_gpu_and_a_relative_store_is_said(
    sim_dir, tmp_path
):
    line = one_error(run("sweep", *QUICK, "measure.window_s=3600", "measure.repeats=100",
                         f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path))
    assert "this trial would take about 8 days" in line
    assert not (tmp_path / "run" / "trials.sqlite").exists()
    ok = run("sweep", *QUICK, "store_dir=rel/results", f"hydra.run.dir={tmp_path / 'run'}",
             cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert f"dvfs sweep: results in {tmp_path / 'rel' / 'results'}" in ok.stderr
    assert (tmp_path / "rel" / "results" / "trials.sqlite").exists()


def test_a_grid_of_days_on_hydras_basic_launcher_is_refused_before_its_first_job(
    sim_dir, tmp_path
):
    line = one_error(run("sweep", "-m", "hydra/launcher=basic", *QUICK, "measure.window_s=3600",
                         "device.sm_clock_mhz=range(210,1411,15)",
                         f"hydra.sweep.dir={tmp_path / 's'}"))
    assert "this sweep would take about 7 days (81 trials of ~2 h 0 min)" in line
    assert not (tmp_path / "s" / "trials.sqlite").exists()


@pytest.mark.slow
def test_a_grid_of_days_on_ray_gpus_is_refused_before_any_trial(
    sim_dir, tmp_path
):
    grid = ["-m", "device.count=4", *QUICK, "measure.window_s=3600",
            "device.sm_clock_mhz=range(210,1411,15)", f"hydra.sweep.dir={tmp_path / 's'}"]
    proc = run("sweep", *grid)
    line = one_error(proc)
    assert "about 40 h" in line and "4 GPUs at once" in line
    lines = proc.stderr.splitlines()
    first = lines.index(f"ray_gpus: 81 job(s); results in {tmp_path / 's'}")
    assert all("ray_gpus" not in ln for ln in lines[:first])  # the sweep's first line
    assert not (tmp_path / "s" / "trials.sqlite").exists()
