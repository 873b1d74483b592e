"""The compiled work of a workload, kept on disk between processes.

Analysing what a framework compiles (:func:`kernels.cost.compiled_work`) costs seconds per
workload: XLA compiles ResNet-50's training step at the study's batch in ~10 s, TensorFlow's graph
is walked op by op, PyTorch's ops are dispatched one by one. A process keeps each result in memory;
this keeps it on disk too, so that every Ray worker of a sweep (one per GPU), every resumed sweep
and every later sweep of the same workload reads it instead of compiling it again.
``experiment=seed_models`` analyses nine (model, framework) pairs: 51 s of CPU in a fresh process
(9 s read back from disk, mostly the frameworks' imports), once per worker: on an 8-GPU node, 7
min of CPU per start.

A result is kept under a key of everything it depends on: the options it was asked with, the
size they name, the framework's version, the backend XLA compiles for here (a GPU's program is
not the CPU's: a home folder shared by a cluster's login and GPU nodes keeps both), and the
source of the modules that define the workload's functions and of the analysis itself
(``kernels/cost.py``, ``kernels/frameworks.py``); a change in any of them is a new key. Only a
framework's own figures are kept, never the analytic fallback a failed analysis gives (it may fail
for a reason that passes).

Where: ``$DVFS_CACHE_DIR/work`` if set (empty: nothing is kept on disk), else
``$XDG_CACHE_HOME/dvfs-orchestrator/work`` (``~/.cache/...``). One small JSON file per result,
written atomically; a file that cannot be read is ignored and written again. Delete the folder to
start afresh.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect
import json
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    from kernels.cost import CompiledWork
    from kernels.spec import KernelSpec

CACHE_DIR_ENV = "DVFS_CACHE_DIR"
_ANALYSIS_SOURCES = ("cost.py", "frameworks.py")
_HOOKS = ("count_fn", "jax_fn", "tf_fn", "torch_fn", "shapes_fn")


def cache_dir() -> Path | None:
    """The folder results are kept in, or None where the user turned the disk cache off."""
    chosen = os.environ.get(CACHE_DIR_ENV)
    if chosen is not None:
        return Path(chosen) / "work" if chosen else None
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dvfs-orchestrator" / "work"


def key_of(spec: KernelSpec, framework: str, options: tuple[object, ...]) -> str:
    """The file name a result is kept under: a hash of all it depends on."""
    size = spec.sizes[options[0]][options[1]]
    xla = bool(options[4])  # (preset, variant, dtype, precision, xla, compile)
    material = [spec.name, framework, [str(o) for o in options], repr(size),
                _framework_version(framework), _compiler_backend() if xla else "host",
                _sources_hash(_hook_files(spec))]
    return hashlib.sha256(json.dumps(material).encode()).hexdigest()[:32]


def kept(spec: KernelSpec, framework: str, options: tuple[object, ...],
         kind: type[CompiledWork], analyse: Callable[[], CompiledWork]) -> CompiledWork:
    """The work of ``spec`` under ``framework`` and ``options`` kept on disk, else what
    ``analyse()`` finds, kept for the next process (a fallback never is: :func:`store`): the one
    place the disk is consulted, once per result a process asks for."""
    key = key_of(spec, framework, options)
    work = load(key, kind)
    if work is None:
        work = analyse()
        store(key, work)
    return work


def load(key: str, kind: type[CompiledWork]) -> CompiledWork | None:
    """The result kept under ``key`` as a ``kind`` (``kernels.cost.CompiledWork``), or None (none
    kept, unreadable, or the cache is off)."""
    folder = cache_dir()
    if folder is None:
        return None
    try:
        fields = json.loads((folder / f"{key}.json").read_text())
        return kind(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})
    except (OSError, ValueError, TypeError):
        return None


def store(key: str, work: CompiledWork) -> None:
    """Keep ``work`` under ``key`` (atomically); a folder that cannot be written keeps nothing."""
    folder = cache_dir()
    if folder is None or work.source == "analytic":
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{key}.", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(dataclasses.asdict(work), f)
        os.replace(tmp, folder / f"{key}.json")
    except OSError:
        return


def _hook_files(spec: KernelSpec) -> tuple[str, ...]:
    files = {str(Path(__file__).with_name(name)) for name in _ANALYSIS_SOURCES}
    for hook in _HOOKS:
        fn = getattr(spec, hook, None)
        try:
            source = inspect.getsourcefile(inspect.unwrap(fn)) if fn is not None else None
        except TypeError:  # a builtin or a C function: no file of its own
            source = None
        if source:
            files.add(source)
    return tuple(sorted(files))


@functools.cache
def _sources_hash(files: tuple[str, ...]) -> str:
    digest = hashlib.sha256()
    for name in files:
        digest.update(name.encode())
        try:
            digest.update(Path(name).read_bytes())
        except OSError:
            digest.update(b"?")
    return digest.hexdigest()


@functools.cache
def _compiler_backend() -> str:
    """The platform JAX compiles for in this process (``cpu``, ``gpu``, ``tpu``), which XLA's
    figures depend on (and TensorFlow's with XLA: it is compiled by the same XLA)."""
    from kernels import frameworks as fw

    try:
        return str(fw.import_jax().default_backend())
    except Exception:  # noqa: BLE001 - no JAX here: no XLA figures either
        return "none"


@functools.cache
def _framework_version(framework: str) -> str:
    """The version of the framework as imported (the analysis imports it anyway)."""
    import importlib

    module = {"pytorch": "torch"}.get(framework, framework)
    try:
        return str(importlib.import_module(module).__version__)
    except (ImportError, AttributeError):
        return "?"
