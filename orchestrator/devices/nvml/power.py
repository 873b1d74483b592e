"""What a GPU's power readings are, and reading NVML's power field values.

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
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from orchestrator.devices.base import PowerSensing
from orchestrator.devices.nvml.errors import translate_nvml_error
from orchestrator.errors import DeviceError

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
POWER_FIELDS = (("instant", "NVML_FI_DEV_POWER_INSTANT"), ("average", "NVML_FI_DEV_POWER_AVERAGE"))

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


def read_power_fields(
    nvml: ModuleType, handle: Any, keys: tuple[str, ...], target: str
) -> dict[str, int | None]:
    """The power field values ``keys`` (of ``POWER_FIELDS``) in one call; None: not offered.

    Args:
        nvml: the NVML module (nvidia-ml-py's ``pynvml`` or the simulated one).
        handle: the GPU's NVML handle.
        keys: which readings, of ``"instant"`` and ``"average"``.
        target: the GPU as error messages name it, e.g. ``GPU 0 (GPU-...)``.

    Raises:
        DeviceLostError: the GPU has fallen off the bus (in the call or in a field's code).
        DeviceError: NVML failed otherwise.
    """
    readings: dict[str, int | None] = dict.fromkeys(keys)
    fields = [(key, getattr(nvml, name, None)) for key, name in POWER_FIELDS if key in keys]
    fields = [(key, field_id) for key, field_id in fields if field_id is not None]
    if not fields or not hasattr(nvml, "nvmlDeviceGetFieldValues"):
        return readings
    scope = getattr(nvml, "NVML_POWER_SCOPE_GPU", 0)
    unsupported = tuple(
        getattr(nvml, name)
        for name in ("NVMLError_NotSupported", "NVMLError_FunctionNotFound")
        if hasattr(nvml, name)
    )
    try:
        values = nvml.nvmlDeviceGetFieldValues(
            handle, [(field_id, scope) for _, field_id in fields]
        )
    except nvml.NVMLError as e:
        if isinstance(e, unsupported):
            return readings  # a driver without field values: usage is all there is
        raise translate_nvml_error(nvml, e, "nvmlDeviceGetFieldValues", target) from e
    for (key, _), value in zip(fields, values):
        code = int(value.nvmlReturn)
        if code == nvml.NVML_ERROR_GPU_IS_LOST:
            lost = nvml.NVMLError(code)
            raise translate_nvml_error(nvml, lost, "nvmlDeviceGetFieldValues", target)
        if code == nvml.NVML_SUCCESS:
            readings[key] = _field_value(nvml, value)
    return readings
