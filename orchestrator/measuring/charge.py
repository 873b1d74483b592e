"""A user's step on the simulated GPU: the work each call is charged, and the faults that reach it.

The window API (``orchestrator.measuring.program``, ``dvfs.charged``) runs a user's step on the
host and tells the simulated GPU what the step would have done on it, as a trial tells it for a
built-in kernel:

- **Work**, by the cost analysis the built-in kernels use (``kernels.cost``), once per distinct
  call signature (the arguments' structure, shapes and dtypes, and the values of ``str``
  arguments; a number's value is not in it, as JAX traces numbers: a step whose static number
  changes its work is charged the work of the first): a JAX step is lowered and
  compiled at the call's shapes and XLA's cost analysis read (``xla_cost_analysis``); a PyTorch
  step's first call of that signature runs for real under a dispatch mode that counts its ATen
  ops and FLOPs (``torch_dispatch_ops``). Times the process's ``sim_scale`` (FLOPs, bytes and
  transcendentals; not launches). A call that is neither, or whose analysis failed, has no work
  to be charged: the caller charges it as busy for its wall time, and its record says why.
- **The roof** its FLOPs run at: ``kernels.spec.compute_roof`` of its first floating argument's
  dtype and its kind (a matmul in float32 at TF32 under JAX, FP32 under PyTorch, as the built-in
  workloads are charged).
- **Faults**: a call the sim corrupts gets one flipped bit (``window.flip_random_bit``) in one
  element of one array, chosen in proportion to size among the call's outputs and, for PyTorch,
  the tensors it updates in place (``state``: the model a training step steps). JAX outputs are
  rebuilt (arrays are immutable); PyTorch tensors are changed in place. On the sim the program
  runs on the host, so this host work costs the virtual clock nothing.
"""

from __future__ import annotations

import sys
from collections.abc import Hashable
from typing import Any

from orchestrator.devices.base import KernelWork

STATIC_TYPES = (str,)
"""Argument types whose values are part of a call's signature (a string is never traced)."""

_INT_OF_SIZE = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}


def _leaves(args: Any) -> tuple[list[Any], Any]:
    """The leaves of a tree of arguments and its structure, by JAX's or PyTorch's pytree (the
    one the program imported), else by plain tuples, lists and dicts."""
    jax = sys.modules.get("jax")
    if jax is not None:
        leaves, tree = jax.tree_util.tree_flatten(args)
        return leaves, str(tree)
    if "torch" in sys.modules:
        from torch.utils._pytree import tree_flatten

        leaves, spec = tree_flatten(args)
        return leaves, str(spec)
    flat: list[Any] = []
    _plain_flatten(args, flat)
    return flat, None


def _plain_flatten(value: Any, out: list[Any]) -> None:
    if isinstance(value, (list, tuple)):
        for v in value:
            _plain_flatten(v, out)
    elif isinstance(value, dict):
        for v in value.values():
            _plain_flatten(v, out)
    else:
        out.append(value)


def framework_of(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """``jax`` or ``pytorch`` as the step and its arguments say; None: neither."""
    jax, torch = sys.modules.get("jax"), sys.modules.get("torch")
    if torch is not None and isinstance(fn, torch.nn.Module):
        return "pytorch"
    if jax is not None and hasattr(fn, "lower"):
        return "jax"
    leaves, _ = _leaves((args, kwargs))
    if torch is not None and any(isinstance(leaf, torch.Tensor) for leaf in leaves):
        return "pytorch"
    if jax is not None and any(isinstance(leaf, jax.Array) for leaf in leaves):
        return "jax"
    return None


def _leaf_key(leaf: Any) -> Hashable:
    if hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
        return tuple(leaf.shape), str(leaf.dtype)
    if isinstance(leaf, STATIC_TYPES):
        return type(leaf).__name__, leaf
    return type(leaf).__name__


def signature(framework: str | None, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Hashable:
    """What a call's work depends on: the arguments' structure, shapes and dtypes, and the
    values of their strings."""
    leaves, tree = _leaves((args, kwargs))
    return framework, tree, tuple(_leaf_key(leaf) for leaf in leaves)


def _first_float_dtype(leaves: list[Any]) -> str:
    for leaf in leaves:
        dtype = str(getattr(leaf, "dtype", "")).removeprefix("torch.")
        if dtype in ("float32", "float64", "bfloat16", "float16"):
            return dtype
    return "float32"


def analyse(
    fn: Any, framework: str | None, args: tuple[Any, ...], kwargs: dict[str, Any], name: str,
    scale: float,
) -> tuple[Any, KernelWork | None, dict[str, Any]]:
    """Run one call and say what it is charged (see the module docstring).

    Returns:
        The call's output; its work per call (None: none could be told, the caller charges it
        as busy); the record of what was charged, for the program's records.
    """
    from kernels.cost import jax_call_work, torch_call_work

    record: dict[str, Any] = {"name": name, "framework": framework, "sim_scale": scale}
    compiled = None
    if framework == "jax":
        try:
            compiled = jax_call_work(fn, args, kwargs)
        except Exception as e:  # noqa: BLE001 - the call still runs; it is charged as busy
            record["note"] = f"xla_cost_analysis failed: {type(e).__name__}: {e}"[:300]
        out = fn(*args, **kwargs)
    elif framework == "pytorch":
        try:
            out, compiled = torch_call_work(fn, args, kwargs)
        except Exception as e:  # noqa: BLE001 - counting failed: the call again, uncounted
            record["note"] = f"torch_dispatch_ops failed: {type(e).__name__}: {e}"[:300]
            out = fn(*args, **kwargs)
    else:
        record["note"] = "neither a JAX nor a PyTorch call"
        out = fn(*args, **kwargs)
    if compiled is None:
        record["source"] = "busy_wall_time"
        return out, None, record
    from kernels.spec import compute_roof

    leaves, _ = _leaves((args, kwargs))
    peak = compute_roof(_first_float_dtype(leaves), "default", framework,
                        uses_matmul=compiled.kind in ("matmul", "conv"),
                        convolution=compiled.kind == "conv")
    work = KernelWork(
        flops=compiled.flops * scale, bytes_moved=compiled.bytes_moved * scale, peak=peak,
        kernel_class=name, framework=framework or "", launches=int(compiled.launches),
        transcendentals=compiled.transcendentals * scale, kind=compiled.kind,
    )
    record.update(flops=work.flops, bytes_moved=work.bytes_moved, launches=work.launches,
                  transcendentals=work.transcendentals, work_kind=work.kind, peak=peak,
                  source=compiled.source, note=compiled.note,
                  analysis_s=compiled.analysis_s)
    return out, work, record


# --- faults ------------------------------------------------------------------------------------
def corrupt(out: Any, state: Any, framework: str | None, rng: Any) -> Any:
    """The call's output with one bit flipped in one element of one of its arrays (or of a
    ``state`` tensor, PyTorch): what a corrupted call on unstable silicon leaves."""
    if framework == "jax":
        return _corrupt_jax(out, rng)
    if framework == "pytorch":
        _corrupt_torch(out, state, rng)
    return out


def _pick(sizes: list[float], rng: Any) -> int:
    """An index drawn in proportion to ``sizes``."""
    total = float(sum(sizes))
    point = float(rng.random()) * total
    for i, size in enumerate(sizes):
        point -= size
        if point < 0:
            return i
    return len(sizes) - 1


def _corrupt_jax(out: Any, rng: Any) -> Any:
    import jax
    import numpy as np

    from orchestrator.measuring.window import flip_random_bit

    leaves, tree = jax.tree_util.tree_flatten(out)
    arrays = [i for i, leaf in enumerate(leaves)
              if hasattr(leaf, "dtype") and int(getattr(leaf, "size", 0)) > 0]
    if not arrays:
        return out
    i = arrays[_pick([leaves[i].size * leaves[i].dtype.itemsize for i in arrays], rng)]
    leaf = leaves[i]
    flipped = flip_random_bit(np.asarray(leaf), rng)
    leaves[i] = jax.device_put(flipped, leaf.sharding) if isinstance(leaf, jax.Array) else flipped
    return jax.tree_util.tree_unflatten(tree, leaves)


def _state_tensors(state: Any, torch: Any) -> list[Any]:
    if state is None:
        return []
    if isinstance(state, torch.Tensor):
        return [state]
    if isinstance(state, torch.nn.Module):
        return [*state.parameters(), *state.buffers()]
    if isinstance(state, dict):
        state = list(state.values())
    if isinstance(state, (list, tuple)):
        return [t for part in state for t in _state_tensors(part, torch)]
    return []


def _corrupt_torch(out: Any, state: Any, rng: Any) -> None:
    import torch
    from torch.utils._pytree import tree_leaves

    from orchestrator.measuring.window import flip_random_bit

    seen: dict[int, Any] = {}
    for t in [*tree_leaves(out), *_state_tensors(state, torch)]:
        if isinstance(t, torch.Tensor) and t.numel() > 0:
            seen.setdefault(id(t), t)
    tensors = list(seen.values())
    if not tensors:
        return
    t = tensors[_pick([float(x.numel() * x.element_size()) for x in tensors], rng)]
    raw = t.detach().view(getattr(torch, _INT_OF_SIZE[t.element_size()]))  # any dtype's bits
    flipped = flip_random_bit(raw.cpu().numpy(), rng)
    with torch.no_grad():
        raw.copy_(torch.from_numpy(flipped).to(raw.device))
