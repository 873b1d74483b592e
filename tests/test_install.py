"""The project installed as a user installs it: a wheel, a fresh virtual environment, and `dvfs`
run from a directory that is not the checkout.

One wheel is built for the module (``pip wheel``, no build isolation: the test environment's
setuptools) and installed with ``--no-deps`` into a fresh virtual environment whose
dependencies are the test environment's (a ``.pth`` line names its site-packages, which is not a
site directory there, so the editable install's finder in it never runs). Every command then
runs from an empty directory with no ``PYTHONPATH``: what it finds, it found in the wheel.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from support import REPO

pytestmark = pytest.mark.slow


def run(cmd: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DVFS_SIM_STATE_DIR")}
    env["DVFS_SIM_STATE_DIR"] = str(cwd / "sim")
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def stored(bin_dir: Path, work: Path, sweep_dir: str) -> list[list]:
    """(status, versions, git_commit) of each row a sweep stored, read by the installed package."""
    out = run([str(bin_dir / "python"), "-c", "import json, sys; from orchestrator.results.store "
               "import ResultStore; s = ResultStore(sys.argv[1], readonly=True); "
               "print(json.dumps([(r['status'], r['versions'], r['git_commit']) "
               "for r in s.rows()]))", sweep_dir], work)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(the wheel, the fresh environment's bin/, an empty working directory)."""
    root = tmp_path_factory.mktemp("install")
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(root / "dist"), str(REPO)],
        capture_output=True, text=True, timeout=300,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = (root / "dist").glob("dvfs_orchestrator-*.whl")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()"
                           "['purelib'])"], capture_output=True, text=True, check=True)
    Path(site.stdout.strip(), "test-env-deps.pth").write_text(sysconfig.get_paths()["purelib"])
    put = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
                          "--no-deps", str(wheel)], capture_output=True, text=True, timeout=300)
    assert put.returncode == 0, put.stderr[-3000:]
    work = root / "work"
    work.mkdir()
    return wheel, venv / "bin", work


def test_the_wheel_carries_every_config_and_the_readmes_example(installed):
    wheel, _, _ = installed
    names = set(zipfile.ZipFile(wheel).namelist())
    configs = {f"orchestrator/conf/{p.relative_to(REPO / 'conf')}"
               for p in (REPO / "conf").rglob("*.yaml")}
    assert len(configs) > 20 and configs <= names, sorted(configs - names)
    assert "examples/attention.py" in names  # README: workload.target=examples.attention:...
    assert {"examples/train_mlp.py", "dvfs/__init__.py"} <= names  # the window API, its example
    assert not [n for n in names if n.startswith(("tests/", "scripts/", "conf/"))]


def test_the_sdist_carries_every_config_and_the_readmes_example(tmp_path):
    import tarfile

    made = subprocess.run([sys.executable, "-c", "import sys; from setuptools import build_meta; "
                           "print(build_meta.build_sdist(sys.argv[1]))", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr[-3000:]
    name = made.stdout.split()[-1]
    with tarfile.open(tmp_path / name) as sdist:
        names = {n.split("/", 1)[1] for n in sdist.getnames() if "/" in n}
    configs = {f"orchestrator/conf/{p.relative_to(REPO / 'conf')}"
               for p in (REPO / "conf").rglob("*.yaml")}
    assert configs <= names and "examples/attention.py" in names, sorted(configs - names)


def test_the_installed_dvfs_says_its_version_and_runs_from_its_own_files(installed):
    _, bin_dir, work = installed
    version = run([str(bin_dir / "dvfs"), "--version"], work)
    assert version.returncode == 0, version.stderr
    import orchestrator

    assert version.stdout.strip() == f"dvfs {orchestrator.__version__}"  # no commit: not a checkout
    where = run([str(bin_dir / "python"), "-c", "import orchestrator, examples.attention as a, "
                 "orchestrator.config as c; print(orchestrator.__file__, a.__file__, c.CONF_DIR)"],
                work)
    assert where.returncode == 0, where.stderr
    assert all(str(bin_dir.parent) in p for p in where.stdout.split()), where.stdout


def test_a_quickstart_sweep_and_its_report_run_from_an_empty_directory(installed):
    """The README's first command from the wheel (two clocks of its grid in JAX: the configs,
    the plugins and the Ray workers all come from the install), then its report; each row
    records the installed version."""
    _, bin_dir, work = installed
    sweep = run([str(bin_dir / "dvfs"), "sweep", "-m", "experiment=quickstart", "framework=jax",
                 "device.sm_clock_mhz=null,1410"], work)
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    report = run([str(bin_dir / "dvfs"), "report", "outputs/quickstart"], work)
    assert report.returncode == 0, report.stderr[-3000:]
    assert (work / "outputs" / "quickstart" / "report" / "report.html").stat().st_size > 10_000
    import orchestrator

    found = stored(bin_dir, work, "outputs/quickstart")
    assert len(found) == 4 and {s for s, _, _ in found} == {"ok"}, found
    assert all(v["dvfs-orchestrator"] == orchestrator.__version__ and c is None
               for _, v, c in found)


def test_every_other_command_runs_from_the_installed_wheel(installed):
    """devices, restore, a single sweep of a user's config folder (an experiment over a workload
    preset of the README's example), a basic-launcher grid, and calibrate against a shipped board
    profile (the profiles are package data too)."""
    _, bin_dir, work = installed
    dvfs = str(bin_dir / "dvfs")
    devices = run([dvfs, "devices", "--json"], work)  # the machine the sweeps above made
    assert devices.returncode == 0, devices.stderr
    (gpu,) = json.loads(devices.stdout)["devices"]
    assert gpu["name"] == "NVIDIA A100-SXM4-40GB"
    assert run([dvfs, "restore"], work).returncode == 0
    mine = work / "mine"  # a user's config folder: an experiment over a workload preset
    (mine / "experiment").mkdir(parents=True)
    (mine / "workload").mkdir()
    (mine / "workload" / "attention.yaml").write_text(
        "defaults:\n  - workload_schema\nname: custom\n"
        "target: examples.attention:make_workload\nsize: tiny\n")
    (mine / "experiment" / "mine.yaml").write_text(
        "# @package _global_\ndefaults:\n  - override /workload: attention\n"
        "  - override /measure: quick\n  - override /framework: jax\n")
    single = run([dvfs, "sweep", "--config-dir", str(mine), "experiment=mine"], work)
    assert single.returncode == 0, single.stderr[-2000:]
    assert "attention" in single.stdout + single.stderr
    grid = run([dvfs, "sweep", "-m", "hydra/launcher=basic", "workload=gemm", "framework=jax",
                "measure=quick", "device.sm_clock_mhz=1110,1410", "hydra.sweep.dir=basic"], work)
    assert grid.returncode == 0, grid.stderr[-2000:]
    assert [status for status, _, _ in stored(bin_dir, work, "basic")] == ["ok", "ok"]
    h200 = REPO / "data" / "measured" / "2026-12-04_h200_gpu_check"  # a user's rows, anywhere
    calibrate = run([dvfs, "calibrate", str(h200), "--profile", "h200_141gb", "--out",
                     "twin.yaml"], work)
    assert calibrate.returncode == 0, calibrate.stderr[-2000:]
    assert "achieved" in (work / "twin.yaml").read_text()
