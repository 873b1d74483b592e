"""The NVML adapter: the one place that speaks nvidia-ml-py.

``NvmlBackend`` takes the NVML *module* as a parameter: the real ``pynvml`` from nvidia-ml-py on a
GPU machine, or ``orchestrator.devices.sim.nvml`` (a simulated NVML with the same functions,
constants and error classes) everywhere else. The adapter is therefore the same code in CI and on
hardware.

NVML's errors never leave the adapter: ``nvml/errors.py`` maps each to one of ours with a message
that names the call, the GPU and what to do. The adapter is this module (backend, device,
settings, telemetry) and three modules beside it in this package: ``errors.py`` (error translation),
``power.py`` (what each power reading is, and the power field values) and
``health.py`` (lost, XID, ECC and thermal checks).

Devices are found by UUID or PCI bus id, never by CUDA's numbering: NVML numbers GPUs in PCI order
and CUDA does not unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID``.

Health (``NvmlDevice.health``, contract in ``Device.health``) is ``NvmlHealthMonitor``'s, and
what each power reading is, per generation, is ``nvml/power.py``'s. The adapter runs unchanged
over nvidia-ml-py's ``pynvml`` and the simulated NVML.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from types import ModuleType
from typing import Any

from orchestrator.devices.base import (
    Backend,
    ClockEventReason,
    Device,
    DeviceCapabilities,
    DeviceIdentity,
    DeviceSettings,
    Health,
    MemoryInfo,
)
from orchestrator.devices.nvml.errors import nvml_errors, nvml_text, translate_nvml_error
from orchestrator.devices.nvml.health import NvmlHealthMonitor
from orchestrator.devices.nvml.power import power_sensing, read_power_fields
from orchestrator.errors import DeviceNotFoundError, DeviceNotSupportedError, InvalidSettingError

_ARCHITECTURES = {
    2: "kepler",
    3: "maxwell",
    4: "pascal",
    5: "volta",
    6: "turing",
    7: "ampere",
    8: "ada",
    9: "hopper",
    10: "blackwell",
}
_TF32_ARCHITECTURES = frozenset({"ampere", "ada", "hopper", "blackwell"})

class NvmlBackend:
    """An initialised NVML (real or simulated) and the devices it sees.

    Use as a context manager, or call ``close()``: NVML is reference-counted, so every
    ``nvmlInit`` here is paired with one ``nvmlShutdown``.
    """

    def __init__(self, nvml: ModuleType, backend: Backend = "nvml") -> None:
        self.nvml = nvml
        self.backend: Backend = backend
        self._lock = threading.Lock()
        with nvml_errors(nvml, "nvmlInit", "the driver"):
            nvml.nvmlInit()
        self._open = True
        with nvml_errors(nvml, "nvmlSystemGetDriverVersion", "the driver"):
            self.driver_version = nvml_text(nvml.nvmlSystemGetDriverVersion())

    def __enter__(self) -> NvmlBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Shut NVML down (once)."""
        if self._open:
            self._open = False
            with contextlib.suppress(Exception):
                self.nvml.nvmlShutdown()

    def count(self) -> int:
        """How many GPUs NVML sees."""
        with nvml_errors(self.nvml, "nvmlDeviceGetCount", "the driver"):
            return int(self.nvml.nvmlDeviceGetCount())

    def devices(self) -> list[NvmlDevice]:
        """Every GPU, in NVML (PCI) order."""
        return [self.device(index=i) for i in range(self.count())]

    def device(
        self, index: int | None = None, *, uuid: str | None = None, pci_bus_id: str | None = None
    ) -> NvmlDevice:
        """One GPU by UUID, PCI bus id or NVML index (in that order of preference)."""
        nvml = self.nvml
        if uuid is not None:
            what, call, arg = f"UUID {uuid}", nvml.nvmlDeviceGetHandleByUUID, uuid
        elif pci_bus_id is not None:
            what, call, arg = (
                f"PCI bus id {pci_bus_id}",
                nvml.nvmlDeviceGetHandleByPciBusId,
                pci_bus_id,
            )
        elif index is not None:
            count = self.count()
            if not 0 <= index < count:
                raise DeviceNotFoundError(
                    f"no GPU with index {index}: this machine has {count} "
                    f"(valid indices: {', '.join(map(str, range(count))) or 'none'})"
                )
            what, call, arg = f"index {index}", nvml.nvmlDeviceGetHandleByIndex, index
        else:
            raise ValueError("device() needs an index, a uuid or a pci_bus_id")
        try:
            handle = call(arg)
        except nvml.NVMLError as e:
            if isinstance(e, (nvml.NVMLError_NotFound, nvml.NVMLError_InvalidArgument)):
                raise DeviceNotFoundError(f"no GPU with {what} ({e})") from e
            raise translate_nvml_error(nvml, e, call.__name__, what) from e
        return self._make_device(handle)

    def _make_device(self, handle: Any) -> NvmlDevice:
        return NvmlDevice(self, handle)


class NvmlDevice(Device):
    """One GPU behind an NVML handle (the same class over the real and the simulated NVML)."""

    def __init__(self, backend: NvmlBackend, handle: Any) -> None:
        self._backend = backend
        self._nvml = backend.nvml
        self._handle = handle
        self._locked_sm: tuple[int, int] | None = None
        self._locked_mem: tuple[int, int] | None = None
        self._caps: DeviceCapabilities | None = None
        nvml = self._nvml
        with nvml_errors(nvml, "identity queries", "a GPU"):
            index = int(nvml.nvmlDeviceGetIndex(handle))
            uuid = nvml_text(nvml.nvmlDeviceGetUUID(handle))
            name = nvml_text(nvml.nvmlDeviceGetName(handle))
            pci_info = nvml.nvmlDeviceGetPciInfo(handle)
            pci = nvml_text(pci_info.busId)
            self._pci_device_id = int(getattr(pci_info, "pciDeviceId", 0) or 0)
            try:
                arch = _ARCHITECTURES.get(int(nvml.nvmlDeviceGetArchitecture(handle)), "unknown")
            except nvml.NVMLError_NotSupported:
                arch = "unknown"
        self.identity = DeviceIdentity(
            index=index,
            uuid=uuid,
            pci_bus_id=pci,
            name=name,
            architecture=arch,
            driver_version=backend.driver_version,
            backend=backend.backend,
        )
        target = f"GPU {index} ({uuid})"
        self._health = NvmlHealthMonitor(nvml, self._call, self.temperature_c, target)

    def __repr__(self) -> str:
        i = self.identity
        return f"<{type(self).__name__} {i.index} {i.name} {i.uuid}>"

    # --- plumbing ----------------------------------------------------------------------------
    def _call(self, fn: str, *args: Any) -> Any:
        with nvml_errors(self._nvml, fn, f"GPU {self.identity.index} ({self.identity.uuid})"):
            return getattr(self._nvml, fn)(self._handle, *args)

    # --- what may be set ---------------------------------------------------------------------
    def capabilities(self) -> DeviceCapabilities:
        """What may be set, read once from NVML and cached (it never changes while open)."""
        if self._caps is None:
            nvml = self._nvml
            mem = tuple(int(m) for m in self._call("nvmlDeviceGetSupportedMemoryClocks"))
            sm = {
                m: tuple(int(c) for c in self._call("nvmlDeviceGetSupportedGraphicsClocks", m))
                for m in mem
            }
            lo_mw, hi_mw = self._call("nvmlDeviceGetPowerManagementLimitConstraints")
            default_mw = self._call("nvmlDeviceGetPowerManagementDefaultLimit")
            try:
                offsets = tuple(int(v) for v in self._call("nvmlDeviceGetGpcClkMinMaxVfOffset"))
                offset_range: tuple[int, int] | None = (offsets[0], offsets[1])
            except DeviceNotSupportedError:
                offset_range = None
            try:
                self._call("nvmlDeviceGetTotalEnergyConsumption")
                has_energy = True
            except DeviceNotSupportedError:
                has_energy = False
            del nvml
            sensing = power_sensing(
                self.identity.architecture,
                self._pci_device_id,
                self.identity.name,
                instant_field=self._read_power_fields(("instant",))["instant"] is not None,
            )
            self._caps = DeviceCapabilities(
                mem_clocks_mhz=mem,
                sm_clocks_mhz=sm,
                power_limit_min_w=lo_mw / 1000.0,
                power_limit_max_w=hi_mw / 1000.0,
                power_limit_default_w=default_mw / 1000.0,
                clock_offset_range_mhz=offset_range,
                has_energy_counter=has_energy,
                energy_note=None if has_energy or sensing.reading else sensing.note,
                power_sensing=sensing,
            )
        return self._caps

    def settings(self) -> DeviceSettings:
        """The power limit and offset as NVML reads them; locked clocks as this device set them."""
        try:
            offset: int | None = int(self._call("nvmlDeviceGetGpcClkVfOffset"))
        except DeviceNotSupportedError:
            offset = None
        return DeviceSettings(
            power_limit_w=self._call("nvmlDeviceGetPowerManagementLimit") / 1000.0,
            clock_offset_mhz=offset,
            sm_clock_locked_mhz=self._locked_sm,
            mem_clock_locked_mhz=self._locked_mem,
        )

    # --- setters -----------------------------------------------------------------------------
    def set_locked_sm_clocks(self, min_mhz: int, max_mhz: int) -> None:
        """Lock the SM clock to a range (NVML rounds into the supported clocks)."""
        with self._allowed(f"SM clocks must lie in {self._sm_range()} MHz"):
            self._call("nvmlDeviceSetGpuLockedClocks", int(min_mhz), int(max_mhz))
        self._locked_sm = (int(min_mhz), int(max_mhz))

    def reset_locked_sm_clocks(self) -> None:
        """Unlock the SM clock (the driver's default)."""
        self._call("nvmlDeviceResetGpuLockedClocks")
        self._locked_sm = None

    def set_locked_mem_clocks(self, min_mhz: int, max_mhz: int) -> None:
        """Lock the memory clock to a range."""
        mems = ", ".join(map(str, sorted(self.capabilities().mem_clocks_mhz)))
        with self._allowed(f"supported memory clocks: {mems} MHz"):
            self._call("nvmlDeviceSetMemoryLockedClocks", int(min_mhz), int(max_mhz))
        self._locked_mem = (int(min_mhz), int(max_mhz))

    def reset_locked_mem_clocks(self) -> None:
        """Unlock the memory clock (the driver's default)."""
        self._call("nvmlDeviceResetMemoryLockedClocks")
        self._locked_mem = None

    def set_power_limit_w(self, watts: float) -> None:
        """Set the power-management limit (NVML speaks mW)."""
        caps = self.capabilities()
        with self._allowed(
            f"power limit must lie in {caps.power_limit_min_w:g}-{caps.power_limit_max_w:g} W"
        ):
            self._call("nvmlDeviceSetPowerManagementLimit", int(round(watts * 1000)))

    def set_clock_offset_mhz(self, offset_mhz: int) -> None:
        """Set the GPC clock offset; refused on a GPU without offsets."""
        rng = self.capabilities().clock_offset_range_mhz
        if rng is None:
            raise DeviceNotSupportedError(
                f"GPU {self.identity.index} ({self.identity.name}) does not support clock offsets"
            )
        with self._allowed(f"clock offset must lie in {rng[0]}..{rng[1]} MHz"):
            self._call("nvmlDeviceSetGpcClkVfOffset", int(offset_mhz))

    def _sm_range(self) -> str:
        clocks = self.capabilities().supported_sm_clocks_mhz()
        return f"{clocks[0]}-{clocks[-1]}" if clocks else "(none)"

    @contextlib.contextmanager
    def _allowed(self, allowed: str) -> Iterator[None]:
        """Add the allowed values to the driver's INVALID_ARGUMENT answer."""
        try:
            yield
        except InvalidSettingError as e:
            raise InvalidSettingError(f"{e}; {allowed}") from e

    # --- health ------------------------------------------------------------------------------
    def _check_health(self) -> Health:
        return self._health.check()

    def close(self) -> None:
        """Free the XID event set (the backend shuts NVML down)."""
        self._health.close()

    # --- telemetry ---------------------------------------------------------------------------
    def energy_mj(self) -> int:
        """The cumulative energy counter in mJ (since the driver loaded)."""
        return int(self._call("nvmlDeviceGetTotalEnergyConsumption"))

    def power_mw(self) -> int:
        """``nvmlDeviceGetPowerUsage`` in mW (instant or averaged: see ``nvml_power``)."""
        return int(self._call("nvmlDeviceGetPowerUsage"))

    def power_readings_mw(self) -> dict[str, int | None]:
        """Board power three ways, in mW: ``usage``, ``instant`` and ``average``.

        ``usage`` is ``nvmlDeviceGetPowerUsage``; ``instant`` and ``average`` are the field values
        ``NVML_FI_DEV_POWER_INSTANT`` and ``NVML_FI_DEV_POWER_AVERAGE`` at GPU scope, read in one
        ``nvmlDeviceGetFieldValues`` call. A reading the GPU or its driver does not offer is None
        (a per-field return code other than success, a driver without field values, a power
        usage query the board does not support). What each one is: see the module docstring.

        Raises:
            DeviceLostError: the GPU has fallen off the bus (in the call or in a field's code).
            DeviceError: NVML failed otherwise.
        """
        try:
            usage: int | None = self.power_mw()
        except DeviceNotSupportedError:
            usage = None
        return {"usage": usage, **self._read_power_fields(("instant", "average"))}

    def instant_power_mw(self) -> int:
        """The instant reading ``capabilities().power_sensing`` names, in mW (one NVML call).

        Raises:
            DeviceNotSupportedError: the GPU offers only a one-second average.
        """
        sensing = self.capabilities().power_sensing
        reading = None if sensing is None else sensing.reading
        if reading == "usage":
            return self.power_mw()
        if reading is not None:
            value = self._read_power_fields((reading,))[reading]
            if value is not None:
                return value
        why = sensing.note if sensing is not None else "no instant power reading"
        gpu = f"GPU {self.identity.index} ({self.identity.uuid})"
        raise DeviceNotSupportedError(f"no instant power reading on {gpu}: {why}")

    def _read_power_fields(self, keys: tuple[str, ...]) -> dict[str, int | None]:
        target = f"GPU {self.identity.index} ({self.identity.uuid})"
        return read_power_fields(self._nvml, self._handle, keys, target)

    def sm_clock_mhz(self) -> int:
        """The current SM clock in MHz."""
        return int(self._call("nvmlDeviceGetClockInfo", self._nvml.NVML_CLOCK_SM))

    def mem_clock_mhz(self) -> int:
        """The current memory clock in MHz."""
        return int(self._call("nvmlDeviceGetClockInfo", self._nvml.NVML_CLOCK_MEM))

    def temperature_c(self) -> int:
        """The GPU die temperature in degrees C."""
        return int(self._call("nvmlDeviceGetTemperature", self._nvml.NVML_TEMPERATURE_GPU))

    def memory_info(self) -> MemoryInfo | None:
        """NVML's total and free device memory (``nvmlDeviceGetMemoryInfo``, v1); None where
        the board does not say."""
        try:
            info = self._call("nvmlDeviceGetMemoryInfo")
        except DeviceNotSupportedError:
            return None
        return MemoryInfo(total_bytes=int(info.total), free_bytes=int(info.free))

    def float32_matmul_default(self, framework: str) -> str:
        """TF32 for JAX and TensorFlow on Ampere and later (their default float32 matmul uses
        the tensor cores); FP32 for PyTorch (``allow_tf32`` is off by default) and before."""
        tf32 = self.identity.architecture in _TF32_ARCHITECTURES
        return "tf32" if tf32 and framework in ("jax", "tensorflow") else "float32"

    def memory_used_bytes(self) -> int | None:
        """NVML's used device memory in bytes (``nvmlDeviceGetMemoryInfo``, v1: the driver's
        reserve included); None where the board does not say."""
        from orchestrator.errors import DeviceNotSupportedError

        try:
            return int(self._call("nvmlDeviceGetMemoryInfo").used)
        except DeviceNotSupportedError:
            return None

    def clock_event_reasons(self) -> ClockEventReason:
        """Why the clock is held down now, as the reasons this package knows."""
        fn = (
            "nvmlDeviceGetCurrentClocksEventReasons"
            if hasattr(self._nvml, "nvmlDeviceGetCurrentClocksEventReasons")
            else "nvmlDeviceGetCurrentClocksThrottleReasons"
        )
        bits = int(self._call(fn))
        known = 0
        for reason in ClockEventReason:
            known |= reason.value
        return ClockEventReason(bits & known)
