"""What the elementwise workloads share: one array in, one array of its shape out, in one pass.

``selu`` and ``hessian`` map each element on its own; ``stencil`` adds each element's
neighbours, which one fused pass finds in cache. For each of them a size is one shape
(:class:`ArraySize`), the one input has that shape (:func:`one_input_shape`), and one call does a
fixed number of FLOPs per element and moves each element twice: the input read once and the
output written once, in the kernel's dtype (:class:`ElementwiseWork`; the conventions are
those of :mod:`kernels.spec`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import NamedTuple

from kernels.spec import WorkCounts


class ArraySize(NamedTuple):
    """The shape of the workload's one input array (and of its output)."""

    shape: tuple[int, ...]


def one_input_shape(size: ArraySize) -> tuple[tuple[int, ...]]:
    """The shape of the one input, without making it (the workload's ``shapes_fn``)."""
    return (tuple(size.shape),)


@dataclasses.dataclass(frozen=True)
class ElementwiseWork:
    """The ``count_fn`` of an elementwise workload: ``count_work(size, itemsize)`` gives
    ``flops_per_element * n`` FLOPs and ``2 * n * itemsize`` bytes, ``n`` the number of
    elements of ``size.shape`` (each read once and written once).

    Attributes:
        flops_per_element: the FLOPs of one element, or a function of the size that gives them
            (the stencil's depend on its number of axes).
    """

    flops_per_element: int | Callable[[ArraySize], int]

    def __call__(self, size: ArraySize, itemsize: int) -> WorkCounts:
        """FLOPs and minimum bytes of one call at ``size``, ``itemsize`` bytes per element."""
        per_element = self.flops_per_element
        if callable(per_element):
            per_element = per_element(size)
        n = math.prod(size.shape)
        return WorkCounts(flops=float(per_element * n), bytes_moved=2.0 * n * itemsize)
