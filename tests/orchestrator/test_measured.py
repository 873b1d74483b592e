"""Real-GPU runs are data: every folder of data/measured loads, goes into a store, and is
compared with the sim's figure for the same work."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support import REPO

from kernels.registry import WORKLOADS
from orchestrator.devices.sim.calibration import compare_real
from orchestrator.devices.sim.profile import available_profiles, load_profile
from orchestrator.errors import UserError
from orchestrator.realgpu import measured
from orchestrator.results.store import ResultStore


def test_every_measured_run_names_a_shipped_profile_and_its_rows_go_into_a_store(tmp_path):
    runs = measured.runs()
    assert runs, "data/measured holds the H200 run"
    for run in runs:
        assert run.provenance["profile"] in available_profiles()
        assert all(row["device_name"] == run.provenance["board"] for row in run.rows)
        store_dir = tmp_path / run.path.name
        assert measured.into_store(run, store_dir) == len(run.rows)
        assert measured.into_store(run, store_dir) == 0  # the same rows again: none new
        with ResultStore(store_dir) as store:
            back = {r["workload"]: r for r in store.rows()}
        assert {r["workload"]: r["energy_per_iter_j"] for r in run.rows} == {
            w: r["energy_per_iter_j"] for w, r in back.items()}


def test_the_h200_run_says_its_rows_were_rebuilt_and_holds_the_six_workloads():
    (run,) = [r for r in measured.runs() if r.provenance["board"] == "NVIDIA H200"]
    assert run.rebuilt
    assert sorted(r["workload"] for r in run.rows) == sorted(
        ["gemm", "stencil", "selu", "conv3d", "mlp_train", "hessian"])


def test_a_row_without_a_figure_is_refused_naming_the_key(tmp_path):
    run = measured.runs()[0]
    (tmp_path / "provenance.yaml").write_text((run.path / "provenance.yaml").read_text())
    row = dict(run.rows[0])
    del row["avg_power_w"]
    (tmp_path / "rows.jsonl").write_text(json.dumps(row) + "\n")
    with pytest.raises(UserError, match=r"rows.jsonl line 1: missing avg_power_w"):
        measured.load(tmp_path)


def test_sim_vs_real_prints_each_row_with_the_sims_figure_over_the_real_one():
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "sim_vs_real.py")], cwd=REPO,
                         capture_output=True, text=True, timeout=300, check=True).stdout
    run = next(r for r in measured.runs() if r.provenance["board"] == "NVIDIA H200")
    profile = load_profile(run.provenance["profile"])
    for row in run.rows:
        c = compare_real(profile, row, WORKLOADS[row["workload"]].peak("float32"))
        assert c.j_per_iter[1] == row["energy_per_iter_j"]
        line = next(x for x in out.splitlines() if x.startswith(f"| {row['workload']} |"))
        assert f"({c.ratio('j_per_iter'):.2f})" in line
        assert f"/ {row['energy_per_iter_j']:.3f}" in line
