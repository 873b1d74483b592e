"""A Google TPU chip as a measured device (``device=tpu``), seen through JAX.

A TPU exposes no power reading and nothing to set: a trial times its kernel (wall time, which on
an asynchronous accelerator is the device's, since the window waits for its last call) and checks
it, and energy is "not measured" with that reason in the row. What the device says:

- **Identity** from JAX: ``device_kind`` (``TPU v5 lite`` on a v5e), the chip's ``id`` as the
  index, a UUID hashed from the host name, the kind and the id (stable across runs), and the
  JAX and libtpu versions as the "driver".
- **Memory** from ``Device.memory_stats()``: ``bytes_limit`` (what the runtime lets JAX
  allocate) and ``bytes_in_use``; free is their difference.
- **Runtime metrics**, where ``libtpu.sdk.tpumonitoring`` imports: ``duty_cycle_pct`` and
  ``tensorcore_util`` of the chip, read after each window (``window_readings``); absent from the
  row where the module is not there (older libtpu), never an error.
- **Arithmetic**: a float32 matrix product at JAX's default precision is one bfloat16 pass on
  the MXU, so the checks of ``precision=default`` take the bfloat16 tolerance
  (``float32_matmul_default``).

Nothing can be set: ``orchestrator.config.validate_static`` refuses a clock, a memory clock, a
power limit or an offset, and any framework but JAX (TensorFlow and PyTorch need their own TPU
builds), before anything runs. Units: bytes for memory, percent for the runtime metrics.
"""

from __future__ import annotations

import hashlib
import socket
import uuid
from typing import Any

from orchestrator.devices.base import (
    Backend,
    DeviceCapabilities,
    DeviceIdentity,
    MemoryInfo,
    Telemetry,
)
from orchestrator.devices.cpu import ObservedDevice
from orchestrator.errors import DeviceNotFoundError, DeviceNotSupportedError, UserError

NO_ENERGY = ("a TPU exposes no power or energy reading (libtpu's runtime metrics have duty "
             "cycle, tensor-core utilisation and HBM use, no watts): time only")
_NO_SETTINGS = ("device=tpu has no settings to change: a TPU exposes no clock or power control "
                "(the chip is measured as it runs; use device=nvml or device=sim to change "
                "clocks or power limits)")
RUNTIME_METRICS = {"duty_cycle_pct": "tpu_duty_cycle_pct",
                   "tensorcore_util": "tpu_tensorcore_util_pct"}
"""libtpu's metric -> the row's column (percent, this chip's entry of the per-chip list)."""


class TpuDevice(ObservedDevice):
    """One TPU chip (see the module docstring).

    Args:
        jax_device: the chip's ``jax.Device``.
        index: its position among the host's chips.
        versions: the JAX and libtpu versions, the "driver" of the identity.
    """

    no_settings = _NO_SETTINGS

    def __init__(self, jax_device: Any, index: int, versions: str = "") -> None:
        self._jax_device = jax_device
        kind = str(getattr(jax_device, "device_kind", "TPU"))
        chip = int(getattr(jax_device, "id", index))
        digest = hashlib.sha256(f"{socket.gethostname()}\0{kind}\0{chip}".encode()).hexdigest()
        self.identity = DeviceIdentity(
            index=index, uuid=f"TPU-{uuid.UUID(hex=digest[:32])}", pci_bus_id="",
            name=kind, architecture=kind, driver_version=versions, backend="tpu",
        )
        self._caps = DeviceCapabilities(
            mem_clocks_mhz=(), sm_clocks_mhz={}, power_limit_min_w=0.0, power_limit_max_w=0.0,
            power_limit_default_w=0.0, clock_offset_range_mhz=None, has_energy_counter=False,
            has_power_sensor=False, energy_note=NO_ENERGY,
        )
        self._monitoring: Any = _tpumonitoring()

    def __repr__(self) -> str:
        return f"<TpuDevice {self.identity.name} {self.identity.uuid}>"

    # --- memory and arithmetic -------------------------------------------------------------
    def memory_info(self) -> MemoryInfo | None:
        """``bytes_limit`` and ``bytes_limit - bytes_in_use`` of JAX's ``memory_stats()``."""
        stats = self._jax_device.memory_stats() or {}
        if "bytes_limit" not in stats:
            return None
        limit = int(stats["bytes_limit"])
        return MemoryInfo(limit, max(limit - int(stats.get("bytes_in_use", 0)), 0))

    def memory_used_bytes(self) -> int | None:
        """JAX's ``bytes_in_use`` on the chip."""
        stats = self._jax_device.memory_stats() or {}
        return int(stats["bytes_in_use"]) if "bytes_in_use" in stats else None

    def float32_matmul_default(self, framework: str) -> str:
        """One bfloat16 pass: JAX's default float32 matmul precision on a TPU."""
        del framework
        return "bfloat16"

    def window_readings(self) -> dict[str, float]:
        """libtpu's runtime metrics for this chip now (empty where libtpu has none)."""
        if self._monitoring is None:
            return {}
        found: dict[str, float] = {}
        for metric, column in RUNTIME_METRICS.items():
            try:
                data = list(self._monitoring.get_metric(metric).data() or [])
                found[column] = float(data[min(self.identity.index, len(data) - 1)])
            except Exception:  # noqa: BLE001 - a metric this libtpu lacks is left out
                continue
        return found

    # --- telemetry: none ---------------------------------------------------------------------
    def energy_mj(self) -> int:
        """Refused: a TPU has no energy counter."""
        raise DeviceNotSupportedError(f"{self.identity.name}: {NO_ENERGY}")

    def power_mw(self) -> int:
        """Refused: a TPU has no power sensor."""
        raise DeviceNotSupportedError(f"{self.identity.name}: {NO_ENERGY}")

    def power_readings_mw(self) -> dict[str, int | None]:
        """None for every reading: a TPU has no power sensor."""
        return {"usage": None, "instant": None, "average": None}

    def sm_clock_mhz(self) -> int:
        """0: a TPU does not report its clock."""
        return 0

    def mem_clock_mhz(self) -> int:
        """0: a TPU does not report its memory clock."""
        return 0

    def temperature_c(self) -> int:
        """0: the chip's temperature is not exposed to JAX."""
        return 0

    def telemetry(self) -> Telemetry:
        """Nothing to read but zeros (``has_power_sensor`` and ``has_energy_counter`` False)."""
        return Telemetry(energy_mj=None, power_mw=0, sm_clock_mhz=0, mem_clock_mhz=0,
                         temperature_c=0)


def _tpumonitoring() -> Any:
    """libtpu's monitoring module, or None where this libtpu has none."""
    try:
        from libtpu.sdk import tpumonitoring  # type: ignore[import-not-found]
    except Exception:  # noqa: BLE001 - ImportError, or a libtpu that fails to load it
        return None
    return tpumonitoring


class TpuBackend:
    """The host's TPU chips as a backend, with the shape of ``CpuBackend``.

    Args:
        devices: the chips (None: every TPU JAX sees here).

    Raises:
        UserError: JAX finds no TPU here.
    """

    def __init__(self, devices: list[TpuDevice] | None = None) -> None:
        self.backend: Backend = "tpu"
        if devices is None:
            devices = _local_tpus()
        self._devices = devices
        self.driver_version = devices[0].identity.driver_version if devices else ""

    def __enter__(self) -> TpuBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Nothing to release: JAX keeps its client for the process."""

    def count(self) -> int:
        """How many chips."""
        return len(self._devices)

    def devices(self) -> list[TpuDevice]:
        """Every chip, in JAX's order."""
        return list(self._devices)

    def device(
        self, index: int | None = None, *, uuid: str | None = None, pci_bus_id: str | None = None
    ) -> TpuDevice:
        """A chip by index or UUID (a TPU has no PCI bus id here).

        Raises:
            DeviceNotFoundError: no such chip (the message names those there are).
        """
        for d in self._devices:
            if (uuid is not None and d.identity.uuid == uuid) or (
                    uuid is None and pci_bus_id is None and index == d.identity.index):
                return d
        there = ", ".join(f"{d.identity.index} ({d.identity.uuid})" for d in self._devices)
        what = uuid or pci_bus_id or f"index {index}"
        raise DeviceNotFoundError(f"no TPU chip {what}: device=tpu has {there or 'none'}")


def _local_tpus() -> list[TpuDevice]:
    """Every TPU chip JAX sees on this host."""
    try:
        import jax

        chips = jax.local_devices(backend="tpu")
    except Exception as e:  # noqa: BLE001 - no TPU runtime: one line naming what to use
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        raise UserError(f"device=tpu: JAX finds no TPU here ({first}); use device=cpu or "
                        "device=sim") from None
    versions = f"jax {jax.__version__}"
    try:
        from importlib.metadata import version

        versions += f", libtpu {version('libtpu')}"
    except Exception:  # noqa: BLE001 - the version is a label only
        pass
    return [TpuDevice(chip, i, versions) for i, chip in enumerate(chips)]
