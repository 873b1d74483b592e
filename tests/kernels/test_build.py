"""Building kernels: identity, caching, seeds, device calls, the TF32 switch and build cost."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from kernels import BuiltKernel, KernelCache, KernelOptions, build_kernel, get_spec


@pytest.fixture(scope="module")
def gemm_jax(frameworks) -> BuiltKernel:
    return build_kernel(KernelOptions("gemm", "jax", "tiny", seed=5, variant="rect"))


def test_a_built_kernel_reports_what_it_runs(frameworks, gemm_jax):
    jax, tf = frameworks
    k = gemm_jax
    assert (k.workload, k.framework, k.preset, k.variant) == ("gemm", "jax", "tiny", "rect")
    assert (k.dtype, k.precision, k.seed, k.xla) == ("float32", "default", 5, True)
    assert k.framework_version == jax.__version__
    assert k.counts == get_spec("gemm").counts("tiny", "float32", "rect")
    assert tuple(k.size) == (96, 48, 80)
    row = k.describe()
    assert row["flops"] == k.counts.flops and row["variant"] == "rect"
    assert row["size"] == "m=96 k=48 n=80"
    t = build_kernel(KernelOptions("selu", "tensorflow", "tiny", xla=True))
    assert t.framework_version == tf.__version__ and t.xla is True


def test_call_device_returns_a_handle_that_converts_to_the_same_output(gemm_jax):
    handle = gemm_jax.call_device()
    assert not isinstance(handle, np.ndarray)
    assert np.array_equal(gemm_jax.to_numpy(handle), gemm_jax.call())


def test_reference_is_cached_and_float64(gemm_jax):
    ref = gemm_jax.reference()
    assert ref.dtype == np.float64 and ref.shape == (96, 80)
    assert gemm_jax.reference() is ref


@pytest.mark.parametrize("framework", ["jax", "tensorflow", "pytorch"])
def test_the_same_seed_gives_the_same_output_and_another_seed_another(
    frameworks, pytorch, framework
):
    a = build_kernel(KernelOptions("stencil", framework, "tiny", seed=1)).call()
    b = build_kernel(KernelOptions("stencil", framework, "tiny", seed=1)).call()
    c = build_kernel(KernelOptions("stencil", framework, "tiny", seed=2)).call()
    assert np.array_equal(a, b)
    assert not np.allclose(a, c)


@pytest.mark.parametrize("name", ["stencil", "gemm", "selu", "conv3d", "mlp_train", "hessian"])
def test_inputs_are_random_and_never_zero(name):
    spec = get_spec(name)
    inputs = spec.inputs_fn(spec.size("tiny"), np.random.default_rng(0))
    for array in inputs:
        assert np.count_nonzero(array) == array.size
        assert np.std(array) > 0


def test_the_cache_builds_each_kernel_once(frameworks):
    cache = KernelCache()
    first = cache.get(KernelOptions("selu", "jax", "tiny"))
    assert cache.get(KernelOptions("selu", "jax", "tiny")) is first
    assert cache.get(KernelOptions("selu", "jax", "tiny", xla=True)) is first  # JAX: always XLA
    assert cache.get(KernelOptions("selu", "jax", "tiny", variant="1d")) is first  # the default
    assert cache.builds == 1
    cache.get(KernelOptions("selu", "tensorflow", "tiny"))
    cache.get(KernelOptions("selu", "tensorflow", "tiny", xla=True))
    cache.get(KernelOptions("selu", "jax", "tiny", seed=1))
    cache.get(KernelOptions("selu", "jax", "tiny", dtype="bfloat16"))
    assert cache.builds == len(cache) == 5
    cache.clear()
    cache.get(KernelOptions("selu", "jax", "tiny"))
    assert cache.builds == 6


def test_one_models_kernels_in_other_frameworks_take_its_float64_reference_over(frameworks):
    """The reference depends on the inputs (workload, size, dtype, seed), not on the framework
    or precision that computes on them: it is computed once, moves to the kernel asked for next,
    and goes from the one that computed it (released, as every other kernel's arrays)."""
    cache = KernelCache()
    jax_kernel = cache.get(KernelOptions("gemm", "jax", "tiny", seed=3))
    reference = jax_kernel.reference()
    tf_options = KernelOptions("gemm", "tensorflow", "tiny", seed=3, precision="highest")
    cache.release_others(tf_options)  # as a trial does first, before it reads the free memory
    assert not jax_kernel.resident
    tf_kernel = cache.get(tf_options)
    assert tf_kernel.reference() is reference and tf_kernel.reference_builds == 0
    assert not jax_kernel.resident and jax_kernel.computed_reference is None
    errors = tf_kernel.compare([tf_kernel.call_device()])[0]
    assert errors.rel_error < 1e-5  # its own output, against the reference it took over
    back = cache.get(KernelOptions("gemm", "jax", "tiny", seed=3))  # and back again
    assert back is jax_kernel and back.reference() is reference
    assert jax_kernel.reference_builds == 1
    other_seed = cache.get(KernelOptions("gemm", "tensorflow", "tiny", seed=4))
    assert other_seed.reference() is not reference and other_seed.reference_builds == 1
    assert not np.allclose(other_seed.reference(), reference)


def test_released_arrays_go_with_their_last_reference_and_only_a_cycle_costs_a_collection(
        frameworks, monkeypatch):
    """A kernel's device arrays go as it lets them go: the cache makes no collection (a full
    one takes ~0.1 s with the frameworks loaded, at every change of kernel). One that a
    reference cycle still holds is counted, and the cache collects it."""
    import gc
    import weakref

    collections = []
    real_collect = gc.collect
    monkeypatch.setattr(gc, "collect", lambda *a: collections.append(a) or real_collect(*a))
    cache = KernelCache()
    first = cache.get(KernelOptions("gemm", "jax", "tiny", seed=21))
    first.compare([first.call_device()])  # its reference on the device too
    arrays = [weakref.ref(a) for a in first._backend._args + first._reference_on_device]
    cache.get(KernelOptions("selu", "jax", "tiny", seed=21))
    assert not first.resident and [a() for a in arrays] == [None] * 4 and collections == []

    first = cache.get(KernelOptions("gemm", "jax", "tiny", seed=21))
    first.call_device()  # its inputs back
    gc.disable()  # no automatic collection may free the cycle before the cache does
    try:
        cycle = [first._backend._args[0]]
        cycle.append(cycle)
        held = weakref.ref(first._backend._args[0])
        del cycle
        assert first.release() == 1 and held() is not None
        first = cache.get(KernelOptions("gemm", "jax", "tiny", seed=21))
        first.call_device()
        cycle = [first._backend._args[0]]
        cycle.append(cycle)
        held = weakref.ref(first._backend._args[0])
        del cycle
        cache.get(KernelOptions("selu", "jax", "tiny", seed=21))
        assert held() is None and len(collections) == 1
    finally:
        gc.enable()


def test_equal_options_give_equal_cache_keys_and_the_kernel_keeps_its_key():
    key = KernelCache.key(KernelOptions("selu", "jax", "tiny"))
    assert key == KernelCache.key(KernelOptions("selu", "jax", "tiny", seed=0.0, xla=True))
    assert key == KernelOptions("selu", "jax", "tiny", xla=True, variant="1d")
    assert key != KernelCache.key(KernelOptions("selu", "tensorflow", "tiny"))
    assert KernelCache.key(KernelOptions("selu", "tensorflow", "tiny", xla=1)).xla is True
    assert build_kernel(KernelOptions("selu", "jax", "tiny")).options == key


def test_tensorflow_tf32_switch_is_restored_after_build_and_call(frameworks):
    _, tf = frameworks
    before = tf.config.experimental.tensor_float_32_execution_enabled()
    k = build_kernel(KernelOptions("gemm", "tensorflow", "tiny", precision="highest"))
    k.call()
    assert tf.config.experimental.tensor_float_32_execution_enabled() == before


def test_the_process_is_in_deterministic_mode_with_no_preallocation(frameworks):
    assert "--xla_gpu_deterministic_ops=true" in os.environ["XLA_FLAGS"]
    assert os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    assert os.environ["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"


def test_jax_lowers_each_precision_to_its_own_dot_precision(frameworks):
    jax, _ = frameworks
    from kernels import frameworks

    x = jax.numpy.ones((4, 4))
    seen = {}
    for precision, expected in (("default", "DEFAULT"), ("highest", "HIGHEST"), ("tf32", "HIGH")):
        with frameworks.jax_precision_scope(precision):
            text = jax.jit(jax.numpy.matmul).lower(x, x).as_text()
        seen[precision] = f"precision = [{expected}, {expected}]" in text
    assert all(seen.values()), seen


@pytest.mark.parametrize("name", ["conv3d", "mlp_train", "hessian"])
@pytest.mark.parametrize("framework", ["jax", "tensorflow", "pytorch"])
def test_tiny_builds_take_well_under_a_second(frameworks, pytorch, name, framework):
    """In CPU seconds of this process (its compiler threads included): a busy machine stretches
    a build's wall clock, not its work."""
    start = time.process_time()
    build_kernel(KernelOptions(name, framework, "tiny", dtype="bfloat16", seed=9))
    assert time.process_time() - start < 1.0


def test_a_pytorch_kernel_reports_what_it_runs_and_where(pytorch):
    k = build_kernel(KernelOptions("gemm", "pytorch", "tiny", seed=5, variant="rect", xla=True))
    assert (k.framework, k.xla, k.compile, k.deterministic) == ("pytorch", False, False, True)
    assert k.framework_version == pytorch.__version__
    assert k.describe()["compile"] is False and k.describe()["deterministic"] is True
    handle = k.call_device()
    assert isinstance(handle, pytorch.Tensor) and handle.device.type == "cpu"  # no GPU here
    assert np.array_equal(k.to_numpy(handle), k.call())
    assert k.peak_memory() == (None, "torch keeps no peak memory on the CPU")
    assert k.reset_peak_memory() is False


def test_a_tensorflow_kernel_reports_the_cpu_allocators_statistics_only_where_it_keeps_them(
        frameworks):
    """TensorFlow's CPU allocator keeps statistics only under oneDNN's allocator (x86 CPUs with
    AVX-512 VNNI and newer, by default): elsewhere get_memory_info raises, and the kernel says
    "nothing" instead of crashing its trial."""
    _, tf = frameworks
    k = build_kernel(KernelOptions("gemm", "tensorflow", "tiny", seed=5))
    try:
        tf.config.experimental.get_memory_info("CPU:0")
        kept = True
    except ValueError:
        kept = False
    peak, source = k.peak_memory()
    assert k.reset_peak_memory() is kept
    if kept:
        assert (peak >= 0, source) == (True, "tf get_memory_info peak")
    else:
        assert peak is None and source.startswith("tf get_memory_info gives nothing")


def test_pytorch_compile_and_determinism_are_part_of_the_cache_key():
    key = KernelCache.key(KernelOptions("selu", "pytorch", "tiny"))
    assert key == KernelCache.key(KernelOptions("selu", "pytorch", "tiny", xla=True))
    assert key != KernelCache.key(KernelOptions("selu", "pytorch", "tiny", compile=True))
    assert key != KernelCache.key(KernelOptions("selu", "pytorch", "tiny", deterministic=False))
    jax = KernelCache.key(KernelOptions("selu", "jax", "tiny", compile=True, deterministic=0))
    assert (jax.compile, jax.deterministic) == (False, True)  # PyTorch's knobs only


def test_pytorch_precision_and_determinism_are_set_around_each_call_and_restored(pytorch):
    before = (pytorch.get_float32_matmul_precision(), pytorch.backends.cudnn.allow_tf32,
              pytorch.are_deterministic_algorithms_enabled())
    assert before[2] is True  # import_torch turns deterministic algorithms on
    seen = []

    def spy(*args):
        seen.append((pytorch.get_float32_matmul_precision(), pytorch.backends.cudnn.allow_tf32,
                     pytorch.are_deterministic_algorithms_enabled()))
        return args[0] @ args[1]

    k = build_kernel(KernelOptions("gemm", "pytorch", "tiny", precision="tf32",
                                   deterministic=False))
    k._backend._step = spy
    k.call()
    assert seen == [("high", True, False)]
    highest = build_kernel(KernelOptions("gemm", "pytorch", "tiny", precision="highest"))
    highest._backend._step = spy
    highest.call()
    assert seen[-1] == ("highest", False, True)
    assert (pytorch.get_float32_matmul_precision(), pytorch.backends.cudnn.allow_tf32,
            pytorch.are_deterministic_algorithms_enabled()) == before


def test_cublas_gets_its_deterministic_workspace_before_cuda_starts(pytorch):
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"


def test_torch_compile_keeps_a_graph_for_every_kernel_of_a_sweep_and_never_falls_back(pytorch):
    from kernels.frameworks import TORCH_RECOMPILE_LIMIT, torch_compile

    torch_compile(lambda x: x)  # every compiled kernel comes through here
    config = pytorch._dynamo.config
    # the checked step's code is shared by every workload: PyTorch's 8 would run the 9th eagerly
    assert config.recompile_limit >= TORCH_RECOMPILE_LIMIT >= 100
    assert config.fail_on_recompile_limit_hit is True
