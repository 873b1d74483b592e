"""The correctness check on NumPy arrays: tolerance, bit flips, NaN, determinism, verdict order."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_testing import exponent_msb, flip_bit

from kernels import CheckResult, Verdict, check_outputs, output_digest

RNG = np.random.default_rng(1234)
REF = RNG.standard_normal(4096)
OUT32 = REF.astype(np.float32)


def check(outputs, digests=None, dtype="float32", workload="stencil"):
    return check_outputs(outputs, REF, dtype, "default", workload, digests=digests)


def test_a_correctly_rounded_output_is_ok_with_every_figure_reported():
    result = check([OUT32])
    assert isinstance(result, CheckResult)
    assert result.verdict is Verdict.OK and result.ok
    assert 0 < result.rel_error < 1e-7
    assert 0 < result.max_abs_error < 1e-6
    assert result.nonfinite_count == 0
    assert result.determinism_mismatches == 0
    assert (result.calls_hashed, result.outputs_compared) == (1, 1)
    assert result.as_dict()["verdict"] == "ok"


def test_verdict_values_are_the_strings_the_store_records():
    assert [v.value for v in Verdict] == ["ok", "wrong", "nondeterministic"]
    assert Verdict("wrong") is Verdict.WRONG


def test_an_error_above_the_tolerance_is_wrong():
    off = (REF * (1 + 3e-5)).astype(np.float32)
    assert check([off]).verdict is Verdict.WRONG
    assert check_outputs([off], REF, "float32", "default", "stencil", tolerance=1e-4).ok


@pytest.mark.parametrize("index", [0, 1234, 4095])
def test_a_flipped_exponent_bit_in_one_element_is_wrong(index):
    bad = flip_bit(OUT32, index, exponent_msb(np.float32))
    result = check([bad])
    assert result.verdict is Verdict.WRONG


def test_a_flipped_bit_that_leaves_a_finite_value_is_wrong_through_the_error_alone():
    index = int(np.argmin(np.abs(OUT32)))  # |x| < 1: the flip multiplies it by 2**128.
    bad = flip_bit(OUT32, index, exponent_msb(np.float32))
    assert np.isfinite(bad).all()
    result = check([bad])
    assert result.verdict is Verdict.WRONG
    assert result.nonfinite_count == 0 and result.rel_error > 1e20


def test_a_flipped_bit_in_one_bfloat16_element_is_wrong():
    out = REF.astype(ml_dtypes.bfloat16)
    assert check([out], dtype="bfloat16").ok
    bad = flip_bit(out, 7, exponent_msb(out.dtype))
    assert check([bad], dtype="bfloat16").verdict is Verdict.WRONG


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_any_non_finite_value_is_wrong_even_when_every_call_agrees(value):
    bad = OUT32.copy()
    bad[99] = value
    result = check([bad, bad])
    assert result.verdict is Verdict.WRONG
    assert result.nonfinite_count == 2
    assert result.rel_error == np.inf and result.max_abs_error == np.inf
    assert result.determinism_mismatches == 0


@pytest.mark.parametrize("bad_call", [0, 3, 9])
def test_one_flipped_low_bit_in_one_unsampled_call_is_nondeterministic(bad_call):
    digests = [output_digest(OUT32)] * 10
    digests[bad_call] = output_digest(flip_bit(OUT32, 2000, 0))
    result = check([OUT32], digests=digests)  # only the last call is compared
    assert result.verdict is Verdict.NONDETERMINISTIC
    assert result.determinism_mismatches == 1
    assert result.calls_hashed == 10


def test_a_flipped_bit_among_the_sampled_outputs_is_nondeterministic_without_digests():
    result = check([OUT32, flip_bit(OUT32, 5, 0), OUT32])
    assert result.verdict is Verdict.NONDETERMINISTIC
    assert result.determinism_mismatches == 1


def test_wrong_wins_over_nondeterministic():
    bad = flip_bit(OUT32, 5, exponent_msb(np.float32))
    result = check([OUT32, bad])
    assert result.determinism_mismatches == 1
    assert result.verdict is Verdict.WRONG


def test_bitwise_determinism_tells_negative_zero_from_zero():
    zero = np.zeros(4, np.float32)
    assert output_digest(zero) != output_digest(-zero)


def test_digest_covers_dtype_and_shape_not_only_bytes():
    a = np.arange(6, dtype=np.float32)
    assert output_digest(a) != output_digest(a.reshape(2, 3))
    assert output_digest(a) != output_digest(a.view(np.int32))
    assert output_digest(a) == output_digest(a.copy())
    transposed = a.reshape(2, 3).T
    assert output_digest(transposed) == output_digest(np.ascontiguousarray(transposed))


def test_check_refuses_a_shape_mismatch_and_digests_passed_as_outputs():
    with pytest.raises(ValueError, match="shape"):
        check([OUT32[:-1]])
    with pytest.raises(ValueError, match="digests="):
        check([output_digest(OUT32)])
    with pytest.raises(ValueError, match="at least one"):
        check([])


def test_errors_are_streamed_in_chunks_with_the_same_result_as_one_pass(monkeypatch):
    import kernels.compare as compare

    whole = check([OUT32])
    monkeypatch.setattr(compare, "_CHUNK", 1000)
    chunked = check([OUT32])
    assert chunked.rel_error == pytest.approx(whole.rel_error, rel=1e-12)
    assert chunked.max_abs_error == whole.max_abs_error


@settings(max_examples=200, deadline=None)
@given(index=st.integers(0, 4095), bit=st.integers(0, 31))
def test_any_single_bit_flip_changes_the_digest(index, bit):
    assert output_digest(flip_bit(OUT32, index, bit)) != output_digest(OUT32)


@settings(max_examples=100, deadline=None)
@given(
    calls=st.integers(2, 40),
    bad=st.sets(st.integers(0, 39), min_size=1, max_size=1),
)
def test_one_corrupted_call_counts_exactly_one_mismatch_wherever_it_falls(calls, bad):
    (bad_call,) = bad
    digests = ["good"] * calls
    if bad_call < calls:
        digests[bad_call] = "bad"
    mismatches = check([OUT32], digests=digests).determinism_mismatches
    assert mismatches == int(bad_call < calls)
