"""One training step of a Vision Transformer (ViT-B/16) classifying images.

Architecture (``VitSize``): a ``patch`` x ``patch`` convolution of stride ``patch`` (with bias)
cuts the image into ``(image / patch)**2`` patch embeddings of width ``hidden``; a learned class
token goes first and learned position embeddings are added; ``layers`` pre-LN encoder layers
(:mod:`kernels.models.transformer`: ``heads`` heads, MLP width ``mlp``, exact GELU, LayerNorm
epsilon 1e-6); a final LayerNorm and a dense classifier on the class token. No dropout. ``gpu``
is ViT-B/16: 224x224 images, patch 16 (197 tokens), L=12, H=768, A=12, MLP 3072, 1000 classes,
batch 64 (86.6 M parameters). ``tiny``: 32x32 images, patch 8 (17 tokens), 2 layers of width 128
(2 heads, MLP 512), 10 classes, batch 8.

Data: images ``N(0, 1)`` (B, H, W, 3) and one-hot labels. Initialisation: every weight, the class
token and the position embeddings ``N(0, 0.02**2)``, the classifier ``N(0, 0.01**2)`` (initial
loss ~ ln(classes)), biases zero, LayerNorm scale 1 and bias 0.

Step: see :mod:`kernels.models.common` (cross-entropy, SGD with momentum 0.9, learning rate
:data:`LEARNING_RATE`; output ``[loss, new parameters...]``).

Counts: the patch convolution 2 passes (the images need no gradient) and its bias 1 + 1; the
class-token concatenation none; the position add 1 + 1 (its gradient sums over the batch);
encoder layers as in :mod:`kernels.models.transformer`; the final LayerNorm over every token
(the frameworks normalise all of them, though only the class token reaches the classifier); the
classifier 3 passes. At ``gpu``: 6.75 TFLOP per step (XLA: 0.5 % more), ~9.3 GiB.

PyTorch (:func:`torch_model`): an ``nn.Conv2d`` patch embedding (NCHW, its kernel an OIHW view of
the canonical HWIO one) whose (B, hidden, h, w) output is flattened row-major into patches as
Flax's reshape does, the layers of :func:`kernels.models.transformer.torch_layer`.

Footprint (:func:`footprint`): as BERT's (:mod:`kernels.models.bert_train`). Tolerance
(:data:`TOLERANCE`): measured errors in :mod:`kernels.models`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from kernels.frameworks import import_jax, import_torch
from kernels.models import common, transformer
from kernels.spec import make_sizes

LEARNING_RATE = 0.05
LN_EPSILON = 1e-6
INIT_STD = 0.02
TOLERANCE = {"float32": 1e-6, "tf32": 3e-4}


class VitSize(NamedTuple):
    """Batch, image side, patch side, layers, hidden width, heads, MLP width, classes."""

    batch: int
    image: int
    patch: int
    layers: int
    hidden: int
    heads: int
    mlp: int
    classes: int


SIZES = make_sizes(
    tiny={"b16": VitSize(8, 32, 8, 2, 128, 2, 512, 10)},
    cpu={"b16": VitSize(16, 64, 8, 4, 256, 4, 1024, 100)},
    gpu={"b16": VitSize(64, 224, 16, 12, 768, 12, 3072, 1000)},
)


def _tokens(size: VitSize) -> int:
    return (size.image // size.patch) ** 2 + 1


def _walk(size: VitSize) -> tuple[list[common.ParamSpec], common.Work]:
    h, p = size.hidden, size.patch
    seq = _tokens(size)
    init = f"normal:{INIT_STD}"
    specs = [
        common.ParamSpec("patch_embed/kernel", (p, p, 3, h), init),
        common.ParamSpec("patch_embed/bias", (h,), "zeros"),
        common.ParamSpec("embed/cls", (1, 1, h), init),
        common.ParamSpec("embed/pos", (1, seq, h), init),
    ]
    work = common.Work()
    b = size.batch
    work.matmul(b * (seq - 1) * p * p * 3 * h, first=True)
    work.elementwise(b * (seq - 1) * h, 1, 1, save=0)  # patch bias
    work.elementwise(b * seq * h, 1, 1, save=0)  # position embeddings
    for index in range(size.layers):
        specs += transformer.layer_specs(f"layer{index}", h, size.heads, size.mlp, INIT_STD)
        transformer.count_layer(work, b, seq, h, size.heads, size.mlp)
    specs += transformer.norm_specs("final_ln", h)
    specs += [
        common.ParamSpec("head/kernel", (h, size.classes), "normal:0.01"),
        common.ParamSpec("head/bias", (size.classes,), "zeros"),
    ]
    transformer.count_layernorm(work, b * seq * h)
    work.matmul(b * h * size.classes, save=b * h)
    work.elementwise(b * size.classes, 1, 1, save=0)
    return specs, work


PARTS = common.StepParts.images(_walk)
param_specs = PARTS.param_specs
footprint = PARTS.footprint


# --- JAX ------------------------------------------------------------------------------------
def _flax_model(size: VitSize) -> Any:
    jnp = import_jax().numpy
    import flax.linen as nn

    layer = transformer.flax_layer(LN_EPSILON, pre_norm=True)
    seq = _tokens(size)

    class Embed(nn.Module):
        @nn.compact
        def __call__(self, x):
            cls = self.param("cls", nn.initializers.zeros, (1, 1, size.hidden))
            pos = self.param("pos", nn.initializers.zeros, (1, seq, size.hidden))
            cls = jnp.broadcast_to(cls.astype(x.dtype), (x.shape[0], 1, size.hidden))
            return jnp.concatenate([cls, x], axis=1) + pos

    class Vit(nn.Module):
        @nn.compact
        def __call__(self, images):
            p = size.patch
            x = nn.Conv(size.hidden, (p, p), (p, p), padding="VALID", name="patch_embed")(images)
            x = Embed(name="embed")(x.reshape(x.shape[0], -1, size.hidden))
            for index in range(size.layers):
                x = layer(size.heads, size.mlp, name=f"layer{index}")(x)
            x = nn.LayerNorm(epsilon=LN_EPSILON, name="final_ln")(x)
            return nn.Dense(size.classes, name="head")(x[:, 0])

    return Vit()


def jax_function(size: VitSize) -> Any:
    """The step with Flax, ``jax.value_and_grad`` and optax."""
    model = _flax_model(size)

    def logits(params, images):
        return model.apply({"params": params}, images), None

    return common.jax_step(param_specs(size), 2, LEARNING_RATE, logits)


def reference(size: VitSize, *inputs: np.ndarray) -> np.ndarray:
    """The JAX step in float64 on the CPU (scoped x64)."""
    return common.jax_reference(lambda: jax_function(size), inputs)


# --- TensorFlow -----------------------------------------------------------------------------
def _keras_model(size: VitSize) -> Any:
    import keras
    from keras import layers, ops

    seq = _tokens(size)

    class Embed(layers.Layer):
        def build(self, input_shape):
            self.cls = self.add_weight(shape=(1, 1, size.hidden), initializer="zeros", name="cls")
            self.pos = self.add_weight(shape=(1, seq, size.hidden), initializer="zeros", name="pos")

        def call(self, x):
            cls = ops.broadcast_to(ops.cast(self.cls, x.dtype), (ops.shape(x)[0], 1, size.hidden))
            return ops.concatenate([cls, x], axis=1) + self.pos

    images = keras.Input((size.image, size.image, 3), batch_size=size.batch)
    p = size.patch
    x = layers.Conv2D(
        size.hidden, p, p, padding="valid", kernel_initializer="zeros", name="patch_embed"
    )(images)
    x = Embed(name="embed")(layers.Reshape((seq - 1, size.hidden))(x))
    for index in range(size.layers):
        x = transformer.keras_layer(
            x, f"layer{index}", size.heads, size.mlp, LN_EPSILON, pre_norm=True
        )
    x = layers.LayerNormalization(epsilon=LN_EPSILON, name="final_ln")(x)
    logits = layers.Dense(size.classes, kernel_initializer="zeros", name="head")(x[:, 0])
    return keras.Model(images, logits)


def tf_function(size: VitSize) -> Any:
    """The step with a Keras model, ``tf.GradientTape`` and the same SGD update."""
    return common.tf_step(
        param_specs(size), 2, LEARNING_RATE, _keras_model(size), lambda images: images
    )


# --- PyTorch --------------------------------------------------------------------------------
def torch_model(size: VitSize) -> Any:
    """The ViT as a ``torch.nn.Module`` (it takes NHWC images like the others)."""
    torch = import_torch()
    nn = torch.nn
    layer = transformer.torch_layer(LN_EPSILON, pre_norm=True)
    seq = _tokens(size)

    class Embed(nn.Module):
        def __init__(self):
            super().__init__()
            self.cls = nn.Parameter(torch.zeros(1, 1, size.hidden))
            self.pos = nn.Parameter(torch.zeros(1, seq, size.hidden))

        def forward(self, x):
            cls = self.cls.expand(x.shape[0], 1, size.hidden)
            return torch.cat([cls, x], dim=1) + self.pos

    class Vit(nn.Module):
        def __init__(self):
            super().__init__()
            p = size.patch
            self.patch_embed = nn.Conv2d(3, size.hidden, p, p)
            self.embed = Embed()
            for index in range(size.layers):
                self.add_module(f"layer{index}", layer(size.hidden, size.heads, size.mlp))
            self.final_ln = nn.LayerNorm(size.hidden, eps=LN_EPSILON)
            self.head = nn.Linear(size.hidden, size.classes)

        def forward(self, images):
            x = self.patch_embed(images.permute(0, 3, 1, 2).contiguous())
            x = self.embed(x.flatten(2).transpose(1, 2))  # (B, patches, hidden), row-major
            for index in range(size.layers):
                x = getattr(self, f"layer{index}")(x)
            return self.head(self.final_ln(x)[:, 0])

    return Vit()


def torch_function(size: VitSize) -> Any:
    """The step with a ``torch.nn`` ViT, ``torch.func`` and the same SGD update."""
    model = common.meta_module(lambda: torch_model(size))
    return common.torch_step(param_specs(size), 2, LEARNING_RATE, model, lambda x: (x,))


SPEC = PARTS.spec(
    name="vit_train",
    description="one SGD-momentum training step of a ViT-B/16 image classifier",
    sizes=SIZES,
    reference_fn=reference,
    jax_fn=jax_function,
    tf_fn=tf_function,
    torch_fn=torch_function,
    tolerances=TOLERANCE,
)
