"""The registry of workloads: names, their specs, and the one entry point that builds a kernel.

``WORKLOADS`` maps each built-in name to its :class:`~kernels.spec.Workload`, in the order of the
study: the kernels ``stencil``, ``gemm``, ``selu``, ``conv3d``, ``mlp_train``, ``hessian``, then
the models ``resnet50_train``, ``bert_train``, ``vit_train``. Every workload has the presets
``tiny``, ``cpu`` and ``gpu``. A user's workload comes in two ways, both through
:func:`load_workload`:

- a *target*, ``"package.module:factory"`` (``workload=custom workload.target=...``);
- an *entry point* of the group :data:`ENTRY_POINT_GROUP` (``dvfs.workloads``) in an installed
  package's metadata, ``name = "package.module:factory"``; then ``workload=name`` works like a
  built-in.

The factory is called with no arguments and returns a :class:`~kernels.spec.Workload` (a module
attribute that already is one is taken as it is). Loaded workloads are registered in this process
under their own name, so ``get_spec`` and ``build_kernel`` find them like built-ins. Modules are
imported from ``sys.path``, the current directory and the directories of
:data:`WORKLOAD_PATH_ENV` (``os.pathsep``-separated: the launcher sets it in its Ray workers).

An unknown name raises :class:`UnknownKernelError`, an unknown preset, variant, dtype, precision or
framework, or a target that does not load, :class:`KernelOptionError`; both are ``ValueError`` and
say what exists. :func:`workload_frameworks` says which frameworks each workload is written in
(a user's may give any of JAX, TensorFlow and PyTorch). Nothing here imports JAX, TensorFlow or
PyTorch until a kernel is built.
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
from collections.abc import Mapping
from importlib.metadata import entry_points
from types import MappingProxyType

from kernels import conv3d, gemm, hessian, mlp_train, selu, stencil
from kernels.build import BuiltKernel
from kernels.frameworks import FRAMEWORKS
from kernels.models import MODEL_SPECS
from kernels.spec import KernelOptionError, KernelOptions, KernelSpec, UnknownKernelError

__all__ = [
    "FRAMEWORKS",
    "KERNELS",
    "MODELS",
    "WORKLOADS",
    "KernelOptionError",
    "UnknownKernelError",
    "build_kernel",
    "get_spec",
    "list_workloads",
    "load_workload",
    "workload_frameworks",
]

ENTRY_POINT_GROUP = "dvfs.workloads"
WORKLOAD_PATH_ENV = "DVFS_WORKLOAD_PATH"
CUSTOM = "custom"  # the config name of a workload given by ``workload.target``

KERNELS: tuple[str, ...] = tuple(
    m.SPEC.name for m in (stencil, gemm, selu, conv3d, mlp_train, hessian)
)
"""The micro-kernels, in the order of the study."""
MODELS: tuple[str, ...] = tuple(MODEL_SPECS)
"""The study's models: one training step each."""
WORKLOADS: Mapping[str, KernelSpec] = MappingProxyType(
    {m.SPEC.name: m.SPEC for m in (stencil, gemm, selu, conv3d, mlp_train, hessian)}
    | dict(MODEL_SPECS)
)

_loaded: dict[str, KernelSpec] = {}  # name -> a user's workload loaded in this process
_targets: dict[str, KernelSpec] = {}  # target -> its workload
_lock = threading.Lock()


def list_workloads() -> tuple[str, ...]:
    """The built-in workload names, in registry order."""
    return tuple(WORKLOADS)


def workload_frameworks(names: tuple[str, ...] | None = None) -> dict[str, tuple[str, ...]]:
    """Which frameworks each workload is written in: name -> e.g. ``("jax", "tensorflow",
    "pytorch")``, for ``names`` (built-ins or workloads loaded in this process; default: every
    built-in). Imports no framework.

    Raises:
        UnknownKernelError: a name that is neither a built-in nor loaded.
    """
    return {name: get_spec(name).frameworks for name in (names or list_workloads())}


def workload_entry_points() -> dict[str, str]:
    """The installed ``dvfs.workloads`` entry points: name -> ``module:factory`` (none loaded)."""
    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}


def get_spec(name: str) -> KernelSpec:
    """Return the spec of workload ``name``: a built-in, one loaded here, or an entry point's.

    Raises:
        UnknownKernelError: for an unknown name; the message lists the known ones.
        KernelOptionError: an entry point that does not load.
    """
    return load_workload(name)


def load_workload(name: str, target: str | None = None) -> KernelSpec:
    """The workload ``name`` (``"custom"`` with a ``target``), loading a user's on first use.

    Args:
        name: a built-in name, an entry point's name, ``"custom"``, or the name a loaded
            workload registered.
        target: ``"package.module:factory"``, for ``name="custom"`` (or any name: then the
            workload must be that name's).

    Raises:
        UnknownKernelError: an unknown name, or ``custom`` without a target.
        KernelOptionError: a target that does not import, a factory that fails or returns
            something else than a workload, or a name that clashes with a built-in.
    """
    if target:
        return _from_target(target, None if name == CUSTOM else name)
    if isinstance(name, str) and name in WORKLOADS:
        return WORKLOADS[name]
    if isinstance(name, str) and name in _loaded:
        return _loaded[name]
    points = workload_entry_points()
    if isinstance(name, str) and name in points:
        return _from_target(points[name], name)
    if name == CUSTOM:
        raise UnknownKernelError("workload=custom needs workload.target=package.module:factory")
    known = [*WORKLOADS, *points]
    raise UnknownKernelError(
        f"unknown workload {name!r}; choose one of: {', '.join(known)}, or workload=custom "
        "workload.target=package.module:factory"
    )


def adopt_workload(spec: KernelSpec) -> None:
    """Know ``spec`` by its name in this process: a user's workload loaded where its job was
    made (the driver) and carried with the job to a worker, whose kernel cache and build find a
    workload by name. A built-in, or a name already loaded here, stays as it is."""
    if spec.name not in WORKLOADS:
        with _lock:
            _loaded.setdefault(spec.name, spec)


def _from_target(target: str, name: str | None) -> KernelSpec:
    with _lock:
        spec = _targets.get(target)
        if spec is None:
            spec = _targets[target] = _call_factory(target)
        if spec.name in WORKLOADS and WORKLOADS[spec.name] is not spec:
            raise KernelOptionError(f"{target} returned a workload named {spec.name!r}, which "
                                    "is a built-in's name: give it another")
        if name is not None and spec.name != name:
            raise KernelOptionError(f"{target} returned a workload named {spec.name!r}, "
                                    f"not {name!r}")
        _loaded.setdefault(spec.name, spec)
        return spec


def _call_factory(target: str) -> KernelSpec:
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise KernelOptionError(f"workload target {target!r} is not 'package.module:factory'")
    for extra in [os.getcwd(), *os.environ.get(WORKLOAD_PATH_ENV, "").split(os.pathsep)]:
        if extra and extra not in sys.path:
            sys.path.append(extra)
    try:
        found = getattr(importlib.import_module(module_name), attr)
    except ImportError as e:
        raise KernelOptionError(f"workload target {target!r}: cannot import {module_name!r} "
                                f"({type(e).__name__}: {e})") from e
    except AttributeError:
        raise KernelOptionError(f"workload target {target!r}: module {module_name!r} has "
                                f"no {attr!r}") from None
    if not isinstance(found, KernelSpec) and not callable(found):
        raise KernelOptionError(f"workload target {target!r} is a {type(found).__name__}, "
                                "neither a kernels.Workload nor a factory returning one")
    try:
        spec = found if isinstance(found, KernelSpec) else found()
    except Exception as e:  # noqa: BLE001 - the user's factory failed: one line, not a trace
        raise KernelOptionError(f"workload target {target!r}: the factory raised "
                                f"{type(e).__name__}: {e}") from e
    if not isinstance(spec, KernelSpec):
        raise KernelOptionError(f"workload target {target!r} returned a "
                                f"{type(spec).__name__}, not a kernels.Workload")
    return spec


def build_kernel(options: KernelOptions) -> BuiltKernel:
    """Build (compile and warm up) one kernel; every option is checked before any import.

    Args:
        options: the workload, by its registry name, and the options to build it with.

    Returns:
        The built kernel.

    Raises:
        UnknownKernelError: an unknown workload.
        KernelOptionError: an unknown framework, preset, variant, dtype or precision.
    """
    return BuiltKernel(get_spec(options.workload), options)
