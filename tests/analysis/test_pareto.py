"""The Pareto front: equal to a brute-force front, and never drops a row."""

from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis import front_mask, pareto_front


def brute_force_front(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """O(n²): a point is on the front unless another is no worse in both and better in one."""
    n = len(x)
    on = np.ones(n, dtype=bool)
    for i in range(n):
        for j in range(n):
            if x[j] <= x[i] and y[j] <= y[i] and (x[j] < x[i] or y[j] < y[i]):
                on[i] = False
                break
    return on


# Small integer coordinates force ties in x, in y and in both.
points = st.lists(st.tuples(st.integers(0, 6), st.integers(0, 6), st.sampled_from(
    ["ok", "ok", "ok", "wrong"]), st.booleans(), st.sampled_from(["a", "b", None])),
    min_size=0, max_size=40)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 8), st.integers(0, 8)), max_size=60))
def test_front_mask_equals_the_brute_force_front(pts):
    x = np.array([p[0] for p in pts], dtype=float)
    y = np.array([p[1] for p in pts], dtype=float)
    assert front_mask(x, y).tolist() == brute_force_front(x, y).tolist()


@settings(max_examples=150, deadline=None)
@given(points)
def test_pareto_front_per_group_equals_brute_force_over_the_candidates(pts):
    df = pd.DataFrame({
        "time_per_iter_s": [float(p[0]) for p in pts],
        "energy_per_iter_j": [float(p[1]) for p in pts],
        "status": [p[2] for p in pts],
        "valid": [p[3] or p[2] == "wrong" for p in pts],  # invalid only when ok
        "invalid_reason": [None if p[3] else "clock mismatch" for p in pts],
        "framework": [p[4] for p in pts],
    }, index=pd.Index(np.arange(len(pts)) * 10 + 3))
    out = pareto_front(df, by=["framework"])
    assert len(out) == len(df) and out.index.equals(df.index)
    expected = np.zeros(len(df), dtype=bool)
    cand = (df["status"] == "ok").to_numpy() & df["valid"].to_numpy(dtype=bool)
    fw = np.array([p[4] for p in pts], dtype=object)
    for g in ("a", "b", None):
        m = cand & np.array([f == g for f in fw], dtype=bool)
        idx = np.flatnonzero(m)
        expected[idx] = brute_force_front(df["time_per_iter_s"].to_numpy()[idx],
                                          df["energy_per_iter_j"].to_numpy()[idx])
    assert out["on_front"].tolist() == expected.tolist()
    assert (out["front_excluded_reason"].isna().to_numpy() == cand).all()


def test_excluded_rows_are_kept_with_their_reason():
    df = pd.DataFrame({
        "time_per_iter_s": [1.0, 2.0, 0.5, 0.4, np.nan],
        "energy_per_iter_j": [5.0, 3.0, 1.0, 1.0, 1.0],
        "status": ["ok", "ok", "wrong", "ok", "crash"],
        "valid": [True, True, True, False, None],
        "invalid_reason": [None, None, None, "power-cap throttling", None],
        "workload": ["gemm"] * 5, "size": ["s"] * 5, "dtype": ["float32"] * 5,
        "precision": [None] * 5, "framework": ["jax"] * 5, "device_name": ["A100"] * 5,
    })
    out = pareto_front(df)
    assert out["on_front"].tolist() == [True, True, False, False, False]
    assert out["front_excluded_reason"].tolist() == [
        None, None, "status=wrong", "invalid: power-cap throttling", "status=crash"]


def test_rows_with_a_missing_group_value_form_their_own_group():
    df = pd.DataFrame({
        "time_per_iter_s": [1.0, 2.0, 3.0], "energy_per_iter_j": [3.0, 2.0, 1.0],
        "status": ["ok"] * 3, "valid": [True] * 3, "precision": [None, np.nan, "tf32"],
    })
    out = pareto_front(df, by=["precision"])
    assert out["on_front"].tolist() == [True, True, True]  # None and NaN: one group
    out = pareto_front(df.assign(precision=[None, None, None]), by=["precision"])
    assert out["on_front"].tolist() == [True, True, True]
    dominated = df.assign(energy_per_iter_j=[1.0, 2.0, 1.0])
    assert pareto_front(dominated, by=["precision"])["on_front"].tolist() == [True, False, True]
