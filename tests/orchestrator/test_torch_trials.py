"""A PyTorch trial on the simulated GPU: charged what PyTorch ran, with its memory columns."""

from __future__ import annotations

import math

import pytest

from kernels import get_spec
from orchestrator.devices.sim.memory import allocator_pool_bytes, process_bytes


def _trial(run, *overrides):
    rows, _ = run("workload=stencil", "measure.window_s=1", "framework=pytorch", *overrides)
    (row,) = rows
    assert row["status"] == "ok" and row["valid"], row
    return row


def test_the_stencil_on_the_sim_takes_longest_eager_then_jax_then_compiled(run):
    eager = _trial(run, "framework.compile=false")
    compiled = _trial(run, "framework.compile=true")
    jax_row = _trial(run, "framework=jax")
    assert [r["work_source"] for r in (eager, jax_row, compiled)] == [
        "torch_dispatch_ops", "xla_cost_analysis", "inductor_kernels"]
    charged = [r["charged_bytes"] for r in (eager, jax_row, compiled)]
    assert charged == sorted(charged, reverse=True)
    times = [r["time_per_iter_s"] for r in (eager, jax_row, compiled)]
    assert times == sorted(times, reverse=True)
    # Memory-bound: each time in the ratio of its bytes (5 us per launch on 1-7 ms calls).
    assert times[0] / times[2] == pytest.approx(charged[0] / charged[2], rel=0.05)
    energies = [r["energy_per_iter_j"] for r in (eager, jax_row, compiled)]
    assert energies == sorted(energies, reverse=True)


def test_a_pytorch_row_carries_the_modelled_peak_and_nvml_memory_of_its_trial(run):
    row = _trial(run)
    in_use = math.prod(get_spec("stencil").size("gpu").shape) * 4 * 2  # x and the output
    assert row["memory_source"] == "sim model: footprint at sim_size"
    assert row["peak_memory_bytes"] == in_use
    assert row["framework_peak_bytes"] is None  # PyTorch keeps no peak on the CPU it ran on
    # NVML: the worker holds its context from the trial's plan on (it asked its GPU what is
    # free), so the kernel adds the caching allocator's pool (the peak in 2 MiB granules).
    assert row["memory_used_after_bytes"] - row["memory_used_before_bytes"] == process_bytes(
        in_use, "pytorch") - process_bytes(0, "pytorch") == allocator_pool_bytes(in_use, "pytorch")
