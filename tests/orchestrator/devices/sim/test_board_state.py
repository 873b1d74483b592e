"""One state directory, many boards: each simulated machine finds its own state without the user
naming a directory per board, and a state directory made for one board keeps working.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from support import DVFS, REPO

from orchestrator.devices import SIM_STATE_ENV, journal_dir, open_backend, sim_state_dir
from orchestrator.devices.sim.state import MACHINES_DIR


def board(profile: str, **more) -> dict:
    return {"backend": "sim", "profile": profile, **more}


def names_in(state) -> list[str]:
    """The GPU name of the machine in a state directory."""
    return [g["profile"] for g in json.loads((state / "machine.json").read_text())["gpus"]]


def open_board(cfg: dict, **kw):
    with open_backend(cfg, **kw) as backend:
        return backend.device(0).identity.name, os.environ[SIM_STATE_ENV]


@pytest.fixture
def root(sim_dir):
    """A state directory that already holds an A100 machine (made before boards had their own)."""
    open_board(board("a100_sxm4_40gb"))
    return sim_dir


def test_another_board_gets_its_own_machine_beside_the_first(root):
    name, where = open_board(board("h100_sxm5_80gb"))
    assert name == "NVIDIA H100 80GB HBM3"
    assert os.path.dirname(where) == str(root / MACHINES_DIR)
    assert names_in(root) == ["a100_sxm4_40gb"]  # the first board is where it was
    assert names_in(root / MACHINES_DIR / os.path.basename(where)) == ["h100_sxm5_80gb"]


def test_each_board_finds_its_own_machine_again_from_wherever_the_last_one_was_exported(root):
    """A process that opened one board has exported that board's directory: the next board is
    found beside it, not inside it (the basic launcher opens them one after the other)."""
    dirs = {p: open_board(board(p))[1] for p in ("h100_sxm5_80gb", "h200_141gb")}
    assert open_board(board("a100_sxm4_40gb"))[1] == str(root)
    for profile, where in dirs.items():
        assert open_board(board(profile))[1] == where
    assert sorted(os.listdir(root / MACHINES_DIR)) == sorted(os.path.basename(d)
                                                           for d in dirs.values())


def test_a_count_or_a_seed_of_its_own_is_a_machine_of_its_own(root):
    four = open_board(board("a100_sxm4_40gb", count=4))[1]
    seeded = open_board(board("a100_sxm4_40gb", seed=7))[1]
    assert len({four, seeded, str(root)}) == 3
    assert len(names_in(type(root)(four))) == 4


def test_an_unused_state_directory_holds_its_first_machine_itself(sim_dir):
    assert open_board(board("h200_141gb"))[1] == str(sim_dir)
    assert names_in(sim_dir) == ["h200_141gb"]


def test_the_journal_of_each_board_is_its_own(root):
    open_board(board("h100_sxm5_80gb"))
    a100, h100 = journal_dir(board("a100_sxm4_40gb")), journal_dir(board("h100_sxm5_80gb"))
    assert a100 == root / "journal"
    assert h100.parent.parent == root / MACHINES_DIR


def test_joining_takes_the_machine_of_the_spec_else_the_one_in_the_directory(root):
    """``dvfs restore`` and a cluster node's workers join: a board made beside the first is
    found; where none of the config's spec exists, the machine in the directory is the one meant
    (a node made with its own seed)."""
    _, h100 = open_board(board("h100_sxm5_80gb"))
    assert str(sim_state_dir(board("h100_sxm5_80gb"), join_existing=True)) == h100
    other_seed = board("a100_sxm4_40gb", seed=3)
    assert sim_state_dir(other_seed, join_existing=True) == root
    assert open_board(other_seed, join_existing=True)[1] == str(root)
    assert not (root / MACHINES_DIR / "a100_sxm4_40gbx1").exists()


HOLDER = """
import sys, time
from orchestrator.devices import journal_dir, open_backend
from orchestrator.jobs.request import SettingsRequest
from orchestrator.measuring.guard import SettingsGuard
from orchestrator.measuring.journal import Journal
cfg = {"backend": "sim", "profile": sys.argv[1]}
b = open_backend(cfg)
g = SettingsGuard(b.device(0), Journal(journal_dir(cfg))).__enter__()
g.apply(SettingsRequest(power_limit_w=250))
print("applied", flush=True)
time.sleep(60)
"""


def killed_while_set(profile: str) -> None:
    """A process that set a board's power limit and was killed (``kill -9``) before restoring."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, profile], cwd=REPO,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "applied"
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def power_limit_w(profile: str) -> float:
    with open_backend(board(profile)) as b:
        return b.device(0).settings().power_limit_w


@pytest.mark.slow
def test_dvfs_restore_puts_back_the_board_it_is_named_and_else_the_directorys_own(sim_dir):
    open_board(board("h200_141gb"))  # the directory's own machine: not the default profile
    killed_while_set("h100_sxm5_80gb")
    killed_while_set("h200_141gb")
    assert power_limit_w("h100_sxm5_80gb") == power_limit_w("h200_141gb") == 250
    env = dict(os.environ, DVFS_SIM_STATE_DIR=str(sim_dir))
    for args in (["device.profile=h100_sxm5_80gb"], []):
        out = subprocess.run([*DVFS, "restore", *args], cwd=REPO, env=env, capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0 and "restored 1 device(s)" in out.stdout, (out.stdout,
                                                                            out.stderr)
    assert power_limit_w("h100_sxm5_80gb") == power_limit_w("h200_141gb") == 700
