"""The NVML adapter: the one place that speaks nvidia-ml-py.

``NvmlBackend`` takes the NVML *module* as a parameter: the real ``pynvml`` from nvidia-ml-py on a
GPU machine, or ``orchestrator.devices.sim.nvml`` (a simulated NVML with the same functions,
constants and error classes) everywhere else. The adapter is therefore the same code in CI and on
hardware.

NVML's errors never leave this module: ``_nvml_errors`` maps each to one of ours with a message that
names the call, the GPU and what to do (no permission -> run as root or observe only; invalid
argument -> the allowed values; not supported -> which call on which GPU).

Devices are found by UUID or PCI bus id, never by CUDA's numbering: NVML numbers GPUs in PCI order
and CUDA does not unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID``.

Health (``NvmlDevice.health``, contract in ``Device.health``) uses what NVML offers on every
datacenter GPU: ``NVML_ERROR_GPU_IS_LOST`` on any call; XID critical errors delivered as events
(an event set registered for ``nvmlEventTypeXidCriticalError`` when the device is opened, drained
with ``nvmlEventSetWait_v2(set, 0)``); the volatile uncorrected ECC count
(``nvmlDeviceGetTotalEccErrors``), compared with its value when the device was opened; and the
temperature against ``nvmlDeviceGetTemperatureThreshold(NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)``.
A query the GPU does not support (no ECC, no events) turns that check off, never the device.

Power, as NVML reports it on each generation (Yang et al., SC'24, "Part-time Power
Measurements", arXiv 2312.02741; NVML's docs of ``nvmlDeviceGetPowerUsage``):

- ``nvmlDeviceGetPowerUsage``: on GA100 (A100, A30, A800: PCI device ids 0x20xx-0x21xx) and
  older architectures the instantaneous sensor: every 100 ms from a ~25 ms window on GA100, 100 ms
  from 100 ms on Turing, 20 ms from 10 ms on Volta and Pascal. On every other Ampere, on Ada,
  Hopper and newer NVML documents it as a one-second average (~900 ms rise after a step).
- ``NVML_FI_DEV_POWER_INSTANT`` (``nvmlDeviceGetFieldValues``, GPU scope): the instantaneous
  sensor, every 100 ms from a ~21-25 ms window on Hopper; ``NVML_FI_DEV_POWER_AVERAGE``: the
  one-second average (not on GA100). Drivers from about R530 offer both (``nvidia-smi``'s
  ``power.draw.instant``/``power.draw.average``). An older driver answers each with a code
  other than success in the field's own ``nvmlReturn`` (NOT_SUPPORTED, or INVALID_ARGUMENT for
  an id it does not know), and a driver older than the call itself (CUDA 9 era) makes pynvml
  raise ``NVMLError_FunctionNotFound``: either way the reading is None, never an error.

``NvmlDevice.power_readings_mw`` returns all three in mW (one ``nvmlDeviceGetPowerUsage`` and one
``nvmlDeviceGetFieldValues`` call). ``capabilities().power_sensing`` (probed once, when
capabilities are first read) names the instant one a meter may poll: the instant field where
the driver offers it and ``nvmlDeviceGetPowerUsage`` is an average, ``nvmlDeviceGetPowerUsage``
where it is itself instant, and none on a Hopper-class GPU whose driver lacks the instant field
(a meter then refuses to poll: integrating a one-second average smears every change of power
over a second). The update period and window it states are the published figures above; NVML
has no call that reports them. ``instant_power_mw`` reads that one reading (one NVML call).
The adapter runs unchanged over nvidia-ml-py's ``pynvml`` and the simulated NVML.
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
    PowerSensing,
)
from orchestrator.errors import (
    DeviceError,
    DeviceLostError,
    DeviceNotFoundError,
    DeviceNotSupportedError,
    DevicePermissionError,
    InvalidSettingError,
)

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

_PERMISSION_HINT = (
    "changing clocks and power limits needs root (or `nvidia-smi -acp UNRESTRICTED` for "
    "application clocks); run as root, or set device.observe_only=true to measure at the "
    "current settings"
)


# XIDs an application causes (its own bad kernel, a page fault, a stopped or cleaned-up context):
# the trial that caused one is a `crash`, but the GPU is fine for the next trial.
APPLICATION_XIDS = frozenset({13, 31, 43, 45})
XID_NAMES = {
    13: "graphics engine exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "preemptive cleanup, due to previous errors",
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint/warning",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}
_MAX_EVENTS_PER_CHECK = 1000


def _text(value: Any) -> str:
    """nvidia-ml-py returns str in v12+ and bytes in older releases."""
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlBackend:
    """An initialised NVML (real or simulated) and the devices it sees.

    Use as a context manager, or call ``close()``: NVML is reference-counted, so every
    ``nvmlInit`` here is paired with one ``nvmlShutdown``.
    """

    def __init__(self, nvml: ModuleType, backend: Backend = "nvml") -> None:
        self.nvml = nvml
        self.backend: Backend = backend
        self._lock = threading.Lock()
        with _nvml_errors(nvml, "nvmlInit", "the driver"):
            nvml.nvmlInit()
        self._open = True
        with _nvml_errors(nvml, "nvmlSystemGetDriverVersion", "the driver"):
            self.driver_version = _text(nvml.nvmlSystemGetDriverVersion())

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
        with _nvml_errors(self.nvml, "nvmlDeviceGetCount", "the driver"):
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
            what, call, arg = f"PCI bus id {pci_bus_id}", nvml.nvmlDeviceGetHandleByPciBusId, pci_bus_id
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
            raise _translate(nvml, e, call.__name__, what) from e
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
        with _nvml_errors(nvml, "identity queries", "a GPU"):
            index = int(nvml.nvmlDeviceGetIndex(handle))
            uuid = _text(nvml.nvmlDeviceGetUUID(handle))
            name = _text(nvml.nvmlDeviceGetName(handle))
            pci_info = nvml.nvmlDeviceGetPciInfo(handle)
            pci = _text(pci_info.busId)
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
        # Health baselines: what "since the device was opened" counts from (see health()).
        self._health_lock = threading.Lock()
        self._xids: list[int] = []
        self._slowdown_c: int | None | bool = False  # False: not read yet; None: unsupported
        self._ecc_at_open = self._uncorrected_ecc()
        self._events = self._open_xid_events()

    def __repr__(self) -> str:
        i = self.identity
        return f"<{type(self).__name__} {i.index} {i.name} {i.uuid}>"

    # --- plumbing ----------------------------------------------------------------------------
    def _call(self, fn: str, *args: Any) -> Any:
        with _nvml_errors(self._nvml, fn, f"GPU {self.identity.index} ({self.identity.uuid})"):
            return getattr(self._nvml, fn)(self._handle, *args)

    # --- what may be set ---------------------------------------------------------------------
    def capabilities(self) -> DeviceCapabilities:
        if self._caps is None:
            nvml = self._nvml
            mem = tuple(int(m) for m in self._call("nvmlDeviceGetSupportedMemoryClocks"))
            sm = {m: tuple(int(c) for c in self._call("nvmlDeviceGetSupportedGraphicsClocks", m)) for m in mem}
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
        with self._allowed(f"SM clocks must lie in {self._sm_range()} MHz"):
            self._call("nvmlDeviceSetGpuLockedClocks", int(min_mhz), int(max_mhz))
        self._locked_sm = (int(min_mhz), int(max_mhz))

    def reset_locked_sm_clocks(self) -> None:
        self._call("nvmlDeviceResetGpuLockedClocks")
        self._locked_sm = None

    def set_locked_mem_clocks(self, min_mhz: int, max_mhz: int) -> None:
        mems = ", ".join(map(str, sorted(self.capabilities().mem_clocks_mhz)))
        with self._allowed(f"supported memory clocks: {mems} MHz"):
            self._call("nvmlDeviceSetMemoryLockedClocks", int(min_mhz), int(max_mhz))
        self._locked_mem = (int(min_mhz), int(max_mhz))

    def reset_locked_mem_clocks(self) -> None:
        self._call("nvmlDeviceResetMemoryLockedClocks")
        self._locked_mem = None

    def set_power_limit_w(self, watts: float) -> None:
        caps = self.capabilities()
        with self._allowed(f"power limit must lie in {caps.power_limit_min_w:g}-{caps.power_limit_max_w:g} W"):
            self._call("nvmlDeviceSetPowerManagementLimit", int(round(watts * 1000)))

    def set_clock_offset_mhz(self, offset_mhz: int) -> None:
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
    def _monitor(self, fn: Any) -> Any:
        """Run one health query at open; None if the GPU cannot answer it (check turned off)."""
        try:
            return fn()
        except DeviceLostError:
            raise
        except DeviceError:
            return None

    def _uncorrected_ecc(self) -> int | None:
        """The volatile uncorrected ECC count; None where ECC is off or unsupported."""
        nvml = self._nvml
        if not hasattr(nvml, "nvmlDeviceGetTotalEccErrors"):
            return None

        def read() -> int | None:
            if hasattr(nvml, "nvmlDeviceGetEccMode"):
                current = self._call("nvmlDeviceGetEccMode")[0]
                if current != getattr(nvml, "NVML_FEATURE_ENABLED", 1):
                    return None
            return int(
                self._call(
                    "nvmlDeviceGetTotalEccErrors",
                    nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                    nvml.NVML_VOLATILE_ECC,
                )
            )

        return self._monitor(read)

    def _open_xid_events(self) -> Any:
        """An NVML event set that receives this GPU's XIDs; None where events are unsupported."""
        nvml = self._nvml
        if not hasattr(nvml, "nvmlEventSetCreate"):
            return None
        target = f"GPU {self.identity.index} ({self.identity.uuid})"

        def create() -> Any:
            with _nvml_errors(nvml, "nvmlEventSetCreate", target):
                events = nvml.nvmlEventSetCreate()
            try:
                self._call("nvmlDeviceRegisterEvents", nvml.nvmlEventTypeXidCriticalError, events)
            except BaseException:
                with contextlib.suppress(Exception):
                    nvml.nvmlEventSetFree(events)
                raise
            return events

        return self._monitor(create)

    def _drain_xids(self) -> None:
        """Collect the XIDs the driver has reported since the last look (never blocks)."""
        nvml = self._nvml
        wait = getattr(nvml, "nvmlEventSetWait_v2", None) or nvml.nvmlEventSetWait
        target = f"GPU {self.identity.index} ({self.identity.uuid})"
        for _ in range(_MAX_EVENTS_PER_CHECK):
            try:
                data = wait(self._events, 0)
            except nvml.NVMLError_Timeout:
                return
            except nvml.NVMLError as e:
                raise _translate(nvml, e, "nvmlEventSetWait_v2", target) from e
            if int(data.eventType) & nvml.nvmlEventTypeXidCriticalError:
                self._xids.append(int(data.eventData))

    def _slowdown_threshold_c(self) -> int | None:
        if self._slowdown_c is False:
            try:
                self._slowdown_c = int(
                    self._call(
                        "nvmlDeviceGetTemperatureThreshold", self._nvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
                    )
                )
            except DeviceNotSupportedError:
                self._slowdown_c = None
        return self._slowdown_c  # type: ignore[return-value]

    def _check_health(self) -> Health:
        i = self.identity
        gpu = f"GPU {i.index} ({i.uuid})"
        with self._health_lock:
            try:
                temperature = self.temperature_c()  # first: a lost GPU fails every call
                if self._events is not None:
                    self._drain_xids()
                faults = [x for x in self._xids if x not in APPLICATION_XIDS]
                if faults:
                    shown = ", ".join(f"{x} ({XID_NAMES.get(x, 'see the NVIDIA XID catalog')})" for x in faults[:3])
                    return Health(False, f"{gpu} reported XID {shown}; it needs a reset or a check", "xid")
                if self._ecc_at_open is not None:
                    now = self._uncorrected_ecc()
                    if now is not None and now > self._ecc_at_open:
                        return Health(
                            False,
                            f"{gpu} had {now - self._ecc_at_open} uncorrected ECC error(s) since it was "
                            f"opened (volatile count {self._ecc_at_open} -> {now})",
                            "ecc",
                        )
                slowdown = self._slowdown_threshold_c()
                if slowdown is not None and temperature >= slowdown:
                    return Health(
                        False,
                        f"{gpu} is at {temperature} C, at or above its slowdown threshold of {slowdown} C",
                        "thermal",
                    )
            except DeviceLostError:
                return Health(False, f"{gpu} is lost (NVML: GPU is lost, fallen off the bus); it needs a reset", "lost")
            except DeviceError as e:
                return Health(False, f"{gpu}: a health query failed: {e}", "query_failed")
        return Health.healthy()

    def close(self) -> None:
        """Free the XID event set (the backend shuts NVML down)."""
        events, self._events = self._events, None
        if events is not None:
            with contextlib.suppress(Exception):
                self._nvml.nvmlEventSetFree(events)

    # --- telemetry ---------------------------------------------------------------------------
    def energy_mj(self) -> int:
        return int(self._call("nvmlDeviceGetTotalEnergyConsumption"))

    def power_mw(self) -> int:
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
        """The power field values ``keys`` (of ``_POWER_FIELDS``) in one call; None: not offered."""
        nvml = self._nvml
        readings: dict[str, int | None] = dict.fromkeys(keys)
        fields = [(key, getattr(nvml, name, None)) for key, name in _POWER_FIELDS if key in keys]
        fields = [(key, field_id) for key, field_id in fields if field_id is not None]
        if not fields or not hasattr(nvml, "nvmlDeviceGetFieldValues"):
            return readings
        scope = getattr(nvml, "NVML_POWER_SCOPE_GPU", 0)
        target = f"GPU {self.identity.index} ({self.identity.uuid})"
        unsupported = tuple(
            getattr(nvml, name)
            for name in ("NVMLError_NotSupported", "NVMLError_FunctionNotFound")
            if hasattr(nvml, name)
        )
        try:
            values = nvml.nvmlDeviceGetFieldValues(
                self._handle, [(field_id, scope) for _, field_id in fields]
            )
        except nvml.NVMLError as e:
            if isinstance(e, unsupported):
                return readings  # a driver without field values: usage is all there is
            raise _translate(nvml, e, "nvmlDeviceGetFieldValues", target) from e
        for (key, _), value in zip(fields, values):
            code = int(value.nvmlReturn)
            if code == nvml.NVML_ERROR_GPU_IS_LOST:
                raise _translate(nvml, nvml.NVMLError(code), "nvmlDeviceGetFieldValues", target)
            if code == nvml.NVML_SUCCESS:
                readings[key] = _field_value(nvml, value)
        return readings

    def sm_clock_mhz(self) -> int:
        return int(self._call("nvmlDeviceGetClockInfo", self._nvml.NVML_CLOCK_SM))

    def mem_clock_mhz(self) -> int:
        return int(self._call("nvmlDeviceGetClockInfo", self._nvml.NVML_CLOCK_MEM))

    def temperature_c(self) -> int:
        return int(self._call("nvmlDeviceGetTemperature", self._nvml.NVML_TEMPERATURE_GPU))

    def clock_event_reasons(self) -> ClockEventReason:
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


# Architectures whose nvmlDeviceGetPowerUsage NVML documents as a one-second average (all but GA100
# of Ampere, and everything newer); GA100 is told apart by its PCI device id.
_AVERAGED_USAGE = frozenset({"ampere", "ada", "hopper", "blackwell"})
_GA100_DEVICE_IDS = range(0x2000, 0x2200)  # A100, A30, A800 (GA102 starts at 0x2200)
# (update period s, window s) of the instant sensor, from Yang et al. SC'24.
_INSTANT_SENSOR = {"ga100": (0.1, 0.025), "averaged": (0.1, 0.025), "turing": (0.1, 0.1)}
_OLD_SENSOR = (0.02, 0.01)  # Volta and Pascal (assumed for older and unknown architectures)


def is_ga100(pci_device_id: int, name: str = "") -> bool:
    """Whether a GPU is a GA100 (``nvmlPciInfo_t.pciDeviceId`` is ``device << 16 | 0x10DE``)."""
    if pci_device_id:
        return (pci_device_id >> 16) in _GA100_DEVICE_IDS
    return any(tag in name for tag in ("A100", "A30", "A800"))


def power_sensing(
    architecture: str, pci_device_id: int, name: str, *, instant_field: bool
) -> PowerSensing:
    """What a GPU's power readings are (see the module docstring) and which one is instant.

    Args:
        architecture: ``DeviceIdentity.architecture``.
        pci_device_id: ``nvmlPciInfo_t.pciDeviceId`` (0: unknown; the name decides GA100).
        name: the GPU's name, for the note.
        instant_field: ``NVML_FI_DEV_POWER_INSTANT`` answered with success.
    """
    ga100 = architecture == "ampere" and is_ga100(pci_device_id, name)
    if architecture in _AVERAGED_USAGE and not ga100:
        period, window = _INSTANT_SENSOR["averaged"]
        if instant_field:
            return PowerSensing(
                "instant", period, window,
                f"{name}: NVML_FI_DEV_POWER_INSTANT is polled (updates every {period * 1e3:g} ms "
                f"from a ~{window * 1e3:g} ms window); nvmlDeviceGetPowerUsage is a 1 s average",
            )
        return PowerSensing(
            None, period, 1.0,
            f"{name} ({architecture}): nvmlDeviceGetPowerUsage is a 1 s average and the driver "
            "offers no NVML_FI_DEV_POWER_INSTANT (about R530 and newer do): no instant power "
            "reading to integrate",
        )
    kind = "ga100" if ga100 else architecture
    period, window = _INSTANT_SENSOR.get(kind, _OLD_SENSOR)
    return PowerSensing(
        "usage", period, window,
        f"{name}: nvmlDeviceGetPowerUsage is instantaneous (updates every {period * 1e3:g} ms "
        f"from a ~{window * 1e3:g} ms window)",
    )


# (reading key, pynvml constant) of the power field values NvmlDevice.power_readings_mw reads.
_POWER_FIELDS = (("instant", "NVML_FI_DEV_POWER_INSTANT"), ("average", "NVML_FI_DEV_POWER_AVERAGE"))

# nvmlValueType_t -> the member of the c_nvmlValue_t union that holds a value of that type.
_VALUE_MEMBERS = (
    ("NVML_VALUE_TYPE_DOUBLE", "dVal"),
    ("NVML_VALUE_TYPE_UNSIGNED_INT", "uiVal"),
    ("NVML_VALUE_TYPE_UNSIGNED_LONG", "ulVal"),
    ("NVML_VALUE_TYPE_UNSIGNED_LONG_LONG", "ullVal"),
    ("NVML_VALUE_TYPE_SIGNED_LONG_LONG", "sllVal"),
    ("NVML_VALUE_TYPE_SIGNED_INT", "siVal"),
    ("NVML_VALUE_TYPE_UNSIGNED_SHORT", "usVal"),
)


def _field_value(nvml: ModuleType, value: Any) -> int:
    """The number one ``c_nvmlFieldValue_t`` holds, read from the union member its type names."""
    kind = int(value.valueType)
    for type_name, member in _VALUE_MEMBERS:
        if getattr(nvml, type_name, None) == kind:
            return int(round(getattr(value.value, member)))
    raise DeviceError(f"NVML field {int(value.fieldId)} has an unknown value type {kind}")


@contextlib.contextmanager
def _nvml_errors(nvml: ModuleType, call: str, target: str) -> Iterator[None]:
    """Turn an NVMLError raised inside into our error for ``call`` on ``target``."""
    try:
        yield
    except nvml.NVMLError as e:
        raise _translate(nvml, e, call, target) from e


def _translate(nvml: ModuleType, e: Exception, call: str, target: str) -> Exception:
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
