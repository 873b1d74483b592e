"""On-device fingerprints: the same two words in NumPy, JAX, TensorFlow and PyTorch; any flipped
bit seen."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels import KernelOptions, build_kernel, fingerprint_hex, numpy_fingerprint
from kernels.fingerprint import jax_fingerprint, tf_fingerprint, torch_fingerprint
from kernels.frameworks import numpy_dtype

DTYPES = ("float32", "bfloat16")  # every dtype a kernel takes (kernels/spec.py)


def _on_torch(array: np.ndarray):
    import torch

    if array.dtype == numpy_dtype("bfloat16"):
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def _device_fingerprints(frameworks, array: np.ndarray) -> dict[str, str]:
    jax, tf = frameworks
    on_jax = jax.jit(jax_fingerprint)(jax.device_put(array))
    on_tf = tf.function(tf_fingerprint, jit_compile=True)(tf.constant(array))
    on_torch = torch_fingerprint(_on_torch(array))
    return {
        "numpy": fingerprint_hex(numpy_fingerprint(array)),
        "jax": fingerprint_hex(np.asarray(on_jax)),
        "tensorflow": fingerprint_hex(on_tf.numpy()),
        "pytorch": fingerprint_hex(on_torch.numpy()),
    }


def _random(dtype: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.standard_normal(shape).astype(numpy_dtype(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_numpy_jax_tensorflow_and_pytorch_give_the_same_fingerprint(frameworks, pytorch, dtype):
    array = _random(dtype, (37, 129), seed=1)
    prints = _device_fingerprints(frameworks, array)
    assert len(set(prints.values())) == 1, prints


@settings(max_examples=40, deadline=None)
@given(
    dtype=st.sampled_from(DTYPES),
    size=st.integers(1, 5000),
    data=st.data(),
)
@pytest.mark.slow
def test_any_single_flipped_bit_changes_the_fingerprint_in_every_framework(
    frameworks, pytorch, dtype, size, data
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


def test_two_swapped_elements_change_the_fingerprint(frameworks, pytorch):
    array = _random("float32", (1000,), seed=3)
    swapped = array.copy()
    swapped[[10, 900]] = swapped[[900, 10]]
    assert fingerprint_hex(numpy_fingerprint(array)) != fingerprint_hex(numpy_fingerprint(swapped))
    on_device, after = _device_fingerprints(frameworks, array), _device_fingerprints(frameworks,
                                                                                      swapped)
    assert on_device["jax"] != after["jax"] and on_device["pytorch"] != after["pytorch"]


def test_pytorch_weights_positions_past_two_to_the_32_modulo_it(pytorch, monkeypatch):
    import kernels.fingerprint as fingerprint

    monkeypatch.setattr(fingerprint, "_TORCH_CHUNK", 7)  # chunk edges inside a small array
    array = _random("float32", (100,), seed=4)
    expected = fingerprint_hex(numpy_fingerprint(array))
    assert fingerprint_hex(torch_fingerprint(_on_torch(array)).numpy()) == expected
    words = pytorch.tensor([0xFFFFFFFF, 0xFFFFFFFF], dtype=pytorch.int64)
    weights = pytorch.tensor([0xFFFFFFFF, 0xFFFFFFFE], dtype=pytorch.int64)
    # the 16-bit halves: no int64 overflow where the plain product would pass 2**63
    product = (words & 0xFFFF) * weights + (((words >> 16) * weights) & 0xFFFF) * 65536
    assert [int(p) & 0xFFFFFFFF for p in product] == [
        (0xFFFFFFFF * 0xFFFFFFFF) % 2**32, (0xFFFFFFFF * 0xFFFFFFFE) % 2**32]


CHECKED = [("jax", False), ("tensorflow", False), ("pytorch", False), ("pytorch", True)]


@pytest.mark.parametrize(("framework", "compiled"), CHECKED,
                         ids=["jax", "tensorflow", "pytorch", "pytorch-compiled"])
def test_a_checked_call_returns_the_output_and_its_fingerprint(
    frameworks, pytorch, framework, compiled
):
    kernel = build_kernel(KernelOptions("stencil", framework=framework, preset="tiny",
                                        compile=compiled))
    out, fingerprint = kernel.dispatch_checked()
    host_out, host_fingerprint = kernel.fetch([out, fingerprint])
    assert host_fingerprint.dtype == np.uint32 and host_fingerprint.shape == (2,)
    assert fingerprint_hex(host_fingerprint) == fingerprint_hex(numpy_fingerprint(host_out))
    again = kernel.fetch([kernel.fingerprint(kernel.dispatch())])[0]
    assert fingerprint_hex(again) == fingerprint_hex(host_fingerprint)  # deterministic mode


def test_a_fingerprint_has_two_words():
    with pytest.raises(ValueError, match="2 words"):
        fingerprint_hex(np.zeros(3, np.uint32))
