"""``hydra/sweeper=stability`` (and the Optuna experiment) end to end, through ``dvfs sweep``.

Each sweep runs in a subprocess on simulated A100s with thresholds planted per GPU. The first
runs on the ``ray_gpus`` launcher (one worker per GPU, the searches of both GPUs side by side); the
others on Hydra's basic launcher (in-process, sequential): what they check is the search.
"""

from __future__ import annotations

import csv
import os
import subprocess

import pytest
import yaml
from support import DVFS

from analysis.thresholds import COLUMNS
from orchestrator.results.store import ResultStore

QUICK = ["hydra/launcher=basic", "workload.size=tiny", "measure=quick", "measure.settle_s=0"]
GRID = 81  # the A100's supported SM clocks: 210-1410 MHz in 15 MHz steps


def dvfs(tmp_path, *args, timeout=300):
    env = dict(os.environ, DVFS_SIM_STATE_DIR=str(tmp_path / "sim"), PYTHONUNBUFFERED="1")
    return subprocess.run([*DVFS, *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=timeout)


def table(sweep_dir):
    with open(sweep_dir / "thresholds.csv", newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_the_sweeper_finds_each_gpus_planted_threshold_within_one_step_in_a_third_of_a_grid(
    tmp_path,
):
    """Through the ray_gpus launcher: each search's jobs are pinned to their GPU by UUID."""
    import analysis

    sweep_dir = tmp_path / "sweep"
    on_ray = [o for o in QUICK if o != "hydra/launcher=basic"]
    out = dvfs(
        tmp_path, "sweep", "-m", "hydra/sweeper=stability", *on_ray, "device.count=2",
        "device.planted_thresholds={0:{gemm:1065},1:{gemm:840}}",
        "hydra.sweeper.confirm_iterations=300",
        f"hydra.sweep.dir={sweep_dir}",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    rows = {int(r["device_index"]): r for r in table(sweep_dir)}
    for index, planted in ((0, 1065), (1, 840)):
        r = rows[index]
        assert (float(r["stable_value"]), float(r["failing_value"])) == (planted, planted - 15)
        assert r["confirmed"] == "True" and r["non_monotone"] == "False"
        assert r["steps_between"] == "1"
        assert int(r["iterations_at_stable"]) >= 300
        assert float(r["fault_rate_bound"]) == pytest.approx(3 / int(r["iterations_at_stable"]))
        assert int(r["trials_used"]) <= GRID / 3 and int(r["grid_size"]) == GRID
        assert f"stable at {planted} MHz" in out.stdout
    with ResultStore(sweep_dir, readonly=True) as store:
        meta = store.get_meta("thresholds")
        stored = store.rows()
    assert [m["stable_value"] for m in meta["rows"]] == [1065, 840]
    # every trial ran on the GPU its search pinned it to, and the two searches ran side by side
    for index, r in rows.items():
        on_gpu = sum(1 for s in stored if s["device_uuid"] == r["device_uuid"])
        assert on_gpu == int(r["trials_used"])
        assert all(s["config"]["device"]["gpus"] == [s["device_uuid"]] for s in stored)
    spans = {u: [(s["launch"]["trial_started_at"], s["launch"]["trial_ended_at"]) for s in stored
                 if s["device_uuid"] == u] for u in {s["device_uuid"] for s in stored}}
    first, second = spans.values()
    assert sum(a0 < b1 and a1 < b0 for a0, b0 in first for a1, b1 in second) >= 5, spans
    # the analysis of the stored rows agrees, and sees the search's phases
    roles = analysis.load_meta(sweep_dir)[0]["meta"]["search_trials"]["roles"]
    assert len(roles) == len(stored)
    by_uuid = analysis.thresholds(analysis.load(sweep_dir), roles=roles).set_index("device_uuid")
    for r in rows.values():
        a = by_uuid.loc[r["device_uuid"]]
        assert a["stable_value"] == float(r["stable_value"])
        assert a["failing_value"] == float(r["failing_value"])
        assert a["iterations_at_stable"] == int(r["iterations_at_stable"])
        assert "coarse×8" in a["search_roles"] and "bisect" in a["search_roles"]


@pytest.mark.slow
def test_seed_claims_on_two_a100s_names_a_threshold_per_gpu_and_framework(tmp_path):
    """The study's claim (JAX fails below 1065 MHz, TensorFlow holds to 510) on GPU 0; GPU 1 has
    its own, planted GEMM threshold, whatever the framework."""
    sweep_dir = tmp_path / "seed_claims"
    out = dvfs(
        tmp_path, "sweep", "-m", "experiment=seed_claims", "hydra/launcher=basic",
        "measure.settle_s=0",
        "hydra.sweeper.params.workload=gemm", "hydra.sweeper.confirm_iterations=300",
        "device.planted_thresholds={1:{gemm:1200}}", f"hydra.sweep.dir={sweep_dir}",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    found = {
        (int(r["device_index"]), r["framework"]):
            (float(r["stable_value"]), float(r["failing_value"]))
        for r in table(sweep_dir)
    }
    assert found == {
        (0, "jax"): (1065, 1050), (0, "tensorflow"): (510, 495),
        (1, "jax"): (1200, 1185), (1, "tensorflow"): (1200, 1185),
    }
    report = [line for line in out.stdout.splitlines() if line.startswith("stability: gpu")]
    assert len(report) == 4
    assert any("gpu0 gemm/jax" in line and "stable at 1065 MHz" in line for line in report)
    assert any("gpu0 gemm/tensorflow" in line and "stable at 510 MHz" in line for line in report)
    # dvfs report writes its own thresholds.csv of the same rows: one schema, one header
    report_dir = tmp_path / "report"
    written = dvfs(tmp_path, "report", str(sweep_dir), "--out", str(report_dir))
    assert written.returncode == 0, written.stderr[-3000:]
    with open(sweep_dir / "thresholds.csv") as ours, open(report_dir / "thresholds.csv") as rep:
        assert next(csv.reader(ours)) == next(csv.reader(rep)) == COLUMNS


@pytest.mark.slow
def test_an_offset_search_goes_upward_to_the_seeded_max_stable_offset(tmp_path):
    from orchestrator.devices.sim import model
    from orchestrator.devices.sim.profile import load_profile

    sweep_dir = tmp_path / "offset"
    out = dvfs(tmp_path, "sweep", "-m", "hydra/sweeper=stability", *QUICK,
               "hydra.sweeper.setting=device.clock_offset_mhz",
               "hydra.sweeper.confirm_iterations=200", f"hydra.sweep.dir={sweep_dir}")
    assert out.returncode == 0, out.stderr[-3000:]
    (r,) = table(sweep_dir)
    truth = model.max_stable_offset_mhz(load_profile("a100_sxm4_40gb"), r["device_uuid"], "gemm")
    assert r["riskier"] == "higher"
    assert (float(r["stable_value"]), float(r["failing_value"])) == (truth, truth + 15)


@pytest.mark.slow
def test_a_power_search_goes_downward_to_the_cap_that_still_holds_the_planted_clock(tmp_path):
    sweep_dir = tmp_path / "power"
    out = dvfs(tmp_path, "sweep", "-m", "hydra/sweeper=stability", *QUICK,
               "hydra.sweeper.setting=device.power_limit_w",
               "device.planted_thresholds={0:{gemm:1065}}", "hydra.sweeper.confirm_iterations=200",
               f"hydra.sweep.dir={sweep_dir}")
    assert out.returncode == 0, out.stderr[-3000:]
    (r,) = table(sweep_dir)
    stable, failing = float(r["stable_value"]), float(r["failing_value"])
    assert r["unit"] == "W" and stable - failing == 10  # the default 10 W grid
    with ResultStore(sweep_dir, readonly=True) as store:
        clock = {r["power_limit_w"]: r["observed_sm_clock_mhz"] for r in store.rows()}
    assert clock[stable] >= 1065 > clock[failing]  # the cap sets the clock, the clock the faults


@pytest.mark.parametrize(
    "args, message",
    [
        (["hydra.sweeper.setting=workload.name"],
         "hydra.sweeper.setting=workload.name is not an ordered setting"),
        (["hydra.sweeper.confirm_iterations=0"],
         "hydra.sweeper.confirm_iterations=0 must be between 1 and"),
        (["device.sm_clock_mhz=1005,1007"],
         "SM clock 1007 MHz is not supported by NVIDIA A100-SXM4-40GB"),
        (["device.sm_clock_mhz=1065"],
         "device.sm_clock_mhz=1065 is the setting hydra/sweeper=stability searches"),
        (["hydra.sweeper.setting=device.clock_offset_mhz", "device.profile=v100_sxm2_16gb"],
         "does not support clock offsets"),
        (["device.gpus=0,1"], "device.gpus selects the GPUs searched"),
    ],
)
@pytest.mark.slow
def test_bad_input_is_one_line_exit_2_before_any_trial(tmp_path, args, message):
    sweep_dir = tmp_path / "sweep"
    out = dvfs(tmp_path, "sweep", "-m", "hydra/sweeper=stability", *QUICK, *args,
               f"hydra.sweep.dir={sweep_dir}", timeout=120)
    assert out.returncode == 2, (out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], out.stderr
    assert not (sweep_dir / "trials.sqlite").exists()


def test_the_experiments_compose_with_their_sweepers():
    from hydra import compose, initialize_config_dir

    from orchestrator.config import CONF_DIR, register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        claims = compose("config", overrides=["experiment=seed_claims"], return_hydra_config=True)
        optuna = compose("config", overrides=["experiment=optuna_energy"], return_hydra_config=True)
    assert claims.hydra.sweeper._target_.endswith("StabilitySweeper")
    assert claims.device.scenario == "seed_claims" and claims.device.count == 2
    assert claims.hydra.sweeper.params == {
        "workload": "stencil,gemm", "framework": "jax,tensorflow",
    }
    assert optuna.hydra.sweeper._target_.endswith("OptunaSweeper")
    assert optuna.objective == "energy_per_work"
    assert set(optuna.hydra.sweeper.params) == {
        "device.power_limit_w", "device.sm_clock_mhz", "device.mem_clock_mhz",
    }


@pytest.mark.slow
def test_optuna_finds_the_lowest_energy_correct_setting_in_six_trials(tmp_path):
    """Hydra's Optuna sweeper over our task: a failed check (below the planted 900 MHz) is an
    objective of infinity, never the best point."""
    sweep_dir = tmp_path / "optuna"
    out = dvfs(
        tmp_path, "sweep", "-m", "experiment=optuna_energy", "hydra/launcher=basic",
        "measure.settle_s=0", "hydra.sweeper.n_trials=6",
        "device.planted_thresholds={0:{gemm:900}}",
        f"hydra.sweep.dir={sweep_dir}",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    best = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())
    with ResultStore(sweep_dir, readonly=True) as store:
        rows = store.rows()
    assert len(rows) == 6
    ok = [r for r in rows if r["status"] == "ok"]
    assert ok and len(ok) < len(rows)  # the seeded sampler tries a clock below the threshold
    assert best["best_value"] == pytest.approx(min(r["energy_per_iter_j"] for r in ok))
    assert best["best_params"]["device.sm_clock_mhz"] >= 900
