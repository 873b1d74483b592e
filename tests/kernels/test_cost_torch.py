"""PyTorch's work on the simulated GPU: eager ATen ops counted one by one, Inductor's kernels."""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import pytest

from kernels import Workload, compiled_work, get_spec, make_sizes
from kernels.cost import count_torch_ops, inductor_work, torch_tensor_bytes, work_source
from kernels.frameworks import import_torch
from orchestrator.devices.base import KernelWork
from orchestrator.devices.sim.model import operating_point
from orchestrator.devices.sim.profile import load_profile


class MatSize(NamedTuple):
    """An (m, k) x (k, n) product."""

    m: int
    k: int
    n: int


def _shapes(size: MatSize) -> tuple[tuple[int, ...], ...]:
    return ((size.m, size.k), (size.k, size.n))


def _inputs(size: MatSize, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    return tuple(rng.standard_normal(shape) for shape in _shapes(size))


def _tanh_of_product(size: MatSize):
    torch = import_torch()
    return lambda a, b: torch.tanh(a @ b) + 1.0


def _torch_only(torch_fn=_tanh_of_product) -> Workload:
    """A user's workload with only a PyTorch step and no FLOP count of its own."""
    return Workload(
        name="tanh_of_product", description="tanh(a @ b) + 1, PyTorch only",
        sizes=make_sizes(tiny={"": MatSize(32, 48, 64)}, cpu={"": MatSize(64, 64, 64)},
                         gpu={"": MatSize(4096, 2048, 1024)}),
        dtypes=("float32",), precisions=("default",), compute_bound=True, uses_matmul=True,
        count_fn=None, inputs_fn=_inputs, reference_fn=None, jax_fn=None, tf_fn=None,
        shapes_fn=_shapes, torch_fn=torch_fn,
    )


def test_each_eager_aten_op_is_one_launch_moving_its_inputs_and_outputs():
    spec = _torch_only()
    m, k, n = spec.size("gpu")
    work = compiled_work(spec, "pytorch", "gpu")
    assert (work.source, work.note, work.kind) == ("torch_dispatch_ops", None, "matmul")
    assert work.launches == 3  # mm, tanh, add (the scalar 1.0 is no tensor)
    # mm reads a and b and writes m x n; tanh and add each read and write m x n.
    assert work.bytes_moved == 4 * (m * k + k * n + m * n + 4 * m * n)
    assert work.transcendentals == m * n  # one tanh per element
    # No count of its own: FlopCounterMode's matmul FLOPs, and one per transcendental.
    assert work.flops == 2 * m * k * n + m * n


@pytest.mark.slow
def test_inductor_fuses_the_elementwise_tail_and_calls_the_library_for_the_product():
    spec = _torch_only()
    m, k, n = spec.size("gpu")
    eager = compiled_work(spec, "pytorch", "gpu")
    work = compiled_work(spec, "pytorch", "gpu", compile=True)
    assert (work.source, work.note) == ("inductor_kernels", None)
    assert work.launches == 2  # the GEMM, then one kernel for tanh and + 1
    assert work.bytes_moved == 4 * (m * k + k * n + m * n + 2 * m * n)
    assert (work.flops, work.transcendentals, work.kind) == (
        eager.flops, eager.transcendentals, eager.kind)


def test_views_launch_nothing_and_a_broadcast_operand_is_read_once():
    torch = import_torch()
    x, bias = torch.ones(8, 16), torch.ones(16)
    ops = count_torch_ops(lambda x, b: (x.reshape(-1).view(16, 8).t() + b).sum(), (x, bias))
    assert ops.launches == 2  # add and sum; reshape, view and t alias x
    assert ops.names == {"aten.add", "aten.sum"}
    assert torch_tensor_bytes(bias.expand(8, 16)) == 16 * 4
    assert ops.nbytes == 4 * (128 + 16 + 128) + 4 * (128 + 1)


def test_a_failing_pytorch_source_falls_back_to_the_analytic_counts_and_says_why():
    def broken(size):
        def step(a, b):
            raise RuntimeError("no such op")
        return step

    gemm = get_spec("gemm")
    spec = Workload(**{**{f: getattr(gemm, f) for f in gemm.__dataclass_fields__},
                       "name": "gemm_broken", "torch_fn": broken})
    work = compiled_work(spec, "pytorch", "tiny", compile=True)
    assert work.source == "analytic" and work.launches == 1
    assert "inductor_kernels failed" in work.note and "no such op" in work.note
    assert work.flops == gemm.counts("tiny").flops


def test_the_work_source_names_each_route():
    assert [work_source(*route) for route in (
        ("jax",), ("tensorflow", False), ("tensorflow", True), ("pytorch", False, False),
        ("pytorch", False, True))] == [
        "xla_cost_analysis", "tf_graph_ops", "xla_cost_analysis", "torch_dispatch_ops",
        "inductor_kernels"]


def test_inductor_work_needs_no_memory_of_the_size_it_analyses():
    torch = import_torch()
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(1 << 32)  # 16 GiB, never allocated
    nbytes, launches = inductor_work(lambda x: x * 2.0 + 1.0, (x,))
    assert (nbytes, launches) == (2 * 4 * (1 << 32), 1)


def test_the_stencil_on_the_sim_takes_longest_eager_then_jax_then_compiled_as_its_bytes():
    stencil = get_spec("stencil")
    works = {name: compiled_work(stencil, framework, "gpu", compile=compiled)
             for name, framework, compiled in (("eager", "pytorch", False), ("jax", "jax", False),
                                              ("compiled", "pytorch", True))}
    assert [w.source for w in works.values()] == [
        "torch_dispatch_ops", "xla_cost_analysis", "inductor_kernels"]
    n = math.prod(stencil.size("gpu").shape)
    # Eager: roll, roll, add, add, each a pass through memory (10n floats, 4 launches);
    # XLA's fusion reads three slices of x (4n); Inductor's one kernel reads x once (2n).
    assert [w.bytes_moved / (4 * n) for w in works.values()] == pytest.approx([10, 4, 2], rel=1e-3)
    assert [w.launches for w in works.values()] == [4, 1, 1]
    a100 = load_profile("a100_sxm4_40gb")
    calls = {name: operating_point(a100, KernelWork(
        w.flops, w.bytes_moved, stencil.peak("float32"), "stencil", "pytorch", w.launches,
        w.transcendentals, w.kind)) for name, w in works.items()}
    times = [call.duration_s for call in calls.values()]
    assert times == sorted(times, reverse=True)
    assert [call.energy_mj for call in calls.values()] == sorted(
        (call.energy_mj for call in calls.values()), reverse=True)
    # Memory-bound: time in the ratio of the bytes, within the launches' 5 us each.
    assert times[0] / times[2] == pytest.approx(5.0, rel=0.05)


@pytest.mark.parametrize("name, kind", [("resnet50_train", "conv"), ("bert_train", "matmul")])
def test_a_models_training_step_is_counted_op_by_op(name, kind):
    # ResNet builds its module on the meta device: its buffers are taken in as fakes.
    spec = get_spec(name)
    work = compiled_work(spec, "pytorch", "tiny")
    assert (work.source, work.note, work.kind) == ("torch_dispatch_ops", None, kind)
    assert work.launches > 100  # forward, backward and the update, one launch per ATen op
    assert work.flops == spec.counts("tiny").flops
    assert work.bytes_moved > 5 * spec.counts("tiny").bytes_moved  # intermediates written
