"""What a simulated GPU lets a privileged user set, and setting it: clocks, power limit, offset.

The getters answer from the GPU's profile (supported SM and memory clocks, the power-limit range
and default, the clock offset range) and its state (the limit and offset in force); the setters
check a value as NVML does (``INVALID_ARGUMENT`` outside the profile's range, ``NO_PERMISSION``
for an unprivileged machine, ``NOT_SUPPORTED`` where the board has no such control) and write it
to the state, synced, so every process sees the same GPU. Units are NVML's: MHz and milliwatts.
``orchestrator.devices.sim.nvml`` re-exports every public name here as part of its pynvml surface.
"""

from __future__ import annotations

from ctypes import c_int as _c_int
from typing import Any

from pynvml import (
    NVML_CLOCK_MEM,
    NVML_ERROR_INVALID_ARGUMENT,
    NVML_ERROR_NOT_FOUND,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_SUCCESS,
    NVMLError,
)

from orchestrator.devices.sim.driver import SimHandle, gpu_of, setter_of


def nvmlDeviceGetSupportedMemoryClocks(handle: SimHandle) -> list[int]:
    """NVML's nvmlDeviceGetSupportedMemoryClocks: the profile's memory clocks in MHz, descending."""
    m, i = gpu_of(handle)
    return sorted(m.profiles[i].mem_clocks_mhz, reverse=True)


def nvmlDeviceGetSupportedGraphicsClocks(handle: SimHandle, memoryClockMHz: int) -> list[int]:
    """NVML's nvmlDeviceGetSupportedGraphicsClocks: the SM clocks in MHz, highest first.

    The profile's SM clocks are the same at every memory clock; a memory clock the profile does
    not support raises ``NVMLError_NotFound``.
    """
    m, i = gpu_of(handle)
    p = m.profiles[i]
    if memoryClockMHz not in p.mem_clocks_mhz:
        raise NVMLError(NVML_ERROR_NOT_FOUND)
    return sorted(p.sm_clocks_mhz, reverse=True)


def nvmlDeviceGetMaxClockInfo(handle: SimHandle, type: int) -> int:
    """NVML's nvmlDeviceGetMaxClockInfo: the top clock in MHz of its domain (memory, else SM)."""
    m, i = gpu_of(handle)
    p = m.profiles[i]
    return p.mem_max_mhz if type == NVML_CLOCK_MEM else p.f_max_mhz


def nvmlDeviceGetPowerManagementLimitConstraints(handle: SimHandle) -> list[int]:
    """NVML's nvmlDeviceGetPowerManagementLimitConstraints: the settable limits in milliwatts.

    ``[min, max]``, the profile's lowest and highest power limit.
    """
    m, i = gpu_of(handle)
    p = m.profiles[i]
    return [int(p.power_limit_min_w * 1000), int(p.power_limit_max_w * 1000)]


def nvmlDeviceGetPowerManagementDefaultLimit(handle: SimHandle) -> int:
    """NVML's nvmlDeviceGetPowerManagementDefaultLimit: the profile's default, milliwatts."""
    m, i = gpu_of(handle)
    return int(m.profiles[i].power_limit_default_w * 1000)


def nvmlDeviceGetPowerManagementLimit(handle: SimHandle) -> int:
    """NVML's nvmlDeviceGetPowerManagementLimit: the power limit now in force, in milliwatts."""
    m, i = gpu_of(handle)
    return int(round(m.read(i)["power_limit_w"] * 1000))


def nvmlDeviceGetEnforcedPowerLimit(handle: SimHandle) -> int:
    """NVML's nvmlDeviceGetEnforcedPowerLimit: in milliwatts, the set limit (nothing else caps)."""
    return nvmlDeviceGetPowerManagementLimit(handle)


def nvmlDeviceGetGpcClkMinMaxVfOffset(
    device: SimHandle, minOffset: Any = _c_int(), maxOffset: Any = _c_int()  # noqa: B008 - as pynvml
) -> tuple[int, int] | int:
    """The offset range in MHz, as pynvml gives it: a tuple for ``c_int`` arguments (the default),
    else (references, e.g. ``byref(c_int())``) filled in and ``NVML_SUCCESS``."""
    m, i = gpu_of(device)
    rng = m.profiles[i].clock_offset_range_mhz
    if rng is None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    if type(minOffset) is _c_int and type(maxOffset) is _c_int:
        # Not written into: pynvml's defaults are shared objects, and a write would change the
        # default every later call (and a drop-in signature check) sees.
        return int(rng[0]), int(rng[1])
    for out, value in ((minOffset, rng[0]), (maxOffset, rng[1])):
        getattr(out, "_obj", out).value = int(value)
    return NVML_SUCCESS


def nvmlDeviceGetGpcClkVfOffset(device: SimHandle) -> int:
    """NVML's nvmlDeviceGetGpcClkVfOffset: the GPC clock offset set now, in MHz.

    ``NVMLError_NotSupported`` on a profile with no offset range (Volta, Pascal).
    """
    m, i = gpu_of(device)
    if m.profiles[i].clock_offset_range_mhz is None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return int(m.read(i)["offset_mhz"])


# --- setting them ------------------------------------------------------------------------------
def _set(handle: SimHandle, key: str, value: Any) -> None:
    """Write one setting of the GPU's state, synced to disk before the call returns."""
    m, i = setter_of(handle)

    def change(s: dict[str, Any]) -> None:
        s[key] = value

    m.update(i, change, sync=True)


def nvmlDeviceSetGpuLockedClocks(
    handle: SimHandle, minGpuClockMHz: int, maxGpuClockMHz: int
) -> None:
    """NVML's nvmlDeviceSetGpuLockedClocks: lock the SM clock to a range in MHz (privileged).

    A range outside the profile's supported clocks raises ``NVMLError_InvalidArgument``; inside
    it, the GPU runs at the nearest supported clock at or below each bound, as NVML rounds.
    """
    m, i = setter_of(handle)
    p = m.profiles[i]
    if not p.f_min_mhz <= minGpuClockMHz <= maxGpuClockMHz <= p.f_max_mhz:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    _set(handle, "locked_sm_mhz", [int(minGpuClockMHz), int(maxGpuClockMHz)])


def nvmlDeviceResetGpuLockedClocks(handle: SimHandle) -> None:
    """NVML's nvmlDeviceResetGpuLockedClocks: release the SM clock lock (privileged)."""
    setter_of(handle)
    _set(handle, "locked_sm_mhz", None)


def nvmlDeviceSetMemoryLockedClocks(
    handle: SimHandle, minMemClockMHz: int, maxMemClockMHz: int
) -> None:
    """NVML's nvmlDeviceSetMemoryLockedClocks: lock the memory clock to a range in MHz (privileged).

    A range outside the profile's lowest to highest memory clock raises
    ``NVMLError_InvalidArgument``.
    """
    m, i = setter_of(handle)
    mems = m.profiles[i].mem_clocks_mhz
    if not mems[0] <= minMemClockMHz <= maxMemClockMHz <= mems[-1]:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    _set(handle, "locked_mem_mhz", [int(minMemClockMHz), int(maxMemClockMHz)])


def nvmlDeviceResetMemoryLockedClocks(handle: SimHandle) -> None:
    """NVML's nvmlDeviceResetMemoryLockedClocks: release the memory clock lock (privileged)."""
    setter_of(handle)
    _set(handle, "locked_mem_mhz", None)


def nvmlDeviceSetPowerManagementLimit(handle: SimHandle, limit: int) -> None:
    """NVML's nvmlDeviceSetPowerManagementLimit: set the power limit, in milliwatts (privileged).

    A limit outside the profile's settable range raises ``NVMLError_InvalidArgument``.
    """
    m, i = setter_of(handle)
    p = m.profiles[i]
    if not p.power_limit_min_w * 1000 <= limit <= p.power_limit_max_w * 1000:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    _set(handle, "power_limit_w", limit / 1000.0)


def nvmlDeviceSetGpcClkVfOffset(device: SimHandle, offset: int) -> None:
    """NVML's nvmlDeviceSetGpcClkVfOffset: set the GPC clock offset in MHz (privileged).

    ``NOT_SUPPORTED`` on a profile with no offset range (Volta, Pascal); an offset outside the
    range raises ``NVMLError_InvalidArgument``.
    """
    m, i = setter_of(device)
    rng = m.profiles[i].clock_offset_range_mhz
    if rng is None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    if not rng[0] <= offset <= rng[1]:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    _set(device, "offset_mhz", int(offset))
