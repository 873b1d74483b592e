"""The simulated machine's state on disk, shared by every process as a real driver's state is.

A state directory holds ``machine.json`` (which GPUs exist: profiles, UUIDs, PCI bus ids, the
seed, whether the user is privileged, planted thresholds, the scenario, the energy counter's
update period), written once, and one ``gpu-<index>.state`` per GPU with what changes: locked
clocks, power limit, clock offset, virtual time, energy, temperature, what the last kernel call
did, the "lost" flag, ECC error counts and the events the driver has reported (XIDs, double-bit
ECC). States written before the health keys existed read as "no errors, no events"; a state
directory from before the ``.state`` files (one ``gpu-<index>.json`` per GPU) is converted the
first time a ``Machine`` opens it.

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
import uuid as uuidlib
import zlib
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

from filelock import FileLock

from orchestrator.devices.sim.model import SCENARIOS, idle_temperature_c
from orchestrator.devices.sim.profile import GpuProfile, ProfileError, load_profile

STATE_ENV = "DVFS_SIM_STATE_DIR"
MACHINE_FILE = "machine.json"
DRIVER_VERSION = "550.54.15-sim"
_UUID_NAMESPACE = uuidlib.UUID("6f1c7a3e-2d4b-4e59-9a51-0c8d7e2b9f10")

T = TypeVar("T")


class MachineSpecError(ValueError):
    """A state directory already holds a different machine (or none where one was expected)."""


class StateCorruptError(MachineSpecError):
    """A GPU's state file has no valid slot (not written by this module, or damaged on disk)."""


class StateTooLargeError(ValueError):
    """A GPU's state would not fit in one slot of its file."""


@dataclass(frozen=True)
class SimGpu:
    """One simulated GPU's fixed identity."""

    index: int
    uuid: str
    pci_bus_id: str
    profile: str


@dataclass(frozen=True)
class MachineSpec:
    """What ``create_machine`` was asked for (compared on re-creation)."""

    profiles: list[str]
    seed: int
    privileged: bool
    planted: dict[str, Any] | None
    scenario: str | None
    energy_update_period_s: float | None  # None: each GPU's profile says


def state_dir_from_env(state_dir: str | os.PathLike[str] | None = None) -> Path:
    """The state directory: the argument, else ``$DVFS_SIM_STATE_DIR``."""
    value = state_dir or os.environ.get(STATE_ENV)
    if not value:
        raise MachineSpecError(
            f"no simulated machine: set {STATE_ENV} or device.state_dir (dvfs does this for you)"
        )
    return Path(value)


def _normalise_planted(planted: Any) -> dict[str, Any] | None:
    if not planted:
        return None
    return {
        str(k): {str(c): int(v) for c, v in dict(per).items()} for k, per in dict(planted).items()
    }


def create_machine(
    state_dir: str | os.PathLike[str],
    profiles: list[str] | str,
    count: int | None = None,
    seed: int = 0,
    privileged: bool = True,
    planted: dict[Any, Any] | None = None,
    scenario: str | None = None,
    energy_update_period_s: float | None = None,
    replace: bool = False,
) -> Machine:
    """Create (or re-open, if the spec is the same) a simulated machine in ``state_dir``.

    Args:
        state_dir: where the state lives.
        profiles: one profile name for every GPU, or one per GPU.
        count: how many GPUs (with a single profile name); default 1.
        seed: seeds UUIDs and the silicon lottery.
        privileged: False makes every setter fail with NVML_ERROR_NO_PERMISSION.
        planted: stability thresholds ``{gpu index or UUID: {kernel class or "*": MHz}}``.
        scenario: a ready fault scenario (``seed_claims``).
        energy_update_period_s: the energy counter updates this often (0: exact; None: as each
            GPU's profile says, ~100 ms on Ampere and Hopper).
        replace: overwrite a machine with a different spec instead of refusing.

    Raises:
        ProfileError: an unknown profile (the message lists those that exist).
        MachineSpecError: the directory holds a different machine and ``replace`` is False.
    """
    names = [profiles] * (count or 1) if isinstance(profiles, str) else list(profiles)
    if count is not None and not isinstance(profiles, str) and count != len(names):
        raise MachineSpecError(f"count={count} but {len(names)} profiles were given")
    if not names or len(names) > 64:
        raise MachineSpecError(f"a simulated machine has 1-64 GPUs, not {len(names)}")
    for name in names:
        load_profile(name)
    if scenario is not None and scenario not in SCENARIOS:
        raise ProfileError(f"unknown scenario {scenario!r}; available: {', '.join(SCENARIOS)}")
    if energy_update_period_s is not None and not energy_update_period_s >= 0:
        raise MachineSpecError("energy_update_period_s must be 0 or more")
    period = None if energy_update_period_s is None else float(energy_update_period_s)
    spec = MachineSpec(
        names, int(seed), bool(privileged), _normalise_planted(planted), scenario, period
    )
    root = Path(state_dir)
    root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(root / "machine.lock")):
        path = root / MACHINE_FILE
        existing = json.loads(path.read_text()) if path.exists() else None
        same = existing is not None and existing["spec"] == asdict(spec)
        if existing is not None and not same:
            if not replace:
                raise MachineSpecError(
                    f"{root} already holds a different simulated machine "
                    f"({_describe(existing['spec'])}); use another device.state_dir"
                )
        if not same:  # a new machine (or a replaced one); the same spec re-opens it
            gpus = [
                SimGpu(
                    index=i,
                    uuid="GPU-" + str(uuidlib.uuid5(_UUID_NAMESPACE, f"{seed}/{i}/{name}")),
                    pci_bus_id=f"00000000:{i + 7:02X}:00.0",
                    profile=name,
                )
                for i, name in enumerate(names)
            ]
            for gpu in gpus:
                fresh = fresh_gpu_state(load_profile(gpu.profile))
                create_state_file(root / state_file_name(gpu.index), fresh)
                (root / f"gpu-{gpu.index}.json").unlink(missing_ok=True)  # from before .state files
            machine = {"spec": asdict(spec), "gpus": [asdict(g) for g in gpus]}
            _write(path, {**machine, "driver_version": DRIVER_VERSION}, sync=True)
    return Machine(root)  # outside the lock: opening may convert older state files under it


def _describe(spec: dict[str, Any]) -> str:
    names = spec["profiles"]
    kinds = sorted(set(names))
    return f"{len(names)} x {', '.join(kinds)}, seed {spec['seed']}"


def fresh_gpu_state(profile: GpuProfile) -> dict[str, Any]:
    """A GPU as the driver leaves it at load: defaults everywhere, idle, zero energy."""
    return {
        "locked_sm_mhz": None,
        "locked_mem_mhz": None,
        "power_limit_w": profile.power_limit_default_w,
        "offset_mhz": 0,
        "time_s": 0.0,
        "energy_mj": 0.0,
        "counter_mj": 0.0,
        "temperature_c": idle_temperature_c(profile),
        "power_w": profile.idle_power_w,
        "sm_clock_mhz": profile.f_min_mhz,
        "mem_clock_mhz": profile.mem_max_mhz,
        "reasons": 0x1,  # GPU_IDLE
        "calls": 0,
        "lost": False,
        "persistence_mode": 0,  # NVML_FEATURE_DISABLED: no persistence daemon at driver load
        "ecc_errors": {"corrected": 0, "uncorrected": 0},
        "events": [],  # [nvmlEventType*, data] in the order they happened (data: the XID)
    }


def _write(path: Path, data: dict[str, Any], *, sync: bool = False) -> None:
    """Replace a small JSON file atomically (``machine.json``: written once per machine)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump(data, f)
        if sync:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)


# --- a GPU's state file: two checksummed slots, mapped into memory ------------------------------
SLOT_BYTES = 1 << 20  # one slot, header included; a multiple of the page size (msync needs it)
_MAGIC = b"DVGS"
_FORMAT_MARSHAL = 1
_HEAD = struct.Struct("<4sIQQ")  # magic, format, generation, payload length
_SLOT_HEADER = struct.Struct("<4sIQQI4x")  # the above, then CRC-32 of head and payload
_CAPACITY = SLOT_BYTES - _SLOT_HEADER.size


def state_file_name(index: int) -> str:
    """The file that holds GPU ``index``'s state in a state directory."""
    return f"gpu-{index}.state"


def _encode(state: dict[str, Any]) -> bytes:
    """The state as a slot stores it: compact JSON (never pickle or marshal: a state file is
    data anyone may have written, and decoding it must not be able to build objects). JSON
    refuses what it cannot hold (``TypeError``).
    """
    return json.dumps(state, separators=(",", ":")).encode()


def _slot_bytes(payload: bytes, generation: int) -> tuple[bytes, bytes]:
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
    header, payload = _slot_bytes(_encode(state), 1)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.ftruncate(fd, 2 * SLOT_BYTES)  # sparse: only the pages written take room
        os.pwrite(fd, header + payload, 0)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    _forget_store(path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class _GpuStore:
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
        self.lock = threading.RLock()
        self.depth = 0  # how deep this process's thread holding ``lock`` is in locked sections
        self.lost: tuple[int, bool] = (0, False)  # (generation, its "lost" flag), for is_lost
        self.writes = 0  # updates this process made (a nested one shows as a change of it)

    @contextlib.contextmanager
    def locked(self, exclusive: bool) -> Iterator[None]:
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

    def _valid(self, k: int) -> bytes | None:
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
                payload = self._valid(k)
                if payload is not None:
                    return k, gens[k], payload
        raise StateCorruptError(f"{self.path} holds no valid simulated GPU state")

    def read(self) -> dict[str, Any]:
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
        with self.locked(exclusive=True):
            while True:
                writes = self.writes
                k, gen, payload = self.current()
                state = json.loads(payload)
                result = change(state)
                if self.writes == writes:  # no update nested in ``change`` wrote meanwhile
                    break
            header, payload = _slot_bytes(_encode(state), gen + 1)
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
        with contextlib.suppress(Exception):
            self.mm.close()
        with contextlib.suppress(OSError):
            os.close(self.fd)


_stores: dict[str, _GpuStore] = {}
_stores_lock = threading.Lock()


def _store(path: Path) -> _GpuStore:
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
        store = _stores[key] = _GpuStore(path)
        return store


def _forget_store(path: Path) -> None:
    with _stores_lock:
        store = _stores.pop(str(path.resolve()), None)
    if store is not None and store.pid == os.getpid():
        store.close()


def _migrate_json_states(root: Path, gpus: list[SimGpu]) -> None:
    """Convert a state directory's ``gpu-<i>.json`` files (from before ``.state``) in place."""
    missing = [g for g in gpus if not (root / state_file_name(g.index)).exists()]
    if not missing:
        return
    with FileLock(str(root / "machine.lock")):
        for g in missing:
            path, old = root / state_file_name(g.index), root / f"gpu-{g.index}.json"
            if path.exists():
                continue
            if not old.exists():
                raise MachineSpecError(f"{root}: GPU {g.index} has no state ({path.name})")
            create_state_file(path, json.loads(old.read_text()))
            old.unlink()


class Machine:
    """An existing simulated machine: its GPUs and their state files."""

    def __init__(self, state_dir: str | os.PathLike[str]) -> None:
        self.state_dir = Path(state_dir)
        path = self.state_dir / MACHINE_FILE
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise MachineSpecError(
                f"no simulated machine in {self.state_dir} (no {MACHINE_FILE})"
            ) from None
        self.spec = MachineSpec(**data["spec"])
        self.gpus = [SimGpu(**g) for g in data["gpus"]]
        self.driver_version = data.get("driver_version", DRIVER_VERSION)
        self.profiles = [load_profile(g.profile) for g in self.gpus]
        _migrate_json_states(self.state_dir, self.gpus)
        root = self.state_dir.resolve()
        self._paths = [root / state_file_name(g.index) for g in self.gpus]
        self._stores = [_store(p) for p in self._paths]

    def _gpu_store(self, index: int) -> _GpuStore:
        store = self._stores[index]
        if store.pid != os.getpid():  # a forked child: its own descriptor and locks
            store = self._stores[index] = _store(self._paths[index])
        return store

    def read(self, index: int) -> dict[str, Any]:
        """A consistent snapshot of one GPU's state (a fresh dict: mutating it changes nothing)."""
        return self._gpu_store(index).read()

    def is_lost(self, index: int) -> bool:
        """Whether GPU ``index`` has fallen off the bus (cheap: every NVML call asks)."""
        return self._gpu_store(index).is_lost()

    def update(self, index: int, change: Callable[[dict[str, Any]], T], *, sync: bool = False) -> T:
        """Locked read-modify-write of one GPU's state; ``change`` mutates the dict in place.

        ``change`` may run more than once (only when an update nested in it, on the same thread,
        wrote first): it should change nothing but the dict it is given. If it raises, nothing
        is written.

        Raises:
            StateTooLargeError: the changed state does not fit in a slot (nothing is written).
        """
        return self._gpu_store(index).update(change, sync)
