"""GPU backends behind one ``Device`` interface.

``open_backend(device_cfg)`` returns an initialised backend: the NVML adapter over nvidia-ml-py's
``pynvml`` (``backend=nvml``) or over the simulated NVML (``backend=sim``), or the host CPU
(``backend=cpu``: ``orchestrator.devices.cpu``, energy from RAPL, nothing settable), or the
host's TPU chips (``backend=tpu``: ``orchestrator.devices.tpu``, through JAX). All hand out
``Device`` objects; nothing above this package imports ``pynvml``.

Where the simulated machine's state and the guard's journal live is decided here, once:

- sim state: ``device.state_dir``, else ``$DVFS_SIM_STATE_DIR``, else a directory under
  ``~/.cache/dvfs/sim`` named after the machine's spec (profile, count, seed, scenario), so that
  two different simulated machines never share state. A state directory the user names holds one
  machine itself and every other one (another board, count or seed) in ``machines/<name>``
  (``sim.state.machine_dir``), so a sweep over boards needs no directory per board. The chosen
  directory is exported as ``DVFS_SIM_STATE_DIR`` so that child processes (Ray workers,
  ``dvfs restore``) see the same GPUs; the boards beside it are still found from there.
- journal: ``device.journal_dir``, else ``$DVFS_JOURNAL_DIR``, else ``<sim state>/journal`` on
  the sim, ``/var/lib/dvfs/journal`` as root or ``~/.local/state/dvfs/journal`` on real GPUs,
  and the same with ``journal-cpu`` for the CPU (which the guard only leases, since nothing on it
  is ever set, so it works without root).
- the frameworks of a ``device=cpu`` process see no GPU: ``open_backend`` sets
  ``CUDA_VISIBLE_DEVICES=""`` and ``JAX_PLATFORMS=cpu`` before either framework is imported (after
  Ray has set a worker's ``CUDA_VISIBLE_DEVICES`` for the logical GPU that stands for the CPU), so
  the kernel a CPU trial measures runs on the host even on a machine with GPUs.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchestrator.config import DeviceConfig, to_device_config
from orchestrator.devices.base import (
    ClockEventReason,
    Device,
    DeviceCapabilities,
    DeviceIdentity,
    DeviceSettings,
    Fault,
    KernelWork,
)
from orchestrator.devices.cpu import CpuBackend, CpuDevice
from orchestrator.devices.nvml import NvmlBackend, NvmlDevice
from orchestrator.errors import DeviceNotFoundError, UserError

__all__ = [
    "ClockEventReason",
    "CpuBackend",
    "CpuDevice",
    "Device",
    "DeviceCapabilities",
    "DeviceIdentity",
    "DeviceSettings",
    "Fault",
    "KernelWork",
    "NvmlBackend",
    "NvmlDevice",
    "backend_overrides",
    "journal_dir",
    "open_backend",
    "select_devices",
    "sim_state_dir",
]

SIM_STATE_ENV = "DVFS_SIM_STATE_DIR"
JOURNAL_ENV = "DVFS_JOURNAL_DIR"


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _profile_name(name: Any) -> str:
    from orchestrator.devices.sim.profile import resolve_profile_name

    return resolve_profile_name(str(name))


def _sim_spec(device: DeviceConfig) -> dict[str, Any]:
    """The simulated machine a ``device`` config names (``sim.state.create_machine``'s keys)."""
    return {
        "profiles": _profile_name(device.profile),
        "count": int(device.count),
        "seed": int(device.seed),
        "privileged": bool(device.privileged),
        "planted": device.planted_thresholds,
        "scenario": device.scenario,
        "energy_update_period_s": _optional_float(device.energy_update_period_s),
    }


def _machine_name(spec: dict[str, Any]) -> str:
    """The directory name of one simulated machine: ``h100_sxm5_80gbx1-<sha>``."""
    identity = json.dumps(spec, sort_keys=True)
    profile = Path(spec["profiles"])
    if profile.is_absolute() and profile.is_file():  # a user's file: its content is the machine too
        identity += hashlib.sha1(profile.read_bytes()).hexdigest()
    digest = hashlib.sha1(identity.encode()).hexdigest()[:10]
    return f"{profile.stem}x{spec['count']}-{digest}"


def sim_state_dir(
    device: DeviceConfig | Mapping[str, Any], *, join_existing: bool = False
) -> Path:
    """The simulated machine's state directory for this device config (see module docstring).

    Args:
        device: the ``device`` config (a plain mapping is typed first: ``to_device_config``).
        join_existing: as :func:`open_backend`'s: where no machine of this config's spec is
            found, the machine already in the state directory is the one meant.
    """
    return _machine_state_dir(to_device_config(device), join_existing)


def _machine_state_dir(device: DeviceConfig, join_existing: bool) -> Path:
    """:func:`sim_state_dir` of a config already typed (``journal_dir`` types it once)."""
    explicit = device.state_dir or os.environ.get(SIM_STATE_ENV)
    spec = _sim_spec(device)
    name = _machine_name(spec)
    if explicit:
        from orchestrator.devices.sim.state import machine_dir

        root = Path(explicit).expanduser().resolve()
        return machine_dir(root, name, join_existing=join_existing, **spec)
    return Path.home() / ".cache" / "dvfs" / "sim" / name


def journal_dir(device: DeviceConfig | Mapping[str, Any]) -> Path:
    """Where the guard's journal for this backend lives (see module docstring).

    On the sim, the journal of the machine a process opening ``device`` uses: the machine of its
    spec where there is one, else the state directory's own (what ``dvfs restore``, a worker
    and the guard of a trial all mean; a journal of a machine not made yet is empty anyway).

    Args:
        device: the ``device`` config (a plain mapping is typed first: ``to_device_config``).
    """
    device = to_device_config(device)
    explicit = device.journal_dir or os.environ.get(JOURNAL_ENV)
    if explicit:
        return Path(explicit).expanduser().resolve()
    backend = device.backend
    if backend == "sim":
        return _machine_state_dir(device, join_existing=True) / "journal"
    name = f"journal-{backend}" if backend in ("cpu", "tpu") else "journal"
    if os.geteuid() == 0:
        return Path("/var/lib/dvfs") / name
    return Path.home() / ".local" / "state" / "dvfs" / name


CPU_ONLY_ENV = {"CUDA_VISIBLE_DEVICES": "", "JAX_PLATFORMS": "cpu"}
"""What a ``device=cpu`` process sets so that JAX and TensorFlow run its kernels on the host."""


def open_backend(
    device: DeviceConfig | Mapping[str, Any], *, join_existing: bool = False
) -> NvmlBackend | CpuBackend:
    """Initialise NVML (real or simulated), or the host CPU, for a ``device`` config.

    Args:
        device: the ``device`` config (a plain mapping is typed first: ``to_device_config``).
        join_existing: on the sim, use the machine of this spec in the state directory, else the
            one already there whatever its spec (``dvfs restore``, ``dvfs devices`` and a
            worker join; a sweep insists on its own spec, in ``machines/`` beside another).

    Raises:
        UserError: an unknown backend or simulated profile, or no NVIDIA driver for ``nvml``.
    """
    device = to_device_config(device)
    backend = device.backend
    if backend == "nvml":
        try:
            import pynvml
        except ImportError as e:  # pragma: no cover - nvidia-ml-py is a dependency
            raise UserError("nvidia-ml-py is not installed: pip install nvidia-ml-py") from e
        return NvmlBackend(pynvml, "nvml")
    if backend == "sim":
        from orchestrator.devices.sim import nvml as sim_nvml
        from orchestrator.devices.sim.device import SimBackend
        from orchestrator.devices.sim.profile import ProfileError
        from orchestrator.devices.sim.state import MachineSpecError, create_machine
        from orchestrator.devices.sim.state_file import StateCorruptError

        state = sim_state_dir(device, join_existing=join_existing)
        if not (join_existing and (state / "machine.json").exists()):
            try:
                create_machine(state, **_sim_spec(device))
            except ProfileError as e:
                raise UserError(f"device.profile: {e}") from e
            except (MachineSpecError, StateCorruptError) as e:
                raise UserError(str(e)) from e
        os.environ[SIM_STATE_ENV] = str(state)
        return SimBackend(sim_nvml, "sim")
    if backend == "cpu":
        os.environ.update(CPU_ONLY_ENV)
        return CpuBackend(CpuDevice(device.powercap_root))
    if backend == "tpu":
        from orchestrator.devices.tpu import TpuBackend

        return TpuBackend()
    raise UserError(f"device.backend={backend!r} is not one of: sim, nvml, cpu, tpu")


def nvml_available() -> bool:
    """True if the real NVML initialises and sees at least one GPU."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - any failure means "no usable NVML here"
        return False
    try:
        return pynvml.nvmlDeviceGetCount() > 0
    except Exception:  # noqa: BLE001
        return False
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


def backend_overrides(overrides: list[str]) -> tuple[list[str], str | None]:
    """A command's overrides with ``device=nvml`` first where none names a backend and NVML
    finds a GPU here; else as they are, with a note that the simulated GPU is what is shown."""
    chose_backend = any(
        o.split("=", 1)[0].lstrip("+~") in ("device", "device.backend") for o in overrides
    )
    if chose_backend:
        return list(overrides), None
    if nvml_available():
        return ["device=nvml", *overrides], None
    return list(overrides), (
        "note: NVML finds no NVIDIA GPU here; showing the simulated GPU (device=sim)")


def select_devices(backend: NvmlBackend | CpuBackend, gpus: list[Any] | None) -> list[Device]:
    """The devices named by ``device.gpus`` (indices or UUIDs), or all of them.

    Raises:
        DeviceNotFoundError: a named GPU does not exist (the message lists those that do).
    """
    if gpus is None:
        return list(backend.devices())
    chosen: list[Device] = []
    for g in gpus:
        if isinstance(g, str) and not g.isdigit():
            by_uuid = g.startswith(("GPU-", "MIG-", "CPU-", "TPU-"))
            chosen.append(backend.device(uuid=g) if by_uuid else backend.device(pci_bus_id=g))
        else:
            chosen.append(backend.device(index=int(g)))
    if len({d.identity.uuid for d in chosen}) != len(chosen):
        raise DeviceNotFoundError(f"device.gpus={list(gpus)} names a GPU twice")
    return chosen
