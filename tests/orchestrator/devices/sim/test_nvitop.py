"""nvitop, an NVML client that calls NVML as C is called, runs unchanged over the simulated NVML.

As the gpustat test does, nvitop runs in a subprocess with ``sys.modules["pynvml"]`` pointing at
the sim and nothing else changed. nvitop calls some entry points itself
(``_nvmlGetFunctionPointer(...)(handle, byref(...))``: versioned memory and temperature, the
running-process lists, field values), so this holds only if the sim's entry points are C's.
"""

from __future__ import annotations

import json
import os

import pynvml
import pytest

from orchestrator.devices.sim import nvml as sim
from orchestrator.devices.sim.state import STATE_ENV, create_machine
from tests.orchestrator.devices.sim.test_dropin import STENCIL, run_python
from tests.orchestrator.devices.sim.test_sim_processes import GIB, Worker

NVITOP_DEVICES = """
import json
from nvitop import Device
answers = []
for d in Device.all():
    answers.append(dict(
        index=d.index, name=d.name(), uuid=d.uuid(), bus_id=d.bus_id(),
        memory_total=d.memory_total(), memory_used=d.memory_used(), memory_free=d.memory_free(),
        gpu_utilization=d.gpu_utilization(), memory_utilization=d.memory_utilization(),
        power_usage=d.power_usage(), power_limit=d.power_limit(), temperature=d.temperature(),
        sm_clock=d.sm_clock(), memory_clock=d.memory_clock(), max_sm_clock=d.max_sm_clock(),
        persistence_mode=d.persistence_mode(), compute_capability=d.cuda_compute_capability(),
        processes={str(pid): p.gpu_memory() for pid, p in d.processes().items()},
    ))
print(json.dumps(answers))
"""


@pytest.fixture
def busy_machine(tmp_path, monkeypatch):
    """A100 (this process ran kernels on it), H200 (a worker process holds it, clocks locked),
    P100 (idle: no energy counter, no power fields)."""
    state = tmp_path / "sim"
    create_machine(state, ["a100_sxm4_40gb", "h200_141gb", "p100_pcie_16gb"])
    monkeypatch.setenv(STATE_ENV, str(state))
    sim.nvmlInit()
    a100, h200 = sim.nvmlDeviceGetHandleByIndex(0), sim.nvmlDeviceGetHandleByIndex(1)
    while sim.simDeviceGetTimeS(a100) < 0.3:
        sim.simDeviceRecordKernelCall(a100, STENCIL)
    sim.nvmlDeviceSetGpuLockedClocks(h200, 1200, 1200)
    sim.simDeviceSetTemperatureC(h200, 57.0)
    worker = Worker(state, sim.nvmlDeviceGetUUID(h200), 3 * GIB)
    yield state, worker
    worker.stop()
    sim.nvmlShutdown()


def sim_answers(index: int) -> dict:
    """What the sim's own pynvml-style calls answer for GPU ``index``, in nvitop's units."""
    h = sim.nvmlDeviceGetHandleByIndex(index)
    memory = sim.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
    util = sim.nvmlDeviceGetUtilizationRates(h)
    return dict(
        index=index, name=sim.nvmlDeviceGetName(h), uuid=sim.nvmlDeviceGetUUID(h),
        bus_id=sim.nvmlDeviceGetPciInfo(h).busId,
        memory_total=memory.total, memory_used=memory.used, memory_free=memory.free,
        gpu_utilization=util.gpu, memory_utilization=util.memory,
        power_usage=sim.nvmlDeviceGetPowerUsage(h),
        power_limit=sim.nvmlDeviceGetPowerManagementLimit(h),
        temperature=sim.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
        sm_clock=sim.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
        memory_clock=sim.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM),
        max_sm_clock=sim.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM),
        persistence_mode=["Disabled", "Enabled"][sim.nvmlDeviceGetPersistenceMode(h)],
        compute_capability=list(sim.nvmlDeviceGetCudaComputeCapability(h)),
        processes={str(p.pid): p.usedGpuMemory
                   for p in sim.nvmlDeviceGetComputeRunningProcesses(h)},
    )


def test_nvitops_device_api_answers_what_the_sims_own_calls_answer(busy_machine):
    state, worker = busy_machine
    out = run_python(NVITOP_DEVICES, state)
    assert out.returncode == 0, out.stderr
    assert "ERROR" not in out.stderr, out.stderr  # nvitop logs every NVML call that failed
    devices = json.loads(out.stdout)
    assert devices == [sim_answers(i) for i in range(3)]
    a100, h200, p100 = devices
    assert a100["processes"] == {str(os.getpid()): 512 * 2**20}  # a context: it ran kernels
    assert h200["processes"] == {str(worker.pid): worker.held_bytes}
    assert h200["memory_used"] == worker.held_bytes and h200["sm_clock"] == 1200
    assert p100["processes"] == {} and p100["name"] == "Tesla P100-PCIE-16GB"
    assert a100["gpu_utilization"] == 100 and h200["gpu_utilization"] == 0


def test_nvitop_once_prints_the_simulated_boards_and_the_worker_holding_one(busy_machine):
    state, worker = busy_machine
    out = run_python("from nvitop.cli import main; sys.argv = ['nvitop', '--once']; main()",
                     state)
    assert out.returncode == 0, out.stderr
    assert "ERROR" not in out.stderr, out.stderr
    screen = out.stdout
    assert f"Driver Version: {sim.nvmlSystemGetDriverVersion()}" in screen
    for name in ("A100-SXM4-40GB", "H200", "P100-PCIE-16GB"):
        assert name in screen
    assert "700W" in screen and "400W" in screen  # the power limits
    rows = [line.split() for line in screen.splitlines() if f" {worker.pid} " in line]
    assert len(rows) == 1, screen
    gpu, pid, kind, _user, memory = rows[0][1:6]
    assert (gpu, pid, kind) == ("1", str(worker.pid), "C")  # GPU 1 held by a compute process
    assert memory == f"{worker.held_bytes // 2**20}MiB"


def test_nvitop_stops_listing_a_worker_once_it_is_killed(busy_machine):
    state, worker = busy_machine
    worker.stop()
    out = run_python(NVITOP_DEVICES, state)
    assert out.returncode == 0, out.stderr
    h200 = json.loads(out.stdout)[1]
    assert h200["processes"] == {} and h200["memory_used"] == 0
