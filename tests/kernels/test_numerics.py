"""Every workload x framework x dtype x precision x variant (tiny preset) against its reference.

Each case draws fresh random inputs from its own seed, builds the kernel, calls it three times
and checks the last output against the float64 reference and all three digests for equality.
TensorFlow runs both without XLA and with it (``jit_compile=True``), PyTorch eagerly here and
compiled (``torch.compile``, slow on a CPU: a few seconds a kernel) once per kernel, in float32,
beside JAX and TensorFlow on the same inputs.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from kernel_testing import exponent_msb, flip_bit

from kernels import (
    KernelOptions,
    Verdict,
    build_kernel,
    check_outputs,
    get_spec,
    output_digest,
    tolerance_for,
)
from kernels.registry import KERNELS

FRAMEWORK_MODES = (
    ("jax", False), ("tensorflow", False), ("tensorflow", True), ("pytorch", False),
)


def _cases() -> list:
    cases = []
    for name in KERNELS:  # the models: tests/kernels/test_models.py
        spec = get_spec(name)
        for dtype in spec.dtypes:
            for precision in spec.precisions_for(dtype):
                for variant in spec.variants:
                    for framework, xla in FRAMEWORK_MODES:
                        mode = f"{framework}-xla" if xla else framework
                        tag = f"{name}-{variant}-{mode}-{dtype}-{precision}"
                        cases.append(
                            pytest.param(name, variant, framework, xla, dtype, precision, id=tag)
                        )
    return cases


@pytest.mark.parametrize(("name", "variant", "framework", "xla", "dtype", "precision"), _cases())
@pytest.mark.slow
def test_kernel_matches_its_float64_reference_and_repeats_bitwise(
    frameworks, pytorch, name, variant, framework, xla, dtype, precision, request
):
    seed = zlib.crc32(request.node.callspec.id.encode())  # fresh inputs per case, reproducible
    options = KernelOptions(name, framework, "tiny", dtype, precision, seed, xla, variant)
    k = build_kernel(options)
    outputs = [k.call() for _ in range(3)]
    digests = [output_digest(o) for o in outputs]
    result = check_outputs(outputs[-1:], k.reference(), dtype, precision, name, digests=digests)
    assert result.verdict is Verdict.OK, result
    assert outputs[-1].dtype == np.dtype(k.to_numpy(k.call_device()).dtype)
    assert str(outputs[-1].dtype) == dtype
    assert outputs[-1].shape == k.reference().shape
    # The inputs were not degenerate: the output has spread, and so does the reference.
    assert np.std(k.reference()) > 1e-3


@pytest.mark.parametrize("name", KERNELS)
@pytest.mark.parametrize("framework", ["jax", "tensorflow", "pytorch"])
def test_check_catches_one_flipped_bit_in_a_real_output(frameworks, pytorch, name, framework):
    k = build_kernel(KernelOptions(name, framework, "tiny", "float32", seed=7))
    good = k.call()
    index = int(np.argmin(np.where(good == 0, np.inf, np.abs(good))))
    assert abs(good.reshape(-1)[index]) < 1  # the exponent flip then scales it by 2**128
    wrong = flip_bit(good, index, exponent_msb(good.dtype))
    ref = k.reference()

    as_wrong = check_outputs([wrong], ref, k.dtype, k.precision, name)
    assert as_wrong.verdict is Verdict.WRONG

    low = flip_bit(good, index, 0)  # the last mantissa bit: invisible to the error, not the hash
    digests = [output_digest(good), output_digest(low), output_digest(good), output_digest(good)]
    as_nondet = check_outputs([good], ref, k.dtype, k.precision, name, digests=digests)
    assert as_nondet.verdict is Verdict.NONDETERMINISTIC
    assert as_nondet.determinism_mismatches == 1

    assert check_outputs([good, wrong], ref, k.dtype, k.precision, name).verdict is Verdict.WRONG


@pytest.mark.parametrize("name", KERNELS)
def test_a_nan_in_a_real_output_is_wrong(frameworks, name):
    k = build_kernel(KernelOptions(name, "jax", "tiny", "float32", seed=3))
    out = k.call().copy()
    out.reshape(-1)[out.size // 2] = np.nan
    result = check_outputs([out], k.reference(), k.dtype, k.precision, name)
    assert result.verdict is Verdict.WRONG and result.nonfinite_count == 1


@pytest.mark.parametrize("name", KERNELS)
def test_jax_and_tensorflow_agree_on_the_same_seed(frameworks, name):
    a = build_kernel(KernelOptions(name, "jax", "tiny", seed=11))
    b = build_kernel(KernelOptions(name, "tensorflow", "tiny", seed=11))
    assert np.array_equal(a.reference(), b.reference())
    tol = 2 * tolerance_for("float32", "default", name)
    diff = np.linalg.norm(a.call().astype(np.float64) - b.call()) / np.linalg.norm(a.reference())
    assert diff <= tol


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("name", KERNELS)
@pytest.mark.slow
def test_pytorch_agrees_with_its_reference_and_with_jax_and_tensorflow(
    frameworks, pytorch, name, compiled
):
    options = KernelOptions(name, "pytorch", "tiny", seed=11, compile=compiled)
    k = build_kernel(options)
    outputs = [k.call() for _ in range(2)]
    assert k.compile is compiled
    result = check_outputs(outputs[-1:], k.reference(), "float32", "default", name,
                           digests=[output_digest(o) for o in outputs])
    assert result.verdict is Verdict.OK, result
    tol = 2 * tolerance_for("float32", "default", name)
    for other in ("jax", "tensorflow"):
        theirs = build_kernel(KernelOptions(name, other, "tiny", seed=11))
        assert np.array_equal(theirs.reference(), k.reference())  # the same inputs
        diff = np.linalg.norm(theirs.call().astype(np.float64) - outputs[-1])
        assert diff / np.linalg.norm(k.reference()) <= tol, other
