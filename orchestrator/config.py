"""Structured configs: the schema every YAML under ``conf/`` is checked against.

Each dataclass is registered in Hydra's ConfigStore under a ``*_schema`` name; the YAML files in
``conf/`` name their schema in their defaults list, so Hydra type-checks every value and refuses a
key that does not exist (a typo) before anything runs. Values that need a device to check
(supported clocks, power range) are checked by the guard's policy before the first setting is
changed.

Units are in the field names: ``*_mhz``, ``*_w``, ``*_s``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from orchestrator.bounds import Bound, bounded, check_fields
from orchestrator.errors import UserError, hydra_user_error

if TYPE_CHECKING:
    from hydra.core.config_store import ConfigStore

CONF_DIR = (Path(__file__).parent / "conf").resolve()
"""The configs: ``orchestrator/conf``, a link to the checkout's top-level ``conf/`` (a source tree
or an editable install), or the copy a wheel carries as package data (any other install)."""

BACKENDS = ("sim", "nvml", "cpu", "tpu")
AUTO_SIZE = "auto"  # workload.size: the largest preset that fits (orchestrator.measuring.memory)
METERS = ("auto", "counter", "polling")
# where calls are checked: orchestrator.measuring.window.DigestMode
DIGESTS = ("after", "inline", "host")
# a trial's thermal start: orchestrator.measuring.thermal
STEADY_STARTS = ("none", "drift", "cooldown")
OBJECTIVES = ("energy_per_work", "time_per_work", "edp", "ed2p")
MAX_SIM_GPUS = 64  # as orchestrator.devices.sim.state.create_machine allows
MAX_REFERENCE_SAMPLES = 64  # calls 1, 2, 4, ... 2**63: more than any window makes
MAX_REPEATS = 1000  # windows per setting: see MeasureConfig.repeats
MAX_CLOCK_MHZ = 5000  # no GPU's SM clock reaches 5 GHz (an H200 boosts to 1980 MHz)
MAX_SEED = 2**32 - 1  # NumPy's legacy and the frameworks' seeds are 32-bit; every row stores it
MAX_ITERS = 1_000_000_000  # calls of one window: a 1 us kernel would take over 16 minutes

# Every numeric field is `bounded(default, lo, hi, why)` (orchestrator.bounds): out of range is
# one line and exit code 2 before anything runs.


@dataclass
class DeviceConfig:
    """Which GPUs, how to reach them, and the settings a trial asks for."""

    backend: str = "sim"  # "sim" (simulated NVML), "nvml" (real GPUs), "cpu" (the host), "tpu"
    default_size: str = "cpu"  # workload.size where unset: tiny (sim), cpu (cpu), auto (nvml, tpu)
    gpus: Optional[list[Any]] = None  # NVML indices or UUIDs to use; None: every GPU
    observe_only: bool = False  # change nothing; refuse any sweep that asks for a setting
    # --- settings a trial asks for (None: leave at the device's default); each checked against
    # its bound here and the GPU's own range by the guard's policy, before any setting changes.
    sm_clock_mhz: Any = None  # lock the SM clock: one value (min=max) or [min, max]
    mem_clock_mhz: Optional[int] = bounded(
        None, 1, 50_000, "the fastest memory NVML reports, GDDR7, runs near 16,000 MHz",
        unit=" MHz")  # lock the memory clock
    power_limit_w: Optional[float] = bounded(
        None, 0, 5000, "no board draws 5 kW: a B200 is 1,000 W; the GPU's own range is checked "
        "before any setting", above=True, unit=" W")  # power-management limit
    clock_offset_mhz: Optional[int] = bounded(
        None, -2000, 2000, "NVML's clock offsets span a few hundred MHz either way", unit=" MHz"
    )  # GPC clock offset
    # --- the guard ---
    journal_dir: Optional[str] = None  # where the restore journal lives (default: journal_dir())
    policy_file: Optional[str] = None  # YAML/JSON of allowed ranges; None: the device's own ranges
    # --- the simulated GPU (backend=sim only) ---
    profile: str = "a100_sxm4_40gb"  # a profile under conf/device/profile/, or a YAML file path
    count: int = bounded(
        1, 1, MAX_SIM_GPUS, "a simulated machine has at most 64 GPUs, as the largest nodes have "
        "16")  # how many simulated GPUs
    state_dir: Optional[str] = None  # the sim's state; default $DVFS_SIM_STATE_DIR or ~/.cache
    seed: int = bounded(0, 0, MAX_SEED, "a 32-bit seed")  # silicon lottery: UUIDs, thresholds
    privileged: bool = True  # false: setters fail with NVML_ERROR_NO_PERMISSION, as without root
    scenario: Optional[str] = None  # a ready fault scenario, e.g. "seed_claims"
    planted_thresholds: Any = None  # {gpu index or UUID: {kernel class or "*": MHz}}
    energy_update_period_s: Optional[float] = bounded(
        None, 0, 10, "real counters update every 1 to 100 ms (0: at every call); 10 s is a "
        "counter that never updates in a window", unit=" s")  # None: the profile's period
    # tests and chaos only (sim): a fault to inject, see orchestrator/measuring/inject.py
    inject: Any = None
    # --- the host CPU (backend=cpu only) ---
    powercap_root: Optional[str] = None  # RAPL's intel-rapl:N zones; None: /sys/class/powercap


@dataclass
class WorkloadConfig:
    """Which kernel, at which size."""

    name: str = "gemm"  # a built-in (gemm, resnet50_train...), an entry point's name, or custom
    size: str = "cpu"  # size preset the kernel computes (the YAML: the device's default_size)
    dtype: str = "float32"  # input dtype: float32, bfloat16, ...
    sim_size: Optional[str] = "gpu"  # the size the simulated GPU models (None: the size above)
    target: Optional[str] = None  # workload=custom: "package.module:factory" (kernels.Workload)
    # --- workload=command: the user's own program, run once per trial (docs/programs.md) ---
    argv: Optional[list[str]] = None  # the program and its arguments; "python" is dvfs's Python
    cwd: Optional[str] = None  # where it runs; None: where dvfs was started
    env: dict[str, str] = field(default_factory=dict)  # added to the program's environment
    label: Optional[str] = None  # the rows' workload name; None: the script's name
    window: Optional[str] = None  # which of its windows a row sums; None: the outermost ones
    result_rtol: float = bounded(
        1e-3, 0, 1e6, "a relative tolerance; 1e6 accepts any result of the right sign")
    # ... a result further from the default setting's than atol + rtol * |its| is `wrong`
    result_atol: float = bounded(0.0, 0, 1e300, "an absolute tolerance")
    timeout_s: float = bounded(
        300.0, 0, 43_200, "half a day: the trial also runs the program once at the default "
        "setting, all within measure.timeout_s", above=True, unit=" s")  # the program's limit
    sim_scale: float = bounded(
        1.0, 0, 1e9, "the sim charges a call as if its arrays were this many times larger",
        above=True)  # the sim: a charged call stands for this many times its data


@dataclass
class FrameworkConfig:
    """Which framework builds the kernel, with which precision knobs."""

    name: str = "jax"  # jax, tensorflow or pytorch
    precision: str = "default"  # matmul precision: default, highest, tf32, ...
    xla: bool = False  # TensorFlow only: compile the tf.function with XLA
    compile: bool = False  # PyTorch only: torch.compile the step (else eager, op by op)
    deterministic: bool = True  # PyTorch only: torch.use_deterministic_algorithms (JAX, TF: always)


@dataclass
class MeasureConfig:
    """One measurement window and how it is taken."""

    window_s: float = bounded(
        1.0, 0, 3600, "an hour: a longer window holds one setting for hours; take several with "
        "measure.repeats", above=True, unit=" s")  # the window lasts at least this (device time)
    min_iters: int = bounded(
        10, 1, MAX_ITERS, "a billion calls: longer than an hour's window of any kernel"
    )  # ... and at least this many kernel calls
    max_iters: int = bounded(
        1_000_000, 1, MAX_ITERS, "a billion calls: longer than an hour's window of any kernel"
    )  # stop after this many calls even if the window is short
    warmup_iters: int = bounded(
        3, 0, 100_000, "warm-up is a few calls (the compile happens at build); 100,000 is "
        "minutes even of a small kernel")  # calls before the window
    settle_s: float = bounded(
        0.5, 0, 600, "ten minutes: a GPU's temperature settles within a few", unit=" s"
    )  # idle time after applying settings, before warm-up
    repeats: int = bounded(
        1, 1, MAX_REPEATS, "a thousand windows per setting pin a mean far tighter than any GPU "
        "holds; more is a slip, such as ${now:%Y}, the year")  # independent windows per setting
    reference_samples: int = bounded(4, 0, MAX_REFERENCE_SAMPLES, "calls 1, 2, 4, ... 2**63 "
        "are compared with the reference")  # calls compared with the float64 reference (+ last)
    held_outputs_share: float = bounded(
        0.25, 0, 1, "a share of the device's free memory", above=True
    )  # of the free device memory a trial's sampled outputs may hold: fewer past it (row says)
    held_outputs_gib: Optional[float] = bounded(
        None, 0, 1024, "no GPU holds a TiB", above=True, unit=" GiB"
    )  # ... and at most this many GiB (None: the share alone)
    # where calls are fingerprinted: "after" (a check run right after a bare timed window),
    # "inline" (the timed calls themselves, on the device), "host" (copy + hash per call: debug)
    digest: str = "after"
    check_iters: Optional[int] = bounded(
        None, 1, MAX_ITERS, "a billion calls, and never more than measure.max_iters"
    )  # calls in the check run (digest=after); None: as many as the window made
    counter_edge_wait_s: float = bounded(
        0.5, 0, 60, "counters update every 1 to 100 ms: a minute is waiting on a counter that "
        "does not move", unit=" s")  # longest wait for an energy-counter update at each end
    meter: str = "auto"  # auto (counter where the device has one), counter, polling
    poll_hz: float = bounded(
        20.0, 0, 1000, "NVML's power reading changes at most every millisecond or so; faster "
        "polling reads the same value", above=True, unit=" Hz")  # polling meter's rate
    min_counter_updates: int = bounded(
        10, 0, 1_000_000, "an hour's window at a 1 ms counter period holds 3.6 million; a "
        "million asks more of any shorter one than it holds")  # fewer in a window: invalid
    clock_tolerance_mhz: float = bounded(
        30.0, 0, MAX_CLOCK_MHZ, "no GPU clock reaches 5 GHz", unit=" MHz"
    )  # observed SM clock this far below the asked one: invalid
    # thermal start (orchestrator/measuring/thermal.py): none (as the board comes: the default, so a
    # trial costs its window), drift (warm until the die holds), cooldown (idle until it is this
    # cool)
    steady_start: str = "none"
    steady_drift_c: float = bounded(
        1.0, 0, 50, "a die that moves 50 C is not steady", unit=" C"
    )  # drift: steady when the temperature moved at most this ...
    steady_interval_s: float = bounded(
        20.0, 0, 600, "ten minutes: a GPU's temperature settles within a few", above=True,
        unit=" s")  # ... over the last this long of load (NVML reports whole degrees)
    cooldown_c: float = bounded(
        45.0, 0, 120, "no GPU runs at 120 C; its slowdown is near 90", unit=" C"
    )  # cooldown: idle until the die is at or below this
    steady_timeout_s: float = bounded(
        300.0, 0, 3600, "an hour: a board that has not settled by then will not", unit=" s"
    )  # longest drift or cooldown wait; past it the trial runs, its row says so
    timeout_s: float = bounded(
        600.0, 0, 86_400, "a day: a trial that takes longer has hung", above=True, unit=" s"
    )  # a trial past this is killed and recorded as `timeout`


@dataclass
class DvfsConfig:
    """One trial (a point of a sweep)."""

    device: DeviceConfig = field(default_factory=DeviceConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    framework: FrameworkConfig = field(default_factory=FrameworkConfig)
    measure: MeasureConfig = field(default_factory=MeasureConfig)
    seed: int = bounded(0, 0, MAX_SEED, "a 32-bit seed")  # seed of the kernel's random inputs
    objective: str = "energy_per_work"  # what the task returns to a sweeper: see OBJECTIVES
    store_dir: Optional[str] = None  # where results go; default: the sweep (or run) directory
    quiet: bool = False  # no per-trial summary on stdout


WORKLOAD_ENTRY_POINTS = "dvfs.workloads"
"""``kernels.registry.ENTRY_POINT_GROUP``, named here so that composing a config (``dvfs
devices`` too) reads the installed entry points without importing the kernels package."""


def register_entry_point_workloads(cs: ConfigStore) -> None:
    """A ``workload/<name>`` config for each installed ``dvfs.workloads`` entry point, so that
    ``workload=<name>`` composes like a built-in (nothing of it is imported until validation)."""
    from importlib.metadata import entry_points

    for name in {ep.name for ep in entry_points(group=WORKLOAD_ENTRY_POINTS)}:
        if name not in ("custom", "workload_schema"):
            cs.store(group="workload", name=name, node=WorkloadConfig(name=name))


def register_configs() -> None:
    """Register the schemas in Hydra's ConfigStore (idempotent)."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(name="dvfs_schema", node=DvfsConfig)
    cs.store(group="device", name="device_schema", node=DeviceConfig)
    cs.store(group="workload", name="workload_schema", node=WorkloadConfig)
    register_entry_point_workloads(cs)
    cs.store(group="framework", name="framework_schema", node=FrameworkConfig)
    cs.store(group="measure", name="measure_schema", node=MeasureConfig)


def check_choice(what: str, value: Any, allowed: tuple[str, ...]) -> None:
    """A one-line UserError naming the allowed values."""
    if value not in allowed:
        raise UserError(f"{what}={value!r} is not one of: {', '.join(allowed)}")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _finite(value: Any) -> bool:
    """``math.isfinite`` that takes any int (``math.isfinite(10**400)`` overflows)."""
    return isinstance(value, int) or math.isfinite(value)


def _whole_mhz(value: Any, shown: Any) -> int:
    if not _finite(value) or value != int(value):
        raise UserError(f"device.sm_clock_mhz={shown} must be a whole number of MHz")
    return int(value)


def parse_sm_clock(value: Any) -> tuple[int, int] | None:
    """``device.sm_clock_mhz``: None, one value, or a [min, max] pair -> (min, max)."""
    if value is None:
        return None
    if _is_number(value):
        return _whole_mhz(value, value), _whole_mhz(value, value)
    if isinstance(value, (str, bytes, Mapping)):
        items = []
    else:
        try:
            items = list(value)
        except TypeError:
            items = []
    if len(items) == 2 and all(_is_number(v) for v in items):
        shown = f"[{items[0]}, {items[1]}]"
        return _whole_mhz(items[0], shown), _whole_mhz(items[1], shown)
    raise UserError(
        f"device.sm_clock_mhz={_show(value)} must be a clock in MHz or a [min, max] pair"
    )


def _show(value: Any) -> str:
    """A value for a one-line message: plain containers, newlines escaped, long ones cut."""
    if hasattr(value, "_content"):  # an OmegaConf node
        from omegaconf import OmegaConf

        value = OmegaConf.to_container(value, resolve=False)
    text = repr(value)  # escapes newlines
    return text if len(text) <= 80 else text[:77] + "..."


def _check_gpus(gpus: Any) -> None:
    """``device.gpus``: None or a list of NVML indices (>= 0), UUIDs or PCI bus ids."""
    if gpus is None:
        return
    if isinstance(gpus, (str, bytes, Mapping)) or not hasattr(gpus, "__iter__"):
        raise UserError(f"device.gpus={_show(gpus)} must be a list, e.g. [0, 1] or [GPU-...]")
    for g in gpus:
        if isinstance(g, str) and g.strip():
            continue
        if isinstance(g, int) and not isinstance(g, bool) and g >= 0:
            continue
        raise UserError(
            f"device.gpus={_show(gpus)}: {_show(g)} is neither an NVML index (0, 1, ...) "
            "nor a UUID or PCI bus id"
        )


def _check_planted(planted: Any) -> None:
    """``device.planted_thresholds``: {gpu index or UUID: {kernel class or "*": MHz}}."""
    if planted is None:
        return
    shape = 'must map a GPU index or UUID to {kernel class or "*": MHz}, e.g. {0: {gemm: 1065}}'
    if not isinstance(planted, Mapping) and not hasattr(planted, "items"):
        raise UserError(f"device.planted_thresholds={_show(planted)} {shape}")
    for gpu, per_class in planted.items():
        if not hasattr(per_class, "items"):
            raise UserError(f"device.planted_thresholds={_show(planted)} {shape}")
        for cls, mhz in per_class.items():
            if not SM_CLOCK_BOUND.admits(mhz) or mhz != int(mhz):
                raise UserError(
                    f"device.planted_thresholds: GPU {gpu}, class {cls}: {_show(mhz)} "
                    "is not a clock in MHz"
                )


def _resolve_all(cfg: DvfsConfig) -> None:
    """Resolve every interpolation once, so a bad ``${...}`` is a UserError here, not later."""
    if not hasattr(cfg, "_get_node"):
        return  # a DvfsConfig instance: nothing to resolve
    from omegaconf import OmegaConf

    try:
        OmegaConf.to_container(cfg, resolve=True)
    except Exception as e:  # noqa: BLE001 - converted or re-raised
        err = hydra_user_error(e)
        if err is None:
            raise
        raise err from e


def _check_known_keys(cfg: DvfsConfig) -> None:
    """Refuse keys no schema has (Hydra's ``+key=value`` adds them even to a structured config)."""
    import dataclasses

    if not hasattr(cfg, "keys"):
        return  # a DvfsConfig instance has only its own fields
    groups = {"": DvfsConfig, "device": DeviceConfig, "workload": WorkloadConfig,
              "framework": FrameworkConfig, "measure": MeasureConfig}
    for group, schema in groups.items():
        node = cfg.get(group) if group else cfg
        if not hasattr(node, "keys"):
            continue
        known = [f.name for f in dataclasses.fields(schema)]
        unknown = sorted(str(k) for k in node.keys() if k not in known)
        if unknown:
            where = f"{group}." if group else ""
            raise UserError(
                f"unknown setting {where}{unknown[0]} (a + override adds keys nothing reads); "
                f"{group or 'the top level'} has: {', '.join(known)}"
            )


def validate_static(cfg: DvfsConfig) -> None:
    """Checks that need no device: choices, signs, counts. Raises UserError with one line.

    Args:
        cfg: a job's config: as Hydra composed it (a DictConfig the schema types, whose
            interpolations and unknown keys are checked too) or a ``DvfsConfig``.
    """
    _resolve_all(cfg)
    _check_known_keys(cfg)
    d, m = cfg.device, cfg.measure
    check_choice("device.backend", d.backend, BACKENDS)
    check_choice("measure.meter", m.meter, METERS)
    check_choice("measure.digest", m.digest, DIGESTS)
    check_choice("measure.steady_start", m.steady_start, STEADY_STARTS)
    check_choice("objective", cfg.objective, OBJECTIVES)
    _check_bounds(cfg)
    _check_paths(cfg)
    _check_measure_counts(m)
    _check_sm_clock(d.sm_clock_mhz)
    _check_gpus(d.gpus)
    _check_planted(d.planted_thresholds)
    if d.backend in ("cpu", "tpu"):
        _check_observed(d, m, cfg.framework.name)
    _check_command(cfg.workload, m)


def _check_bounds(cfg: DvfsConfig) -> None:
    """Every bounded field of every section is in its range (``orchestrator.bounds``)."""
    check_fields("", cfg, DvfsConfig)
    check_fields("device.", cfg.device, DeviceConfig)
    check_fields("measure.", cfg.measure, MeasureConfig)
    check_fields("workload.", cfg.workload, WorkloadConfig)


PATH_KEYS = ("store_dir", "device.journal_dir", "device.policy_file", "device.state_dir",
             "device.powercap_root")
"""The keys whose value is a file or directory (relative: to where the command was started)."""

OPTION_GROUPS = ("device", "workload", "framework", "measure", "experiment")
"""The config groups whose option names a path key's value is checked against."""


@functools.cache
def group_options() -> dict[str, str]:
    """Each option name of ``conf/``'s groups -> its group (``quick`` -> ``measure``)."""
    found: dict[str, str] = {}
    for group in OPTION_GROUPS:
        for path in sorted((CONF_DIR / group).glob("*.yaml")):
            found.setdefault(path.stem, group)
    return found


def _check_paths(cfg: DvfsConfig) -> None:
    """A path key holds a path: not a boolean, not empty, not a config group's option name.

    ``store_dir=true`` made a directory named ``True`` and wrote the results there; ``store_dir=
    quick`` one named ``quick`` (``measure=quick`` was meant). A name like that is refused; as
    ``./quick`` it is a directory of that name.
    """
    for key in PATH_KEYS:
        node = cfg
        for part in key.split("."):
            node = node.get(part) if hasattr(node, "get") else getattr(node, part)
        if node is None:
            continue
        value = str(node)
        if not value.strip():
            raise UserError(f"{key}={value!r} is empty: give a path, or null for the default")
        if value.lower() in ("true", "false"):
            raise UserError(f"{key}={value} is a boolean, not a path: give a path, or null for "
                            "the default")
        group = group_options().get(value)
        if group is not None:
            raise UserError(f"{key}={value} names the option {group}={value}, not a path: did you "
                            f"mean {group}={value}? (./{value} is a path of that name)")


SM_CLOCK_BOUND = Bound(1, MAX_CLOCK_MHZ, "no GPU clock reaches 5 GHz; the GPU's own supported "
                       "clocks are checked before any setting", unit=" MHz")


def _check_sm_clock(value: Any) -> None:
    """``device.sm_clock_mhz``: each end in range, the lower end first."""
    lock = parse_sm_clock(value)
    for end in lock or ():
        SM_CLOCK_BOUND.check("device.sm_clock_mhz", end)
    if lock is not None and lock[0] > lock[1]:
        raise UserError(f"device.sm_clock_mhz=[{lock[0]}, {lock[1]}]: the lower clock comes "
                        "first, [min, max]")


COMMAND = "command"
"""``workload.name`` of a user's own program run as a trial (``orchestrator.measuring.command``)."""


def _check_command(w: WorkloadConfig, m: MeasureConfig) -> None:
    """``workload=command``'s limit leaves the trial room for its reference run; the other
    workloads take no ``argv`` (a job checks that a program's ``argv`` is there and starts:
    ``jobs.checks``, as a custom workload's target is checked there)."""
    if w.name != COMMAND:
        if w.argv:
            raise UserError(f"workload.argv is for workload=command, not workload={w.name}")
        return
    if 2 * w.timeout_s > m.timeout_s:
        raise UserError(
            f"workload.timeout_s={w.timeout_s:g} must be at most half of measure.timeout_s="
            f"{m.timeout_s:g}: a trial runs the program at its setting and once at the default "
            "setting (its reference result)")


def _check_measure_counts(m: MeasureConfig) -> None:
    """The window's call counts agree with each other."""
    if m.check_iters is not None and m.check_iters > m.max_iters:
        raise UserError(
            f"measure.check_iters={m.check_iters} must be between 1 and "
            f"measure.max_iters={m.max_iters}"
        )
    if m.min_iters > m.max_iters:
        raise UserError(f"measure.min_iters={m.min_iters} is above measure.max_iters={m.max_iters}")


SETTINGS_KEYS = ("sm_clock_mhz", "mem_clock_mhz", "power_limit_w", "clock_offset_mhz")
"""The ``device`` keys a trial asks the device to be set to."""

PER_JOB_KEYS = (*SETTINGS_KEYS, "inject", "gpus")
"""The ``device`` keys that the jobs of one machine (one pool of workers, one simulated machine)
may differ in, and nothing else: what a trial sets, the fault it injects, which GPUs it runs on."""


def to_device_config(device: DeviceConfig | Mapping[str, Any]) -> DeviceConfig:
    """A ``device`` config as the schema's dataclass, converted once where it arrives untyped.

    Args:
        device: a ``DeviceConfig``; a DictConfig (typed by the schema, or not); or a plain
            mapping of some of its keys (a resolved job's ``device``, a Ray message, a test's).

    Raises:
        TypeError: a key the schema does not have.
    """
    if isinstance(device, DeviceConfig):
        return device
    from omegaconf import DictConfig, OmegaConf

    if isinstance(device, DictConfig):
        if OmegaConf.get_type(device) is DeviceConfig:
            typed = OmegaConf.to_object(device)
            assert isinstance(typed, DeviceConfig)
            return typed
        device = OmegaConf.to_container(device, resolve=True)  # type: ignore[assignment]
    return DeviceConfig(**device)


def _check_observed(d: DeviceConfig, m: MeasureConfig, framework: str) -> None:
    """``device=cpu`` and ``device=tpu`` set nothing and have no power sensor to poll; a TPU
    runs JAX only."""
    what = {"cpu": "the host CPU", "tpu": "the TPU chip"}[d.backend]
    asked = [
        f"device.{k}={_show(getattr(d, k))}" for k in SETTINGS_KEYS if getattr(d, k) is not None
    ]
    if asked:
        raise UserError(
            f"device={d.backend} has no settings to change: {', '.join(asked)} ({what} is "
            f"measured as it runs; drop the setting or use device=nvml or device=sim)"
        )
    if m.meter == "polling":
        source = "the RAPL counter" if d.backend == "cpu" else "nowhere: a TPU reports no watts"
        raise UserError(
            f"measure.meter=polling needs a power sensor, and device={d.backend} has none (its "
            f"energy comes from {source}): use measure.meter=auto"
        )
    if d.backend == "tpu" and framework != "jax":
        raise UserError(
            f"device=tpu runs JAX only: framework={framework} needs its own TPU build, which "
            "this project does not drive; use framework=jax"
        )


def compose(overrides: list[str] | None = None, config_name: str = "config") -> DvfsConfig:
    """Compose ``conf/`` with overrides, as ``dvfs sweep`` would (for the non-Hydra commands).

    Returns:
        The composed config: a DictConfig that the schema (``DvfsConfig``) types.

    Raises:
        UserError: a typo in a key, an unknown group option, a value of the wrong type.
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    register_configs()
    if GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return hydra_compose(config_name=config_name, overrides=list(overrides or []))
    except Exception as e:  # noqa: BLE001 - converted or re-raised below
        err = hydra_user_error(e)
        if err is None:
            raise
        raise err from e
