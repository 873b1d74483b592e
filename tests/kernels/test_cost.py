"""The work a framework compiled: XLA's cost analysis, TensorFlow's graph ops, the fallback."""

from __future__ import annotations

import dataclasses
import math
import resource

import numpy as np
import pytest

from kernels import WORKLOADS, KernelOptions, build_kernel, compiled_work, get_spec
from kernels.cost import count_launches

STENCIL = get_spec("stencil")


def test_every_workloads_shapes_are_those_of_its_inputs():
    for spec in WORKLOADS.values():
        for variant in spec.variants:
            size = spec.sizes["tiny"][variant]
            inputs = spec.inputs_fn(size, np.random.default_rng(0))
            assert tuple(a.shape for a in inputs) == spec.shapes_fn(size), spec.name


@pytest.mark.parametrize("framework, xla", [("jax", True), ("tensorflow", True)])
def test_xla_counts_a_gpu_gemm_at_the_analytic_flops_and_bytes(frameworks, framework, xla):
    spec = get_spec("gemm")
    work = compiled_work(spec, framework, "gpu", xla=xla)
    analytic = spec.counts("gpu")
    assert work.source == "xla_cost_analysis" and work.note is None
    # XLA counts a dot's multiply-adds as 2 FLOPs, as we do, and reads each operand once:
    # within 1% (the margin leaves room for an epilogue or a layout copy XLA might add).
    assert work.flops == pytest.approx(analytic.flops, rel=0.01)
    assert work.bytes_moved == pytest.approx(analytic.bytes_moved, rel=0.01)
    assert work.launches == 1


@pytest.mark.parametrize("framework, xla", [("jax", True), ("tensorflow", True)])
def test_a_bf16_gemm_is_charged_the_one_dot_a_gpu_runs_not_the_cpus_conversions(
    frameworks, framework, xla
):
    spec = get_spec("gemm")
    work = compiled_work(spec, framework, "gpu", "bfloat16", xla=xla)
    analytic = spec.counts("gpu", "bfloat16")  # A and B read, C written, 2 bytes each
    assert work.source == "xla_cost_analysis" and work.note is None
    assert work.flops == pytest.approx(analytic.flops, rel=0.01)
    assert work.bytes_moved == pytest.approx(analytic.bytes_moved, rel=0.01)
    assert work.launches == 1 and work.kind == "matmul"


def test_the_cpus_own_bf16_gemm_converts_around_the_dot(frameworks):
    # What the rule replaces: XLA's CPU backend has no bf16 dot, so it converts each operand to
    # float32, multiplies, and converts back: more launches and bytes than one bf16 dot.
    from kernels.cost import _jax_work

    spec = get_spec("gemm")
    cpu = _jax_work(spec, spec.size("gpu"), "bfloat16", "default")
    analytic = spec.counts("gpu", "bfloat16")
    assert cpu.launches > 1 and cpu.bytes_moved > 2 * analytic.bytes_moved


def test_a_bf16_training_step_is_the_float32_steps_kernels_at_half_the_bytes(frameworks):
    spec = get_spec("mlp_train")
    wide = compiled_work(spec, "jax", "gpu", "float32")
    narrow = compiled_work(spec, "jax", "gpu", "bfloat16")
    analytic = spec.counts("gpu", "bfloat16")
    assert narrow.flops == pytest.approx(analytic.flops, rel=0.01)  # every FLOP of the step
    assert narrow.launches == wide.launches and narrow.kind == "matmul"
    assert narrow.bytes_moved == pytest.approx(wide.bytes_moved / 2, rel=1e-9)
    # XLA's fusions still write activations between the matmuls: more than the fewest bytes.
    assert narrow.bytes_moved > analytic.bytes_moved


def test_xla_counts_a_convolution_without_its_padding_taps(frameworks):
    spec = get_spec("conv3d")
    work = compiled_work(spec, "jax", "gpu")
    analytic = spec.counts("gpu")
    # Our count includes the SAME padding's zero taps; XLA's counts only taps inside the input:
    # at 64^3 with a 3^3 filter, 3.1% fewer.
    assert 0.95 * analytic.flops < work.flops < analytic.flops


def test_the_jax_stencil_moves_fewer_bytes_and_launches_fewer_kernels_than_the_tf_graph(
    frameworks,
):
    jax_work = compiled_work(STENCIL, "jax", "gpu")
    tf_work = compiled_work(STENCIL, "tensorflow", "gpu", xla=False)
    assert (jax_work.source, tf_work.source) == ("xla_cost_analysis", "tf_graph_ops")
    assert jax_work.bytes_moved < tf_work.bytes_moved
    # XLA's one fusion reads three slices of x and writes the output (4n floats); TF's graph runs
    # roll, roll, add, add, each reading and writing whole arrays (10n): a ratio of 2.5.
    assert 2.0 < tf_work.bytes_moved / jax_work.bytes_moved < 3.0
    assert jax_work.launches < tf_work.launches
    assert tf_work.flops == STENCIL.counts("gpu").flops  # graph FLOPs are the analytic count


@pytest.mark.parametrize("framework, xla", [("jax", True), ("tensorflow", False)])
def test_each_call_says_its_kind_of_work_and_its_transcendentals(frameworks, framework, xla):
    kinds = {name: compiled_work(get_spec(name), framework, "tiny", xla=xla)
             for name in ("gemm", "conv3d", "stencil", "selu")}
    assert {k: w.kind for k, w in kinds.items()} == {
        "gemm": "matmul", "conv3d": "conv", "stencil": "elementwise", "selu": "elementwise"}
    n = math.prod(get_spec("selu").size("tiny").shape)
    assert kinds["selu"].transcendentals == n  # one exp per element (XLA and TF's Selu op alike)
    assert kinds["stencil"].transcendentals == kinds["gemm"].transcendentals == 0
    if framework == "jax":  # XLA counts each transcendental in its FLOPs as one
        assert kinds["selu"].flops >= n + kinds["selu"].transcendentals


def test_a_tf_graph_is_charged_each_ops_inputs_and_outputs(frameworks):
    work = compiled_work(STENCIL, "tensorflow", "gpu", xla=False)
    n = math.prod(STENCIL.size("gpu").shape)
    assert work.launches == 4  # Roll, Roll, AddV2, AddV2 (placeholder, consts, identity: none)
    # 2 rolls (n in, n out) + 2 adds (2n in, n out) = 10n floats, plus the rolls' int32 shift
    # and axis scalars (16 bytes).
    assert work.bytes_moved == 10 * n * 4 + 16


def test_the_analysis_allocates_nothing_of_the_size_it_analyses(frameworks):
    spec = get_spec("stencil")
    n = math.prod(spec.size("gpu", "3d").shape)  # 2^28 floats: 1 GiB in, 1 GiB out
    before_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for framework, xla in (("jax", True), ("tensorflow", False), ("tensorflow", True)):
        work = compiled_work(spec, framework, "gpu", xla=xla, variant="3d")
        assert work.source != "analytic", work.note
    grown_bytes = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before_kib) * 1024
    assert grown_bytes < 0.25 * n * 4


def test_the_work_is_computed_once_per_options(frameworks):
    first = compiled_work(STENCIL, "jax", "gpu", variant="2d")
    again = compiled_work(STENCIL, "jax", "gpu", variant="2d")
    assert again is first  # the same object: nothing was compiled or analysed again
    assert first.analysis_s > 0


def test_a_built_kernel_gives_its_work_at_its_own_size_or_another(frameworks):
    kernel = build_kernel(KernelOptions("stencil", "jax", "tiny"))
    assert kernel.compiled_work() == compiled_work(STENCIL, "jax", "tiny")
    big = kernel.compiled_work("gpu")
    assert big.bytes_moved / kernel.compiled_work().bytes_moved == pytest.approx(
        (1 << 28) / 4096, rel=1e-3
    )


def test_a_function_xla_cannot_compile_is_charged_the_analytic_counts_and_says_why(frameworks):
    _, tf = frameworks

    def numpy_selu(size):
        return lambda x: tf.numpy_function(np.negative, [x], tf.float32, stateful=False)

    spec = dataclasses.replace(get_spec("selu"), name="selu_numpy", tf_fn=numpy_selu)
    work = compiled_work(spec, "tensorflow", "gpu", xla=True)
    assert work.source == "analytic"
    assert (work.flops, work.bytes_moved) == tuple(spec.counts("gpu"))
    assert work.launches == 1
    assert work.note.startswith("xla_cost_analysis failed, analytic counts charged:")


HLO = """\
HloModule jit_step, entry_computation_layout={(f32[8]{0})->(f32[8]{0}, f32[])}

%fused (p: f32[8]) -> f32[8] {
  %p = f32[8]{0} parameter(0)
  ROOT %n = f32[8]{0} negate(%p)
}

ENTRY %main (x: f32[8]) -> (f32[8], f32[]) {
  %x = f32[8]{0} parameter(0)
  %c = f32[] constant(0)
  %neg_fusion = f32[8]{0} fusion(%x), kind=kLoop, calls=%fused
  %b = f32[2,4]{1,0} bitcast(%neg_fusion)
  %r = f32[] reduce(%b, %c), dimensions={0,1}, to_apply=%fused
  %custom = (f32[8]{0}, s8[64]{0}) custom-call(%x), custom_call_target="cublas"
  %g = f32[8]{0} get-tuple-element(%custom), index=0
  ROOT %t = (f32[8]{0}, f32[]) tuple(%g, %r)
}
"""


def test_launches_are_the_entry_computations_kernels():
    # fusion, reduce, custom-call; not the parameter, constant, bitcast, get-tuple-element, tuple,
    # nor the instructions of the fused computation.
    assert count_launches(HLO) == 3


def test_a_steps_output_is_traced_once_however_many_plans_ask(frameworks, monkeypatch):
    """The memory plan sizes a TensorFlow or PyTorch trial's output with JAX's shape inference
    of the step (a second or more for ResNet-50's); it asks at every trial, and the step is
    traced once per workload, size and dtype in the process."""
    from kernels import cost

    jax, _ = frameworks
    traced = []
    real = jax.eval_shape
    monkeypatch.setattr(jax, "eval_shape", lambda *a, **k: traced.append(a) or real(*a, **k))
    step = STENCIL.jax_fn
    spec = dataclasses.replace(STENCIL, jax_fn=lambda size: step(size))  # new to this process
    first = cost.kernel_memory(spec, spec.at("tiny"), "tensorflow")
    assert first.source == "estimate" and first.output > 0
    assert cost.kernel_memory(spec, spec.at("tiny"), "pytorch") == first
    assert cost.kernel_memory(spec, spec.at("tiny"), "tensorflow") == first
    assert len(traced) == 1
    narrower = cost.kernel_memory(spec, spec.at("tiny", "bfloat16"), "tensorflow")
    assert len(traced) == 2 and 2 * narrower.output == first.output
