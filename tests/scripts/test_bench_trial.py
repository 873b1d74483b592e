"""``scripts/bench_trial.py`` at its smallest size, as a user runs it: a table, JSON, no output
copied to the host."""

from __future__ import annotations

import json
import subprocess
import sys

from support import REPO


def test_bench_trial_prints_each_phase_and_the_bytes_a_trial_copied(tmp_path):
    out = tmp_path / "rows.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "bench_trial.py"), "--preset", "tiny",
         "--window-s", "0.2", "--workloads", "gemm", "--frameworks", "jax", "--json", str(out)],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )
    assert proc.returncode in (0, 1), proc.stderr[-2000:]  # 1: a target missed, not a failure
    (result,) = json.loads(out.read_text())
    assert "error" not in result, result
    assert result["status"] == "ok" and result["reference_builds"] == 1
    assert result["window_s"] >= 0.2
    assert result["bytes_to_host"] == 8 * result["checked_iters"] + 8  # one distinct sample
    assert result["meets_targets"] == (proc.returncode == 0)
    assert "| gemm | jax |" in proc.stdout
    assert ("met" if proc.returncode == 0 else "MISSED") in proc.stdout.splitlines()[2]
