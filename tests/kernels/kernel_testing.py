"""Helpers shared by the kernel tests: bit flips on outputs, the repository root."""

from __future__ import annotations

from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]


def flip_bit(array: np.ndarray, index: int, bit: int) -> np.ndarray:
    """Return a copy of ``array`` with bit ``bit`` of element ``index`` (flat) flipped."""
    out = np.array(array, copy=True)
    words = out.reshape(-1).view(np.dtype(f"u{out.dtype.itemsize}"))
    words[index] ^= words.dtype.type(1 << bit)
    return out


def exponent_msb(dtype: np.dtype) -> int:
    """The bit index of the exponent's most significant bit (30 for float32, 14 for bfloat16)."""
    return 8 * np.dtype(dtype).itemsize - 2
