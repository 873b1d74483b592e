"""Planning and running a stability sweep: one search per (group of overrides, GPU).

The command line splits into groups (every combination of the swept overrides, e.g.
``workload=gemm,stencil framework=jax,tensorflow``); each group is composed once, to learn its
GPUs, the values each supports of the searched setting, its store and its seed. Each
:class:`Target` then runs one :class:`~orchestrator.search.algorithm.ThresholdSearch`, and each
round's proposals, for every group and GPU at once, go to the launcher as one batch. Each job is
pinned to its GPU (``device.gpus=[GPU-...]``), so the ``ray_gpus`` launcher runs the searches
of different GPUs side by side. Each job's verdict comes back in Hydra's
``JobReturn.return_value``, an :class:`orchestrator.results.rows.JobResult` (its outcome and trial
keys): nothing here composes a job or reads a store's rows. At the end the ``thresholds`` table
goes to ``thresholds.csv`` in the sweep directory (:mod:`orchestrator.search.table`).

The Hydra sweeper (``hydra_plugins/dvfs/stability_sweeper.py``) is a shell over :func:`sweep`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.errors import UserError
from orchestrator.results.rows import JobResult, Outcome
from orchestrator.search.algorithm import Probe, ThresholdSearch
from orchestrator.search.space import (
    OrderedSetting,
    SearchOptions,
    plain_number,
    search_values,
)
from orchestrator.search.table import describe, record_trials, thresholds_table, write_thresholds

if TYPE_CHECKING:
    from hydra.core.utils import JobReturn
    from hydra.plugins.launcher import Launcher
    from hydra.types import HydraContext
    from omegaconf import DictConfig

    from orchestrator.config import DeviceConfig
    from orchestrator.devices.base import DeviceCapabilities
    from orchestrator.jobs.job import JobSpec


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as the planner needs it."""

    index: int
    uuid: str
    name: str
    caps: DeviceCapabilities


def discover_gpus(device_cfg: DeviceConfig) -> list[GpuInfo]:
    """The GPUs ``device.gpus`` selects, with their capabilities (read only; nothing is set).

    Raises:
        UserError: no such GPU, an unknown backend or profile, no driver.
    """
    from orchestrator.devices import open_backend, select_devices

    backend = open_backend(device_cfg)
    try:
        return [
            GpuInfo(d.identity.index, d.identity.uuid, d.identity.name, d.capabilities())
            for d in select_devices(backend, device_cfg.gpus)
        ]
    finally:
        backend.close()


@dataclass
class Target:
    """One search: a group of overrides on one GPU.

    Attributes:
        group: the swept overrides that make the group (``{"workload": "gemm", ...}``).
        overrides: every override of the group's jobs (common ones and the group's).
        labels: the computation, for the table (workload, framework, dtype, precision).
        gpu: the GPU.
        search: its state machine.
        store_dir: where its jobs store their rows (and where its table row goes).
        base_seed: the group's ``seed`` (of the kernel's random inputs).
        max_iters: the group's ``measure.max_iters`` (a confirmation trial asks for no more).
    """

    group: dict[str, str]
    overrides: list[str]
    labels: dict[str, Any]
    gpu: GpuInfo
    search: ThresholdSearch
    store_dir: str = ""
    base_seed: int = 0
    max_iters: int | None = None

    def job_overrides(self, setting: OrderedSetting, probe: Probe) -> list[str]:
        """The overrides of the job that runs ``probe``, pinned to this GPU by its UUID.

        The first trial at a value is exactly the trial a grid sweep would run there (same
        trial key: a grid already in the store is reused). A repeated trial at a value runs on
        fresh random inputs (``seed`` + attempt), which also gives it a trial key of its own, so
        it is a new trial, never a resumed one.
        """
        extra = []
        if probe.attempt:
            extra.append(f"seed={self.base_seed + probe.attempt}")
        if probe.min_iterations is not None:
            m = probe.min_iterations
            m = m if self.max_iters is None else min(m, self.max_iters)
            extra.append(f"measure.min_iters={m}")
        pinned = f"device.gpus=[{self.gpu.uuid}]"
        return [*self.overrides, pinned, f"{setting.key}={plain_number(probe.value)}", *extra]

    def trial_record(self, probe: Probe) -> dict[str, Any]:
        """What the store's ``search_trials`` meta item keeps about one trial."""
        return {"role": probe.role, "attempt": probe.attempt, "value": plain_number(probe.value),
                "device_uuid": self.gpu.uuid, "group": self.group_label}

    @property
    def group_label(self) -> str:
        """The group's overrides, ``workload=gemm framework=jax`` ("" for a single group)."""
        return " ".join(f"{k}={v}" for k, v in self.group.items())

    @property
    def label(self) -> str:
        """The search in the report's lines: ``gpu0 gemm/jax`` and the group's other overrides."""
        what = "/".join(str(self.labels[k]) for k in ("workload", "framework")
                        if self.labels.get(k) is not None)
        extra = " ".join(f"{k}={v}" for k, v in self.group.items()
                         if k not in ("workload", "framework"))
        return f"gpu{self.gpu.index} {what}" + (f" {extra}" if extra else "")


def next_batch(targets: Iterable[Target]) -> list[tuple[Target, Probe]]:
    """Every search's next proposals, as one batch, ordered by GPU (so a process that serves
    several GPUs switches between them once per batch)."""
    batch = [(t, p) for t in targets for p in t.search.propose()]
    return sorted(batch, key=lambda tp: tp[0].gpu.index)


def run_sweep(
    targets: list[Target], run_batch: Callable[[list[tuple[Target, Probe]]], list[Outcome]]
) -> int:
    """Run every search to its end; ``run_batch`` runs a batch and returns each trial's outcome.

    Returns:
        The number of trials run.
    """
    total = 0
    while batch := next_batch(targets):
        outcomes = run_batch(batch)
        for (target, probe), outcome in zip(batch, outcomes, strict=True):
            target.search.record(probe, outcome)
        total += len(batch)
    return total


# --- the command line -------------------------------------------------------------------------
@dataclass(frozen=True)
class SplitArguments:
    """The command line of a stability sweep, split.

    Attributes:
        common: overrides every job gets (``k=v``).
        groups: one list of ``k=v`` per combination of the swept overrides.
        explicit: the values to search within (``device.sm_clock_mhz=range(...)``), or None.
    """

    common: list[str]
    groups: list[list[str]]
    explicit: list[float] | None = None


def _explicit_values(override: Any) -> list[float]:
    """The values of a sweep of the searched setting itself (the values to search within)."""
    key = override.key_or_group
    if not override.is_sweep_override():
        raise UserError(
            f"{key}={override.get_value_element_as_str()} is the setting hydra/sweeper=stability "
            "searches: leave it out (every supported value) or give values to search within "
            "(a,b,c or range(...))"
        )
    try:
        return [float(v) for v in override.sweep_iterator()]
    except (TypeError, ValueError):
        raise UserError(f"{key}: the values to search must be numbers") from None


def split_arguments(overrides: Sequence[Any], setting: OrderedSetting) -> SplitArguments:
    """Split parsed overrides (Hydra's ``Override``) into common ones, groups and explicit values.

    Raises:
        UserError: an interval sweep, a single value of the searched setting, values that are
            not numbers, a sweep of ``device.gpus``.
    """
    by_key: dict[str, Any] = {}  # key -> [k=v, ...] (a sweep) or "k=v"; a later override wins
    explicit = None
    for o in overrides:
        key = o.key_or_group
        if o.is_sweep_override() and not o.is_discrete_sweep():
            raise UserError(f"{key}: hydra/sweeper=stability takes lists and ranges, not intervals")
        if key == setting.key:
            explicit = _explicit_values(o)
        elif key == "device.gpus" and o.is_sweep_override():
            raise UserError("device.gpus selects the GPUs searched (each on its own): give one "
                            "list, e.g. device.gpus=[0,1]")
        elif o.is_sweep_override():
            by_key[key] = [f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()]
        else:
            by_key[key] = f"{o.get_key_element()}={o.get_value_element_as_str()}"
    common = [v for v in by_key.values() if isinstance(v, str)]
    swept = [v for v in by_key.values() if isinstance(v, list)]
    return SplitArguments(common, [list(g) for g in itertools.product(*swept)], explicit)


# --- one sweep --------------------------------------------------------------------------------
@dataclass
class StabilitySweep:
    """One ``hydra/sweeper=stability`` run: plans its searches, launches each round, writes up.

    Attributes:
        config: the sweep's config (with its ``hydra`` node).
        hydra_context: Hydra's context (its config loader composes each group once).
        launcher: Hydra's launcher (``ray_gpus`` or ``basic``).
        options: what the sweeper was asked to do.
        job_idx: the index of the next job launched.
    """

    config: DictConfig
    hydra_context: HydraContext
    launcher: Launcher
    options: SearchOptions
    job_idx: int = 0
    _gpus: dict[str, list[GpuInfo]] = field(default_factory=dict)  # machine key -> its GPUs

    @property
    def sweep_dir(self) -> Path:
        """``hydra.sweep.dir``: where ``multirun.yaml`` and, by default, the store go."""
        return Path(str(self.config.hydra.sweep.dir))

    def split(self, arguments: list[str]) -> SplitArguments:
        """The command line (the sweeper's ``params`` first), split into groups."""
        from hydra.core.override_parser.overrides_parser import OverridesParser

        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        return split_arguments(parser.parse_overrides(arguments), self.options.ordered)

    def targets(self, common: list[str], group: list[str], explicit: Any) -> list[Target]:
        """One search per GPU for one group, on the values each GPU supports.

        Raises:
            UserError: a bad job config, ``device.observe_only``, an unsupported value.
        """
        from orchestrator.jobs.job import machine_key
        from orchestrator.launching.compose import composer_for

        # The launcher composes the group's jobs with the same composer: Hydra composes once.
        job = composer_for(self.config, self.hydra_context).spec([*common, *group])
        cfg = job.config
        if cfg.device.observe_only:
            raise UserError(f"device.observe_only=true changes nothing, but a stability search "
                            f"sets {self.options.setting}")
        machine = machine_key(job.device)
        if machine not in self._gpus:
            self._gpus[machine] = discover_gpus(cfg.device)
        labels = {"workload": job.workload_name, "framework": cfg.framework.name,
                  "dtype": cfg.workload.dtype, "precision": cfg.framework.precision}
        return [
            Target(
                group={o.split("=", 1)[0].lstrip("+~"): o.split("=", 1)[1] for o in group},
                overrides=[*common, *group], labels=labels, gpu=gpu,
                search=self._search(self._values(job, gpu, explicit)),
                store_dir=str(job.store_dir), base_seed=int(cfg.seed),
                max_iters=int(cfg.measure.max_iters),
            )
            for gpu in self._gpus[machine]
        ]

    def _values(self, job: JobSpec, gpu: GpuInfo, explicit: Any) -> tuple[float, ...]:
        """The values ``gpu`` supports and its policy allows, riskiest first."""
        from orchestrator.jobs.policy import load_policy

        policy = load_policy(job.config.device.policy_file, gpu.name)
        return search_values(
            self.options.ordered, gpu.caps, lambda req: policy.check(req, gpu.caps, gpu.name),
            job.request, step=self.options.step, explicit=explicit,
            device_label=f"GPU {gpu.index} ({gpu.name})",
        )

    def _search(self, values: tuple[float, ...]) -> ThresholdSearch:
        o = self.options
        return ThresholdSearch(values, o.confirm_iterations, o.coarse_points, o.max_inconclusive,
                               o.confirm_trials)

    def run_batch(self, batch: list[tuple[Target, Probe]]) -> list[Outcome]:
        """Launch one batch; each job's outcome is its ``JobResult``'s; record who asked what."""
        setting = self.options.ordered
        returns = self.launcher.launch([t.job_overrides(setting, p) for t, p in batch],
                                       initial_job_idx=self.job_idx)
        self.job_idx += len(returns)
        results = [job_result(r) for r in returns]
        for store_dir in {t.store_dir for t, _ in batch}:  # which phase asked for each trial
            record_trials(store_dir, {key: t.trial_record(p)
                                      for (t, p), res in zip(batch, results, strict=True)
                                      if t.store_dir == store_dir for key in res.trial_keys})
        return [res.outcome for res in results]


def job_result(job_return: JobReturn) -> JobResult:
    """The ``JobResult`` of one launched job.

    Raises:
        Exception: the job's own, when it raised (not a failed check: a bug, a lost device):
            that ends the sweep.
        RuntimeError: the job returned something else (a task other than ``dvfs``'s).
    """
    value = job_return.return_value
    if not isinstance(value, JobResult):
        raise RuntimeError(
            f"a job returned {value!r}, not an orchestrator.results.rows.JobResult: the stability "
            "sweeper runs the dvfs task on the ray_gpus or basic launcher"
        )
    return value


def write_up(targets: Sequence[Target], options: SearchOptions, trials: int) -> list[dict]:
    """Write each store's table, print a line per search and where the table went."""
    table = thresholds_table(targets, options)
    store_dirs = sorted({t.store_dir for t in targets})
    for store_dir in store_dirs:
        rows = [r for t, r in zip(targets, table) if t.store_dir == store_dir]
        path = write_thresholds(store_dir, rows, options, trials)
    for t, row in zip(targets, table):
        print(describe(row, t.label))
    print(f"stability: {trials} trial(s); thresholds in {path}; "
          f"report: dvfs report {' '.join(store_dirs)}")
    return table


def sweep(
    config: DictConfig,
    hydra_context: HydraContext,
    launcher: Launcher,
    params: Mapping[str, str],
    options: Mapping[str, Any],
    arguments: list[str],
) -> list[dict]:
    """``hydra/sweeper=stability``'s sweep: every search to its end, then the table.

    Args:
        config: the sweep's config; hydra_context, launcher: Hydra's.
        params: ``hydra.sweeper.params`` (swept overrides, as for the basic sweeper).
        options: the sweeper's other config keys (:class:`SearchOptions`).
        arguments: the command line's overrides.

    Returns:
        The thresholds table, one row per search.

    Raises:
        UserError: bad options or overrides, before any trial runs.
    """
    from omegaconf import OmegaConf

    run = StabilitySweep(config, hydra_context, launcher, SearchOptions(**options).validated())
    split = run.split([*(f"{k}={v}" for k, v in params.items()), *arguments])
    targets = [t for g in split.groups for t in run.targets(split.common, g, split.explicit)]
    run.sweep_dir.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(config, run.sweep_dir / "multirun.yaml")
    setting = run.options.ordered
    print(
        f"stability: searching {setting.key} ({setting.direction}) for {len(split.groups)} "
        f"group(s) x {len({t.gpu.uuid for t in targets})} GPU(s); "
        f"{run.options.confirm_iterations} clean iterations confirm a value", flush=True
    )
    trials = run_sweep(targets, run.run_batch)
    return write_up(targets, run.options, trials)
