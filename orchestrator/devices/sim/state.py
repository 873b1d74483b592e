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
a guard, ``dvfs restore`` after a kill) always see one consistent GPU. How a state file makes
that cheap and safe against a kill at any instant is :mod:`orchestrator.devices.sim.state_file`'s.
"""

from __future__ import annotations

import json
import os
import uuid as uuidlib
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

from filelock import FileLock

from orchestrator.devices.sim.model import SCENARIOS, idle_temperature_c
from orchestrator.devices.sim.profile import GpuProfile, ProfileError, load_profile

# StateCorruptError, StateTooLargeError and SLOT_BYTES are re-exported: a state's errors and size.
from orchestrator.devices.sim.state_file import (  # noqa: F401
    SLOT_BYTES,
    GpuStateFile,
    StateCorruptError,
    StateTooLargeError,
    create_state_file,
    state_file,
    state_file_name,
)

STATE_ENV = "DVFS_SIM_STATE_DIR"
MACHINE_FILE = "machine.json"
DRIVER_VERSION = "550.54.15-sim"
_UUID_NAMESPACE = uuidlib.UUID("6f1c7a3e-2d4b-4e59-9a51-0c8d7e2b9f10")

T = TypeVar("T")


class MachineSpecError(ValueError):
    """A state directory already holds a different machine (or none where one was expected)."""


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


def _machine_spec(
    profiles: list[str] | str,
    count: int | None,
    seed: int,
    privileged: bool,
    planted: dict[Any, Any] | None,
    scenario: str | None,
    energy_update_period_s: float | None,
) -> MachineSpec:
    """The checked spec of :func:`create_machine`'s arguments (its Raises say what is refused)."""
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
    return MachineSpec(
        names, int(seed), bool(privileged), _normalise_planted(planted), scenario, period
    )


def _write_new_machine(root: Path, spec: MachineSpec) -> None:
    """Fresh state for every GPU of ``spec``, then ``machine.json`` (last: it marks the machine)."""
    gpus = [
        SimGpu(
            index=i,
            uuid="GPU-" + str(uuidlib.uuid5(_UUID_NAMESPACE, f"{spec.seed}/{i}/{name}")),
            pci_bus_id=f"00000000:{i + 7:02X}:00.0",
            profile=name,
        )
        for i, name in enumerate(spec.profiles)
    ]
    for gpu in gpus:
        fresh = fresh_gpu_state(load_profile(gpu.profile))
        create_state_file(root / state_file_name(gpu.index), fresh)
        (root / f"gpu-{gpu.index}.json").unlink(missing_ok=True)  # from before .state files
    machine = {"spec": asdict(spec), "gpus": [asdict(g) for g in gpus]}
    _write(root / MACHINE_FILE, {**machine, "driver_version": DRIVER_VERSION}, sync=True)


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
    spec = _machine_spec(profiles, count, seed, privileged, planted, scenario,
                         energy_update_period_s)
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
            _write_new_machine(root, spec)
    return Machine(root)  # outside the lock: opening may convert older state files under it


def _describe(spec: dict[str, Any]) -> str:
    names = spec["profiles"]
    kinds = sorted(set(names))
    return f"{len(names)} x {', '.join(kinds)}, seed {spec['seed']}"


MACHINES_DIR = "machines"
"""A state directory keeps the machines of other boards in ``<state dir>/machines/<name>``."""
_UNREADABLE: dict[str, Any] = {"unreadable": True}


def _held(root: Path) -> dict[str, Any] | None:
    """The spec of the machine in ``root``; None: no machine there."""
    path = root / MACHINE_FILE
    if not path.is_file():
        return None
    try:
        return dict(json.loads(path.read_text())["spec"])
    except (OSError, ValueError, KeyError, TypeError):
        return _UNREADABLE


def machine_dir(
    state_dir: str | os.PathLike[str], name: str, *, join_existing: bool = False, **spec: Any
) -> Path:
    """Where the machine of ``spec`` (:func:`create_machine`'s arguments) lives under a state
    directory, so that one state directory serves every board a user compares.

    A state directory holds one machine itself (the first made there: a directory made before
    boards had their own keeps working as it was) and every other machine in
    ``machines/<name>`` (``name`` tells the machine apart: its profile, count and a digest of
    its spec). The directory of a machine in ``machines/`` leads back to its state directory,
    so a process that exported it (``DVFS_SIM_STATE_DIR``) finds the other boards beside it.

    Args:
        state_dir: the state directory (``device.state_dir`` or ``$DVFS_SIM_STATE_DIR``).
        name: the machine's directory name under ``machines/``.
        join_existing: the machine the state directory itself holds is taken whatever its spec
            when no machine of this spec is there (``dvfs restore``, a cluster node's workers).

    Returns:
        The machine's directory (it may not exist yet).
    """
    given = Path(state_dir)
    try:
        wanted = asdict(_machine_spec(**spec))
    except (ProfileError, MachineSpecError):
        return given  # refused by create_machine there, in its own words

    def holds(root: Path) -> bool:
        held = _held(root)
        return held is _UNREADABLE or held == wanted  # unreadable: opening it says what is wrong

    if holds(given):
        return given
    in_machines = given.parent.name == MACHINES_DIR and _held(given) is not None
    root = given.parent.parent if in_machines else given
    if root != given and holds(root):
        return root
    board = root / MACHINES_DIR / name
    if _held(board) is not None:
        return board
    if join_existing:  # the machine of the state directory itself, whatever its spec
        for joined in (root, given):
            if _held(joined) is not None:
                return joined
    return root if root == given and _held(root) is None else board


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
        self._stores = [state_file(p) for p in self._paths]

    def _gpu_store(self, index: int) -> GpuStateFile:
        store = self._stores[index]
        if store.pid != os.getpid():  # a forked child: its own descriptor and locks
            store = self._stores[index] = state_file(self._paths[index])
        return store

    def read(self, index: int) -> dict[str, Any]:
        """A consistent snapshot of one GPU's state (a fresh dict: mutating it changes nothing)."""
        return self._gpu_store(index).read()

    def changed(self) -> list[str]:
        """The GPUs not at their defaults (a clock locked, a power limit or an offset changed) or
        lost, each as ``gpu2 (sm clock locked, power limit 200 W)``: what a test or a chaos run
        requires to be empty once every process is done."""
        found = []
        for i, profile in enumerate(self.profiles):
            s = self.read(i)
            what = [k for k, bad in (
                ("sm clock locked", s["locked_sm_mhz"] is not None),
                ("memory clock locked", s["locked_mem_mhz"] is not None),
                (f"power limit {s['power_limit_w']} W",
                 abs(s["power_limit_w"] - profile.power_limit_default_w) > 0.5),
                (f"offset {s['offset_mhz']} MHz", s["offset_mhz"] != 0),
                ("lost", s["lost"]),
            ) if bad]
            if what:
                found.append(f"gpu{i} ({', '.join(what)})")
        return found

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
