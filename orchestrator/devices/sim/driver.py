"""The simulated driver's session: which machine ``nvmlInit`` opened, and handle checks.

NVML is a process-wide library: ``nvmlInit``/``nvmlShutdown`` are reference-counted and every
call before the first ``nvmlInit`` raises ``NVMLError_Uninitialized``. This module holds that
state for the simulated NVML (``nvml.py`` re-exports the init calls) and the checks every call
makes of its handle: in range, GPU not lost, the user privileged for a setter.

The simulated machine plays the driver. Where none is configured (no ``$DVFS_SIM_STATE_DIR``, or
a directory without a machine in it), ``nvmlInit`` raises ``NVMLError_LibraryNotFound``: that is
what nvidia-ml-py raises on a host without an NVIDIA driver (``libnvidia-ml.so.1`` ships with
the driver, so without one there is no library to load), and so what a pynvml client's "no GPU
here" path expects; ``DRIVER_NOT_LOADED`` would mean a library installed over a driver that is
not running, which nothing here can be. A machine that is there but cannot be opened (a damaged
``machine.json``, a profile gone since) raises ``NVMLError_Unknown``. Both say, in their message,
what to do about it; ``nvmlInit`` never raises anything but an ``NVMLError``.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass

import pynvml as _real

from orchestrator.devices.sim.profile import ProfileError
from orchestrator.devices.sim.state import STATE_ENV, Machine, MachineSpecError, state_dir_from_env

NVMLError = _real.NVMLError
NVML_ERROR_GPU_IS_LOST = _real.NVML_ERROR_GPU_IS_LOST
NVML_ERROR_INVALID_ARGUMENT = _real.NVML_ERROR_INVALID_ARGUMENT
NVML_ERROR_NO_PERMISSION = _real.NVML_ERROR_NO_PERMISSION
NVML_ERROR_UNINITIALIZED = _real.NVML_ERROR_UNINITIALIZED

_lock = threading.Lock()
_refcount = 0
_machine: Machine | None = None
_loaded = False  # nvmlInit has succeeded once in this process: the "library" is loaded


@dataclass(frozen=True)
class SimHandle:
    """An opaque device handle (NVML's is a pointer)."""

    index: int



# --- init -------------------------------------------------------------------------------------
class _SimInitError:
    """Mixed into an ``NVMLError_*`` class: the same error, with what to do in its message."""

    detail = ""

    def __str__(self) -> str:
        return f"{super().__str__()} (simulated NVML: {self.detail})"


class NVMLError_LibraryNotFound(_SimInitError, _real.NVMLError_LibraryNotFound):  # noqa: N801
    """No simulated machine configured: what nvidia-ml-py raises on a host without a driver."""


class NVMLError_Unknown(_SimInitError, _real.NVMLError_Unknown):  # noqa: N801
    """A simulated machine that is there but cannot be opened."""


_INIT_CODES = {
    NVMLError_LibraryNotFound: _real.NVML_ERROR_LIBRARY_NOT_FOUND,
    NVMLError_Unknown: _real.NVML_ERROR_UNKNOWN,
}


def _init_error(kind: type, detail: str) -> _real.NVMLError:
    error = kind(_INIT_CODES[kind])
    error.detail = detail
    return error


def _open_machine() -> Machine:
    try:
        root = state_dir_from_env()
    except MachineSpecError:
        raise _init_error(
            NVMLError_LibraryNotFound,
            f"no machine configured: set {STATE_ENV} to a directory made by "
            f"orchestrator.devices.sim.state.create_machine",
        ) from None
    if not (root / "machine.json").is_file():
        raise _init_error(
            NVMLError_LibraryNotFound,
            f"no machine in {STATE_ENV}={root}: create one there with "
            f"orchestrator.devices.sim.state.create_machine",
        )
    try:
        return Machine(root)
    except (OSError, ValueError, KeyError, TypeError, ProfileError, json.JSONDecodeError) as e:
        message = str(e).splitlines()[0] if str(e) else type(e).__name__
        detail = f"the machine in {root} cannot be opened: {message}"
        raise _init_error(NVMLError_Unknown, detail) from e


def nvmlInit() -> None:
    """Open the machine in ``$DVFS_SIM_STATE_DIR`` (reference-counted, as NVML is).

    Raises:
        NVMLError_LibraryNotFound: no simulated machine is configured (see the module docstring).
        NVMLError_Unknown: the configured machine cannot be opened.
    """
    global _refcount, _machine, _loaded
    with _lock:
        if _refcount == 0:
            _machine = _open_machine()
            _loaded = True
        _refcount += 1


def nvmlInitWithFlags(flags: int) -> None:
    """``nvmlInit``; the flags change nothing on the simulated driver."""
    del flags
    nvmlInit()


def nvmlShutdown() -> None:
    """Release one ``nvmlInit`` (NVMLError_Uninitialized when none is held)."""
    global _refcount, _machine
    with _lock:
        if _refcount == 0:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        _refcount -= 1
        if _refcount == 0:
            _machine = None


def current_machine() -> Machine:
    """The machine ``nvmlInit`` opened (``NVMLError_Uninitialized`` before it)."""
    if _machine is None:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    return _machine


def gpu_of(handle: SimHandle, *, allow_lost: bool = False) -> tuple[Machine, int]:
    """The open machine and the GPU index of ``handle``, checked as NVML checks a handle.

    Raises:
        NVMLError: uninitialised, a handle out of range, or (unless ``allow_lost``) a lost GPU.
    """
    m = current_machine()
    if not isinstance(handle, SimHandle) or not 0 <= handle.index < len(m.gpus):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    if not allow_lost and m.is_lost(handle.index):
        raise NVMLError(NVML_ERROR_GPU_IS_LOST)
    return m, handle.index


def setter_of(handle: SimHandle) -> tuple[Machine, int]:
    """As :func:`gpu_of`, for a call that changes a setting: NO_PERMISSION unless privileged."""
    m, i = gpu_of(handle)
    if not m.spec.privileged:
        raise NVMLError(NVML_ERROR_NO_PERMISSION)
    return m, i


def library_loaded() -> bool:
    """Whether ``nvmlInit`` has succeeded once in this process (it stays loaded after shutdown)."""
    return _loaded

