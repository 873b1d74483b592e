"""The guard's policy file: which clock, power and offset ranges a sweep may set, per GPU model.

A policy narrows what the device itself supports (it never widens it). The file is YAML or JSON::

    default:                         # every GPU model
      power_range_w: [150, 400]
    "NVIDIA A100-SXM4-40GB":         # one model, by the name NVML reports
      sm_clock_range_mhz: [900, 1410]
      clock_offset_range_mhz: [0, 0]

Because a policy is a safety limit, it is read only from a path that nobody but its owner (the
current user or root) can write: a file writable by group or others, or a file in a directory
that others could replace it in (writable by group or others without the sticky bit, or owned by
someone else), is refused, as ``ssh`` refuses a loose ``authorized_keys``. The checks are made on
the open file (``fstat``), so the file read is the file checked. Every range must be a
``[low, high]`` pair of finite numbers; anything else is refused with one line. Parsed with a safe
YAML loader; nothing here unpickles anything. The policy binds root too: the guard refuses a
setting outside it whoever runs the sweep.
"""

from __future__ import annotations

import math
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.errors import InvalidSettingError, PolicyViolationError, UserError

if TYPE_CHECKING:
    from orchestrator.devices.base import DeviceCapabilities
    from orchestrator.jobs.request import SettingsRequest

_RANGE_KEYS = ("sm_clock_range_mhz", "power_range_w", "clock_offset_range_mhz")


@dataclass(frozen=True)
class Policy:
    """Allowed ranges; None means "whatever the device supports"."""

    sm_clock_range_mhz: tuple[int, int] | None = None
    power_range_w: tuple[float, float] | None = None
    clock_offset_range_mhz: tuple[int, int] | None = None

    @classmethod
    def from_mapping(cls, data: dict[str, Any] | None) -> Policy:
        """Build from a mapping like ``{"sm_clock_range_mhz": [900, 1410], ...}``."""
        data = dict(data or {})
        unknown = set(data) - {"sm_clock_range_mhz", "power_range_w", "clock_offset_range_mhz"}
        if unknown:
            raise UserError(f"unknown policy keys: {', '.join(sorted(unknown))}")
        return cls(**{k: tuple(v) if v is not None else None for k, v in data.items()})

    def check(self, request: SettingsRequest, caps: DeviceCapabilities, device_name: str) -> None:
        """Refuse a request outside this policy or the device's support, before any call."""
        if request.mem_clock_mhz is not None and request.mem_clock_mhz not in caps.mem_clocks_mhz:
            raise InvalidSettingError(
                f"memory clock {request.mem_clock_mhz} MHz is not supported by {device_name}; "
                f"supported: {', '.join(map(str, sorted(caps.mem_clocks_mhz)))} MHz"
            )
        if request.sm_clock_mhz is not None:
            supported = caps.supported_sm_clocks_mhz(request.mem_clock_mhz)
            lo, hi = request.sm_clock_mhz
            if lo > hi:
                raise InvalidSettingError(f"SM clock range {lo}-{hi} MHz has min above max")
            for value in {lo, hi}:
                if value not in supported:
                    raise InvalidSettingError(
                        f"SM clock {value} MHz is not supported by {device_name}; supported: "
                        f"{supported[0]}-{supported[-1]} MHz in {_steps(supported)} "
                        f"({len(supported)} values), e.g. {_nearest(supported, value)}"
                    )
            self._within("SM clock", (lo, hi), self.sm_clock_range_mhz, "MHz")
        if request.power_limit_w is not None:
            p = request.power_limit_w
            if not caps.power_limit_min_w <= p <= caps.power_limit_max_w:
                raise InvalidSettingError(
                    f"power limit {p:g} W is out of range for {device_name}: "
                    f"{caps.power_limit_min_w:g}-{caps.power_limit_max_w:g} W"
                )
            self._within("power limit", (p, p), self.power_range_w, "W")
        if request.clock_offset_mhz is not None:
            rng = caps.clock_offset_range_mhz
            off = request.clock_offset_mhz
            if rng is None:
                raise InvalidSettingError(f"{device_name} does not support clock offsets")
            if not rng[0] <= off <= rng[1]:
                raise InvalidSettingError(
                    f"clock offset {off:+d} MHz is out of range for {device_name}: "
                    f"{rng[0]}..{rng[1]} MHz"
                )
            self._within("clock offset", (off, off), self.clock_offset_range_mhz, "MHz")

    @staticmethod
    def _within(what: str, value: tuple[float, float], allowed: tuple | None, unit: str) -> None:
        if allowed is not None and not (allowed[0] <= value[0] and value[1] <= allowed[1]):
            shown = f"{value[0]:g}" if value[0] == value[1] else f"{value[0]:g}-{value[1]:g}"
            raise PolicyViolationError(
                f"{what} {shown} {unit} is outside the policy's allowed range "
                f"{allowed[0]:g}-{allowed[1]:g} {unit}"
            )


def _steps(clocks: tuple[int, ...]) -> str:
    if len(clocks) < 2:
        return "one step"
    diffs = sorted({b - a for a, b in zip(clocks, clocks[1:])})
    return f"{diffs[0]} MHz steps" if len(diffs) == 1 else f"{diffs[0]}-{diffs[-1]} MHz steps"


def _nearest(clocks: tuple[int, ...], value: int) -> str:
    near = sorted(clocks, key=lambda c: abs(c - value))[:2]
    return " or ".join(f"{c}" for c in sorted(near))


def load_policy(path: str | os.PathLike[str] | None, device_name: str) -> Policy:
    """The policy for one GPU model (the file's ``default`` merged with the model's entry).

    Args:
        path: the policy file (``device.policy_file``); None: no policy beyond the device's own.
        device_name: the GPU model as NVML names it (``"NVIDIA A100-SXM4-40GB"``).

    Raises:
        UserError: the file is missing, unreadable, writable by others, owned by someone else,
            not YAML/JSON, or holds a key or range that is not a policy's.
    """
    if path is None:
        return Policy()
    p = Path(path).expanduser()
    where = f"device.policy_file={p}"
    try:
        with open(p, "rb") as f:
            _check_owner_only(where, p, os.fstat(f.fileno()), "file")
            raw = f.read(1 << 20)
    except FileNotFoundError:
        raise UserError(f"{where} does not exist") from None
    except IsADirectoryError:
        raise UserError(f"{where} is a directory, not a policy file") from None
    except OSError as e:
        raise UserError(f"{where} cannot be read: {e.strerror or e}") from None
    for directory in _directories_of(p):
        try:
            st = directory.stat()
        except OSError as e:
            raise UserError(
                f"{where}: cannot check directory {directory}: {e.strerror or e}"
            ) from None
        _check_owner_only(where, directory, st, "directory")
    data = _parse(where, raw)
    if not isinstance(data, dict):
        raise UserError(f"{where} must map GPU model names (or 'default') to ranges")
    merged: dict[str, Any] = {}
    for section in ("default", device_name):
        entry = data.get(section)
        if entry is None:
            continue
        if not isinstance(entry, dict):
            raise UserError(f"{where}: {section!r} must map range names to [low, high] pairs")
        merged.update(entry)
    unknown = sorted(str(k) for k in merged if k not in _RANGE_KEYS)
    if unknown:
        raise UserError(
            f"{where}: unknown policy keys: {', '.join(unknown)}; "
            f"known: {', '.join(_RANGE_KEYS)}"
        )
    for key, value in merged.items():
        _check_range(where, key, value)
    return Policy.from_mapping(merged)


def _directories_of(p: Path) -> list[Path]:
    """Every directory above the file, as given and with symlinks resolved."""
    seen: dict[str, Path] = {}
    for path in (p.absolute(), p.resolve()):
        for parent in path.parents:
            seen.setdefault(str(parent), parent)
    return list(seen.values())


def _check_owner_only(where: str, path: Path, st: os.stat_result, what: str) -> None:
    """Refuse a file or directory someone other than its owner (you or root) could change."""
    writable = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    sticky_dir = what == "directory" and st.st_mode & stat.S_ISVTX
    if writable and not sticky_dir:
        raise UserError(
            f"{where}: the {what} {path} is writable by others (mode {stat.filemode(st.st_mode)}); "
            f"a safety policy must be writable only by its owner: chmod go-w {path}"
        )
    if st.st_uid not in (0, os.geteuid()):
        raise UserError(
            f"{where}: the {what} {path} is owned by uid {st.st_uid}, neither you nor root"
        )


def _check_range(where: str, key: str, value: Any) -> None:
    if value is None:
        return
    ok = (
        isinstance(value, (list, tuple))
        and len(value) == 2
        and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            for v in value
        )
        and value[0] <= value[1]
    )
    if not ok:
        raise UserError(f"{where}: {key} must be a [low, high] pair of numbers, not {value!r}")


def _parse(where: str, raw: bytes) -> Any:
    import yaml

    try:
        return yaml.safe_load(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise UserError(f"{where} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    except yaml.YAMLError as e:
        first = str(e).splitlines()[0]
        raise UserError(f"{where} is not valid YAML/JSON: {first}") from e
