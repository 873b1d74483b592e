"""An output's error against the float64 reference, computed where the output is: on the device.

A check compares a few sampled outputs of a window with the float64 reference: the norm-wise
relative error ``||out - ref||_2 / ||ref||_2``, the largest absolute error, and how many values
are not finite. Copying each sampled output to the host to compare it there (a GEMM's output at
the ``gpu`` preset is 1 GiB: ~40 ms over PCIe, then ~1 s of float64 arithmetic on a core, five
times a trial) made a real-GPU trial cost many times its window. Here the framework reduces each
output on its own device to two numbers (a third, the count of non-finite values, only when
those are not finite), and only those come to the host.

The reference goes to the device once per kernel, as two float32 arrays: ``hi = float32(ref)``
and ``lo = float32(ref - hi)``, so ``hi + lo`` keeps 48 of float64's 53 bits (JAX without x64
has no float64, and a GPU's float64 is slow where it exists at all). The difference is formed as
``(out - hi) - lo`` in float32: where ``out`` is within a factor of two of ``hi`` (every output a
check would pass) ``out - hi`` is exact (Sterbenz), and subtracting ``lo`` rounds the small
difference itself, not the output. So the errors computed on the device agree with the host's
float64 computation (:func:`host_errors`) to about 1e-6 of themselves; a reduction in float32 sums
the squares in a tree on a GPU, and in 1024-element blocks here where the size allows it, so the
sums' own rounding stays that small. ``tests/kernels/test_compare.py`` checks both against each
other for every workload and every framework.

Device memory: ``hi`` and ``lo`` take 8 bytes per output element (twice a float32 output, four
times a bfloat16 one), once per kernel; the comparison's temporaries are fused by XLA into the
reductions.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

ERROR_SUMS = 2
"""Numbers a device comparison returns: the sum of squared differences and the largest absolute
difference (both non-finite when a value is; then :func:`jax_nonfinite_count` counts them). The
reference's own squared norm is computed once, on the host, in float64."""

_BLOCK = 1024  # elements per first-stage partial sum where the size divides evenly
_CHUNK = 1 << 22  # elements per float64 chunk on the host: 32 MiB of temporaries


@dataclasses.dataclass(frozen=True)
class OutputErrors:
    """How far one output is from the reference (``inf`` errors with a non-finite value)."""

    rel_error: float
    max_abs_error: float
    nonfinite: int


def split_reference(reference: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The float64 reference as ``(hi, lo)`` float32 arrays with ``hi + lo ~= reference``."""
    reference = np.asarray(reference, dtype=np.float64)
    hi = reference.astype(np.float32)
    lo = (reference - hi.astype(np.float64)).astype(np.float32)
    return hi, lo


def errors_from_sums(diff_sq: float, ref_sq: float, max_abs: float,
                     nonfinite: int = 0) -> OutputErrors:
    """The errors from the sums of a comparison (``inf`` errors with a non-finite value)."""
    if nonfinite or not (np.isfinite(diff_sq) and np.isfinite(max_abs)):
        return OutputErrors(float("inf"), float("inf"), max(1, int(nonfinite)))
    norm = np.sqrt(ref_sq)
    rel = np.sqrt(diff_sq) / norm if norm > 0 else np.sqrt(diff_sq)
    return OutputErrors(float(rel), float(max_abs), 0)


def reference_sq(reference: np.ndarray) -> float:
    """``||ref||_2**2`` in float64, chunked (computed once per kernel, on the host)."""
    flat = np.asarray(reference, dtype=np.float64).reshape(-1)
    return float(sum(np.dot(flat[i : i + _CHUNK], flat[i : i + _CHUNK])
                     for i in range(0, flat.size, _CHUNK)))


@np.errstate(invalid="ignore", over="ignore")  # a corrupted value may be a signalling NaN.
def host_errors(output: np.ndarray, reference: np.ndarray | None) -> OutputErrors:
    """The errors of an output held on the host, in float64, streamed in chunks (so a
    2**28-element output needs no float64 copy): the simulated GPU's corrupted outputs and
    ``measure.digest=host``, and the yardstick the device comparison is tested against.
    Without a reference, NaN errors and the count of non-finite values."""
    if reference is None:
        nan = float("nan")
        return OutputErrors(nan, nan, int(output.size - np.count_nonzero(np.isfinite(output))))
    if output.shape != reference.shape:
        raise ValueError(f"output shape {output.shape} != reference shape {reference.shape}")
    out = output.reshape(-1)
    ref = reference.reshape(-1)
    diff_sq = ref_sq = max_abs = 0.0
    nonfinite = 0
    for start in range(0, out.size, _CHUNK):
        o = out[start : start + _CHUNK].astype(np.float64)
        r = ref[start : start + _CHUNK].astype(np.float64, copy=False)
        nonfinite += int(o.size - np.count_nonzero(np.isfinite(o)))
        d = np.abs(o - r)
        diff_sq += float(np.dot(d, d))
        ref_sq += float(np.dot(r, r))
        if d.size:
            max_abs = max(max_abs, float(d.max()))
    return errors_from_sums(diff_sq, ref_sq, max_abs, nonfinite)


def _blocked(values: Any, size: int, reshape: Any) -> Any:
    """``values`` as (blocks, 1024) where the size divides evenly (a two-stage sum), else 1-D."""
    return reshape(values, (-1, _BLOCK) if size % _BLOCK == 0 and size > _BLOCK else (-1,))


def jax_error_sums(output: Any, hi: Any, lo: Any) -> Any:
    """The :data:`ERROR_SUMS` of a JAX output, traced into the caller's ``jax.jit``: one
    variadic reduction, so the difference is formed and both figures taken in one pass over the
    output and the reference (two separate reductions took 2.3x as long on a CPU)."""
    import jax
    import jax.numpy as jnp

    out = output.astype(jnp.float32).reshape(-1)
    diff = _blocked((out - hi.reshape(-1)) - lo.reshape(-1), out.size, jnp.reshape)
    zero = jnp.float32(0)

    def both(a: Any, b: Any) -> Any:
        return a[0] + b[0], jnp.maximum(a[1], b[1])

    sq, top = jax.lax.reduce((diff * diff, jnp.abs(diff)), (zero, zero), both, (diff.ndim - 1,))
    if diff.ndim == 2:  # the blocks' partial sums and maxima
        sq, top = jax.lax.reduce((sq, top), (zero, zero), both, (0,))
    return jnp.stack([sq, top])


def jax_nonfinite_count(output: Any) -> Any:
    """How many values of a JAX output are NaN or infinite (traced into ``jax.jit``)."""
    import jax.numpy as jnp

    return jnp.sum(~jnp.isfinite(output.astype(jnp.float32)), dtype=jnp.int32)


def tf_error_sums(output: Any, hi: Any, lo: Any) -> Any:
    """The :data:`ERROR_SUMS` of a TensorFlow tensor (call it inside a ``jit_compile``
    function, so XLA fuses it on the tensor's device)."""
    import tensorflow as tf

    out = tf.reshape(tf.cast(output, tf.float32), [-1])
    diff = (out - tf.reshape(hi, [-1])) - tf.reshape(lo, [-1])
    sq = _blocked(diff * diff, int(out.shape[0]), tf.reshape)
    return tf.stack([tf.reduce_sum(tf.reduce_sum(sq, axis=-1)), tf.reduce_max(tf.abs(diff))])


def tf_nonfinite_count(output: Any) -> Any:
    """How many values of a TensorFlow tensor are NaN or infinite (inside ``jit_compile``)."""
    import tensorflow as tf

    finite = tf.math.is_finite(tf.cast(output, tf.float32))
    return tf.reduce_sum(tf.cast(tf.logical_not(finite), tf.int32))


def torch_error_sums(output: Any, hi: Any, lo: Any) -> Any:
    """The :data:`ERROR_SUMS` of a PyTorch tensor, on its device, as :func:`jax_error_sums`
    forms them: ``(out - hi) - lo`` in float32, its squares summed in 1024-element blocks and
    then across them, and its largest absolute value. Eager, the difference is one pass that
    writes a float32 temporary and the two reductions read it (no graph compiler to fuse them);
    it runs after the window, never inside one."""
    import torch

    out = output.detach().reshape(-1).to(torch.float32)
    diff = torch.sub(out, hi.reshape(-1)).sub_(lo.reshape(-1))
    blocks = _blocked(diff, diff.numel(), torch.reshape)
    sq = torch.sum(torch.sum(blocks * blocks, dim=-1))
    top = torch.linalg.vector_norm(diff, ord=float("inf"))
    return torch.stack([sq, top])


def torch_nonfinite_count(output: Any) -> Any:
    """How many values of a PyTorch tensor are NaN or infinite (an ``int64`` on its device)."""
    import torch

    return torch.sum(~torch.isfinite(output.detach()))
