"""A cache of built kernels, owned by its caller (one per worker), so each kernel compiles once.

A sweep calls the same kernel at many clock settings; compiling it again at each point would
waste minutes and change which kernel XLA's autotuner picks. A worker keeps one
:class:`KernelCache` and asks it for kernels; ``builds`` counts the real builds, so a test can
assert "each kernel compiled once per actor".

The compiled functions stay for the life of the worker; the **arrays** (inputs and reference on
the device, the float64 reference on the host) are kept for one kernel at a time: asking for a
kernel releases every other one's (:meth:`KernelCache.release_others`), and a released kernel
puts its inputs back, drawn again from its seed, at its next call. So a sweep over several
workloads on one device holds the largest one's arrays, never their sum. The float64 reference
depends on the inputs alone, not on the framework that computes on them: a kernel of the same
model and seed in another framework takes it over rather than computing it again.
"""

from __future__ import annotations

import threading

import numpy as np

from kernels.build import BuiltKernel
from kernels.registry import build_kernel, get_spec
from kernels.spec import KernelOptions


class KernelCache:
    """Built kernels keyed by their :class:`~kernels.spec.KernelOptions`, resolved: every option
    that changes the compiled computation or its inputs, each written one way.

    Attributes:
        builds: how many kernels this cache has built (a hit does not count).
    """

    def __init__(self) -> None:
        self._kernels: dict[KernelOptions, BuiltKernel] = {}
        self._lock = threading.Lock()
        self.builds = 0
        # a float64 reference on its way to the next kernel of the same inputs (_keep_reference_for)
        self._kept_reference: tuple[tuple[object, ...], np.ndarray] | None = None

    @staticmethod
    def key(options: KernelOptions) -> KernelOptions:
        """The cache key: ``options`` resolved (the default variant named, ``xla`` True for
        JAX), so equal kernels have equal keys; a built kernel's ``options`` is its key. Nothing
        is checked here, on every trial's lookup: a miss builds the kernel, which checks its
        options once (:meth:`KernelOptions.checked`), and a trial's were checked with its job.

        Raises:
            UnknownKernelError: an unknown workload.
        """
        return options.resolved(get_spec(options.workload))

    def get(self, options: KernelOptions) -> BuiltKernel:
        """Return the cached kernel for ``options``, building it on first use
        (:func:`kernels.registry.build_kernel`); every other kernel's arrays are released
        first (:meth:`release_others`)."""
        key = self.key(options)
        self.release_others(key)
        with self._lock:
            kernel = self._kernels.get(key)
            if kernel is None:
                kernel = build_kernel(key)
                self._kernels[key] = kernel
                self.builds += 1
            kept, self._kept_reference = self._kept_reference, None
            if kept is not None and kept[0] == key.inputs_key():
                kernel.share_reference(kept[1])
            return kernel

    def _keep_reference_for(self, key: KernelOptions) -> None:
        """Before the other kernels are released: keep the float64 reference one of them
        computed on the inputs ``key``'s kernel computes on (another framework's or precision's
        kernel of the same model and seed), where ``key``'s own holds none, for :meth:`get` to
        hand over. It replaces the one that computed it, so a worker still holds one
        reference; one kept for other inputs goes. Called under the lock."""
        inputs = key.inputs_key()
        own = self._kernels.get(key)
        if own is not None and own.computed_reference is not None:
            self._kept_reference = None
            return
        found = next((k.computed_reference for k in self._kernels.values()
                      if k.computed_reference is not None and k.options.inputs_key() == inputs),
                     None)
        if found is not None:
            self._kept_reference = (inputs, found)
        elif self._kept_reference is not None and self._kept_reference[0] != inputs:
            self._kept_reference = None

    def release_others(self, options: KernelOptions | None) -> int:
        """Release the arrays of every kernel but the one of ``options`` (None: all of them),
        keeping their compiled functions (:meth:`BuiltKernel.release`). A trial calls this
        before it reads the device's free memory, so a worker holds one kernel's arrays at a
        time whatever a sweep runs before. Returns how many kernels it released."""
        key = None if options is None else self.key(options)
        released = held = 0
        with self._lock:
            if key is None:
                self._kept_reference = None
            else:
                self._keep_reference_for(key)
            for k, kernel in self._kernels.items():
                if k != key and kernel.resident:
                    held += kernel.release()
                    released += 1
        if held:  # a reference cycle holds device buffers: they go when it is collected
            import gc

            gc.collect()  # a full collection: ~0.1 s with a framework loaded, so only then
        return released

    def resident_bytes(self, options: KernelOptions) -> int:
        """The device bytes the kernel of ``options`` holds now (0: not built, or released)."""
        kernel = self._kernels.get(self.key(options))
        return 0 if kernel is None else kernel.device_bytes

    def __len__(self) -> int:
        return len(self._kernels)

    def __contains__(self, key: object) -> bool:
        return key in self._kernels

    def clear(self) -> None:
        """Drop every kernel (their device memory goes with them); ``builds`` keeps counting."""
        with self._lock:
            self._kernels.clear()
