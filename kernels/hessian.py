"""Second-order gradients: ``grad(grad(f))`` of a scalar function at every point of a large array.

``f(x) = sin(x) * exp(-x**2 / 2)``. JAX computes ``vmap(grad(grad(f)))(x)``; TensorFlow nests two
``GradientTape``s (the inner one gives ``f'`` elementwise, the outer one differentiates that
again); PyTorch calls ``torch.autograd.grad`` twice, the first with ``create_graph=True``.
Because ``f`` acts elementwise, ``sum(f(x))`` has a diagonal Hessian and all three give its
diagonal, ``f''(x)``. The reference is the closed form, derived by hand, in float64:

    f''(x) = exp(-x**2 / 2) * ((x**2 - 2) * sin(x) - 2 * x * cos(x))

so the check compares automatic differentiation with calculus, not one autodiff with another.

Counts per element: 11 FLOPs, those of the closed form (x*x; the exponent's multiply and exp;
sin; cos; subtract and multiply for (x**2 - 2) * sin; two multiplies for 2 * x * cos; subtract
and multiply for the final product); the frameworks' derivative graphs do a few more. Bytes: the
input read and the output written once.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kernels.elementwise import ArraySize, ElementwiseWork, one_input_shape
from kernels.frameworks import import_jax, import_tensorflow, import_torch
from kernels.spec import KernelSpec, make_sizes, module_hooks

FLOPS_PER_ELEMENT = 11

SIZES = make_sizes(
    tiny={"elementwise": ArraySize((4096,))},
    cpu={"elementwise": ArraySize((1 << 22,))},
    gpu={"elementwise": ArraySize((1 << 26,))},
)

count_work = ElementwiseWork(FLOPS_PER_ELEMENT)
input_shapes = one_input_shape


def make_inputs(size: ArraySize, rng: np.random.Generator) -> tuple[np.ndarray]:
    """Points uniform in [-3, 3], where ``f''`` has its structure."""
    return (rng.uniform(-3.0, 3.0, size.shape),)


def reference(size: ArraySize, x: np.ndarray) -> np.ndarray:
    """The closed-form ``f''(x)`` in float64."""
    return np.exp(-0.5 * x * x) * ((x * x - 2.0) * np.sin(x) - 2.0 * x * np.cos(x))


def jax_function(size: ArraySize) -> Any:
    """``vmap(grad(grad(f)))`` over every element."""
    jax = import_jax()
    jnp = jax.numpy

    def f(x):
        return jnp.sin(x) * jnp.exp(-0.5 * x * x)

    second = jax.grad(jax.grad(f))
    batched = second
    for _ in size.shape:
        batched = jax.vmap(batched)
    return batched


def tf_function(size: ArraySize) -> Any:
    """Nested ``GradientTape``s."""
    tf = import_tensorflow()

    def hessian(x):
        with tf.GradientTape() as outer:
            outer.watch(x)
            with tf.GradientTape() as inner:
                inner.watch(x)
                y = tf.sin(x) * tf.exp(-0.5 * x * x)
            first = inner.gradient(y, x)
        return outer.gradient(first, x)

    return hessian


def torch_function(size: ArraySize) -> Any:
    """Two ``torch.autograd.grad`` calls, the first with ``create_graph=True`` so the second
    differentiates ``f'`` again (each ``sum`` has a diagonal Jacobian, as in TensorFlow).

    ``torch.compile`` cannot trace a double backward through ``autograd.grad`` (AOTAutograd
    refuses it), so the traced path takes the same two derivatives with ``torch.func.grad``,
    which it compiles into one graph: the same math, the same operations.
    """
    torch = import_torch()

    def f_sum(x):
        return torch.sum(torch.sin(x) * torch.exp(-0.5 * x * x))

    def first_sum(x):
        return torch.sum(torch.func.grad(f_sum)(x))

    def hessian(x):
        if torch.compiler.is_compiling():
            return torch.func.grad(first_sum)(x)
        with torch.enable_grad():
            x = x.detach().requires_grad_(True)
            y = torch.sin(x) * torch.exp(-0.5 * x * x)
            (first,) = torch.autograd.grad(y.sum(), x, create_graph=True)
            (second,) = torch.autograd.grad(first.sum(), x)
        return second.detach()

    return hessian

SPEC = KernelSpec(
    name="hessian",
    description="second-order gradients grad(grad(f)) of a scalar function, elementwise",
    sizes=SIZES, dtypes=("float32", "bfloat16"), precisions=("default", "highest"),
    compute_bound=False, uses_matmul=False, **module_hooks(globals()),
)
