"""Which jobs each GPU admits: a batch's distinct device settings asked of each GPU's worker once.

Before any trial, every distinct ``device`` config of the batch's checked jobs (the first job
with each distinct value, ``batch.JobStream.check``) goes to each GPU's worker, which checks it
against that GPU's policy and supported values and changes nothing (``GpuWorker.check``). And
the pool admits each GPU once (``refuse_duplicates``).
"""

from __future__ import annotations

import json
from typing import Any

from orchestrator.errors import UserError
from orchestrator.launching.slot import Slot


def refusals(slots: list[Slot], jobs: list[Any]) -> list[str]:
    """Each (job, GPU) the GPU refuses, as a one-line message; empty when all are admitted.

    Args:
        slots: the GPUs to ask (those not live are skipped).
        jobs: the jobs (``batch.Job``) whose settings to check; each on the GPUs it may run on.
    """
    import ray

    unique: dict[str, dict[str, Any]] = {}
    for j in jobs:
        unique.setdefault(_key(j), j.device)
    refused: dict[str, list[tuple[Slot, str]]] = {}
    live = [s for s in slots if s.live]
    for slot, ref in [(s, s.actor.check.remote(list(unique.values()))) for s in live]:
        try:
            errs = ray.get(ref)
        except ray.exceptions.RayActorError:
            continue  # a worker being replaced; the supervisor sees to it
        for key, err in zip(unique, errs):
            if err is not None:
                refused.setdefault(key, []).append((slot, err))
    return [
        f"job #{j.num} ({j.what}) on {slot.label} ({slot.uuid}): {err}"
        for j in jobs
        for slot, err in refused.get(_key(j), [])
        if slot.runs(j)
    ]


def refuse_duplicates(infos: list[Any]) -> None:
    """Two workers that see one GPU (``worker.WorkerInfo`` s) cannot both be in the pool.

    Raises:
        UserError: naming the GPU, both hosts and both simulated machines.
    """
    seen: dict[str, Any] = {}
    for info in infos:
        other = seen.setdefault(info.uuid, info)
        if other is not info:
            raise UserError(
                f"two workers see GPU {info.uuid} (hosts {other.host} and {info.host}, sim "
                f"state {other.sim_state_dir} and {info.sim_state_dir}): on a simulated "
                "cluster give each node its own DVFS_SIM_STATE_DIR and device.seed"
            )


def _key(job: Any) -> str:
    return json.dumps(job.device, sort_keys=True, default=str)
