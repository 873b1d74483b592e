"""``dvfs check`` over the simulated GPU, run as a lent GPU runs it: from the source tree, with
the carried wheels first on the path, and with neither TensorFlow nor Ray importable."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from support import DVFS, REPO

from orchestrator.realgpu import measured
from orchestrator.realgpu.check import FILES, LEASE_REQUIREMENTS, lease_wheels, trial_plan

# Startup code for the child: TensorFlow and Ray cannot be imported (the lease's image has
# neither); at exit it says where Hydra, OmegaConf and ANTLR's runtime came from. Each is absent
# as a module that is not installed is: ``import`` raises ModuleNotFoundError and
# ``importlib.util.find_spec`` answers None (``None`` in ``sys.modules`` does both; PyTorch's
# dynamo asks find_spec about tensorflow when it loads, and a finder that raised broke it).
BLOCKER = textwrap.dedent("""
    import atexit, importlib.abc, json, os, sys

    class Blocked(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("tensorflow", "ray"):
                raise ModuleNotFoundError(f"No module named {name!r} (blocked: the lease)")
            return None

    sys.meta_path.insert(0, Blocked())
    sys.modules.update(tensorflow=None, ray=None)

    @atexit.register
    def _origins():
        names = ("hydra", "omegaconf", "antlr4")
        origins = {n: getattr(sys.modules.get(n), "__file__", None) for n in names}
        with open(os.environ["ORIGINS_FILE"], "w") as f:
            json.dump(origins, f)
""")


@pytest.fixture(scope="module")
def lease(tmp_path_factory):
    """The carried wheels, resolved for Python 3.12 and unpacked, as the lease gets them."""
    root = tmp_path_factory.mktemp("lease")
    wheels = lease_wheels(root / "wheels")
    return root, wheels


def test_the_carried_wheels_are_pure_python_for_the_leases_python(lease):
    _, wheels = lease
    names = {w.name.split("-")[0].replace("_", "-").lower() for w in wheels}
    assert names == {r.replace("_", "-") for r in LEASE_REQUIREMENTS}
    assert all(w.name.endswith("-py3-none-any.whl") for w in wheels)


def run_check_as_on_a_lease(lease_root, tmp_path, *args):
    """``python -m orchestrator.cli check`` from the source tree, the wheels first on the
    path, TensorFlow and Ray blocked; returns (process, where hydra & co came from)."""
    startup = tmp_path / "startup"
    startup.mkdir()
    (startup / "sitecustomize.py").write_text(BLOCKER)
    origins = tmp_path / "origins.json"
    env = dict(os.environ, ORIGINS_FILE=str(origins), PYTHONPATH=os.pathsep.join(
        [str(startup), str(lease_root / "wheels" / "site"), str(REPO)]))
    proc = subprocess.run([sys.executable, "-m", "orchestrator.cli", "check", *args],
                          capture_output=True, text=True, timeout=900, cwd=tmp_path, env=env)
    return proc, json.loads(origins.read_text())


@pytest.mark.slow
def test_dvfs_check_runs_end_to_end_on_the_sim_without_tensorflow_or_ray(lease, tmp_path):
    out = tmp_path / "out"
    proc, origins = run_check_as_on_a_lease(
        lease[0], tmp_path, "device=sim", f"device.state_dir={tmp_path / 'sim'}",
        "--out", str(out), "--workloads", "gemm,stencil")
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name, origin in origins.items():  # the carried wheels, not this venv's copies
        assert origin is not None and str(lease[0]) in origin, (name, origin)
    assert sorted(p.name for p in out.iterdir()) == sorted(FILES)  # at most 8, in one folder
    report = json.loads((out / "check.json").read_text())
    # the lease's image has JAX and PyTorch (this venv's torch stands in for it)
    assert report["observe_only"] and report["frameworks"] == ["jax", "pytorch"]
    sections = report["sections"]
    assert {n: s["status"] for n, s in sections.items()} == {
        "identity": "ok", "readings": "ok", "trials": "ok"}
    rows = sections["trials"]["data"]["rows"]
    assert [(r["workload"], r["framework"], r["dtype"]) for r in rows] == [
        (w, f, d) for f in ("jax", "pytorch")
        for w, d in (("gemm", "float32"), ("stencil", "float32"), ("gemm", "bfloat16"))]
    assert all(r["status"] == "ok" and r["wall_s"] > 0 for r in rows)
    beside = sections["trials"]["data"]["beside_sim"]
    assert beside["profile"] == "a100_sxm4_40gb" and len(beside["rows"]) == 6
    counter = sections["readings"]["data"]["phases"]["energy_counter"]
    assert counter["load"]["interval_s"]["median_s"] == pytest.approx(0.1, abs=0.005)
    assert "# dvfs check: NVIDIA A100-SXM4-40GB" in (out / "check.md").read_text()


def torch_version() -> str:
    import torch

    return str(torch.__version__)


@pytest.mark.slow
def test_the_checks_folder_is_what_dvfs_report_and_the_measured_data_read(lease, tmp_path):
    out = tmp_path / "out"
    proc, _ = run_check_as_on_a_lease(
        lease[0], tmp_path, "device=sim", f"device.state_dir={tmp_path / 'sim'}",
        "--out", str(out), "--workloads", "gemm", "--sections", "trials")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = subprocess.run([*DVFS, "report", str(out), "--out", str(tmp_path / "report")],
                            capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert report.returncode == 0, report.stderr[-2000:]
    assert "gemm" in (tmp_path / "report" / "report.md").read_text()
    run = measured.load(out)  # the folder is a data/measured run as it is
    assert run.provenance["board"] == "NVIDIA A100-SXM4-40GB"
    assert run.provenance["profile"] == "a100_sxm4_40gb" and not run.rebuilt
    assert [(r["workload"], r["framework"], r["dtype"]) for r in run.rows] == [
        ("gemm", f, d) for f in ("jax", "pytorch") for d in ("float32", "bfloat16")]
    assert run.provenance["libraries"]["torch"] == torch_version()


def test_a_setting_is_refused_in_one_line_before_anything_runs(tmp_path):
    proc = subprocess.run([*DVFS, "check", "device=sim", f"device.state_dir={tmp_path}",
                           "device.sm_clock_mhz=900", "--out", str(tmp_path / "out"),
                           "--sections", "trials", "--workloads", "gemm"],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    report = json.loads((tmp_path / "out" / "check.json").read_text())
    trials = report["sections"]["trials"]
    assert trials["status"] == "failed"
    assert "device.observe_only=true changes nothing" in trials["error"]
    assert proc.returncode == 1


def test_without_a_gpu_it_says_so_in_one_line_and_writes_nothing(tmp_path):
    proc = subprocess.run([*DVFS, "check", "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 2  # DeviceNotFoundError: the machine, not the check, is wrong
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("dvfs check: error: NVML is not available") and "device=sim" in line
    assert not (tmp_path / "out").exists()


def test_an_unknown_section_is_one_line_and_exit_2(tmp_path):
    proc = subprocess.run([*DVFS, "check", "device=sim", "--sections", "identity,power"],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("dvfs check: error: unknown section(s) power; known: "
                                   "identity, readings, trials")


def test_the_plan_puts_each_frameworks_bf16_gemm_after_its_workloads():
    assert trial_plan(("stencil", "gemm"), ("jax", "tensorflow")) == [
        ("stencil", "jax", "float32"), ("gemm", "jax", "float32"), ("gemm", "jax", "bfloat16"),
        ("stencil", "tensorflow", "float32"), ("gemm", "tensorflow", "float32"),
        ("gemm", "tensorflow", "bfloat16")]
