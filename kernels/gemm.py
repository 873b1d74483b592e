"""GEMM: ``C = A @ B`` with A of shape (M, K) and B of shape (K, N): compute-bound.

Variants: ``square`` (M = K = N) and ``rect`` (three different extents, so a transposed operand
or a swapped extent cannot pass the reference check by accident). In float32 the precision knob
picks full fp32 or TF32 on GPUs; in bfloat16 the inputs and the output are bf16 (accumulation is
the framework's, fp32 on every backend we use).

Counts: ``2 * M * N * K`` FLOPs (one multiply-add per term); bytes: A and B read once, C
written once, ``(M*K + K*N + M*N) * itemsize``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from kernels.frameworks import import_jax, import_tensorflow, import_torch
from kernels.spec import KernelSpec, WorkCounts, make_sizes, module_hooks


class GemmSize(NamedTuple):
    """Extents of ``C[M, N] = A[M, K] @ B[K, N]``."""

    m: int
    k: int
    n: int


SIZES = make_sizes(
    tiny={"square": GemmSize(64, 64, 64), "rect": GemmSize(96, 48, 80)},
    cpu={"square": GemmSize(2048, 2048, 2048), "rect": GemmSize(4096, 1024, 2048)},
    gpu={"square": GemmSize(8192, 8192, 8192), "rect": GemmSize(32768, 4096, 8192)},
)


def count_work(size: GemmSize, itemsize: int) -> WorkCounts:
    """FLOPs and minimum bytes of one call (see the module docstring)."""
    m, k, n = size
    return WorkCounts(flops=2.0 * m * n * k, bytes_moved=float(m * k + k * n + m * n) * itemsize)


def input_shapes(size: GemmSize) -> tuple[tuple[int, ...], ...]:
    """The shapes of A and B, without making them."""
    return (size.m, size.k), (size.k, size.n)


def make_inputs(size: GemmSize, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A and B, standard normal in float64."""
    return rng.standard_normal((size.m, size.k)), rng.standard_normal((size.k, size.n))


def reference(size: GemmSize, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` in float64."""
    return a @ b


def jax_function(size: GemmSize) -> Any:
    """``a @ b`` in ``jax.numpy`` (precision from ``jax_default_matmul_precision``)."""
    jnp = import_jax().numpy

    def gemm(a, b):
        return jnp.matmul(a, b)

    return gemm


def tf_function(size: GemmSize) -> Any:
    """``a @ b`` in TensorFlow (precision from the TF32 switch)."""
    tf = import_tensorflow()

    def gemm(a, b):
        return tf.linalg.matmul(a, b)

    return gemm


def torch_function(size: GemmSize) -> Any:
    """``a @ b`` in PyTorch (precision from ``torch.set_float32_matmul_precision``)."""
    torch = import_torch()

    def gemm(a, b):
        return torch.matmul(a, b)

    return gemm


SPEC = KernelSpec(
    name="gemm",
    description="C = A @ B, square and rectangular (compute-bound)",
    sizes=SIZES, dtypes=("float32", "bfloat16"), precisions=("default", "highest", "tf32"),
    compute_bound=True, uses_matmul=True, **module_hooks(globals()),
)
