"""The processes that hold each simulated GPU: NVML's running-process calls answer real pids.

A "worker" here is a separate process that opens its GPU as ``GpuWorker`` does
(``open_backend(..., join_existing=True)``, the GPU by UUID) and records what a trial's process
would hold (``Device.model_allocation``), then waits for a command on stdin.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pynvml
import pytest

from orchestrator.devices.base import KernelWork
from orchestrator.devices.sim import nvml as sim
from orchestrator.devices.sim.memory import CONTEXT_BYTES, process_bytes
from orchestrator.devices.sim.processes import PROCESSES, process_start
from orchestrator.devices.sim.state import STATE_ENV, Machine, create_machine

GIB = 2**30
STENCIL = KernelWork(
    flops=2e9, bytes_moved=4e8, peak="fp32", kernel_class="stencil", framework="jax"
)
WORKER = textwrap.dedent(
    """
    import sys
    from orchestrator.devices import open_backend
    state_dir, uuid, in_use = sys.argv[1], sys.argv[2], int(sys.argv[3])
    backend = open_backend({"backend": "sim", "state_dir": state_dir}, join_existing=True)
    device = backend.device(uuid=uuid)
    print(device.model_allocation(in_use, "jax"), flush=True)
    for line in sys.stdin:
        if line.strip() == "close":
            backend.close()
            print("closed", flush=True)
    """
)


class Worker:
    """A process holding one simulated GPU until told to close, or killed."""

    def __init__(self, state_dir, uuid: str, in_use_bytes: int) -> None:
        env = {k: v for k, v in os.environ.items() if k != STATE_ENV}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WORKER, str(state_dir), uuid, str(in_use_bytes)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
        )
        line = self.proc.stdout.readline()
        assert line.strip().isdigit(), f"worker did not start: {line!r}"
        self.held_bytes = int(line)
        self.pid = self.proc.pid

    def close(self) -> None:
        self.proc.stdin.write("close\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "closed"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)


@pytest.fixture
def machine(tmp_path, monkeypatch):
    """A100 + H200, initialised in this process."""
    state = tmp_path / "sim"
    create_machine(state, ["a100_sxm4_40gb", "h200_141gb"])
    monkeypatch.setenv(STATE_ENV, str(state))
    sim.nvmlInit()
    yield state
    sim.nvmlShutdown()


@pytest.fixture
def start_worker(machine):
    """Start workers on GPUs of ``machine`` (by index); each is killed at the end."""
    workers: list[Worker] = []

    def start(index: int, in_use_bytes: int) -> Worker:
        uuid = sim.nvmlDeviceGetUUID(sim.nvmlDeviceGetHandleByIndex(index))
        workers.append(Worker(machine, uuid, in_use_bytes))
        return workers[-1]

    yield start
    for w in workers:
        w.stop()


def listed(index: int) -> dict[int, int]:
    """``{pid: used bytes}`` of the GPU's compute processes, as NVML lists them."""
    h = sim.nvmlDeviceGetHandleByIndex(index)
    return {p.pid: p.usedGpuMemory for p in sim.nvmlDeviceGetComputeRunningProcesses(h)}


def used(index: int) -> int:
    h = sim.nvmlDeviceGetHandleByIndex(index)
    return sim.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2).used


def test_a_worker_is_listed_on_its_gpu_with_the_memory_it_holds(start_worker):
    worker = start_worker(1, 3 * GIB)
    assert worker.held_bytes == process_bytes(3 * GIB, "jax")
    assert listed(1) == {worker.pid: worker.held_bytes}
    assert listed(0) == {}
    assert used(1) == worker.held_bytes  # NVML's used memory is what its processes hold
    h = sim.nvmlDeviceGetHandleByIndex(1)
    for call in (sim.nvmlDeviceGetComputeRunningProcesses_v3,
                 sim.nvmlDeviceGetComputeRunningProcesses_v2):
        (info,) = call(h)
        assert (info.pid, info.usedGpuMemory) == (worker.pid, worker.held_bytes)
        assert info.gpuInstanceId == info.computeInstanceId == 0xFFFFFFFF  # no MIG
    assert sim.nvmlDeviceGetGraphicsRunningProcesses(h) == []  # a compute context only
    assert sim.nvmlDeviceGetMPSComputeRunningProcesses(h) == []


def test_two_workers_on_one_gpu_are_both_listed_and_their_memory_adds_up(start_worker):
    a, b = start_worker(0, 1 * GIB), start_worker(0, 2 * GIB)
    assert listed(0) == {a.pid: a.held_bytes, b.pid: b.held_bytes}
    assert used(0) == a.held_bytes + b.held_bytes


def test_a_killed_worker_is_not_listed_even_before_it_is_reaped(start_worker):
    a, b = start_worker(1, 2 * GIB), start_worker(1, 1 * GIB)
    os.kill(a.pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while os.path.exists(f"/proc/{a.pid}") and _state(a.pid) != "Z":
        assert time.monotonic() < deadline, "the killed worker did not exit"
        time.sleep(0.01)
    assert listed(1) == {b.pid: b.held_bytes}  # a zombie holds no context
    a.proc.wait(timeout=30)
    assert listed(1) == {b.pid: b.held_bytes}
    assert used(1) == b.held_bytes


def test_a_worker_that_closes_its_backend_is_no_longer_listed_while_it_lives(start_worker):
    worker = start_worker(0, 1 * GIB)
    worker.close()
    assert worker.proc.poll() is None  # still running
    assert listed(0) == {}
    assert used(0) == 0


def test_a_record_of_a_pid_since_given_to_another_process_is_not_listed(start_worker, machine):
    worker = start_worker(0, GIB)
    started = process_start(worker.pid)
    stale = {"pid": worker.pid, "started": started + 1, "used_bytes": 2 * GIB}
    mine = {"pid": os.getpid(), "started": process_start(os.getpid()), "used_bytes": GIB}
    Machine(machine).update(1, lambda s: s.update({PROCESSES: [stale, mine]}))
    assert listed(1) == {os.getpid(): GIB}  # same pid, another start: that process has exited
    assert listed(0) == {worker.pid: worker.held_bytes}  # the pid's own record still counts


def test_records_of_dead_processes_are_dropped_at_the_next_write(machine):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    record = {"pid": int(dead.stdout), "started": None, "used_bytes": GIB}
    m = Machine(machine)
    m.update(0, lambda s: s.update({PROCESSES: [record]}))
    assert listed(0) == {} and used(0) == 0
    sim.simDeviceSetAllocatedBytes(sim.nvmlDeviceGetHandleByIndex(0), 2 * GIB)
    assert [r["pid"] for r in m.read(0)[PROCESSES]] == [os.getpid()]


def test_a_process_running_kernels_holds_a_context_until_it_frees_everything(machine):
    h = sim.nvmlDeviceGetHandleByIndex(0)
    sim.simDeviceRecordKernelCall(h, STENCIL)
    assert listed(0) == {os.getpid(): CONTEXT_BYTES}
    sim.simDeviceSetAllocatedBytes(h, 5 * GIB)
    sim.simDeviceRecordKernelCall(h, STENCIL)
    assert listed(0) == {os.getpid(): 5 * GIB}  # a later call keeps what it holds
    sim.simDeviceSetAllocatedBytes(h, 0)
    assert listed(0) == {}


def test_release_drops_this_process_from_every_gpu_and_only_it(start_worker):
    worker = start_worker(0, GIB)
    for i in (0, 1):
        sim.simDeviceSetAllocatedBytes(sim.nvmlDeviceGetHandleByIndex(i), GIB)
    sim.simReleaseProcess()
    assert listed(0) == {worker.pid: worker.held_bytes} and listed(1) == {}


def _state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None
