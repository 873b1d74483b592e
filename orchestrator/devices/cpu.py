"""The host CPU as a measured device (``device=cpu``).

A ``CpuDevice`` is the machine's processor seen through the ``Device`` interface, so that a trial
can time a kernel and measure its energy on the host as it does on a GPU:

- **Identity from the OS**: the model name from ``/proc/cpuinfo`` (``model name``; else
  ``platform.processor()``), the count of logical CPUs (``os.cpu_count()``), the architecture
  (``platform.machine()``) and, as the "driver", the kernel release (``platform.release()``). The
  UUID, ``CPU-<8-4-4-4-12 hex>``, is a hash of the host name and the model, so it is stable across
  runs on one machine and differs between machines.
- **Time** is wall time (``time.perf_counter``, the ``Device`` default): the kernel really runs
  here, so the window's length is the host's.
- **Energy** comes from Linux powercap RAPL. Every package-level zone
  ``<powercap_root>/intel-rapl:N`` (the Intel RAPL driver, which AMD Zen kernels also use) has a
  cumulative counter ``energy_uj`` in microjoules that counts up to ``max_energy_range_uj`` ("the
  range of the above energy counter", Documentation/ABI/testing/sysfs-class-powercap) and then
  starts again from 0. A reading below the previous one is one wrap, and adds
  ``max_energy_range_uj + 1`` µJ (exact to within one RAPL energy unit, about 61 µJ, per wrap).
  Sub-zones (``intel-rapl:N:M``: cores, uncore, DRAM) are parts of their package and a platform
  zone (``psys``) contains the packages, so only zones named ``package-*`` are summed: nothing is
  counted twice. ``energy_mj()`` is the sum over packages in mJ, cumulative and never decreasing;
  the device keeps the unwrap state, so it must be read at least once per wrap period (minutes
  under full load: 2**32 energy units of 61 µJ is about 262 kJ).
- **No power sensor and no settings.** RAPL gives energy, not an instant power reading, so
  ``power_mw()`` raises and ``capabilities().has_power_sensor`` is False. Nothing can be set
  (``orchestrator.config.validate_static`` refuses a sweep that asks for a setting before anything
  runs); the setters raise ``DeviceNotSupportedError`` and the resets do nothing, since a CPU
  sweep never changes anything to reset.

Where no package zone's ``energy_uj`` can be read (no powercap in a VM, or a kernel of 5.10 or later
that keeps the counter to root since PLATYPUS, CVE-2020-8694), ``has_energy_counter`` is False and
``capabilities().energy_note`` says why in one line, for the trial's row.

Units: µJ in sysfs (``*_uj``), mJ out of ``energy_mj()``, kHz in ``cpufreq`` and MHz out of
``sm_clock_mhz()`` (the mean current core frequency), millidegrees in sysfs and °C out of
``temperature_c()`` (the hottest package sensor).
"""

from __future__ import annotations

import errno
import hashlib
import os
import platform
import re
import socket
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path

from orchestrator.devices.base import (
    Backend,
    ClockEventReason,
    Device,
    DeviceCapabilities,
    DeviceIdentity,
    DeviceSettings,
    MemoryInfo,
    Telemetry,
)
from orchestrator.errors import DeviceError, DeviceNotFoundError, DeviceNotSupportedError

POWERCAP_ROOT = Path("/sys/class/powercap")
_PACKAGE_ZONE = re.compile(r"intel-rapl:(\d+)")  # top-level zones only, not intel-rapl:N:M
_HWMON_PACKAGE_SENSORS = ("coretemp", "k10temp", "zenpower")  # Intel, AMD, AMD (out of tree)
_ROOT_ONLY_HINT = "energy_uj is readable by root only since Linux 5.10 (CVE-2020-8694)"
_NO_SETTINGS = (
    "device=cpu has no settings to change: the host CPU is measured as it runs; "
    "use device=nvml or device=sim to change clocks or power limits"
)


@dataclass(frozen=True)
class HostPaths:
    """Where the OS describes the processor (tests point these at a directory of their own)."""

    cpuinfo: Path = Path("/proc/cpuinfo")  # "model name" and "cpu MHz" lines
    cpu_sysfs: Path = Path("/sys/devices/system/cpu")  # cpuN/cpufreq/scaling_cur_freq (kHz)
    thermal: Path = Path("/sys/class/thermal")  # thermal_zoneN/{type,temp}: x86_pkg_temp
    hwmon: Path = Path("/sys/class/hwmon")  # hwmonN/{name,temp1_input}: coretemp, k10temp


def _read_int(path: Path) -> int:
    """A sysfs file holding one integer.

    Raises:
        OSError: the file cannot be read (missing, a directory, permission denied).
        ValueError: it does not hold an integer.
    """
    text = path.read_text().strip()
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{path}: not an integer ({text[:40]!r})") from None


def _why(path: Path, e: Exception) -> str:
    """Why ``path`` could not be read, in a few words (with the root-only hint where it applies)."""
    if isinstance(e, OSError):
        reason = e.strerror or type(e).__name__
        if e.errno in (errno.EACCES, errno.EPERM):
            reason += f" ({_ROOT_ONLY_HINT})"
        return f"{path}: {reason}"
    return str(e)


@dataclass
class RaplZone:
    """One package's RAPL counter and its unwrap state."""

    name: str  # the zone's own name, e.g. "package-0"
    energy_path: Path  # <zone>/energy_uj
    range_uj: int  # max_energy_range_uj: the counter runs 0..range_uj, then wraps to 0
    last_uj: int  # the raw reading of the previous read
    total_uj: int  # unwrapped: the first raw reading plus every increase since

    def read_uj(self) -> int:
        """Read the counter and return the unwrapped total in µJ.

        Raises:
            OSError, ValueError: the counter could not be read.
        """
        raw = _read_int(self.energy_path)
        delta = raw - self.last_uj
        if delta < 0:  # one wrap since the last read
            delta += self.range_uj + 1
        self.last_uj = raw
        self.total_uj += delta
        return self.total_uj


class RaplCounter:
    """The package-level RAPL zones under one powercap root, unwrapped and summed.

    ``zones`` is empty and ``note`` says why when no package's counter can be read. A package
    whose counter cannot be read makes the whole counter unusable (a sum over the other packages
    would silently leave a socket out).

    Args:
        root: the powercap class directory (``/sys/class/powercap``).
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.zones: list[RaplZone] = []
        self.note: str | None = None
        self._lock = threading.Lock()
        try:
            self.zones = self._discover()
        except _NoCounter as e:
            self.note = f"no RAPL energy counter: {e}"

    def _discover(self) -> list[RaplZone]:
        if not self.root.is_dir():
            raise _NoCounter(f"{self.root} does not exist (no powercap in this kernel or VM)")
        found = sorted(
            (int(m.group(1)), p)
            for p in self.root.iterdir()
            if (m := _PACKAGE_ZONE.fullmatch(p.name))
        )
        zones: list[RaplZone] = []
        for _, path in found:
            try:
                name = (path / "name").read_text().strip()
            except OSError:
                name = path.name  # no name file: take it for a package, as the driver makes them
            if name != path.name and not name.startswith("package-"):
                continue  # psys (the whole platform, packages included) or another domain
            energy = path / "energy_uj"
            try:
                raw = _read_int(energy)
            except (OSError, ValueError) as e:
                raise _NoCounter(_why(energy, e)) from e
            span = path / "max_energy_range_uj"
            try:
                range_uj = _read_int(span)
            except (OSError, ValueError) as e:
                raise _NoCounter(f"{_why(span, e)} (needed to unwrap {energy})") from e
            zones.append(RaplZone(name, energy, range_uj, last_uj=raw, total_uj=raw))
        if not zones:
            raise _NoCounter(f"{self.root} has no intel-rapl package zone")
        return zones

    def read_uj(self) -> int:
        """The unwrapped energy of every package together, in µJ.

        Raises:
            DeviceNotSupportedError: there is no usable counter (``note`` says why).
            DeviceError: a counter that could be read before cannot be read now.
        """
        if not self.zones:
            raise DeviceNotSupportedError(self.note or "no RAPL energy counter")
        with self._lock:
            total = 0
            for zone in self.zones:
                try:
                    total += zone.read_uj()
                except (OSError, ValueError) as e:
                    why = _why(zone.energy_path, e)
                    raise DeviceError(f"reading the RAPL counter failed: {why}") from e
            return total


class _NoCounter(Exception):
    """Why a powercap tree offers no usable package counter (becomes ``energy_note``)."""


def cpu_model_name(cpuinfo: Path) -> str:
    """The processor's model name: ``model name`` in ``/proc/cpuinfo``, else what Python knows."""
    try:
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, sep, value = line.partition(":")
            if sep and key.strip() == "model name" and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


class ObservedDevice(Device):
    """A device measured as it runs, with nothing to set (the host CPU, a TPU): no clocks, no
    power limits, no offsets; every setter refuses with ``no_settings`` and every reset does
    nothing, since nothing was ever changed.

    Subclasses set ``identity``, ``no_settings`` (one line: what to use instead) and
    ``_caps`` (their ``DeviceCapabilities``).
    """

    no_settings: str = _NO_SETTINGS
    _caps: DeviceCapabilities

    def capabilities(self) -> DeviceCapabilities:
        """No clocks, no power limits, no offsets; an energy counter where the device has one."""
        return self._caps

    def settings(self) -> DeviceSettings:
        """Nothing is settable: a power limit of 0 W stands for "none"."""
        return DeviceSettings(power_limit_w=0.0, clock_offset_mhz=None)

    def set_locked_sm_clocks(self, min_mhz: int, max_mhz: int) -> None:
        """Refused: the device locks no clock (``DeviceNotSupportedError``)."""
        raise DeviceNotSupportedError(
            f"{self.no_settings} (asked: SM clock {min_mhz}-{max_mhz} MHz)")

    def reset_locked_sm_clocks(self) -> None:
        """Nothing to reset: the device never changes a clock."""

    def set_locked_mem_clocks(self, min_mhz: int, max_mhz: int) -> None:
        """Refused: the device locks no clock (``DeviceNotSupportedError``)."""
        asked = f"memory clock {min_mhz}-{max_mhz} MHz"
        raise DeviceNotSupportedError(f"{self.no_settings} (asked: {asked})")

    def reset_locked_mem_clocks(self) -> None:
        """Nothing to reset: the device never changes a clock."""

    def set_power_limit_w(self, watts: float) -> None:
        """Refused: the device sets no power limit (``DeviceNotSupportedError``)."""
        raise DeviceNotSupportedError(f"{self.no_settings} (asked: power limit {watts:g} W)")

    def set_clock_offset_mhz(self, offset_mhz: int) -> None:
        """Refused: the device sets no clock offset (``DeviceNotSupportedError``)."""
        raise DeviceNotSupportedError(
            f"{self.no_settings} (asked: clock offset {offset_mhz:+d} MHz)")

    def clock_event_reasons(self) -> ClockEventReason:
        """NONE: nothing reports reasons in NVML's sense."""
        return ClockEventReason.NONE


def host_memory(meminfo: Path = Path("/proc/meminfo")) -> MemoryInfo | None:
    """The host's memory from ``/proc/meminfo``: ``MemTotal`` and ``MemAvailable`` (what new
    allocations may take without swapping); None where the file cannot be read."""
    found: dict[str, int] = {}
    try:
        for line in meminfo.read_text().splitlines():
            key, sep, value = line.partition(":")
            if sep and key in ("MemTotal", "MemAvailable"):
                found[key] = int(value.split()[0]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        return None
    if "MemTotal" not in found:
        return None
    return MemoryInfo(found["MemTotal"], found.get("MemAvailable", found["MemTotal"]))


class CpuDevice(ObservedDevice):
    """The host CPU (see the module docstring): wall time, RAPL energy, no settings.

    Args:
        powercap_root: the powercap class directory; None: ``/sys/class/powercap``.
        host: where the OS describes the processor.
    """

    def __init__(
        self, powercap_root: str | Path | None = None, *, host: HostPaths = HostPaths()
    ) -> None:
        self.host = host
        self.model_name = cpu_model_name(host.cpuinfo)
        self.cpu_count = os.cpu_count() or 1
        hostname = socket.gethostname()
        digest = hashlib.sha256(f"{hostname}\0{self.model_name}".encode()).hexdigest()
        self.identity = DeviceIdentity(
            index=0,
            uuid=f"CPU-{uuid.UUID(hex=digest[:32])}",
            pci_bus_id="",
            name=f"{self.model_name} ({self.cpu_count} CPUs)",
            architecture=platform.machine() or "unknown",
            driver_version=platform.release(),
            backend="cpu",
        )
        self.rapl = RaplCounter(Path(powercap_root) if powercap_root else POWERCAP_ROOT)
        self._freq_files = sorted(host.cpu_sysfs.glob("cpu[0-9]*/cpufreq/scaling_cur_freq"))
        self._temp_files = self._package_sensors()
        self._caps = DeviceCapabilities(
            mem_clocks_mhz=(),
            sm_clocks_mhz={},
            power_limit_min_w=0.0,
            power_limit_max_w=0.0,
            power_limit_default_w=0.0,
            clock_offset_range_mhz=None,
            has_energy_counter=bool(self.rapl.zones),
            has_power_sensor=False,
            energy_note=self.rapl.note,
        )

    def __repr__(self) -> str:
        return f"<CpuDevice {self.identity.name} {self.identity.uuid}>"

    def _package_sensors(self) -> list[Path]:
        """Package temperature files: thermal zones of type x86_pkg_temp, else hwmon's temp1."""
        zones = [
            z / "temp"
            for z in sorted(self.host.thermal.glob("thermal_zone*"))
            if _text_or_none(z / "type") == "x86_pkg_temp"
        ]
        if zones:
            return zones
        return [
            h / "temp1_input"
            for h in sorted(self.host.hwmon.glob("hwmon*"))
            if _text_or_none(h / "name") in _HWMON_PACKAGE_SENSORS
        ]

    def memory_info(self) -> MemoryInfo | None:
        """The host's memory: ``MemTotal`` and ``MemAvailable`` of ``/proc/meminfo``."""
        return host_memory()

    # --- telemetry ------------------------------------------------------------------------
    def energy_mj(self) -> int:
        """Every package's RAPL energy, unwrapped, in mJ (cumulative; never decreases).

        Raises:
            DeviceNotSupportedError: no readable RAPL counter (``energy_note`` says why).
            DeviceError: the counter could be read when the device opened, and now cannot.
        """
        return self.rapl.read_uj() // 1000

    def power_mw(self) -> int:
        """Refused: a CPU has no power sensor; power is RAPL energy over a window."""
        raise DeviceNotSupportedError(
            f"{self.identity.name} has no power sensor: a CPU's energy comes from its RAPL "
            f"counter (energy_mj), and power is energy over a window"
        )

    def power_readings_mw(self) -> dict[str, int | None]:
        """None for every reading: a CPU has no power sensor."""
        return {"usage": None, "instant": None, "average": None}

    def sm_clock_mhz(self) -> int:
        """The mean current frequency of the cores (cpufreq, else /proc/cpuinfo), 0 if unknown."""
        khz = [v for v in (_int_or_none(p) for p in self._freq_files) if v is not None]
        if khz:
            return round(sum(khz) / len(khz) / 1000)
        try:
            lines = self.host.cpuinfo.read_text(errors="replace").splitlines()
        except OSError:
            return 0
        mhz = []
        for line in lines:
            key, sep, value = line.partition(":")
            if sep and key.strip() == "cpu MHz":
                try:
                    mhz.append(float(value))
                except ValueError:
                    continue
        return round(sum(mhz) / len(mhz)) if mhz else 0

    def mem_clock_mhz(self) -> int:
        """0: the OS does not report the memory clock."""
        return 0

    def temperature_c(self) -> int:
        """The hottest package sensor in °C; 0 where the OS shows none."""
        millis = [v for v in (_int_or_none(p) for p in self._temp_files) if v is not None]
        return round(max(millis) / 1000) if millis else 0

    def telemetry(self) -> Telemetry:
        """Every sensor once; ``power_mw`` is 0, since a CPU has none (``has_power_sensor``)."""
        try:
            energy: int | None = self.energy_mj()
        except DeviceError:
            energy = None
        return Telemetry(
            energy_mj=energy,
            power_mw=0,
            sm_clock_mhz=self.sm_clock_mhz(),
            mem_clock_mhz=0,
            temperature_c=self.temperature_c(),
        )


def _text_or_none(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _int_or_none(path: Path) -> int | None:
    try:
        return _read_int(path)
    except (OSError, ValueError):
        return None


class CpuBackend:
    """The host CPU as a backend of one device, with the shape of ``NvmlBackend``.

    Args:
        device: the one device (None: this host's CPU, read where the OS puts it).
    """

    def __init__(self, device: CpuDevice | None = None) -> None:
        self.backend: Backend = "cpu"
        self.driver_version = platform.release()
        self._device = device if device is not None else CpuDevice()

    def __enter__(self) -> CpuBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Nothing to release: the device only reads files."""

    def count(self) -> int:
        """One: the host's processors are measured together."""
        return 1

    def devices(self) -> list[CpuDevice]:
        """The one CPU device (the same object every time: it keeps the RAPL unwrap state)."""
        return [self._device]

    def device(
        self, index: int | None = None, *, uuid: str | None = None, pci_bus_id: str | None = None
    ) -> CpuDevice:
        """The CPU device by UUID, PCI bus id ("") or index (0).

        Raises:
            DeviceNotFoundError: anything else (the message names the one device there is).
        """
        ident = self._device.identity
        if uuid is not None:
            found, what = uuid == ident.uuid, f"UUID {uuid}"
        elif pci_bus_id is not None:
            found, what = pci_bus_id == ident.pci_bus_id, f"PCI bus id {pci_bus_id}"
        elif index is not None:
            found, what = index == 0, f"index {index}"
        else:
            raise ValueError("device() needs an index, a uuid or a pci_bus_id")
        if not found:
            raise DeviceNotFoundError(
                f"no CPU device with {what}: device=cpu has one device, index 0, {ident.uuid} "
                f"({ident.name})"
            )
        return self._device
