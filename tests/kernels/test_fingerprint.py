"""On-device fingerprints: the same two words in NumPy, JAX and TensorFlow; any flipped bit seen."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels import KernelOptions, build_kernel, fingerprint_hex, numpy_fingerprint
from kernels.fingerprint import jax_fingerprint, tf_fingerprint
from kernels.frameworks import numpy_dtype

DTYPES = ("float32", "bfloat16")  # every dtype a kernel takes (kernels/spec.py)


def _device_fingerprints(frameworks, array: np.ndarray) -> dict[str, str]:
    jax, tf = frameworks
    on_jax = jax.jit(jax_fingerprint)(jax.device_put(array))
    on_tf = tf.function(tf_fingerprint, jit_compile=True)(tf.constant(array))
    return {
        "numpy": fingerprint_hex(numpy_fingerprint(array)),
        "jax": fingerprint_hex(np.asarray(on_jax)),
        "tensorflow": fingerprint_hex(on_tf.numpy()),
    }


def _random(dtype: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.standard_normal(shape).astype(numpy_dtype(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_numpy_jax_and_tensorflow_give_the_same_fingerprint(frameworks, dtype):
    array = _random(dtype, (37, 129), seed=1)
    prints = _device_fingerprints(frameworks, array)
    assert len(set(prints.values())) == 1, prints


@settings(max_examples=40, deadline=None)
@given(
    dtype=st.sampled_from(DTYPES),
    size=st.integers(1, 5000),
    data=st.data(),
)
def test_any_single_flipped_bit_changes_the_fingerprint_in_both_frameworks(
    frameworks, dtype, size, data
):
    array = _random(dtype, (size,), seed=size)
    element = data.draw(st.integers(0, size - 1), label="element")
    bit = data.draw(st.integers(0, array.dtype.itemsize * 8 - 1), label="bit")
    flipped = array.copy()
    raw = flipped.view(np.uint8)
    raw[element * array.dtype.itemsize + bit // 8] ^= np.uint8(1 << (bit % 8))
    before = _device_fingerprints(frameworks, array)
    after = _device_fingerprints(frameworks, flipped)
    for backend in before:
        assert before[backend] != after[backend], (backend, element, bit)


def test_two_swapped_elements_change_the_fingerprint(frameworks):
    array = _random("float32", (1000,), seed=3)
    swapped = array.copy()
    swapped[[10, 900]] = swapped[[900, 10]]
    assert fingerprint_hex(numpy_fingerprint(array)) != fingerprint_hex(numpy_fingerprint(swapped))
    on_device = _device_fingerprints(frameworks, array)
    assert on_device["jax"] != _device_fingerprints(frameworks, swapped)["jax"]


@pytest.mark.parametrize("framework", ["jax", "tensorflow"])
def test_a_checked_call_returns_the_output_and_its_fingerprint(frameworks, framework):
    kernel = build_kernel(KernelOptions("stencil", framework=framework, preset="tiny"))
    out, fingerprint = kernel.dispatch_checked()
    host_out, host_fingerprint = kernel.fetch([out, fingerprint])
    assert host_fingerprint.dtype == np.uint32 and host_fingerprint.shape == (2,)
    assert fingerprint_hex(host_fingerprint) == fingerprint_hex(numpy_fingerprint(host_out))
    again = kernel.fetch([kernel.fingerprint(kernel.dispatch())])[0]
    assert fingerprint_hex(again) == fingerprint_hex(host_fingerprint)  # deterministic mode


def test_a_fingerprint_has_two_words():
    with pytest.raises(ValueError, match="2 words"):
        fingerprint_hex(np.zeros(3, np.uint32))
