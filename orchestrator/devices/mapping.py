"""Which GPU a worker's Ray GPU id names, and which machine a node's worker joins.

**Which GPU.** Ray gives a ``num_gpus=1`` actor one GPU id and sets ``CUDA_VISIBLE_DEVICES`` to it.
An id that is a UUID (``GPU-...``, when the node's ``CUDA_VISIBLE_DEVICES`` listed UUIDs) names the
GPU directly. A number is a CUDA ordinal in PCI bus order (the worker runs with
``CUDA_DEVICE_ORDER=PCI_BUS_ID``), so it is resolved to the node's GPUs sorted by PCI bus id
(:func:`gpu_uuid_for`), and from then on the worker names its GPU by UUID only: NVML's own index is
never trusted to match CUDA's. On the simulated GPU the local Ray instance declares one logical GPU
per simulated GPU, and the same rule maps logical GPU ``k`` to the ``k``-th simulated GPU in PCI
order. On ``device=cpu`` it declares one logical GPU, which stands for the host CPU (the backend's
one device, index 0).

**Which machine.** On the simulated GPU a worker uses the simulated machine of its node: the
``DVFS_SIM_STATE_DIR`` of its process (passed by the driver for a local Ray instance, inherited
from ``ray start`` on a cluster node), joining the machine already there
(:func:`node_device_config`). So each node of a cluster has its own simulated GPUs, as each real
node has its own GPUs.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from orchestrator.config import PER_JOB_KEYS, DeviceConfig, to_device_config
from orchestrator.devices import SIM_STATE_ENV, CpuBackend, Device, NvmlBackend
from orchestrator.errors import DeviceLostError, DeviceNotFoundError


def pci_order_key(pci_bus_id: str) -> tuple[int, ...]:
    """Sort key of a PCI bus id ``DDDDDDDD:BB:DD.F`` (CUDA's PCI_BUS_ID order)."""
    text = pci_bus_id.strip().lower()
    parts = text.replace(".", ":").split(":")
    try:
        return tuple(int(p, 16) for p in parts)
    except ValueError:
        return (1 << 62,)


def node_devices(backend: NvmlBackend | CpuBackend) -> list[Device | int]:
    """Every GPU of the node by NVML index: its ``Device``, or the index itself for a GPU that
    has fallen off the bus (NVML refuses its handle, so nothing else of it can be read)."""
    found: list[Device | int] = []
    for index in range(backend.count()):
        try:
            found.append(backend.device(index=index))
        except DeviceLostError:
            found.append(index)
    return found


def gpu_uuid_for(devices: list[Device | int], ray_gpu_id: str | int) -> str:
    """The UUID of the GPU behind one Ray GPU id on this node.

    Args:
        devices: every ``Device`` of the node's backend, or (``node_devices``) the NVML index of
            one that is lost: it keeps its index's place in the PCI order, as NVML lists GPUs in
            PCI bus order.
        ray_gpu_id: what ``ray.get_gpu_ids()`` gave this process: a CUDA ordinal (PCI bus order)
            or a GPU UUID.

    Raises:
        DeviceNotFoundError: no such GPU on this node.
        DeviceLostError: the ordinal is that of a GPU that has fallen off the bus.
    """
    lost = [d for d in devices if isinstance(d, int)]
    found = [d for d in devices if not isinstance(d, int)]
    text = str(ray_gpu_id)
    if text.startswith(("GPU-", "MIG-")):
        if any(d.identity.uuid == text for d in found):
            return text
        raise DeviceNotFoundError(f"Ray gave this worker GPU {text}, which NVML does not list here")
    ordered: list[Device | int] = sorted(found, key=lambda d: pci_order_key(d.identity.pci_bus_id))
    for index in lost:
        ordered.insert(index, index)
    k = int(float(text))
    if not 0 <= k < len(ordered):
        raise DeviceNotFoundError(
            f"Ray gave this worker GPU {k}, but this node has {len(ordered)} GPU(s): declare no "
            f"more GPUs to Ray (ray start --num-gpus) than the node has"
        )
    chosen = ordered[k]
    if isinstance(chosen, int):
        raise DeviceLostError(f"Ray gave this worker GPU {k}, which has fallen off the bus")
    return chosen.identity.uuid


def node_device_config(device: DeviceConfig | Mapping[str, Any]) -> DeviceConfig:
    """A sweep's ``device`` config as this node sees it: the machine, not a job's settings.

    On the sim, the machine is this node's own (``DVFS_SIM_STATE_DIR`` of the process, where
    set); every per-job key (``config.PER_JOB_KEYS``: settings and routing) is cleared, so one
    session serves every job of the machine.

    Args:
        device: the sweep's ``device`` config (a plain mapping is typed first).
    """
    device = to_device_config(device)
    node: dict[str, Any] = {key: None for key in PER_JOB_KEYS}
    if device.backend == "sim" and os.environ.get(SIM_STATE_ENV):
        node["state_dir"] = os.environ[SIM_STATE_ENV]
    return dataclasses.replace(device, **node)
