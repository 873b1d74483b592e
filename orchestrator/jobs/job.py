"""One job, typed: what a trial is asked to measure, its identity, and the rules that exist once.

A Hydra job is one trial. ``JobSpec`` is that job after validation: its typed config
(``config.DvfsConfig``, so code reads ``job.config.workload.name``), where its rows go, and the
sweep they belong to. Everything derived from it lives here, once, for both ways a trial runs
(``app.task`` under Hydra's basic launcher, and the ``ray_gpus`` launcher's workers):

- the trial key: a hash of what is measured (``job_identity``) and the GPU's UUID; resume, the
  store and the stability search all find a trial by it;
- the settings request the guard checks and applies, and the one-line label of a job;
- the machine key: which jobs may share one simulated machine or one pool of workers (the device
  config less the keys a job may set or route by);
- the sweep id and the ``sweep`` meta item (resume, which stored trials run again, is
  ``launching/resume.py``'s).

A user's mistake (a typo'd choice, an unsupported size, a bad inject spec) is a ``UserError``
raised by ``JobSpec.from_config`` before anything touches a device. A job is checked once, when
it is made (``JobSpec.of``): what the checks found (the workload's ``KernelSpec``, the fault to
inject) travels with it, so the worker and the trial read them and check nothing again.
"""

from __future__ import annotations

import functools
import hashlib
import json
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.config import (
    COMMAND,
    PER_JOB_KEYS,  # the device keys the jobs of one machine may differ in
    DvfsConfig,
    FrameworkConfig,
    WorkloadConfig,
)
from orchestrator.jobs import checks
from orchestrator.jobs.request import SettingsRequest, settings_request

if TYPE_CHECKING:
    from kernels.spec import KernelSpec
    from orchestrator.results.store import ResultStore

# Config keys that do not change what a trial measures (kept out of the trial key).
_NON_IDENTITY_KEYS = ("store_dir", "quiet", "objective")
# default_size only chooses workload.size, which is in the identity itself.
_NON_IDENTITY_DEVICE_KEYS = ("state_dir", "journal_dir", "gpus", "policy_file", "default_size")


def job_identity(resolved: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a resolved job config that defines what is measured."""
    ident = {k: v for k, v in resolved.items() if k not in _NON_IDENTITY_KEYS}
    device = dict(ident.get("device", {}))
    for k in _NON_IDENTITY_DEVICE_KEYS:
        device.pop(k, None)
    ident["device"] = device
    return ident


def trial_key(resolved: Mapping[str, Any], device_uuid: str) -> str:
    """A stable key: hash of the resolved job config (what is measured) and the GPU's UUID."""
    blob = json.dumps(
        {"job": job_identity(resolved), "uuid": device_uuid}, sort_keys=True, default=str
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def config_hash(resolved: Mapping[str, Any]) -> str:
    """Hash of the job config alone (the same point on every GPU shares it)."""
    blob = json.dumps(job_identity(resolved), sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def command_label(workload: WorkloadConfig) -> str:
    """The rows' name of a program (``workload=command``): ``workload.label``, else its script's
    stem (``python examples/train_mlp.py`` -> ``train_mlp``), the module of ``python -m``, or
    the program's own name."""
    if workload.label:
        return str(workload.label)
    argv = [str(a) for a in workload.argv or ()]
    for i, arg in enumerate(argv):
        if arg == "-m" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.endswith(".py"):
            return Path(arg).stem
    return Path(argv[0]).name if argv else COMMAND


def machine_key(device: Mapping[str, Any]) -> str:
    """Which machine a job's device config opens: the config less the per-job keys."""
    return json.dumps(
        {k: v for k, v in dict(device).items() if k not in PER_JOB_KEYS},
        sort_keys=True,
        default=str,
    )


def sweep_id_for(store_dir: str | Path) -> str:
    """The sweep id stamped on rows: the last two parts of the store directory."""
    return "/".join(Path(store_dir).resolve().parts[-2:])


@functools.lru_cache(maxsize=256)
def _sweep_id_of(store_dir: str) -> str:
    return sweep_id_for(store_dir)


def describe_request(
    workload: WorkloadConfig, framework: FrameworkConfig, request: SettingsRequest,
    name: str | None = None,
) -> str:
    """A job's one-line label, e.g. ``gemm/jax float32 [sm=1065 MHz]`` (``name``: the
    workload's own, where ``workload.name`` is ``custom``)."""
    return f"{name or workload.name}/{framework.name} {workload.dtype} [{request.describe()}]"


# --- the job ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class JobSpec:
    """One validated job: its typed config, where its rows go, and the sweep they belong to.

    Attributes:
        config: the job's config (``hydra`` node excluded), typed.
        store_dir: the store its rows go to (None: not decided, e.g. a test's bare trial).
        sweep_id: stamped on every row.
        workload_spec: the workload's ``kernels.Workload``, found and checked against the
            config when the job was made (None for ``workload=command``, a program).
        inject: ``device.inject`` as checked (``checks.validate_inject``); None: no fault.
    """

    config: DvfsConfig
    store_dir: Path | None = None
    sweep_id: str = ""
    workload_spec: KernelSpec | None = field(default=None, compare=False, repr=False)
    inject: dict[str, Any] | None = field(default=None, compare=False, repr=False)

    @classmethod
    def from_config(
        cls, cfg: DvfsConfig, default_store_dir: str | Path | None = None
    ) -> JobSpec:
        """Validate a job's composed config (a DictConfig) and type it.

        Args:
            cfg: the job's task config.
            default_store_dir: where rows go unless the job sets ``store_dir``.

        Raises:
            UserError: the first mistake found, on one line; nothing has touched a device.
        """
        from omegaconf import OmegaConf

        from orchestrator.config import validate_static

        validate_static(cfg)  # on the DictConfig: interpolations and unknown keys too
        if OmegaConf.get_type(cfg) is not DvfsConfig:  # a plain dict config: type it first
            cfg = OmegaConf.merge(OmegaConf.structured(DvfsConfig), cfg)
        config = OmegaConf.to_object(cfg)
        assert isinstance(config, DvfsConfig)
        return cls._checked(config, default_store_dir)

    @classmethod
    def of(cls, config: DvfsConfig, default_store_dir: str | Path | None = None) -> JobSpec:
        """Validate a typed config (values, and the checks that span keys) and make the job.

        ``SweepComposer`` makes most jobs of a sweep this way, from a validated config with a few
        values replaced: the checks here are what a combination of valid values can still fail.

        Raises:
            UserError: the first mistake found, on one line; nothing has touched a device.
        """
        from orchestrator.config import validate_static

        validate_static(config)
        return cls._checked(config, default_store_dir)

    @classmethod
    def _checked(cls, config: DvfsConfig, default_store_dir: str | Path | None) -> JobSpec:
        """The checks that span keys and need the registry, each once; the job that carries
        what they found. ``config`` has passed ``validate_static``."""
        workload_spec = checks.validate_workload(config)
        fault = checks.validate_inject(config.device.inject, config.device.backend)
        if config.workload.name == COMMAND:
            config = checks.command_job(config)
        settings_request(config.device)  # a malformed setting is refused here, not on a GPU
        where = config.store_dir or default_store_dir
        # A relative store is where the command was started (Hydra does not chdir: see
        # conf/config.yaml), made absolute now: a worker or a report elsewhere finds the same.
        store_dir = None if where is None else Path(where).absolute()
        return cls(config, store_dir, _sweep_id_of(str(store_dir)) if store_dir else "",
                   workload_spec, fault)

    @cached_property
    def resolved(self) -> dict[str, Any]:
        """The config as plain values: stored beside every row, hashed into the trial key."""
        return asdict(self.config)

    @cached_property
    def workload_name(self) -> str:
        """The workload's own name: ``workload.name``, or for ``workload=custom`` the name its
        target's workload gives itself (what rows and tolerances go by)."""
        workload = self.config.workload
        if workload.name == COMMAND:
            return command_label(workload)
        if not workload.target or self.workload_spec is None:
            return workload.name
        return self.workload_spec.name

    @cached_property
    def request(self) -> SettingsRequest:
        """The settings the trial asks for."""
        return settings_request(self.config.device)

    @property
    def label(self) -> str:
        """E.g. ``gemm/jax float32 [sm=1065 MHz]``."""
        return describe_request(self.config.workload, self.config.framework, self.request,
                                self.workload_name)

    @property
    def repeats(self) -> int:
        """Windows per trial (``measure.repeats``): one row each."""
        return int(self.config.measure.repeats)

    @property
    def device(self) -> dict[str, Any]:
        """The resolved ``device`` section."""
        return self.resolved["device"]

    @property
    def quiet(self) -> bool:
        """No per-trial summary on stdout."""
        return bool(self.config.quiet)

    @property
    def objective_name(self) -> str:
        """What the job returns to a sweeper (``objective``)."""
        return str(self.config.objective)

    @property
    def config_hash(self) -> str:
        """Hash of what is measured, the same on every GPU."""
        return config_hash(self.resolved)

    @cached_property
    def _identity_json(self) -> str:
        return json.dumps(job_identity(self.resolved), sort_keys=True, default=str)

    def trial_key(self, device_uuid: str) -> str:
        """The key of this job's trial on one GPU: :func:`trial_key`'s, from the identity
        serialised once per job (a sweep on 64 GPUs asks for 64 keys per job)."""
        blob = f'{{"job": {self._identity_json}, "uuid": {json.dumps(device_uuid)}}}'
        return hashlib.sha256(blob.encode()).hexdigest()[:24]


# --- the store's view of jobs -----------------------------------------------------------------
def record_sweep(store: ResultStore, job: JobSpec) -> None:
    """Write the store's ``sweep`` meta item (where, when, the first job's config), once."""
    if store.get_meta("sweep") is None:
        store.put_meta(
            "sweep",
            {"store_dir": str(job.store_dir), "started_at": time.time(), "config": job.resolved},
        )
