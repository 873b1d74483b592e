"""The registry and the specs: names, presets, refusals that list what exists, hand-counted work."""

from __future__ import annotations

import pytest

from kernels import KernelCache, KernelOptions, WorkCounts, get_spec, list_workloads
from kernels.checks import FP32_TOLERANCE, tolerance_for
from kernels.registry import KernelOptionError, UnknownKernelError, build_kernel

NAMES = ("stencil", "gemm", "selu", "conv3d", "mlp_train", "hessian")
MODELS = ("resnet50_train", "bert_train", "vit_train")


def test_registry_lists_the_six_kernels_then_the_three_models_in_study_order():
    from kernels.registry import KERNELS
    from kernels.registry import MODELS as REGISTERED_MODELS

    assert list_workloads() == NAMES + MODELS
    assert (KERNELS, REGISTERED_MODELS) == (NAMES, MODELS)


def test_the_registry_says_every_kernel_is_written_in_all_three_frameworks():
    from kernels.registry import workload_frameworks

    every = ("jax", "tensorflow", "pytorch")
    assert {n: f for n, f in workload_frameworks().items() if n in NAMES} == {
        n: every for n in NAMES}
    assert workload_frameworks(("gemm",)) == {"gemm": every}
    with pytest.raises(UnknownKernelError):
        workload_frameworks(("nope",))


@pytest.mark.parametrize("name", NAMES)
def test_every_workload_has_the_three_presets_and_float32_and_bfloat16(name):
    spec = get_spec(name)
    assert spec.name == name
    assert spec.presets == ("tiny", "cpu", "gpu")
    assert spec.dtypes == ("float32", "bfloat16")
    assert "default" in spec.precisions and "highest" in spec.precisions
    assert spec.precisions_for("bfloat16") == ("default",)


def test_an_unknown_workload_is_a_value_error_that_lists_the_names():
    with pytest.raises(UnknownKernelError) as err:
        get_spec("gemmm")
    assert isinstance(err.value, ValueError)
    for name in NAMES:
        assert name in str(err.value)


@pytest.mark.parametrize(
    ("options", "listed"),
    [
        ({"preset": "huge"}, "tiny, cpu, gpu"),
        ({"preset": "tiny", "dtype": "float16"}, "float32, bfloat16"),
        ({"preset": "tiny", "variant": "4d"}, "square, rect"),
        ({"preset": "tiny", "dtype": "bfloat16", "precision": "tf32"}, "default"),
        ({"preset": "tiny", "precision": "fp8"}, "default, highest, tf32"),
        ({"preset": "tiny", "framework": "torch"}, "jax, tensorflow"),
    ],
)
def test_an_unknown_option_is_a_value_error_that_lists_the_choices(options, listed):
    options = {"framework": "jax", **options}
    with pytest.raises(KernelOptionError) as err:
        build_kernel(KernelOptions("gemm", **options))
    assert isinstance(err.value, ValueError)
    assert listed in str(err.value)


def test_elementwise_workloads_refuse_tf32_since_they_have_no_matmul():
    with pytest.raises(KernelOptionError, match="default, highest"):
        get_spec("stencil").validate("tiny", "float32", "tf32")


def test_the_cache_refuses_an_unknown_workload_without_building():
    cache = KernelCache()
    with pytest.raises(UnknownKernelError):
        cache.get(KernelOptions("nope", "jax", "tiny"))
    assert cache.builds == 0


# Hand counts for the tiny presets. Conventions: a multiply-add is 2 FLOPs, every add, multiply,
# select and transcendental 1; bytes are inputs read once plus outputs written once.
HAND_COUNTS = [
    # stencil 1-D, n = 4096: 2 adds per element; read + write 4096 floats.
    ("stencil", "1d", "float32", 2 * 4096, 2 * 4096 * 4),
    ("stencil", "1d", "bfloat16", 2 * 4096, 2 * 4096 * 2),
    # 2-D 64x64: 4 adds per element; 3-D 16^3: 6 adds per element.
    ("stencil", "2d", "float32", 4 * 4096, 2 * 4096 * 4),
    ("stencil", "3d", "float32", 6 * 4096, 2 * 4096 * 4),
    # gemm 64^3: 2*64*64*64 = 524288; A, B, C each 64*64 = 4096 floats.
    ("gemm", "square", "float32", 524_288, 3 * 4096 * 4),
    ("gemm", "square", "bfloat16", 524_288, 3 * 4096 * 2),
    # gemm M=96, K=48, N=80: 2*96*48*80 = 737280; 96*48 + 48*80 + 96*80 = 4608+3840+7680 = 16128.
    ("gemm", "rect", "float32", 737_280, 16_128 * 4),
    # selu n = 4096: exp, subtract, times alpha, select, times scale = 5 per element.
    ("selu", "1d", "float32", 5 * 4096, 2 * 4096 * 4),
    # conv3d N=2, 8^3, 4 -> 8 channels, 3^3 taps: 1024 voxels; 2*1024*8*4*27 = 1769472 plus
    # 1024*8 = 8192 bias adds; x 1024*4 + w 27*4*8 + b 8 + y 1024*8 = 4096+864+8+8192 = 13160.
    ("conv3d", "same", "float32", 1_777_664, 13_160 * 4),
    # mlp_train B=32, widths 16-32-32-4 (layers 16x32, 32x32, 32x4):
    #   forward matmuls 2*32*(512+1024+128) = 106496, bias adds 32*(32+32+4) = 2176,
    #   tanh 32*(32+32) = 2048; loss 3*32*4 + 1 = 385; loss gradient 32*4 = 128;
    #   dW 106496; db 2176; dx for layers 2 and 3: 2*32*(1024+128) = 73728;
    #   tanh derivative 3*32*(32+32) = 6144; SGD 2 * 1732 parameters = 3464.
    #   Sum: 303241. Bytes: x 512 + y 128 + 2 * 1732 parameters = 4104 floats.
    ("mlp_train", "tanh", "float32", 303_241, 4_104 * 4),
    # hessian n = 4096: 11 FLOPs per element for the closed-form f''.
    ("hessian", "elementwise", "float32", 11 * 4096, 2 * 4096 * 4),
]


@pytest.mark.parametrize(("name", "variant", "dtype", "flops", "bytes_moved"), HAND_COUNTS)
def test_work_counts_of_the_tiny_presets_match_a_hand_count(
    name, variant, dtype, flops, bytes_moved
):
    counts = get_spec(name).counts(preset="tiny", dtype=dtype, variant=variant)
    assert counts == WorkCounts(flops=flops, bytes_moved=bytes_moved)


def test_gemm_gpu_preset_is_an_8192_cube_and_stencil_gpu_covers_2_to_the_28():
    assert get_spec("gemm").counts("gpu").flops == 2 * 8192**3
    assert get_spec("stencil").counts("gpu").bytes_moved == 2 * 2**28 * 4


@pytest.mark.parametrize("name", NAMES)
def test_presets_grow_and_gpu_sizes_are_compute_or_memory_bound_as_declared(name):
    spec = get_spec(name)
    tiny, cpu, gpu = (spec.counts(p) for p in spec.presets)
    assert tiny.flops < cpu.flops < gpu.flops
    # An H100's fp32-ish ridge point is well above 10 FLOP/byte; elementwise work is far below.
    assert (gpu.intensity > 10) is spec.compute_bound


@pytest.mark.parametrize(
    ("name", "dtype", "precision", "roof"),
    [
        ("gemm", "float32", "highest", "fp32"),
        ("gemm", "float32", "tf32", "tf32"),
        ("gemm", "float32", "default", "tf32"),
        ("gemm", "bfloat16", "default", "bf16"),
        ("conv3d", "bfloat16", "default", "bf16"),
        ("mlp_train", "float32", "default", "tf32"),
        ("stencil", "float32", "default", "fp32"),
        ("stencil", "bfloat16", "default", "fp32"),
        ("selu", "float32", "highest", "fp32"),
        ("hessian", "bfloat16", "default", "fp32"),
    ],
)
def test_peak_names_the_compute_roof_that_applies(name, dtype, precision, roof):
    assert get_spec(name).peak(dtype, precision) == roof


@pytest.mark.parametrize("name", NAMES)
def test_every_workload_has_a_tolerance_for_every_dtype_and_precision(name):
    spec = get_spec(name)
    assert name in FP32_TOLERANCE
    for dtype in spec.dtypes:
        for precision in spec.precisions_for(dtype):
            tol = tolerance_for(dtype, precision, name)
            assert 0 < tol <= 5e-2
    assert tolerance_for("float32", "highest", name) <= 1e-4
    assert tolerance_for("bfloat16", "default", name) >= 1e-2


def test_default_precision_of_matmul_work_gets_the_tf32_tolerance_it_has_on_a_gpu():
    assert tolerance_for("float32", "default", "gemm") == tolerance_for("float32", "tf32", "gemm")
    fp32 = tolerance_for("float32", "highest", "selu")
    assert tolerance_for("float32", "default", "selu") == fp32


@pytest.mark.parametrize(
    ("name", "precision", "roof"),
    [
        ("gemm", "default", "fp32"),  # torch.matmul: float32 matmul precision "highest"
        ("mlp_train", "default", "fp32"),
        ("conv3d", "default", "tf32"),  # cuDNN: torch.backends.cudnn.allow_tf32 is on
        ("gemm", "tf32", "tf32"),
        ("conv3d", "highest", "fp32"),
        ("selu", "default", "fp32"),
    ],
)
def test_pytorch_keeps_float32_matmuls_at_fp32_by_default_but_not_convolutions(
    name, precision, roof
):
    assert get_spec(name).peak("float32", precision, "pytorch") == roof
    assert get_spec(name).peak("bfloat16", "default", "pytorch") in ("bf16", "fp32")
    if precision == "default" and name in ("gemm", "mlp_train"):
        assert get_spec(name).peak("float32", precision, "jax") == "tf32"
