"""One training step of a BERT-base encoder with a sequence-classification head.

Architecture (``BertSize``): word embeddings (``vocab`` x ``hidden``) plus learned position
embeddings (``seq`` x ``hidden``), LayerNorm; ``layers`` post-LN encoder layers
(:mod:`kernels.models.transformer`: ``heads`` heads, MLP width ``mlp``, exact GELU, LayerNorm
epsilon 1e-12); a pooler (dense ``hidden`` -> ``hidden`` and tanh on the first token) and a dense
classifier to ``classes``. There are no token-type embeddings and no attention mask (every
token is real), and no dropout. ``gpu`` is BERT-base: L=12, H=768, A=12, MLP 3072, vocabulary
30522, sequence 128, batch 32, 2 classes (109.5 M parameters with the head). ``tiny``: 2 layers
of width 128 (2 heads, MLP 512), vocabulary 1000, sequence 32, batch 8.

Data: token ids drawn uniformly from the vocabulary and passed as floats (B, S), cast to int32
inside the step: exact in float32 (ids below 2**24), which is why the workload offers float32
only (bfloat16 would round ids above 256); one-hot labels (B, classes). Initialisation: every
weight ``N(0, 0.02**2)`` (BERT's), biases zero, LayerNorm scale 1 and bias 0.

Step: see :mod:`kernels.models.common` (cross-entropy, SGD with momentum 0.9, learning rate
:data:`LEARNING_RATE`; output ``[loss, new parameters...]``).

Counts: the encoder layers as in :mod:`kernels.models.transformer`; the embedding lookups cost
no FLOPs forward and ``T * hidden`` adds each backward (the gradient's scatter-add, and the
position gradient's sum over the batch), their sum 1 + 1 per element; the pooler's and the
classifier's matmuls 3 passes, tanh 1 + 3, bias adds 1 + 1.

PyTorch (:func:`torch_model`): ``nn.Embedding`` for the words (the ids cast to int64) and for the
positions (its whole table added, no lookup), the layers of
:func:`kernels.models.transformer.torch_layer`, ``nn.Linear`` pooler and head.

Footprint (:func:`footprint`): parameters, momentum, gradients, and the activations the backward
pass keeps (per layer: its input, query, key, value, the attention probabilities, the context,
the MLP input, GELU's input and output; LayerNorm inputs). At ``gpu``: 2.15 TFLOP per step (XLA:
0.5 % more), ~3.8 GiB. Tolerance (:data:`TOLERANCE`): measured errors in :mod:`kernels.models`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from kernels.frameworks import import_jax, import_tensorflow, import_torch
from kernels.models import common, transformer
from kernels.spec import make_sizes

LEARNING_RATE = 0.05
LN_EPSILON = 1e-12
INIT_STD = 0.02
TOLERANCE = {"float32": 1e-6, "tf32": 3e-4}


class BertSize(NamedTuple):
    """Batch, sequence length, layers, hidden width, heads, MLP width, vocabulary, classes."""

    batch: int
    seq: int
    layers: int
    hidden: int
    heads: int
    mlp: int
    vocab: int
    classes: int


SIZES = make_sizes(
    tiny={"base": BertSize(8, 32, 2, 128, 2, 512, 1000, 2)},
    cpu={"base": BertSize(16, 64, 4, 256, 4, 1024, 8000, 2)},
    gpu={"base": BertSize(32, 128, 12, 768, 12, 3072, 30522, 2)},
)


def _walk(size: BertSize) -> tuple[list[common.ParamSpec], common.Work]:
    h = size.hidden
    init = f"normal:{INIT_STD}"
    specs = [
        common.ParamSpec("word_embed/embedding", (size.vocab, h), init),
        common.ParamSpec("pos_embed/embedding", (size.seq, h), init),
        *transformer.norm_specs("embed_ln", h),
    ]
    work = common.Work()
    t = size.batch * size.seq
    work.elementwise(t * h, 0, 2, save=0)  # gathers: scatter-add and batch-sum backward
    work.elementwise(t * h, 1, 1, save=0)  # word + position
    transformer.count_layernorm(work, t * h)
    for index in range(size.layers):
        specs += transformer.layer_specs(f"layer{index}", h, size.heads, size.mlp, INIT_STD)
        transformer.count_layer(work, size.batch, size.seq, h, size.heads, size.mlp)
    specs += [
        common.ParamSpec("pooler/kernel", (h, h), init),
        common.ParamSpec("pooler/bias", (h,), "zeros"),
        common.ParamSpec("head/kernel", (h, size.classes), init),
        common.ParamSpec("head/bias", (size.classes,), "zeros"),
    ]
    work.matmul(size.batch * h * h, save=size.batch * h)
    work.elementwise(size.batch * h, 2, 4, save=1)  # bias, tanh
    work.matmul(size.batch * h * size.classes, save=size.batch * h)
    work.elementwise(size.batch * size.classes, 1, 1, save=0)
    return specs, work


def _data_shapes(size: BertSize) -> list[tuple[int, ...]]:
    return [(size.batch, size.seq), (size.batch, size.classes)]


def _tokens(size: BertSize, rng: np.random.Generator) -> np.ndarray:
    """Token ids drawn uniformly from the vocabulary, as floats (exact in float32)."""
    return rng.integers(0, size.vocab, (size.batch, size.seq)).astype(np.float64)


PARTS = common.StepParts(_walk, _data_shapes, _tokens)
param_specs = PARTS.param_specs
footprint = PARTS.footprint


# --- JAX ------------------------------------------------------------------------------------
def _flax_model(size: BertSize) -> Any:
    import flax.linen as nn

    layer = transformer.flax_layer(LN_EPSILON, pre_norm=False)

    class PositionEmbedding(nn.Module):
        @nn.compact
        def __call__(self, x):
            return x + self.param("embedding", nn.initializers.zeros, x.shape[1:])

    class Bert(nn.Module):
        @nn.compact
        def __call__(self, tokens):
            x = nn.Embed(size.vocab, size.hidden, name="word_embed")(tokens)
            x = nn.LayerNorm(epsilon=LN_EPSILON, name="embed_ln")(
                PositionEmbedding(name="pos_embed")(x)
            )
            for index in range(size.layers):
                x = layer(size.heads, size.mlp, name=f"layer{index}")(x)
            pooled = nn.tanh(nn.Dense(size.hidden, name="pooler")(x[:, 0]))
            return nn.Dense(size.classes, name="head")(pooled)

    return Bert()


def jax_function(size: BertSize) -> Any:
    """The step with Flax, ``jax.value_and_grad`` and optax."""
    jnp = import_jax().numpy
    model = _flax_model(size)

    def logits(params, tokens):
        return model.apply({"params": params}, tokens.astype(jnp.int32)), None

    return common.jax_step(param_specs(size), 2, LEARNING_RATE, logits)


def reference(size: BertSize, *inputs: np.ndarray) -> np.ndarray:
    """The JAX step in float64 on the CPU (scoped x64)."""
    return common.jax_reference(lambda: jax_function(size), inputs)


# --- TensorFlow -----------------------------------------------------------------------------
def _keras_model(size: BertSize) -> Any:
    import keras
    from keras import layers

    class PositionEmbedding(layers.Layer):
        def build(self, input_shape):
            self.embedding = self.add_weight(
                shape=tuple(input_shape[1:]), initializer="zeros", name="embedding"
            )

        def call(self, x):
            return x + self.embedding

    tokens = keras.Input((size.seq,), batch_size=size.batch, dtype="int32")
    x = layers.Embedding(
        size.vocab, size.hidden, embeddings_initializer="zeros", name="word_embed"
    )(tokens)
    x = PositionEmbedding(name="pos_embed")(x)
    x = layers.LayerNormalization(epsilon=LN_EPSILON, name="embed_ln")(x)
    for index in range(size.layers):
        x = transformer.keras_layer(
            x, f"layer{index}", size.heads, size.mlp, LN_EPSILON, pre_norm=False
        )
    pooled = layers.Dense(
        size.hidden, activation="tanh", kernel_initializer="zeros", name="pooler"
    )(x[:, 0])
    logits = layers.Dense(size.classes, kernel_initializer="zeros", name="head")(pooled)
    return keras.Model(tokens, logits)


def tf_function(size: BertSize) -> Any:
    """The step with a Keras model, ``tf.GradientTape`` and the same SGD update."""
    tf = import_tensorflow()
    return common.tf_step(
        param_specs(size), 2, LEARNING_RATE, _keras_model(size),
        lambda tokens: tf.cast(tokens, tf.int32),
    )


# --- PyTorch --------------------------------------------------------------------------------
def torch_model(size: BertSize) -> Any:
    """The encoder as a ``torch.nn.Module`` over int64 token ids (B, S)."""
    torch = import_torch()
    nn = torch.nn
    layer = transformer.torch_layer(LN_EPSILON, pre_norm=False)

    class Bert(nn.Module):
        def __init__(self):
            super().__init__()
            self.word_embed = nn.Embedding(size.vocab, size.hidden)
            self.pos_embed = nn.Embedding(size.seq, size.hidden)  # added whole, not looked up
            self.embed_ln = nn.LayerNorm(size.hidden, eps=LN_EPSILON)
            for index in range(size.layers):
                self.add_module(f"layer{index}", layer(size.hidden, size.heads, size.mlp))
            self.pooler = nn.Linear(size.hidden, size.hidden)
            self.head = nn.Linear(size.hidden, size.classes)

        def forward(self, tokens):
            x = self.embed_ln(self.word_embed(tokens) + self.pos_embed.weight)
            for index in range(size.layers):
                x = getattr(self, f"layer{index}")(x)
            return self.head(torch.tanh(self.pooler(x[:, 0])))

    return Bert()


def torch_function(size: BertSize) -> Any:
    """The step with a ``torch.nn`` encoder, ``torch.func`` and the same SGD update."""
    torch = import_torch()
    model = common.meta_module(lambda: torch_model(size))
    return common.torch_step(
        param_specs(size), 2, LEARNING_RATE, model, lambda tokens: (tokens.to(torch.int64),)
    )


SPEC = PARTS.spec(
    name="bert_train",
    description="one SGD-momentum training step of a BERT-base encoder with a classifier head",
    sizes=SIZES,
    reference_fn=reference,
    jax_fn=jax_function,
    tf_fn=tf_function,
    torch_fn=torch_function,
    tolerances=TOLERANCE,
)
