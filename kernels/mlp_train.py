"""One training step of a small MLP: forward pass, loss, gradients, SGD update.

The network is ``widths = (d_0, d_1, ..., d_L)``: L dense layers ``h = h @ W + b``, ``tanh`` after
every layer but the last. The loss is half the mean squared error over the batch,
``0.5 * sum((pred - y)**2) / B``. Gradients come from ``jax.grad``, ``tf.GradientTape`` and
``torch.autograd.grad``; the float64 reference back-propagates by hand, so it shares no code
with any framework. The step returns the updated parameters ``p - lr * grad`` (lr = 0.1),
flattened and concatenated in the order ``W_1, b_1, ..., W_L, b_L``: one array.

Counts (B = batch, layer l maps d_in to d_out):

- forward: ``2*B*d_in*d_out`` per matmul, ``B*d_out`` per bias add, ``B*d_out`` per tanh;
- loss: ``3*B*d_L + 1`` (difference, square, sum, scale);
- backward: ``B*d_L`` for the loss gradient; per layer ``2*B*d_in*d_out`` for dW,
  ``B*d_out`` for db, ``2*B*d_in*d_out`` for dx (not for the first layer, whose input needs no
  gradient), and ``3*B*d_out`` for the tanh derivative ``dh * (1 - h*h)`` on hidden layers;
- update: 2 per parameter.

Bytes: x and y read, the parameters read and the updated ones written.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from kernels.frameworks import import_jax, import_tensorflow, import_torch
from kernels.spec import KernelSpec, WorkCounts, make_sizes, module_hooks

LEARNING_RATE = 0.1


class MlpSize(NamedTuple):
    """Batch size and layer widths (input first, output last)."""

    batch: int
    widths: tuple[int, ...]


SIZES = make_sizes(
    tiny={"tanh": MlpSize(32, (16, 32, 32, 4))},
    cpu={"tanh": MlpSize(512, (256, 512, 512, 64))},
    gpu={"tanh": MlpSize(4096, (1024, 4096, 4096, 1024))},
)


def _layers(size: MlpSize) -> list[tuple[int, int]]:
    return list(zip(size.widths[:-1], size.widths[1:], strict=True))


def parameter_count(size: MlpSize) -> int:
    """Number of trainable parameters (weights and biases)."""
    return sum(d_in * d_out + d_out for d_in, d_out in _layers(size))


def count_work(size: MlpSize, itemsize: int) -> WorkCounts:
    """FLOPs and minimum bytes of one call (see the module docstring)."""
    b = size.batch
    layers = _layers(size)
    last = len(layers) - 1
    d_last = size.widths[-1]
    flops = 3 * b * d_last + 1 + b * d_last  # loss and its gradient
    for index, (d_in, d_out) in enumerate(layers):
        hidden = index < last
        flops += 2 * b * d_in * d_out + b * d_out + (b * d_out if hidden else 0)  # forward
        flops += 2 * b * d_in * d_out + b * d_out  # dW, db
        flops += 2 * b * d_in * d_out if index > 0 else 0  # dx
        flops += 3 * b * d_out if hidden else 0  # tanh derivative
    params = parameter_count(size)
    flops += 2 * params
    elements = b * size.widths[0] + b * d_last + 2 * params
    return WorkCounts(flops=float(flops), bytes_moved=float(elements) * itemsize)


def input_shapes(size: MlpSize) -> tuple[tuple[int, ...], ...]:
    """The shapes of x, y, ``W_1, b_1, ...``, without making them."""
    shapes: list[tuple[int, ...]] = [(size.batch, size.widths[0]), (size.batch, size.widths[-1])]
    for d_in, d_out in _layers(size):
        shapes += [(d_in, d_out), (d_out,)]
    return tuple(shapes)


def make_inputs(size: MlpSize, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """x, y standard normal, then ``W_1, b_1, ...`` (weights scaled by 1/sqrt(d_in))."""
    b = size.batch
    arrays = [rng.standard_normal((b, size.widths[0])), rng.standard_normal((b, size.widths[-1]))]
    for d_in, d_out in _layers(size):
        arrays.append(rng.standard_normal((d_in, d_out)) / np.sqrt(d_in))
        arrays.append(0.1 * rng.standard_normal(d_out))
    return tuple(arrays)


def reference(size: MlpSize, x: np.ndarray, y: np.ndarray, *params: np.ndarray) -> np.ndarray:
    """The training step in float64 with hand-written back-propagation."""
    weights, biases = params[0::2], params[1::2]
    activations = [x]
    h = x
    for index, (w, b) in enumerate(zip(weights, biases, strict=True)):
        h = h @ w + b
        if index < len(weights) - 1:
            h = np.tanh(h)
        activations.append(h)
    grad = (h - y) / x.shape[0]
    new: list[np.ndarray] = []
    for index in reversed(range(len(weights))):
        if index < len(weights) - 1:
            grad = grad * (1.0 - activations[index + 1] ** 2)
        d_w = activations[index].T @ grad
        d_b = grad.sum(axis=0)
        new[:0] = [weights[index] - LEARNING_RATE * d_w, biases[index] - LEARNING_RATE * d_b]
        grad = grad @ weights[index].T
    return np.concatenate([p.ravel() for p in new])


def jax_function(size: MlpSize) -> Any:
    """The step with ``jax.grad``."""
    jax = import_jax()
    jnp = jax.numpy

    def loss(params, x, y):
        h = x
        count = len(params) // 2
        for index in range(count):
            h = h @ params[2 * index] + params[2 * index + 1]
            if index < count - 1:
                h = jnp.tanh(h)
        return 0.5 * jnp.sum((h - y) ** 2) / x.shape[0]

    def mlp_train(x, y, *params):
        grads = jax.grad(loss)(params, x, y)
        return jnp.concatenate(
            [(p - LEARNING_RATE * g).ravel() for p, g in zip(params, grads, strict=True)]
        )

    return mlp_train


def tf_function(size: MlpSize) -> Any:
    """The step with ``tf.GradientTape``."""
    tf = import_tensorflow()

    def mlp_train(x, y, *params):
        count = len(params) // 2
        with tf.GradientTape() as tape:
            tape.watch(params)
            h = x
            for index in range(count):
                h = tf.linalg.matmul(h, params[2 * index]) + params[2 * index + 1]
                if index < count - 1:
                    h = tf.tanh(h)
            loss = 0.5 * tf.reduce_sum(tf.square(h - y)) / size.batch
        grads = tape.gradient(loss, params)
        return tf.concat(
            [tf.reshape(p - LEARNING_RATE * g, [-1]) for p, g in zip(params, grads, strict=True)],
            axis=0,
        )

    return mlp_train


def torch_function(size: MlpSize) -> Any:
    """The step with ``torch.autograd.grad``."""
    torch = import_torch()

    def mlp_train(x, y, *params):
        count = len(params) // 2
        with torch.enable_grad():
            leaves = [p.detach().requires_grad_(True) for p in params]
            h = x
            for index in range(count):
                h = torch.matmul(h, leaves[2 * index]) + leaves[2 * index + 1]
                if index < count - 1:
                    h = torch.tanh(h)
            loss = 0.5 * torch.sum(torch.square(h - y)) / size.batch
            grads = torch.autograd.grad(loss, leaves)
        with torch.no_grad():
            return torch.cat(
                [(p - LEARNING_RATE * g).reshape(-1) for p, g in zip(params, grads, strict=True)]
            )

    return mlp_train


SPEC = KernelSpec(
    name="mlp_train",
    description="one SGD training step of a small tanh MLP: forward, loss, gradients, update",
    sizes=SIZES, dtypes=("float32", "bfloat16"), precisions=("default", "highest", "tf32"),
    compute_bound=True, uses_matmul=True, **module_hooks(globals()),
)
