"""The study's workloads in JAX, TensorFlow and PyTorch, with float64 references, work counts and
checks.

Six workloads (``stencil``, ``gemm``, ``selu``, ``conv3d``, ``mlp_train``, ``hessian``), each with
a JAX implementation (``jax.jit``), a TensorFlow one (``tf.function``, XLA on a switch), a PyTorch
one (eager, or ``torch.compile`` on a switch; PyTorch is the extra ``dvfs-orchestrator[torch]``),
a float64 NumPy reference and an analytic count of FLOPs and minimum bytes per call. A kernel is
built once (inputs, compile, warm-up) and then called many times on the same inputs::

    from kernels import KernelOptions, build_kernel, check_errors, fingerprint_hex

    k = build_kernel(KernelOptions("gemm", framework="jax", preset="tiny"))
    calls = [k.dispatch_checked() for _ in range(3)]      # queued; fingerprints stay on the device
    fingerprints = k.fetch([fp for _, fp in calls])       # a few bytes each, after the loop
    errors = k.compare([calls[0][0], calls[-1][0]])       # on the device: four numbers each
    result = check_errors(errors, [fingerprint_hex(f) for f in fingerprints], k.dtype,
                          k.precision, k.workload)

Importing this package imports none of JAX, TensorFlow and PyTorch (nor ml_dtypes): they load
when the first kernel is built. This package knows nothing of devices, Ray or configuration.
"""

from kernels.build import BuiltKernel
from kernels.cache import KernelCache
from kernels.checks import (
    CheckResult,
    Verdict,
    check_errors,
    check_outputs,
    output_digest,
    tolerance_for,
)
from kernels.compare import OutputErrors
from kernels.cost import CompiledWork, compiled_work
from kernels.fingerprint import fingerprint_hex, numpy_fingerprint
from kernels.registry import (
    FRAMEWORKS,
    WORKLOADS,
    build_kernel,
    get_spec,
    list_workloads,
    load_workload,
)
from kernels.spec import (
    KernelOptionError,
    KernelOptions,
    KernelSpec,
    UnknownKernelError,
    WorkCounts,
    Workload,
    make_sizes,
)

__all__ = [
    "FRAMEWORKS",
    "WORKLOADS",
    "BuiltKernel",
    "CheckResult",
    "CompiledWork",
    "KernelCache",
    "KernelOptionError",
    "KernelOptions",
    "KernelSpec",
    "UnknownKernelError",
    "Verdict",
    "WorkCounts",
    "Workload",
    "OutputErrors",
    "build_kernel",
    "check_errors",
    "check_outputs",
    "compiled_work",
    "fingerprint_hex",
    "get_spec",
    "list_workloads",
    "load_workload",
    "make_sizes",
    "numpy_fingerprint",
    "output_digest",
    "tolerance_for",
]
