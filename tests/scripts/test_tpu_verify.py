"""``scripts/tpu_verify.sh`` as its header says to try it before a TPU: both phases on the host CPU
(``device=cpu``) at the tiny size, over one workload."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from support import REPO


@pytest.mark.slow
def test_both_phases_run_on_the_cpu_and_leave_their_rows_under_out(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable, "WORKLOADS": "gemm",
           "TMPDIR": str(tmp_path)}
    proc = subprocess.run(["bash", str(REPO / "scripts" / "tpu_verify.sh"), "all", "cpu", "tiny"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "bench: exit 0" in proc.stdout and "sweep: exit 0" in proc.stdout
    bench = [json.loads(line) for line in (out / "bench_rows.jsonl").read_text().splitlines()]
    assert bench and {(r["workload"], r["backend"], r["status"]) for r in bench} == {
        ("gemm", "cpu", "ok")}
    assert all(r["host_peak_bytes"] > 0 and r["check_arithmetic"] for r in bench)
    assert "| gemm | jax |" in (out / "bench.md").read_text()
    sweep = [json.loads(line) for line in (out / "sweep_rows.jsonl").read_text().splitlines()]
    assert sorted(r["repeat"] for r in sweep) == [0, 1]  # measure.repeats=2
    assert all(r["status"] == "ok" and r["size"] == "tiny" for r in sweep)
