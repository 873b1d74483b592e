"""SELU, the scaled exponential linear unit, elementwise: memory-bound, with a transcendental.

``selu(x) = scale * x`` for ``x > 0`` and ``scale * alpha * (exp(x) - 1)`` otherwise, with
``alpha = 1.6732632423543772`` and ``scale = 1.0507009873554805`` (Klambauer et al., 2017).
JAX uses ``jax.nn.selu`` and TensorFlow ``tf.nn.selu``; the reference uses ``expm1`` in float64.

Counts per element: 5 FLOPs (exp, subtract, multiply by alpha, select, multiply by scale), the
same for either branch; bytes: the input read and the output written once.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kernels.elementwise import ArraySize, ElementwiseWork, one_input_shape
from kernels.frameworks import import_jax, import_tensorflow, import_torch
from kernels.spec import KernelSpec, make_sizes, module_hooks

ALPHA = 1.6732632423543772848170429916717
SCALE = 1.0507009873554804934193349852946
FLOPS_PER_ELEMENT = 5

SIZES = make_sizes(
    tiny={"1d": ArraySize((4096,))},
    cpu={"1d": ArraySize((1 << 24,))},
    gpu={"1d": ArraySize((1 << 28,))},
)

count_work = ElementwiseWork(FLOPS_PER_ELEMENT)
input_shapes = one_input_shape


def make_inputs(size: ArraySize, rng: np.random.Generator) -> tuple[np.ndarray]:
    """Normal inputs of standard deviation 2: both branches and the exp's tail are exercised."""
    return (2.0 * rng.standard_normal(size.shape),)


def reference(size: ArraySize, x: np.ndarray) -> np.ndarray:
    """SELU in float64."""
    return SCALE * np.where(x > 0, x, ALPHA * np.expm1(np.minimum(x, 0.0)))


def jax_function(size: ArraySize) -> Any:
    """``jax.nn.selu``."""
    jax = import_jax()
    return jax.nn.selu


def tf_function(size: ArraySize) -> Any:
    """``tf.nn.selu``."""
    tf = import_tensorflow()
    return tf.nn.selu


def torch_function(size: ArraySize) -> Any:
    """``torch.nn.functional.selu``."""
    torch = import_torch()
    return torch.nn.functional.selu


SPEC = KernelSpec(
    name="selu", description="the SELU activation elementwise (memory-bound, transcendental)",
    sizes=SIZES, dtypes=("float32", "bfloat16"), precisions=("default", "highest"),
    compute_bound=False, uses_matmul=False, **module_hooks(globals()),
)
