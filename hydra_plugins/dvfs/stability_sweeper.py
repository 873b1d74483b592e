"""``hydra/sweeper=stability``: the stability threshold of each GPU and computation, by search.

A thin shell over :mod:`orchestrator.search`: it splits the command line into groups (every
combination of the swept overrides, e.g. ``workload=gemm,stencil framework=jax,tensorflow``),
asks each selected GPU for its supported values of the searched setting, runs one
:class:`~orchestrator.search.ThresholdSearch` per (group, GPU), and sends each round's proposals,
for every group and GPU at once, to the launcher as one batch. Each job is pinned to its GPU
(``device.gpus=[GPU-...]``), so the ``ray_gpus`` launcher runs the searches of different GPUs side
by side; each job's outcome is read from the rows it stored. At the end the ``thresholds``
table goes to ``thresholds.csv`` in the sweep directory and to the store's ``thresholds`` meta item.

    dvfs sweep -m hydra/sweeper=stability workload=gemm,stencil framework=jax,tensorflow
    dvfs sweep -m hydra/sweeper=stability hydra.sweeper.setting=device.power_limit_w
    dvfs sweep -m hydra/sweeper=stability device.sm_clock_mhz='range(510,1411,15)'  # within these

Bad input (a setting that is not ordered, a value the GPU does not support, a confirmation
count under 1) is a one-line ``UserError`` (exit code 2) before any trial runs. Hydra imports this
module at start-up: it imports nothing heavy.
"""

# No `from __future__ import annotations`: Hydra's plugin scanner runs this module before it is in
# sys.modules, and dataclasses then cannot resolve string annotations.
import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from hydra.plugins.sweeper import Sweeper


@dataclass
class StabilitySweeperConf:
    """``hydra.sweeper`` for ``stability`` (see ``orchestrator/search.py`` for the algorithm)."""

    _target_: str = "hydra_plugins.dvfs.stability_sweeper.StabilitySweeper"
    setting: str = "device.sm_clock_mhz"  # searched: sm_clock_mhz, power_limit_w (down), clock_offset_mhz (up)
    confirm_iterations: int = 1000  # n clean iterations to declare a value stable (fault rate < 3/n, 95 %)
    coarse_points: int = 8  # values of the first pass, spread over the whole supported range
    step: Optional[float] = None  # grid step of a power (W) or offset (MHz) search; null: 10 W / SM clock step
    max_inconclusive: int = 2  # ok-but-invalid trials at one value before the search gives up on it
    confirm_trials: int = 3  # a confirmation spreads the iterations it still needs over this many trials
    params: Optional[Dict[str, str]] = None  # swept overrides, as for the basic sweeper: each combination is a group


ConfigStore.instance().store(group="hydra/sweeper", name="stability", node=StabilitySweeperConf, provider="dvfs")


class StabilitySweeper(Sweeper):
    """Searches one ordered setting per group of overrides and per GPU (``orchestrator.search``)."""

    def __init__(self, params: Optional[Dict[str, str]] = None, **options: Any) -> None:
        self.params = dict(params or {})
        self.options = options
        self.config: Any = None
        self.hydra_context: Any = None
        self.launcher: Any = None
        self.job_idx = 0
        self._gpus: Dict[str, Any] = {}  # machine (device config less its settings) -> GpuInfo list

    def setup(self, *, hydra_context: Any, task_function: Any, config: Any) -> None:
        from hydra.core.plugins import Plugins

        self.hydra_context = hydra_context
        self.config = config
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    # --- the sweep -----------------------------------------------------------------------------
    def sweep(self, arguments: List[str]) -> Any:
        from omegaconf import OmegaConf

        from orchestrator import search

        options = search.SearchOptions(**self.options).validated()
        setting = options.ordered
        common, groups, explicit = self._split([*(f"{k}={v}" for k, v in self.params.items()), *arguments], setting)
        targets = [t for group in groups for t in self._targets(options, common, group, explicit)]
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        print(
            f"stability: searching {setting.key} ({'down' if setting.riskier == 'lower' else 'up'}ward) for "
            f"{len(groups)} group(s) x {len({t.gpu.uuid for t in targets})} GPU(s); "
            f"{options.confirm_iterations} clean iterations confirm a value", flush=True
        )
        trials = search.run_sweep(targets, lambda batch: self._run_batch(setting, batch))
        table = search.thresholds_table(targets, options)
        store_dirs = sorted({t.store_dir for t in targets})
        for store_dir in store_dirs:
            rows = [r for t, r in zip(targets, table) if t.store_dir == store_dir]
            path = search.write_thresholds(store_dir, rows, options, trials)
        for t, row in zip(targets, table):
            print(search.describe(row, t.label))
        print(f"stability: {trials} trial(s); thresholds in {path}; report: dvfs report {' '.join(store_dirs)}")
        return table

    # --- planning ------------------------------------------------------------------------------
    def _split(self, arguments: List[str], setting: Any) -> Any:
        """(common overrides, groups of swept overrides, explicit values of the setting or None)."""
        from hydra.core.override_parser.overrides_parser import OverridesParser

        from orchestrator.errors import UserError

        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        by_key: Dict[str, Any] = {}  # key -> [k=v, ...] (a sweep) or "k=v"; a later override wins
        explicit = None
        for o in parser.parse_overrides(arguments):
            key = o.key_or_group
            if o.is_sweep_override() and not o.is_discrete_sweep():
                raise UserError(f"{key}: hydra/sweeper=stability takes lists and ranges, not intervals")
            if key == setting.key:
                if not o.is_sweep_override():
                    raise UserError(
                        f"{key}={o.get_value_element_as_str()} is the setting hydra/sweeper=stability searches: "
                        "leave it out (every supported value) or give values to search within (a,b,c or range(...))"
                    )
                try:
                    explicit = [float(v) for v in o.sweep_iterator()]
                except (TypeError, ValueError):
                    raise UserError(f"{key}: the values to search must be numbers") from None
            elif key == "device.gpus" and o.is_sweep_override():
                raise UserError("device.gpus selects the GPUs searched (each on its own): give one list, e.g. device.gpus=[0,1]")
            elif o.is_sweep_override():
                by_key[key] = [f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()]
            else:
                by_key[key] = f"{o.get_key_element()}={o.get_value_element_as_str()}"
        common = [v for v in by_key.values() if isinstance(v, str)]
        swept = [v for v in by_key.values() if isinstance(v, list)]
        return common, [list(g) for g in itertools.product(*swept)], explicit

    def _compose(self, overrides: List[str]) -> Any:
        """A job's task config (without the ``hydra`` node), as the launcher will compose it."""
        from omegaconf import open_dict, read_write

        cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
        with read_write(cfg), open_dict(cfg):
            del cfg["hydra"]
        return cfg

    def _targets(self, options: Any, common: List[str], group: List[str], explicit: Any) -> List[Any]:
        """One search per GPU for one group, on the values each GPU supports."""
        from orchestrator import search
        from orchestrator.app import prepare
        from orchestrator.errors import UserError
        from orchestrator.policy import load_policy
        from orchestrator.worker import machine_key

        cfg = self._compose([*common, *group])
        resolved, request = prepare(cfg)
        if cfg.device.observe_only:
            raise UserError(f"device.observe_only=true changes nothing, but a stability search sets {options.setting}")
        machine = machine_key(resolved["device"])
        if machine not in self._gpus:
            self._gpus[machine] = search.discover_gpus(cfg.device)
        gpus = self._gpus[machine]
        store_dir = str(resolved.get("store_dir") or self.config.hydra.sweep.dir)
        labels = {"workload": cfg.workload.name, "framework": cfg.framework.name, "dtype": cfg.workload.dtype,
                  "precision": cfg.framework.precision}
        targets = []
        for gpu in gpus:
            policy = load_policy(cfg.device.policy_file, gpu.name)
            values = search.search_values(
                options.ordered,
                gpu.caps,
                lambda req, gpu=gpu, policy=policy: policy.check(req, gpu.caps, gpu.name),
                request,
                step=options.step,
                explicit=explicit,
                device_label=f"GPU {gpu.index} ({gpu.name})",
            )
            targets.append(search.Target(
                group={o.split("=", 1)[0].lstrip("+~"): o.split("=", 1)[1] for o in group},
                overrides=[*common, *group],
                labels=labels,
                gpu=gpu,
                search=search.ThresholdSearch(values, options.confirm_iterations, options.coarse_points,
                                              options.max_inconclusive, options.confirm_trials),
                store_dir=store_dir,
                base_seed=int(cfg.seed),
                max_iters=int(cfg.measure.max_iters),
            ))
        return targets

    # --- running -------------------------------------------------------------------------------
    def _run_batch(self, setting: Any, batch: List[Any]) -> List[Any]:
        """Launch one batch and read each job's outcome from the rows it stored."""
        from omegaconf import OmegaConf

        from orchestrator.search import outcome_of, record_trials
        from orchestrator.store import ResultStore, StoreNotFoundError
        from orchestrator.trial import trial_key

        overrides = [target.job_overrides(setting, probe) for target, probe in batch]
        keys = []
        for (target, _), job in zip(batch, overrides):
            resolved = OmegaConf.to_container(self._compose(job), resolve=True)
            keys.append(trial_key(resolved, target.gpu.uuid))
        for store_dir in {t.store_dir for t, _ in batch}:  # which phase asked for each trial
            record_trials(store_dir, {k: t.trial_record(p) for k, (t, p) in zip(keys, batch) if t.store_dir == store_dir})
        returns = self.launcher.launch(overrides, initial_job_idx=self.job_idx)
        self.job_idx += len(returns)
        for r in returns:
            _ = r.return_value  # a job that raised (not a failed check: a bug, a lost device) ends the sweep
        rows: Dict[str, List[Dict[str, Any]]] = {}
        for store_dir in {t.store_dir for t, _ in batch}:
            try:
                with ResultStore(store_dir, readonly=True) as store:
                    for row in store.iter_rows():
                        rows.setdefault(row["trial_key"], []).append(row)
            except StoreNotFoundError:
                pass
        return [outcome_of(rows.get(k, [])) for k in keys]
