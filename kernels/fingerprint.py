"""Bitwise fingerprints of kernel outputs, computed on the device, a few bytes each.

Determinism is checked by comparing every call's output bit for bit. Copying a GPU-sized output to
the host and hashing it there (1 GiB: ~40 ms over PCIe and ~1 s of BLAKE2b on one core) would turn
a kernel benchmark into a host benchmark, so the framework reduces each output to a fingerprint on
the device and only that comes back:

- the output's bits, read as unsigned words (``float32`` as ``uint32``; ``bfloat16`` and
  ``float16`` as ``uint16`` widened to ``uint32``), flattened in row-major order: ``u[i]``;
- ``sum(u[i]) mod 2**32`` and ``sum(u[i] * (i + 1)) mod 2**32``, both in wrap-around ``uint32``
  arithmetic, so they are exact and identical on every backend (integer sums are associative).

Any single flipped bit changes the plain sum: flipping bit ``b`` of one word moves it by
``2**b`` (``b < 32``), which is never 0 modulo ``2**32``. The position-weighted sum catches what a
plain sum cannot, such as two elements swapped. It is a check against hardware faults, not a
cryptographic hash: it is not meant to resist outputs crafted to collide.

The four implementations (:func:`numpy_fingerprint`, :func:`jax_fingerprint`,
:func:`tf_fingerprint`, :func:`torch_fingerprint`) give the same two words for the same bits;
``tests/kernels`` checks that for every dtype in every framework. The NumPy one serves the
simulated GPU, which corrupts an output on the host (its clock is virtual, so host work costs a
window nothing), and the tests.
"""

from __future__ import annotations

from typing import Any

import numpy as np

FINGERPRINT_WORDS = 2
"""uint32 words in a fingerprint: the plain sum and the position-weighted sum."""

_WORD_BITS = {4: np.uint32, 2: np.uint16, 1: np.uint8}


def _unsigned(itemsize: int) -> Any:
    try:
        return _WORD_BITS[itemsize]
    except KeyError:
        raise TypeError(f"no fingerprint for {itemsize}-byte elements (1, 2 or 4 bytes)") from None


def numpy_fingerprint(array: np.ndarray) -> np.ndarray:
    """The fingerprint of an array on the host: two ``uint32`` words (see the module docstring)."""
    array = np.ascontiguousarray(array)
    words = array.reshape(-1).view(_unsigned(array.dtype.itemsize)).astype(np.uint64)
    weights = np.arange(1, words.size + 1, dtype=np.uint64) & np.uint64(0xFFFFFFFF)
    mask = np.uint64(0xFFFFFFFF)
    plain = int(words.sum(dtype=np.uint64) & mask)
    weighted = int(((words * weights) & mask).sum(dtype=np.uint64) & mask)
    return np.array([plain, weighted], dtype=np.uint32)


def jax_fingerprint(output: Any) -> Any:
    """The fingerprint of a JAX array, traced into the caller's ``jax.jit`` (it stays on device)."""
    import jax
    import jax.numpy as jnp

    words = jax.lax.bitcast_convert_type(output, _unsigned(output.dtype.itemsize)).reshape(-1)
    words = words.astype(jnp.uint32)
    weights = jnp.arange(1, words.size + 1, dtype=jnp.uint32)
    return jnp.stack([jnp.sum(words, dtype=jnp.uint32), jnp.sum(words * weights, dtype=jnp.uint32)])


def tf_fingerprint(output: Any) -> Any:
    """The fingerprint of a TensorFlow tensor (call it inside a ``jit_compile`` function, so XLA
    runs it on the tensor's device: TensorFlow's own GPU kernels lack most ``uint32`` ops)."""
    import tensorflow as tf

    unsigned = {4: tf.uint32, 2: tf.uint16, 1: tf.uint8}[output.dtype.size]
    words = tf.cast(tf.reshape(tf.bitcast(output, unsigned), [-1]), tf.uint32)
    weights = tf.range(1, tf.size(words) + 1, dtype=tf.int32)
    weights = tf.bitcast(weights, tf.uint32)
    return tf.stack([tf.reduce_sum(words), tf.reduce_sum(words * weights)])


_TORCH_CHUNK = 1 << 24  # elements per int64 pass in PyTorch: 128 MiB temporaries each
_MASK32 = 0xFFFFFFFF


def torch_fingerprint(output: Any) -> Any:
    """The fingerprint of a PyTorch tensor, on its device: two words, held as ``int64`` in
    ``[0, 2**32)`` (PyTorch has no wrap-around ``uint32`` arithmetic, and its ``uint32`` tensors
    support few operations on a GPU: the built kernel's fetch makes them ``uint32`` on the host).

    The words are widened to ``int64`` and the position-weighted product is formed in 16-bit
    halves, so nothing overflows; the sums go over chunks of 2**24 elements, so the temporaries
    stay small beside a GPU-sized output. Traced into the caller's ``torch.compile`` as one
    graph; eager, a few passes over the output, on the device.
    """
    import torch

    signed = {4: torch.int32, 2: torch.int16, 1: torch.int8}[output.element_size()]
    words = output.contiguous().reshape(-1).view(signed)
    low = (1 << (8 * output.element_size())) - 1
    plain = torch.zeros((), dtype=torch.int64, device=output.device)
    weighted = torch.zeros((), dtype=torch.int64, device=output.device)
    for start in range(0, words.numel(), _TORCH_CHUNK):
        chunk = words[start : start + _TORCH_CHUNK].to(torch.int64) & low
        weights = torch.arange(start + 1, start + chunk.numel() + 1, dtype=torch.int64,
                               device=output.device) & _MASK32
        # chunk * weights mod 2**32, in 16-bit halves of chunk: each product stays < 2**48.
        product = (chunk & 0xFFFF) * weights + (((chunk >> 16) * weights) & 0xFFFF) * 65536
        plain = plain + chunk.sum()
        weighted = weighted + (product & _MASK32).sum()
        del product
    return torch.stack([plain & _MASK32, weighted & _MASK32])


def fingerprint_hex(fingerprint: Any) -> str:
    """A fingerprint as 16 hex digits: what the determinism count compares."""
    words = np.asarray(fingerprint, dtype=np.uint32).reshape(-1)
    if words.size != FINGERPRINT_WORDS:
        raise ValueError(f"a fingerprint has {FINGERPRINT_WORDS} words, not {words.size}")
    return "".join(f"{int(w):08x}" for w in words)
