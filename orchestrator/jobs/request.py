"""What a trial asks of a device: the settings request, and the one way a job's config makes it.

A ``SettingsRequest`` is the setting under test (locked SM and memory clocks, a power limit, a
clock offset; None leaves one at the device's default). The guard (``measuring/guard.py``) checks
it against the policy and the device and applies it; the job (``jobs/job.py``) makes it from its
``device`` config once (:func:`settings_request`); the search and the rows read it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from orchestrator.config import DeviceConfig, parse_sm_clock


@dataclass(frozen=True)
class SettingsRequest:
    """What a trial asks of a device; None leaves that setting at the device's default."""

    sm_clock_mhz: tuple[int, int] | None = None  # locked (min, max) SM clock
    mem_clock_mhz: int | None = None  # locked memory clock
    power_limit_w: float | None = None  # power-management limit
    clock_offset_mhz: int | None = None  # GPC clock offset

    @property
    def is_default(self) -> bool:
        """True when nothing is asked for (the device's default setting)."""
        return all(v is None for v in asdict(self).values())

    def describe(self) -> str:
        """A short human description, e.g. ``sm=1065 MHz, power=250 W``."""
        parts = []
        if self.sm_clock_mhz is not None:
            lo, hi = self.sm_clock_mhz
            parts.append(f"sm={hi} MHz" if lo == hi else f"sm={lo}-{hi} MHz")
        if self.mem_clock_mhz is not None:
            parts.append(f"mem={self.mem_clock_mhz} MHz")
        if self.power_limit_w is not None:
            parts.append(f"power={self.power_limit_w:g} W")
        if self.clock_offset_mhz is not None:
            parts.append(f"offset={self.clock_offset_mhz:+d} MHz")
        return ", ".join(parts) or "device default"


def settings_request(device_cfg: DeviceConfig) -> SettingsRequest:
    """The settings a job's ``device`` config asks for."""
    return SettingsRequest(
        sm_clock_mhz=parse_sm_clock(device_cfg.sm_clock_mhz),
        mem_clock_mhz=None if device_cfg.mem_clock_mhz is None else int(device_cfg.mem_clock_mhz),
        power_limit_w=None if device_cfg.power_limit_w is None else float(device_cfg.power_limit_w),
        clock_offset_mhz=(
            None if device_cfg.clock_offset_mhz is None else int(device_cfg.clock_offset_mhz)
        ),
    )
