"""A simulated GPU from a user's own profile file: ``device.profile=/path/board.yaml``.

Same schema as the shipped profiles; a relative path is resolved once, so every process of a
sweep reads the same file; a bad file is one line on stderr and exit code 2, naming the file.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from support import DVFS

from orchestrator.devices.sim.profile import ProfileError, load_profile, profile_dir

SHIPPED = profile_dir() / "a100_sxm4_40gb.yaml"


def my_board(tmp_path, filename="board.yaml", replace=None):
    """A copy of the shipped A100 profile with some top-level lines replaced."""
    lines = SHIPPED.read_text().splitlines()
    for key, value in (replace or {}).items():
        lines = [f"{key}: {value}" if line.startswith(f"{key}:") else line for line in lines]
    path = tmp_path / filename
    path.write_text("\n".join(lines) + "\n")
    return path


def dvfs(tmp_path, *args):
    env = dict(os.environ, DVFS_SIM_STATE_DIR=str(tmp_path / "sim"))
    return subprocess.run([*DVFS, *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)


def test_a_users_file_loads_with_its_own_values_keyed_by_its_absolute_path(tmp_path, monkeypatch):
    path = my_board(tmp_path, "mine.yaml", {"memory_bandwidth_gbs": 2039})
    monkeypatch.chdir(tmp_path)
    profile = load_profile("mine.yaml")
    assert profile.key == str(path.resolve())
    assert profile.memory_bandwidth_gbs == 2039
    assert profile.sm_clocks_mhz == load_profile("a100_sxm4_40gb").sm_clocks_mhz


def test_dvfs_devices_shows_the_board_of_a_relative_profile_path(tmp_path):
    my_board(tmp_path, replace={"name": '"NVIDIA A100-SXM4-80GB"'})
    out = dvfs(tmp_path, "devices", "device.profile=board.yaml", "--json")
    assert out.returncode == 0, out.stderr
    (gpu,) = json.loads(out.stdout)["devices"]
    assert gpu["name"] == "NVIDIA A100-SXM4-80GB"


@pytest.mark.parametrize(
    "content, message",
    [
        ("name: x\narchitecture: ampere\n  bad: [\n", "not valid YAML (line 3)"),
        ("- just\n- a list\n", "expected a mapping at the top level"),
        (None, "power_w: missing hbm"),
        (None, "missing key 'sensors'"),
    ],
)
def test_a_bad_profile_file_is_one_line_and_exit_2(tmp_path, content, message):
    path = tmp_path / "bad.yaml"
    if content is not None:
        path.write_text(content)
    else:
        drop = "  hbm:" if "hbm" in message else "sensors:"
        lines = SHIPPED.read_text().splitlines()
        if drop == "sensors:":
            lines = lines[: next(i for i, line in enumerate(lines) if line.startswith(drop))]
        else:
            lines = [line for line in lines if not line.startswith(drop)]
        path.write_text("\n".join(lines) + "\n")
    out = dvfs(tmp_path, "devices", f"device.profile={path}")
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert str(path) in out.stderr and message in out.stderr


def test_a_missing_file_names_the_path_and_the_shipped_profiles(tmp_path):
    with pytest.raises(ProfileError, match=r"no such profile file .*nothere\.yaml.*a100_sxm4_40gb"):
        load_profile(str(tmp_path / "nothere.yaml"))
