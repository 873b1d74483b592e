"""Users' workloads and the study's models through `dvfs sweep -m`, end to end, on the sim.

Each test runs the `dvfs` command in a subprocess, as a user would: a worked user workload
(``examples/attention.py``) by target and by entry point in both frameworks, the mistakes a user
makes with one (exit 2, one line, nothing run), and ``experiment=seed_models`` through to its
report's memory table.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from support import DVFS

from orchestrator.results.store import ResultStore

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
TARGET = "examples.attention:make_workload"
QUICK_BASIC = ["measure=quick", "measure.settle_s=0", "quiet=true"]
QUICK = [*QUICK_BASIC, "hydra.launcher.progress=false"]  # the Ray launcher's progress line off


def dvfs(tmp_path, *args, env=None, timeout=600):
    env = {**os.environ, "DVFS_SIM_STATE_DIR": str(tmp_path / "sim"), **(env or {})}
    return subprocess.run([*DVFS, *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=timeout)


def rows_of(directory: Path) -> list[dict]:
    with ResultStore(directory, readonly=True) as store:
        return store.rows()


def test_a_users_workload_by_target_runs_in_both_frameworks_with_its_own_unit(tmp_path):
    d = tmp_path / "custom"
    out = dvfs(tmp_path, "sweep", "-m", "workload=custom", f"workload.target={TARGET}",
               "framework=jax,tensorflow", "device.sm_clock_mhz=1110,1410", *QUICK,
               f"hydra.sweep.dir={d}", env={"DVFS_WORKLOAD_PATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    rows = rows_of(d)
    assert len(rows) == 4 and {r["status"] for r in rows} == {"ok"}
    assert {r["framework"] for r in rows} == {"jax", "tensorflow"}
    # the sim charges the gpu preset's call (sim_size): 32 sequences of 1024 tokens
    tokens = 32 * 1024
    assert {(r["workload"], r["rate_unit"], r["items_per_call"]) for r in rows} == {
        ("attention", "tokens/s", tokens)}
    for r in rows:  # tokens per second: calls per second times the tokens of one call
        assert r["rate"] == pytest.approx(r["throughput"] * tokens)
        assert r["energy_per_item_j"] == pytest.approx(r["energy_per_iter_j"] / tokens)
        assert r["rel_error"] < 1e-5 and r["determinism_mismatches"] == 0
        # it gives no count: XLA's cost analysis of its compiled step says what a call does
        assert r["work_source"] in ("xla_cost_analysis", "tf_graph_ops")
        assert r["tflops"] > 0 and r["peak_memory_bytes"] > 0


def test_a_users_workload_by_entry_point_is_named_like_a_built_in(tmp_path):
    """A package's ``dvfs.workloads`` entry point (its dist-info on the path, as pip leaves it)
    makes ``workload=attention`` compose and run, in the driver and in the Ray workers."""
    site = tmp_path / "site"
    info = site / "my_attention-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-attention\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[dvfs.workloads]\nattention = {TARGET}\n")
    d = tmp_path / "entry"
    path = os.pathsep.join([str(site), str(ROOT), os.environ.get("PYTHONPATH", "")])
    out = dvfs(tmp_path, "sweep", "-m", "workload=attention", "framework=jax,tensorflow",
               "device.sm_clock_mhz=1410", *QUICK, f"hydra.sweep.dir={d}",
               env={"PYTHONPATH": path})
    assert out.returncode == 0, out.stderr
    rows = rows_of(d)
    assert [(r["workload"], r["rate_unit"], r["status"]) for r in rows] == [
        ("attention", "tokens/s", "ok")] * 2


@pytest.mark.parametrize(
    "args, message",
    [
        (["workload=custom"], "workload=custom needs workload.target=package.module:factory"),
        (["workload=custom", "workload.target=nowhere.mod:make"],
         "cannot import 'nowhere.mod'"),
        (["workload=custom", f"workload.target={TARGET.replace('make_workload', 'nope')}"],
         "module 'examples.attention' has no 'nope'"),
        (["workload=custom", "workload.target=math:pi"], "is a float, neither a kernels"),
        (["workload=resnet50_train", "workload.dtype=bfloat16"],
         "unknown dtype 'bfloat16' for workload 'resnet50_train'"),
    ],
)
def test_a_bad_workload_is_one_line_exit_2_before_anything_runs(tmp_path, args, message):
    out = dvfs(tmp_path, "sweep", "-m", *args, "device.sm_clock_mhz=1110,1410", *QUICK,
               f"hydra.sweep.dir={tmp_path / 'bad'}", env={"DVFS_WORKLOAD_PATH": str(ROOT)})
    assert out.returncode == 2, out.stderr
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], out.stderr
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "bad" / "trials.sqlite").exists()


def test_seed_models_compares_the_frameworks_on_each_model_and_reports_memory(tmp_path):
    d = tmp_path / "seed_models"
    # every model in every framework, at the default setting and one locked clock of the
    # experiment's four (a model's first trial, its build, is most of the time: ~10 s each)
    out = dvfs(tmp_path, "sweep", "-m", "experiment=seed_models", "device.sm_clock_mhz=null,1110",
               "quiet=true", "hydra.launcher.progress=false", f"hydra.sweep.dir={d}",
               timeout=1500)
    assert out.returncode == 0, out.stderr
    rows = rows_of(d)
    assert len(rows) == 3 * 3 * 2
    assert {r["workload"] for r in rows} == {"resnet50_train", "bert_train", "vit_train"}
    assert {r["framework"] for r in rows} == {"jax", "tensorflow", "pytorch"}
    assert {r["work_source"] for r in rows if r["framework"] == "pytorch"} == {
        "torch_dispatch_ops"}  # eager, as the study's PyTorch 1.13 ran
    ok = [r for r in rows if r["status"] == "ok"]
    assert len(ok) >= 15
    for r in ok:
        assert r["rate_unit"] == "samples/s" and r["items_per_call"] in (256, 32, 64)
        assert r["memory_source"].startswith("sim model")
        # the modelled footprint at the study's batch: GiBs, and NVML counts context and pool
        assert 2**30 < r["peak_memory_bytes"] < r["memory_used_after_bytes"]
    report = dvfs(tmp_path, "report", str(d))
    assert report.returncode == 0, report.stderr
    text = (d / "report" / "report.md").read_text()
    assert "## Frameworks side by side" in text and "samples/s" in text
    assert "(theirs: JAX 0.4.12, A100, ResNet-50 training)" in text


def test_a_users_workload_runs_on_the_cpu_device_too(tmp_path):
    """``device=cpu`` (no RAPL zone, as in a VM: time only) runs the example in both frameworks
    at its own size; the rows' rate is in tokens/s of that size, and memory is what each
    framework says on a CPU: JAX keeps no statistics there, TensorFlow's allocator does
    where oneDNN's allocator runs."""
    (tmp_path / "powercap").mkdir()
    d = tmp_path / "cpu"
    out = dvfs(tmp_path, "sweep", "-m", "device=cpu",
               "hydra/launcher=basic",  # in this process: the tests above run one through Ray
               f"device.powercap_root={tmp_path / 'powercap'}",
               f"device.journal_dir={tmp_path / 'journal'}", "workload=custom",
               f"workload.target={TARGET}", "framework=jax,tensorflow", *QUICK_BASIC,
               "workload.size=tiny",  # device=cpu computes its cpu preset unless told
               f"hydra.sweep.dir={d}", env={"DVFS_WORKLOAD_PATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    rows = {r["framework"]: r for r in rows_of(d)}
    assert set(rows) == {"jax", "tensorflow"}
    for r in rows.values():
        assert (r["workload"], r["status"], r["backend"]) == ("attention", "ok", "cpu")
        assert r["rate_unit"] == "tokens/s" and r["items_per_call"] == 2 * 32
        assert r["rate"] == pytest.approx(r["throughput"] * 64) and r["energy_j"] is None
    assert rows["jax"]["peak_memory_bytes"] is None
    assert "memory_stats() gives nothing" in rows["jax"]["memory_source"]
    tf_row = rows["tensorflow"]  # what TF's CPU allocator keeps: test_build checks which
    if tf_row["memory_source"] == "tf get_memory_info peak":
        assert tf_row["peak_memory_bytes"] >= 0
    else:
        assert tf_row["peak_memory_bytes"] is None
        assert tf_row["memory_source"].startswith("tf get_memory_info gives nothing")
