"""What one process keeps across the trials it runs: the backend, each GPU's guard, the kernels.

Opening NVML (or the simulated machine), taking a GPU's lease and compiling a kernel cost far more
than a trial's bookkeeping, so a process that runs many trials keeps them: ``app.task`` (Hydra's
basic launcher runs every job in one process) holds one ``GpuSession`` for the whole sweep, and
each ``ray_gpus`` worker holds one over the backend it opened for its GPU. A session opens a GPU's
``TrialContext`` once (guard entered, lease taken) and reuses it; ``close`` restores and releases
every GPU it holds (the guard's exit handlers do the same if the process dies first).

A job whose device config names another machine (another simulated machine, another backend)
closes the session's GPUs and opens that machine instead: the machine key is ``jobs.machine_key``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from orchestrator.config import DeviceConfig, to_device_config
from orchestrator.errors import DvfsError, close_on_exit
from orchestrator.jobs.job import machine_key

if TYPE_CHECKING:
    from orchestrator.devices import CpuBackend, NvmlBackend
    from orchestrator.measuring.trial import TrialContext


class GpuSession:
    """A process's backend and the ``TrialContext`` of each GPU it runs trials on.

    Args:
        backend: a backend already open (a Ray worker's, joined to its node's machine); None:
            open the first job's machine on first use.
    """

    def __init__(self, backend: NvmlBackend | CpuBackend | None = None) -> None:
        self._backend = backend
        self._owns_backend = backend is None
        self._machine: str | None = None
        self._contexts: dict[str, TrialContext] = {}  # device uuid -> its context

    def context(
        self,
        device_cfg: DeviceConfig | Mapping[str, Any],
        *,
        sweep_id: str = "",
        device_uuid: str | None = None,
    ) -> TrialContext:
        """The ``TrialContext`` of one GPU (opened once, then reused).

        Args:
            device_cfg: the job's ``device`` config (a plain mapping is typed first:
                ``config.to_device_config``).
            sweep_id: stamped on the context's rows.
            device_uuid: which GPU; default: the first that ``device.gpus`` selects.
        """
        from orchestrator.devices import open_backend, select_devices

        device_cfg = to_device_config(device_cfg)
        key = machine_key(asdict(device_cfg))
        if self._owns_backend and self._machine not in (None, key):
            self.close()  # another machine: restore this one's GPUs first
        if self._backend is None:
            self._backend = open_backend(device_cfg)
        self._machine = key
        if device_uuid is None:
            device_uuid = select_devices(self._backend, device_cfg.gpus)[0].identity.uuid
        ctx = self._contexts.get(device_uuid)
        if ctx is None:
            ctx = self._contexts[device_uuid] = self._open(device_cfg, device_uuid)
        ctx.sweep_id = sweep_id or ctx.sweep_id
        return ctx

    def _open(self, device_cfg: DeviceConfig, device_uuid: str) -> TrialContext:
        """Enter the guard of one GPU (takes its lease) and give it a kernel cache."""
        from kernels import KernelCache
        from orchestrator.devices import journal_dir
        from orchestrator.jobs.policy import load_policy
        from orchestrator.measuring.guard import SettingsGuard
        from orchestrator.measuring.journal import Journal
        from orchestrator.measuring.trial import TrialContext

        assert self._backend is not None  # opened by context
        device = self._backend.device(uuid=device_uuid)
        policy = load_policy(device_cfg.policy_file, device.identity.name)
        guard = SettingsGuard(
            device, Journal(journal_dir(device_cfg)), policy,
            observe_only=bool(device_cfg.observe_only),
        )
        guard.__enter__()
        return TrialContext(device=device, guard=guard, kernels=KernelCache())

    def close(self) -> None:
        """Restore and release every GPU this session holds; close a backend it opened."""
        failed: list[DvfsError] = []
        try:
            for ctx in self._contexts.values():
                try:  # every GPU is put back, even after one that would not be
                    ctx.guard.close()
                except DvfsError as e:
                    failed.append(e)
        finally:
            self._contexts.clear()
            if self._owns_backend and self._backend is not None:
                self._backend.close()
                self._backend = None
            self._machine = None
        if failed:
            for other in failed[1:]:
                failed[0].add_note(f"and: {other}")
            raise failed[0]

    def __enter__(self) -> GpuSession:
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        close_on_exit(self.close, exc, "restoring this session's GPUs")
