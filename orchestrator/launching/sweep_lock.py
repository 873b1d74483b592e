"""One sweep per directory: the exclusive claim a running sweep holds on its sweep directory.

Two sweeps writing one directory at once would each run the jobs the other has not stored yet,
and with ``placement=any`` store the same job twice (once per GPU). So the driver of a sweep
claims its directory before it runs anything: an exclusive lock on
``<sweep_dir>/.dvfs-sweep.lock`` that the operating system drops when its holder dies, even by
``kill -9``, so a resume after a crash is never refused. Beside the lock an owner file
(``.dvfs-sweep.owner``: pid, host, Unix seconds since) names the holder, only so that the
refusal of a second sweep can say who holds the directory.

Readers (``dvfs report``) take no claim: the results store (:mod:`orchestrator.results.store`) lets
them read beside the one writer.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from orchestrator.results.store import StoreError

SWEEP_LOCK_FILENAME = ".dvfs-sweep.lock"
SWEEP_OWNER_FILENAME = ".dvfs-sweep.owner"

_claimed: dict[Path, Any] = {}  # sweep directory -> the FileLock this process holds on it


class SweepDirBusyError(StoreError):
    """Another live process is running a sweep into this directory."""


def claim_sweep_dir(store_dir: str | Path) -> None:
    """Make this process the one sweep writing into ``store_dir`` until ``release_sweep_dirs``.

    A claim this process holds already is a no-op, so the driver and an in-process job may
    both claim the directory they write.

    Args:
        store_dir: The sweep directory; created if missing.

    Raises:
        SweepDirBusyError: Another live process holds it (the message names it).
        StoreError: The directory cannot be created.
    """
    from filelock import FileLock, Timeout  # lazily: only a sweep's driver needs it

    d = Path(store_dir).resolve()
    if d in _claimed:
        return
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise StoreError(f"cannot create sweep directory {d}: {e}") from e
    lock = FileLock(d / SWEEP_LOCK_FILENAME)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        raise SweepDirBusyError(
            f"{d} is being written by another sweep ({_owner_of(d)}): wait for it to end, or "
            f"give this sweep another hydra.sweep.dir"
        ) from None
    _write_owner(d)
    _claimed[d] = lock


def release_sweep_dirs() -> None:
    """Release every sweep directory this process claimed (the end of ``dvfs sweep``)."""
    while _claimed:
        _, lock = _claimed.popitem()
        lock.release()


def _owner_of(sweep_dir: Path) -> str:
    """Who holds a sweep directory, as the owner file says, for the busy message."""
    try:
        owner = json.loads((sweep_dir / SWEEP_OWNER_FILENAME).read_text())
        return f"pid {owner['pid']} on {owner['host']}, since {time.ctime(owner['since'])}"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"


def _write_owner(sweep_dir: Path) -> None:
    """Names this process in the owner file, atomically (a reader never sees half a file)."""
    owner_path = sweep_dir / SWEEP_OWNER_FILENAME
    tmp = owner_path.with_suffix(f".tmp{os.getpid()}")
    owner = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
    try:
        tmp.write_text(json.dumps(owner))
        os.replace(tmp, owner_path)
    except OSError:  # who holds it is only for the message; a full disk must not stop the claim
        tmp.unlink(missing_ok=True)
