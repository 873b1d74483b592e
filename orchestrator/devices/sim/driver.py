"""The simulated driver's session: which machine ``nvmlInit`` opened, and handle checks.

NVML is a process-wide library: ``nvmlInit``/``nvmlShutdown`` are reference-counted and every
call before the first ``nvmlInit`` raises ``NVMLError_Uninitialized``. This module holds that
state for the simulated NVML (``nvml.py`` re-exports the init calls) and the checks every call
makes of its handle: in range, GPU not lost, the user privileged for a setter.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import pynvml as _real

from orchestrator.devices.sim.state import Machine, state_dir_from_env

NVMLError = _real.NVMLError
NVML_ERROR_GPU_IS_LOST = _real.NVML_ERROR_GPU_IS_LOST
NVML_ERROR_INVALID_ARGUMENT = _real.NVML_ERROR_INVALID_ARGUMENT
NVML_ERROR_NO_PERMISSION = _real.NVML_ERROR_NO_PERMISSION
NVML_ERROR_UNINITIALIZED = _real.NVML_ERROR_UNINITIALIZED

_lock = threading.Lock()
_refcount = 0
_machine: Machine | None = None


@dataclass(frozen=True)
class SimHandle:
    """An opaque device handle (NVML's is a pointer)."""

    index: int



# --- init -------------------------------------------------------------------------------------
def nvmlInit() -> None:
    """Open the machine in ``$DVFS_SIM_STATE_DIR`` (reference-counted, as NVML is)."""
    global _refcount, _machine
    with _lock:
        if _refcount == 0:
            _machine = Machine(state_dir_from_env())
        _refcount += 1


def nvmlInitWithFlags(flags: int) -> None:
    del flags
    nvmlInit()


def nvmlShutdown() -> None:
    global _refcount, _machine
    with _lock:
        if _refcount == 0:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        _refcount -= 1
        if _refcount == 0:
            _machine = None


def _m() -> Machine:
    if _machine is None:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    return _machine


def _gpu(handle: SimHandle, *, allow_lost: bool = False) -> tuple[Machine, int]:
    m = _m()
    if not isinstance(handle, SimHandle) or not 0 <= handle.index < len(m.gpus):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    if not allow_lost and m.is_lost(handle.index):
        raise NVMLError(NVML_ERROR_GPU_IS_LOST)
    return m, handle.index


def _setter(handle: SimHandle) -> tuple[Machine, int]:
    m, i = _gpu(handle)
    if not m.spec.privileged:
        raise NVMLError(NVML_ERROR_NO_PERMISSION)
    return m, i


def simMachineStateDir() -> str:
    """The state directory of the open machine."""
    return str(_m().state_dir)

