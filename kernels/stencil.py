"""The stencil: each element plus its two neighbours along every axis, with periodic boundaries.

In 1-D, ``roll(x, 1) + roll(x, -1) + x``; in 2-D and 3-D the same pair of rolls along each axis is
added, ``x + sum over axes of (roll(x, 1, axis) + roll(x, -1, axis))``. Each output element
reads a handful of neighbours that are already in cache, so one fused pass reads the array once
and writes it once: a memory-bound kernel (0.25 FLOP/byte in 1-D float32).

Counts per element: ``2 * ndim`` additions; bytes: the input read and the output written once.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kernels.elementwise import ArraySize, ElementwiseWork, one_input_shape
from kernels.frameworks import import_jax, import_tensorflow, import_torch
from kernels.spec import KernelSpec, make_sizes, module_hooks

SIZES = make_sizes(
    tiny={"1d": ArraySize((4096,)), "2d": ArraySize((64, 64)), "3d": ArraySize((16, 16, 16))},
    cpu={
        "1d": ArraySize((1 << 24,)),
        "2d": ArraySize((4096, 4096)),
        "3d": ArraySize((256, 256, 256)),
    },
    gpu={
        "1d": ArraySize((1 << 28,)),
        "2d": ArraySize((16384, 16384)),
        "3d": ArraySize((1024, 512, 512)),
    },
)


def flops_per_element(size: ArraySize) -> int:
    """Two additions per axis (see the module docstring)."""
    return 2 * len(size.shape)


count_work = ElementwiseWork(flops_per_element)
input_shapes = one_input_shape


def make_inputs(size: ArraySize, rng: np.random.Generator) -> tuple[np.ndarray]:
    """One standard-normal array of the size's shape, in float64."""
    return (rng.standard_normal(size.shape),)


def reference(size: ArraySize, x: np.ndarray) -> np.ndarray:
    """The stencil in float64 NumPy."""
    out = x.copy()
    for axis in range(x.ndim):
        pair = np.roll(x, 1, axis)
        pair += np.roll(x, -1, axis)
        out += pair
    return out


def jax_function(size: ArraySize) -> Any:
    """The stencil in ``jax.numpy``, fused by XLA into one pass.

    In 1-D the rolls are written as shifted slices of the interior plus the two wrapped edge
    elements, joined by one ``concatenate``: XLA then emits one vectorised loop per region instead
    of a per-element select between the rolled pieces (2x faster on a CPU, same values, same
    order of additions: ``(x[i-1] + x[i+1]) + x[i]``). In 2-D and 3-D it uses ``jnp.roll``.
    """
    jnp = import_jax().numpy

    def stencil_1d(x):
        if x.shape[0] < 3:
            return jnp.roll(x, 1) + jnp.roll(x, -1) + x
        first = (x[-1:] + x[1:2]) + x[:1]
        inner = (x[:-2] + x[2:]) + x[1:-1]
        last = (x[-2:-1] + x[:1]) + x[-1:]
        return jnp.concatenate([first, inner, last])

    def stencil(x):
        if x.ndim == 1:
            return stencil_1d(x)
        out = x
        for axis in range(x.ndim):
            out = out + (jnp.roll(x, 1, axis) + jnp.roll(x, -1, axis))
        return out

    return stencil


def tf_function(size: ArraySize) -> Any:
    """The stencil in TensorFlow."""
    tf = import_tensorflow()

    def stencil(x):
        out = x
        for axis in range(len(size.shape)):
            out = out + (tf.roll(x, 1, axis) + tf.roll(x, -1, axis))
        return out

    return stencil


def torch_function(size: ArraySize) -> Any:
    """The stencil in PyTorch, as TensorFlow writes it: ``torch.roll`` along each axis (eager,
    one pass per roll and add; ``torch.compile`` fuses them into one)."""
    torch = import_torch()

    def stencil(x):
        out = x
        for axis in range(len(size.shape)):
            out = out + (torch.roll(x, 1, axis) + torch.roll(x, -1, axis))
        return out

    return stencil


SPEC = KernelSpec(
    name="stencil",
    description="roll(x, 1) + roll(x, -1) + x over a large 1-D/2-D/3-D array (memory-bound)",
    sizes=SIZES, dtypes=("float32", "bfloat16"), precisions=("default", "highest"),
    compute_bound=False, uses_matmul=False, **module_hooks(globals()),
)
