"""Framework setup: lazy imports, deterministic mode, device-memory sharing, precision knobs.

JAX, TensorFlow and PyTorch are imported here and only here, inside functions, so that
``import kernels`` costs no framework import (TensorFlow alone takes 8-11 s). The first call to
:func:`import_jax`, :func:`import_tensorflow` or :func:`import_torch` puts the process in the mode
a measurement needs, before any framework initialises a device:

- **Deterministic ops.** ``--xla_gpu_deterministic_ops=true`` is appended to ``XLA_FLAGS`` (read by
  JAX's XLA and by TensorFlow's ``jit_compile``), and TensorFlow gets
  ``tf.config.experimental.enable_op_determinism()``. The same inputs then give bitwise-identical
  outputs within one process, so a digest mismatch means the device misbehaved.
- **No memory starvation.** JAX preallocates 75% of a GPU and TensorFlow grabs all of it; a process
  hosting both sets ``XLA_PYTHON_CLIENT_PREALLOCATE=false`` and TensorFlow memory growth on every
  GPU (also through ``TF_FORCE_GPU_ALLOW_GROWTH`` in case TensorFlow was imported elsewhere first).
- **PyTorch.** ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` is set before CUDA initialises (cuBLAS needs
  it for deterministic GEMMs), and ``torch.use_deterministic_algorithms(True)`` is on from the
  first import (a kernel built with ``deterministic: false`` turns it off around its calls).
  PyTorch is an extra (``dvfs-orchestrator[torch]``): without it :func:`import_torch` raises
  :class:`FrameworkMissingError`, one line naming the extra.

Precision names are ours and map to each framework's own knob:

========== ============================================ ==============================
ours       JAX (``jax_default_matmul_precision``)        TensorFlow (TF32 switch)
========== ============================================ ==============================
default    framework default (TF32 on Ampere+ GPUs)     framework default (TF32 on)
highest    ``"highest"`` (full fp32)                     TF32 disabled
tf32       ``"tensorfloat32"``                           TF32 enabled
========== ============================================ ==============================

PyTorch (``torch.set_float32_matmul_precision``, which also sets
``torch.backends.cuda.matmul.allow_tf32``; ``torch.backends.cudnn.allow_tf32`` for convolutions):
``default`` keeps its own defaults (matmuls in full fp32, cuDNN convolutions in TF32),
``highest`` is ``"highest"`` with cuDNN TF32 off, ``tf32`` is ``"high"`` with cuDNN TF32 on.
Like TensorFlow's switch they are process-wide, so :func:`torch_mode_scope` sets them around a
build and around every call, with ``torch.use_deterministic_algorithms``.

bf16 is a dtype (bfloat16 inputs and outputs), not a precision. On a CPU, TF32 does not exist and
every float32 matmul runs at full precision whatever the knob says.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator, Mapping
from typing import Any, Literal

Framework = Literal["jax", "tensorflow", "pytorch"]
FRAMEWORKS: tuple[str, ...] = ("jax", "tensorflow", "pytorch")
ITEMSIZE: Mapping[str, int] = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}
"""Bytes per element of each of our dtype names: the one table a workload's counts, its
footprint and the compiled-work analysis read (no NumPy import to learn a width)."""
FRAMEWORK_MODULES: dict[str, str] = {"jax": "jax", "tensorflow": "tensorflow", "pytorch": "torch"}
"""Each framework's top-level module (what ``import`` and ``importlib.util.find_spec`` name)."""
TORCH_EXTRA = "pip install 'dvfs-orchestrator[torch]'"
"""The install command that brings PyTorch (named by :class:`FrameworkMissingError`)."""
CUBLAS_WORKSPACE_CONFIG = ":4096:8"
"""What cuBLAS needs for deterministic results (PyTorch's reproducibility notes)."""

DETERMINISM_FLAG = "--xla_gpu_deterministic_ops=true"

_JAX_MATMUL_PRECISION: dict[str, str | None] = {
    "default": None,
    "highest": "highest",
    "tf32": "tensorfloat32",
}
# None leaves TensorFlow's own default (TF32 enabled since TF 2.4).
_TF_TF32_ENABLED: dict[str, bool | None] = {"default": None, "highest": False, "tf32": True}

_lock = threading.Lock()
_tf_configured = False
_torch_configured = False


class FrameworkMissingError(ImportError):
    """A framework the request needs is not installed; the message names how to install it."""


def configure_environment() -> None:
    """Set the environment variables both frameworks read when they initialise.

    Idempotent. Must run before JAX or TensorFlow touches a device; :func:`import_jax` and
    :func:`import_tensorflow` call it first.
    """
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_gpu_deterministic_ops" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} {DETERMINISM_FLAG}".strip()
    os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    os.environ["TF_FORCE_GPU_ALLOW_GROWTH"] = "true"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE_CONFIG)


def import_jax() -> Any:
    """Import JAX after :func:`configure_environment`.

    Returns:
        The ``jax`` module.
    """
    configure_environment()
    import jax

    return jax


def import_tensorflow() -> Any:
    """Import TensorFlow after :func:`configure_environment`, in deterministic mode.

    On first use it also turns on memory growth for every GPU TensorFlow sees. If TensorFlow has
    already initialised its GPUs (someone else imported and used it first), memory growth can no
    longer change; ``TF_FORCE_GPU_ALLOW_GROWTH`` covers that case when it was set in time.

    Returns:
        The ``tensorflow`` module.
    """
    global _tf_configured
    configure_environment()
    import tensorflow as tf

    with _lock:
        if not _tf_configured:
            for gpu in tf.config.list_physical_devices("GPU"):
                with contextlib.suppress(RuntimeError):  # GPUs already initialised.
                    tf.config.experimental.set_memory_growth(gpu, True)
            tf.config.experimental.enable_op_determinism()
            _tf_configured = True
    return tf


def import_torch() -> Any:
    """Import PyTorch after :func:`configure_environment`, in deterministic mode.

    ``CUBLAS_WORKSPACE_CONFIG`` is in the environment before CUDA initialises (it initialises
    lazily, at the first CUDA call, so this holds even if ``torch`` was imported elsewhere first,
    as long as nothing used CUDA yet), and on first use ``torch.use_deterministic_algorithms(True)``
    is turned on, as TensorFlow's op determinism is.

    Returns:
        The ``torch`` module.

    Raises:
        FrameworkMissingError: PyTorch is not installed (one line naming the extra).
    """
    global _torch_configured
    if _torch_configured:  # the fast path: the mode scope asks at every call
        return sys.modules["torch"]
    configure_environment()
    try:
        import torch
    except ImportError as e:
        raise FrameworkMissingError(
            missing_framework("pytorch") or f"PyTorch does not import ({e}): {TORCH_EXTRA}"
        ) from e
    with _lock:
        if not _torch_configured:
            torch.use_deterministic_algorithms(True)
            _torch_configured = True
    return torch


def missing_framework(framework: str) -> str | None:
    """The one line a user gets for a framework whose library is not installed (found, not
    imported: cheap, before anything touches a device); None when it is there, or is not one
    of the optional frameworks (JAX and TensorFlow are required by the package)."""
    if framework != "pytorch":
        return None
    import importlib.util

    try:
        found = importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):  # a finder that refuses it, or a broken install
        found = False
    return None if found else (
        f"framework=pytorch needs PyTorch, which is not installed: {TORCH_EXTRA}"
    )


TORCH_RECOMPILE_LIMIT = 1024
"""Graphs ``torch.compile`` keeps per function: one per kernel that shares its code (the
checked step of every workload, each workload's dtypes and variants). PyTorch's default, 8,
would run the ninth kernel of a sweep eagerly under a compiled label, with a warning."""


def torch_compile(fn: Any) -> Any:
    """``torch.compile(fn)`` for static shapes, with room for every kernel of a sweep
    (:data:`TORCH_RECOMPILE_LIMIT`) and an error, never a silent eager fallback, past it."""
    torch = import_torch()
    config = torch._dynamo.config
    with _lock:
        for name in ("cache_size_limit", "recompile_limit"):
            if getattr(config, name, TORCH_RECOMPILE_LIMIT) < TORCH_RECOMPILE_LIMIT:
                setattr(config, name, TORCH_RECOMPILE_LIMIT)
        for name in ("accumulated_cache_size_limit", "accumulated_recompile_limit"):
            if getattr(config, name, 4 * TORCH_RECOMPILE_LIMIT) < 4 * TORCH_RECOMPILE_LIMIT:
                setattr(config, name, 4 * TORCH_RECOMPILE_LIMIT)
        if hasattr(config, "fail_on_recompile_limit_hit"):
            config.fail_on_recompile_limit_hit = True
    return torch.compile(fn, dynamic=False)


def framework_version(framework: str) -> str:
    """Return the version string of ``framework`` (importing it), e.g. ``"0.10.2"``."""
    if framework == "jax":
        return str(import_jax().__version__)
    if framework == "pytorch":
        return str(import_torch().__version__)
    return str(import_tensorflow().__version__)


def numpy_dtype(dtype: str) -> Any:
    """Return the NumPy dtype for one of our dtype names (bfloat16 through ``ml_dtypes``)."""
    import numpy as np

    if dtype == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(dtype)


def jax_matmul_precision(precision: str) -> str | None:
    """Return the ``jax_default_matmul_precision`` value for ``precision`` (None: default)."""
    return _JAX_MATMUL_PRECISION[precision]


@contextlib.contextmanager
def jax_precision_scope(precision: str) -> Iterator[None]:
    """Trace and compile JAX code under the matmul precision that ``precision`` names."""
    jax = import_jax()
    value = jax_matmul_precision(precision)
    if value is None:
        yield
        return
    with jax.default_matmul_precision(value):
        yield


# (float32 matmul precision, cuDNN TF32) per precision; None leaves PyTorch's own default.
_TORCH_PRECISION: dict[str, tuple[str, bool] | None] = {
    "default": None,
    "highest": ("highest", False),
    "tf32": ("high", True),
}


def _torch_mode(torch: Any) -> tuple[str, bool, bool]:
    """The process-wide knobs :func:`torch_mode_scope` sets, as they are now."""
    return (torch.get_float32_matmul_precision(), bool(torch.backends.cudnn.allow_tf32),
            bool(torch.are_deterministic_algorithms_enabled()))


def _set_torch_mode(torch: Any, mode: tuple[str, bool, bool]) -> None:
    matmul, cudnn_tf32, deterministic = mode
    torch.set_float32_matmul_precision(matmul)
    torch.backends.cudnn.allow_tf32 = cudnn_tf32
    torch.use_deterministic_algorithms(deterministic)


@contextlib.contextmanager
def torch_mode_scope(precision: str, deterministic: bool = True) -> Iterator[None]:
    """Run PyTorch code with the precision ``precision`` names and deterministic algorithms on
    or off, then restore both (they are process-wide, read when an op runs and when
    ``torch.compile`` generates code, so kernels of different modes can share a process).

    Args:
        precision: ``"default"``, ``"highest"`` or ``"tf32"`` (see the module docstring).
        deterministic: ``torch.use_deterministic_algorithms`` inside the scope.
    """
    torch = import_torch()
    before = _torch_mode(torch)
    knobs = _TORCH_PRECISION[precision]
    wanted = (*(knobs or before[:2]), bool(deterministic))
    if wanted == before:
        yield
        return
    _set_torch_mode(torch, wanted)
    try:
        yield
    finally:
        _set_torch_mode(torch, before)


@contextlib.contextmanager
def tf_precision_scope(precision: str) -> Iterator[None]:
    """Run TensorFlow code with the TF32 switch that ``precision`` names, then restore it.

    The switch is process-wide and read when a kernel runs (and when XLA compiles), so it is set
    around the build and around every call: kernels of different precisions can share a process.
    """
    enabled = _TF_TF32_ENABLED[precision]
    if enabled is None:
        yield
        return
    tf = import_tensorflow()
    before = tf.config.experimental.tensor_float_32_execution_enabled()
    if before == enabled:
        yield
        return
    tf.config.experimental.enable_tensor_float_32_execution(enabled)
    try:
        yield
    finally:
        tf.config.experimental.enable_tensor_float_32_execution(before)
