"""What the three training-step workloads share: parameters, the step, the reference, the counts.

A model workload is one training step on one batch: forward pass in training mode, softmax
cross-entropy against one-hot labels (mean over the batch), gradients, and one step of SGD with
momentum (optax's ``sgd(lr, momentum=0.9)``: ``t' = g + 0.9 t``, ``p' = p + (-lr) t'``).

- **Parameters** are a list of :class:`ParamSpec` in one canonical order, named by their Flax path
  (``"stage1_block1/conv1/kernel"``). The three frameworks start from the same arrays, drawn in
  NumPy by :func:`init_arrays` with the scheme each spec names. The Keras model's variables are
  matched to the canonical names by their paths (:func:`canonical_name`); the PyTorch module's
  parameters by name and layout (:func:`torch_param`: HWIO convolution kernels are OIHW there,
  dense ``(in, out)`` kernels ``Linear``'s ``(out, in)``, attention kernels flattened over heads).
- **Inputs** (``inputs_fn``): the batch's data arrays, then the parameters, then the momentum
  buffers, all in the canonical order. The momentum is that of a run in progress: small random
  values (:data:`MOMENTUM_INIT_STD`), not zeros, so the momentum term is exercised.
- **Output**: one 1-D array, ``[loss, p'_1.ravel(), p'_2.ravel(), ...]``. The new momentum is
  implied by the new parameters (``t' = (p - p') / lr``) and not returned.
- **Normalisation statistics**: BatchNorm in training mode normalises with the batch's own
  statistics; the running averages it would update do not feed the output and are not returned.
- **Reference**: the JAX step (:func:`jax_step`) in float64, on the CPU, under the scoped
  ``jax.enable_x64(True)`` context (no process-wide flag survives the call). It shares the Flax
  model with the JAX step, so the TensorFlow step (Keras layers, ``tf.GradientTape``, its own
  update) and the PyTorch step (``torch.nn`` modules, ``torch.func``, its own update) are the
  independent checks of both.

Work counts (:class:`Work` accumulates them) follow :mod:`kernels.spec`'s convention: a
multiply-add is 2 FLOPs, other arithmetic and each transcendental 1. A matmul or convolution of
``F`` forward FLOPs costs ``3F`` in a step (forward, input gradient, weight gradient), ``2F`` for
the first layer, whose input needs no gradient. Convolutions count only the taps that fall inside
the (unpadded) input, as XLA does.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

import numpy as np

from kernels.frameworks import import_jax, import_tensorflow, import_torch
from kernels.spec import KernelSpec, WorkCounts

MOMENTUM = 0.9
MOMENTUM_INIT_STD = 1e-3
LOG_SOFTMAX_FLOPS = 5  # per logit: max-subtract, exp, sum, log-subtract, label product


class ParamSpec(NamedTuple):
    """One trainable array: its Flax path, shape and initialisation.

    Attributes:
        name: the Flax path, ``/``-separated.
        shape: the array's shape.
        init: ``"zeros"``, ``"ones"``, ``"he"`` (normal, std ``sqrt(2 / fan_in)``) or
            ``"normal:<std>"``.
        fan_in: inputs per output unit (for ``"he"``).
    """

    name: str
    shape: tuple[int, ...]
    init: str
    fan_in: int = 1


def init_arrays(specs: Sequence[ParamSpec], rng: np.random.Generator) -> list[np.ndarray]:
    """Draw the parameters in float64, in the order of ``specs``."""
    arrays = []
    for spec in specs:
        if spec.init == "zeros":
            arrays.append(np.zeros(spec.shape))
        elif spec.init == "ones":
            arrays.append(np.ones(spec.shape))
        elif spec.init == "he":
            arrays.append(rng.standard_normal(spec.shape) * math.sqrt(2.0 / spec.fan_in))
        elif spec.init.startswith("normal:"):
            arrays.append(rng.standard_normal(spec.shape) * float(spec.init.split(":")[1]))
        else:
            raise ValueError(f"unknown initialisation {spec.init!r} of {spec.name}")
    return arrays


def step_inputs(
    data: Sequence[np.ndarray], specs: Sequence[ParamSpec], rng: np.random.Generator
) -> tuple[np.ndarray, ...]:
    """The flat inputs of a step: data, then parameters, then momentum buffers."""
    params = init_arrays(specs, rng)
    momentum = [MOMENTUM_INIT_STD * rng.standard_normal(s.shape) for s in specs]
    return (*data, *params, *momentum)


def step_shapes(
    data_shapes: Sequence[tuple[int, ...]], specs: Sequence[ParamSpec]
) -> tuple[tuple[int, ...], ...]:
    """The shapes of :func:`step_inputs`'s arrays, without making them."""
    return (*map(tuple, data_shapes), *(s.shape for s in specs), *(s.shape for s in specs))


def one_hot(labels: np.ndarray, classes: int) -> np.ndarray:
    """One-hot rows of float64 (exact in every dtype)."""
    return np.eye(classes)[labels]


def parameter_count(specs: Sequence[ParamSpec]) -> int:
    """Number of trainable scalars."""
    return sum(math.prod(s.shape) for s in specs)


# --- JAX ------------------------------------------------------------------------------------
def nest(specs: Sequence[ParamSpec], arrays: Sequence[Any]) -> dict[str, Any]:
    """The arrays as a Flax parameter tree, by their specs' paths (``"a/b/kernel"``)."""
    tree: dict[str, Any] = {}
    for spec, array in zip(specs, arrays, strict=True):
        *path, leaf = spec.name.split("/")
        node = tree
        for key in path:
            node = node.setdefault(key, {})
        node[leaf] = array
    return tree


def _unnest(specs: Sequence[ParamSpec], tree: dict[str, Any]) -> list[Any]:
    arrays = []
    for spec in specs:
        node = tree
        for key in spec.name.split("/"):
            node = node[key]
        arrays.append(node)
    return arrays


def jax_step(
    specs: Sequence[ParamSpec],
    n_data: int,
    learning_rate: float,
    logits_fn: Callable[..., tuple[Any, Any]],
) -> Callable[..., Any]:
    """One training step in JAX: cross-entropy, ``jax.value_and_grad``, optax SGD with momentum.

    Args:
        specs: the parameters, in the canonical order.
        n_data: how many data arrays lead the inputs; the last of them is the one-hot labels.
        learning_rate: the SGD learning rate.
        logits_fn: ``logits_fn(params_tree, *data_without_labels) -> (logits, aux)``; ``aux`` is
            discarded (the updated BatchNorm statistics).

    Returns:
        ``step(*arrays) -> [loss, new parameters...]`` as one 1-D array.
    """
    jax = import_jax()
    jnp = jax.numpy
    import optax

    optimizer = optax.sgd(learning_rate, momentum=MOMENTUM)
    count = len(specs)

    def loss_fn(params, *data):
        *features, labels = data
        logits, _ = logits_fn(params, *features)
        return optax.softmax_cross_entropy(logits, labels).mean()

    def step(*arrays):
        data = arrays[:n_data]
        params = nest(specs, arrays[n_data : n_data + count])
        trace = nest(specs, arrays[n_data + count :])
        state = (optax.TraceState(trace=trace), optax.EmptyState())
        loss, grads = jax.value_and_grad(loss_fn)(params, *data)
        updates, _ = optimizer.update(grads, state, params)
        new = optax.apply_updates(params, updates)
        return jnp.concatenate([loss[None]] + [p.ravel() for p in _unnest(specs, new)])

    return step


def jax_reference(step_fn: Callable[[], Callable[..., Any]], inputs: Sequence[Any]) -> np.ndarray:
    """Run the JAX step in float64 on the CPU, inside a scoped x64 switch.

    Args:
        step_fn: makes the step (called inside the scope, so every constant is float64).
        inputs: the step's inputs (float64 NumPy arrays).

    Returns:
        The step's output in float64.
    """
    jax = import_jax()
    cpu = jax.devices("cpu")[0]
    with jax.enable_x64(True), jax.default_device(cpu):
        args = [jax.numpy.asarray(np.asarray(a, np.float64)) for a in inputs]
        out = jax.jit(step_fn())(*args)
        return np.asarray(out, np.float64)


# --- TensorFlow / Keras ---------------------------------------------------------------------
_KERAS_NAMES = {"gamma": "scale", "beta": "bias", "embeddings": "embedding",
                "attention_output": "out"}


def canonical_name(keras_path: str) -> str:
    """The Flax path of a Keras variable: ``"layer0.attn/attention_output/kernel"`` is
    ``"layer0/attn/out/kernel"`` (dots in layer names stand for Flax's nesting)."""
    parts = keras_path.replace(".", "/").split("/")
    return "/".join(_KERAS_NAMES.get(p, p) for p in parts)


def tf_step(
    specs: Sequence[ParamSpec],
    n_data: int,
    learning_rate: float,
    model: Any,
    model_inputs: Callable[..., list[Any]],
) -> Callable[..., Any]:
    """One training step in TensorFlow: a Keras model's ``stateless_call`` under a gradient tape.

    Args:
        specs: the parameters, in the canonical order.
        n_data: how many data arrays lead the inputs; the last of them is the one-hot labels.
        learning_rate: the SGD learning rate.
        model: a built Keras model whose trainable variables are exactly ``specs``.
        model_inputs: ``model_inputs(*data_without_labels) -> list`` of the model's inputs.

    Returns:
        ``step(*tensors) -> [loss, new parameters...]`` as one 1-D tensor.

    Raises:
        ValueError: the Keras model's variables are not the canonical parameters.
    """
    tf = import_tensorflow()
    index = {s.name: i for i, s in enumerate(specs)}
    keras_names = [canonical_name(v.path) for v in model.trainable_variables]
    shapes = {canonical_name(v.path): tuple(v.shape) for v in model.trainable_variables}
    if sorted(keras_names) != sorted(index) or any(shapes[s.name] != s.shape for s in specs):
        raise ValueError(
            f"the Keras model's variables {sorted(shapes.items())} are not the parameters "
            f"{sorted((s.name, s.shape) for s in specs)}"
        )
    order = [index[name] for name in keras_names]
    fixed = [
        np.ones(v.shape, np.float32) if "variance" in v.path else np.zeros(v.shape, np.float32)
        for v in model.non_trainable_variables
    ]
    count = len(specs)

    def step(*arrays):
        *features, labels = arrays[:n_data]
        params = list(arrays[n_data : n_data + count])
        trace = arrays[n_data + count :]
        with tf.GradientTape() as tape:
            tape.watch(params)
            statistics = [tf.constant(a, dtype=params[0].dtype) for a in fixed]
            logits, _ = model.stateless_call(
                [params[i] for i in order], statistics, model_inputs(*features), training=True
            )
            loss = tf.reduce_mean(
                tf.nn.softmax_cross_entropy_with_logits(labels=labels, logits=logits)
            )
        grads = tape.gradient(loss, params)
        new = [
            p + (-learning_rate) * (g + MOMENTUM * t)
            for p, g, t in zip(params, grads, trace, strict=True)
        ]
        return tf.concat([tf.reshape(loss, [1])] + [tf.reshape(p, [-1]) for p in new], axis=0)

    return step


# --- PyTorch ---------------------------------------------------------------------------------
_TORCH_LEAVES = {"kernel": "weight", "scale": "weight", "embedding": "weight"}
TorchLayout = Literal["same", "dense", "conv", "heads_in", "heads_out", "heads_bias"]
"""How a canonical array is laid out as a torch parameter (see :class:`TorchParam`)."""


class TorchParam(NamedTuple):
    """Where a canonical parameter lives in a PyTorch module, and in which layout.

    Attributes:
        name: the ``torch.nn.Module`` parameter's dotted name (``"stage1_block1.conv1.weight"``).
        layout: how the canonical (Flax) array becomes the torch one: ``"same"``; ``"dense"``
            (kernel ``(in, out)`` to ``Linear.weight`` ``(out, in)``); ``"conv"`` (HWIO to
            OIHW); ``"heads_in"`` (a query/key/value kernel ``(hidden, heads, dim)`` to
            ``(heads * dim, hidden)``); ``"heads_out"`` (the output kernel ``(heads, dim,
            hidden)`` to ``(hidden, heads * dim)``); ``"heads_bias"`` (``(heads, dim)`` to
            ``(heads * dim,)``).
    """

    name: str
    layout: TorchLayout


def torch_param(spec: ParamSpec) -> TorchParam:
    """The torch parameter of a canonical one: the Flax path with dots, Flax's ``kernel``,
    ``scale`` and ``embedding`` called ``weight``, and the layout the array's rank and place
    imply (a kernel of rank 4 is a convolution's, of rank 2 a dense layer's, of rank 3 an
    attention projection's; a bias of rank 2 is an attention projection's)."""
    *path, leaf = spec.name.split("/")
    rank = len(spec.shape)
    layout: TorchLayout = "same"
    if leaf == "kernel" and rank == 4:
        layout = "conv"
    elif leaf == "kernel" and rank == 2:
        layout = "dense"
    elif leaf == "kernel":
        layout = "heads_out" if path[-1] == "out" else "heads_in"
    elif leaf == "bias" and rank == 2:
        layout = "heads_bias"
    return TorchParam(".".join([*path, _TORCH_LEAVES.get(leaf, leaf)]), layout)


def to_torch_layout(layout: TorchLayout, array: Any) -> Any:
    """A canonical array (a torch tensor) in the torch layout ``layout`` names (a view)."""
    if layout == "conv":
        return array.permute(3, 2, 0, 1)
    if layout == "dense":
        return array.t()
    if layout == "heads_in":
        return array.reshape(array.shape[0], -1).t()
    if layout == "heads_out":
        return array.reshape(-1, array.shape[-1]).t()
    if layout == "heads_bias":
        return array.reshape(-1)
    return array


def from_torch_layout(layout: TorchLayout, tensor: Any, shape: tuple[int, ...]) -> Any:
    """The inverse of :func:`to_torch_layout`: a torch parameter back in canonical ``shape``."""
    if layout == "conv":
        return tensor.permute(2, 3, 1, 0)
    if layout in ("dense", "heads_in", "heads_out"):
        return tensor.t().reshape(shape)
    return tensor.reshape(shape)


def torch_state(specs: Sequence[ParamSpec], tensors: Sequence[Any]) -> dict[str, Any]:
    """The canonical parameters as a torch module's parameters, by name (views, no copies)."""
    state = {}
    for spec, tensor in zip(specs, tensors, strict=True):
        name, layout = torch_param(spec)
        state[name] = to_torch_layout(layout, tensor)
    return state


def load_torch_parameters(model: Any, specs: Sequence[ParamSpec], arrays: Sequence[Any]) -> None:
    """Copy canonical NumPy arrays into a torch module's parameters (in its dtype, on its device).

    Raises:
        ValueError: the module's parameters are not exactly the canonical ones.
    """
    torch = import_torch()
    check_torch_parameters(model, specs)
    own = dict(model.named_parameters())
    state = torch_state(specs, [torch.from_numpy(np.asarray(a)) for a in arrays])
    with torch.no_grad():
        for name, tensor in state.items():
            own[name].copy_(tensor)


def read_torch_parameters(model: Any, specs: Sequence[ParamSpec]) -> list[np.ndarray]:
    """A torch module's parameters as canonical NumPy arrays, in the order of ``specs``."""
    own = dict(model.named_parameters())
    arrays = []
    for spec in specs:
        name, layout = torch_param(spec)
        tensor = from_torch_layout(layout, own[name].detach().cpu(), spec.shape)
        arrays.append(tensor.contiguous().numpy())
    return arrays


def check_torch_parameters(model: Any, specs: Sequence[ParamSpec]) -> None:
    """Refuse a torch module whose parameters are not the canonical ones, name for name and in
    the torch layout's shape.

    Raises:
        ValueError: a parameter is missing, extra or of another shape.
    """
    torch = import_torch()
    empty = [torch.empty(s.shape, device="meta") for s in specs]
    expected = {n: tuple(t.shape) for n, t in torch_state(specs, empty).items()}
    own = {n: tuple(p.shape) for n, p in model.named_parameters()}
    if own != expected:
        raise ValueError(
            f"the torch module's parameters {sorted(own.items())} are not the canonical "
            f"parameters {sorted(expected.items())}"
        )


def torch_step(
    specs: Sequence[ParamSpec],
    n_data: int,
    learning_rate: float,
    model: Any,
    model_inputs: Callable[..., tuple[Any, ...]],
) -> Callable[..., Any]:
    """One training step in PyTorch: ``torch.func.functional_call`` of a ``torch.nn`` module
    over the canonical parameters (viewed in torch's layouts, :func:`torch_param`), gradients by
    ``torch.func.grad_and_value``, and the same SGD update as the other two.

    The module (built on the ``meta`` device: it holds no memory of its own) supplies the
    architecture only; every call passes it the parameters and fresh normalisation statistics
    (running means 0, variances 1), so a step is a pure function of its inputs, as in the
    other frameworks. Gradients reach the canonical arrays through the layout views.

    Args:
        specs: the parameters, in the canonical order.
        n_data: how many data arrays lead the inputs; the last of them is the one-hot labels.
        learning_rate: the SGD learning rate.
        model: a ``torch.nn.Module`` in training mode whose parameters are exactly ``specs``.
        model_inputs: ``model_inputs(*data_without_labels) -> tuple`` of the module's inputs.

    Returns:
        ``step(*tensors) -> [loss, new parameters...]`` as one 1-D tensor.

    Raises:
        ValueError: the module's parameters are not the canonical ones.
    """
    torch = import_torch()
    from torch.func import functional_call, grad_and_value

    check_torch_parameters(model, specs)
    buffers = {n: (tuple(b.shape), b.dtype, "var" in n) for n, b in model.named_buffers()}
    count = len(specs)

    def loss_fn(params, features, labels):
        floats = params[0].dtype  # statistics in the parameters' dtype; the step counter as is
        stats = {
            n: torch.full(shape, 1 if ones else 0, device=labels.device,
                          dtype=floats if dtype.is_floating_point else dtype)
            for n, (shape, dtype, ones) in buffers.items()
        }
        state = {**torch_state(specs, params), **stats}
        logits = functional_call(model, state, model_inputs(*features))
        return torch.nn.functional.cross_entropy(logits, labels)

    def step(*tensors):
        *features, labels = tensors[:n_data]
        params = list(tensors[n_data : n_data + count])
        trace = tensors[n_data + count :]
        grads, loss = grad_and_value(loss_fn)(params, features, labels)
        new = [
            p + (-learning_rate) * (g + MOMENTUM * t)
            for p, g, t in zip(params, grads, trace, strict=True)
        ]
        return torch.cat([loss.reshape(1)] + [p.reshape(-1) for p in new])

    return step


def meta_module(build: Callable[[], Any]) -> Any:
    """``build()``'s torch module, made on the ``meta`` device (no memory, no initialisation
    cost: :func:`torch_step` passes every parameter and buffer in), in training mode."""
    torch = import_torch()
    with torch.device("meta"):
        return build().train()


# --- counts ---------------------------------------------------------------------------------
def valid_taps(size: int, kernel: int, stride: int) -> int:
    """Sum over a SAME-padded axis's outputs of the kernel taps that fall inside the input."""
    out = -(-size // stride)
    pad = max((out - 1) * stride + kernel - size, 0)
    before = pad // 2
    return sum(
        sum(1 for k in range(kernel) if 0 <= o * stride - before + k < size) for o in range(out)
    )


class Work:
    """An accumulator of FLOPs, the step's activation memory, and the parameters' size.

    FLOPs are those of a whole step (forward and backward); ``saved`` counts the elements the
    forward pass keeps for the backward pass (see each model's ``footprint``).
    """

    def __init__(self) -> None:
        self.flops = 0.0
        self.saved = 0.0

    def matmul(self, macs: float, first: bool = False, save: float = 0.0) -> None:
        """A matmul or convolution of ``macs`` multiply-adds: 2 FLOPs each, 3 passes (2 first)."""
        self.flops += 2.0 * macs * (2 if first else 3)
        self.saved += save

    def elementwise(self, elements: float, forward: float, backward: float, save: float) -> None:
        """An elementwise or normalising op over ``elements``, FLOPs per element both ways."""
        self.flops += elements * (forward + backward)
        self.saved += save * elements


def step_counts(
    work: Work, params: int, batch: int, classes: int, data_elements: int, itemsize: int
) -> WorkCounts:
    """Close a step's counts: loss, optimizer, and the minimum bytes.

    Loss: log-softmax and label product forward (:data:`LOG_SOFTMAX_FLOPS` per logit), its
    gradient ``(softmax - y) / B`` (3 per logit). Optimizer: 4 FLOPs per parameter (``g + 0.9 t``
    and ``p + (-lr) t'``). Bytes: the data read, parameters and momentum read, parameters
    written, and the loss.
    """
    logits = batch * classes
    flops = work.flops + logits * (LOG_SOFTMAX_FLOPS + 3) + 4 * params
    elements = data_elements + 3 * params + 1
    return WorkCounts(flops=float(flops), bytes_moved=float(elements * itemsize))


def footprint_bytes(work: Work, params: int, data_elements: int, itemsize: int) -> dict[str, int]:
    """The modelled device memory of one step, in bytes, by part.

    Parameters, momentum and gradients are one array each of every parameter; activations are
    the elements the forward pass keeps for the backward pass (:class:`Work`'s ``saved``); data
    is the batch. ``total`` is their sum, the step's peak if nothing is freed early.
    """
    parts = {
        "parameters": params * itemsize,
        "optimizer_state": params * itemsize,
        "gradients": params * itemsize,
        "activations": int(work.saved) * itemsize,
        "data": data_elements * itemsize,
    }
    parts["total"] = sum(parts.values())
    return parts


def batch_of(size: Any) -> int:
    """Samples one step processes: the size's batch (the models' ``items_fn``)."""
    return int(size.batch)


@dataclass(frozen=True)
class StepParts:
    """What a model's size decides, the same way for the three models: its parameters and work
    (``walk(size) -> (specs, Work)``) and its data arrays' shapes (``data_shapes(size)``, the
    one-hot labels last); the rest of a workload's size-derived hooks follow from these two."""

    walk: Callable[[Any], tuple[list[ParamSpec], Work]]
    data_shapes: Callable[[Any], list[tuple[int, ...]]]
    features: Callable[[Any, np.random.Generator], np.ndarray]  # the batch's data, float64

    @classmethod
    def images(cls, walk: Callable[[Any], tuple[list[ParamSpec], Work]]) -> StepParts:
        """An image classifier's: ``N(0, 1)`` images (batch, image, image, 3) and labels."""
        def shapes(size: Any) -> list[tuple[int, ...]]:
            return [(size.batch, size.image, size.image, 3), (size.batch, size.classes)]

        return cls(walk, shapes, lambda size, rng: rng.standard_normal(shapes(size)[0]))

    def param_specs(self, size: Any) -> list[ParamSpec]:
        """The trainable parameters in canonical order."""
        return self.walk(size)[0]

    def input_shapes(self, size: Any) -> tuple[tuple[int, ...], ...]:
        """Data, labels, parameters, momentum: the shapes, without making them."""
        return step_shapes(self.data_shapes(size), self.param_specs(size))

    def inputs(self, size: Any, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
        """The batch's data, one-hot labels, the initial parameters and the momentum, all
        float64 (the workload's ``inputs_fn``)."""
        features = self.features(size, rng)
        labels = one_hot(rng.integers(0, size.classes, size.batch), size.classes)
        return step_inputs([features, labels], self.param_specs(size), rng)

    def _data_elements(self, size: Any) -> int:
        return sum(int(np.prod(s)) for s in self.data_shapes(size))

    def count_work(self, size: Any, itemsize: int) -> WorkCounts:
        """FLOPs and minimum bytes of one step (see the model's docstring)."""
        specs, work = self.walk(size)
        return step_counts(work, parameter_count(specs), size.batch, size.classes,
                           self._data_elements(size), itemsize)

    def footprint(self, size: Any, itemsize: int) -> dict[str, int]:
        """Modelled device memory of one step in bytes, by part (see the model's docstring)."""
        specs, work = self.walk(size)
        return footprint_bytes(work, parameter_count(specs), self._data_elements(size), itemsize)

    def spec(self, **hooks: Any) -> KernelSpec:
        """The model's workload: float32, matmul-bound, in samples/s, with this size's shapes,
        inputs, counts and footprint; ``hooks`` give the rest (``name``, ``description``,
        ``sizes``, ``reference_fn``, ``jax_fn``, ``tf_fn``, ``tolerances``)."""
        return KernelSpec(
            dtypes=("float32",),
            precisions=("default", "highest", "tf32"),
            compute_bound=True,
            uses_matmul=True,
            count_fn=self.count_work,
            shapes_fn=self.input_shapes,
            unit="samples/s",
            items_fn=batch_of,
            footprint_fn=self.footprint,
            inputs_fn=self.inputs,
            **hooks,
        )
