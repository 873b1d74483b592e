"""`dvfs --help`, `dvfs devices`: fast, light, and one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from support import DVFS, REPO


def run(tmp_path, *args):
    env = dict(os.environ, DVFS_SIM_STATE_DIR=str(tmp_path / "sim"))
    return subprocess.run(
        [*DVFS, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize("argv", [["--help"], ["devices", "--json"], ["report", "--help"]])
def test_light_commands_import_no_framework_nor_ray(tmp_path, argv):
    code = (
        "import sys, runpy; sys.argv = ['dvfs', *sys.argv[1:]]\n"
        "from orchestrator.cli import main\n"
        "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
        "heavy = [m for m in ('jax', 'tensorflow', 'torch', 'ray') if m in sys.modules]\n"
        "print('HEAVY=' + ','.join(heavy))\n"
    )
    env = dict(os.environ, DVFS_SIM_STATE_DIR=str(tmp_path / "sim"))
    out = subprocess.run(
        [sys.executable, "-c", code, *argv],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )
    assert "HEAVY=\n" in out.stdout, out.stdout + out.stderr


def test_devices_lists_the_simulated_gpus_with_what_may_be_set(tmp_path):
    out = run(tmp_path, "devices", "device.count=2", "device.profile=h100_sxm5_80gb", "--json")
    assert out.returncode == 0, out.stderr
    listing = json.loads(out.stdout)
    assert listing["backend"] == "sim" and "simulated GPU" in listing["note"]
    a, b = listing["devices"]
    assert (a["index"], b["index"]) == (0, 1)
    assert a["name"] == "NVIDIA H100 80GB HBM3"
    assert (a["sm_clock_min_mhz"], a["sm_clock_max_mhz"]) == (345, 1980)
    assert a["sm_clock_count"] == (1980 - 345) // 15 + 1
    assert (a["power_limit_min_w"], a["power_limit_default_w"]) == (200, 700)
    assert a["uuid"] != b["uuid"]
    text = run(tmp_path, "devices")
    assert "NVIDIA H100 80GB HBM3" in text.stdout and "345-1980 MHz" in text.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["device.profile=a99"], "no simulated GPU profile 'a99'"),
        (["device.gpus=[3]"], "no GPU with index 3: this machine has 1 (valid indices: 0)"),
        (["devic.count=2"], "Could not override 'devic.count'"),
    ],
)
def test_devices_bad_input_is_one_line_and_exit_2(tmp_path, args, message):
    out = run(tmp_path, "devices", *args)
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert message in out.stderr


def test_an_unknown_command_is_exit_2(tmp_path):
    out = run(tmp_path, "sweeep")
    assert out.returncode == 2 and "unknown command 'sweeep'" in out.stderr


def test_version_says_pyprojects_version_and_the_checkouts_commit(capsys):
    import tomllib

    import orchestrator
    from orchestrator.cli import main

    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"dvfs {version} (git {commit[:12]})\n"
    assert orchestrator.__version__ == version


def test_a_source_tree_never_installed_reads_its_version_from_pyproject(monkeypatch):
    import importlib.metadata as md

    from orchestrator.results import provenance

    def not_installed(name):
        raise md.PackageNotFoundError(name)

    monkeypatch.setattr(md, "version", not_installed)
    provenance.package_version.cache_clear()
    try:
        import tomllib

        version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
        assert provenance.package_version() == version
    finally:
        provenance.package_version.cache_clear()
