"""Fixtures for the kernel tests: the frameworks are imported once per pytest process.

TensorFlow takes ~10 s to import, so every test that builds a kernel asks for the
session-scoped ``frameworks`` fixture instead of importing it itself (``pytorch`` for PyTorch,
~1 s). The repository root goes
first on ``sys.path``, so ``import kernels`` finds this repository's package even when pytest is
started from elsewhere (``tests/kernels`` would otherwise shadow it as a namespace package).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


@pytest.fixture(scope="session")
def frameworks():
    """Import JAX and TensorFlow once, in the mode the kernels set up."""
    from kernels import frameworks

    return frameworks.import_jax(), frameworks.import_tensorflow()


@pytest.fixture(scope="session")
def pytorch():
    """Import PyTorch once, in the mode the kernels set up (deterministic algorithms on)."""
    from kernels import frameworks

    return frameworks.import_torch()
