"""SELU, the scaled exponential linear unit, elementwise: memory-bound, with a transcendental.

``selu(x) = scale * x`` for ``x > 0`` and ``scale * alpha * (exp(x) - 1)`` otherwise, with
``alpha = 1.6732632423543772`` and ``scale = 1.0507009873554805`` (Klambauer et al., 2017).
JAX uses ``jax.nn.selu`` and TensorFlow ``tf.nn.selu``; the reference uses ``expm1`` in float64.

Counts per element: 5 FLOPs (exp, subtract, multiply by alpha, select, multiply by scale), the
same for either branch; bytes: the input read and the output written once.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from kernels.frameworks import import_jax, import_tensorflow
from kernels.spec import KernelSpec, WorkCounts, make_sizes

ALPHA = 1.6732632423543772848170429916717
SCALE = 1.0507009873554804934193349852946
FLOPS_PER_ELEMENT = 5


class SeluSize(NamedTuple):
    """Array shape of the input (and output)."""

    shape: tuple[int, ...]


SIZES = make_sizes(
    tiny={"1d": SeluSize((4096,))},
    cpu={"1d": SeluSize((1 << 24,))},
    gpu={"1d": SeluSize((1 << 28,))},
)


def count_work(size: SeluSize, itemsize: int) -> WorkCounts:
    """FLOPs and minimum bytes of one call (see the module docstring)."""
    n = math.prod(size.shape)
    return WorkCounts(flops=float(FLOPS_PER_ELEMENT * n), bytes_moved=2.0 * n * itemsize)


def input_shapes(size: SeluSize) -> tuple[tuple[int, ...]]:
    """The shape of the one input, without making it."""
    return (tuple(size.shape),)


def make_inputs(size: SeluSize, rng: np.random.Generator) -> tuple[np.ndarray]:
    """Normal inputs of standard deviation 2: both branches and the exp's tail are exercised."""
    return (2.0 * rng.standard_normal(size.shape),)


def reference(size: SeluSize, x: np.ndarray) -> np.ndarray:
    """SELU in float64."""
    return SCALE * np.where(x > 0, x, ALPHA * np.expm1(np.minimum(x, 0.0)))


def jax_function(size: SeluSize) -> Any:
    """``jax.nn.selu``."""
    jax = import_jax()
    return jax.nn.selu


def tf_function(size: SeluSize) -> Any:
    """``tf.nn.selu``."""
    tf = import_tensorflow()
    return tf.nn.selu


SPEC = KernelSpec(
    name="selu",
    description="the SELU activation elementwise (memory-bound, transcendental)",
    sizes=SIZES,
    dtypes=("float32", "bfloat16"),
    precisions=("default", "highest"),
    compute_bound=False,
    uses_matmul=False,
    count_fn=count_work,
    inputs_fn=make_inputs,
    reference_fn=reference,
    jax_fn=jax_function,
    tf_fn=tf_function,
    shapes_fn=input_shapes,
)
