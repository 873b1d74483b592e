"""The simulated machine's state on disk, shared by every process as a real driver's state is.

A state directory holds ``machine.json`` (which GPUs exist: profiles, UUIDs, PCI bus ids, the
seed, whether the user is privileged, planted thresholds, the scenario, the energy counter's
update period), written once, and one ``gpu-<index>.json`` per GPU with what changes: locked
clocks, power limit, clock offset, virtual time, energy, temperature, what the last kernel call
did, the "lost" flag, ECC error counts and the events the driver has reported (XIDs, double-bit
ECC). State files written before the health keys existed read as "no errors, no events".

Every change is a locked read-modify-write (one ``filelock`` per GPU) followed by an atomic
replace of the file, so concurrent processes (Ray workers, a guard, ``dvfs restore`` after a kill)
always see one consistent GPU. Setters fsync; the per-kernel-call path does not (a lost update on
power failure of the host does not matter for a simulation, and fsync would cost milliseconds
per call).
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
    return {str(k): {str(c): int(v) for c, v in dict(per).items()} for k, per in dict(planted).items()}


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
    spec = MachineSpec(names, int(seed), bool(privileged), _normalise_planted(planted), scenario, period)
    root = Path(state_dir)
    root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(root / "machine.lock")):
        path = root / MACHINE_FILE
        if path.exists():
            existing = json.loads(path.read_text())
            if existing["spec"] == asdict(spec):
                return Machine(root)
            if not replace:
                raise MachineSpecError(
                    f"{root} already holds a different simulated machine "
                    f"({_describe(existing['spec'])}); use another device.state_dir"
                )
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
            _write(root / f"gpu-{gpu.index}.json", fresh_gpu_state(load_profile(gpu.profile)), sync=True)
        _write(path, {"spec": asdict(spec), "gpus": [asdict(g) for g in gpus], "driver_version": DRIVER_VERSION}, sync=True)
    return Machine(root)


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
        "ecc_errors": {"corrected": 0, "uncorrected": 0},
        "events": [],  # [nvmlEventType*, data] in the order they happened (data: the XID)
    }


def _write(path: Path, data: dict[str, Any], *, sync: bool = False) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump(data, f)
        if sync:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)


class Machine:
    """An existing simulated machine: its GPUs and their locked state files."""

    def __init__(self, state_dir: str | os.PathLike[str]) -> None:
        self.state_dir = Path(state_dir)
        path = self.state_dir / MACHINE_FILE
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise MachineSpecError(f"no simulated machine in {self.state_dir} (no {MACHINE_FILE})") from None
        self.spec = MachineSpec(**data["spec"])
        self.gpus = [SimGpu(**g) for g in data["gpus"]]
        self.driver_version = data.get("driver_version", DRIVER_VERSION)
        self.profiles = [load_profile(g.profile) for g in self.gpus]
        self._locks = [FileLock(str(self.state_dir / f"gpu-{g.index}.lock")) for g in self.gpus]

    def _path(self, index: int) -> Path:
        return self.state_dir / f"gpu-{index}.json"

    def read(self, index: int) -> dict[str, Any]:
        """A consistent snapshot of one GPU's state (files are replaced atomically)."""
        return json.loads(self._path(index).read_text())

    def update(self, index: int, change: Callable[[dict[str, Any]], T], *, sync: bool = False) -> T:
        """Locked read-modify-write of one GPU's state; ``change`` mutates the dict in place."""
        with self._locks[index]:
            state = self.read(index)
            result = change(state)
            _write(self._path(index), state, sync=sync)
        return result
