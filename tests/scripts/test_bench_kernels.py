"""``scripts/bench_kernels.py`` at its smallest size: tiny kernels against small ceilings, a table
row per kernel and way (JAX, PyTorch eager, PyTorch compiled), every rate and ratio a finite
number and every check passed, and the ways' times side by side."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from support import REPO

WAYS = ["jax", "pytorch", "pytorch-compiled"]
KERNELS = [(name, way) for name in ("gemm", "stencil") for way in WAYS]


@pytest.mark.slow
def test_each_kernel_has_its_row_a_finite_share_of_its_roof_and_a_passed_check(tmp_path):
    out = tmp_path / "kernels.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "bench_kernels.py"), "--preset", "tiny",
         "--workloads", "gemm", "stencil", "--frameworks", *WAYS, "--repeats", "1",
         "--min-time", "0.01", "--matmul-n", "64", "--copy-elements", "4096",
         "--json", str(out)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["ceilings"]["matmul_n"] == 64
    assert math.isfinite(result["ceilings"]["matmul_gflops"])
    assert math.isfinite(result["ceilings"]["copy_gbs"]) and result["ceilings"]["copy_gbs"] > 0
    assert [(r["workload"], r["way"]) for r in result["rows"]] == KERNELS
    assert [r["framework"] for r in result["rows"]] == ["jax", "pytorch", "pytorch"] * 2
    for r in result["rows"]:
        assert math.isfinite(r["roof_ratio"]) and r["roof_ratio"] > 0, r
        assert r["time_s"] > 0 and r["verdict"] == "ok", r
    table = proc.stdout.splitlines()
    assert "| workload | framework | size | build s | ms/call |" in proc.stdout
    assert table[0].startswith("preset `tiny`, float32")
    for r in result["rows"]:
        (line,) = [ln for ln in table if ln.startswith(f"| {r['workload']} | {r['way']} |")]
        assert f"| {r['roof_ratio']:.2f} x {r['roof']} | ok (" in line
    assert "| workload | jax ms/call | pytorch ms/call | pytorch-compiled ms/call |" in table
    (stencil,) = [ln for ln in table if ln.startswith("| stencil | ") and "x JAX)" in ln]
    assert stencil.count("x JAX)") == 2
