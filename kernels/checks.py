"""Numerical-correctness checks of a window of kernel calls: accuracy, determinism, finiteness.

A trial calls a kernel many times on the same inputs. Hashing every call's output is cheap and
exact; comparing against the float64 reference costs a float64 pass, so a trial does that only for
a sample. The API follows that split::

    digests = [output_digest(k.call()) for _ in range(n)]      # every call
    result = check_outputs([last_output], k.reference(), "float32", "default", "gemm",
                           digests=digests)

``check_outputs(outputs, reference, dtype, precision, workload, *, digests=None, tolerance=None)``

- ``outputs``: the sampled outputs (at least one; include the last call's), each compared with the
  reference: relative error ``||out - ref||_2 / ||ref||_2`` and the largest absolute error, both in
  float64 (streamed in chunks, so a 2**28-element output needs no float64 copy). A trial does not
  copy its outputs here: it compares them on the device (``kernels/compare.py``,
  ``BuiltKernel.compare``) and judges the errors with :func:`check_errors`.
- ``digests``: :func:`output_digest` of every call of the window, in call order. Without it the
  digests of ``outputs`` are used. A call mismatches when its digest differs from the most common
  one (ties go to the earliest), so one corrupted call counts 1 wherever it falls.
- Verdict: ``wrong`` if any value is non-finite or the relative error exceeds the tolerance;
  otherwise ``nondeterministic`` if any digest mismatches; otherwise ``ok``. WRONG wins over
  NONDETERMINISTIC. With a non-finite value both errors read ``inf``.

Tolerances (relative, norm-wise; :func:`tolerance_for`) depend on the dtype, the precision and
the workload. ``default`` precision means what the device computes a float32 matmul in by default
(``arithmetic``, from ``Device.float32_matmul_default``, recorded in each row as
``check_arithmetic``): TF32 on Ampere and later GPUs for JAX and TensorFlow (the tf32 column),
FP32 for PyTorch, older GPUs and a CPU (the fp32 column), and one bfloat16 pass on a TPU (the
bf16 column for the matmul workloads; elementwise work stays fp32):

=========== ======== ===== ====== =============================================================
workload    fp32     tf32  bf16   why
=========== ======== ===== ====== =============================================================
stencil     1e-5     -     1e-2   two adds per axis: ~1 rounding per element
selu        1e-5     -     1e-2   a few ulp of exp
gemm        3e-5     1e-3  1e-2   K products: ~u*sqrt(K/2) = 4e-6 at K = 8192; TF32 ~0.8*2**-11
conv3d      3e-5     2e-3  1e-2   sum of 27*C_in products, same argument; TF32 on both operands
mlp_train   1e-5     1e-3  1e-2   the output is p - lr*g: dominated by the exactly-stored parameters
hessian     1e-4     -     2e-2   autodiff graph (~20 ops) vs the closed form, cancellation in f''
=========== ======== ===== ====== =============================================================

The hessian needs more room than the other elementwise kernels: the frameworks evaluate
``f''`` as the derivative graph of ``sin(x) * exp(-x**2/2)`` (products of terms that nearly cancel
near the roots of ``f''``), each op rounded in the kernel's dtype, and XLA's exp and sin are
polynomial approximations of a few ulp; in bf16 that compounds to a few bf16 ulps (2**-8 = 3.9e-3
each) norm-wise. Measured on a CPU (jaxlib 0.10.2, TF 2.21): float32 errors are 3e-8..2e-7
at the tiny preset and at most 5e-7 at the ``cpu`` preset (conv3d, gemm); bfloat16 errors are
1.7e-3..4.4e-3 (selu highest, hessian 4.2e-3). ``tests/kernels/test_numerics.py`` checks every
combination.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np

from kernels.compare import OutputErrors, host_errors
from kernels.spec import KernelOptionError, UnknownKernelError

FP32_TOLERANCE: Mapping[str, float] = {
    "stencil": 1e-5,
    "gemm": 3e-5,
    "selu": 1e-5,
    "conv3d": 3e-5,
    "mlp_train": 1e-5,
    "hessian": 1e-4,
}
TF32_TOLERANCE: Mapping[str, float] = {"gemm": 1e-3, "conv3d": 2e-3, "mlp_train": 1e-3}
BF16_TOLERANCE: Mapping[str, float] = {
    "stencil": 1e-2,
    "gemm": 1e-2,
    "selu": 1e-2,
    "conv3d": 1e-2,
    "mlp_train": 1e-2,
    "hessian": 2e-2,
}


class Verdict(enum.StrEnum):
    """The outcome of a check."""

    OK = "ok"
    WRONG = "wrong"
    NONDETERMINISTIC = "nondeterministic"


@dataclasses.dataclass(frozen=True)
class CheckResult:
    """What the check found over one window of calls.

    Attributes:
        verdict: ``ok``, ``wrong`` or ``nondeterministic``.
        rel_error: the largest ``||out - ref||_2 / ||ref||_2`` over the compared outputs
            (``inf`` with a non-finite value).
        max_abs_error: the largest ``|out - ref|`` over the compared outputs.
        nonfinite_count: NaN and infinite values over the compared outputs.
        determinism_mismatches: calls whose digest differs from the most common one.
        tolerance: the relative-error tolerance applied.
        calls_hashed: how many digests were compared.
        outputs_compared: how many outputs were compared with the reference.
    """

    verdict: Verdict
    rel_error: float
    max_abs_error: float
    nonfinite_count: int
    determinism_mismatches: int
    tolerance: float
    calls_hashed: int
    outputs_compared: int

    @property
    def ok(self) -> bool:
        """Whether the verdict is ``ok``."""
        return self.verdict is Verdict.OK

    def as_dict(self) -> dict[str, object]:
        """The result as plain values (the verdict as its string), for a results row."""
        row = dataclasses.asdict(self)
        row["verdict"] = self.verdict.value
        return row


BF16_OVER_TF32 = 8.0
"""bfloat16 keeps 8 significand bits, TF32 11: a unit roundoff 2**3 times larger. A workload
whose table has a ``tf32`` figure and no ``bfloat16`` one gets this multiple of it where the
device's default matmul is one bfloat16 pass."""

ARITHMETICS = ("tf32", "float32", "bfloat16")
"""What a float32 matrix product at ``precision=default`` runs in on a device: TF32 (JAX and
TensorFlow on an Ampere or later GPU), FP32 (PyTorch, older GPUs, a CPU) or one bfloat16 pass
(a TPU)."""


def tolerance_for(dtype: str, precision: str, workload: str, arithmetic: str = "tf32") -> float:
    """Return the relative-error tolerance for a workload in ``dtype`` and ``precision``.

    Args:
        dtype: ``"float32"`` or ``"bfloat16"``.
        precision: ``"default"``, ``"highest"`` or ``"tf32"``.
        workload: a workload name: a built-in kernel's (the table above), or one whose
            :class:`~kernels.spec.Workload` gives ``tolerances`` (the models, a user's).
        arithmetic: what ``precision=default`` computes a float32 matmul in on the device
            (:data:`ARITHMETICS`): ``tf32`` keeps the table above; ``float32`` takes the fp32
            column; ``bfloat16`` the bf16 column for matmul work (elementwise work stays fp32).

    Returns:
        The tolerance on ``||out - ref||_2 / ||ref||_2``.

    Raises:
        UnknownKernelError: for an unknown workload.
        KernelOptionError: for a dtype or precision without a tolerance.
    """
    if arithmetic not in ARITHMETICS:
        raise KernelOptionError(f"unknown arithmetic {arithmetic!r}; known: "
                                f"{', '.join(ARITHMETICS)}")
    if dtype == "float32" and precision == "default" and arithmetic != "tf32":
        if arithmetic == "float32":
            precision = "highest"
        elif workload not in FP32_TOLERANCE or workload in TF32_TOLERANCE:
            dtype = "bfloat16"  # one bfloat16 pass: matmul work is as exact as bf16 inputs
        else:
            precision = "highest"  # elementwise work is float32 whatever the matmul default
    if workload not in FP32_TOLERANCE:
        return _spec_tolerance(dtype, precision, workload)
    if dtype == "bfloat16":
        return BF16_TOLERANCE[workload]
    if dtype != "float32":
        raise KernelOptionError(f"no tolerance for dtype {dtype!r}; known: float32, bfloat16")
    if precision == "highest" or (precision == "default" and workload not in TF32_TOLERANCE):
        return FP32_TOLERANCE[workload]
    if precision in ("default", "tf32") and workload in TF32_TOLERANCE:
        return TF32_TOLERANCE[workload]
    raise KernelOptionError(
        f"no tolerance for precision {precision!r} of {workload!r} in float32"
    )


def _spec_tolerance(dtype: str, precision: str, workload: str) -> float:
    """A workload's own ``tolerances``: ``bfloat16`` by dtype; in float32, ``float32`` at the
    ``highest`` precision, ``tf32`` (else ``float32``) at ``default`` and ``tf32``."""
    from kernels.registry import get_spec

    table = get_spec(workload).tolerances
    if not table:
        raise UnknownKernelError(f"workload {workload!r} gives no tolerances")
    key = dtype if dtype != "float32" else "float32" if precision == "highest" else "tf32"
    value = table.get(key, table.get("float32") if key == "tf32" else None)
    if value is None and key == "bfloat16" and "tf32" in table:  # one bf16 pass (a TPU's
        value = BF16_OVER_TF32 * table["tf32"]  # default) of a model that names no bf16 figure
    if value is None:
        raise KernelOptionError(f"workload {workload!r} gives no tolerance for {dtype} "
                                f"at precision {precision!r}; it has: {', '.join(table)}")
    return float(value)


def output_digest(array: np.ndarray) -> str:
    """A bitwise digest of an output: BLAKE2b-128 of its dtype, shape and bytes, in hex.

    Any change of a single bit changes the digest; ``-0.0`` and ``0.0`` differ, and NaNs with
    different payloads differ, as the bits do.
    """
    array = np.ascontiguousarray(array)
    digest = hashlib.blake2b(digest_size=16)
    digest.update(f"{array.dtype.str}{array.shape}".encode())
    digest.update(array.reshape(-1).view(np.uint8).data)
    return digest.hexdigest()


def count_mismatches(digests: Sequence[str]) -> int:
    """Count the digests that differ from the most common one (ties: the earliest)."""
    if not digests:
        return 0
    counts = Counter(digests)
    top = max(counts.values())
    baseline = next(d for d in digests if counts[d] == top)
    return len(digests) - counts[baseline]


def check_outputs(
    outputs: Sequence[np.ndarray],
    reference: np.ndarray | None,
    dtype: str,
    precision: str,
    workload: str,
    *,
    digests: Sequence[str] | None = None,
    tolerance: float | None = None,
) -> CheckResult:
    """Check a window of calls: sampled outputs against the reference, all digests for equality.

    Args:
        outputs: the sampled outputs (NumPy arrays), at least one; include the last call's.
        reference: the float64 reference of the same computation on the same inputs; None for a
            workload without one (then only finiteness and determinism are checked, and the
            errors and tolerance read NaN).
        dtype: the kernel's dtype (chooses the tolerance).
        precision: the kernel's precision (chooses the tolerance).
        workload: the registry name (chooses the tolerance).
        digests: :func:`output_digest` of every call of the window; None hashes ``outputs``.
        tolerance: overrides :func:`tolerance_for`.

    Returns:
        The verdict and its figures (see the module docstring).

    Raises:
        ValueError: no outputs, a string among them, or a shape that differs from the reference.
    """
    if isinstance(outputs, np.ndarray):
        outputs = [outputs]
    if not outputs:
        raise ValueError("check_outputs needs at least one output to compare with the reference")
    if any(isinstance(o, str | bytes) for o in outputs):
        raise ValueError("outputs must be arrays; pass digests with digests=[...]")
    arrays = [np.asarray(o) for o in outputs]
    if digests is None:
        digests = [output_digest(a) for a in arrays]
    ref = None if reference is None else np.asarray(reference)
    errors = [host_errors(a, ref) for a in arrays]
    return check_errors(errors, digests, dtype, precision, workload, tolerance=tolerance)


def check_errors(
    errors: Sequence[OutputErrors],
    digests: Sequence[str],
    dtype: str,
    precision: str,
    workload: str,
    *,
    tolerance: float | None = None,
    arithmetic: str = "tf32",
) -> CheckResult:
    """The verdict from errors already computed (on the device: :mod:`kernels.compare`).

    Args:
        errors: one :class:`~kernels.compare.OutputErrors` per compared output; NaN errors
            for a workload without a reference (then only finiteness and determinism count).
        digests: the fingerprints of every checked call, in call order.
        dtype, precision, workload: choose the tolerance (:func:`tolerance_for`).
        tolerance: overrides :func:`tolerance_for`.
        arithmetic: the device's float32 matmul at ``precision=default`` (:data:`ARITHMETICS`).
    """
    nonfinite = sum(e.nonfinite for e in errors)
    compared = [e for e in errors if not np.isnan(e.rel_error)]  # NaN: no reference to compare
    if not compared:
        nan = float("nan")
        return _verdict(nonfinite, False, digests, (nan, nan, nan), len(errors))
    tol = (tolerance_for(dtype, precision, workload, arithmetic) if tolerance is None
           else float(tolerance))
    rel = max(e.rel_error for e in compared)
    max_abs = max(e.max_abs_error for e in compared)
    return _verdict(nonfinite, not rel <= tol, digests, (rel, max_abs, tol), len(errors))


def _verdict(
    nonfinite: int, too_far: bool, digests: Sequence[str], figures: tuple[float, float, float],
    compared: int,
) -> CheckResult:
    rel, max_abs, tol = figures
    mismatches = count_mismatches(list(digests))
    if nonfinite or too_far:
        verdict = Verdict.WRONG
    elif mismatches:
        verdict = Verdict.NONDETERMINISTIC
    else:
        verdict = Verdict.OK
    return CheckResult(
        verdict=verdict,
        rel_error=rel,
        max_abs_error=max_abs,
        nonfinite_count=nonfinite,
        determinism_mismatches=mismatches,
        tolerance=tol,
        calls_hashed=len(digests),
        outputs_compared=compared,
    )
