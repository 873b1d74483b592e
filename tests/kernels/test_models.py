"""The model training steps (ResNet-50, BERT, ViT) at tiny size, in JAX, TF graphs and TF+XLA.

Each model is built once per framework mode and its float64 reference computed once (the
inputs come from one seed, so every mode shares it); the tests then read those outputs.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from kernel_testing import exponent_msb, flip_bit

from kernels import KernelOptions, Verdict, check_outputs, compiled_work, output_digest
from kernels.build import BuiltKernel
from kernels.models import bert_train, common, resnet50_train, vit_train

MODELS = {m.SPEC.name: m for m in (resnet50_train, bert_train, vit_train)}
MODES = {"jax": ("jax", False), "tensorflow": ("tensorflow", False), "tf-xla": ("tensorflow", True)}
SEED = 3
# Published parameter counts: torchvision's resnet50 (1000 classes); BERT-base uncased
# (109,482,240 with the pooler) less its token-type embeddings (2 x 768) and the position
# embeddings past our 128 tokens (384 x 768), plus our 2-class head (768 x 2 + 2); ViT-B/16 with
# a 1000-class head (timm's vit_base_patch16_224).
GPU_PARAMETERS = {
    "resnet50_train": 25_557_032,
    "bert_train": 109_482_240 - 2 * 768 - 384 * 768 + 768 * 2 + 2,
    "vit_train": 86_567_656,
}

_kernels: dict[tuple[str, str], BuiltKernel] = {}
_outputs: dict[tuple[str, str], list[np.ndarray]] = {}
_references: dict[str, np.ndarray] = {}


def _inputs(name: str) -> list[np.ndarray]:
    spec = MODELS[name].SPEC
    arrays = spec.inputs_fn(spec.size("tiny"), np.random.default_rng(SEED))
    return [a.astype(np.float32) for a in arrays]


def _kernel(name: str, mode: str) -> BuiltKernel:
    if (name, mode) not in _kernels:
        framework, xla = MODES[mode]
        options = KernelOptions(name, framework, "tiny", seed=SEED, xla=xla)
        kernel = BuiltKernel(MODELS[name].SPEC, options)
        _kernels[name, mode] = kernel
        _outputs[name, mode] = [kernel.call() for _ in range(3)]
    return _kernels[name, mode]


def _output(name: str, mode: str) -> np.ndarray:
    _kernel(name, mode)
    return _outputs[name, mode][-1]


def _reference(name: str) -> np.ndarray:
    if name not in _references:
        spec = MODELS[name].SPEC
        inputs = [a.astype(np.float64) for a in _inputs(name)]
        _references[name] = spec.reference_fn(spec.size("tiny"), *inputs)
    return _references[name]


def _start(name: str) -> np.ndarray:
    """The flat parameters the step starts from (the reference's layout without the loss)."""
    specs = MODELS[name].param_specs(MODELS[name].SPEC.size("tiny"))
    return np.concatenate([a.ravel() for a in _inputs(name)[2 : 2 + len(specs)]])


# TensorFlow's XLA bridge has no deterministic MaxPoolGrad, and op determinism is on.
CASES = [(n, m) for n in MODELS for m in MODES if (n, m) != ("resnet50_train", "tf-xla")]


@pytest.mark.parametrize(("name", "mode"), CASES)
def test_step_matches_the_float64_reference_and_repeats_bitwise(frameworks, name, mode):
    _kernel(name, mode)
    outputs = _outputs[name, mode]
    digests = [output_digest(o) for o in outputs]
    tolerance = MODELS[name].TOLERANCE["float32"]
    result = check_outputs(
        outputs[-1:], _reference(name), "float32", "default", name,
        digests=digests, tolerance=tolerance,
    )
    assert result.verdict is Verdict.OK, result
    assert len(set(digests)) == 1
    assert outputs[-1].dtype == np.float32 and outputs[-1].shape == _reference(name).shape


def test_resnet_under_tf_xla_is_refused_while_op_determinism_is_on(frameworks):
    with pytest.raises(Exception, match="MaxPool gradient ops do not yet have a deterministic"):
        BuiltKernel(resnet50_train.SPEC,
                    KernelOptions("resnet50_train", "tensorflow", "tiny", seed=SEED, xla=True))


@pytest.mark.parametrize("name", list(MODELS))
def test_the_update_itself_matches_the_reference(frameworks, name):
    # The output is dominated by the stored parameters; the update p' - p isolates the
    # gradients and the optimizer. Its error is mostly the output's own float32 rounding
    # (about 2**-24 of |p| against an update of 0.2-0.9% of |p|).
    start = _start(name)
    expected = _reference(name)[1:] - start
    for mode in ("jax", "tensorflow"):
        update = _output(name, mode)[1:].astype(np.float64) - start
        assert np.linalg.norm(update - expected) / np.linalg.norm(expected) < 1e-4, mode


@pytest.mark.parametrize("name", list(MODELS))
def test_a_flipped_bit_in_an_updated_parameter_is_wrong(frameworks, name):
    good = _output(name, "jax")
    params = np.abs(good[1:])
    index = 1 + int(np.argmin(np.where(params == 0, np.inf, params)))
    wrong = flip_bit(good, index, exponent_msb(good.dtype))
    tolerance = MODELS[name].TOLERANCE["float32"]
    result = check_outputs([wrong], _reference(name), "float32", "default", name,
                           tolerance=tolerance)
    assert result.verdict is Verdict.WRONG


@pytest.mark.parametrize("name", list(MODELS))
def test_a_doubled_learning_rate_is_wrong(frameworks, name):
    good = _output(name, "tensorflow").astype(np.float64)
    start = _start(name)
    doubled = np.concatenate([good[:1], start + 2 * (good[1:] - start)]).astype(np.float32)
    tolerance = MODELS[name].TOLERANCE["float32"]
    result = check_outputs([doubled], _reference(name), "float32", "default", name,
                           tolerance=tolerance)
    assert result.verdict is Verdict.WRONG, result


@pytest.mark.parametrize("name", list(MODELS))
def test_jax_and_tensorflow_agree(frameworks, name):
    a = _output(name, "jax").astype(np.float64)
    b = _output(name, "tensorflow").astype(np.float64)
    assert np.linalg.norm(a - b) / np.linalg.norm(_reference(name)) <= MODELS[name].TOLERANCE[
        "float32"
    ]


@pytest.mark.parametrize("preset", ["tiny", "gpu"])
@pytest.mark.parametrize("name", list(MODELS))
def test_analytic_flops_are_within_10_percent_of_xla(frameworks, name, preset):
    spec = MODELS[name].SPEC
    work = compiled_work(spec, "jax", preset, "float32", "default", True, None)
    assert work.source == "xla_cost_analysis", work.note
    assert work.flops == pytest.approx(spec.counts(preset).flops, rel=0.10)


@pytest.mark.parametrize("name", list(MODELS))
def test_the_initial_loss_is_near_ln_classes_and_steps_reduce_it(frameworks, name):
    jax, _ = frameworks
    module = MODELS[name]
    size = module.SPEC.size("tiny")
    for mode in ("jax", "tensorflow"):
        loss = float(_output(name, mode)[0])
        assert abs(loss - math.log(size.classes)) < 0.1 * math.log(size.classes), mode
    specs = module.param_specs(size)
    shapes = [s.shape for s in specs]
    inputs = _inputs(name)
    data, params = inputs[:2], inputs[2 : 2 + len(specs)]
    momentum = [np.zeros_like(p) for p in params]
    step = jax.jit(module.SPEC.jax_fn(size))
    losses = []
    for _ in range(4):
        out = np.asarray(step(*data, *params, *momentum))
        losses.append(float(out[0]))
        cuts = np.cumsum([math.prod(s) for s in shapes])[:-1]
        new = [a.reshape(s) for a, s in zip(np.split(out[1:], cuts), shapes, strict=True)]
        momentum = [(p - q) / module.LEARNING_RATE for p, q in zip(params, new, strict=True)]
        params = new
    assert losses[-1] < losses[0] - 0.05, losses


@pytest.mark.parametrize("name", list(MODELS))
def test_shapes_are_those_of_the_inputs(name):
    spec = MODELS[name].SPEC
    for preset in ("tiny", "cpu"):
        size = spec.size(preset)
        inputs = spec.inputs_fn(size, np.random.default_rng(0))
        assert tuple(a.shape for a in inputs) == spec.shapes_fn(size)


@pytest.mark.parametrize("name", list(MODELS))
def test_the_gpu_preset_has_the_published_parameter_count(name):
    module = MODELS[name]
    specs = module.param_specs(module.SPEC.size("gpu"))
    assert common.parameter_count(specs) == GPU_PARAMETERS[name]


@pytest.mark.parametrize("name", list(MODELS))
def test_the_footprint_adds_up_and_a_gpu_step_fits_an_h200(name):
    module = MODELS[name]
    for preset in ("tiny", "gpu"):
        size = module.SPEC.size(preset)
        parts = module.footprint(size, 4)
        assert parts["total"] == sum(v for k, v in parts.items() if k != "total")
        assert parts["parameters"] == 4 * common.parameter_count(module.param_specs(size))
        assert parts["activations"] > parts["data"] > 0
    assert module.footprint(module.SPEC.size("gpu"), 4)["total"] < 141e9


@pytest.mark.parametrize("name", list(MODELS))
def test_tensorflows_graph_of_each_step_is_counted_op_by_op(frameworks, name):
    """The graph route counts every op a training step launches (the gradient's shape
    arithmetic, BroadcastGradientArgs' axes, is host metadata, not device traffic); it moves
    more than XLA's fused step and launches more kernels."""
    spec = MODELS[name].SPEC
    graph = compiled_work(spec, "tensorflow", "tiny", xla=False)
    fused = compiled_work(spec, "jax", "tiny")
    assert graph.source == "tf_graph_ops", graph.note
    assert graph.flops == spec.counts("tiny").flops
    assert graph.bytes_moved > fused.bytes_moved and graph.launches > fused.launches
