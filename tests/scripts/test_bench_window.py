"""``scripts/bench_window.py`` at its smallest size: one round of a short trial window against the
bare loop on the host, its table and JSON, the ratios finite."""

from __future__ import annotations

import json
import math
import subprocess
import sys

from support import REPO


def test_the_window_is_timed_against_the_bare_loop_with_finite_ratios(tmp_path):
    out = tmp_path / "window.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "bench_window.py"), "--preset", "tiny",
         "--window-s", "0.1", "--rounds", "1", "--workloads", "gemm", "--frameworks", "jax",
         "--json", str(out)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )
    assert proc.returncode in (0, 1), proc.stderr[-3000:]  # 1: over the target, not a failure
    (row,) = json.loads(out.read_text())
    assert "error" not in row, row
    assert (row["workload"], row["framework"], row["preset"]) == ("gemm", "jax", "tiny")
    for key in ("ratio", "control_ratio", "host_digest_ratio"):
        assert math.isfinite(row[key]) and row[key] > 0, (key, row[key])
    assert len(row["rounds_s"]["trial"]) == len(row["rounds_s"]["bare"]) == 1
    assert proc.stdout.startswith("| workload | framework | trial ms/iter | bare ms/iter |")
    assert f"| gemm | jax | {row['trial_s_per_iter'] * 1e3:.3f} |" in proc.stdout
    assert f"worst trial/bare ratio {row['ratio']:.3f}" in proc.stdout
    assert (proc.returncode == 0) == (row["ratio"] <= 1.03)
