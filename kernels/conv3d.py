"""A 3-D convolution layer's forward pass, NDHWC: ``y = conv3d(x, w) + b``.

Input ``x`` is (N, D, H, W, C_in), the filter ``w`` is (k, k, k, C_in, C_out) (DHWIO, TensorFlow's
layout), the bias ``b`` is (C_out,); stride 1 and ``SAME`` zero padding, so the output is
(N, D, H, W, C_out). Both frameworks compute a cross-correlation (no filter flip), as does the
reference, which sums ``k**3`` shifted matrix products in float64. No activation follows, so every
output element carries the convolution's full error into the check.

Counts: ``2 * N*D*H*W * C_out * C_in * k**3`` for the multiply-adds (padding taps included, the
usual convention for dense convolution rates) plus ``N*D*H*W * C_out`` for the bias; bytes: x, w
and b read once, y written once.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from kernels.frameworks import import_jax, import_tensorflow, import_torch
from kernels.spec import KernelSpec, WorkCounts, make_sizes, module_hooks


class Conv3dSize(NamedTuple):
    """Extents of the layer: batch, spatial extents, channels and the (cubic) filter size."""

    batch: int
    depth: int
    height: int
    width: int
    c_in: int
    c_out: int
    kernel: int


SIZES = make_sizes(
    tiny={"same": Conv3dSize(2, 8, 8, 8, 4, 8, 3)},
    cpu={"same": Conv3dSize(4, 32, 32, 32, 32, 32, 3)},
    gpu={"same": Conv3dSize(8, 64, 64, 64, 64, 64, 3)},
)


def count_work(size: Conv3dSize, itemsize: int) -> WorkCounts:
    """FLOPs and minimum bytes of one call (see the module docstring)."""
    voxels = size.batch * size.depth * size.height * size.width
    taps = size.kernel**3
    flops = 2.0 * voxels * size.c_out * size.c_in * taps + voxels * size.c_out
    elements = voxels * size.c_in + taps * size.c_in * size.c_out + size.c_out + voxels * size.c_out
    return WorkCounts(flops=flops, bytes_moved=float(elements) * itemsize)


def input_shapes(size: Conv3dSize) -> tuple[tuple[int, ...], ...]:
    """The shapes of x, w and b, without making them."""
    k = size.kernel
    x = (size.batch, size.depth, size.height, size.width, size.c_in)
    return x, (k, k, k, size.c_in, size.c_out), (size.c_out,)


def make_inputs(size: Conv3dSize, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """x standard normal; w scaled by 1/sqrt(fan-in) so outputs stay of order one; b small."""
    k = size.kernel
    x = rng.standard_normal((size.batch, size.depth, size.height, size.width, size.c_in))
    w = rng.standard_normal((k, k, k, size.c_in, size.c_out)) / np.sqrt(k**3 * size.c_in)
    b = 0.1 * rng.standard_normal(size.c_out)
    return x, w, b


def reference(size: Conv3dSize, x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The layer in float64: a sum of ``k**3`` shifted (voxels, C_in) @ (C_in, C_out) products."""
    k = size.kernel
    lo = (k - 1) // 2  # SAME padding: TensorFlow puts the odd extra tap after.
    pad = ((0, 0), (lo, k - 1 - lo), (lo, k - 1 - lo), (lo, k - 1 - lo), (0, 0))
    xp = np.pad(x, pad)
    n, d, h, wd = x.shape[:4]
    out = np.broadcast_to(b, (n, d, h, wd, size.c_out)).copy()
    for i in range(k):
        for j in range(k):
            for m in range(k):
                out += xp[:, i : i + d, j : j + h, m : m + wd, :] @ w[i, j, m]
    return out


def jax_function(size: Conv3dSize) -> Any:
    """The layer with ``jax.lax.conv_general_dilated``."""
    lax = import_jax().lax

    def conv3d(x, w, b):
        y = lax.conv_general_dilated(
            x,
            w,
            window_strides=(1, 1, 1),
            padding="SAME",
            dimension_numbers=("NDHWC", "DHWIO", "NDHWC"),
        )
        return y + b

    return conv3d


def tf_function(size: Conv3dSize) -> Any:
    """The layer with ``tf.nn.conv3d``."""
    tf = import_tensorflow()

    def conv3d(x, w, b):
        return tf.nn.conv3d(x, w, strides=[1, 1, 1, 1, 1], padding="SAME") + b

    return conv3d


def torch_function(size: Conv3dSize) -> Any:
    """The layer with ``torch.nn.functional.conv3d`` on the same NDHWC and DHWIO arrays.

    PyTorch's logical layout is NCDHW with an (O, I, D, H, W) filter: the input's permuted view
    is NCDHW in ``channels_last_3d`` memory (no copy), the convolution keeps that memory format,
    and its output permuted back is NDHWC and contiguous. Odd filters only (``padding="same"``
    pads symmetrically, as ``SAME`` does for them).
    """
    torch = import_torch()
    functional = torch.nn.functional

    def conv3d(x, w, b):
        y = functional.conv3d(x.permute(0, 4, 1, 2, 3), w.permute(4, 3, 0, 1, 2), b,
                              stride=1, padding="same")
        return y.permute(0, 2, 3, 4, 1)

    return conv3d


SPEC = KernelSpec(
    name="conv3d",
    description="a 3-D convolution layer forward pass, NDHWC, 3x3x3 SAME (compute-bound)",
    sizes=SIZES, dtypes=("float32", "bfloat16"), precisions=("default", "highest", "tf32"),
    compute_bound=True, uses_matmul=True, convolution=True, **module_hooks(globals()),
)
