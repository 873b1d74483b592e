"""The work one kernel call does as its framework compiled it: FLOPs, bytes and kernel launches.

The analytic counts of :mod:`kernels.spec` are the same whatever runs the kernel: the fewest bytes,
every intermediate on chip. What a framework compiles moves more, and differently: XLA fuses the
stencil's rolls and adds into one or two loops, TensorFlow's graph runs one kernel per op and
writes every intermediate to memory. :func:`compiled_work` derives the work of one call from what
the framework compiled, at any size preset, with abstract shapes (``jax.ShapeDtypeStruct``,
``tf.TensorSpec``) so that nothing of that size is allocated:

- **JAX** (``source="xla_cost_analysis"``): ``jax.jit(f).lower(*abstract).compile()`` on the
  default backend (where the kernel runs), then XLA's cost analysis of that optimized executable:
  ``flops`` plus ``transcendentals`` (the project counts an exp or a sin as one FLOP) and
  ``bytes accessed``. Launches: the instructions of the entry computation that run as device
  kernels (fusions, custom calls, dots, convolutions, copies...; not parameters, constants,
  tuples or bitcasts).
- **TensorFlow with XLA** (``jit_compile=True``, ``source="xla_cost_analysis"``): TensorFlow's own
  HLO for the function (``experimental_get_compiler_ir(...)(stage="hlo_serialized")``, traced
  from ``tf.TensorSpec``), converted to StableHLO and compiled by jax's XLA for the CPU, then the
  same cost analysis and launch count. The HLO is TensorFlow's (its tf2xla lowering: a ``Roll``
  becomes a concatenate and a slice); the optimizing compiler is jax's build of XLA, not
  TensorFlow's.
- **TensorFlow graphs** (``source="tf_graph_ops"``): the ``tf.function`` traced at the size's
  shapes; each op that feeds the outputs and runs a kernel is one launch, and moves its inputs'
  and outputs' bytes. Ops that run no device kernel are skipped (:data:`NO_KERNEL_OPS`:
  placeholders, constants, identities, no-ops, and reshapes and shape queries, which alias or
  read metadata). FLOPs are the analytic count: a graph op's arithmetic is the computation's.
- **Fallback** (``source="analytic"``): if a source fails, the analytic counts and one launch,
  with ``note`` saying what failed.

Each result is cached per (workload, framework, preset, variant, dtype, precision, xla): a
process computes it once, outside any measurement window. Units: FLOPs and bytes per call.
"""

from __future__ import annotations

import re
import threading
import time
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from kernels import frameworks as fw

if TYPE_CHECKING:  # annotations only: kernels.spec imports this module for derived counts
    from kernels.spec import KernelSpec

WorkKind = Literal["matmul", "conv", "elementwise"]
"""How a call's arithmetic runs: a call that convolves is ``conv``, else one that multiplies
matrices ``matmul`` (both on the tensor cores, each at the rate its libraries reach), else
``elementwise`` (ALU work). The simulated GPU charges each at its board's achieved rate."""
WorkSource = Literal["xla_cost_analysis", "tf_graph_ops", "analytic"]
WORK_SOURCES: tuple[str, ...] = ("xla_cost_analysis", "tf_graph_ops", "analytic")

NO_KERNEL_OPS: frozenset[str] = frozenset(
    {
        "Placeholder", "Const", "Identity", "IdentityN", "NoOp", "StopGradient",
        "Reshape", "Squeeze", "ExpandDims", "Shape", "ShapeN", "Size", "Rank",
        "BroadcastGradientArgs",
    }
)
"""TensorFlow op types that launch no device kernel (they alias a buffer or read metadata)."""

TRANSCENDENTAL_OPS: frozenset[str] = frozenset(
    {"Exp", "Expm1", "Log", "Log1p", "Tanh", "Sigmoid", "Selu", "Elu", "Softplus", "Erf",
     "Sin", "Cos", "Pow", "Rsqrt", "Sqrt", "TanhGrad", "SigmoidGrad"}
)
"""TensorFlow op types that evaluate one transcendental function per output element."""

MATMUL_OPS: frozenset[str] = frozenset({"MatMul", "BatchMatMul", "BatchMatMulV2",
                                        "BatchMatMulV3", "Einsum"})
"""TensorFlow op types that multiply matrices."""

NO_LAUNCH_HLO: frozenset[str] = frozenset(
    {"parameter", "constant", "tuple", "get-tuple-element", "bitcast", "after-all"}
)
"""HLO opcodes of an entry computation that run no device kernel."""

_TF_CPU = "/job:localhost/replica:0/task:0/device:CPU:0"
_NOTE_CHARS = 300


@dataclass(frozen=True)
class CompiledWork:
    """The work of one call as compiled, the figures a simulated GPU charges for it.

    Attributes:
        flops: floating-point operations of one call.
        bytes_moved: bytes one call reads and writes in device memory.
        launches: device kernels one call launches.
        source: where the figures come from: ``"xla_cost_analysis"``, ``"tf_graph_ops"`` or
            ``"analytic"``.
        note: why the figures are analytic when another source was tried; None otherwise.
        analysis_s: seconds the analysis took (trace, lower, compile).
        transcendentals: exp, log, tanh... of one call (included in ``flops``, one each).
        kind: ``"conv"`` if the call convolves, else ``"matmul"`` if it multiplies matrices,
            else ``"elementwise"``: which achieved rate the simulated GPU charges its FLOPs at.
    """

    flops: float
    bytes_moved: float
    launches: int
    source: WorkSource
    note: str | None = None
    analysis_s: float = 0.0
    transcendentals: float = 0.0
    kind: WorkKind = "elementwise"


_cache: dict[tuple[object, ...], CompiledWork] = {}
_lock = threading.RLock()  # re-entered: a TF graph without counts asks JAX for its FLOPs


def compiled_work(
    spec: KernelSpec,
    framework: str,
    preset: str,
    dtype: str = "float32",
    precision: str = "default",
    xla: bool = False,
    variant: str | None = None,
) -> CompiledWork:
    """The work one call does as ``framework`` compiles it at ``preset``; cached per options.

    Args:
        spec: the workload.
        framework: ``"jax"`` or ``"tensorflow"``.
        preset: the size preset to analyse (need not be the one the kernel runs at).
        dtype: a dtype name.
        precision: a precision name.
        xla: TensorFlow only: analyse the XLA-compiled function (JAX always is).
        variant: a shape variant, or None for the default one.

    Returns:
        The compiled work; analytic counts with a ``note`` if the framework's source failed.

    Raises:
        KernelOptionError: an option the spec does not have (nothing is traced then).
    """
    variant = spec.validate(preset, dtype, precision, variant)
    xla = True if framework == "jax" else bool(xla)
    key = (spec.name, framework, preset, variant, dtype, precision, xla)
    with _lock:
        work = _cache.get(key)
        if work is None:
            work = _analyse(spec, framework, (preset, variant), dtype, precision, xla)
            _cache[key] = work
    return work


def _analyse(
    spec: KernelSpec, framework: str, where: tuple[str, str], dtype: str, precision: str,
    xla: bool,
) -> CompiledWork:
    preset, variant = where
    size = spec.sizes[preset][variant]
    counts = None if spec.count_fn is None else spec.counts(preset, dtype, variant)
    source = "xla_cost_analysis" if xla else "tf_graph_ops"
    start = time.perf_counter()
    try:
        if framework == "jax":
            counted = _jax_work(spec, size, dtype, precision)
        elif xla:
            counted = _tf_xla_work(spec, size, dtype, precision)
        else:
            known = counts or spec.counts(preset, dtype, variant)  # derived from JAX or XLA
            counted = _tf_graph_work(spec, size, dtype, precision)._replace(flops=known.flops)
    except Exception as e:  # noqa: BLE001 - any failure of a source falls back, and says why
        if counts is None:
            return CompiledWork(0.0, 0.0, 1, "analytic", note=f"{type(e).__name__}: {e}"[:200])
        note = f"{source} failed, analytic counts charged: {type(e).__name__}: {e}"
        return CompiledWork(
            float(counts.flops), float(counts.bytes_moved), 1, "analytic",
            note=" ".join(note.split())[:_NOTE_CHARS], analysis_s=time.perf_counter() - start,
        )
    return CompiledWork(
        float(counted.flops), float(counted.bytes_moved), int(counted.launches),
        source,  # type: ignore[arg-type]
        analysis_s=time.perf_counter() - start,
        transcendentals=float(counted.transcendentals), kind=counted.kind,
    )


class Counted(NamedTuple):
    """What one source counted of a call (``CompiledWork`` less its provenance)."""

    flops: float
    bytes_moved: float
    launches: int
    transcendentals: float
    kind: WorkKind


# --- XLA ------------------------------------------------------------------------------------
def xla_work(cost: Any, hlo_text: str) -> Counted:
    """FLOPs, bytes, launches, transcendentals and kind from XLA's cost analysis and the
    optimized HLO's text.

    Args:
        cost: what ``cost_analysis()`` returned (a dict, or a one-element list of one).
        hlo_text: the optimized module, as text.

    Returns:
        ``flops + transcendentals``, ``bytes accessed``, the launches, the transcendentals and
        the kind (:func:`hlo_kind`).

    Raises:
        ValueError: the analysis has no byte count, or the module launches nothing.
    """
    if isinstance(cost, (list, tuple)):
        cost = cost[0]
    nbytes = float(cost.get("bytes accessed", 0.0))
    if nbytes <= 0:
        raise ValueError(f"XLA's cost analysis has no 'bytes accessed': {sorted(cost)}")
    transcendentals = float(cost.get("transcendentals") or 0.0)
    flops = float(cost.get("flops") or 0.0) + transcendentals
    launches = count_launches(hlo_text)
    if launches < 1:
        raise ValueError("the optimized HLO's entry computation launches no kernel")
    return Counted(flops, nbytes, launches, transcendentals, hlo_kind(hlo_text))


def hlo_kind(hlo_text: str) -> WorkKind:
    """``"conv"`` if any computation of the module convolves (XLA's ``convolution`` or a cuDNN
    custom call), else ``"matmul"`` if any multiplies matrices (``dot`` or a cuBLAS call), else
    ``"elementwise"``."""
    opcodes = set(_OPCODE.findall(hlo_text))
    targets = hlo_text.lower()
    if "convolution" in opcodes or "cudnn$conv" in targets:
        return "conv"
    if "dot" in opcodes or "cublas" in targets:
        return "matmul"
    return "elementwise"


_OPCODE = re.compile(r"(?<![\w.%\-])([a-z][a-z0-9\-]*)\(")


def count_launches(hlo_text: str) -> int:
    """Count the device kernels an optimized HLO module's entry computation launches.

    Every instruction of the ``ENTRY`` computation is one launch except those in
    :data:`NO_LAUNCH_HLO`. A ``while`` or ``call`` counts once, however often its body runs
    (none of the workloads has one).
    """
    lines = hlo_text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("ENTRY"))
    launches = 0
    for line in lines[start + 1 :]:
        if line.strip() == "}":
            break
        _, sep, rest = line.partition(" = ")
        match = _OPCODE.search(rest) if sep else None
        if match and match.group(1) not in NO_LAUNCH_HLO:
            launches += 1
    return launches


def _jax_work(spec: KernelSpec, size: Any, dtype: str, precision: str) -> Counted:
    jax = fw.import_jax()
    np_dtype = fw.numpy_dtype(dtype)
    args = [jax.ShapeDtypeStruct(shape, np_dtype) for shape in spec.shapes_fn(size)]
    with fw.jax_precision_scope(precision):
        compiled = jax.jit(spec.jax_fn(size)).lower(*args).compile()
    return xla_work(compiled.cost_analysis(), compiled.as_text())


def _tf_specs(tf: Any, spec: KernelSpec, size: Any, dtype: str) -> list[Any]:
    return [tf.TensorSpec(shape, tf.as_dtype(dtype)) for shape in spec.shapes_fn(size)]


def _tf_positional(spec: KernelSpec, size: Any) -> Any:
    """The TF function with positional tensor arguments only: ``tf.nn.selu``'s ``name=None``
    would otherwise enter the signature as a None spec, which the compiler IR cannot take."""
    fn = spec.tf_fn(size)

    def positional(*tensors: Any) -> Any:
        return fn(*tensors)

    return positional


def _tf_xla_work(spec: KernelSpec, size: Any, dtype: str, precision: str) -> Counted:
    tf = fw.import_tensorflow()
    function = tf.function(_tf_positional(spec, size), jit_compile=True, autograph=False)
    with fw.tf_precision_scope(precision), warnings.catch_warnings():
        # device_name is "being deprecated", but platform_name still draws a random op to find
        # the device, which op determinism refuses without a seed.
        warnings.simplefilter("ignore")
        ir = function.experimental_get_compiler_ir(*_tf_specs(tf, spec, size, dtype))
        proto = ir(stage="hlo_serialized", device_name=_TF_CPU)
    fw.import_jax()
    import jax.extend.backend
    from jax._src.lib import xla_client as xc  # the one route from an HLO proto to a compile

    backend = jax.extend.backend.get_backend("cpu")
    module = xc._xla.mlir.hlo_to_stablehlo(proto)
    executable = backend.compile_and_load(
        module,
        executable_devices=xc.DeviceList(tuple(backend.local_devices()[:1])),
        compile_options=xc.CompileOptions(),
    )
    return xla_work(executable.cost_analysis(), executable.hlo_modules()[0].to_string())


# --- TensorFlow graphs ----------------------------------------------------------------------
def _tf_graph_work(spec: KernelSpec, size: Any, dtype: str, precision: str) -> Counted:
    """The graph's bytes, launches, transcendentals and kind; FLOPs 0 (the caller's count)."""
    tf = fw.import_tensorflow()
    function = tf.function(_tf_positional(spec, size), autograph=False)
    with fw.tf_precision_scope(precision):
        concrete = function.get_concrete_function(*_tf_specs(tf, spec, size, dtype))
    nbytes, launches = graph_work(concrete.graph)
    ops = [op for op in _ops_feeding(concrete.graph.outputs) if op.type not in NO_KERNEL_OPS]
    transcendentals = sum(
        _tensor_bytes(t) / t.dtype.size for op in ops if op.type in TRANSCENDENTAL_OPS
        for t in op.outputs
    )
    types = {op.type for op in ops}
    kind: WorkKind = ("conv" if any("Conv" in t for t in types)
                      else "matmul" if types & MATMUL_OPS else "elementwise")
    return Counted(0.0, nbytes, launches, float(transcendentals), kind)


def graph_work(graph: Any) -> tuple[float, int]:
    """Bytes and launches of one run of a TensorFlow graph, one kernel per op.

    Only ops that feed the graph's outputs count (TensorFlow prunes the rest when it instantiates
    a function); ops in :data:`NO_KERNEL_OPS` launch nothing and move nothing.

    Args:
        graph: a ``FuncGraph`` with fully defined shapes (a concrete function's ``graph``).

    Returns:
        ``(bytes, launches)``: each launched op's input and output bytes summed, and the count.

    Raises:
        ValueError: a tensor's shape is not fully defined, or an op calls another function
            (whose ops this count would miss).
    """
    nbytes = 0.0
    launches = 0
    for op in _ops_feeding(graph.outputs):
        if op.type in NO_KERNEL_OPS:
            continue
        if op.type in ("PartitionedCall", "StatefulPartitionedCall"):
            raise ValueError(f"op {op.name} calls a function; its ops are not counted")
        nbytes += sum(_tensor_bytes(t) for t in (*op.inputs, *op.outputs))
        launches += 1
    if launches < 1:
        raise ValueError("the graph launches no kernel")
    return nbytes, launches


def _ops_feeding(outputs: Any) -> list[Any]:
    seen: dict[str, Any] = {}
    stack = [t.op for t in outputs]
    while stack:
        op = stack.pop()
        if op.name in seen:
            continue
        seen[op.name] = op
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
    return list(seen.values())


def _tensor_bytes(tensor: Any) -> float:
    if not tensor.shape.is_fully_defined():
        if tensor.op.type in NO_KERNEL_OPS and tensor.dtype.is_integer:
            return 0.0  # a gradient's reduction axes (BroadcastGradientArgs): host metadata
        raise ValueError(f"tensor {tensor.name} has no fully defined shape: {tensor.shape}")
    return float(tensor.shape.num_elements() * tensor.dtype.size)


# --- the table in docs/simulator.md ---------------------------------------------------------
def work_table(specs: Iterable[KernelSpec], preset: str = "gpu", dtype: str = "float32") -> str:
    """A Markdown table of each workload's compiled work per framework at ``preset``.

    Columns: GFLOP, GB and launches per call for JAX, TF graph and TF+XLA, and the TF graph's
    bytes and launches over JAX's. Run ``python -m kernels.cost`` to print it for the
    registry's workloads.

    Args:
        specs: the workloads, one row each.
        preset: the size preset to analyse.
        dtype: a dtype name.
    """
    routes = (
        ("JAX", "jax", True), ("TF graph", "tensorflow", False), ("TF+XLA", "tensorflow", True)
    )
    head = ["workload", "analytic GFLOP / GB"]
    head += [f"{name} GFLOP / GB / launches" for name, _, _ in routes]
    head += ["TF graph / JAX: bytes, launches"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for spec in specs:
        counts = spec.counts(preset, dtype)
        works = [compiled_work(spec, fw_, preset, dtype, xla=xla) for _, fw_, xla in routes]
        cells = [spec.name, f"{counts.flops / 1e9:.4g} / {counts.bytes_moved / 1e9:.3g}"]
        for work in works:
            mark = "" if work.source != "analytic" else " (analytic)"
            cells.append(
                f"{work.flops / 1e9:.4g} / {work.bytes_moved / 1e9:.3g} / {work.launches}{mark}"
            )
        jax_work, graph = works[0], works[1]
        cells.append(
            f"{graph.bytes_moved / jax_work.bytes_moved:.2f}x, "
            f"{graph.launches / jax_work.launches:.2f}x"
        )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":  # run as a program, never on import: the registry imports this
    from kernels.registry import WORKLOADS

    print(work_table(WORKLOADS.values()))
