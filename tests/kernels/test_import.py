"""``import kernels`` stays light: no JAX, TensorFlow, PyTorch or ml_dtypes until a kernel is
built."""

from __future__ import annotations

import subprocess
import sys

from kernel_testing import REPO

PROBE = """
import sys
import numpy as np
import kernels
from kernels import get_spec, list_workloads, check_outputs, build_kernel, KernelCache
from kernels import KernelOptions
for name in list_workloads():
    spec = get_spec(name)
    for preset in spec.presets:
        for dtype in spec.dtypes:
            spec.counts(preset=preset, dtype=dtype)
            spec.peak(dtype, "default")
x = np.arange(1.0, 9.0, dtype=np.float32)
check_outputs([x], x.astype(np.float64), "float32", "default", "selu")
BAD = [("nope", "jax"), ("gemm", "jax", "huge"), ("gemm", "torch"), ("gemm", "jax", "tiny", "int8")]
for bad in BAD:
    try:
        build_kernel(KernelOptions(*bad))
    except ValueError:
        pass
    else:
        raise SystemExit(f"no error for {bad}")
heavy = [m for m in ("jax", "jaxlib", "tensorflow", "torch", "ml_dtypes") if m in sys.modules]
print("HEAVY", heavy)
"""


def test_import_kernels_loads_no_framework_even_after_counts_checks_and_refused_builds():
    result = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "HEAVY []" in result.stdout
