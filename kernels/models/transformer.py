"""The Transformer encoder layer that BERT (post-LN) and ViT (pre-LN) share, in Flax, Keras and
PyTorch.

A layer over ``tokens`` vectors of width ``hidden``: multi-head self-attention (``heads`` heads of
``hidden / heads``; query, key, value and output projections with biases; scores scaled by
``1/sqrt(head_dim)``, softmax over keys, no mask) and an MLP (dense to ``mlp``, exact erf GELU,
dense back), each with a residual connection and a LayerNorm: after the residual add (post-LN,
BERT) or before the branch (pre-LN, ViT). Parameter names follow Flax's ``nn.Dense``,
``nn.LayerNorm`` and ``nn.MultiHeadDotProductAttention``; the Keras layers are named
``layer{i}.attn``, ``layer{i}.ln1``... so that :func:`kernels.models.common.canonical_name` maps
them onto the same paths; the ``torch.nn`` modules are named as Flax's (``layer0.attn.query``),
their weights the canonical arrays in torch's layouts (:func:`kernels.models.common.torch_param`).

Counts per layer (T = tokens in the batch, B*heads*S*S attention scores), whole step:
matmuls 3 passes of ``2 * macs``; bias adds 1 + 1 per element; the query scaling 1 + 1; softmax
5 forward (max, subtract, exp, sum, divide) and 4 backward; LayerNorm 7 forward and 10 backward;
exact GELU 5 forward and 8 backward (erf and exp count 1); residual adds 1 + 1.
"""

from __future__ import annotations

from typing import Any

from kernels.frameworks import import_torch
from kernels.models import common


def layer_specs(
    prefix: str, hidden: int, heads: int, mlp: int, std: float
) -> list[common.ParamSpec]:
    """The parameters of one layer, in canonical order."""
    dim = hidden // heads
    init = f"normal:{std}"
    specs = []
    for proj in ("query", "key", "value"):
        specs.append(common.ParamSpec(f"{prefix}/attn/{proj}/kernel", (hidden, heads, dim), init))
        specs.append(common.ParamSpec(f"{prefix}/attn/{proj}/bias", (heads, dim), "zeros"))
    specs.append(common.ParamSpec(f"{prefix}/attn/out/kernel", (heads, dim, hidden), init))
    specs.append(common.ParamSpec(f"{prefix}/attn/out/bias", (hidden,), "zeros"))
    specs += norm_specs(f"{prefix}/ln1", hidden)
    specs.append(common.ParamSpec(f"{prefix}/mlp_in/kernel", (hidden, mlp), init))
    specs.append(common.ParamSpec(f"{prefix}/mlp_in/bias", (mlp,), "zeros"))
    specs.append(common.ParamSpec(f"{prefix}/mlp_out/kernel", (mlp, hidden), init))
    specs.append(common.ParamSpec(f"{prefix}/mlp_out/bias", (hidden,), "zeros"))
    specs += norm_specs(f"{prefix}/ln2", hidden)
    return specs


def norm_specs(prefix: str, width: int) -> list[common.ParamSpec]:
    """A LayerNorm's scale (ones) and bias (zeros)."""
    return [
        common.ParamSpec(f"{prefix}/scale", (width,), "ones"),
        common.ParamSpec(f"{prefix}/bias", (width,), "zeros"),
    ]


def count_layernorm(work: common.Work, elements: int) -> None:
    """Add one LayerNorm over ``elements`` to ``work``."""
    work.elementwise(elements, 7, 10, save=1)


def count_layer(
    work: common.Work, batch: int, seq: int, hidden: int, heads: int, mlp: int
) -> None:
    """Add one encoder layer's step work and saved activations to ``work``."""
    t = batch * seq
    scores = batch * heads * seq * seq
    for _ in range(3):  # query, key, value
        work.matmul(t * hidden * hidden, save=0)
        work.elementwise(t * hidden, 1, 1, save=1)
    work.elementwise(t * hidden, 1, 1, save=0)  # query scaling
    work.matmul(t * seq * hidden, save=0)  # scores
    work.elementwise(scores, 5, 4, save=1)  # softmax
    work.matmul(t * seq * hidden, save=0)  # context
    work.matmul(t * hidden * hidden, save=t * hidden)  # output projection, its input saved
    work.elementwise(t * hidden, 1, 1, save=0)  # bias
    work.elementwise(t * hidden, 1, 1, save=0)  # residual
    count_layernorm(work, t * hidden)
    work.matmul(t * hidden * mlp, save=t * hidden)
    work.elementwise(t * mlp, 1, 1, save=0)  # bias
    work.elementwise(t * mlp, 5, 8, save=2)  # GELU: input and output saved
    work.matmul(t * mlp * hidden, save=0)
    work.elementwise(t * hidden, 1, 1, save=0)  # bias
    work.elementwise(t * hidden, 1, 1, save=0)  # residual
    count_layernorm(work, t * hidden)
    work.saved += t * hidden  # the layer's input (LayerNorm and query/key/value inputs)


def flax_layer(epsilon: float, pre_norm: bool) -> Any:
    """The Flax encoder layer class: ``Layer(heads, mlp, name=...)(x)``."""
    import flax.linen as nn

    class Layer(nn.Module):
        heads: int
        mlp: int

        @nn.compact
        def __call__(self, x):
            hidden = x.shape[-1]
            attention = nn.MultiHeadDotProductAttention(
                num_heads=self.heads, qkv_features=hidden, out_features=hidden,
                deterministic=True, name="attn",
            )
            ln1 = nn.LayerNorm(epsilon=epsilon, name="ln1")
            ln2 = nn.LayerNorm(epsilon=epsilon, name="ln2")
            mlp_in = nn.Dense(self.mlp, name="mlp_in")
            mlp_out = nn.Dense(hidden, name="mlp_out")

            def mlp(y):
                return mlp_out(nn.gelu(mlp_in(y), approximate=False))

            if pre_norm:
                x = x + attention(ln1(x))
                return x + mlp(ln2(x))
            x = ln1(x + attention(x))
            return ln2(x + mlp(x))

    return Layer


def keras_layer(x: Any, name: str, heads: int, mlp: int, epsilon: float, pre_norm: bool) -> Any:
    """Apply one Keras encoder layer named ``name`` to the symbolic tensor ``x``."""
    import keras
    from keras import layers

    hidden = x.shape[-1]
    attention = layers.MultiHeadAttention(
        heads, hidden // heads, kernel_initializer="zeros", name=f"{name}.attn"
    )
    ln1 = layers.LayerNormalization(epsilon=epsilon, name=f"{name}.ln1")
    ln2 = layers.LayerNormalization(epsilon=epsilon, name=f"{name}.ln2")
    mlp_in = layers.Dense(mlp, kernel_initializer="zeros", name=f"{name}.mlp_in")
    mlp_out = layers.Dense(hidden, kernel_initializer="zeros", name=f"{name}.mlp_out")

    def mlp_branch(y):
        return mlp_out(keras.ops.gelu(mlp_in(y), approximate=False))

    if pre_norm:
        y = ln1(x)
        x = x + attention(y, y)
        return x + mlp_branch(ln2(x))
    x = ln1(x + attention(x, x))
    return ln2(x + mlp_branch(x))


def torch_layer(epsilon: float, pre_norm: bool) -> Any:
    """The ``torch.nn`` encoder layer class: ``Layer(hidden, heads, mlp)``, named as the Flax
    layer (``attn.query``, ``ln1``, ``mlp_in``...). The query, key, value and output projections
    are separate ``nn.Linear`` layers (as Hugging Face's BERT has them) and attention is
    ``scaled_dot_product_attention`` (default scale ``1/sqrt(head_dim)``, no mask, no dropout).
    """
    torch = import_torch()
    nn, functional = torch.nn, torch.nn.functional

    class Attention(nn.Module):
        def __init__(self, hidden: int, heads: int):
            super().__init__()
            self.heads = heads
            self.query, self.key = nn.Linear(hidden, hidden), nn.Linear(hidden, hidden)
            self.value, self.out = nn.Linear(hidden, hidden), nn.Linear(hidden, hidden)

        def forward(self, x):
            batch, seq, hidden = x.shape

            def split(y):
                return y.reshape(batch, seq, self.heads, -1).transpose(1, 2)

            q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
            context = functional.scaled_dot_product_attention(q, k, v)
            return self.out(context.transpose(1, 2).reshape(batch, seq, hidden))

    class Layer(nn.Module):
        def __init__(self, hidden: int, heads: int, mlp: int):
            super().__init__()
            self.attn = Attention(hidden, heads)
            self.ln1 = nn.LayerNorm(hidden, eps=epsilon)
            self.ln2 = nn.LayerNorm(hidden, eps=epsilon)
            self.mlp_in, self.mlp_out = nn.Linear(hidden, mlp), nn.Linear(mlp, hidden)

        def mlp(self, y):
            return self.mlp_out(functional.gelu(self.mlp_in(y), approximate="none"))

        def forward(self, x):
            if pre_norm:
                x = x + self.attn(self.ln1(x))
                return x + self.mlp(self.ln2(x))
            x = self.ln1(x + self.attn(x))
            return self.ln2(x + self.mlp(x))

    return Layer
