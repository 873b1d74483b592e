"""One training step of a ResNet-50 (v1.5, bottleneck blocks) on a batch of images.

Architecture (``ResNetSize``): a 7x7/2 stem convolution of ``width`` channels, BatchNorm, ReLU and a
3x3/2 max pool; four stages of ``blocks[i]`` bottleneck blocks (1x1 conv to ``width * 2**i``,
3x3 conv with the stage's stride, 1x1 conv to 4x that; BatchNorm after each, ReLU after the
first two and after the residual add; a 1x1 projection with BatchNorm on each stage's first
block); global average pooling; a dense classifier. Convolutions have no bias; every padding is
SAME (TensorFlow's and XLA's: the odd pixel goes after). Stage strides are 1, 2, 2, 2 and the
stride sits on the 3x3 convolution (v1.5). ``gpu`` is ResNet-50 itself: blocks (3, 4, 6, 3),
width 64, 224x224 images, 1000 classes, batch 256 (25.6 M parameters). ``tiny`` keeps every
kind of layer with one block per stage, width 8, 32x32 images and 10 classes.

Step: see :mod:`kernels.models.common` (cross-entropy, SGD with momentum 0.9, learning rate
:data:`LEARNING_RATE`; output ``[loss, new parameters...]``). BatchNorm (epsilon 1e-5) uses the
batch's statistics; its running averages are not part of the output. Initialisation: He normal
convolutions, BatchNorm scale 1 and bias 0, classifier ``N(0, 0.01**2)`` with zero bias (initial
loss ~ ln(classes)). Data: images ``N(0, 1)`` (B, H, W, 3) and one-hot labels (B, classes),
exact in any dtype.

Counts: convolutions count the taps inside the image (XLA's convention), 3 passes except the
stem (2: the images need no gradient); BatchNorm 6 FLOPs per element forward (sum, sum of
squares, subtract, scale, shift) and 8 backward; ReLU 1 + 1; the residual add 1 forward and 1
for the gradients' sum at the block input; max pool 2 per tap; average pool 1 + 1 per element.

Footprint (:func:`footprint`): parameters, momentum and gradients (one each), and the
activations the backward pass needs: every convolution's input, every BatchNorm's input and
every ReLU's output, the pooled features and logits.

PyTorch (:func:`torch_model`): ``torch.nn`` convolutions in NCHW (the NHWC images are permuted
and made contiguous first; kernels are OIHW views of the canonical HWIO arrays), SAME padding
placed as XLA places it (:func:`same_padding`; ``F.pad`` where it is asymmetric, the max pool's
with -inf), ``BatchNorm2d(eps=1e-5, momentum=0.1)`` (torch's momentum weighs the new batch:
Flax's 0.9). In training mode all three normalise with the batch's biased variance; torch's
running variance is the unbiased one, Flax's and Keras' the biased one, which no output sees.

At ``gpu`` the model is 6.05 TFLOP per step (XLA: 1.2 % more) and ~31 GiB of device memory,
30 GiB of it activations. Tolerance (:data:`TOLERANCE`): measured errors in :mod:`kernels.models`.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from kernels.frameworks import import_jax, import_torch
from kernels.models import common
from kernels.spec import make_sizes

LEARNING_RATE = 0.05
BN_EPSILON = 1e-5
TOLERANCE = {"float32": 1e-6, "tf32": 3e-4}


class ResNetSize(NamedTuple):
    """Batch, image side, stem width, bottleneck blocks per stage, and classes."""

    batch: int
    image: int
    width: int
    blocks: tuple[int, ...]
    classes: int


SIZES = make_sizes(
    tiny={"v1.5": ResNetSize(8, 32, 8, (1, 1, 1, 1), 10)},
    cpu={"v1.5": ResNetSize(16, 64, 16, (1, 2, 2, 1), 100)},
    gpu={"v1.5": ResNetSize(256, 224, 64, (3, 4, 6, 3), 1000)},
)


def _same(size: int, stride: int) -> int:
    return -(-size // stride)


def _walk(size: ResNetSize) -> tuple[list[common.ParamSpec], common.Work]:
    """The parameters in canonical order and the step's work, from one pass over the layers."""
    specs: list[common.ParamSpec] = []
    work = common.Work()
    b = size.batch

    def conv(name: str, hw: int, k: int, stride: int, c_in: int, c_out: int, first=False) -> int:
        specs.append(common.ParamSpec(f"{name}/kernel", (k, k, c_in, c_out), "he", k * k * c_in))
        taps = common.valid_taps(hw, k, stride) ** 2
        work.matmul(b * taps * c_in * c_out, first=first, save=0 if first else b * hw * hw * c_in)
        return _same(hw, stride)

    def bn(name: str, hw: int, c: int, relu: bool) -> None:
        specs.append(common.ParamSpec(f"{name}/scale", (c,), "ones"))
        specs.append(common.ParamSpec(f"{name}/bias", (c,), "zeros"))
        elements = b * hw * hw * c
        work.elementwise(elements, 6, 8, save=1)
        if relu:
            work.elementwise(elements, 1, 1, save=1)

    hw = conv("stem_conv", size.image, 7, 2, 3, size.width, first=True)
    bn("stem_bn", hw, size.width, relu=True)
    pooled = _same(hw, 2)
    work.elementwise(b * size.width, 2 * common.valid_taps(hw, 3, 2) ** 2, 0, save=0)
    hw = pooled
    c_in = size.width
    for stage, count in enumerate(size.blocks):
        width = size.width * 2**stage
        for block in range(count):
            stride = 2 if stage > 0 and block == 0 else 1
            name = f"stage{stage + 1}_block{block + 1}"
            conv(f"{name}/conv1", hw, 1, 1, c_in, width)
            bn(f"{name}/bn1", hw, width, relu=True)
            out = conv(f"{name}/conv2", hw, 3, stride, width, width)
            bn(f"{name}/bn2", out, width, relu=True)
            conv(f"{name}/conv3", out, 1, 1, width, 4 * width)
            bn(f"{name}/bn3", out, 4 * width, relu=False)
            if block == 0:
                conv(f"{name}/proj_conv", hw, 1, stride, c_in, 4 * width)
                bn(f"{name}/proj_bn", out, 4 * width, relu=False)
            work.elementwise(b * out * out * 4 * width, 2, 1, save=1)  # add, ReLU; grads' sum
            hw, c_in = out, 4 * width
    work.elementwise(b * hw * hw * c_in, 1, 1, save=0)  # global average pool
    specs.append(common.ParamSpec("head/kernel", (c_in, size.classes), "normal:0.01"))
    specs.append(common.ParamSpec("head/bias", (size.classes,), "zeros"))
    work.matmul(b * c_in * size.classes, save=b * c_in)
    work.elementwise(b * size.classes, 1, 1, save=1)  # bias add; bias gradient
    return specs, work


PARTS = common.StepParts.images(_walk)
param_specs = PARTS.param_specs
footprint = PARTS.footprint


# --- JAX ------------------------------------------------------------------------------------
def _flax_model(size: ResNetSize) -> Any:
    import flax.linen as nn

    conv = lambda c, k, s, name: nn.Conv(  # noqa: E731
        c, (k, k), (s, s), padding="SAME", use_bias=False, name=name
    )
    norm = lambda name: nn.BatchNorm(  # noqa: E731
        use_running_average=False, momentum=0.9, epsilon=BN_EPSILON, name=name
    )

    class Bottleneck(nn.Module):
        width: int
        stride: int
        project: bool

        @nn.compact
        def __call__(self, x):
            y = nn.relu(norm("bn1")(conv(self.width, 1, 1, "conv1")(x)))
            y = nn.relu(norm("bn2")(conv(self.width, 3, self.stride, "conv2")(y)))
            y = norm("bn3")(conv(4 * self.width, 1, 1, "conv3")(y))
            if self.project:
                x = norm("proj_bn")(conv(4 * self.width, 1, self.stride, "proj_conv")(x))
            return nn.relu(x + y)

    class ResNet(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.relu(norm("stem_bn")(conv(size.width, 7, 2, "stem_conv")(x)))
            x = nn.max_pool(x, (3, 3), (2, 2), padding="SAME")
            for stage, count in enumerate(size.blocks):
                for block in range(count):
                    stride = 2 if stage > 0 and block == 0 else 1
                    x = Bottleneck(
                        size.width * 2**stage, stride, block == 0,
                        name=f"stage{stage + 1}_block{block + 1}",
                    )(x)
            return nn.Dense(size.classes, name="head")(x.mean(axis=(1, 2)))

    return ResNet()


def _batch_stats(jnp: Any, specs: list[common.ParamSpec], dtype: Any) -> dict[str, Any]:
    bn = [s for s in specs if s.name.endswith("/scale")]
    stats = [common.ParamSpec(s.name.replace("/scale", "/mean"), s.shape, "") for s in bn]
    stats += [common.ParamSpec(s.name.replace("/scale", "/var"), s.shape, "") for s in bn]
    return common.nest(stats, [jnp.zeros(s.shape, dtype) for s in stats])


def jax_function(size: ResNetSize) -> Any:
    """The step with Flax, ``jax.value_and_grad`` and optax."""
    jnp = import_jax().numpy
    model = _flax_model(size)
    specs = param_specs(size)

    def logits(params, images):
        stats = _batch_stats(jnp, specs, images.dtype)
        return model.apply(
            {"params": params, "batch_stats": stats}, images, mutable=["batch_stats"]
        )

    return common.jax_step(specs, 2, LEARNING_RATE, logits)


def reference(size: ResNetSize, *inputs: np.ndarray) -> np.ndarray:
    """The JAX step in float64 on the CPU (scoped x64)."""
    return common.jax_reference(lambda: jax_function(size), inputs)


# --- TensorFlow -----------------------------------------------------------------------------
def _keras_model(size: ResNetSize) -> Any:
    import keras
    from keras import layers

    def conv(x, c, k, s, name):
        return layers.Conv2D(
            c, k, s, padding="same", use_bias=False, kernel_initializer="zeros", name=name
        )(x)

    def norm(x, name):
        return layers.BatchNormalization(momentum=0.9, epsilon=BN_EPSILON, name=name)(x)

    images = keras.Input((size.image, size.image, 3), batch_size=size.batch)
    x = layers.ReLU()(norm(conv(images, size.width, 7, 2, "stem_conv"), "stem_bn"))
    x = layers.MaxPooling2D(3, 2, padding="same")(x)
    for stage, count in enumerate(size.blocks):
        width = size.width * 2**stage
        for block in range(count):
            stride = 2 if stage > 0 and block == 0 else 1
            name = f"stage{stage + 1}_block{block + 1}"
            y = layers.ReLU()(norm(conv(x, width, 1, 1, f"{name}.conv1"), f"{name}.bn1"))
            y = layers.ReLU()(norm(conv(y, width, 3, stride, f"{name}.conv2"), f"{name}.bn2"))
            y = norm(conv(y, 4 * width, 1, 1, f"{name}.conv3"), f"{name}.bn3")
            if block == 0:
                x = norm(conv(x, 4 * width, 1, stride, f"{name}.proj_conv"), f"{name}.proj_bn")
            x = layers.ReLU()(layers.Add()([x, y]))
    x = layers.GlobalAveragePooling2D()(x)
    logits = layers.Dense(size.classes, kernel_initializer="zeros", name="head")(x)
    return keras.Model(images, logits)


def tf_function(size: ResNetSize) -> Any:
    """The step with a Keras model, ``tf.GradientTape`` and the same SGD update."""
    return common.tf_step(
        param_specs(size), 2, LEARNING_RATE, _keras_model(size), lambda images: images
    )


# --- PyTorch --------------------------------------------------------------------------------
def same_padding(size: int, kernel: int, stride: int) -> tuple[int, int]:
    """SAME padding of one axis as TensorFlow and XLA place it: ``(before, after)``, the odd
    pixel after (PyTorch's own ``padding="same"`` allows stride 1 only)."""
    pad = max((-(-size // stride) - 1) * stride + kernel - size, 0)
    return pad // 2, pad - pad // 2


def _torch_same(
    functional: Any, x: Any, kernel: int, stride: int
) -> tuple[Any, tuple[int, int]]:
    """``x`` (NCHW) padded for a SAME window: symmetric padding is left to the op (returned),
    asymmetric padding is applied here with ``functional.pad`` (zeros, for a convolution)."""
    pads = [same_padding(side, kernel, stride) for side in x.shape[2:]]
    if all(before == after for before, after in pads):
        return x, (pads[0][0], pads[1][0])
    (top, bottom), (left, right) = pads
    return functional.pad(x, (left, right, top, bottom)), (0, 0)


def torch_model(size: ResNetSize) -> Any:
    """The ResNet as a ``torch.nn.Module`` (NCHW inside; it takes NHWC images like the others)."""
    torch = import_torch()
    nn, functional = torch.nn, torch.nn.functional

    class SameConv(nn.Conv2d):
        def __init__(self, c_in: int, c_out: int, k: int, s: int):
            super().__init__(c_in, c_out, k, s, bias=False)

        def forward(self, x):
            x, padding = _torch_same(functional, x, self.kernel_size[0], self.stride[0])
            return functional.conv2d(x, self.weight, None, self.stride, padding)

    def norm(c: int) -> Any:  # Flax's momentum 0.9 on the running average is torch's 0.1
        return nn.BatchNorm2d(c, eps=BN_EPSILON, momentum=1 - 0.9)

    class Bottleneck(nn.Module):
        def __init__(self, c_in: int, width: int, stride: int, project: bool):
            super().__init__()
            self.conv1, self.bn1 = SameConv(c_in, width, 1, 1), norm(width)
            self.conv2, self.bn2 = SameConv(width, width, 3, stride), norm(width)
            self.conv3, self.bn3 = SameConv(width, 4 * width, 1, 1), norm(4 * width)
            if project:
                self.proj_conv = SameConv(c_in, 4 * width, 1, stride)
                self.proj_bn = norm(4 * width)

        def forward(self, x):
            y = functional.relu(self.bn1(self.conv1(x)))
            y = functional.relu(self.bn2(self.conv2(y)))
            y = self.bn3(self.conv3(y))
            if hasattr(self, "proj_conv"):
                x = self.proj_bn(self.proj_conv(x))
            return functional.relu(x + y)

    class ResNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem_conv, self.stem_bn = SameConv(3, size.width, 7, 2), norm(size.width)
            c_in, self.blocks = size.width, []
            for stage, count in enumerate(size.blocks):
                width = size.width * 2**stage
                for block in range(count):
                    stride = 2 if stage > 0 and block == 0 else 1
                    name = f"stage{stage + 1}_block{block + 1}"
                    self.add_module(name, Bottleneck(c_in, width, stride, block == 0))
                    self.blocks.append(name)
                    c_in = 4 * width
            self.head = nn.Linear(c_in, size.classes)

        def forward(self, images):
            x = images.permute(0, 3, 1, 2).contiguous()
            x = functional.relu(self.stem_bn(self.stem_conv(x)))
            (top, bottom), (left, right) = (same_padding(s, 3, 2) for s in x.shape[2:])
            x = functional.pad(x, (left, right, top, bottom), value=-math.inf)
            x = functional.max_pool2d(x, 3, 2)
            for name in self.blocks:
                x = getattr(self, name)(x)
            return self.head(x.mean(dim=(2, 3)))

    return ResNet()


def torch_function(size: ResNetSize) -> Any:
    """The step with a ``torch.nn`` ResNet, ``torch.func`` and the same SGD update."""
    model = common.meta_module(lambda: torch_model(size))
    return common.torch_step(param_specs(size), 2, LEARNING_RATE, model, lambda x: (x,))


SPEC = PARTS.spec(
    name="resnet50_train",
    description="one SGD-momentum training step of ResNet-50 (bottleneck, BatchNorm) on images",
    sizes=SIZES,
    reference_fn=reference,
    jax_fn=jax_function,
    tf_fn=tf_function,
    torch_fn=torch_function,
    tolerances=TOLERANCE,
    convolution=True,  # its matrix work is convolutions (the classifier's is 0.05 %)
)
