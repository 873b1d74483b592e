"""What the elementwise workloads share: one shape, one input, FLOPs per element, two passes."""

from __future__ import annotations

import pytest

from kernels.elementwise import ArraySize, ElementwiseWork, one_input_shape
from kernels.spec import WorkCounts


@pytest.mark.parametrize("itemsize", [4, 2])
def test_a_fixed_count_per_element_gives_k_flops_and_one_read_and_one_write_per_element(
    itemsize,
):
    count_work = ElementwiseWork(5)
    assert count_work(ArraySize((8, 3)), itemsize) == WorkCounts(5 * 24, 2 * 24 * itemsize)


def test_a_count_per_element_may_depend_on_the_size():
    count_work = ElementwiseWork(lambda size: 2 * len(size.shape))
    assert count_work(ArraySize((4, 4, 4)), 4).flops == 6 * 64
    assert count_work(ArraySize((64,)), 4).flops == 2 * 64


def test_the_counts_are_floats_as_the_roofline_divides_them():
    counts = ElementwiseWork(11)(ArraySize((4096,)), 2)
    assert type(counts.flops) is float and type(counts.bytes_moved) is float


def test_the_one_input_has_the_sizes_shape():
    assert one_input_shape(ArraySize((16, 32))) == ((16, 32),)
