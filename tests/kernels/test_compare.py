"""The comparison on the device agrees with the host's float64 one, and copies no output."""

from __future__ import annotations

import numpy as np
import pytest

from kernels import KernelCache, KernelOptions, build_kernel
from kernels.compare import host_errors, split_reference
from kernels.registry import WORKLOADS
from tests.kernels.kernel_testing import flip_bit

FRAMEWORKS = ("jax", "tensorflow", "pytorch")


def test_the_split_reference_keeps_far_more_bits_than_float32():
    ref = np.random.default_rng(0).standard_normal(10_000) * 1e3
    hi, lo = split_reference(ref)
    assert hi.dtype == lo.dtype == np.float32
    rebuilt = hi.astype(np.float64) + lo.astype(np.float64)
    assert np.max(np.abs(rebuilt - ref) / np.abs(ref)) < 2.0**-46
    assert np.max(np.abs(hi.astype(np.float64) - ref) / np.abs(ref)) > 2.0**-30  # lo matters


@pytest.fixture(scope="module")
def cache():
    """One kernel cache for the module, as a worker has: a model's kernels in the three
    frameworks (consecutive tests) take over one float64 reference, computed once per model
    (ResNet-50's at tiny: ~10 CPU-s)."""
    return KernelCache()


@pytest.mark.parametrize("framework", FRAMEWORKS)  # the frameworks of one model run in turn
@pytest.mark.parametrize("workload", sorted(WORKLOADS))
@pytest.mark.slow
def test_device_errors_match_the_host_float64_errors(frameworks, pytorch, cache, workload,
                                                     framework):
    kernel = cache.get(KernelOptions(workload, framework, preset="tiny"))
    out = kernel.call_device()
    host = host_errors(kernel.to_numpy(out), kernel.reference())
    before = kernel.bytes_to_host
    (device,) = kernel.compare([out])
    assert kernel.bytes_to_host - before == 8  # two float32 numbers, never the output
    assert device.nonfinite == host.nonfinite == 0
    assert device.rel_error == pytest.approx(host.rel_error, rel=1e-3, abs=1e-9)
    assert device.max_abs_error == pytest.approx(host.max_abs_error, rel=1e-3, abs=1e-9)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_corrupted_output_is_as_far_on_the_device_as_on_the_host(frameworks, pytorch, framework):
    kernel = build_kernel(KernelOptions("gemm", framework, preset="tiny"))
    good = kernel.call()
    bad = flip_bit(good, 17, 27)  # an exponent bit: the element changes by orders of magnitude
    on_device = kernel.compare([kernel._backend.put(bad)])[0]  # as if the device computed it
    on_host = kernel.compare([bad])[0]  # a host array is compared on the host
    assert on_device.rel_error == pytest.approx(on_host.rel_error, rel=1e-4)
    assert on_device.rel_error > 1e-2


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_nan_is_counted_on_the_device(frameworks, pytorch, framework):
    kernel = build_kernel(KernelOptions("selu", framework, preset="tiny"))
    out = np.array(kernel.call())
    out.reshape(-1)[[3, 5]] = np.nan
    errors = kernel.compare([kernel._backend.put(out)])[0]
    assert errors.nonfinite == 2
    assert errors.rel_error == errors.max_abs_error == float("inf")


def test_the_reference_goes_to_the_device_once(frameworks):
    kernel = build_kernel(KernelOptions("stencil", "jax", preset="tiny"))
    kernel.compare([kernel.call_device()])
    held = kernel._reference_on_device
    kernel.compare([kernel.call_device(), kernel.call_device()])
    assert kernel._reference_on_device is held
    assert kernel.reference_builds == 1
