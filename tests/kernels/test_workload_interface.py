"""The public workload interface: a user's factory by target or entry point, and its errors.

The worked example (``examples/attention.py``) is built in both frameworks and checked against
its float64 reference; its work per call comes from XLA's cost analysis (it gives no count_fn)
and is compared with the hand count of the same block. Bad targets and factories give one-line
``KernelOptionError``s that say what is wrong.
"""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path

import numpy as np
import pytest

from kernels import (
    KernelOptionError,
    KernelOptions,
    UnknownKernelError,
    Verdict,
    Workload,
    check_outputs,
)
from kernels.build import BuiltKernel
from kernels.registry import (
    ENTRY_POINT_GROUP,
    WORKLOAD_PATH_ENV,
    load_workload,
    workload_entry_points,
)

ROOT = Path(__file__).resolve().parents[2]
TARGET = "examples.attention:make_workload"


@pytest.fixture
def example(monkeypatch):
    monkeypatch.setenv(WORKLOAD_PATH_ENV, str(ROOT))
    return load_workload("custom", TARGET)


def attention_flops(b: int, s: int, m: int, h: int) -> float:
    """Four projections, Q K^T and P V (2 per multiply-add), the scale, and softmax (~5 per
    score: max, subtract, exp, sum, divide)."""
    return 4 * 2 * b * s * m * m + 2 * (2 * b * s * s * m) + b * h * s * s * 6


@pytest.mark.parametrize("framework, xla", [("jax", True), ("tensorflow", False),
                                            ("tensorflow", True)])
def test_the_example_workload_matches_its_reference_in_each_framework(example, framework, xla):
    kernel = BuiltKernel(example, KernelOptions(example.name, framework, "tiny", xla=xla))
    outputs = [kernel.call() for _ in range(3)]
    result = check_outputs(outputs, kernel.reference(), "float32", "highest", example.name)
    assert result.verdict is Verdict.OK, result
    assert result.rel_error < 1e-6 and result.tolerance == 1e-5
    corrupted = outputs[-1].copy()
    corrupted.flat[7] *= 1.01
    assert check_outputs([corrupted], kernel.reference(), "float32", "highest",
                         example.name).verdict is Verdict.WRONG


def test_the_example_reports_tokens_and_derives_its_work_from_xla(example):
    assert (example.unit, example.items("tiny"), example.frameworks) == (
        "tokens/s", 2 * 32, ("jax", "tensorflow"))
    counts = example.counts("tiny")
    expected = attention_flops(2, 32, 64, 4)
    assert counts.flops == pytest.approx(expected, rel=0.10)
    assert counts.bytes_moved > 5 * 64 * 64 * 4  # at least the four weights and x, once


def test_a_tensorflow_graph_without_counts_takes_its_flops_from_xla(example):
    """TensorFlow's graph route counts bytes and launches op by op and takes FLOPs from the
    spec; without a count_fn they come from XLA's analysis of the JAX step (the same cache,
    entered again from inside: it must not deadlock)."""
    from kernels import compiled_work

    graph = compiled_work(example, "tensorflow", "gpu", xla=False)
    assert graph.source == "tf_graph_ops", graph.note
    assert graph.flops == example.counts("gpu").flops
    assert graph.flops == pytest.approx(attention_flops(32, 1024, 1024, 16), rel=0.10)


def test_a_target_is_loaded_once_and_found_by_its_own_name_afterwards(example):
    assert load_workload("custom", TARGET) is example
    assert load_workload("attention") is example  # registered in this process


@pytest.mark.parametrize(
    "target, message",
    [
        ("examples.attention", "is not 'package.module:factory'"),
        ("no_such_package.mod:make", "cannot import 'no_such_package.mod'"),
        ("examples.attention:nope", "module 'examples.attention' has no 'nope'"),
        ("json:dumps", "the factory raised TypeError"),
        ("math:pi", "is a float, neither a kernels.Workload nor a factory returning one"),
        ("platform:system", "returned a str, not a kernels.Workload"),
        ("kernels.gemm:SPEC", None),  # a module attribute that is a workload is taken as it is
    ],
)
def test_a_bad_target_says_what_is_wrong(monkeypatch, target, message):
    monkeypatch.setenv(WORKLOAD_PATH_ENV, str(ROOT))
    if message is None:
        assert load_workload("custom", target).name == "gemm"
        return
    with pytest.raises(KernelOptionError, match=message.replace("(", r"\(")):
        load_workload("custom", target)


def test_custom_without_a_target_and_an_unknown_name_list_what_exists():
    with pytest.raises(UnknownKernelError, match="workload=custom needs workload.target"):
        load_workload("custom")
    with pytest.raises(UnknownKernelError, match="choose one of: stencil, gemm.*vit_train"):
        load_workload("nope")


def test_a_factory_whose_workload_takes_a_built_in_name_is_refused(tmp_path, monkeypatch):
    (tmp_path / "clash_wl.py").write_text(textwrap.dedent("""
        import dataclasses
        from kernels.gemm import SPEC
        def make():
            return dataclasses.replace(SPEC)
    """))
    monkeypatch.setenv(WORKLOAD_PATH_ENV, str(tmp_path))
    with pytest.raises(KernelOptionError, match="which is a built-in's name"):
        load_workload("custom", "clash_wl:make")


def test_a_framework_the_workload_lacks_is_refused_before_anything_is_built(example):
    jax_only = dataclasses.replace(example, name="attention_jax_only", tf_fn=None)
    assert jax_only.frameworks == ("jax",)
    with pytest.raises(KernelOptionError, match="has no tensorflow step; it has: jax"):
        BuiltKernel(jax_only, KernelOptions(jax_only.name, "tensorflow", "tiny"))


def test_a_workload_must_say_how_many_items_a_samples_per_second_unit_counts(example):
    with pytest.raises(KernelOptionError, match="reports samples/s but has no items_fn"):
        dataclasses.replace(example, unit="samples/s", items_fn=None)
    with pytest.raises(KernelOptionError, match="unknown unit 'images/s'"):
        dataclasses.replace(example, unit="images/s")


def test_an_entry_point_names_a_workload_like_a_built_in(tmp_path, monkeypatch):
    """An installed package's ``dvfs.workloads`` entry point (a dist-info on the path, as pip
    writes it) makes ``load_workload(<name>)`` work without a target."""
    info = tmp_path / "my_attention-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-attention\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        f"[dvfs.workloads]\nattention = {TARGET}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(WORKLOAD_PATH_ENV, str(ROOT))
    assert workload_entry_points() == {"attention": TARGET}
    from orchestrator.config import WORKLOAD_ENTRY_POINTS

    assert WORKLOAD_ENTRY_POINTS == ENTRY_POINT_GROUP  # the config's composition reads the same
    spec = load_workload("attention")
    assert spec.name == "attention" and spec.unit == "tokens/s"


def test_without_a_reference_only_finiteness_and_determinism_are_checked(example):
    bare = dataclasses.replace(example, name="attention_no_reference", reference_fn=None)
    kernel = BuiltKernel(bare, KernelOptions(bare.name, "jax", "tiny"))
    assert kernel.reference() is None
    out = kernel.call()
    result = check_outputs([out, out], None, "float32", "default", bare.name)
    assert result.verdict is Verdict.OK and np.isnan(result.rel_error)
    nan = out.copy()
    nan.flat[0] = np.nan
    assert check_outputs([nan], None, "float32", "default", bare.name).verdict is Verdict.WRONG
    other = out.copy()
    other.flat[0] += 1
    result = check_outputs([out, other, out], None, "float32", "default", bare.name)
    assert result.verdict is Verdict.NONDETERMINISTIC


def test_workload_is_the_one_public_name_of_the_built_ins_description_too():
    from kernels import get_spec

    assert isinstance(get_spec("gemm"), Workload)
    assert isinstance(get_spec("resnet50_train"), Workload)


def test_a_footprints_peak_is_its_total_else_the_sum_of_its_parts(example):
    parts = {"parameters": 100, "activations": 900}
    summed = dataclasses.replace(example, name="attention_parts",
                                 footprint_fn=lambda size, itemsize: parts)
    assert summed.peak_bytes("tiny") == 1000
    totalled = dataclasses.replace(example, name="attention_total",
                                   footprint_fn=lambda size, itemsize: {**parts, "total": 950})
    assert totalled.peak_bytes("tiny") == 950  # the parts' peak together, not their sum
    assert example.peak_bytes("tiny") is None  # it gives no footprint


def test_a_workload_at_a_size_is_read_once_with_its_shapes_and_modelled_memory(example):
    """What a planner reads of a workload at one size (``KernelSpec.at``): its inputs' shapes,
    its modelled peak in its dtype, and in float64 for its reference (None without one)."""
    sized = dataclasses.replace(example, name="attention_sized",
                                footprint_fn=lambda size, itemsize: {"total": 100 * itemsize})
    at = sized.at("tiny", "float32")
    assert (at.preset, at.dtype, at.size) == ("tiny", "float32", sized.size("tiny"))
    assert at.shapes == tuple(sized.shapes_fn(sized.size("tiny")))
    assert (at.modelled, at.reference) == (400, 800)  # float32, and the float64 reference
    unreferenced = dataclasses.replace(sized, name="attention_unreferenced", reference_fn=None)
    assert (unreferenced.at("tiny").modelled, unreferenced.at("tiny").reference) == (400, None)
    assert (example.at("tiny").modelled, example.at("tiny").reference) == (None, None)


def test_a_pytorch_only_workload_builds_there_and_its_work_comes_from_inductor():
    from kernels.selu import SPEC

    torch_only = dataclasses.replace(SPEC, name="selu_torch_only", count_fn=None, jax_fn=None,
                                     tf_fn=None)
    assert torch_only.frameworks == ("pytorch",)
    with pytest.raises(KernelOptionError, match="has no jax step; it has: pytorch"):
        BuiltKernel(torch_only, KernelOptions(torch_only.name, "jax", "tiny"))
    kernel = BuiltKernel(torch_only, KernelOptions(torch_only.name, "pytorch", "tiny"))
    result = check_outputs([kernel.call()], kernel.reference(), "float32", "default", "selu")
    assert result.verdict is Verdict.OK, result
    counts = torch_only.counts("tiny")  # no count_fn: Inductor's kernels say what a call moves
    assert counts.bytes_moved == SPEC.counts("tiny").bytes_moved and counts.flops > 0
