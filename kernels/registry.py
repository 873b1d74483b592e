"""The registry of workloads: names, their specs, and the one entry point that builds a kernel.

``WORKLOADS`` maps each name to its :class:`~kernels.spec.KernelSpec`, in the order of the study:
``stencil``, ``gemm``, ``selu``, ``conv3d``, ``mlp_train``, ``hessian``. Every workload has the
presets ``tiny``, ``cpu`` and ``gpu``. An unknown name raises :class:`UnknownKernelError`, an
unknown preset, variant, dtype, precision or framework raises :class:`KernelOptionError`; both are
``ValueError`` and list what exists. Nothing here imports JAX or TensorFlow until a kernel is built.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from kernels import conv3d, gemm, hessian, mlp_train, selu, stencil
from kernels.build import BuiltKernel
from kernels.frameworks import FRAMEWORKS
from kernels.spec import KernelOptionError, KernelSpec, UnknownKernelError

__all__ = [
    "FRAMEWORKS",
    "WORKLOADS",
    "KernelOptionError",
    "UnknownKernelError",
    "build_kernel",
    "get_spec",
    "list_workloads",
]

WORKLOADS: Mapping[str, KernelSpec] = MappingProxyType(
    {m.SPEC.name: m.SPEC for m in (stencil, gemm, selu, conv3d, mlp_train, hessian)}
)


def list_workloads() -> tuple[str, ...]:
    """The workload names, in registry order."""
    return tuple(WORKLOADS)


def get_spec(name: str) -> KernelSpec:
    """Return the spec of workload ``name``.

    Raises:
        UnknownKernelError: for an unknown name; the message lists the known ones.
    """
    try:
        return WORKLOADS[name]
    except (KeyError, TypeError):
        raise UnknownKernelError(
            f"unknown workload {name!r}; choose one of: {', '.join(WORKLOADS)}"
        ) from None


def build_kernel(
    workload: str,
    framework: str,
    preset: str = "cpu",
    dtype: str = "float32",
    precision: str = "default",
    seed: int = 0,
    xla: bool = False,
    variant: str | None = None,
) -> BuiltKernel:
    """Build (compile and warm up) one kernel; every option is checked before any import.

    Args:
        workload: a registry name.
        framework: ``"jax"`` or ``"tensorflow"``.
        preset: ``"tiny"``, ``"cpu"`` or ``"gpu"``.
        dtype: one of the spec's dtypes.
        precision: one of the spec's precisions for ``dtype``.
        seed: seed of the random inputs.
        xla: TensorFlow only: compile with XLA (``jit_compile=True``).
        variant: a shape variant of the spec, or None for its default.

    Returns:
        The built kernel.

    Raises:
        UnknownKernelError: an unknown workload.
        KernelOptionError: an unknown framework, preset, variant, dtype or precision.
    """
    spec = get_spec(workload)
    if framework not in FRAMEWORKS:
        raise KernelOptionError(
            f"unknown framework {framework!r}; choose one of: {', '.join(FRAMEWORKS)}"
        )
    spec.validate(preset, dtype, precision, variant)
    return BuiltKernel(spec, framework, preset, dtype, precision, seed, xla, variant)
