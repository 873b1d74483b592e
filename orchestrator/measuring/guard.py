"""The guard: the only path that changes a device setting, and the promise to change it back.

A ``SettingsGuard`` owns one GPU for as long as it is open:

1. **Lease.** It takes an exclusive, per-GPU lock file (``<journal_dir>/<uuid>.lease``) so that
   two processes, and so two concurrent sweeps, never drive one GPU at once. The OS releases the
   lock when the holder dies, even by ``kill -9``.
2. **Journal first.** Before changing anything it writes what it is about to change and the
   original values to ``<journal_dir>/<uuid>.json``, flushed and fsynced. The entry is removed only
   once the device is restored. An entry whose owner is gone (the lease is free) is therefore a
   device a killed process left changed: a new guard refuses that device, and ``restore_journal``
   (``dvfs restore``, in ``orchestrator.measuring.journal`` with the journal itself) puts it back
   and says what it did.
3. **Policy before the device.** A request outside the policy (allowed SM clock, power-limit and
   offset ranges, by default the device's own) or outside what the device supports is refused
   before any call reaches the driver.
4. **Restore always**: on normal exit, on exceptions, on SIGINT/SIGTERM (handlers restore, then
   behave as the signal would have), and via ``atexit``.

NVML cannot read locked clocks back, so "restore" for locked clocks means reset (the driver's
default); the power limit and clock offset are restored to the values read before the first
change. ``observe_only`` guards change nothing at all and refuse any request that asks for a
setting: that is what a user without root, or on a shared GPU, runs.
"""

from __future__ import annotations

import atexit
import os
import signal
import socket
import threading
import time
from types import FrameType
from typing import Any

from filelock import FileLock, Timeout

from orchestrator.devices.base import Device
from orchestrator.errors import (
    DeviceBusyError,
    DvfsError,
    InvalidSettingError,
    UnrestoredDeviceError,
    UserError,
    close_on_exit,
)
from orchestrator.jobs.policy import Policy
from orchestrator.jobs.request import SettingsRequest
from orchestrator.measuring.journal import JOURNAL_VERSION, Journal, restore_setting

# --- the guard --------------------------------------------------------------------------------
_open_guards: set[SettingsGuard] = set()
_handlers_lock = threading.Lock()
_previous_handlers: dict[int, Any] = {}


class SettingsGuard:
    """Exclusive, journaled, always-restored control of one device's settings."""

    def __init__(
        self,
        device: Device,
        journal: Journal,
        policy: Policy | None = None,
        *,
        observe_only: bool = False,
        lease_timeout_s: float = 0.0,
    ) -> None:
        self.device = device
        self.journal = journal
        self.policy = policy or Policy()
        self.observe_only = observe_only
        self.lease_timeout_s = lease_timeout_s
        self._lease = FileLock(journal.lease_path(device.identity.uuid))
        self._entered = False
        self._original: dict[str, Any] | None = None
        self._changed: set[str] = set()

    # --- lifecycle ---------------------------------------------------------------------------
    def __enter__(self) -> SettingsGuard:
        ident = self.device.identity
        try:
            self._lease.acquire(timeout=self.lease_timeout_s)
        except Timeout:
            raise DeviceBusyError(
                f"GPU {ident.index} ({ident.uuid}) is in use by another process "
                f"(lease {self._lease.lock_file}); one GPU runs one sweep at a time"
            ) from None
        try:
            entry = self.journal.read(ident.uuid)
        except BaseException:
            self._lease.release()
            raise
        if entry is not None:
            self._lease.release()
            raise UnrestoredDeviceError(
                f"GPU {ident.index} ({ident.uuid}) was left changed by pid {entry.get('pid')} on "
                f"{entry.get('host')} ({', '.join(entry.get('changed', [])) or 'settings'}); "
                f"run `dvfs restore` first"
            )
        self._entered = True
        _register(self)
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        close_on_exit(self.close, exc, f"restoring GPU {self.device.identity.index}")

    def close(self) -> None:
        """Restore the device and release the lease (idempotent)."""
        if not self._entered:
            return
        try:
            self.restore()
        finally:
            self._entered = False
            _unregister(self)
            self._lease.release()

    # --- changing settings -------------------------------------------------------------------
    def check(self, request: SettingsRequest) -> None:
        """Refuse a request (policy, support, observe-only) without touching the device."""
        ident = self.device.identity
        if self.observe_only and not request.is_default:
            raise UserError(
                f"device.observe_only=true changes nothing, but this trial asks for "
                f"{request.describe()} on GPU {ident.index}; drop the setting or observe_only"
            )
        self.policy.check(request, self.device.capabilities(), ident.name)

    def apply(self, request: SettingsRequest) -> None:
        """Put the device in exactly the requested state (unrequested settings at default)."""
        if not self._entered:
            raise RuntimeError("SettingsGuard.apply outside its `with` block")
        self.check(request)
        if self.observe_only:
            return
        wanted = {
            "sm_clock": request.sm_clock_mhz is not None,
            "mem_clock": request.mem_clock_mhz is not None,
            "power_limit": request.power_limit_w is not None,
            "clock_offset": request.clock_offset_mhz is not None,
        }
        # Anything changed before and not asked for now goes back to its original value first.
        for name in sorted(self._changed - {k for k, v in wanted.items() if v}):
            self._restore_one(name)
        to_change = {k for k, v in wanted.items() if v}
        if not to_change:
            self._close_entry_if_clean()
            return
        self._journal_before(to_change)
        dev = self.device
        if request.mem_clock_mhz is not None:
            dev.set_locked_mem_clocks(request.mem_clock_mhz, request.mem_clock_mhz)
        if request.sm_clock_mhz is not None:
            dev.set_locked_sm_clocks(*request.sm_clock_mhz)
        if request.power_limit_w is not None:
            dev.set_power_limit_w(request.power_limit_w)
            got = dev.settings().power_limit_w
            if abs(got - request.power_limit_w) > 1.0:
                raise InvalidSettingError(
                    f"power limit read back as {got:g} W after setting {request.power_limit_w:g} W"
                )
        if request.clock_offset_mhz is not None:
            dev.set_clock_offset_mhz(request.clock_offset_mhz)

    def restore(self) -> list[str]:
        """Put back everything this guard changed; returns what was restored.

        Every setting is tried, even after one fails (a clock that would not reset must not keep
        the power limit low); the first failure is raised after, and the journal entry stays for
        what is still changed, for `dvfs restore`.
        """
        restored: list[str] = []
        failed: list[DvfsError] = []
        for name in sorted(self._changed):
            try:
                self._restore_one(name)
            except DvfsError as e:
                failed.append(e)
                continue
            restored.append(name)
        if failed:
            for other in failed[1:]:
                failed[0].add_note(f"and: {other}")
            raise failed[0]
        self._close_entry_if_clean()
        return restored

    # --- internals ---------------------------------------------------------------------------
    def _journal_before(self, to_change: set[str]) -> None:
        """Record originals and intent durably before the first call that changes anything."""
        if self._original is None:
            s = self.device.settings()
            self._original = {
                "power_limit_w": s.power_limit_w,
                "clock_offset_mhz": s.clock_offset_mhz,
            }
        self._changed |= to_change
        ident = self.device.identity
        self.journal.write(
            ident.uuid,
            {
                "version": JOURNAL_VERSION,
                "uuid": ident.uuid,
                "index": ident.index,
                "name": ident.name,
                "backend": ident.backend,
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "written_at": time.time(),
                "original": self._original,
                "changed": sorted(self._changed),
            },
        )

    def _restore_one(self, name: str) -> None:
        restore_setting(self.device, name, self._original or {})
        self._changed.discard(name)

    def _close_entry_if_clean(self) -> None:
        if not self._changed:
            self.journal.remove(self.device.identity.uuid)
            self._original = None


# --- signals and exit -------------------------------------------------------------------------
def _register(guard: SettingsGuard) -> None:
    with _handlers_lock:
        first = not _open_guards
        _open_guards.add(guard)
        if first and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                _previous_handlers[sig] = signal.signal(sig, _on_signal)


def _unregister(guard: SettingsGuard) -> None:
    with _handlers_lock:
        _open_guards.discard(guard)
        if not _open_guards and threading.current_thread() is threading.main_thread():
            for sig, handler in _previous_handlers.items():
                signal.signal(sig, handler)
            _previous_handlers.clear()


def restore_all_open() -> None:
    """Restore every guard open in this process (signals and atexit call this)."""
    for guard in list(_open_guards):
        try:
            guard.close()
        except DvfsError as e:  # the journal entry stays, so `dvfs restore` can finish the job
            ident = guard.device.identity
            _say(f"dvfs: GPU {ident.index} ({ident.uuid}) could not be restored: {e}; "
                 f"run `dvfs restore`\n")


def _say(text: str) -> None:
    """Write to stderr from a signal handler or at exit (os.write: no buffered stream to lock)."""
    try:
        os.write(2, text.encode(errors="replace"))
    except OSError:  # stderr already closed: the journal entry still says it
        pass


def _on_signal(signum: int, frame: FrameType | None) -> None:
    previous = _previous_handlers.get(signum)
    restore_all_open()
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_IGN:
        return
    else:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


atexit.register(restore_all_open)
