"""A sweep's jobs, composed at the cost of a dictionary lookup rather than a Hydra composition each.

Hydra composes every job of a multirun from scratch (``ConfigLoader.load_sweep_config``: the
defaults list, every YAML file, every override): about 70 ms a job here, 12 minutes for a
10,000-point grid before its first trial. Yet the jobs of a grid differ in a handful of values.
:class:`SweepComposer` composes each job from three cached parts, with Hydra's own machinery:

- a **base** per distinct set of *structural* overrides (config-group choices such as
  ``workload=gemm``, ``workload.target``, which chooses a user's workload as a group choice does,
  ``hydra.*`` keys, and ``+``/``++``/``~`` overrides): Hydra's full composition
  (``load_sweep_config``), once;
- a **patch** per distinct (base, ``key=value``) override: the override applied to a copy of the
  base's task config as Hydra applies it after composition (``OmegaConf.update(..., merge=True)``),
  which types the value, then the job it makes validated (``jobs.JobSpec``). The override must
  change its own key and nothing else: when the base holds an interpolation (another key might
  read this one) or the value is one (``${...}``), the patched config is validated in full and
  compared with the base; the patch keeps the typed value;
- the **job**: the base's typed config with each patch's value put in place
  (``dataclasses.replace``), then the checks that span keys (workload x size, inject x backend).

A job whose overrides cannot be composed that way (a config that reads ``${hydra:job.num}``, a
base that is no valid job without its jobs' values, a patch that moves another key) is composed by
Hydra in full, so the result is always what Hydra
would give: ``tests/orchestrator/test_compose.py`` compares the two on the shipped experiments and
on random override sets.

:meth:`SweepComposer.check_values` composes one job per distinct swept value before anything runs,
so a bad value anywhere in a grid is a one-line ``UserError`` before any device is changed; a bad
*combination* of good values is found when that job is prepared.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from orchestrator.errors import UserError
from orchestrator.jobs.job import JobSpec

if TYPE_CHECKING:
    from hydra.core.config_loader import ConfigLoader
    from hydra.core.override_parser.types import Override
    from hydra.types import HydraContext
    from omegaconf import DictConfig

    from orchestrator.config import DvfsConfig

# Interpolations that differ per job though no override names them: such a config is composed
# in full for every job (Hydra sets ``hydra.job.num``/``id`` and ``override_dirname`` per job).
_PER_JOB_FIELDS = ("hydra:job.", "hydra.job.")
STRUCTURAL_KEYS = frozenset({"workload.target"})
"""Keys that choose what a job is, as a group choice does: each value gets its own base."""


@dataclass(frozen=True)
class Base:
    """Hydra's full composition of one set of structural overrides.

    Attributes:
        sweep_config: the composed config, ``hydra`` node included (shared: never mutated).
        task: its task config (``hydra`` removed), the copy each patch starts from.
        spec: the validated job it is, with no value override (None: it is valid only with its
            jobs' own values, as ``workload=custom`` with its ``workload.target``).
        store_dir: ``hydra.sweep.dir``: where rows go unless a job sets ``store_dir``.
        per_job: the config reads a per-job Hydra field, or is no valid job alone: every job is
            composed in full.
        interpolated: the config holds an interpolation (another key may read a swept one).
        scratch: a copy of ``task`` that patches write their values into, to read them typed.
    """

    sweep_config: DictConfig
    task: DvfsConfig
    spec: JobSpec | None
    store_dir: str
    per_job: bool
    interpolated: bool
    scratch: DvfsConfig


@dataclass(frozen=True)
class Patch:
    """One ``key=value`` override on one base: where it goes and the typed value (None: it is
    entangled, and jobs with it are composed in full)."""

    path: tuple[str, ...]
    value: Any
    entangled: bool = False


class SweepComposer:
    """Composes the jobs of one sweep (one master config) from cached bases and patches.

    Args:
        master_config: the sweep's config, as the sweeper and launcher get it.
        config_loader: Hydra's config loader (``hydra_context.config_loader``).
    """

    def __init__(self, master_config: DictConfig, config_loader: ConfigLoader) -> None:
        from hydra.core.override_parser.overrides_parser import OverridesParser

        self.master = master_config
        self.loader = config_loader
        self.parser = OverridesParser.create(config_loader=config_loader)
        self._parsed: dict[str, Override] = {}
        self._structural: dict[str, bool] = {}
        self._bases: dict[tuple[str, ...], Base] = {}
        self._patches: dict[tuple[tuple[str, ...], str], Patch] = {}
        self.failed_at = 0  # the batch index of the first job ``check_values`` refused
        self.more_refused = 0  # and how many more it refused
        self._prefixes: dict[tuple[tuple[str, ...], tuple[str, ...]], DvfsConfig] = {}

    # --- the public face ---------------------------------------------------------------------
    def spec(self, overrides: Sequence[str], num: int = 0) -> JobSpec:
        """The validated job of these overrides: what Hydra's full composition would give.

        Raises:
            UserError: a value or a combination the schema, the kernels or a check refuses.
        """
        base_key, values = self.split(overrides)
        base = self.base(base_key)
        patches = [] if base.per_job else [self.patch(base_key, v) for v in values]
        if base.per_job or any(p.entangled for p in patches):
            sweep_config, task = self.full(overrides, num)
            return JobSpec.from_config(task, default_store_dir=str(sweep_config.hydra.sweep.dir))
        config = self._patched(base, base_key, values[:-1], patches[:-1])
        if patches:
            config = replace_path(config, patches[-1].path, patches[-1].value)
        return JobSpec.of(config, default_store_dir=base.store_dir)

    def _patched(
        self, base: Base, base_key: tuple[str, ...], values: list[str], patches: list[Patch]
    ) -> DvfsConfig:
        """The base's typed config with ``patches`` in place, cached by the override lines: in a
        grid every job but the last key's value shares them (Hydra's product varies the last
        key fastest), so a job costs one replacement, not one per override of its line."""
        key = (base_key, tuple(values))
        found = self._prefixes.get(key)
        if found is None:
            found = base.spec.config
            for p in patches:
                found = replace_path(found, p.path, p.value)
            if len(self._prefixes) >= 4096:  # a grid whose last key has few values: keep it small
                self._prefixes.clear()
            self._prefixes[key] = found
        return found

    def check_values(
        self, job_overrides: Sequence[Sequence[str]], first_num: int = 0
    ) -> list[tuple[int, JobSpec]]:
        """Compose the first job of the batch with each distinct override (each value of each
        swept key): a bad value anywhere is found before anything runs.

        Returns:
            (index in the batch, job) of each job composed: real jobs of the batch, which between
            them hold every distinct override.

        Raises:
            UserError: the first job refused (``failed_at`` and ``more_refused`` say which, and
                how many more; the caller names the job).
        """
        seen: set[str] = set()
        firsts, refused = [], []
        for i, overrides in enumerate(job_overrides):
            if all(o in seen for o in overrides) and (firsts or refused):
                continue
            seen.update(overrides)
            try:
                firsts.append((i, self.spec(overrides, first_num + i)))
            except UserError as e:
                refused.append((i, e))
        if refused:
            self.failed_at, self.more_refused = refused[0][0], len(refused) - 1
            raise refused[0][1]
        return firsts

    def full(self, overrides: Sequence[str], num: int = 0) -> tuple[DictConfig, DvfsConfig]:
        """Hydra's own composition of one job: (sweep config, task config without ``hydra``).

        Raises:
            UserError: overrides that do not compose (a missing key, a bad type, no such option).
        """
        from hydra.core.hydra_config import HydraConfig
        from omegaconf import open_dict, read_write

        from orchestrator.errors import hydra_user_error

        try:
            sweep_config = self.loader.load_sweep_config(self.master, list(overrides))
        except Exception as e:  # noqa: BLE001 - a composition error is the user's, or re-raised
            err = hydra_user_error(e)
            if err is None:
                raise
            raise err from e
        with open_dict(sweep_config):
            sweep_config.hydra.job.id = f"{sweep_config.hydra.job.name}_{num}"
            sweep_config.hydra.job.num = num
        HydraConfig.instance().set_config(sweep_config)
        task = copy.deepcopy(sweep_config)
        with read_write(task), open_dict(task):
            del task["hydra"]
        return sweep_config, task

    # --- the parts -----------------------------------------------------------------------------
    def split(self, overrides: Sequence[str]) -> tuple[tuple[str, ...], list[str]]:
        """(structural overrides, in order; ``key=value`` overrides, in order)."""
        structural, values = [], []
        for line in overrides:
            (structural if self._is_structural(line) else values).append(line)
        return tuple(structural), values

    def base(self, key: tuple[str, ...]) -> Base:
        """The full composition of one set of structural overrides (cached)."""
        found = self._bases.get(key)
        if found is not None:
            return found
        from omegaconf import OmegaConf

        sweep_config, task = self.full(list(key))
        store_dir = str(sweep_config.hydra.sweep.dir)
        try:
            spec: JobSpec | None = JobSpec.from_config(task, default_store_dir=store_dir)
        except UserError:  # valid only with its jobs' values: each is composed and checked in full
            spec = None
        task_yaml = OmegaConf.to_yaml(task)
        unresolved = task_yaml + str(
            OmegaConf.to_container(sweep_config.hydra.sweep, resolve=False).get("dir", "")
        )
        per_job = spec is None or any(f in unresolved for f in _PER_JOB_FIELDS)
        base = self._bases[key] = Base(sweep_config, task, spec, store_dir, per_job,
                                       "${" in task_yaml, copy.deepcopy(task))
        return base

    def patch(self, base_key: tuple[str, ...], line: str) -> Patch:
        """One ``key=value`` override applied to a base and checked (cached).

        Raises:
            UserError: the value does not fit the key, or the job it makes is refused.
        """
        found = self._patches.get((base_key, line))
        if found is not None:
            return found
        from hydra.core.hydra_config import HydraConfig
        from omegaconf import OmegaConf

        from orchestrator.errors import hydra_user_error

        base = self.base(base_key)
        override = self._parse(line)
        key, value = override.key_or_group, override.value()
        path = tuple(key.split("."))
        # A scalar or list into a config without interpolations: only the value's own key can
        # change, so Hydra's update of one scratch copy per base gives the typed value.
        quick = not base.interpolated and "${" not in line and not isinstance(value, dict)
        task = base.scratch if quick else copy.deepcopy(base.task)
        if not quick:  # ``${hydra:...}`` resolves against the config Hydra last saw
            HydraConfig.instance().set_config(base.sweep_config)
        try:
            OmegaConf.update(task, key, value, merge=True)
        except Exception as e:  # noqa: BLE001 - a bad value is the user's, or re-raised
            err = hydra_user_error(e)
            if err is None:
                raise
            raise UserError(f"{line}: {err}") from e
        if quick:
            typed = OmegaConf.select(task, key)
            if OmegaConf.is_config(typed):
                typed = OmegaConf.to_container(typed, resolve=True)
            JobSpec.of(replace_path(base.spec.config, path, typed), base.store_dir)
            patch = Patch(path, typed)
        else:
            spec = JobSpec.from_config(task, default_store_dir=base.store_dir)
            moved = changed_paths(base.spec.resolved, spec.resolved)
            # An interpolated value reads other keys, which other patches may change.
            entangled = "${" in line or any(p[: len(path)] != path for p in moved)
            patch = Patch(path, None if entangled else value_at(spec.config, path), entangled)
        self._patches[(base_key, line)] = patch
        return patch

    def _parse(self, line: str) -> Override:
        found = self._parsed.get(line)
        if found is None:
            from orchestrator.errors import hydra_user_error

            try:
                found = self._parsed[line] = self.parser.parse_overrides([line])[0]
            except Exception as e:  # noqa: BLE001 - a parse error is the user's, or re-raised
                err = hydra_user_error(e)
                if err is None:
                    raise
                raise err from e
        return found

    def _is_structural(self, line: str) -> bool:
        """Whether an override shapes the composition itself (composed by Hydra, per base)."""
        found = self._structural.get(line)
        if found is None:
            from hydra.core.override_parser.types import OverrideType

            o = self._parse(line)
            found = (
                o.type is not OverrideType.CHANGE
                or o.package is not None
                or o.is_hydra_override()
                or o.is_sweep_override()
                or self.loader.repository.group_exists(o.key_or_group)
                or o.key_or_group in STRUCTURAL_KEYS
            )
            self._structural[line] = found
        return found


# --- typed configs ------------------------------------------------------------------------------
def replace_path(obj: Any, path: tuple[str, ...], value: Any) -> Any:
    """A copy of ``obj`` (nested dataclasses and dicts) with ``value`` at ``path``; the parts
    off the path are shared, not copied."""
    head, rest = path[0], path[1:]
    new = value if not rest else replace_path(_child(obj, head), rest, value)
    if dataclasses.is_dataclass(obj):
        return dataclasses.replace(obj, **{head: new})  # type: ignore[arg-type]
    return {**obj, head: new}


def value_at(obj: Any, path: tuple[str, ...]) -> Any:
    """The value at ``path`` of nested dataclasses and dicts."""
    for part in path:
        obj = _child(obj, part)
    return obj


def _child(obj: Any, name: str) -> Any:
    return getattr(obj, name) if dataclasses.is_dataclass(obj) else obj[name]


def changed_paths(a: Any, b: Any, at: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """The leaf paths where two plain nested dicts differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[tuple[str, ...]] = []
        for k in a.keys() | b.keys():
            if k not in a or k not in b:
                out.append((*at, str(k)))
            else:
                out += changed_paths(a[k], b[k], (*at, str(k)))
        return out
    return [] if a == b and type(a) is type(b) else [at]


# --- one composer per sweep ------------------------------------------------------------------
_COMPOSERS: dict[int, SweepComposer] = {}


def composer_for(master_config: DictConfig, hydra_context: HydraContext) -> SweepComposer:
    """The process's composer of this master config (the launcher's batches and the stability
    sweeper share its caches)."""
    found = _COMPOSERS.get(id(master_config))
    if found is None or found.master is not master_config:
        _COMPOSERS.clear()  # one sweep per process: a new master config starts afresh
        found = _COMPOSERS[id(master_config)] = SweepComposer(
            master_config, hydra_context.config_loader
        )
    return found

