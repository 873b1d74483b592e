"""A simulated GPU's state file: two checksummed slots, mapped into memory by every process.

A GPU's state is a JSON-able dict, read with ``Machine.read(i)`` and changed with
``Machine.update(i, change)``: a locked read-modify-write, so concurrent processes (Ray workers,
a guard, ``dvfs restore`` after a kill) always see one consistent GPU. An accounted kernel call
makes one such update, so it has to be cheap (tens of microseconds, not the milliseconds a
replaced JSON file costs). Each ``gpu-<index>.state`` is a fixed-size file, mapped into memory
by every process that opens it, holding two *slots*; a slot is a header (magic, format,
generation, length, CRC-32 of all of it) and the state's bytes (compact JSON: the project
never unpickles or unmarshals a file).

- *A read* takes a shared ``flock`` on the file and decodes the valid slot (its CRC matches) with
  the higher generation.
- *An update* takes the exclusive ``flock``, decodes the current slot, runs ``change``, and writes
  the result into the *other* slot with the next generation, payload first and header last. The
  slot it writes is never the one readers use until the write is complete: a process killed at
  any instant of it leaves a slot whose CRC does not match, and every reader goes on using the
  previous state. Nothing is renamed or created on this path.
- ``flock`` belongs to an open file description, so threads of one process share one file
  descriptor and take a per-GPU re-entrant thread lock first (and a forked child opens its own).
  An update nested inside another on the same thread (a signal handler's setter while a kernel
  call is being accounted) writes first; the outer one then sees the generation moved and runs
  its ``change`` again on the new state, so neither change is lost.
- A process holds one view (descriptor and mapping) per file while anything uses it: a ``Machine``
  (which ``nvmlInit`` keeps until ``nvmlShutdown``) holds its views, and the last holder to let go
  closes them. A process that opens many machines in turn (a test session, a notebook) so never
  piles up descriptors; a view held by nobody is opened again when a machine needs it.
- Setters pass ``sync=True``: the written slot is ``msync``-ed before the call returns. The
  per-kernel-call path does not (a lost update on power failure of the host does not matter for
  a simulation, and a sync costs tens of microseconds to milliseconds). A power failure can lose
  the updates since the last synced one; it cannot mix two states.

A slot holds at most ``SLOT_BYTES`` less its header (1 MiB: some hundred thousand events); a
larger state is refused with ``StateTooLargeError`` and nothing is written.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import mmap
import os
import struct
import threading
import weakref
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


class StateCorruptError(ValueError):
    """A GPU's state file has no valid slot (not written by this module, or damaged on disk)."""


class StateTooLargeError(ValueError):
    """A GPU's state would not fit in one slot of its file."""


SLOT_BYTES = 1 << 20  # one slot, header included; a multiple of the page size (msync needs it)
_MAGIC = b"DVGS"
_FORMAT_MARSHAL = 1
_HEAD = struct.Struct("<4sIQQ")  # magic, format, generation, payload length
_SLOT_HEADER = struct.Struct("<4sIQQI4x")  # the above, then CRC-32 of head and payload
_CAPACITY = SLOT_BYTES - _SLOT_HEADER.size


def state_file_name(index: int) -> str:
    """The file that holds GPU ``index``'s state in a state directory."""
    return f"gpu-{index}.state"


def encode_state(state: dict[str, Any]) -> bytes:
    """The state as a slot stores it: compact JSON (never pickle or marshal: a state file is
    data anyone may have written, and decoding it must not be able to build objects). JSON
    refuses what it cannot hold (``TypeError``).
    """
    return json.dumps(state, separators=(",", ":")).encode()


def slot_bytes(payload: bytes, generation: int) -> tuple[bytes, bytes]:
    """The header and payload of a slot holding ``payload`` as ``generation``."""
    if len(payload) > _CAPACITY:
        raise StateTooLargeError(
            f"a simulated GPU's state of {len(payload)} bytes does not fit in {_CAPACITY} bytes"
        )
    head = _HEAD.pack(_MAGIC, _FORMAT_MARSHAL, generation, len(payload))
    crc = zlib.crc32(payload, zlib.crc32(head))
    return _SLOT_HEADER.pack(_MAGIC, _FORMAT_MARSHAL, generation, len(payload), crc), payload


def create_state_file(path: Path, state: dict[str, Any]) -> None:
    """Write a new state file holding ``state`` (generation 1) atomically and durably."""
    header, payload = slot_bytes(encode_state(state), 1)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.ftruncate(fd, 2 * SLOT_BYTES)  # sparse: only the pages written take room
        os.pwrite(fd, header + payload, 0)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    forget_state_file(path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class GpuStateFile:
    """One process's view of one state file: its descriptor, its mapping and its locks."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.pid = os.getpid()
        self.fd = os.open(path, os.O_RDWR)
        try:
            self.inode = os.fstat(self.fd).st_ino
            self.mm = mmap.mmap(self.fd, 2 * SLOT_BYTES, mmap.MAP_SHARED)
        except BaseException:
            os.close(self.fd)
            raise
        # Closed when the last holder lets go (or by close()); the finalizer holds no self.
        self._release = weakref.finalize(self, _unmap_and_close, self.mm, self.fd)
        self.lock = threading.RLock()
        self.depth = 0  # how deep this process's thread holding ``lock`` is in locked sections
        self.lost: tuple[int, bool] = (0, False)  # (generation, its "lost" flag), for is_lost
        self.writes = 0  # updates this process made (a nested one shows as a change of it)

    @contextlib.contextmanager
    def locked(self, exclusive: bool) -> Iterator[None]:
        """Hold the file's ``flock`` (shared or exclusive) and this process's thread lock.

        Re-entrant on one thread: only the outermost section takes and drops the ``flock``.
        """
        with self.lock:
            outermost = self.depth == 0
            if outermost:
                fcntl.flock(self.fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            self.depth += 1
            try:
                yield
            finally:
                self.depth -= 1
                if outermost:
                    fcntl.flock(self.fd, fcntl.LOCK_UN)

    def _generations(self) -> tuple[int, int]:
        """Each slot's header generation, checksum unchecked (0: no slot there)."""
        gens = []
        for k in (0, 1):
            magic, _, gen, _ = _HEAD.unpack_from(self.mm, k * SLOT_BYTES)
            gens.append(gen if magic == _MAGIC else 0)
        return gens[0], gens[1]

    def valid_payload(self, k: int) -> bytes | None:
        """Slot ``k``'s payload if its checksum holds, else None."""
        off = k * SLOT_BYTES
        magic, fmt, _, length, crc = _SLOT_HEADER.unpack_from(self.mm, off)
        if magic != _MAGIC or fmt != _FORMAT_MARSHAL or length > _CAPACITY:
            return None
        start = off + _SLOT_HEADER.size
        payload = self.mm[start : start + length]
        if zlib.crc32(payload, zlib.crc32(self.mm[off : off + _HEAD.size])) != crc:
            return None
        return payload

    def current(self) -> tuple[int, int, bytes]:
        """(slot, generation, payload) of the newest valid slot; hold ``locked`` around it."""
        gens = self._generations()
        for k in sorted((0, 1), key=lambda k: gens[k], reverse=True):
            if gens[k]:
                payload = self.valid_payload(k)
                if payload is not None:
                    return k, gens[k], payload
        raise StateCorruptError(f"{self.path} holds no valid simulated GPU state")

    def read(self) -> dict[str, Any]:
        """The state in the newest valid slot, under a shared lock."""
        with self.locked(exclusive=False):
            _, gen, payload = self.current()
        state = json.loads(payload)
        self.lost = (gen, bool(state.get("lost")))
        return state

    def is_lost(self) -> bool:
        """The "lost" flag without decoding the state when nothing changed since it was seen."""
        seen, flag = self.lost
        if seen and max(self._generations()) == seen:
            return flag
        return bool(self.read().get("lost"))

    def update(self, change: Callable[[dict[str, Any]], T], sync: bool) -> T:
        """Run ``change`` on the current state and write the result to the other slot.

        Under the exclusive lock; ``change`` runs again if an update nested inside it (a signal
        handler's setter on this thread) wrote first. ``sync`` msyncs the slot before returning.
        Returns what ``change`` returned.
        """
        with self.locked(exclusive=True):
            while True:
                writes = self.writes
                k, gen, payload = self.current()
                state = json.loads(payload)
                result = change(state)
                if self.writes == writes:  # no update nested in ``change`` wrote meanwhile
                    break
            header, payload = slot_bytes(encode_state(state), gen + 1)
            off = (1 - k) * SLOT_BYTES
            start = off + _SLOT_HEADER.size
            self.mm[start : start + len(payload)] = payload
            self.mm[off:start] = header  # the commit: from here the slot's checksum holds
            self.writes += 1
            if sync:
                self.mm.flush(off, _SLOT_HEADER.size + len(payload))
            self.lost = (gen + 1, bool(state.get("lost")))
        return result

    def close(self) -> None:
        """Unmap and close the file (errors ignored: it may be gone already)."""
        self._release()


def _unmap_and_close(mm: mmap.mmap, fd: int) -> None:
    """Release one view (errors ignored: the file may be gone already)."""
    with contextlib.suppress(Exception):
        mm.close()
    with contextlib.suppress(OSError):
        os.close(fd)


# Weak values: a view lives while a Machine (or a caller) holds it, and closes when the last does.
_stores: weakref.WeakValueDictionary[str, GpuStateFile] = weakref.WeakValueDictionary()
_stores_lock = threading.Lock()


def state_file(path: Path) -> GpuStateFile:
    """This process's store for ``path`` (one per file and process, shared by its threads)."""
    key = str(path)
    store = _stores.get(key)
    if store is not None and store.pid == os.getpid() and store.inode == os.stat(path).st_ino:
        return store
    with _stores_lock:
        store = _stores.get(key)
        if store is not None and store.pid == os.getpid() and store.inode == os.stat(path).st_ino:
            return store
        if store is not None and store.pid == os.getpid():
            store.close()  # the file was replaced (a new machine in the same directory)
        store = _stores[key] = GpuStateFile(path)
        return store


def forget_state_file(path: Path) -> None:
    """Close this process's view of ``path`` (the file was replaced or removed)."""
    with _stores_lock:
        store = _stores.pop(str(path.resolve()), None)
    if store is not None and store.pid == os.getpid():
        store.close()
