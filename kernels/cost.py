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
- **PyTorch eager** (``source="torch_dispatch_ops"``): the function run once under a
  ``TorchDispatchMode`` over ``FakeTensor`` inputs of the size's shapes (nothing allocated); each
  ATen op that runs a kernel is one launch and moves its tensor inputs' and outputs' bytes (a
  broadcast input counted once per distinct element). Views, aliases and empty allocations
  launch nothing (:data:`NO_KERNEL_TORCH_OPS`). FLOPs are the analytic count, or where the
  workload has none, ``torch.utils.flop_counter.FlopCounterMode``'s (matmuls and convolutions).
- **PyTorch compiled** (``source="inductor_kernels"``): the function traced at those fake shapes
  (``make_fx``) and compiled by Inductor (``compile_fx``, what ``torch.compile`` runs after
  Dynamo) for the CPU; bytes are Inductor's own count over the scheduled kernels
  (``torch._inductor.metrics.num_bytes_accessed``, each kernel's buffers read and written),
  launches the kernels it scheduled (its generated kernels plus library calls such as a GEMM).
  FLOPs and the kind as for eager.
- **Fallback** (``source="analytic"``): if a source fails, the analytic counts and one launch,
  with ``note`` saying what failed.

**A GPU's kernels, not the CPU's conversions** (:data:`NARROW_DTYPES`): XLA's CPU backend has no
bfloat16 or float16 dot, so it converts both operands to float32 around each dot and the result
back (a bf16 GEMM at the ``gpu`` preset: 4 launches and 5x the analytic bytes), where a GPU runs
one dot in the narrow dtype. When an XLA route (JAX, TensorFlow with XLA) compiles for the CPU in a
narrow dtype, the call is charged the float32 program's work with its bytes scaled by the narrow
item size over float32's (2 / 4): the same FLOPs, launches and fusions, at half the width, which is
the program the GPU's XLA builds from the same step. Every built-in workload computes in one dtype
throughout, so the scaling is exact for them; a step mixing widths would be charged its float32
bytes at the narrow ratio. On a GPU backend the program is analysed as it is.

Each result is cached per (workload, framework, preset, variant, dtype, precision, xla,
compile): a process computes it once, outside any measurement window, and keeps it on disk for
the next process (:mod:`kernels.work_cache`: every worker of a sweep, a resume). Units: FLOPs and
bytes per call.
"""

from __future__ import annotations

import logging
import re
import threading
import time
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from kernels import frameworks as fw
from kernels import work_cache

if TYPE_CHECKING:  # annotations only: kernels.spec imports this module for derived counts
    from kernels.spec import KernelSpec, Sized

WorkKind = Literal["matmul", "conv", "elementwise"]
"""How a call's arithmetic runs: a call that convolves is ``conv``, else one that multiplies
matrices ``matmul`` (both on the tensor cores, each at the rate its libraries reach), else
``elementwise`` (ALU work). The simulated GPU charges each at its board's achieved rate."""
WorkSource = Literal[
    "xla_cost_analysis", "tf_graph_ops", "torch_dispatch_ops", "inductor_kernels", "analytic"
]
WORK_SOURCES: tuple[str, ...] = (
    "xla_cost_analysis", "tf_graph_ops", "torch_dispatch_ops", "inductor_kernels", "analytic"
)

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

NARROW_DTYPES: dict[str, int] = {"bfloat16": 2, "float16": 2}
"""Dtypes XLA's CPU backend computes by converting to float32 around each dot, and their bytes
per element: a call in one of them is charged as the GPU runs it (the module docstring)."""

_TF_CPU = "/job:localhost/replica:0/task:0/device:CPU:0"
_NOTE_CHARS = 300


@dataclass(frozen=True)
class CompiledWork:
    """The work of one call as compiled, the figures a simulated GPU charges for it.

    Attributes:
        flops: floating-point operations of one call.
        bytes_moved: bytes one call reads and writes in device memory.
        launches: device kernels one call launches.
        source: where the figures come from: ``"xla_cost_analysis"``, ``"tf_graph_ops"``,
            ``"torch_dispatch_ops"`` (PyTorch eager), ``"inductor_kernels"`` (``torch.compile``)
            or ``"analytic"``.
        note: why the figures are analytic when another source was tried; None otherwise.
        analysis_s: seconds the analysis took (trace, lower, compile).
        transcendentals: exp, log, tanh... of one call (included in ``flops``, one each).
        kind: ``"conv"`` if the call convolves, else ``"matmul"`` if it multiplies matrices,
            else ``"elementwise"``: which achieved rate the simulated GPU charges its FLOPs at.
        xla_memory: JAX only: XLA's memory analysis of the same compile, (argument, output,
            temporary + code) bytes of one call (:func:`kernel_memory`); None elsewhere.
    """

    flops: float
    bytes_moved: float
    launches: int
    source: WorkSource
    note: str | None = None
    analysis_s: float = 0.0
    transcendentals: float = 0.0
    kind: WorkKind = "elementwise"
    xla_memory: tuple[int, int, int] | None = None


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
    compile: bool = False,  # noqa: A002 - KernelOptions.compile's name
) -> CompiledWork:
    """The work one call does as ``framework`` compiles it at ``preset``; cached per options.

    Args:
        spec: the workload.
        framework: ``"jax"``, ``"tensorflow"`` or ``"pytorch"``.
        preset: the size preset to analyse (need not be the one the kernel runs at).
        dtype: a dtype name.
        precision: a precision name.
        xla: TensorFlow only: analyse the XLA-compiled function (JAX always is).
        variant: a shape variant, or None for the default one.
        compile: PyTorch only: analyse ``torch.compile``'s kernels (else the eager ops).

    Returns:
        The compiled work; analytic counts with a ``note`` if the framework's source failed.
        The options are taken as checked (:meth:`KernelSpec.validate`, once, where they came in).
    """
    variant = spec.default_variant if variant is None else variant
    xla = framework == "jax" or (framework == "tensorflow" and bool(xla))
    compile = framework == "pytorch" and bool(compile)
    key = (spec.name, framework, preset, variant, dtype, precision, xla, compile)
    with _lock:
        work = _cache.get(key)
        if work is None:  # not yet in this process: kept on disk, else analysed (and kept)
            work = _cache[key] = work_cache.kept(
                spec, framework, key[2:], CompiledWork,
                lambda: _analyse(spec, (framework, xla, compile), (preset, variant), dtype,
                                 precision))
    return work


def work_source(framework: str, xla: bool = False, compile: bool = False) -> WorkSource:  # noqa: A002
    """Where the work of ``framework`` (with XLA, or compiled) is taken from when it succeeds."""
    if framework == "pytorch":
        return "inductor_kernels" if compile else "torch_dispatch_ops"
    return "xla_cost_analysis" if framework == "jax" or xla else "tf_graph_ops"


def _analyse(
    spec: KernelSpec, route: tuple[str, bool, bool], where: tuple[str, str], dtype: str,
    precision: str,
) -> CompiledWork:
    framework, xla, compiled = route
    preset, variant = where
    size = spec.sizes[preset][variant]
    counts = None if spec.count_fn is None else spec.count_fn(size, fw.ITEMSIZE[dtype])
    source = work_source(framework, xla, compiled)
    start = time.perf_counter()
    try:
        if framework == "jax":
            counted = _narrowed(_jax_work, spec, size, dtype, precision, _jax_on_cpu())
        elif framework == "pytorch":
            counted = _torch_work(spec, size, dtype, counts, compiled)
        elif xla:
            counted = _narrowed(_tf_xla_work, spec, size, dtype, precision, True)
        else:
            known = counts or _first_compiled(spec, preset, dtype, variant)
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
        source,
        analysis_s=time.perf_counter() - start,
        transcendentals=float(counted.transcendentals), kind=counted.kind,
        xla_memory=counted.memory,
    )


def _first_compiled(spec: KernelSpec, preset: str, dtype: str, variant: str) -> CompiledWork:
    """The FLOPs a TensorFlow graph of a workload without ``count_fn`` is charged: its first
    framework's step compiled (JAX, else TensorFlow with XLA), as its derived counts are.

    Raises:
        RuntimeError: that compile could not say either.
    """
    work = compiled_work(spec, spec.frameworks[0], preset, dtype, "default", True, variant,
                         compile=True)
    if work.source == "analytic":
        raise RuntimeError(f"no compiled work of {spec.frameworks[0]} to count: {work.note}")
    return work


class Counted(NamedTuple):
    """What one source counted of a call (``CompiledWork`` less its provenance)."""

    flops: float
    bytes_moved: float
    launches: int
    transcendentals: float
    kind: WorkKind
    memory: tuple[int, int, int] | None = None  # XLA's memory analysis (CompiledWork.xla_memory)


# --- XLA ------------------------------------------------------------------------------------
def _narrowed(analyse: Any, spec: KernelSpec, size: Any, dtype: str, precision: str,
              on_cpu: bool) -> Counted:
    """``analyse``'s count of the call, as a GPU runs it: in a dtype the CPU backend lacks
    (:data:`NARROW_DTYPES`), the float32 program's count with its bytes at the narrow width."""
    if dtype not in NARROW_DTYPES or not on_cpu:
        return analyse(spec, size, dtype, precision)
    wide = analyse(spec, size, "float32", "default")  # its memory is not the narrow program's
    return wide._replace(bytes_moved=wide.bytes_moved * NARROW_DTYPES[dtype] / 4, memory=None)


def _jax_on_cpu() -> bool:
    """Whether JAX compiles for the CPU here (its default backend)."""
    return fw.import_jax().default_backend() == "cpu"


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
    args = [jax.ShapeDtypeStruct(shape, dtype) for shape in spec.shapes_fn(size)]  # our names
    with fw.jax_precision_scope(precision):
        compiled = jax.jit(spec.jax_fn(size)).lower(*args).compile()
    counted = xla_work(compiled.cost_analysis(), compiled.as_text())
    try:  # the same compile answers the memory question (kernel_memory)
        stats = compiled.memory_analysis()
        return counted._replace(memory=(
            int(stats.argument_size_in_bytes), int(stats.output_size_in_bytes),
            int(stats.temp_size_in_bytes) + int(stats.generated_code_size_in_bytes)))
    except Exception:  # noqa: BLE001 - a backend without memory analysis: the estimate stands
        return counted


@dataclass(frozen=True)
class KernelMemory:
    """The device memory one call of a compiled kernel needs, in bytes.

    Attributes:
        inputs: its input arrays (from the workload's shapes).
        output: its output.
        temporaries: what the compiled program allocates for itself while it runs (XLA's
            ``memory_analysis()`` temp and code sizes on the JAX path; an estimate elsewhere).
        source: ``"xla_memory_analysis"`` or ``"estimate"`` (one output-sized buffer of
            temporaries, or the workload's own footprint where it has one).
        modelled: the workload's own modelled device memory of one call
            (:meth:`KernelSpec.peak_bytes`), the simulated GPU's in-use peak; None where it
            gives none.
    """

    inputs: int
    output: int
    temporaries: int
    source: str
    modelled: int | None


def kernel_memory(spec: KernelSpec, sized: Sized, framework: str,
                  precision: str = "default") -> KernelMemory:
    """The device memory of one call of ``spec`` at ``sized`` (its preset and dtype, read of the
    spec once by the planner: :meth:`KernelSpec.at`), known before anything is put on a device.

    On the JAX path the figures come from XLA's memory analysis of the step compiled with
    abstract shapes (the compile :func:`compiled_work` makes, cached per options); TensorFlow
    and PyTorch have no equivalent before the step runs, so their temporaries are estimated:
    the workload's modelled footprint beyond its inputs where it has one, else one buffer of
    the output's size.
    """
    itemsize = fw.ITEMSIZE[sized.dtype]
    inputs = sum(int(_prod(shape)) * itemsize for shape in sized.shapes)
    modelled = sized.modelled
    found = None
    if framework == "jax":  # XLA's memory analysis of the compile compiled_work makes
        found = compiled_work(spec, "jax", sized.preset, sized.dtype, precision).xla_memory
    if found is not None:
        args, output, temporaries = found
        return KernelMemory(max(args, inputs), output, temporaries, "xla_memory_analysis",
                            modelled)
    output = _output_bytes(spec, sized, (itemsize, inputs))
    temporaries = max(modelled - inputs - output, output) if modelled else output
    return KernelMemory(inputs, output, temporaries, "estimate", modelled)


def _prod(shape: Iterable[int]) -> int:
    total = 1
    for n in shape:
        total *= int(n)
    return total


_output_cache: dict[tuple[object, ...], int] = {}


def _output_bytes(spec: KernelSpec, sized: Sized, widths: tuple[int, int]) -> int:
    """One output's bytes from JAX's shape inference where JAX is there, else the largest
    input's (an elementwise or same-shape kernel's output); ``widths`` is (bytes per element,
    all inputs' bytes), as the caller counted them. Cached per workload, size and dtype in the
    process: the memory plan asks at every TensorFlow and PyTorch trial, and tracing a model's
    step (ResNet-50's, BERT's) takes a second or more each time."""
    key = (spec.name, spec.jax_fn, sized.preset, sized.size, sized.shapes, sized.dtype, widths)
    try:
        hash(key)
    except TypeError:  # a user's size that is not a tuple (a dict): traced each time
        return _traced_output_bytes(spec, sized, widths)
    with _lock:
        found = _output_cache.get(key)
        if found is None:
            found = _output_cache[key] = _traced_output_bytes(spec, sized, widths)
    return found


def _traced_output_bytes(spec: KernelSpec, sized: Sized, widths: tuple[int, int]) -> int:
    itemsize, inputs = widths
    if spec.jax_fn is not None:
        try:
            jax = fw.import_jax()
            args = [jax.ShapeDtypeStruct(s, sized.dtype) for s in sized.shapes]  # our dtype names
            out = jax.eval_shape(spec.jax_fn(sized.size), *args)
            return sum(int(_prod(leaf.shape)) * leaf.dtype.itemsize
                       for leaf in jax.tree_util.tree_leaves(out))
        except Exception:  # noqa: BLE001 - no JAX here: the estimate below
            pass
    return max((int(_prod(s)) * itemsize for s in sized.shapes), default=inputs)


def _tf_specs(tf: Any, spec: KernelSpec, size: Any, dtype: str) -> list[Any]:
    return [tf.TensorSpec(shape, tf.as_dtype(dtype)) for shape in spec.shapes_fn(size)]


def _tf_positional(spec: KernelSpec, size: Any) -> Any:
    """The TF function with positional tensor arguments only: ``tf.nn.selu``'s ``name=None``
    would otherwise enter the signature as a None spec, which the compiler IR cannot take."""
    return _positional(spec.tf_fn(size))


def _positional(fn: Any) -> Any:
    """``fn`` with positional tensor arguments only: a library function's keyword defaults
    (``tf.nn.selu``'s ``name``, ``torch.nn.functional.selu``'s ``inplace``) would otherwise be
    taken for inputs by a tracer that reads the signature (TF's compiler IR, ``make_fx``)."""

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


# --- PyTorch ---------------------------------------------------------------------------------
NO_KERNEL_TORCH_OPS: frozenset[str] = frozenset(
    {
        "aten.detach", "aten.lift_fresh", "aten.lift_fresh_copy", "aten.alias",
        "aten.empty", "aten.empty_like", "aten.empty_strided", "aten.new_empty",
        "aten.new_empty_strided", "aten._unsafe_view", "aten.sym_size", "aten.sym_stride",
        "aten.sym_numel", "aten.sym_storage_offset", "aten.is_same_size",
        "aten._local_scalar_dense",
    }
)
"""ATen ops (overload packets) that launch no device kernel: they alias a tensor, allocate
without writing, or read metadata. Every view op (``func.is_view``) is skipped too."""

TORCH_TRANSCENDENTAL_OPS: frozenset[str] = frozenset(
    {"exp", "expm1", "log", "log1p", "tanh", "sigmoid", "sin", "cos", "erf", "elu", "selu",
     "gelu", "silu", "softplus", "rsqrt", "sqrt", "pow", "tanh_backward", "sigmoid_backward",
     "elu_backward", "gelu_backward", "silu_backward", "_softmax", "_log_softmax"}
)
"""ATen op names (in place ``_`` stripped) that evaluate one transcendental per output element."""

TORCH_MATMUL_OPS: frozenset[str] = frozenset(
    {"mm", "bmm", "addmm", "baddbmm", "addbmm", "matmul", "linear", "dot", "mv", "einsum"}
)
"""ATen op names that multiply matrices."""


@dataclass
class TorchOps:
    """What a ``TorchDispatchMode`` saw of one eager call: bytes, launches, transcendentals and
    the names of the ATen ops that launched (``aten.add`` ...)."""

    nbytes: float = 0.0
    launches: int = 0
    transcendentals: float = 0.0
    names: set[str] = field(default_factory=set)

    def record(self, func: Any, inputs: Any, outputs: Any) -> None:
        """Count one ATen op: one launch, its tensors' bytes, unless it launches nothing."""
        name = str(func.overloadpacket)
        tensors_out = _torch_tensors(outputs)
        if func.is_view or name in NO_KERNEL_TORCH_OPS or not tensors_out:
            return
        self.nbytes += sum(torch_tensor_bytes(t) for t in (*_torch_tensors(inputs), *tensors_out))
        self.launches += 1
        self.names.add(name)
        if name.removeprefix("aten.").rstrip("_") in TORCH_TRANSCENDENTAL_OPS:
            self.transcendentals += sum(float(t.numel()) for t in tensors_out)

    @property
    def kind(self) -> WorkKind:
        """``conv``, ``matmul`` or ``elementwise``, by the ops that launched."""
        short = {n.removeprefix("aten.") for n in self.names}
        if any("convolution" in n for n in short):
            return "conv"
        return "matmul" if short & TORCH_MATMUL_OPS else "elementwise"


def torch_tensor_bytes(tensor: Any) -> float:
    """The bytes a kernel touches in ``tensor``: its distinct elements (a broadcast dimension,
    stride 0, counts once) times the element size."""
    elements = 1
    for extent, stride in zip(tensor.shape, tensor.stride(), strict=True):
        if stride != 0:
            elements *= int(extent)
    return float(elements * tensor.element_size())


def _torch_tensors(tree: Any) -> list[Any]:
    torch = fw.import_torch()
    from torch.utils._pytree import tree_leaves

    return [leaf for leaf in tree_leaves(tree) if isinstance(leaf, torch.Tensor)]


def _counting(ops: TorchOps) -> Any:
    """A ``TorchDispatchMode`` that records every ATen op it sees into ``ops``."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Counting(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            ops.record(func, (args, kwargs), out)
            return out

    return Counting()


def count_torch_ops(fn: Any, args: Any) -> TorchOps:
    """Run ``fn(*args)`` once eagerly under a ``TorchDispatchMode`` that counts every ATen op
    (forward and, for a training step, backward): see :class:`TorchOps`.

    Args:
        fn: a function of tensors (fake ones, so that nothing of the size is allocated).
        args: its tensor arguments.
    """
    fw.import_torch()
    ops = TorchOps()
    with _counting(ops):
        fn(*args)
    if ops.launches < 1:
        raise ValueError("the eager call launches no kernel")
    return ops


def inductor_work(fn: Any, args: Any) -> tuple[float, int]:
    """Bytes and kernels of ``fn`` compiled by Inductor at the shapes of ``args`` (fake tensors).

    ``make_fx`` traces ``fn`` to an ATen graph (a training step's backward included), and
    ``compile_fx`` compiles it as ``torch.compile`` would after Dynamo. Inductor's scheduler then
    says what each kernel reads and writes (``metrics.num_bytes_accessed``, kept only while its
    ``inductor_metrics`` log is on, here without a handler) and which kernels run
    (``metrics.nodes_num_elem``: fused kernels, and library calls such as a GEMM).

    Returns:
        ``(bytes, launches)`` of one call.

    Raises:
        ValueError: the compiled graph runs no kernel.
    """
    torch = fw.import_torch()
    from torch._inductor import metrics
    from torch._inductor.compile_fx import compile_fx
    from torch.fx.experimental.proxy_tensor import make_fx

    log = torch._logging.getArtifactLogger("torch._inductor.compile_fx", "inductor_metrics")
    level, propagate = log.level, log.propagate
    log.setLevel(logging.INFO)
    log.propagate = False
    try:
        metrics.reset()
        compile_fx(make_fx(fn, tracing_mode="fake")(*args), list(args))
        kernels = [node for node, _ in metrics.nodes_num_elem
                   if type(node).__name__ != "NopKernelSchedulerNode"]
        nbytes = float(metrics.num_bytes_accessed)
    finally:
        log.setLevel(level)
        log.propagate = propagate
    if not kernels:
        raise ValueError("Inductor scheduled no kernel")
    return nbytes, len(kernels)


def _torch_work(
    spec: KernelSpec, size: Any, dtype: str, counts: Any, compiled: bool,
) -> Counted:
    """Eager ops (or Inductor's kernels) of the PyTorch function over fake tensors of ``size``'s
    shapes; FLOPs the analytic count, else ``FlopCounterMode``'s."""
    torch = fw.import_torch()
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode

    # A step may build its module on the meta device (a buffer such as BatchNorm's counter is
    # then a meta tensor, not a fake one): such tensors are taken in as fakes.
    with FakeTensorMode(allow_non_fake_inputs=True):
        args = [torch.empty(shape, dtype=getattr(torch, dtype)) for shape in spec.shapes_fn(size)]
        fn = _positional(spec.torch_fn(size))
        with FlopCounterMode(display=False) as flop_counter:
            ops = count_torch_ops(fn, args)
    if counts is not None:
        flops = float(counts.flops)
    else:  # matmuls and convolutions, and one FLOP per transcendental as XLA's route counts
        flops = float(flop_counter.get_total_flops()) + ops.transcendentals
    nbytes, launches = ops.nbytes, ops.launches
    if compiled:
        nbytes, launches = inductor_work(fn, args)
    return Counted(flops, nbytes, launches, ops.transcendentals, ops.kind)


# --- a user's own call (the window API charges it to the simulated GPU) ---------------------
def jax_call_work(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> CompiledWork:
    """The work of one call of a JAX function at these arguments' shapes, as XLA compiled it
    (``source="xla_cost_analysis"``, the route of a workload's JAX step): ``fn`` as it is if it
    is already ``jax.jit``-ed (its static arguments kept), else ``jax.jit(fn)``. Lowering and
    compiling run nothing; the compile is the call's own (the first call compiles anyway).

    Raises:
        Exception: whatever JAX raises for a function it cannot lower (the caller falls back).
    """
    import jax

    start = time.perf_counter()
    jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
    compiled = jitted.lower(*args, **kwargs).compile()
    counted = xla_work(compiled.cost_analysis(), compiled.as_text())
    return CompiledWork(counted.flops, counted.bytes_moved, counted.launches, "xla_cost_analysis",
                        analysis_s=time.perf_counter() - start,
                        transcendentals=counted.transcendentals, kind=counted.kind)


def torch_call_work(
    fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Any, CompiledWork]:
    """Run one eager PyTorch call for real, counting its ATen ops as they run
    (``source="torch_dispatch_ops"``, the route of a workload's eager step: :class:`TorchOps`)
    and its FLOPs (``FlopCounterMode``'s matmuls and convolutions, plus one per transcendental).

    Counting the real call, not one over fake tensors, leaves a training step's parameters and
    optimizer state as the call left them (a fake run would put fake tensors in an optimizer's
    lazily made state). Only this call pays the counting.

    Returns:
        The call's own output, and its work.

    Raises:
        ValueError: the call launched no kernel (nothing is lost: the call ran).
    """
    from torch.utils.flop_counter import FlopCounterMode

    ops = TorchOps()
    start = time.perf_counter()
    with FlopCounterMode(display=False) as flop_counter, _counting(ops):
        out = fn(*args, **kwargs)
    flops = float(flop_counter.get_total_flops()) + ops.transcendentals
    work = CompiledWork(flops, ops.nbytes, max(ops.launches, 1), "torch_dispatch_ops",
                        analysis_s=time.perf_counter() - start,
                        transcendentals=ops.transcendentals, kind=ops.kind,
                        note=None if ops.launches else "the call launched no kernel")
    return out, work


# --- the table in docs/simulator.md ---------------------------------------------------------
def work_table(specs: Iterable[KernelSpec], preset: str = "gpu", dtype: str = "float32") -> str:
    """A Markdown table of each workload's compiled work per framework at ``preset``.

    Columns: GFLOP, GB and launches per call for JAX, TF graph, TF+XLA, PyTorch eager and
    PyTorch compiled (``-`` where the workload lacks the framework), and the TF graph's and
    PyTorch eager's bytes over JAX's. Run ``python -m kernels.cost`` to print it for the
    registry's workloads.

    Args:
        specs: the workloads, one row each.
        preset: the size preset to analyse.
        dtype: a dtype name.
    """
    routes = (("JAX", "jax", False), ("TF graph", "tensorflow", False),
              ("TF+XLA", "tensorflow", True), ("PyTorch eager", "pytorch", False),
              ("PyTorch compiled", "pytorch", True))
    head = ["workload", "analytic GFLOP / GB"]
    head += [f"{name} GFLOP / GB / launches" for name, _, _ in routes]
    head += ["bytes over JAX's: TF graph, PyTorch eager, compiled"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for spec in specs:
        counts = spec.counts(preset, dtype)
        works = [
            compiled_work(spec, fw_, preset, dtype, xla=flag, compile=flag)
            if fw_ in spec.frameworks else None
            for _, fw_, flag in routes
        ]
        cells = [spec.name, f"{counts.flops / 1e9:.4g} / {counts.bytes_moved / 1e9:.3g}"]
        cells += [_work_cell(work) for work in works]
        base = works[0]
        cells.append(", ".join(
            "-" if work is None or base is None else f"{work.bytes_moved / base.bytes_moved:.2f}x"
            for work in (works[1], works[3], works[4])
        ))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _work_cell(work: CompiledWork | None) -> str:
    if work is None:
        return "-"
    mark = "" if work.source != "analytic" else " (analytic)"
    return f"{work.flops / 1e9:.4g} / {work.bytes_moved / 1e9:.3g} / {work.launches}{mark}"


if __name__ == "__main__":  # run as a program, never on import: the registry imports this
    from kernels.registry import KERNELS, WORKLOADS

    # The kernels only: a model's compiled PyTorch analysis at gpu takes minutes.
    print(work_table(WORKLOADS[name] for name in KERNELS))
