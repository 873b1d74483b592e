"""What a monitoring client asks the simulated NVML beyond what the adapter needs.

A program written against nvidia-ml-py (gpustat, an ``nvidia-smi``-like script) asks for memory,
utilisation, fans, processes, versions, persistence mode and the like. Each call here answers as
a real data-center board would, from the model where the model knows, and with
``NVMLError_NotSupported`` where such a board has no such thing. ``nvml.py`` re-exports every
public name; signatures, return types and structs are nvidia-ml-py's own.

- Versions: the driver is ``state.DRIVER_VERSION``; NVML reports ``12.<driver>`` and the CUDA
  driver API 12.4 (``12040``), what an R550 driver reports.
- Memory (``nvmlDeviceGetMemoryInfo``, v1 and ``version=nvmlMemory_v2``): the board's capacity
  from its profile (``memory_gib``, or the "NNGB" in its profile or marketing name); the driver
  reserves about 1 %, reported as ``reserved`` by v2 (and in v1's ``used``, which includes it);
  ``used`` is what a trial told the sim its process holds (``memory.simDeviceSetAllocatedBytes``:
  the modelled context and allocator pool), 0 when nothing ran.
- Utilisation: ``gpu`` is 100 % while a kernel is resident (the last thing the GPU did was a
  kernel call) and 0 when idle; ``memory`` is the last call's share of memory-bound time where the
  state records it (``memory_util``), else 0 when idle and ``gpu`` when busy. Video engines are
  idle: 0 % over NVML's 167 ms sampling period.
- Fans: every shipped board is passively cooled (SXM, or a passive PCIe card), so
  ``nvmlDeviceGetFanSpeed`` is ``NOT_SUPPORTED``, as on the real boards.
- Processes: ``processes.py`` records which processes hold each GPU (the workers) and answers
  the running-process calls.
- Persistence mode: off when the machine is made, settable by a privileged user
  (``nvmlDeviceSetPersistenceMode``); it changes nothing else in the model.
- C2C (chip-to-chip, Grace Hopper's NVLink-C2C): no shipped board has the link, so
  ``nvmlDeviceGetC2cModeInfoV`` is ``NOT_SUPPORTED``.
- Driver model (WDDM/TCC): Windows only, ``NOT_SUPPORTED`` as on Linux.
- MIG mode: disabled (current and pending) on Ampere and Hopper; ``NOT_SUPPORTED`` before them.
- Identity extras: the minor number is the index, the serial a fixed 13-digit number derived from
  the UUID, the brand ``NVML_BRAND_TESLA`` for "Tesla ..." boards and ``NVML_BRAND_NVIDIA`` for the
  rest, compute mode ``DEFAULT``, performance state P0.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

import pynvml as _real

from orchestrator.devices.base import ClockEventReason
from orchestrator.devices.sim.driver import SimHandle, current_machine, gpu_of, setter_of
from orchestrator.devices.sim.memory import allocated_bytes
from orchestrator.devices.sim.state import Machine

NVMLError = _real.NVMLError
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = _real.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
NVML_ERROR_INVALID_ARGUMENT = _real.NVML_ERROR_INVALID_ARGUMENT
NVML_ERROR_NOT_SUPPORTED = _real.NVML_ERROR_NOT_SUPPORTED
NVML_FEATURE_DISABLED = _real.NVML_FEATURE_DISABLED
NVML_FEATURE_ENABLED = _real.NVML_FEATURE_ENABLED
NVML_TEMPERATURE_GPU = _real.NVML_TEMPERATURE_GPU
nvmlMemory_v2 = _real.nvmlMemory_v2
nvmlTemperature_v1 = _real.nvmlTemperature_v1

CUDA_DRIVER_VERSION = 12040  # CUDA 12.4, the driver API an R550 driver offers
VIDEO_SAMPLING_PERIOD_US = 167_000  # NVML's encoder/decoder utilisation window
_RESERVED_SHARE = 0.01  # of the board's memory, kept by the driver
_MIB = 1 << 20
_COMPUTE_CAPABILITY = {
    "pascal": (6, 0), "volta": (7, 0), "turing": (7, 5), "ampere": (8, 0), "ada": (8, 9),
    "hopper": (9, 0),
}
_MIG_ARCHITECTURES = frozenset({"ampere", "hopper"})


# --- versions ---------------------------------------------------------------------------------
def nvmlSystemGetNVMLVersion() -> str:
    """NVML's nvmlSystemGetNVMLVersion: the NVML library version, "12." and the driver version."""
    return f"12.{current_machine().driver_version}"


def nvmlSystemGetCudaDriverVersion() -> int:
    """NVML's nvmlSystemGetCudaDriverVersion: the CUDA driver API version, 12040 (CUDA 12.4)."""
    current_machine()
    return CUDA_DRIVER_VERSION


def nvmlSystemGetCudaDriverVersion_v2() -> int:
    """NVML's nvmlSystemGetCudaDriverVersion_v2: the same CUDA driver API version as v1, 12040."""
    return nvmlSystemGetCudaDriverVersion()


# --- temperature (the versioned call) -----------------------------------------------------------
def nvmlDeviceGetTemperatureV1(handle: SimHandle, sensor: int) -> int:
    """NVML's nvmlDeviceGetTemperatureV1: the die temperature in whole degrees C.

    Raises:
        NVMLError_InvalidArgument: ``sensor`` is not ``NVML_TEMPERATURE_GPU``.
    """
    m, i = gpu_of(handle)
    if sensor != NVML_TEMPERATURE_GPU:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return int(round(m.read(i)["temperature_c"]))


def nvmlDeviceGetTemperatureV(
    handle: SimHandle, sensor: int, version: int = nvmlTemperature_v1
) -> int:
    """The die temperature in degrees C, as ``nvmlDeviceGetTemperature`` (pynvml returns the int).

    Raises:
        NVMLError_ArgumentVersionMismatch: ``version`` is not ``nvmlTemperature_v1``.
    """
    if version != nvmlTemperature_v1:
        raise NVMLError(NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
    return nvmlDeviceGetTemperatureV1(handle, sensor)


# --- memory -----------------------------------------------------------------------------------
def memory_total_bytes(m: Machine, i: int) -> int | None:
    """The board's memory capacity: the profile's ``memory_gib``, else the "NNGB" in its names."""
    p = m.profiles[i]
    gib = getattr(p, "memory_gib", None)
    if gib is None:
        for text in (m.gpus[i].profile, p.name):
            found = re.search(r"(\d+)\s*GB", text, re.IGNORECASE)
            if found:
                gib = int(found.group(1))
                break
    return None if gib is None else int(gib * 1024) * _MIB


def nvmlDeviceGetMemoryInfo(handle: SimHandle, version: Any = None) -> Any:
    """``c_nvmlMemory_t`` (v1), or ``c_nvmlMemory_v2_t`` for ``version=nvmlMemory_v2``, in bytes.

    Raises:
        NVMLError_NotSupported: the profile does not say how much memory the board has.
        NVMLError_ArgumentVersionMismatch: a ``version`` other than ``nvmlMemory_v2``.
    """
    m, i = gpu_of(handle)
    total = memory_total_bytes(m, i)
    if total is None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    reserved = int(total * _RESERVED_SHARE) // _MIB * _MIB
    held = min(allocated_bytes(m.read(i)), total - reserved)
    if not version:
        info = _real.c_nvmlMemory_t()
        info.total, info.used, info.free = total, reserved + held, total - reserved - held
        return info
    if version != nvmlMemory_v2:
        raise NVMLError(NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
    info = _real.c_nvmlMemory_v2_t()
    info.version, info.total, info.reserved = version, total, reserved
    info.used, info.free = held, total - reserved - held
    return info


# --- utilisation, fans ---------------------------------------------------------------------------
def _busy(s: dict[str, Any]) -> bool:
    return not int(s.get("reasons", 0)) & int(ClockEventReason.GPU_IDLE)


def nvmlDeviceGetUtilizationRates(handle: SimHandle) -> Any:
    """``c_nvmlUtilization_t``: percent of the last sample period a kernel ran / memory was busy."""
    m, i = gpu_of(handle)
    s = m.read(i)
    util = _real.c_nvmlUtilization_t()
    busy = _busy(s)
    util.gpu = 100 if busy else 0
    memory = s.get("memory_util")
    if not busy:
        util.memory = 0
    elif memory is not None:
        util.memory = int(round(100 * min(1.0, max(0.0, float(memory)))))
    else:
        util.memory = util.gpu
    return util


def nvmlDeviceGetEncoderUtilization(handle: SimHandle) -> list[int]:
    """NVML's nvmlDeviceGetEncoderUtilization: ``[percent, sampling period in us]``, always idle."""
    gpu_of(handle)
    return [0, VIDEO_SAMPLING_PERIOD_US]


def nvmlDeviceGetDecoderUtilization(handle: SimHandle) -> list[int]:
    """NVML's nvmlDeviceGetDecoderUtilization: ``[percent, sampling period in us]``, always idle."""
    gpu_of(handle)
    return [0, VIDEO_SAMPLING_PERIOD_US]


def nvmlDeviceGetFanSpeed(handle: SimHandle) -> int:
    """Every shipped board is passively cooled: ``NOT_SUPPORTED``, as on the real boards."""
    gpu_of(handle)
    raise NVMLError(NVML_ERROR_NOT_SUPPORTED)


def nvmlDeviceGetFanSpeed_v2(handle: SimHandle, fan: int) -> int:
    """NVML's nvmlDeviceGetFanSpeed_v2: one fan's speed; passive boards: ``NOT_SUPPORTED``."""
    gpu_of(handle)
    raise NVMLError(NVML_ERROR_NOT_SUPPORTED)


def nvmlDeviceGetNumFans(device: SimHandle) -> int:
    """NVML's nvmlDeviceGetNumFans: how many fans the board has; 0 (passively cooled)."""
    gpu_of(device)
    return 0


# --- modes ------------------------------------------------------------------------------------
def nvmlDeviceGetPersistenceMode(handle: SimHandle) -> int:
    """NVML's nvmlDeviceGetPersistenceMode: ``NVML_FEATURE_*``, off until set (privileged)."""
    m, i = gpu_of(handle)
    return int(m.read(i).get("persistence_mode", NVML_FEATURE_DISABLED))


def nvmlDeviceSetPersistenceMode(handle: SimHandle, mode: int) -> None:
    """Turn persistence mode on or off (privileged, as every setter).

    Raises:
        NVMLError_NoPermission: the machine is not privileged.
        NVMLError_InvalidArgument: ``mode`` is neither ``NVML_FEATURE_ENABLED`` nor ``_DISABLED``.
    """
    m, i = setter_of(handle)
    if mode not in (NVML_FEATURE_DISABLED, NVML_FEATURE_ENABLED) or isinstance(mode, bool):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)

    def change(s: dict[str, Any]) -> None:
        s["persistence_mode"] = int(mode)

    m.update(i, change, sync=True)


def nvmlDeviceGetC2cModeInfoV(handle: SimHandle) -> Any:
    """No shipped board has a chip-to-chip (NVLink-C2C) link: ``NOT_SUPPORTED``."""
    gpu_of(handle)
    raise NVMLError(NVML_ERROR_NOT_SUPPORTED)


nvmlDeviceGetC2cModeInfoV1 = nvmlDeviceGetC2cModeInfoV


def nvmlDeviceGetMigMode(device: SimHandle) -> list[int]:
    """NVML's nvmlDeviceGetMigMode: ``[current, pending]``, both disabled on Ampere and Hopper.

    Raises:
        NVMLError_NotSupported: an architecture before Ampere, which has no MIG.
    """
    m, i = gpu_of(device)
    if m.profiles[i].architecture not in _MIG_ARCHITECTURES:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return [_real.NVML_DEVICE_MIG_DISABLE, _real.NVML_DEVICE_MIG_DISABLE]


def nvmlDeviceGetDriverModel(handle: SimHandle) -> list[int]:
    """The driver model (WDDM or TCC) is Windows only: ``NOT_SUPPORTED`` on the sim's Linux
    driver, as NVML answers there (NVML API reference, ``nvmlDeviceGetDriverModel``)."""
    gpu_of(handle)
    raise NVMLError(NVML_ERROR_NOT_SUPPORTED)


nvmlDeviceGetDriverModel_v2 = nvmlDeviceGetDriverModel
nvmlDeviceGetDriverModel_v1 = nvmlDeviceGetDriverModel
nvmlDeviceGetCurrentDriverModel = nvmlDeviceGetDriverModel
nvmlDeviceGetPendingDriverModel = nvmlDeviceGetDriverModel


def nvmlDeviceGetDisplayActive(handle: SimHandle) -> int:
    """NVML's nvmlDeviceGetDisplayActive: no display is initialised on a data-center board,
    ``NVML_FEATURE_DISABLED`` (nvidia-smi's "Disp.A Off")."""
    gpu_of(handle)
    return NVML_FEATURE_DISABLED


def nvmlDeviceGetProcessUtilization(handle: SimHandle, timeStamp: int) -> list[Any]:
    """The sim keeps no per-process utilisation samples: ``NOT_FOUND``, NVML's answer when no
    sample is newer than ``timeStamp`` (nvmlDeviceGetUtilizationRates has the board's)."""
    gpu_of(handle)
    raise NVMLError(_real.NVML_ERROR_NOT_FOUND)


def nvmlDeviceGetComputeMode(handle: SimHandle) -> int:
    """NVML's nvmlDeviceGetComputeMode: ``NVML_COMPUTEMODE_DEFAULT`` (shared), always."""
    gpu_of(handle)
    return _real.NVML_COMPUTEMODE_DEFAULT


def nvmlDeviceGetPerformanceState(handle: SimHandle) -> int:
    """NVML's nvmlDeviceGetPerformanceState: P0 (full performance), always."""
    gpu_of(handle)
    return _real.NVML_PSTATE_0


nvmlDeviceGetPowerState = nvmlDeviceGetPerformanceState


# --- identity extras ------------------------------------------------------------------------
def nvmlDeviceGetMinorNumber(handle: SimHandle) -> int:
    """NVML's nvmlDeviceGetMinorNumber: the /dev/nvidiaN number, the GPU's index here."""
    return gpu_of(handle)[1]


def nvmlDeviceGetSerial(handle: SimHandle) -> str:
    """NVML's nvmlDeviceGetSerial: the board's serial, 13 digits derived from its UUID."""
    m, i = gpu_of(handle)
    digest = hashlib.sha256(m.gpus[i].uuid.encode()).hexdigest()
    return str(int(digest[:12], 16) % 10**13).rjust(13, "0")


def nvmlDeviceGetBrand(handle: SimHandle) -> int:
    """NVML's nvmlDeviceGetBrand: ``NVML_BRAND_TESLA`` for a "Tesla ..." board, else ``_NVIDIA``."""
    m, i = gpu_of(handle)
    tesla = m.profiles[i].name.startswith("Tesla")
    return _real.NVML_BRAND_TESLA if tesla else _real.NVML_BRAND_NVIDIA


def nvmlDeviceGetCudaComputeCapability(handle: SimHandle) -> tuple[int, int]:
    """NVML's nvmlDeviceGetCudaComputeCapability: ``(major, minor)`` of the architecture.

    Raises:
        NVMLError_NotSupported: an architecture the sim has no compute capability for (before
            Pascal).
    """
    m, i = gpu_of(handle)
    arch = m.profiles[i].architecture
    if arch not in _COMPUTE_CAPABILITY:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return _COMPUTE_CAPABILITY[arch]

