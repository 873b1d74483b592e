"""Safety: corrupt stores and journals are reported and left as they are; who may change what.

- A corrupt ``trials.sqlite`` makes ``dvfs sweep`` and ``dvfs report`` exit 2 with one line naming
  the file, and the file's bytes do not change.
- A corrupt journal entry makes ``dvfs restore`` and a new sweep on that GPU refuse in one line
  naming the file, and its bytes do not change.
- The guard's policy file is read only from a path nobody but its owner can write; a setting
  outside it is refused even as root; nothing under ``orchestrator/``, ``analysis/`` or
  ``kernels/`` unpickles anything or loads YAML unsafely.
"""

from __future__ import annotations

import ast
import json
import os
import sqlite3
import subprocess
from pathlib import Path

import pytest
from support import DVFS, REPO

from orchestrator.devices import open_backend
from orchestrator.errors import UserError
from orchestrator.jobs.policy import load_policy
from orchestrator.results.store import ResultStore

QUICK = ["workload.size=tiny", "measure=quick", "measure.settle_s=0"]


def dvfs(tmp_path, *args):
    env = dict(os.environ, DVFS_SIM_STATE_DIR=str(tmp_path / "sim"))
    return subprocess.run(
        [*DVFS, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180
    )


def one_line_exit_2(out, *words):
    """The command refused in one line of stderr that holds every word, without a traceback."""
    assert out.returncode == 2, (out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    for word in words:
        assert word in lines[0], (word, lines[0])


def sim_gpu(tmp_path):
    """The UUID of the sweep's simulated GPU, and the journal directory it uses."""
    with open_backend({"backend": "sim", "state_dir": str(tmp_path / "sim")}) as b:
        return b.device(0).identity.uuid, tmp_path / "sim" / "journal"


def power_limit_w(tmp_path):
    with open_backend(
        {"backend": "sim", "state_dir": str(tmp_path / "sim")}, join_existing=True
    ) as b:
        return b.device(0).settings().power_limit_w


# --- corrupt results stores --------------------------------------------------------------------
def _garbage(path: Path) -> None:
    path.write_bytes(os.urandom(4096))


def _header_then_garbage(path: Path) -> None:
    path.write_bytes(b"SQLite format 3\x00" + os.urandom(4080))


def _foreign_database(path: Path) -> None:
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE photos (id INTEGER)")
    db.close()


CORRUPTIONS = [_garbage, _header_then_garbage, _foreign_database]


@pytest.mark.parametrize("corrupt", CORRUPTIONS, ids=lambda f: f.__name__.strip("_"))
def test_a_corrupt_store_stops_dvfs_sweep_and_is_left_as_it_was(tmp_path, corrupt):
    store = tmp_path / "run" / "trials.sqlite"
    store.parent.mkdir()
    corrupt(store)
    before = store.read_bytes()
    out = dvfs(
        tmp_path, "sweep", *QUICK, f"hydra.run.dir={tmp_path / 'run'}", "device.power_limit_w=250"
    )
    one_line_exit_2(out, str(store))
    assert store.read_bytes() == before
    assert not list((tmp_path / "sim" / "journal").glob("*.json"))
    assert power_limit_w(tmp_path) == 400


def test_a_corrupt_store_stops_a_multirun_and_is_left_as_it_was(tmp_path):
    store = tmp_path / "sweep" / "trials.sqlite"
    store.parent.mkdir()
    _header_then_garbage(store)
    before = store.read_bytes()
    out = dvfs(tmp_path, "sweep", "-m", "hydra/launcher=basic", *QUICK,
               f"hydra.sweep.dir={tmp_path / 'sweep'}", "device.sm_clock_mhz=1200,1305")
    one_line_exit_2(out, str(store))
    assert store.read_bytes() == before


@pytest.mark.parametrize("corrupt", CORRUPTIONS, ids=lambda f: f.__name__.strip("_"))
def test_a_corrupt_store_stops_dvfs_report_and_is_left_as_it_was(tmp_path, corrupt):
    store = tmp_path / "sweep" / "trials.sqlite"
    store.parent.mkdir()
    corrupt(store)
    before = store.read_bytes()
    out = dvfs(tmp_path, "report", str(tmp_path / "sweep"), "--out", str(tmp_path / "report"))
    one_line_exit_2(out, str(store))
    assert store.read_bytes() == before


def test_a_stored_row_that_is_not_json_stops_dvfs_report_naming_the_file(tmp_path):
    with ResultStore(tmp_path / "sweep") as store:
        store.put({"trial_key": "k", "repeat": 0, "status": "ok"})
    path = tmp_path / "sweep" / "trials.sqlite"
    with sqlite3.connect(path) as db:
        db.execute("UPDATE trials SET row_json = '{not json'")
    db.close()
    before = path.read_bytes()
    out = dvfs(tmp_path, "report", str(tmp_path / "sweep"), "--out", str(tmp_path / "report"))
    one_line_exit_2(out, str(path), "not valid JSON")
    assert path.read_bytes() == before


# --- corrupt journal entries -------------------------------------------------------------------
JOURNAL_CORRUPTIONS = {
    "truncated": b'{"version": 1, "uuid": "GPU-',
    "not_utf8": b"\xff\xfe\x00garbage",
    "a_list": b"[1, 2, 3]",
    "changed_not_a_list": json.dumps(
        {"version": 1, "changed": "power_limit", "original": {}}
    ).encode(),
    "unknown_setting": json.dumps({"version": 1, "changed": ["voltage"], "original": {}}).encode(),
    "original_not_a_dict": json.dumps(
        {"version": 1, "changed": ["power_limit"], "original": 5}
    ).encode(),
}


@pytest.mark.parametrize("content", JOURNAL_CORRUPTIONS.values(), ids=JOURNAL_CORRUPTIONS.keys())
def test_a_corrupt_journal_entry_stops_dvfs_restore_and_is_left_as_it_was(tmp_path, content):
    uuid, journal = sim_gpu(tmp_path)
    entry = journal / f"{uuid}.json"
    journal.mkdir(parents=True, exist_ok=True)
    entry.write_bytes(content)
    out = dvfs(tmp_path, "restore")
    one_line_exit_2(out, str(entry), "corrupt")
    assert entry.read_bytes() == content


@pytest.mark.parametrize("content",
                         [JOURNAL_CORRUPTIONS["truncated"], JOURNAL_CORRUPTIONS["a_list"]],
                         ids=["truncated", "a_list"])
def test_a_corrupt_journal_entry_stops_a_new_sweep_on_that_gpu(tmp_path, content):
    uuid, journal = sim_gpu(tmp_path)
    entry = journal / f"{uuid}.json"
    journal.mkdir(parents=True, exist_ok=True)
    entry.write_bytes(content)
    out = dvfs(
        tmp_path, "sweep", *QUICK, f"hydra.run.dir={tmp_path / 'run'}", "device.power_limit_w=250"
    )
    one_line_exit_2(out, str(entry), "corrupt")
    assert entry.read_bytes() == content
    assert power_limit_w(tmp_path) == 400


# --- who may change what -----------------------------------------------------------------------
POLICY = "default:\n  power_range_w: [150, 300]\n"


@pytest.fixture
def policy(tmp_path):
    """A policy file only its owner can write, in a directory only its owner can write."""
    directory = tmp_path / "policy"
    directory.mkdir(mode=0o755)
    path = directory / "policy.yaml"
    path.write_text(POLICY)
    path.chmod(0o644)
    return path


def test_a_policy_file_only_its_owner_can_write_is_read(policy):
    assert load_policy(policy, "NVIDIA A100-SXM4-40GB").power_range_w == (150, 300)


@pytest.mark.parametrize("mode", [0o664, 0o646, 0o666])
def test_a_policy_file_writable_by_group_or_others_is_refused(policy, mode):
    policy.chmod(mode)
    with pytest.raises(UserError, match="writable by others.*chmod go-w"):
        load_policy(policy, "NVIDIA A100-SXM4-40GB")


def test_a_policy_file_in_a_directory_others_can_write_is_refused(policy):
    policy.parent.chmod(0o777)
    with pytest.raises(UserError, match=f"directory {policy.parent} is writable by others"):
        load_policy(policy, "NVIDIA A100-SXM4-40GB")
    policy.parent.chmod(0o1777)  # sticky, as /tmp: others cannot replace a file they do not own
    assert load_policy(policy, "NVIDIA A100-SXM4-40GB").power_range_w == (150, 300)


def test_a_policy_file_owned_by_someone_else_is_refused(policy):
    if os.geteuid() != 0:
        pytest.skip("chown needs root")
    os.chown(policy, 12345, 12345)
    with pytest.raises(UserError, match="owned by uid 12345, neither you nor root"):
        load_policy(policy, "NVIDIA A100-SXM4-40GB")


def test_a_loose_policy_file_stops_dvfs_sweep_before_any_setting(tmp_path, policy):
    policy.chmod(0o666)
    out = dvfs(tmp_path, "sweep", *QUICK, f"hydra.run.dir={tmp_path / 'run'}",
               f"device.policy_file={policy}", "device.power_limit_w=250")
    one_line_exit_2(out, "writable by others")
    assert power_limit_w(tmp_path) == 400


def test_a_setting_outside_the_policy_is_refused_even_as_root(tmp_path, policy):
    # The tests run as root here: root may set anything the driver allows, the policy still binds.
    out = dvfs(tmp_path, "sweep", *QUICK, f"hydra.run.dir={tmp_path / 'run'}",
               f"device.policy_file={policy}",
               "device.power_limit_w=350")  # the A100 allows 100-400 W; the policy 150-300 W
    one_line_exit_2(out, "power limit 350 W is outside the policy's allowed range 150-300 W")
    assert power_limit_w(tmp_path) == 400
    assert not list((tmp_path / "sim" / "journal").glob("*.json"))
    assert not (tmp_path / "run" / "trials.sqlite").exists()


# --- nothing is unpickled ----------------------------------------------------------------------
UNSAFE_MODULES = {
    "pickle", "cPickle", "_pickle", "dill", "cloudpickle", "shelve", "marshal", "jsonpickle"
}
SAFE_YAML_LOADERS = {"SafeLoader", "CSafeLoader", "BaseLoader", "CBaseLoader"}


def _unsafe_calls(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [
                f"import {a.name}" for a in node.names if a.name.split(".")[0] in UNSAFE_MODULES
            ]
        elif (isinstance(node, ast.ImportFrom)
              and (node.module or "").split(".")[0] in UNSAFE_MODULES):
            found.append(f"from {node.module} import ...")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value.id if isinstance(node.func.value, ast.Name) else ""
            name = node.func.attr
            keywords = {k.arg: k.value for k in node.keywords}
            if (name in ("read_pickle", "unsafe_load", "full_load", "load_all")
                    and owner in ("pd", "pandas", "yaml")):
                found.append(f"{owner}.{name}(...)")
            elif owner in ("np", "numpy") and name == "load":
                flag = keywords.get("allow_pickle")
                if (isinstance(flag, ast.Constant) and flag.value is not False
                        or (flag is not None and not isinstance(flag, ast.Constant))):
                    found.append("np.load(allow_pickle=...)")
            elif owner == "yaml" and name == "load":
                loader = keywords.get("Loader", node.args[1] if len(node.args) > 1 else None)
                loader_name = getattr(loader, "attr", getattr(loader, "id", None))
                if loader_name not in SAFE_YAML_LOADERS:
                    found.append(f"yaml.load(Loader={loader_name})")
            elif owner == "torch" and name == "load":
                found.append("torch.load(...)")
    return found


def test_the_unsafe_call_finder_finds_what_it_looks_for():
    code = (
        "import pickle\nfrom dill import loads\nimport numpy as np, yaml\n"
        "np.load('x', allow_pickle=True)\nyaml.load(s, Loader=yaml.Loader)\nyaml.load(s)\n"
        "yaml.load(s, Loader=yaml.SafeLoader)\nnp.load('x')\nyaml.safe_load(s)\n"
    )
    assert _unsafe_calls(ast.parse(code)) == [
        "import pickle", "from dill import ...", "np.load(allow_pickle=...)",
        "yaml.load(Loader=Loader)", "yaml.load(Loader=None)",
    ]


def test_nothing_in_orchestrator_analysis_or_kernels_unpickles_or_loads_yaml_unsafely():
    offenders = {}
    for package in ("orchestrator", "analysis", "kernels"):
        for path in sorted((REPO / package).rglob("*.py")):
            found = _unsafe_calls(ast.parse(path.read_text(), filename=str(path)))
            if found:
                offenders[str(path.relative_to(REPO))] = found
    assert offenders == {}
