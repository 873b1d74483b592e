"""Which processes hold each simulated GPU, as NVML's running-process calls report them.

On a real GPU a process appears in ``nvmlDeviceGetComputeRunningProcesses`` from the moment it
creates a CUDA context there (the first kernel launch or allocation) until that context is
destroyed or the process exits; NVML reports its pid and the device memory it holds. The sim's
kernels run on the host, so the sim records the same thing itself, in each GPU's state (key
``processes``: one ``{"pid", "started", "used_bytes"}`` per process), shared by every process as
the rest of the machine is:

- a process that accounts a kernel call on a GPU (``simDeviceRecordKernelCall``) holds it, with
  a context's worth of memory (``memory.CONTEXT_BYTES``) until it says more;
- ``simDeviceSetAllocatedBytes`` sets what the calling process holds (a trial's modelled context
  and allocator pool, ``memory.process_bytes``); 0 means it holds nothing and is no longer listed;
- ``simReleaseProcess`` drops the calling process from every GPU (a ``SimBackend`` calls it on
  close: the worker is done with its GPU);
- a process that has exited is never listed, whatever its record says: every read checks each
  pid, and ``started`` (its start time in clock ticks since boot, from ``/proc/<pid>/stat``)
  tells a pid the kernel has given to a new process from the one recorded. A zombie (exited,
  not yet reaped) is not listed either: its context is gone. Records of dead processes are
  dropped at the next write of that GPU's state.

Pids are the host's: a simulated machine's state directory belongs to one host (each Ray node
has its own, ``devices.mapping.node_device_config``). Only compute contexts exist on the sim: the
graphics and MPS lists are empty. Without ``/proc`` (not Linux) a pid that ``kill(pid, 0)`` finds
is live.
"""

from __future__ import annotations

import os
from typing import Any

import pynvml as _real

from orchestrator.devices.sim.driver import SimHandle, current_machine, gpu_of

PROCESSES = "processes"  # state key: the processes holding the GPU, as recorded
CONTEXT_BYTES = 512 * 2**20  # a CUDA context: about 0.5 GiB on recent drivers (memory.py)
NO_MIG = 0xFFFFFFFF  # gpuInstanceId / computeInstanceId without MIG, as NVML reports them


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """``(state letter, start time in ticks)`` of ``pid`` from ``/proc`` (None: no such process
    there, or no ``/proc`` on this system)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # the name may hold spaces and parentheses
    return fields[0], int(fields[19])


def _has_proc() -> bool:
    return os.path.isdir("/proc/self")


def process_start(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot), None where the system does not say."""
    stat = _proc_stat(pid)
    return None if stat is None else stat[1]


def alive(record: dict[str, Any]) -> bool:
    """Whether the process a record names still runs: the same pid, started at the same tick,
    neither exited nor a zombie."""
    pid = int(record["pid"])
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it exists
    stat = _proc_stat(pid)
    if stat is None:
        return not _has_proc()  # it exited since kill(), unless there is no /proc to ask
    state, started = stat
    recorded = record.get("started")
    return state not in ("Z", "X") and (recorded is None or recorded == started)


def holders(state: dict[str, Any]) -> list[dict[str, Any]]:
    """The live processes holding a GPU, from its state, in the order they came."""
    return [r for r in state.get(PROCESSES) or () if alive(r)]


def held_bytes(state: dict[str, Any]) -> int:
    """The device memory the live processes hold (0 when none does)."""
    return sum(int(r["used_bytes"]) for r in holders(state))


def hold(state: dict[str, Any], used_bytes: int | None = None) -> None:
    """Record, in a GPU's state being updated, that the calling process holds it.

    Args:
        state: the GPU's state (mutated; call inside ``Machine.update``).
        used_bytes: what the process holds now; None keeps what it held, or a context's worth
            for a process new to the GPU; 0 removes it.
    """
    pid = os.getpid()
    others = [r for r in holders(state) if r["pid"] != pid]
    mine = next((r for r in state.get(PROCESSES) or () if r["pid"] == pid), None)
    if used_bytes is None:
        used_bytes = CONTEXT_BYTES if mine is None else int(mine["used_bytes"])
    if used_bytes > 0:
        others.append({"pid": pid, "started": process_start(pid), "used_bytes": int(used_bytes)})
    state[PROCESSES] = others


def hold_once(state: dict[str, Any]) -> None:
    """``hold`` for the per-kernel-call path: nothing to do (no /proc read) once the calling
    process is recorded."""
    pid = os.getpid()
    if not any(r["pid"] == pid for r in state.get(PROCESSES) or ()):
        hold(state)


def simReleaseProcess() -> None:
    """Sim extension: the calling process holds no GPU of the open machine any more (its CUDA
    contexts are destroyed, as at its exit). A GPU it did not hold is not written."""
    m = current_machine()
    pid = os.getpid()
    for i in range(len(m.gpus)):
        if any(r["pid"] == pid for r in m.read(i).get(PROCESSES) or ()):
            m.update(i, lambda s: hold(s, 0), sync=True)


def _process_infos(handle: SimHandle) -> list[Any]:
    """The live holders of a GPU as nvidia-ml-py returns them: friendly objects with the fields
    of ``c_nvmlProcessInfo_v3_t`` (pid, usedGpuMemory in bytes, MIG instance ids)."""
    m, i = gpu_of(handle)
    infos = []
    for record in holders(m.read(i)):
        info = _real.c_nvmlProcessInfo_v3_t()
        info.pid, info.usedGpuMemory = int(record["pid"]), int(record["used_bytes"])
        info.gpuInstanceId = info.computeInstanceId = NO_MIG
        infos.append(_real.nvmlStructToFriendlyObject(info))
    return infos


def nvmlDeviceGetComputeRunningProcesses_v3(handle: SimHandle) -> list[Any]:
    """NVML's nvmlDeviceGetComputeRunningProcesses_v3: every live process holding the GPU."""
    return _process_infos(handle)


def nvmlDeviceGetComputeRunningProcesses_v2(handle: SimHandle) -> list[Any]:
    """NVML's nvmlDeviceGetComputeRunningProcesses_v2: the v3 list (the same fields)."""
    return _process_infos(handle)


def nvmlDeviceGetComputeRunningProcesses(handle: SimHandle) -> list[Any]:
    """NVML's nvmlDeviceGetComputeRunningProcesses (pynvml calls _v3)."""
    return _process_infos(handle)


def _no_processes(handle: SimHandle) -> list[Any]:
    gpu_of(handle)
    return []


def nvmlDeviceGetGraphicsRunningProcesses(handle: SimHandle) -> list[Any]:
    """No process holds a graphics context on the sim: an empty list."""
    return _no_processes(handle)


def nvmlDeviceGetMPSComputeRunningProcesses(handle: SimHandle) -> list[Any]:
    """No MPS server runs on the sim: an empty list."""
    return _no_processes(handle)


nvmlDeviceGetGraphicsRunningProcesses_v3 = nvmlDeviceGetGraphicsRunningProcesses
nvmlDeviceGetGraphicsRunningProcesses_v2 = nvmlDeviceGetGraphicsRunningProcesses
nvmlDeviceGetMPSComputeRunningProcesses_v3 = nvmlDeviceGetMPSComputeRunningProcesses
nvmlDeviceGetMPSComputeRunningProcesses_v2 = nvmlDeviceGetMPSComputeRunningProcesses
