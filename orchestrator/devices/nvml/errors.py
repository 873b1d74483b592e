"""NVML's errors, in ours: the one translation from ``NVMLError`` to the ``DvfsError`` hierarchy.

Every NVML call the adapter makes runs inside ``nvml_errors`` (or hands a caught error to
``translate_nvml_error``), so nothing above the adapter sees an ``NVMLError``: each becomes one of
ours with a message that names the call, the GPU and what to do (no permission -> run as root or
observe only; invalid argument -> the allowed values, which the caller adds; not supported ->
which call on which GPU; lost -> it needs a reset; no library -> there is no NVIDIA driver here).
Works over nvidia-ml-py's ``pynvml`` and the simulated NVML alike: the module is a parameter.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import ModuleType
from typing import Any

from orchestrator.errors import (
    DeviceError,
    DeviceLostError,
    DeviceNotFoundError,
    DeviceNotSupportedError,
    DevicePermissionError,
    InvalidSettingError,
)

_PERMISSION_HINT = (
    "changing clocks and power limits needs root (or `nvidia-smi -acp UNRESTRICTED` for "
    "application clocks); run as root, or set device.observe_only=true to measure at the "
    "current settings"
)


def nvml_text(value: Any) -> str:
    """A string NVML returned: nvidia-ml-py returns str in v12+ and bytes in older releases."""
    return value.decode() if isinstance(value, bytes) else str(value)


@contextlib.contextmanager
def nvml_errors(nvml: ModuleType, call: str, target: str) -> Iterator[None]:
    """Turn an NVMLError raised inside into our error for ``call`` on ``target``."""
    try:
        yield
    except nvml.NVMLError as e:
        raise translate_nvml_error(nvml, e, call, target) from e


def translate_nvml_error(nvml: ModuleType, e: Exception, call: str, target: str) -> Exception:
    """Map one NVMLError to our hierarchy with a message that says what to do."""
    if isinstance(e, nvml.NVMLError_NoPermission):
        return DevicePermissionError(f"{call} on {target} was refused: {_PERMISSION_HINT}")
    if isinstance(e, nvml.NVMLError_NotSupported):
        return DeviceNotSupportedError(f"{call} is not supported on {target}")
    if isinstance(e, nvml.NVMLError_InvalidArgument):
        return InvalidSettingError(f"{call} on {target} rejected the value")
    if isinstance(e, nvml.NVMLError_GpuIsLost):
        return DeviceLostError(
            f"{target} has fallen off the bus (NVML: GPU is lost) during {call}; it needs a reset"
        )
    if isinstance(e, (nvml.NVMLError_LibraryNotFound, nvml.NVMLError_DriverNotLoaded)):
        return DeviceNotFoundError(
            f"NVML is not available ({e}): no NVIDIA driver on this machine; use device=sim"
        )
    return DeviceError(f"{call} on {target} failed: NVML error {e}")
