"""Every column a stored row carries is declared once (``orchestrator/results/columns.py``).

Real trials on the simulated GPU (ok, wrong, out of memory, a crashed kernel, a program as a
trial with its windows, the launcher's failure rows with their ``launch`` facts) are stored and
read back, and every key of every row, and of the maps the declaration types, must be declared:
a ``row["new_thing"] = 1`` anywhere on the way fails here. The launcher's own rows are checked
on a real Ray sweep in ``test_launch.py``.
"""

from __future__ import annotations

from pathlib import Path

from test_memory import FAST, small_board

from analysis import ROW_COLUMNS as ANALYSIS_COLUMNS
from orchestrator.config import compose
from orchestrator.devices import journal_dir, open_backend
from orchestrator.devices.base import DeviceIdentity
from orchestrator.jobs.job import JobSpec
from orchestrator.measuring.guard import SettingsGuard
from orchestrator.measuring.journal import Journal
from orchestrator.measuring.trial import TrialContext, run_trial
from orchestrator.results.columns import ROW_COLUMNS, undeclared
from orchestrator.results.rows import Status, add_launch, failure_rows
from orchestrator.results.store import ResultStore
from orchestrator.results.store.sqlite import INDEXED_COLUMNS


def stored(tmp_path: Path, rows: list[dict]) -> list[dict]:
    """``rows`` as the store gives them back."""
    with ResultStore(tmp_path / "store") as store:
        for row in rows:
            store.put(row)
        return [r for r in store.rows() if r["trial_key"] in {x["trial_key"] for x in rows}]


def test_the_rows_of_real_trials_carry_only_declared_columns(run, tmp_path):
    planted = "device.planted_thresholds={0: {gemm: 1065}}"
    ok, _ = run(*FAST)
    wrong, _ = run(planted, "device.sm_clock_mhz=900", "measure.min_iters=40")
    oom, _ = run("workload=gemm", f"device.profile={small_board(tmp_path)}", *FAST)
    rows = ok + wrong + oom
    assert {r["status"] for r in rows} >= {Status.OK, Status.OUT_OF_MEMORY}
    assert wrong[0]["status"] != Status.OK
    for row in stored(tmp_path, rows):
        assert undeclared(row) == [], row["status"]


def test_a_crashed_kernel_and_the_launchers_failure_rows_carry_only_declared_columns(
        run, tmp_path):
    class Exploding:
        builds = 0

        def get(self, *a, **k):
            raise RuntimeError("CUDA_ERROR_ILLEGAL_ADDRESS")

    cfg = run.compose("measure.repeats=2")
    crashed, _ = run(cfg=cfg, kernels=Exploding())
    identity = DeviceIdentity(index=0, uuid="GPU-0", name="NVIDIA A100-SXM4-40GB",
                              pci_bus_id="0:0", driver_version="555", backend="sim",
                              architecture="ampere")
    lost = failure_rows(JobSpec.from_config(cfg), identity, Status.NOT_MEASURED, "worker died",
                        sweep_id="s")
    add_launch(lost, {"launcher": "ray_gpus", "host": "h", "node_id": None, "worker_pid": 1,
                      "ray_gpu_id": "0", "worker_restarts": 0, "job_num": 0,
                      "dispatched_at": 1.0, "died_at": 2.0})
    assert [r["status"] for r in crashed] == [Status.CRASH] * 2
    for row in stored(tmp_path, crashed + lost):
        assert undeclared(row) == []
    assert undeclared({**lost[0], "launch": {"launcher": "ray_gpus", "new_thing": 1}}) == [
        "launch.new_thing"]


def test_a_program_trial_with_windows_carries_only_declared_columns(tmp_path):
    code = "import dvfs\nwith dvfs.window('step', items=4): pass\ndvfs.report_result(1.0)"
    cfg = compose(["workload=command", "workload.argv=[python]", "measure=quick",
                   "measure.settle_s=0", f"device.state_dir={tmp_path / 'sim'}"])
    cfg.workload.argv = ["python", "-c", code]
    job = JobSpec.from_config(cfg)
    backend = open_backend(cfg.device)
    guard = SettingsGuard(backend.device(0), Journal(journal_dir(cfg.device))).__enter__()
    try:
        rows = run_trial(TrialContext(device=backend.device(0), guard=guard, kernels=None), job)
    finally:
        guard.close()
        backend.close()
    assert rows[0]["program_windows"], rows[0]["error"]
    for row in stored(tmp_path, rows):
        assert undeclared(row) == []


def test_the_columns_analysis_and_the_store_name_are_declared():
    assert set(ANALYSIS_COLUMNS) <= set(ROW_COLUMNS)
    assert set(INDEXED_COLUMNS) <= set(ROW_COLUMNS)
    assert undeclared({"status": "ok", "new_thing": 1}) == ["new_thing"]
