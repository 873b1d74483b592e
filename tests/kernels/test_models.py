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
@pytest.mark.slow
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
@pytest.mark.slow
def test_analytic_flops_are_within_10_percent_of_xla(frameworks, name, preset):
    spec = MODELS[name].SPEC
    work = compiled_work(spec, "jax", preset, "float32", "default", True, None)
    assert work.source == "xla_cost_analysis", work.note
    assert work.flops == pytest.approx(spec.counts(preset).flops, rel=0.10)


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.slow
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


# --- PyTorch ------------------------------------------------------------------------------------
# The PyTorch step is built as a sweep builds it (BuiltKernel: eager, deterministic algorithms on
# around every call) from the same seed, and called twice.
_torch_kernels: dict[str, BuiltKernel] = {}
_torch_outputs: dict[str, list[np.ndarray]] = {}


@pytest.fixture(scope="session")
def torch():
    """PyTorch, imported once, in the mode the kernels set up."""
    from kernels.frameworks import import_torch

    return import_torch()


def _torch_output(torch, name: str) -> list[np.ndarray]:
    if name not in _torch_outputs:
        options = KernelOptions(name, "pytorch", "tiny", seed=SEED, deterministic=True)
        kernel = BuiltKernel(MODELS[name].SPEC, options)
        _torch_kernels[name] = kernel
        _torch_outputs[name] = [kernel.call() for _ in range(2)]
    return _torch_outputs[name]


@pytest.mark.parametrize("name", list(MODELS))
def test_pytorch_step_matches_the_float64_reference_and_repeats_bitwise(torch, name):
    outputs = _torch_output(torch, name)
    assert _torch_kernels[name].deterministic and not _torch_kernels[name].compile
    digests = [output_digest(o) for o in outputs]
    result = check_outputs(
        outputs[-1:], _reference(name), "float32", "default", name,
        digests=digests, tolerance=MODELS[name].TOLERANCE["float32"],
    )
    assert result.verdict is Verdict.OK, result
    assert len(set(digests)) == 1
    assert outputs[-1].dtype == np.float32 and outputs[-1].shape == _reference(name).shape


@pytest.mark.parametrize("name", list(MODELS))
def test_pytorch_agrees_with_jax_and_tensorflow_on_the_first_step(frameworks, torch, name):
    # Measured (tiny, seed 3), norm-wise against the reference's norm: torch-JAX 2.7e-8 ResNet,
    # 1.7e-9 BERT, 8.9e-9 ViT; the update p' - p alone matches the reference to 3e-6..1.4e-5.
    ours = _torch_output(torch, name)[-1].astype(np.float64)
    reference = _reference(name)
    start = _start(name)
    for mode in ("jax", "tensorflow"):
        theirs = _output(name, mode).astype(np.float64)
        error = np.linalg.norm(ours - theirs) / np.linalg.norm(reference)
        assert error <= MODELS[name].TOLERANCE["float32"], (mode, error)
    assert abs(ours[0] - reference[0]) < 1e-6 * reference[0]
    expected = reference[1:] - start
    update = ours[1:] - start
    assert np.linalg.norm(update - expected) / np.linalg.norm(expected) < 1e-4


@pytest.mark.parametrize("name", list(MODELS))
def test_loaded_torch_parameters_are_bitwise_the_numpy_bits(torch, name):
    module = MODELS[name]
    size = module.SPEC.size("tiny")
    specs = module.param_specs(size)
    inputs = _inputs(name)
    params = inputs[2 : 2 + len(specs)]
    model = module.torch_model(size).train()
    common.load_torch_parameters(model, specs, params)
    for spec, read, array in zip(specs, common.read_torch_parameters(model, specs), params,
                                 strict=True):
        assert read.dtype == np.float32 and np.array_equal(read.view(np.uint32),
                                                           array.view(np.uint32)), spec.name
    # The module called as PyTorch users call it gives the step's loss.
    features = [torch.from_numpy(a) for a in inputs[:1]]
    if name == "bert_train":
        features = [f.long() for f in features]
    with torch.no_grad():
        logits = model(*features)
        loss = torch.nn.functional.cross_entropy(logits, torch.from_numpy(inputs[1]))
    assert float(loss) == pytest.approx(float(_reference(name)[0]), rel=1e-6)


def test_torch_layouts_put_each_canonical_element_where_torch_expects_it(torch):
    rng = np.random.default_rng(0)
    conv, dense = rng.standard_normal((3, 5, 2, 4)), rng.standard_normal((6, 7))
    heads_in, heads_out = rng.standard_normal((6, 2, 3)), rng.standard_normal((2, 3, 6))
    heads_bias = rng.standard_normal((2, 3))
    expected = {
        "conv": np.transpose(conv, (3, 2, 0, 1)),  # HWIO -> OIHW: w[o, i, y, x] = k[y, x, i, o]
        "dense": dense.T,  # (in, out) -> (out, in)
        "heads_in": heads_in.reshape(6, 6).T,  # w[h * dim + d, i] = k[i, h, d]
        "heads_out": heads_out.reshape(6, 6).T,  # w[o, h * dim + d] = k[h, d, o]
        "heads_bias": heads_bias.reshape(6),
        "same": dense,
    }
    arrays = {"conv": conv, "dense": dense, "heads_in": heads_in, "heads_out": heads_out,
              "heads_bias": heads_bias, "same": dense}
    assert expected["conv"][3, 1, 2, 4] == conv[2, 4, 1, 3]
    assert expected["heads_in"][1 * 3 + 2, 5] == heads_in[5, 1, 2]
    for layout, array in arrays.items():
        ours = common.to_torch_layout(layout, torch.from_numpy(array))
        assert np.array_equal(ours.numpy(), expected[layout]), layout
        back = common.from_torch_layout(layout, ours.contiguous(), array.shape)
        assert np.array_equal(back.numpy(), array), layout


@pytest.mark.parametrize(
    ("flax", "shape", "torch_name", "layout"),
    [
        ("stage1_block1/conv1/kernel", (1, 1, 8, 8), "stage1_block1.conv1.weight", "conv"),
        ("stem_bn/scale", (8,), "stem_bn.weight", "same"),
        ("head/kernel", (64, 10), "head.weight", "dense"),
        ("layer0/attn/query/kernel", (128, 2, 64), "layer0.attn.query.weight", "heads_in"),
        ("layer0/attn/query/bias", (2, 64), "layer0.attn.query.bias", "heads_bias"),
        ("layer0/attn/out/kernel", (2, 64, 128), "layer0.attn.out.weight", "heads_out"),
        ("layer0/attn/out/bias", (128,), "layer0.attn.out.bias", "same"),
        ("word_embed/embedding", (1000, 128), "word_embed.weight", "same"),
        ("embed/cls", (1, 1, 128), "embed.cls", "same"),
    ],
)
def test_each_canonical_parameter_has_its_torch_name_and_layout(flax, shape, torch_name, layout):
    assert common.torch_param(common.ParamSpec(flax, shape, "zeros")) == (torch_name, layout)


def test_a_torch_module_without_the_canonical_parameters_is_refused(torch):
    size = resnet50_train.SPEC.size("tiny")
    specs = resnet50_train.param_specs(size)
    model = common.meta_module(lambda: resnet50_train.torch_model(size))
    with pytest.raises(ValueError, match="not the canonical parameters"):
        common.torch_step(specs[:-1], 2, 0.05, model, lambda x: (x,))
    del model.head
    with pytest.raises(ValueError, match="not the canonical parameters"):
        common.torch_step(specs, 2, 0.05, model, lambda x: (x,))


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.slow
def test_the_pytorch_step_traces_whole_for_torch_compile(torch, name):
    # fullgraph: no graph break anywhere in the step (functional_call, grad_and_value, the
    # update). The aot_eager backend stops short of Inductor's C++ code generation, which takes
    # 100-170 s per model at tiny on 2 loaded cores; it runs the traced graph's ATen ops.
    spec = MODELS[name].SPEC
    torch._dynamo.reset()  # a fresh cache: the steps share code objects, each compile guards
    step = torch.compile(spec.torch_fn(spec.size("tiny")), fullgraph=True, backend="aot_eager")
    out = step(*[torch.from_numpy(a) for a in _inputs(name)]).numpy()
    assert np.array_equal(out, _torch_output(torch, name)[-1])


@pytest.mark.parametrize("name", list(MODELS))
def test_pytorch_in_float64_is_the_float64_reference(torch, name):
    # The same computation as Flax's up to float64 rounding (padding, epsilons, exact GELU,
    # attention scaling, loss, update): what separates the float32 steps is rounding alone.
    spec = MODELS[name].SPEC
    step = spec.torch_fn(spec.size("tiny"))
    out = step(*[torch.from_numpy(a.astype(np.float64)) for a in _inputs(name)]).numpy()
    reference = _reference(name)
    assert out.dtype == np.float64
    assert np.linalg.norm(out - reference) / np.linalg.norm(reference) < 1e-14
    start = _start(name)
    update = np.linalg.norm(out[1:] - reference[1:]) / np.linalg.norm(reference[1:] - start)
    assert update < 1e-12
