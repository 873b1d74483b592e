"""The simulated NVML as a drop-in ``pynvml``: a client the project did not write runs unchanged.

gpustat (``gpustat --json``) runs in a subprocess with ``sys.modules["pynvml"]`` pointing at the
sim; the rest checks the calls such clients make, against nvidia-ml-py's own signatures, types
and errors.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import textwrap
from ctypes import byref, c_int

import pynvml
import pytest

from orchestrator.devices import DeviceNotFoundError, open_backend
from orchestrator.devices.base import KernelWork
from orchestrator.devices.nvml import NvmlBackend
from orchestrator.devices.sim import nvml as sim
from orchestrator.devices.sim.profile import available_profiles, load_profile
from orchestrator.devices.sim.state import STATE_ENV, create_machine

STENCIL = KernelWork(
    flops=2e9, bytes_moved=4e8, peak="fp32", kernel_class="stencil", framework="jax"
)
AS_PYNVML = "import sys; from orchestrator.devices.sim import nvml; sys.modules['pynvml'] = nvml\n"


def run_python(code: str, state_dir, *args: str) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter, the simulated NVML standing in for pynvml."""
    env = {k: v for k, v in os.environ.items() if k != STATE_ENV}
    if state_dir is not None:
        env[STATE_ENV] = str(state_dir)
    return subprocess.run(
        [sys.executable, "-c", AS_PYNVML + textwrap.dedent(code), *args],
        env=env, capture_output=True, text=True, timeout=120,
    )


@pytest.fixture
def machine(tmp_path, monkeypatch):
    """A100 + H200 + V100, initialised in this process too."""
    state = tmp_path / "sim"
    create_machine(state, ["a100_sxm4_40gb", "h200_141gb", "v100_sxm2_16gb"])
    monkeypatch.setenv(STATE_ENV, str(state))
    sim.nvmlInit()
    yield state
    sim.nvmlShutdown()


# --- a third-party client, unchanged ------------------------------------------------------------
def test_gpustat_shows_the_simulated_gpus_as_they_are(machine):
    a100_handle = sim.nvmlDeviceGetHandleByIndex(0)
    while sim.simDeviceGetTimeS(a100_handle) < 0.3:  # past a few of its power sensor's updates
        sim.simDeviceRecordKernelCall(a100_handle, STENCIL)
    sim.simDeviceSetLost(sim.nvmlDeviceGetHandleByIndex(2), True)
    out = run_python("import gpustat; sys.argv = ['gpustat', '--json']; gpustat.main()", machine)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["driver_version"] == sim.nvmlSystemGetDriverVersion()
    a100, h200, lost = report["gpus"]
    for gpu, index in ((a100, 0), (h200, 1)):
        h = sim.nvmlDeviceGetHandleByIndex(index)
        assert gpu["index"] == index
        assert gpu["name"] == sim.nvmlDeviceGetName(h)
        assert gpu["uuid"] == sim.nvmlDeviceGetUUID(h)
        gpu_temp = sim.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
        assert gpu["temperature.gpu"] == gpu_temp
        assert gpu["enforced.power.limit"] == sim.nvmlDeviceGetEnforcedPowerLimit(h) // 1000
        assert gpu["fan.speed"] is None  # passive boards
    assert (a100["name"], h200["name"]) == ("NVIDIA A100-SXM4-40GB", "NVIDIA H200")
    assert (a100["memory.total"], h200["memory.total"]) == (40 * 1024, 141 * 1024)  # MiB
    assert a100["enforced.power.limit"] == 400 and h200["enforced.power.limit"] == 700
    assert a100["power.draw"] == sim.nvmlDeviceGetPowerUsage(a100_handle) // 1000
    assert a100["power.draw"] > load_profile("a100_sxm4_40gb").idle_power_w  # under load
    assert a100["utilization.gpu"] == 100 and h200["utilization.gpu"] == 0
    assert h200["power.draw"] == round(load_profile("h200_141gb").idle_power_w)
    assert lost["index"] == 2 and lost["name"] == "((GPU is lost))"  # its handle is refused
    # this process ran kernels on the A100: it holds a context there, and nothing holds the H200
    assert [(p["pid"], p["gpu_memory_usage"]) for p in a100["processes"]] == [(os.getpid(), 512)]
    assert h200["processes"] == []


def test_gpustat_sees_no_gpu_without_a_simulated_machine(tmp_path):
    out = run_python("import gpustat; print(gpustat.gpu_count(), gpustat.is_available())", None)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0", "False"]


# --- the library's lookups -------------------------------------------------------------------
def test_function_pointers_are_looked_up_cached_and_refused_as_pynvml_does(tmp_path):
    create_machine(tmp_path / "sim", "a100_sxm4_40gb")
    out = run_python(
        """
        import pynvml
        try:
            pynvml._nvmlGetFunctionPointer("nvmlDeviceGetCount")
        except pynvml.NVMLError_Uninitialized:
            print("uninitialized before init")
        pynvml.nvmlInit()
        fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetHandleByIndex_v2")
        cache = pynvml._nvmlGetFunctionPointer_cache
        print(fn is cache["nvmlDeviceGetHandleByIndex_v2"], fn.__name__)
        v2 = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetMemoryInfo_v2")
        print(v2 is pynvml._nvmlGetFunctionPointer("nvmlDeviceGetMemoryInfo_v2"))
        for name in ("nvmlDeviceGetBAR1MemoryInfo", "nvmlNoSuchCall", "simDeviceIdle"):
            try:
                pynvml._nvmlGetFunctionPointer(name)
            except pynvml.NVMLError_FunctionNotFound:
                print("not found", name)
        try:
            pynvml.nvmlDeviceGetBAR1MemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0))
        except pynvml.NVMLError_FunctionNotFound:
            print("call not found")
        pynvml.nvmlShutdown()
        print(callable(pynvml._nvmlGetFunctionPointer("nvmlDeviceGetUUID")))  # stays loaded
        """,
        tmp_path / "sim",
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "uninitialized before init",
        "True nvmlDeviceGetHandleByIndex_v2",
        "True",
        "not found nvmlDeviceGetBAR1MemoryInfo",
        "not found nvmlNoSuchCall",
        "not found simDeviceIdle",
        "call not found",
        "True",
    ]


def test_a_client_filling_the_pointer_cache_is_answered_from_it(machine):
    sim._nvmlGetFunctionPointer_cache["nvmlDeviceGetFancyThing_v9"] = sim.nvmlDeviceGetName
    try:
        assert sim._nvmlGetFunctionPointer("nvmlDeviceGetFancyThing_v9") is sim.nvmlDeviceGetName
    finally:
        del sim._nvmlGetFunctionPointer_cache["nvmlDeviceGetFancyThing_v9"]


def test_every_function_pynvml_also_has_takes_pynvmls_parameter_names():
    shared = [
        name for name, fn in vars(sim).items()
        if inspect.isfunction(fn) and not name.startswith("_")
        and inspect.isfunction(getattr(pynvml, name, None))
    ]
    assert len(shared) > 60
    for name in shared:
        ours = inspect.signature(getattr(sim, name)).parameters.values()
        theirs = inspect.signature(getattr(pynvml, name)).parameters.values()
        assert [p.name for p in ours] == [p.name for p in theirs], name
        for a, b in zip(ours, theirs):
            empty = inspect.Parameter.empty
            assert (a.default is empty) == (b.default is empty), name
            if isinstance(b.default, (int, str, float, type(None))):
                assert a.default == b.default, (name, a.name)
            elif b.default is not inspect.Parameter.empty:  # a ctypes out-argument
                assert type(a.default) is type(b.default) and a.default.value == b.default.value


# --- nvmlInit without a machine ---------------------------------------------------------------
@pytest.mark.parametrize("where", ["unset", "empty", "missing"])
def test_init_without_a_machine_is_nvidias_no_driver_error_saying_what_to_do(tmp_path, where):
    state = {"unset": None, "empty": tmp_path, "missing": tmp_path / "nowhere"}[where]
    out = run_python(
        """
        import pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError_LibraryNotFound as e:
            print(e.value == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, str(e))
        """,
        state,
    )
    assert out.returncode == 0, out.stderr
    ok, text = out.stdout.strip().split(" ", 1)
    assert ok == "True" and text.startswith("NVML Shared Library Not Found (simulated NVML:")
    assert STATE_ENV in text and "create_machine" in text and "\n" not in text


def test_init_on_a_damaged_machine_is_an_nvml_error(tmp_path, monkeypatch):
    create_machine(tmp_path, "a100_sxm4_40gb")
    (tmp_path / "machine.json").write_text("{not json")
    monkeypatch.setenv(STATE_ENV, str(tmp_path))
    with pytest.raises(pynvml.NVMLError_Unknown, match="cannot be opened"):
        sim.nvmlInit()
    with pytest.raises(pynvml.NVMLError_Uninitialized):  # nothing was opened
        sim.nvmlDeviceGetCount()


def test_the_adapter_over_no_machine_refuses_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv(STATE_ENV, str(tmp_path))
    with pytest.raises(DeviceNotFoundError) as e:
        NvmlBackend(sim, "sim")
    assert "\n" not in str(e.value) and STATE_ENV in str(e.value)
    with open_backend({"backend": "sim", "state_dir": str(tmp_path / "made")}) as backend:
        assert backend.count() == 1  # open_backend makes the machine first, as dvfs does


# --- the calls monitoring clients make ---------------------------------------------------------
def test_temperature_v_answers_as_the_plain_call_and_checks_its_version(machine):
    h = sim.nvmlDeviceGetHandleByIndex(0)
    sim.simDeviceSetTemperatureC(h, 61.4)
    assert sim.nvmlDeviceGetTemperatureV(h, pynvml.NVML_TEMPERATURE_GPU) == 61
    v1 = pynvml.nvmlTemperature_v1
    assert sim.nvmlDeviceGetTemperatureV(h, pynvml.NVML_TEMPERATURE_GPU, v1) == 61
    with pytest.raises(pynvml.NVMLError_ArgumentVersionMismatch):
        sim.nvmlDeviceGetTemperatureV(h, pynvml.NVML_TEMPERATURE_GPU, version=7)


def test_persistence_mode_is_off_at_load_and_set_only_by_a_privileged_user(
    machine, tmp_path, monkeypatch
):
    h = sim.nvmlDeviceGetHandleByIndex(1)
    assert sim.nvmlDeviceGetPersistenceMode(h) == pynvml.NVML_FEATURE_DISABLED
    sim.nvmlDeviceSetPersistenceMode(h, pynvml.NVML_FEATURE_ENABLED)
    assert sim.nvmlDeviceGetPersistenceMode(h) == pynvml.NVML_FEATURE_ENABLED
    assert sim.nvmlDeviceGetPersistenceMode(sim.nvmlDeviceGetHandleByIndex(0)) == 0
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        sim.nvmlDeviceSetPersistenceMode(h, 2)
    sim.nvmlShutdown()
    create_machine(tmp_path / "user", "a100_sxm4_40gb", privileged=False)
    monkeypatch.setenv(STATE_ENV, str(tmp_path / "user"))
    sim.nvmlInit()
    with pytest.raises(pynvml.NVMLError_NoPermission):
        sim.nvmlDeviceSetPersistenceMode(sim.nvmlDeviceGetHandleByIndex(0), 1)


def test_no_shipped_board_has_a_c2c_link(tmp_path, monkeypatch):
    names = available_profiles()
    create_machine(tmp_path, names)
    monkeypatch.setenv(STATE_ENV, str(tmp_path))
    sim.nvmlInit()
    try:
        for i in range(len(names)):
            with pytest.raises(pynvml.NVMLError_NotSupported):
                sim.nvmlDeviceGetC2cModeInfoV(sim.nvmlDeviceGetHandleByIndex(i))
            with pytest.raises(pynvml.NVMLError_NotSupported):
                sim.nvmlDeviceGetFanSpeed(sim.nvmlDeviceGetHandleByIndex(i))  # passive boards
    finally:
        sim.nvmlShutdown()


def test_memory_info_v1_and_v2_in_pynvmls_structs(machine):
    h = sim.nvmlDeviceGetHandleByIndex(1)
    v1 = sim.nvmlDeviceGetMemoryInfo(h)
    v2 = sim.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
    assert isinstance(v1, pynvml.c_nvmlMemory_t) and isinstance(v2, pynvml.c_nvmlMemory_v2_t)
    assert v1.total == v2.total == 141 * 2**30
    assert v1.used == v2.reserved > 0 and v2.used == 0  # v1's used includes the reserved memory
    assert v1.free == v2.free == v1.total - v1.used
    with pytest.raises(pynvml.NVMLError_ArgumentVersionMismatch):
        sim.nvmlDeviceGetMemoryInfo(h, version=3)


def test_memory_a_trial_holds_is_nvmls_used_memory_with_each_frameworks_allocator(machine):
    """A trial tells the sim what its process holds (context and allocator pool); NVML reports
    it as used. JAX without preallocation holds its peak rounded to 2 MiB; TensorFlow with memory
    growth holds the doubling regions its peak needed (2+4+...+2**k MiB)."""
    from orchestrator.devices.sim.memory import CONTEXT_BYTES, allocator_pool_bytes

    mib = 2**20
    assert allocator_pool_bytes(5 * mib + 1, "jax") == 6 * mib
    assert allocator_pool_bytes(5 * mib + 1, "tensorflow") == (2 + 4) * mib
    assert allocator_pool_bytes(7 * mib, "tensorflow") == (2 + 4 + 8) * mib
    assert allocator_pool_bytes(0, "tensorflow") == allocator_pool_bytes(0, "jax") == 0
    h = sim.nvmlDeviceGetHandleByIndex(1)
    before = sim.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
    held = CONTEXT_BYTES + allocator_pool_bytes(3 * 2**30, "tensorflow")
    sim.simDeviceSetAllocatedBytes(h, held)
    v1 = sim.nvmlDeviceGetMemoryInfo(h)
    v2 = sim.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
    assert v2.used == held and v1.used == held + v2.reserved
    assert v2.free == before.free - held and v1.free == v2.free
    other = sim.nvmlDeviceGetHandleByIndex(0)  # nothing ran there: only the driver's reserve
    assert sim.nvmlDeviceGetMemoryInfo(other, version=pynvml.nvmlMemory_v2).used == 0
    sim.simDeviceSetAllocatedBytes(h, 10**15)  # more than the board: used is all there is
    assert sim.nvmlDeviceGetMemoryInfo(h).free == 0


def test_utilization_follows_what_the_gpu_last_did(machine):
    h = sim.nvmlDeviceGetHandleByIndex(0)
    idle = sim.nvmlDeviceGetUtilizationRates(h)
    assert isinstance(idle, pynvml.c_nvmlUtilization_t) and (idle.gpu, idle.memory) == (0, 0)
    sim.simDeviceRecordKernelCall(h, STENCIL)
    busy = sim.nvmlDeviceGetUtilizationRates(h)
    assert busy.gpu == 100 and 0 < busy.memory <= 100
    sim.simDeviceIdle(h, 1.0)
    assert sim.nvmlDeviceGetUtilizationRates(h).gpu == 0
    assert sim.nvmlDeviceGetEncoderUtilization(h) == [0, 167_000]
    assert sim.nvmlDeviceGetDecoderUtilization(h) == [0, 167_000]


def test_versions_processes_and_modes_answer_as_an_r550_board(machine):
    a100, v100 = sim.nvmlDeviceGetHandleByIndex(0), sim.nvmlDeviceGetHandleByIndex(2)
    assert sim.nvmlSystemGetNVMLVersion() == "12." + sim.nvmlSystemGetDriverVersion()
    assert sim.nvmlSystemGetCudaDriverVersion() == sim.nvmlSystemGetCudaDriverVersion_v2() == 12040
    assert sim.nvmlDeviceGetComputeRunningProcesses(a100) == []
    assert sim.nvmlDeviceGetGraphicsRunningProcesses(a100) == []
    assert sim.nvmlDeviceGetCudaComputeCapability(a100) == (8, 0)
    assert sim.nvmlDeviceGetCudaComputeCapability(v100) == (7, 0)
    assert sim.nvmlDeviceGetMigMode(a100) == [0, 0]
    with pytest.raises(pynvml.NVMLError_NotSupported):
        sim.nvmlDeviceGetMigMode(v100)
    assert sim.nvmlDeviceGetBrand(v100) == pynvml.NVML_BRAND_TESLA
    assert sim.nvmlDeviceGetMinorNumber(v100) == 2
    serial = sim.nvmlDeviceGetSerial(a100)
    assert len(serial) == 13 and serial.isdigit() and serial != sim.nvmlDeviceGetSerial(v100)
    assert sim.nvmlDeviceGetPerformanceState(a100) == pynvml.NVML_PSTATE_0
    assert sim.nvmlErrorString(pynvml.NVML_ERROR_GPU_IS_LOST) == "GPU is lost"


def test_the_offset_range_fills_references_as_pynvml_does(machine):
    h = sim.nvmlDeviceGetHandleByIndex(0)
    lo, hi = sim.nvmlDeviceGetGpcClkMinMaxVfOffset(h)
    a, b = c_int(), c_int()
    assert sim.nvmlDeviceGetGpcClkMinMaxVfOffset(h, byref(a), byref(b)) == pynvml.NVML_SUCCESS
    assert (a.value, b.value) == (lo, hi) and lo < 0 < hi


# --- known defects, fixed ---------------------------------------------------------------------
def test_a_locked_clock_shows_at_once_idle_or_busy(machine):
    h = sim.nvmlDeviceGetHandleByIndex(0)
    p = load_profile("a100_sxm4_40gb")
    assert sim.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM) == p.f_min_mhz  # idle at load
    sim.nvmlDeviceSetGpuLockedClocks(h, 1005, 1110)
    assert sim.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM) == 1005  # idle: at the locked min
    assert sim.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_GRAPHICS) == 1005
    call = sim.simDeviceRecordKernelCall(h, STENCIL)
    assert sim.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM) == call.sm_clock_mhz <= 1110
    sim.nvmlDeviceSetGpuLockedClocks(h, 510, 510)  # lowered while resident: drops at once
    assert sim.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM) == 510
    sim.nvmlDeviceSetGpuLockedClocks(h, 1200, 1212)  # 1212 is not supported: NVML rounds down
    sim.simDeviceIdle(h, 0.5)
    assert sim.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM) == 1200
    sim.nvmlDeviceResetGpuLockedClocks(h)
    assert sim.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM) == p.f_min_mhz


def test_a_locked_memory_clock_shows_at_once(machine):
    h = sim.nvmlDeviceGetHandleByIndex(2)
    mems = sorted(load_profile("v100_sxm2_16gb").mem_clocks_mhz)
    sim.nvmlDeviceSetMemoryLockedClocks(h, mems[0], mems[0])
    assert sim.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM) == mems[0]
    sim.nvmlDeviceResetMemoryLockedClocks(h)
    assert sim.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM) == mems[-1]


def test_nvml_hands_out_no_handle_to_a_lost_gpu(machine):
    h = sim.nvmlDeviceGetHandleByIndex(1)
    uuid, bus = sim.nvmlDeviceGetUUID(h), sim.nvmlDeviceGetPciInfo(h).busId
    bus = bus.decode() if isinstance(bus, bytes) else bus
    sim.simDeviceSetLost(h, True)
    for lookup in (
        lambda: sim.nvmlDeviceGetHandleByIndex(1),
        lambda: sim.nvmlDeviceGetHandleByUUID(uuid),
        lambda: sim.nvmlDeviceGetHandleByPciBusId(bus),
    ):
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            lookup()
    assert sim.nvmlDeviceGetHandleByIndex(0) is not None  # the others are still there
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        sim.nvmlDeviceGetHandleByIndex(9)  # out of range is still out of range
    sim.simDeviceSetLost(sim.simDeviceGetHandleByUUID(uuid), False)  # the sim's own lookup: a reset
    assert sim.nvmlDeviceGetIndex(sim.nvmlDeviceGetHandleByIndex(1)) == 1
