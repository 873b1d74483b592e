"""The default sweeper: Hydra's basic grid, checked once per distinct value instead of per job.

(Hydra's plugin scanner may import this module as ``hydra_plugins.test_...`` too, since ``tests/``
is on the path: it does nothing at import time.)
"""

from __future__ import annotations

import sqlite3

import pytest

QUICK = ["device=sim", "workload.size=tiny", "measure=quick", "quiet=true"]


def test_the_default_sweeper_is_the_grid_sweeper_and_experiments_still_choose_theirs():
    from hydra import compose, initialize_config_dir

    from orchestrator.config import CONF_DIR, register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        plain = compose(config_name="config", return_hydra_config=True)
        claims = compose(config_name="config", return_hydra_config=True,
                         overrides=["experiment=seed_claims"])
        own = compose(config_name="config", return_hydra_config=True, overrides=[
            "hydra.sweeper._target_=hydra._internal.core_plugins.basic_sweeper.BasicSweeper"])
    assert plain.hydra.sweeper._target_ == "hydra_plugins.dvfs.grid_sweeper.GridSweeper"
    assert claims.hydra.sweeper._target_.endswith("StabilitySweeper")
    assert own.hydra.sweeper._target_.endswith(".BasicSweeper")


def test_with_the_basic_launcher_a_bad_value_stops_the_grid_before_its_first_job(
    tmp_path, monkeypatch, capsys
):
    # Hydra's basic launcher runs jobs in this process, one after the other: without the sweeper's
    # check, jobs #0 and #1 would run before job #2's repeats=0 was refused.
    from orchestrator.app import run_sweep

    monkeypatch.setenv("DVFS_SIM_STATE_DIR", str(tmp_path / "sim"))
    rc = run_sweep(["-m", "hydra/launcher=basic", *QUICK, "seed=1,2", "measure.repeats=1,0",
                    f"hydra.sweep.dir={tmp_path / 'sweep'}"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "job #1 (seed=1 measure.repeats=0)" in err and "measure.repeats" in err
    assert not (tmp_path / "sweep" / "trials.sqlite").exists()


@pytest.mark.slow
def test_with_the_basic_launcher_a_good_grid_runs_every_job(tmp_path, monkeypatch):
    from orchestrator.app import run_sweep

    monkeypatch.setenv("DVFS_SIM_STATE_DIR", str(tmp_path / "sim"))
    sweep = tmp_path / "sweep"
    assert run_sweep(["-m", "hydra/launcher=basic", *QUICK, "workload=selu",
                      "device.sm_clock_mhz=1110,1410", f"hydra.sweep.dir={sweep}"]) == 0
    with sqlite3.connect(sweep / "trials.sqlite") as con:
        assert con.execute("SELECT COUNT(DISTINCT trial_key) FROM trials").fetchone() == (2,)
