"""Boards side by side, as a user runs it: one ``dvfs sweep`` over three simulated boards with
each launcher, each board on its own simulated machine under one state directory, and a report
that compares them. Real GPUs stay one machine per ``ray_gpus`` sweep.
"""

from __future__ import annotations

import os
import subprocess

import pandas as pd
import pytest
from support import DVFS

from orchestrator.devices.sim.state import MACHINES_DIR, Machine
from orchestrator.results.store import ResultStore

BOARDS = ("a100_sxm4_40gb", "h100_sxm5_80gb", "h200_141gb")
NAMES = {"NVIDIA A100-SXM4-40GB", "NVIDIA H100 80GB HBM3", "NVIDIA H200"}
QUICK = ["workload=gemm", "workload.size=tiny", "measure=quick", "measure.settle_s=0"]


def dvfs(tmp_path, *args):
    env = dict(os.environ, DVFS_SIM_STATE_DIR=str(tmp_path / "sim"), PYTHONUNBUFFERED="1")
    return subprocess.run([*DVFS, *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)


def machines(state) -> list:
    """Every simulated machine under a state directory."""
    found = [Machine(state)] if (state / "machine.json").exists() else []
    where = state / MACHINES_DIR
    return found + [Machine(d) for d in sorted(where.iterdir())] if where.exists() else found


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["ray_gpus", "basic"])
def test_one_sweep_runs_three_boards_each_on_its_own_machine_and_the_report_compares_them(
    tmp_path, launcher
):
    sweep_dir = tmp_path / "boards"
    out = dvfs(tmp_path, "sweep", "-m", f"hydra/launcher={launcher}", *QUICK,
               f"device.profile={','.join(BOARDS)}", "device.sm_clock_mhz=null,1005",
               f"hydra.sweep.dir={sweep_dir}")
    assert out.returncode == 0, out.stderr[-3000:]
    with ResultStore(sweep_dir, readonly=True) as store:
        rows = store.rows()
    assert len(rows) == 6 and all(r["status"] == "ok" for r in rows), rows
    assert {r["device_name"] for r in rows} == NAMES
    assert len({r["device_uuid"] for r in rows}) == 3  # one GPU per board
    found = machines(tmp_path / "sim")
    assert sorted(m.gpus[0].profile for m in found) == sorted(BOARDS)
    assert all(not m.changed() for m in found)  # every board's GPU put back

    report = dvfs(tmp_path, "report", str(sweep_dir), "--out", str(tmp_path / "report"))
    assert report.returncode == 0, report.stderr
    md = (tmp_path / "report" / "report.md").read_text()
    section = md.split("## Boards side by side", 1)[1].split("\n## ", 1)[0]
    header, _, *table = [[c.strip() for c in line.strip("|").split("|")]
                         for line in section.splitlines() if line.startswith("|")]
    assert {row[header.index("board")] for row in table} == NAMES
    assert (tmp_path / "report" / "boards.png").stat().st_size > 10_000
    best = pd.read_csv(tmp_path / "report" / "boards.csv")  # the best board of each is 1.0
    assert set(best["device_name"]) == NAMES
    assert best["energy_vs_best"].min() == 1.0 and best["time_vs_best"].min() == 1.0

def test_ray_gpus_still_runs_one_machine_of_real_gpus_per_sweep(tmp_path):
    out = dvfs(tmp_path, "sweep", "-m", *QUICK, "device=nvml", "device.observe_only=true,false",
               f"hydra.sweep.dir={tmp_path / 'x'}")
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines() == [
        "dvfs sweep: error: hydra/launcher=ray_gpus runs one machine per sweep, but these jobs "
        "differ in device.observe_only: run them as separate sweeps (the same store_dir gathers "
        "them) or with hydra/launcher=basic"
    ]


def test_a_sweep_over_boards_on_a_ray_cluster_is_refused_before_anything_runs(tmp_path):
    out = dvfs(tmp_path, "sweep", "-m", *QUICK, "hydra.launcher.address=auto",
               "device.profile=a100_sxm4_40gb,h200_141gb", f"hydra.sweep.dir={tmp_path / 'x'}")
    assert out.returncode == 2, out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert "on a Ray cluster runs one machine per sweep" in line and "device.profile" in line
    assert not (tmp_path / "sim").exists()
