"""How the ``ray_gpus`` launcher reaches the GPUs: the ``hydra.launcher`` keys, checked once.

``LaunchSettings`` is made once per batch (``launch.launch_batch``) and is the one value every
part of the launcher reads: the pool (Ray's address, each worker's CPUs and resources, how long a
worker may take to start), the scheduling (``placement``, ``queue_ahead``), resume (``retry``)
and the supervisor (limits and restarts). A pool reused by a later batch keeps its workers and
takes the new batch's settings (``pool.get_pool``): only ``pool_key``'s fields make workers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from orchestrator.bounds import Bound, bounded, check_fields
from orchestrator.errors import UserError

PLACEMENTS = ("any", "every")
RETRY_POLICIES = ("never", "not_measured", "failed")
"""Which stored trials a re-run runs again (``hydra.launcher.retry``): ``never``; those whose
latest attempt measured nothing (``not_measured``, the default: a GPU that was unhealthy, a
worker killed from outside); or those whose latest attempt is not all ok (``failed``)."""

RESOURCE_BOUND = Bound(0, 1e6, "a worker's share of a custom Ray resource")


@dataclass
class LaunchSettings:
    """How the ``ray_gpus`` launcher reaches the GPUs (the ``hydra.launcher`` keys)."""

    address: str | None = None  # None: a local Ray instance; "auto", "host:port", "ray://...": join
    placement: str | tuple[str, ...] = "any"  # "any", "every", or GPU UUIDs (any of those)
    timeout_s: float | None = bounded(
        None, 0, 86_400, "a day: a trial that takes longer has hung", above=True, unit=" s"
    )  # per-trial limit; None: each job's measure.timeout_s
    max_restarts: int = bounded(
        5, -1, 1000, "-1 never retires a GPU; a thousand deaths in a row is a GPU to retire"
    )  # worker deaths in a row before a GPU is retired; -1: never retire
    start_timeout_s: float = bounded(
        120.0, 0, 3600, "an hour: a worker that has not started by then will not", above=True,
        unit=" s")  # a worker that does not start within this is given up
    lease_wait_s: float | None = bounded(
        None, 0, 7 * 86_400, "a week: null waits as long as the other sweep takes", above=True,
        unit=" s")  # wait this long for a GPU another sweep holds; None: forever
    retry: str = "not_measured"  # which stored trials a re-run runs again (RETRY_POLICIES)
    queue_ahead: bool = True  # send a busy GPU its next trial, to start as the last one returns
    num_cpus: float = bounded(
        0.0, 0, 1024, "no node has more than 1,024 CPUs for one worker"
    )  # CPUs each worker reserves (0: or four never start on two cores)
    resources: dict[str, float] = field(default_factory=dict)  # custom Ray resources per worker
    log_to_driver: bool = False  # forward workers' stdout/stderr to this terminal
    progress: bool = True  # the live progress line on stderr
    dashboard: bool = False  # a local Ray's web dashboard, on 127.0.0.1:8265 (off unless asked)

    @classmethod
    def from_mapping(cls, m: Any) -> LaunchSettings:
        """Build from ``hydra.launcher`` (a DictConfig or dict); refuses bad values.

        Raises:
            UserError: an unknown placement, a negative limit.
        """
        from omegaconf import DictConfig, ListConfig, OmegaConf

        d = OmegaConf.to_container(m, resolve=True) if isinstance(m, DictConfig) else dict(m)
        d = {
            k: OmegaConf.to_container(v, resolve=True)
            if isinstance(v, (DictConfig, ListConfig))
            else v
            for k, v in d.items()
        }
        d = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        placement = d.get("placement", "any")
        if isinstance(placement, (list, tuple)):
            uuids = tuple(str(u) for u in placement)
            if not uuids or not all(u.startswith(("GPU-", "MIG-")) for u in uuids):
                raise UserError(
                    f"hydra.launcher.placement={list(placement)} must be any, every or a list of "
                    f"GPU "
                    f"UUIDs (GPU-...; `dvfs devices` lists them)"
                )
            d["placement"] = uuids
        elif placement not in PLACEMENTS:
            raise UserError(
                f"hydra.launcher.placement={placement!r} is not one of: any, every, [GPU UUIDs]"
            )
        if d.get("address") in ("", "local", "none", "null"):
            d["address"] = None
        check_fields("hydra.launcher.", d, cls)
        if d.get("retry", "not_measured") not in RETRY_POLICIES:
            raise UserError(
                f"hydra.launcher.retry={d['retry']!r} is not one of: {', '.join(RETRY_POLICIES)}"
            )
        d["resources"] = {str(k): float(v) for k, v in (d.get("resources") or {}).items()}
        for name, amount in d["resources"].items():
            RESOURCE_BOUND.check(f"hydra.launcher.resources.{name}", amount)
        return cls(**d)

    def pool_key(self) -> str:
        """What makes a pool of workers reusable by another batch (not limits or display)."""
        return repr((self.address, self.placement, self.num_cpus, sorted(self.resources.items())))
