"""``framework=pytorch`` through ``dvfs sweep``, as a user runs it: one trial, a small grid on
the simulated GPU, and the one line a user without PyTorch gets.

Each test runs the ``dvfs`` command in a subprocess. PyTorch is installed wherever these tests
run (the test extra brings it); a user without it is played by a child whose import system
refuses ``torch``, as ``test_check.py`` refuses TensorFlow and Ray.
"""

from __future__ import annotations

import os
import subprocess
import textwrap

import pytest
from support import DVFS, REPO

from orchestrator.results.store import ResultStore

QUICK = ["device=sim", "workload.size=tiny", "measure=quick", "measure.settle_s=0", "quiet=true"]

BLOCK_TORCH = textwrap.dedent("""
    import importlib.abc, sys

    class Blocked(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "torch":
                raise ModuleNotFoundError(f"No module named {name!r} (blocked: no torch)")
            return None

    sys.meta_path.insert(0, Blocked())
""")


def dvfs(tmp_path, *args, startup=None, timeout=600):
    env = {**os.environ, "DVFS_SIM_STATE_DIR": str(tmp_path / "sim")}
    if startup is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(startup), str(REPO)])
    return subprocess.run([*DVFS, *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=timeout)


def rows_of(directory) -> list[dict]:
    with ResultStore(directory, readonly=True) as store:
        return store.rows()


def assert_measured_and_checked(row: dict) -> None:
    assert row["status"] == "ok" and row["valid"], row
    assert row["framework"] == "pytorch" and row["framework_version"] == _torch_version()
    assert row["versions"]["torch"] == _torch_version()
    assert row["rate"] > 0 and row["rate_unit"] == "TFLOP/s"
    assert row["energy_j"] > 0 and row["energy_per_iter_j"] > 0
    assert row["rel_error"] < 1e-5 and row["nonfinite_count"] == 0
    assert row["determinism_mismatches"] == 0


def _torch_version() -> str:
    import torch

    return str(torch.__version__)


@pytest.mark.parametrize("multirun", [False, True], ids=["single", "multirun"])
def test_without_torch_framework_pytorch_is_one_line_naming_the_extra_and_exit_2(
    tmp_path, multirun
):
    startup = tmp_path / "startup"
    startup.mkdir()
    (startup / "sitecustomize.py").write_text(BLOCK_TORCH)
    out = dvfs(tmp_path, "sweep", *(["-m"] if multirun else []), "framework=pytorch",
               "workload=gemm", *QUICK, f"hydra.sweep.dir={tmp_path / 'm'}",
               f"hydra.run.dir={tmp_path / 'r'}", startup=startup)
    assert out.returncode == 2, out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert line.endswith("framework=pytorch needs PyTorch, which is not installed: "
                         "pip install 'dvfs-orchestrator[torch]'"
                         + ("; nothing was run" if multirun else "")), line
    assert not (tmp_path / "r" / "trials.sqlite").exists()
    assert not (tmp_path / "m" / "trials.sqlite").exists()


@pytest.mark.parametrize("override, message", [
    ("framework.compile=maybe", "'maybe' is not a valid bool"),
    ("framework.deterministic=sometimes", "'sometimes' is not a valid bool"),
    ("framework.precision=bf16", "unknown precision 'bf16' for workload 'gemm'"),
])
def test_a_bad_pytorch_option_is_one_line_exit_2(tmp_path, override, message):
    out = dvfs(tmp_path, "sweep", "framework=pytorch", "workload=gemm", override, *QUICK,
               f"hydra.run.dir={tmp_path / 'r'}")
    assert out.returncode == 2, out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert message in line


@pytest.mark.slow
def test_one_pytorch_trial_on_the_sim_stores_rate_energy_and_checks(tmp_path):
    out = dvfs(tmp_path, "sweep", "framework=pytorch", "workload=gemm", *QUICK,
               f"hydra.run.dir={tmp_path / 'r'}")
    assert out.returncode == 0, out.stderr
    (row,) = rows_of(tmp_path / "r")
    assert_measured_and_checked(row)
    assert row["config"]["framework"] == {"name": "pytorch", "precision": "default",
                                          "xla": False, "compile": False, "deterministic": True}


@pytest.mark.slow
def test_a_pytorch_grid_eager_and_compiled_runs_through_the_launcher(tmp_path):
    d = tmp_path / "grid"
    out = dvfs(tmp_path, "sweep", "-m", "framework=pytorch", "workload=gemm,stencil",
               "framework.compile=false,true", *QUICK, "hydra.launcher.progress=false",
               f"hydra.sweep.dir={d}")
    assert out.returncode == 0, out.stderr
    rows = rows_of(d)
    assert sorted((r["workload"], r["config"]["framework"]["compile"]) for r in rows) == [
        ("gemm", False), ("gemm", True), ("stencil", False), ("stencil", True)]
    for row in rows:
        assert_measured_and_checked(row)
        compiled = row["config"]["framework"]["compile"]
        assert row["work_source"] == ("inductor_kernels" if compiled else "torch_dispatch_ops")
    # one trial key each: compile is part of what is measured
    assert len({r["trial_key"] for r in rows}) == 4
    stencil = {r["config"]["framework"]["compile"]: r for r in rows if r["workload"] == "stencil"}
    assert stencil[True]["charged_bytes"] < stencil[False]["charged_bytes"]  # fused by Inductor


def test_dvfs_check_finds_pytorch_by_its_module_torch():
    from orchestrator.realgpu.check import frameworks_present

    assert frameworks_present() == ("jax", "tensorflow", "pytorch")
