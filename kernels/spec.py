"""What a workload is, apart from any framework: sizes, dtypes, precisions and its work counts.

A :class:`Workload` (also named :class:`KernelSpec`) describes one workload: the built-in kernels,
the study's models and a user's own step are all one of these (``kernels.registry`` finds them by
name, by an entry point of the ``dvfs.workloads`` group, or by a ``module:factory`` target). It
answers, without importing any framework and without allocating anything, how much work one
call does (:class:`WorkCounts`) and which compute roof applies (:meth:`KernelSpec.peak`), so a
simulator or a planner can use it cheaply. The same spec carries the hooks
:func:`kernels.registry.build_kernel` uses to make inputs, the float64 reference and the JAX,
TensorFlow and PyTorch functions. A built-in kernel module names its hooks by one convention
(:data:`HOOK_NAMES`) and ends with ``SPEC = KernelSpec(..., **module_hooks(globals()))``.

Units and conventions:

- ``flops``: floating-point operations of one call, counted by hand from the computation: a
  multiply-add is 2, each add, multiply, compare-select and transcendental evaluation (exp, sin,
  tanh, ...) is 1. It is the work a roofline divides by a FLOP/s roof, not an instruction count.
- ``bytes_moved``: the fewest bytes one call must move to and from device memory: every input read
  once and every output written once, in the kernel's dtype; intermediates are assumed to stay
  on chip.
- Size presets: ``tiny`` (tests: well under a second on a CPU), ``cpu`` (the default off a GPU),
  ``gpu`` (fills a modern GPU).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Literal, NamedTuple

from kernels.cost import compiled_work
from kernels.frameworks import ITEMSIZE

Peak = Literal["fp32", "tf32", "bf16", "fp16", "fp8", "fp64"]
Unit = Literal["TFLOP/s", "GB/s", "samples/s", "tokens/s"]
UNITS: tuple[str, ...] = ("TFLOP/s", "GB/s", "samples/s", "tokens/s")

PRESETS: tuple[str, ...] = ("tiny", "cpu", "gpu")


class KernelOptionError(ValueError):
    """An unknown preset, dtype, precision, variant or framework; the message lists what exists."""


class UnknownKernelError(KernelOptionError):
    """An unknown workload name; the message lists the names that exist."""


class WorkCounts(NamedTuple):
    """The work of one kernel call.

    Attributes:
        flops: floating-point operations (see the module docstring for the convention).
        bytes_moved: the fewest bytes one call must move to and from memory.
    """

    flops: float
    bytes_moved: float

    @property
    def intensity(self) -> float:
        """Arithmetic intensity in FLOP per byte."""
        return self.flops / self.bytes_moved


class Sized(NamedTuple):
    """A workload at one size preset in one dtype, as a planner reads it: asked of the spec once
    (:meth:`KernelSpec.at`) and handed on, so that what it holds is not asked again.

    Attributes:
        preset: the size preset.
        dtype: the dtype its arrays hold.
        size: the size itself (the default variant's).
        shapes: its inputs' shapes (``shapes_fn``).
        modelled: its modelled peak device memory in ``dtype`` (:meth:`KernelSpec.peak_bytes`;
            None: it gives no footprint).
        reference: the same in float64, as its float64 reference holds it on the host (None: no
            reference, or no footprint).
    """

    preset: str
    dtype: str
    size: Any
    shapes: tuple[tuple[int, ...], ...]
    modelled: int | None
    reference: int | None


def _choices(what: str, value: object, choices: tuple[str, ...], context: str) -> str:
    return f"unknown {what} {value!r} for {context}; choose one of: {', '.join(choices)}"


@dataclasses.dataclass(frozen=True)
class KernelSpec:
    """One workload: its options, its analytic work counts and its implementation hooks.

    Attributes:
        name: the registry name, e.g. ``"gemm"``.
        description: one line for listings.
        sizes: ``sizes[preset][variant]`` is the workload's size (a NamedTuple of its own).
        dtypes: supported dtypes, e.g. ``("float32", "bfloat16")``.
        precisions: precisions accepted with float32 (bfloat16 takes only ``"default"``).
        compute_bound: whether the ``gpu`` preset is limited by compute rather than memory.
        uses_matmul: whether the work runs on matrix units (GEMM, convolution), so the TF32 and
            BF16 tensor-core roofs apply; elementwise work uses the FP32 roof in any dtype.
        count_fn: ``count_fn(size, itemsize) -> WorkCounts``.
        inputs_fn: ``inputs_fn(size, rng) -> tuple[np.ndarray, ...]`` in float64, never zeros.
        reference_fn: ``reference_fn(size, *inputs) -> np.ndarray`` in float64.
        jax_fn: ``jax_fn(size) -> f(*arrays) -> array``, traced under ``jax.jit``.
        tf_fn: ``tf_fn(size) -> f(*tensors) -> tensor``, wrapped in ``tf.function``.
        torch_fn: ``torch_fn(size) -> f(*tensors) -> tensor``, run eagerly or under
            ``torch.compile`` (the same meaning as ``jax_fn``: given the size, a function of the
            input tensors returning the output tensor).
        shapes_fn: ``shapes_fn(size) -> tuple of shapes``, those of ``inputs_fn``'s arrays,
            computed without making them (the compiled-work analysis traces at a GPU size
            with abstract shapes: :mod:`kernels.cost`).
        unit: the throughput unit its rows report (``rate``): ``TFLOP/s`` (the default), ``GB/s``,
            ``samples/s`` or ``tokens/s`` (these two need ``items_fn``).
        items_fn: ``items_fn(size) -> int``, the samples (or tokens) one call processes.
        tolerances: the relative error allowed, by ``"float32"``, ``"tf32"`` and ``"bfloat16"``;
            None: the built-in table of :mod:`kernels.checks`.
        convolution: whether its matrix work is convolutions (cuDNN), which PyTorch runs in TF32
            by default where it keeps float32 matmuls in FP32 (:meth:`peak`).
        footprint_fn: ``footprint_fn(size, itemsize) -> {part: bytes}``, the device memory one
            call holds (parameters, optimizer state, activations...; a ``"total"`` entry, if
            any, is their peak together, else their sum): the simulated GPU's peak.

    A hook left None means: ``count_fn``, derive the work from XLA's cost analysis of the compiled
    step (:mod:`kernels.cost`); ``reference_fn``, no reference (determinism and finiteness are
    still checked); ``jax_fn``, ``tf_fn`` or ``torch_fn``, the workload lacks that framework. A
    built-in kernel module passes its hooks by name (:func:`module_hooks`); a user's workload
    passes them itself.
    """

    name: str
    description: str
    sizes: Mapping[str, Mapping[str, Any]]
    dtypes: tuple[str, ...]
    precisions: tuple[str, ...]
    compute_bound: bool
    uses_matmul: bool
    count_fn: Callable[[Any, int], WorkCounts] | None = dataclasses.field(repr=False)
    inputs_fn: Callable[..., tuple[Any, ...]] = dataclasses.field(repr=False)
    reference_fn: Callable[..., Any] | None = dataclasses.field(repr=False)
    jax_fn: Callable[[Any], Callable[..., Any]] | None = dataclasses.field(repr=False)
    tf_fn: Callable[[Any], Callable[..., Any]] | None = dataclasses.field(repr=False)
    shapes_fn: Callable[[Any], tuple[tuple[int, ...], ...]] = dataclasses.field(repr=False)
    unit: Unit = "TFLOP/s"
    items_fn: Callable[[Any], int] | None = dataclasses.field(default=None, repr=False)
    tolerances: Mapping[str, float] | None = None
    footprint_fn: Callable[[Any, int], Mapping[str, int]] | None = dataclasses.field(
        default=None, repr=False
    )
    torch_fn: Callable[[Any], Callable[..., Any]] | None = dataclasses.field(
        default=None, repr=False
    )
    convolution: bool = False

    def __post_init__(self) -> None:
        if self.unit not in UNITS:
            raise KernelOptionError(_choices("unit", self.unit, UNITS, f"workload {self.name!r}"))
        if self.unit in ("samples/s", "tokens/s") and self.items_fn is None:
            raise KernelOptionError(
                f"workload {self.name!r} reports {self.unit} but has no items_fn"
            )
        if not self.frameworks:
            raise KernelOptionError(
                f"workload {self.name!r} has none of jax_fn, tf_fn and torch_fn"
            )

    @property
    def frameworks(self) -> tuple[str, ...]:
        """The frameworks it is implemented in."""
        hooks = (("jax", self.jax_fn), ("tensorflow", self.tf_fn), ("pytorch", self.torch_fn))
        return tuple(f for f, fn in hooks if fn)

    def items(self, preset: str, variant: str | None = None) -> int | None:
        """Samples or tokens per call at ``preset`` (None for a FLOP/s or GB/s workload)."""
        if self.unit not in ("samples/s", "tokens/s") or self.items_fn is None:
            return None
        return int(self.items_fn(self.size(preset, variant)))

    def footprint(self, preset: str, dtype: str = "float32") -> dict[str, int] | None:
        """The modelled device memory of one call, by part (None: the workload gives none)."""
        if self.footprint_fn is None:
            return None
        return dict(self.footprint_fn(self.size(preset), ITEMSIZE[dtype]))

    def peak_bytes(self, preset: str, dtype: str = "float32") -> int | None:
        """The modelled peak device memory of one call: the footprint's ``total``, else the sum
        of its parts (None: the workload gives no footprint)."""
        parts = self.footprint(preset, dtype)
        if parts is None:
            return None
        return int(parts["total"] if "total" in parts else sum(parts.values()))

    def at(self, preset: str, dtype: str = "float32") -> Sized:
        """The workload at ``preset`` in ``dtype`` (its default variant): its size, its inputs'
        shapes and its modelled memory, read once for whoever plans it."""
        size = self.size(preset)
        modelled = self.peak_bytes(preset, dtype)
        reference = self.peak_bytes(preset, "float64") if self.reference_fn is not None else None
        return Sized(preset, dtype, size, tuple(self.shapes_fn(size)), modelled, reference)

    @property
    def presets(self) -> tuple[str, ...]:
        """The size presets, smallest first: ``("tiny", "cpu", "gpu")``."""
        return tuple(self.sizes)

    @property
    def variants(self) -> tuple[str, ...]:
        """Shape variants (the stencil's ``"1d"``, ``"2d"``, ``"3d"``); the first is the default."""
        return tuple(next(iter(self.sizes.values())))

    @property
    def default_variant(self) -> str:
        """The variant used when none is named."""
        return self.variants[0]

    def precisions_for(self, dtype: str) -> tuple[str, ...]:
        """Precisions accepted with ``dtype``: all for float32, only the default otherwise."""
        return self.precisions if dtype == "float32" else ("default",)

    def validate(
        self,
        preset: str,
        dtype: str = "float32",
        precision: str = "default",
        variant: str | None = None,
    ) -> str:
        """Check a combination of options.

        Args:
            preset: a size preset.
            dtype: a dtype name.
            precision: a precision name.
            variant: a shape variant, or None for the default one.

        Returns:
            The variant, resolved.

        Raises:
            KernelOptionError: naming the bad option and listing the valid ones.
        """
        context = f"workload {self.name!r}"
        if preset not in self.sizes:
            raise KernelOptionError(_choices("size preset", preset, self.presets, context))
        if dtype not in self.dtypes:
            raise KernelOptionError(_choices("dtype", dtype, self.dtypes, context))
        allowed = self.precisions_for(dtype)
        if precision not in allowed:
            raise KernelOptionError(
                _choices("precision", precision, allowed, f"{context} in {dtype}")
            )
        variant = self.default_variant if variant is None else variant
        if variant not in self.variants:
            raise KernelOptionError(_choices("variant", variant, self.variants, context))
        return variant

    def size(self, preset: str, variant: str | None = None) -> Any:
        """Return the size of ``preset`` and ``variant``: a NamedTuple of the workload's own.

        A getter, like :meth:`counts`, :meth:`peak` and :meth:`footprint`: the options were
        checked once where they came in (:meth:`validate`), so none of them checks again.
        """
        return self.sizes[preset][self.default_variant if variant is None else variant]

    def counts(
        self, preset: str = "cpu", dtype: str = "float32", variant: str | None = None
    ) -> WorkCounts:
        """Analytic FLOP and byte counts of one call; imports no framework, allocates nothing.

        Args:
            preset: a size preset.
            dtype: a dtype name (sets the bytes per element).
            variant: a shape variant, or None for the default one.

        Returns:
            The work of one call; derived from XLA's cost analysis when ``count_fn`` is None.
        """
        variant = self.default_variant if variant is None else variant
        if self.count_fn is None:
            return self._derived_counts(preset, dtype, variant)
        return self.count_fn(self.sizes[preset][variant], ITEMSIZE[dtype])

    def _derived_counts(self, preset: str, dtype: str, variant: str) -> WorkCounts:
        """The work of one call from what a compiler made of it, for a workload without a
        ``count_fn``: its JAX step compiled (XLA's cost analysis), or else its TensorFlow step
        compiled with XLA, or else its PyTorch step compiled by Inductor.

        Raises:
            RuntimeError: the compiler could not compile it, so nothing can say what it does.
        """
        framework = self.frameworks[0]  # JAX, then TensorFlow, then PyTorch
        work = compiled_work(self, framework, preset, dtype, "default", True, variant,
                             compile=True)
        if work.source == "analytic":
            raise RuntimeError(f"workload {self.name!r} has no count_fn and its {framework} "
                               f"step's compiled work could not be derived: {work.note}")
        return WorkCounts(work.flops, work.bytes_moved)

    def peak(self, dtype: str, precision: str = "default", framework: str | None = None) -> Peak:
        """Name the compute roof that limits this workload in ``dtype`` and ``precision``.

        Matmul and convolution work runs on tensor cores: bf16 at the BF16 roof, float32 at the
        TF32 roof unless the precision is ``"highest"`` (JAX and TensorFlow use TF32 by default
        on Ampere and newer GPUs). PyTorch's default is TF32 for cuDNN convolutions only: its
        float32 matmuls stay at the FP32 roof unless the precision is ``"tf32"``
        (``convolution`` tells the two apart). Elementwise work runs on the CUDA cores at the
        FP32 roof in any dtype narrower than float64.

        Args:
            dtype: a dtype name.
            precision: a precision name.
            framework: the framework that runs it (None: JAX's and TensorFlow's defaults).

        Returns:
            ``"fp32"``, ``"tf32"``, ``"bf16"``, ``"fp16"`` or ``"fp64"``.
        """
        return compute_roof(dtype, precision, framework, uses_matmul=self.uses_matmul,
                            convolution=self.convolution)


def compute_roof(
    dtype: str, precision: str = "default", framework: str | None = None, *,
    uses_matmul: bool, convolution: bool = False,
) -> Peak:
    """The compute roof of work in ``dtype`` and ``precision`` (:meth:`KernelSpec.peak`'s rule,
    for work that is no workload: a user's own step, as the window API charges it).

    Args:
        dtype: a dtype name.
        precision: a precision name.
        framework: the framework that runs it (None: JAX's and TensorFlow's defaults).
        uses_matmul: the work runs on matrix units (GEMM, convolution).
        convolution: its matrix work is convolutions.
    """
    if dtype == "float64":
        return "fp64"
    if not uses_matmul:
        return "fp32"
    if dtype == "bfloat16":
        return "bf16"
    if dtype == "float16":
        return "fp16"
    if precision == "highest":
        return "fp32"
    torch_fp32 = framework == "pytorch" and precision == "default" and not convolution
    return "fp32" if torch_fp32 else "tf32"


@dataclasses.dataclass(frozen=True)
class KernelOptions:
    """Which kernel to build: a workload by name and every option that changes the compiled
    computation or its inputs.

    One value in place of the eight arguments that :func:`kernels.registry.build_kernel`,
    :class:`kernels.cache.KernelCache` and :class:`kernels.build.BuiltKernel` each wrote out:
    the defaults live here once, and two requests for the same kernel compare equal once
    :meth:`resolved` (the cache's key, and a built kernel's ``options``).

    Attributes:
        workload: a registry name (:func:`kernels.registry.get_spec`).
        framework: ``"jax"``, ``"tensorflow"`` or ``"pytorch"``.
        preset: the size preset: ``"tiny"``, ``"cpu"`` or ``"gpu"``.
        dtype: one of the spec's dtypes.
        precision: one of the spec's precisions for ``dtype``.
        seed: the seed of the random inputs.
        xla: TensorFlow only: compile with XLA (``jit_compile=True``); JAX always does.
        variant: a shape variant of the spec, or None for its default.
        compile: PyTorch only: run under ``torch.compile`` (else eagerly).
        deterministic: PyTorch only: ``torch.use_deterministic_algorithms`` on around the calls;
            JAX and TensorFlow always run deterministic ops.
    """

    workload: str
    framework: str
    preset: str = "cpu"
    dtype: str = "float32"
    precision: str = "default"
    seed: int = 0
    xla: bool = False
    variant: str | None = None
    compile: bool = False
    deterministic: bool = True

    def checked(self, spec: KernelSpec) -> KernelOptions:
        """These options checked against ``spec`` (:meth:`KernelSpec.validate`), then
        :meth:`resolved`: what a kernel is built from.

        Raises:
            KernelOptionError: an unknown preset, dtype, precision or variant.
        """
        spec.validate(self.preset, self.dtype, self.precision, self.variant)
        return self.resolved(spec)

    def resolved(self, spec: KernelSpec) -> KernelOptions:
        """These options written one way (checks nothing: :meth:`checked` does): the variant
        named, ``xla`` True for JAX (which always compiles with XLA) and False for PyTorch,
        ``compile`` False and ``deterministic`` True outside PyTorch (the knobs only it has), the
        seed an ``int``. Two requests for one kernel resolve equal: the kernel cache's key."""
        variant = spec.default_variant if self.variant is None else self.variant
        xla = self.framework == "jax" or (self.framework == "tensorflow" and bool(self.xla))
        torch = self.framework == "pytorch"
        return dataclasses.replace(
            self, seed=int(self.seed), xla=xla, variant=variant,
            compile=torch and bool(self.compile),
            deterministic=not torch or bool(self.deterministic),
        )

    def inputs_key(self) -> tuple[str, str, str | None, str, int]:
        """What a kernel's inputs, and so its float64 reference, are made of: the workload at
        its size (preset and variant), its dtype (the inputs are rounded to it) and its seed.
        Not the framework, precision or compiler that computes on them: one model's kernels in
        three frameworks share one reference (:meth:`kernels.cache.KernelCache.get`). Of
        resolved options (:meth:`resolved` names the variant)."""
        return (self.workload, self.preset, self.variant, self.dtype, int(self.seed))


def make_sizes(**presets: Mapping[str, Any]) -> Mapping[str, Mapping[str, Any]]:
    """Build a ``sizes`` table, checking that every preset has the same variants in order."""
    if tuple(presets) != PRESETS:
        raise ValueError(f"presets must be {PRESETS}, got {tuple(presets)}")
    variants = [tuple(v) for v in presets.values()]
    if len(set(variants)) != 1:
        raise ValueError(f"every preset needs the same variants, got {variants}")
    return {k: dict(v) for k, v in presets.items()}


HOOK_NAMES: Mapping[str, str] = MappingProxyType({
    "count_fn": "count_work",
    "inputs_fn": "make_inputs",
    "reference_fn": "reference",
    "jax_fn": "jax_function",
    "tf_fn": "tf_function",
    "torch_fn": "torch_function",
    "shapes_fn": "input_shapes",
})
"""The built-in kernel modules' convention: a :class:`KernelSpec` hook field -> the name of the
module-level function that fills it (read by :func:`module_hooks`)."""
REQUIRED_HOOKS: tuple[str, ...] = ("inputs_fn", "shapes_fn")
"""The hook fields no workload goes without; any other may be None (see :class:`KernelSpec`)."""


def module_hooks(namespace: Mapping[str, Any]) -> dict[str, Callable[..., Any] | None]:
    """A kernel module's hooks, found under the conventional names of :data:`HOOK_NAMES`.

    A built-in kernel module ends with ``SPEC = KernelSpec(<its descriptive fields>,
    **module_hooks(globals()))``: a new hook (a framework) is then one entry in
    :data:`HOOK_NAMES` and one function in each module that has it, not one more keyword in
    every ``SPEC``.

    Args:
        namespace: the module's globals.

    Returns:
        Each hook field of :data:`HOOK_NAMES` -> the module's function of that name, or None
        where the module has none (the workload lacks that hook: see :class:`KernelSpec`).

    Raises:
        KernelOptionError: a name of :data:`HOOK_NAMES` that is not a function, or a required
            hook (:data:`REQUIRED_HOOKS`) the module lacks.
    """
    module = namespace.get("__name__", "a kernel module")
    hooks = {field: namespace.get(name) for field, name in HOOK_NAMES.items()}
    wrong = [HOOK_NAMES[f] for f, fn in hooks.items() if fn is not None and not callable(fn)]
    if wrong:
        raise KernelOptionError(f"{module}: {', '.join(wrong)} must be a function (a hook "
                                "of its SPEC), or not defined")
    missing = [f"{HOOK_NAMES[f]} ({f})" for f in REQUIRED_HOOKS if hooks[f] is None]
    if missing:
        raise KernelOptionError(f"{module} defines no {', '.join(missing)}: every workload "
                                "needs one")
    return hooks


Workload = KernelSpec
"""The public name of a workload's description: what a user's factory returns."""
