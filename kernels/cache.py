"""A cache of built kernels, owned by its caller (one per worker), so each kernel compiles once.

A sweep calls the same kernel at many clock settings; compiling it again at each point would
waste minutes and change which kernel XLA's autotuner picks. A worker keeps one
:class:`KernelCache` and asks it for kernels; ``builds`` counts the real builds, so a test can
assert "each kernel compiled once per actor".
"""

from __future__ import annotations

import threading

from kernels.build import BuiltKernel
from kernels.registry import build_kernel, get_spec


class KernelCache:
    """Built kernels keyed by every option that changes the compiled computation or its inputs.

    Attributes:
        builds: how many kernels this cache has built (a hit does not count).
    """

    def __init__(self) -> None:
        self._kernels: dict[tuple[object, ...], BuiltKernel] = {}
        self._lock = threading.Lock()
        self.builds = 0

    @staticmethod
    def key(
        workload: str,
        framework: str,
        preset: str,
        dtype: str,
        precision: str,
        seed: int,
        xla: bool,
        variant: str | None,
    ) -> tuple[object, ...]:
        """The normalised cache key (default variant resolved; ``xla`` ignored for JAX)."""
        spec = get_spec(workload)
        variant = spec.default_variant if variant is None else variant
        xla = True if framework == "jax" else bool(xla)
        return (workload, framework, preset, variant, dtype, precision, int(seed), xla)

    def get(
        self,
        workload: str,
        framework: str,
        preset: str = "cpu",
        dtype: str = "float32",
        precision: str = "default",
        seed: int = 0,
        xla: bool = False,
        variant: str | None = None,
    ) -> BuiltKernel:
        """Return the cached kernel for these options, building it on first use.

        Arguments are those of :func:`kernels.registry.build_kernel`.
        """
        key = self.key(workload, framework, preset, dtype, precision, seed, xla, variant)
        with self._lock:
            kernel = self._kernels.get(key)
            if kernel is None:
                kernel = build_kernel(
                    workload, framework, preset, dtype, precision, seed, xla, variant
                )
                self._kernels[key] = kernel
                self.builds += 1
            return kernel

    def __len__(self) -> int:
        return len(self._kernels)

    def __contains__(self, key: object) -> bool:
        return key in self._kernels

    def clear(self) -> None:
        """Drop every kernel (their device memory goes with them); ``builds`` keeps counting."""
        with self._lock:
            self._kernels.clear()
