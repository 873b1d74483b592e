"""The guard's journal: what a guard is about to change, on disk, before it changes it.

One JSON file per GPU UUID (``<journal_dir>/<uuid>.json``), written atomically (tmp file, fsync,
rename, fsync the directory) so that a ``kill -9`` at any instant leaves either the old entry or
the new one, never half of one. Beside each entry is the GPU's lease file
(``<journal_dir>/<uuid>.lease``), the lock a live ``SettingsGuard`` holds: an entry whose lease
is free is a device a dead process left changed. ``restore_journal`` (``dvfs restore``) puts such
devices back: locked clocks are reset (NVML cannot read them back), the power limit and clock
offset return to the values recorded before the first change.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from filelock import FileLock, Timeout

from orchestrator.devices.base import Device
from orchestrator.errors import UserError

JOURNAL_VERSION = 1


class Journal:
    """Entries on disk, one JSON file per GPU UUID, each written atomically and fsynced."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)

    def entry_path(self, uuid: str) -> Path:
        """Where one GPU's entry lives (it exists only while the GPU is changed)."""
        return self.directory / f"{uuid}.json"

    def lease_path(self, uuid: str) -> Path:
        """The lock file a live guard holds for one GPU (free: nobody is driving it)."""
        return self.directory / f"{uuid}.lease"

    def write(self, uuid: str, entry: dict[str, Any]) -> None:
        """Write an entry durably: tmp file, fsync, rename, fsync the directory."""
        path = self.entry_path(uuid)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        with open(tmp, "w") as f:
            json.dump(entry, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(self.directory)

    def read(self, uuid: str) -> dict[str, Any] | None:
        """The entry of one GPU, None if it has none.

        Raises:
            UserError: the entry is not a journal entry (not UTF-8, not JSON, or not the shape
                ``SettingsGuard`` writes); the file is left in place.
        """
        path = self.entry_path(uuid)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            entry = json.loads(raw.decode("utf-8"))
            problem = _entry_problem(entry)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            problem = str(e)
        if problem:
            raise UserError(
                f"journal entry {path} is corrupt ({problem}); it is left in place: check the "
                f"device by hand, then remove the file"
            )
        return entry

    def remove(self, uuid: str) -> None:
        """Drop one GPU's entry once it is restored, durably (the directory is fsynced)."""
        self.entry_path(uuid).unlink(missing_ok=True)
        _fsync_dir(self.directory)

    def uuids(self) -> list[str]:
        """UUIDs of every GPU with an open entry."""
        return sorted(p.stem for p in self.directory.glob("*.json"))

    def is_leased(self, uuid: str) -> bool:
        """True if a live process holds this GPU's lease right now."""
        lock = FileLock(self.lease_path(uuid))
        try:
            lock.acquire(timeout=0)
        except Timeout:
            return True
        lock.release()
        return False


_SETTINGS = ("clock_offset", "mem_clock", "power_limit", "sm_clock")  # what a guard may change


def _entry_problem(entry: Any) -> str | None:
    """What makes a decoded journal entry unusable for a restore (None: nothing)."""
    if not isinstance(entry, dict):
        return f"a {type(entry).__name__}, not an object"
    changed = entry.get("changed", [])
    if not isinstance(changed, list) or not all(isinstance(c, str) for c in changed):
        return "'changed' is not a list of setting names"
    unknown = sorted(set(changed) - set(_SETTINGS))
    if unknown:
        return f"unknown setting(s) {', '.join(unknown)}"
    original = entry.get("original", {})
    if not isinstance(original, dict):
        return "'original' is not an object"
    for key in ("power_limit_w", "clock_offset_mhz"):
        value = original.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            return f"original {key} is {value!r}, not a number"
    return None


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def restore_setting(device: Device, name: str, original: dict[str, Any]) -> None:
    """Undo one setting: reset locked clocks; put power limit and offset back."""
    if name == "sm_clock":
        device.reset_locked_sm_clocks()
    elif name == "mem_clock":
        device.reset_locked_mem_clocks()
    elif name == "power_limit":
        watts = original.get("power_limit_w")
        if watts is None:
            watts = device.capabilities().power_limit_default_w
        device.set_power_limit_w(watts)
    elif name == "clock_offset":
        device.set_clock_offset_mhz(int(original.get("clock_offset_mhz") or 0))
    else:
        raise ValueError(f"unknown setting {name!r} in journal")


@dataclass(frozen=True)
class RestoreAction:
    """What ``restore_journal`` did for one journal entry."""

    uuid: str
    name: str
    restored: tuple[str, ...]  # settings put back
    skipped_reason: str | None = None  # e.g. "in use by a live process"

    def describe(self) -> str:
        """One line for ``dvfs restore`` to print."""
        if self.skipped_reason:
            return f"{self.name} {self.uuid}: skipped ({self.skipped_reason})"
        return f"{self.name} {self.uuid}: restored {', '.join(self.restored)}"


def restore_journal(journal: Journal, find_device: Callable[[str], Device]) -> list[RestoreAction]:
    """Restore every device a dead process left changed (what ``dvfs restore`` runs).

    Args:
        journal: the journal to read.
        find_device: opens a device by UUID (from the backend the entries were written on).
    """
    actions = []
    for uuid in journal.uuids():
        lease = FileLock(journal.lease_path(uuid))
        try:
            lease.acquire(timeout=0)
        except Timeout:
            entry = journal.read(uuid) or {}
            skipped = RestoreAction(uuid, entry.get("name", "GPU"), (), "in use by a live process")
            actions.append(skipped)
            continue
        try:
            entry = journal.read(uuid)
            if entry is None:
                continue
            device = find_device(uuid)
            changed = tuple(entry.get("changed", []))
            for name in changed:
                restore_setting(device, name, entry.get("original", {}))
            journal.remove(uuid)
            actions.append(RestoreAction(uuid, entry.get("name", device.identity.name), changed))
        finally:
            lease.release()
    return actions
