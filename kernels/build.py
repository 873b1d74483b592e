"""A built kernel: inputs on the device, compiled once, then called many times on the same inputs.

:class:`BuiltKernel` does all the expensive work when it is made, so none of it lands in a
measurement window: it draws the inputs from a seeded generator (fresh random values, never
zeros), rounds them to the kernel's dtype and places them on the framework's default device
(the one GPU a worker sees, or the CPU), compiles the computation and runs it once to warm up.
Then :meth:`BuiltKernel.dispatch` queues one call and returns at once (a timing loop dispatches
many and waits with :meth:`BuiltKernel.sync` only where it must know the time),
:meth:`BuiltKernel.dispatch_checked` queues the kernel fused with its on-device fingerprint
(:mod:`kernels.fingerprint`), :meth:`BuiltKernel.call_device` is one synchronised call with no host
transfer, and :meth:`BuiltKernel.call` the same with the output copied into a NumPy array.

- JAX: ``jax.jit(f).lower(*inputs).compile()`` under ``jax.default_matmul_precision``; the
  precision is fixed at compile time. JAX always compiles with XLA, so ``xla`` is ignored (and
  reported as True).
- TensorFlow: ``tf.function(f, jit_compile=xla)``, traced once into a concrete function; the TF32
  switch is set around the build and around every call, since it is process-wide. Without a
  GPU, TensorFlow runs synchronously; with one, calls end with ``sync_devices``.
- PyTorch: the function run eagerly, or under ``torch.compile`` (``compile``); inputs on
  ``cuda`` when the worker's GPU is visible, else on the CPU. The precision and deterministic
  knobs are process-wide, so they are set around the build and around every call
  (:func:`kernels.frameworks.torch_mode_scope`). On a GPU calls are asynchronous and ``sync`` is
  ``torch.cuda.synchronize``; on the CPU they compute before they return.

The float64 reference is computed on demand from the same rounded inputs (the host copy made at
the build, kept until then, or drawn again from the seed) and cached.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from kernels import frameworks as fw
from kernels.compare import (
    OutputErrors,
    errors_from_sums,
    host_errors,
    jax_error_sums,
    jax_nonfinite_count,
    reference_sq,
    split_reference,
    tf_error_sums,
    tf_nonfinite_count,
    torch_error_sums,
    torch_nonfinite_count,
)
from kernels.cost import CompiledWork, compiled_work
from kernels.fingerprint import jax_fingerprint, tf_fingerprint, torch_fingerprint
from kernels.spec import KernelOptionError, KernelOptions, KernelSpec, WorkCounts


def format_size(size: Any) -> str:
    """A workload size as ``field=value`` pairs, tuples joined by ``x``: ``m=64 k=48 n=80``."""
    parts = []
    for field, value in size._asdict().items():
        text = "x".join(map(str, value)) if isinstance(value, tuple) else str(value)
        parts.append(f"{field}={text}")
    return " ".join(parts)


def check_framework(spec: KernelSpec, framework: str) -> None:
    """Refuse a framework that does not exist, or that the workload is not written in.

    Raises:
        KernelOptionError: naming the frameworks there are.
    """
    if framework not in fw.FRAMEWORKS:
        raise KernelOptionError(
            f"unknown framework {framework!r}; choose one of: {', '.join(fw.FRAMEWORKS)}"
        )
    if framework not in spec.frameworks:
        raise KernelOptionError(
            f"workload {spec.name!r} has no {framework} step; it has: {', '.join(spec.frameworks)}"
        )


def _watch(array: Any) -> Callable[[], Any]:
    """A weak reference to a device array (one that cannot be weakly referenced reads as held)."""
    try:
        return weakref.ref(array)
    except TypeError:
        return lambda: array


class _JaxBackend:
    """Compiled JAX executables (bare, and fused with the fingerprint) and their inputs.

    Calls dispatch asynchronously: ``dispatch`` returns as soon as XLA has queued the call.
    """

    def __init__(self, fn: Callable[..., Any], inputs: tuple[np.ndarray, ...], precision: str):
        jax = fw.import_jax()
        self._jax = jax
        self._fn = fn
        self._precision = precision
        self._args = tuple(jax.device_put(a) for a in inputs)
        with fw.jax_precision_scope(precision):
            self._compiled = jax.jit(fn).lower(*self._args).compile()
        self._checked: Any = None
        self._fingerprint: Any = None
        self._error_sums: Any = None
        self._nonfinite: Any = None

    def dispatch(self) -> Any:
        return self._compiled(*self._args)

    def put(self, array: np.ndarray) -> Any:
        return self._jax.device_put(array)

    def error_sums(self, handle: Any, hi: Any, lo: Any) -> Any:
        if self._error_sums is None:
            self._error_sums = self._jax.jit(jax_error_sums)
        return self._error_sums(handle, hi, lo)

    def nonfinite_count(self, handle: Any) -> Any:
        if self._nonfinite is None:
            self._nonfinite = self._jax.jit(jax_nonfinite_count)
        return self._nonfinite(handle)

    @staticmethod
    def nbytes(handle: Any) -> int:
        return int(handle.nbytes)

    def dispatch_checked(self) -> tuple[Any, Any]:
        if self._checked is None:
            fn = self._fn

            def checked(*args: Any) -> tuple[Any, Any]:
                out = fn(*args)
                return out, jax_fingerprint(out)

            with fw.jax_precision_scope(self._precision):
                self._checked = self._jax.jit(checked).lower(*self._args).compile()
        return self._checked(*self._args)

    def fingerprint(self, handle: Any) -> Any:
        if self._fingerprint is None:
            self._fingerprint = self._jax.jit(jax_fingerprint)
        return self._fingerprint(handle)

    def sync(self, handle: Any) -> None:
        self._jax.block_until_ready(handle)

    def fetch(self, handles: list[Any]) -> list[np.ndarray]:
        return [np.asarray(h) for h in self._jax.device_get(list(handles))]

    def call_device(self) -> Any:
        out = self.dispatch()
        out.block_until_ready()
        return out

    @staticmethod
    def to_numpy(handle: Any) -> np.ndarray:
        return np.asarray(handle)

    def peak_memory(self) -> tuple[int | None, str]:
        stats = self._jax.local_devices()[0].memory_stats()  # None on the CPU
        if not stats or "peak_bytes_in_use" not in stats:
            return None, "jax memory_stats() gives nothing on this device"
        return int(stats["peak_bytes_in_use"]), "jax memory_stats peak_bytes_in_use"

    def reset_peak_memory(self) -> bool:
        return False  # JAX has no reset: its peak is the process's


class _TensorFlowBackend:
    """Concrete ``tf.function``s (bare, and with the fingerprint) and their device-resident inputs.

    A call returns once TensorFlow has launched its kernels; on a GPU they run on after it, so
    ``dispatch`` is asynchronous there and ``sync`` waits for the device (``sync_devices``). On a
    CPU TensorFlow computes before it returns, and ``sync`` has nothing to wait for.
    """

    def __init__(
        self, fn: Callable[..., Any], inputs: tuple[np.ndarray, ...], precision: str, xla: bool
    ):
        tf = fw.import_tensorflow()
        self._tf = tf
        self._fn = fn
        self._xla = bool(xla)
        self._precision = precision
        gpus = tf.config.list_logical_devices("GPU")
        self._sync = tf.test.experimental.sync_devices if gpus else None
        self._device = gpus[0].name if gpus else "/CPU:0"
        with tf.device(self._device):
            # identity copies each constant onto the device once, not at every call.
            self._args = tuple(tf.identity(tf.constant(a)) for a in inputs)
        function = tf.function(fn, jit_compile=self._xla, autograph=False)
        with fw.tf_precision_scope(precision):
            self._concrete = function.get_concrete_function(*self._args)
        self._checked: Any = None
        self._fingerprint: Any = None
        self._error_sums: Any = None
        self._nonfinite: Any = None

    def _fingerprint_fn(self) -> Any:
        if self._fingerprint is None:
            # XLA runs the fingerprint on the output's device whatever the kernel was compiled
            # with: TensorFlow's own GPU kernels lack most uint32 arithmetic.
            self._fingerprint = self._tf.function(tf_fingerprint, jit_compile=True, autograph=False)
        return self._fingerprint

    def dispatch(self) -> Any:
        with fw.tf_precision_scope(self._precision):
            return self._concrete(*self._args)

    def dispatch_checked(self) -> tuple[Any, Any]:
        if self._checked is None:
            fn, fingerprint = self._fn, self._fingerprint_fn()

            def checked(*args: Any) -> tuple[Any, Any]:
                out = fn(*args)
                return out, fingerprint(out)

            function = self._tf.function(checked, jit_compile=self._xla, autograph=False)
            with fw.tf_precision_scope(self._precision):
                self._checked = function.get_concrete_function(*self._args)
        with fw.tf_precision_scope(self._precision):
            return self._checked(*self._args)

    def fingerprint(self, handle: Any) -> Any:
        with self._tf.device(self._device):
            return self._fingerprint_fn()(handle)

    def put(self, array: np.ndarray) -> Any:
        with self._tf.device(self._device):
            return self._tf.identity(self._tf.constant(array))

    def error_sums(self, handle: Any, hi: Any, lo: Any) -> Any:
        if self._error_sums is None:  # XLA, as for the fingerprint: fused, on the output's device
            self._error_sums = self._tf.function(tf_error_sums, jit_compile=True,
                                                 autograph=False)
        with self._tf.device(self._device):
            return self._error_sums(handle, hi, lo)

    def nonfinite_count(self, handle: Any) -> Any:
        if self._nonfinite is None:
            self._nonfinite = self._tf.function(tf_nonfinite_count, jit_compile=True,
                                                autograph=False)
        with self._tf.device(self._device):
            return self._nonfinite(handle)

    @staticmethod
    def nbytes(handle: Any) -> int:
        return int(handle.shape.num_elements()) * handle.dtype.size

    def sync(self, handle: Any) -> None:
        del handle
        if self._sync is not None:
            self._sync()

    def fetch(self, handles: list[Any]) -> list[np.ndarray]:
        return [np.asarray(h.numpy()) for h in handles]

    def call_device(self) -> Any:
        out = self.dispatch()
        self.sync(out)
        return out

    @staticmethod
    def to_numpy(handle: Any) -> np.ndarray:
        return np.asarray(handle.numpy())

    def _memory_device(self) -> str:
        return self._device.rpartition("device:")[2] if "device:" in self._device else "CPU:0"

    def peak_memory(self) -> tuple[int | None, str]:
        try:
            info = self._tf.config.experimental.get_memory_info(self._memory_device())
        except ValueError as e:  # "Allocator stats not available": TF's CPU allocator, mostly
            return None, f"tf get_memory_info gives nothing on this device ({e})"
        return int(info["peak"]), "tf get_memory_info peak"

    def reset_peak_memory(self) -> bool:
        try:
            self._tf.config.experimental.reset_memory_stats(self._memory_device())
        except ValueError:  # "Cannot reset memory stats": an allocator that keeps none
            return False
        return True


class _TorchBackend:
    """A PyTorch function, eager or ``torch.compile``d (bare, and fused with the fingerprint),
    and its inputs on the device (``cuda`` when the worker's GPU is visible, else the CPU).

    On a GPU a call returns once its kernels are queued and ``sync`` waits for the device; on
    the CPU PyTorch computes before it returns. Compiled, the fingerprint is traced into the
    same graph as the kernel (Inductor fuses it); eager, it is a separate pass on the device.
    """

    def __init__(self, fn: Callable[..., Any], inputs: tuple[np.ndarray, ...],
                 options: KernelOptions):
        torch = fw.import_torch()
        self._torch = torch
        self._fn = fn
        self._compile = options.compile
        self._mode = (options.precision, options.deterministic)
        self._cuda = torch.cuda.is_available() and torch.cuda.device_count() > 0
        self._device = torch.device("cuda" if self._cuda else "cpu")
        self._args = tuple(self.put(a) for a in inputs)
        self._step = self._compiled(fn)
        self._checked: Any = None

    def _compiled(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` compiled (``torch.compile``: traced at its first call), or as it is."""
        return fw.torch_compile(fn) if self._compile else fn

    def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        with fw.torch_mode_scope(*self._mode):
            return fn(*args)

    def dispatch(self) -> Any:
        return self._run(self._step, *self._args)

    def dispatch_checked(self) -> tuple[Any, Any]:
        if self._checked is None:
            fn = self._fn

            def checked(*args: Any) -> tuple[Any, Any]:
                out = fn(*args)
                return out, torch_fingerprint(out)

            self._checked = self._compiled(checked)
        return self._run(self._checked, *self._args)

    def fingerprint(self, handle: Any) -> Any:
        return torch_fingerprint(handle)

    def put(self, array: np.ndarray) -> Any:
        torch = self._torch
        if array.dtype == fw.numpy_dtype("bfloat16"):  # NumPy has no bfloat16 PyTorch reads
            host = torch.from_numpy(np.ascontiguousarray(array).view(np.int16))
            return host.to(self._device).view(torch.bfloat16)
        return torch.from_numpy(np.ascontiguousarray(array)).to(self._device)

    def error_sums(self, handle: Any, hi: Any, lo: Any) -> Any:
        return torch_error_sums(handle, hi, lo)

    def nonfinite_count(self, handle: Any) -> Any:
        return torch_nonfinite_count(handle)

    @staticmethod
    def nbytes(handle: Any) -> int:
        return int(handle.numel()) * int(handle.element_size())

    def sync(self, handle: Any) -> None:
        del handle
        if self._cuda:
            self._torch.cuda.synchronize(self._device)

    def fetch(self, handles: list[Any]) -> list[np.ndarray]:
        return [self.to_numpy(h) for h in handles]

    def call_device(self) -> Any:
        out = self.dispatch()
        self.sync(out)
        return out

    def to_numpy(self, handle: Any) -> np.ndarray:
        tensor = handle.detach()
        if tensor.dtype == self._torch.int64:  # a fingerprint's words (or a count): < 2**32
            return tensor.cpu().numpy().astype(np.uint32)
        if tensor.dtype == self._torch.bfloat16:
            bits = tensor.contiguous().view(self._torch.int16).cpu().numpy()
            return bits.view(fw.numpy_dtype("bfloat16"))
        return np.asarray(tensor.cpu().numpy())

    def peak_memory(self) -> tuple[int | None, str]:
        if not self._cuda:
            return None, "torch keeps no peak memory on the CPU"
        peak = self._torch.cuda.max_memory_allocated(self._device)
        return int(peak), "torch.cuda.max_memory_allocated"

    def reset_peak_memory(self) -> bool:
        if not self._cuda:
            return False
        self._torch.cuda.reset_peak_memory_stats(self._device)
        return True


class BuiltKernel:
    """One workload compiled for one :class:`~kernels.spec.KernelOptions`.

    Attributes:
        spec: the workload's :class:`~kernels.spec.KernelSpec`.
        options: the options it was built with, checked and resolved
            (:meth:`KernelOptions.checked`).
        workload: the workload name.
        framework: ``"jax"``, ``"tensorflow"`` or ``"pytorch"``.
        framework_version: the framework's version string.
        preset: the size preset.
        variant: the shape variant.
        size: the workload's size (a NamedTuple).
        dtype: the dtype name.
        precision: the precision name.
        seed: the seed of the inputs.
        xla: whether XLA compiles it (always True for JAX, False for PyTorch).
        compile: PyTorch: whether ``torch.compile`` compiles it (False elsewhere).
        deterministic: whether deterministic algorithms are on (PyTorch's option; always True
            for JAX and TensorFlow).
        counts: FLOPs and minimum bytes of one call at this size.
        build_s: seconds the build took (inputs, transfer, compile, warm-up call).
        output_bytes: bytes of one call's output on the device.
        bytes_to_host: bytes of outputs and check results copied to the host so far
            (:meth:`fetch`, :meth:`to_numpy`, :meth:`compare`): a trial's share is what it added.
        reference_builds: how many times the float64 reference was computed (at most once).
    """

    def __init__(self, spec: KernelSpec, options: KernelOptions):
        check_framework(spec, options.framework)
        self.options = options = options.checked(spec)  # the kernel API's one check
        start = time.perf_counter()
        self.spec = spec
        self.workload = spec.name
        self.framework = framework = options.framework
        self.preset, self.dtype, self.precision = options.preset, options.dtype, options.precision
        self.seed, self.xla = options.seed, options.xla
        self.compile, self.deterministic = options.compile, options.deterministic
        self.variant = str(options.variant)  # resolved: always named
        self.size = spec.sizes[self.preset][self.variant]
        self.counts: WorkCounts = spec.counts(self.preset, self.dtype, self.variant)
        self.framework_version = fw.framework_version(framework)
        self._reference: np.ndarray | None = None
        self._reference_on_device: tuple[Any, ...] | None = None
        self._reference_sq = 0.0
        self.bytes_to_host = 0
        self.reference_builds = 0
        inputs = self._rounded_inputs()
        self._backend: Any = self._make_backend(inputs)
        # Kept until the reference is computed (a trial asks for it right after its warm-up):
        # drawing a GPU-sized input again from the seed took seconds per array on the host.
        self._inputs: tuple[np.ndarray, ...] | None = inputs if spec.reference_fn else None
        del inputs
        warm = self._backend.call_device()  # warm-up: first-call allocations and autotuning.
        self.output_bytes = self._backend.nbytes(warm)
        del warm
        self.build_s = time.perf_counter() - start

    def _make_backend(self, inputs: tuple[np.ndarray, ...]) -> Any:
        """The framework's backend over these inputs: compiled (or, eager, ready) to call."""
        spec, options = self.spec, self.options
        if self.framework == "jax":
            return _JaxBackend(spec.jax_fn(self.size), inputs, self.precision)
        if self.framework == "pytorch":
            return _TorchBackend(spec.torch_fn(self.size), inputs, options)
        return _TensorFlowBackend(spec.tf_fn(self.size), inputs, self.precision, self.xla)

    def _rounded_inputs(self) -> tuple[np.ndarray, ...]:
        rng = np.random.default_rng(self.seed)
        np_dtype = fw.numpy_dtype(self.dtype)
        return tuple(a.astype(np_dtype) for a in self.spec.inputs_fn(self.size, rng))

    @property
    def resident(self) -> bool:
        """Whether its inputs are on the device (False after :meth:`release`)."""
        return self._backend._args is not None

    @property
    def device_bytes(self) -> int:
        """The bytes of its arrays on the device now: inputs and the reference (0 released)."""
        if self._backend._args is None:
            return 0
        arrays = self._backend._args + (self._reference_on_device or ())
        return sum(int(self._backend.nbytes(a)) for a in arrays)

    def release(self) -> int:
        """Give back this kernel's arrays: its inputs and reference on the device, and the host
        copies (inputs, float64 reference); the compiled functions stay. The next call puts the
        inputs back (drawn again from the seed) and the next comparison computes the reference
        again, so a worker holds the arrays of one kernel at a time (``KernelCache``).

        Returns:
            How many of its device arrays outlived their references here: 0 when each went with
            its last reference (JAX, TensorFlow and PyTorch free a buffer then); more when a
            reference cycle or a caller still holds one, which only a collection frees.
        """
        arrays = (self._backend._args or ()) + (self._reference_on_device or ())
        watched = [_watch(a) for a in arrays]
        del arrays
        self._backend._args = None
        self._reference_on_device = None
        self._reference = None
        self._inputs = None
        return sum(ref() is not None for ref in watched)

    def _resident(self) -> None:
        """Put the inputs back on the device after :meth:`release` (never inside a window:
        the trial's warm-up calls come first)."""
        if self._backend._args is None:
            self._backend._args = tuple(self._backend.put(a) for a in self._rounded_inputs())

    def call_device(self) -> Any:
        """Run one call and wait for it, leaving the output on the device.

        Returns:
            An opaque handle to the output; :meth:`to_numpy` converts it.
        """
        self._resident()
        return self._backend.call_device()

    def dispatch(self) -> Any:
        """Queue one call on the device and return at once (asynchronous dispatch).

        Returns:
            A handle to the output, which may still be being computed: :meth:`sync` waits for it.
        """
        self._resident()
        return self._backend.dispatch()

    def dispatch_checked(self) -> tuple[Any, Any]:
        """Queue one call of the kernel fused with its fingerprint (one compiled step).

        Returns:
            Handles to the output and to its fingerprint (:mod:`kernels.fingerprint`), both on
            the device.
        """
        self._resident()
        return self._backend.dispatch_checked()

    def fingerprint(self, handle: Any) -> Any:
        """The on-device fingerprint of an output handle (a separate pass over the output)."""
        return self._backend.fingerprint(handle)

    def sync(self, handle: Any) -> None:
        """Wait until the call that made ``handle`` (and every call before it) has finished."""
        self._backend.sync(handle)

    def fetch(self, handles: list[Any]) -> list[np.ndarray]:
        """Copy device handles to the host, as NumPy arrays (after a window, never inside one)."""
        arrays = self._backend.fetch(handles)
        self.bytes_to_host += sum(a.nbytes for a in arrays)
        return arrays

    def to_numpy(self, handle: Any) -> np.ndarray:
        """Copy an output handle from :meth:`call_device` into a NumPy array."""
        array = self._backend.to_numpy(handle)
        self.bytes_to_host += array.nbytes
        return array

    def call(self) -> np.ndarray:
        """Run one call and return its output as a NumPy array (in the kernel's dtype)."""
        return self.to_numpy(self.call_device())

    @property
    def computed_reference(self) -> np.ndarray | None:
        """Its float64 reference if it is computed and held now (None: not yet, released, or the
        workload has none); computes nothing."""
        return self._reference

    def share_reference(self, reference: np.ndarray) -> None:
        """Take the float64 reference another kernel computed on the same inputs (equal
        :meth:`~kernels.spec.KernelOptions.inputs_key`: another framework's or precision's
        kernel of the same model), instead of computing it again: on the host, in float64, it
        is a model's whole step (minutes for a GPU-sized one). The host copy of the inputs,
        kept only to compute it, goes."""
        if self.spec.reference_fn is not None and self._reference is None:
            self._reference, self._inputs = reference, None

    def reference(self) -> np.ndarray | None:
        """The float64 NumPy reference on the same (dtype-rounded) inputs; computed once (None:
        the workload has none, and is checked for determinism and finiteness only)."""
        if self._reference is None and self.spec.reference_fn is not None:
            rounded, self._inputs = self._inputs or self._rounded_inputs(), None
            inputs = [a.astype(np.float64) for a in rounded]
            del rounded
            self._reference = np.asarray(self.spec.reference_fn(self.size, *inputs), np.float64)
            self.reference_builds += 1
        return self._reference

    def compare(self, outputs: list[Any]) -> list[OutputErrors]:
        """Each output's errors against the reference (:mod:`kernels.compare`), in order.

        A device handle is compared on its device, against the reference put there once as
        float32 ``(hi, lo)``, and only four numbers come back; an output already on the host
        (the simulated GPU's corrupted copies, ``measure.digest=host``) is compared there.
        Without a reference the errors read NaN and only the non-finite values are counted.
        """
        reference = self.reference()
        return [self._errors(output, reference) for output in outputs]

    def _errors(self, output: Any, reference: np.ndarray | None) -> OutputErrors:
        if isinstance(output, np.ndarray):
            return host_errors(output, reference)
        backend = self._backend
        if reference is None:
            nan = float("nan")
            return OutputErrors(nan, nan, int(self.fetch([backend.nonfinite_count(output)])[0]))
        if self._reference_on_device is None:  # once per kernel
            self._reference_on_device = tuple(backend.put(a) for a in split_reference(reference))
            self._reference_sq = reference_sq(reference)
        sums = backend.error_sums(output, *self._reference_on_device)
        diff_sq, max_abs = self.fetch([sums])[0]
        nonfinite = 0
        if not (np.isfinite(diff_sq) and np.isfinite(max_abs)):
            nonfinite = int(self.fetch([backend.nonfinite_count(output)])[0])
        return errors_from_sums(float(diff_sq), self._reference_sq, float(max_abs), nonfinite)

    def compiled_work(self, preset: str | None = None) -> CompiledWork:
        """The work one call does as the framework compiled it (:mod:`kernels.cost`).

        Traced and compiled with abstract shapes, so ``preset`` may be larger than the one this
        kernel runs at (the simulated GPU charges the ``gpu`` preset's work); computed once per
        process for these options, never during a call.

        Args:
            preset: the size preset to analyse; None for the one this kernel runs at.

        Returns:
            FLOPs, bytes and launches of one call, and where they come from.
        """
        return compiled_work(
            self.spec,
            self.framework,
            self.preset if preset is None else preset,
            self.dtype,
            self.precision,
            self.xla,
            self.variant,
            compile=self.compile,
        )

    def peak_memory(self) -> tuple[int | None, str]:
        """The framework's peak device memory in bytes, and where the figure comes from: JAX's
        ``memory_stats()["peak_bytes_in_use"]`` (None where the device keeps no stats, as the
        CPU; since the process started: JAX cannot reset it), TensorFlow's
        ``get_memory_info(device)["peak"]`` and PyTorch's ``torch.cuda.max_memory_allocated``
        (None on the CPU) since :meth:`reset_peak_memory`."""
        return self._backend.peak_memory()

    def reset_peak_memory(self) -> bool:
        """Start the peak over where the framework allows (TensorFlow; PyTorch on a GPU);
        False where it cannot."""
        return self._backend.reset_peak_memory()

    def describe(self) -> dict[str, Any]:
        """Identity of the kernel as plain values, for a results row."""
        return {
            "workload": self.workload,
            "framework": self.framework,
            "framework_version": self.framework_version,
            "preset": self.preset,
            "variant": self.variant,
            "size": format_size(self.size),
            "dtype": self.dtype,
            "precision": self.precision,
            "seed": self.seed,
            "xla": self.xla,
            "compile": self.compile,
            "deterministic": self.deterministic,
            "flops": self.counts.flops,
            "bytes_moved": self.counts.bytes_moved,
        }

    def __repr__(self) -> str:
        return (
            f"BuiltKernel({self.workload}/{self.variant}, {self.framework}, preset={self.preset}, "
            f"dtype={self.dtype}, precision={self.precision}, seed={self.seed}, xla={self.xla}, "
            f"compile={self.compile})"
        )
