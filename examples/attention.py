"""A user's own workload: one multi-head self-attention block, in JAX and in TensorFlow.

This is the worked example of the public workload interface. A factory returns a
:class:`kernels.Workload`; run it with::

    dvfs sweep -m workload=custom workload.target=examples.attention:make_workload \\
        framework=jax,tensorflow device.sm_clock_mhz=1110,1410

or register it under the ``dvfs.workloads`` entry-point group of your package's
``pyproject.toml`` and name it like a built-in (``workload=attention``)::

    [project.entry-points."dvfs.workloads"]
    attention = "my_package.attention:make_workload"

What the workload holds:

- sizes per preset (``tiny`` runs in milliseconds on a CPU, ``gpu`` fills an accelerator);
- the inputs, drawn from a seeded NumPy generator in float64 (the kernel casts them);
- the step in each framework: a pure function of the inputs, compiled by the tool
  (``jax.jit`` / ``tf.function``), returning one array;
- no ``count_fn``: the work per call is derived from XLA's cost analysis of the compiled step;
- its throughput unit (``tokens/s``) and the tokens one call processes;
- a float64 NumPy reference and the tolerances it is checked with.

The block: ``softmax(Q K^T / sqrt(d)) V`` per head, with ``Q, K, V = x W_q, x W_k, x W_v`` and an
output projection ``W_o``; ``x`` is (batch, seq, model), ``heads * head_dim = model``.
Tolerance: float32 sums of ``model`` products (``~u*sqrt(model)``, 1e-6 at 256) through a
softmax; 1e-5 leaves room, and TF32 (10-bit mantissas on the GPU) is 2e-3, as for the GEMM.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from kernels import Workload, make_sizes


class AttentionSize(NamedTuple):
    """Batch, sequence length, model width and heads."""

    batch: int
    seq: int
    model: int
    heads: int


SIZES = make_sizes(
    tiny={"mha": AttentionSize(2, 32, 64, 4)},
    cpu={"mha": AttentionSize(8, 128, 256, 8)},
    gpu={"mha": AttentionSize(32, 1024, 1024, 16)},
)


def input_shapes(size: AttentionSize) -> tuple[tuple[int, ...], ...]:
    """x, then W_q, W_k, W_v, W_o."""
    m = size.model
    return ((size.batch, size.seq, m), (m, m), (m, m), (m, m), (m, m))


def make_inputs(size: AttentionSize, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """x standard normal; weights scaled by 1/sqrt(model)."""
    x_shape, *w_shapes = input_shapes(size)
    scale = 1.0 / np.sqrt(size.model)
    return (rng.standard_normal(x_shape), *(scale * rng.standard_normal(s) for s in w_shapes))


def _heads(a: Any, size: AttentionSize, reshape: Any, transpose: Any) -> Any:
    """(batch, seq, model) -> (batch, heads, seq, head_dim)."""
    head_dim = size.model // size.heads
    return transpose(reshape(a, (size.batch, size.seq, size.heads, head_dim)), (0, 2, 1, 3))


def reference(size: AttentionSize, x, w_q, w_k, w_v, w_o) -> np.ndarray:
    """The block in float64 NumPy."""
    q, k, v = (_heads(x @ w, size, np.reshape, np.transpose) for w in (w_q, w_k, w_v))
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(size.model // size.heads)
    scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
    context = (scores / scores.sum(axis=-1, keepdims=True)) @ v
    merged = np.transpose(context, (0, 2, 1, 3)).reshape(size.batch, size.seq, size.model)
    return merged @ w_o


def jax_step(size: AttentionSize) -> Any:
    """The block in JAX (``jax.nn.softmax``)."""
    import jax
    import jax.numpy as jnp

    def attention(x, w_q, w_k, w_v, w_o):
        q, k, v = (_heads(x @ w, size, jnp.reshape, jnp.transpose) for w in (w_q, w_k, w_v))
        scores = q @ jnp.swapaxes(k, -1, -2) / np.sqrt(size.model // size.heads)
        context = jax.nn.softmax(scores, axis=-1) @ v
        merged = jnp.transpose(context, (0, 2, 1, 3)).reshape(size.batch, size.seq, size.model)
        return merged @ w_o

    return attention


def tf_step(size: AttentionSize) -> Any:
    """The block in TensorFlow (``tf.nn.softmax``)."""
    import tensorflow as tf

    def attention(x, w_q, w_k, w_v, w_o):
        q, k, v = (_heads(tf.matmul(x, w), size, tf.reshape, tf.transpose)
                   for w in (w_q, w_k, w_v))
        scale = tf.cast(1.0 / np.sqrt(size.model // size.heads), x.dtype)
        scores = tf.matmul(q, k, transpose_b=True) * scale
        context = tf.matmul(tf.nn.softmax(scores, axis=-1), v)
        merged = tf.reshape(tf.transpose(context, (0, 2, 1, 3)),
                            (size.batch, size.seq, size.model))
        return tf.matmul(merged, w_o)

    return attention


def make_workload() -> Workload:
    """The factory ``workload.target`` names: returns the workload's description."""
    return Workload(
        name="attention",
        description="one multi-head self-attention block (a user's workload, examples/)",
        sizes=SIZES,
        dtypes=("float32",),
        precisions=("default", "highest", "tf32"),
        compute_bound=True,
        uses_matmul=True,
        count_fn=None,  # derived from XLA's cost analysis of the compiled step
        inputs_fn=make_inputs,
        reference_fn=reference,
        jax_fn=jax_step,
        tf_fn=tf_step,
        shapes_fn=input_shapes,
        unit="tokens/s",
        items_fn=lambda size: size.batch * size.seq,
        tolerances={"float32": 1e-5, "tf32": 2e-3},
    )
