"""Structured configs: the schema every YAML under ``conf/`` is checked against.

Each dataclass is registered in Hydra's ConfigStore under a ``*_schema`` name; the YAML files in
``conf/`` name their schema in their defaults list, so Hydra type-checks every value and refuses a
key that does not exist (a typo) before anything runs. Values that need a device to check
(supported clocks, power range) are checked by the guard's policy before the first setting is
changed.

Units are in the field names: ``*_mhz``, ``*_w``, ``*_s``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from orchestrator.errors import UserError

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
"""The top-level ``conf/`` directory (an editable install keeps it beside the packages)."""

BACKENDS = ("sim", "nvml")
METERS = ("auto", "counter", "polling")
OBJECTIVES = ("energy_per_work", "time_per_work", "edp", "ed2p")


@dataclass
class DeviceConfig:
    """Which GPUs, how to reach them, and the settings a trial asks for."""

    backend: str = "sim"  # "sim" (simulated NVML) or "nvml" (nvidia-ml-py on real GPUs)
    gpus: Optional[list[Any]] = None  # NVML indices or UUIDs to use; None: every GPU
    observe_only: bool = False  # change nothing; refuse any sweep that asks for a setting
    # --- settings a trial asks for (None: leave at the device's default) ---
    sm_clock_mhz: Any = None  # lock the SM clock: one value (min=max) or [min, max]
    mem_clock_mhz: Optional[int] = None  # lock the memory clock
    power_limit_w: Optional[float] = None  # power-management limit
    clock_offset_mhz: Optional[int] = None  # GPC clock offset
    # --- the guard ---
    journal_dir: Optional[str] = None  # where the restore journal lives (default: see journal_dir())
    policy_file: Optional[str] = None  # YAML/JSON of allowed ranges; None: the device's own ranges
    # --- the simulated GPU (backend=sim only) ---
    profile: str = "a100_sxm4_40gb"  # datasheet profile under conf/device/profile/
    count: int = 1  # how many simulated GPUs
    state_dir: Optional[str] = None  # the sim's on-disk state; default $DVFS_SIM_STATE_DIR or ~/.cache
    seed: int = 0  # silicon lottery: seeds UUIDs and stability thresholds
    privileged: bool = True  # false: setters fail with NVML_ERROR_NO_PERMISSION, as without root
    scenario: Optional[str] = None  # a ready fault scenario, e.g. "seed_claims"
    planted_thresholds: Any = None  # {gpu index or UUID: {kernel class or "*": MHz}}
    energy_update_period_s: float = 0.02  # the energy counter's update period (real: 20-100 ms)
    inject: Any = None  # tests and chaos only (sim): a fault to inject, see orchestrator/inject.py


@dataclass
class WorkloadConfig:
    """Which kernel, at which size."""

    name: str = "gemm"  # stencil, gemm, selu, conv3d, mlp_train, hessian
    size: str = "cpu"  # size preset the kernel really runs at: tiny, cpu, gpu
    dtype: str = "float32"  # input dtype: float32, bfloat16, ...
    sim_size: Optional[str] = "gpu"  # the size the simulated GPU models (None: the size above)


@dataclass
class FrameworkConfig:
    """Which framework builds the kernel, with which precision knobs."""

    name: str = "jax"  # jax or tensorflow
    precision: str = "default"  # matmul precision: default, highest, tf32, ...
    xla: bool = False  # TensorFlow only: compile the tf.function with XLA


@dataclass
class MeasureConfig:
    """One measurement window and how it is taken."""

    window_s: float = 1.0  # the window lasts at least this long (device time)
    min_iters: int = 10  # ... and at least this many kernel calls
    max_iters: int = 1_000_000  # stop after this many calls even if the window is short
    warmup_iters: int = 3  # calls before the window (the JIT compile happens at build)
    settle_s: float = 0.5  # idle time after applying settings, before warm-up
    repeats: int = 1  # independent windows per setting (a spread needs >= 3)
    reference_samples: int = 4  # calls compared with the float64 reference (plus the last)
    meter: str = "auto"  # auto (counter where the device has one), counter, polling
    poll_hz: float = 20.0  # power polling rate of the polling meter
    min_counter_updates: int = 10  # fewer energy-counter updates in a window: invalid
    clock_tolerance_mhz: float = 30.0  # observed SM clock this far below the asked one: invalid
    timeout_s: float = 600.0  # a trial past this is killed and recorded as `timeout`


@dataclass
class DvfsConfig:
    """One trial (a point of a sweep)."""

    device: DeviceConfig = field(default_factory=DeviceConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    framework: FrameworkConfig = field(default_factory=FrameworkConfig)
    measure: MeasureConfig = field(default_factory=MeasureConfig)
    seed: int = 0  # seed of the kernel's random inputs
    objective: str = "energy_per_work"  # what the task returns to a sweeper: see OBJECTIVES
    store_dir: Optional[str] = None  # where results go; default: the sweep (or run) directory
    quiet: bool = False  # no per-trial summary on stdout


def register_configs() -> None:
    """Register the schemas in Hydra's ConfigStore (idempotent)."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(name="dvfs_schema", node=DvfsConfig)
    cs.store(group="device", name="device_schema", node=DeviceConfig)
    cs.store(group="workload", name="workload_schema", node=WorkloadConfig)
    cs.store(group="framework", name="framework_schema", node=FrameworkConfig)
    cs.store(group="measure", name="measure_schema", node=MeasureConfig)


def check_choice(what: str, value: Any, allowed: tuple[str, ...]) -> None:
    """A one-line UserError naming the allowed values."""
    if value not in allowed:
        raise UserError(f"{what}={value!r} is not one of: {', '.join(allowed)}")


def parse_sm_clock(value: Any) -> tuple[int, int] | None:
    """``device.sm_clock_mhz``: None, one value, or a [min, max] pair -> (min, max)."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if value != int(value):
            raise UserError(f"device.sm_clock_mhz={value} must be a whole number of MHz")
        return int(value), int(value)
    try:
        items = list(value)
    except TypeError:
        items = []
    if len(items) == 2 and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in items):
        return int(items[0]), int(items[1])
    raise UserError(f"device.sm_clock_mhz={value!r} must be a clock in MHz or a [min, max] pair")


def validate_static(cfg: Any) -> None:
    """Checks that need no device: choices, signs, counts. Raises UserError with one line."""
    d, m = cfg.device, cfg.measure
    check_choice("device.backend", d.backend, BACKENDS)
    check_choice("measure.meter", m.meter, METERS)
    check_choice("objective", cfg.objective, OBJECTIVES)
    positive = {
        "measure.window_s": m.window_s,
        "measure.min_iters": m.min_iters,
        "measure.max_iters": m.max_iters,
        "measure.repeats": m.repeats,
        "measure.poll_hz": m.poll_hz,
        "measure.timeout_s": m.timeout_s,
        "device.count": d.count,
    }
    for key, value in positive.items():
        if value is None or value <= 0:
            raise UserError(f"{key}={value} must be greater than 0")
    non_negative = {
        "measure.warmup_iters": m.warmup_iters,
        "measure.settle_s": m.settle_s,
        "measure.reference_samples": m.reference_samples,
        "measure.min_counter_updates": m.min_counter_updates,
        "measure.clock_tolerance_mhz": m.clock_tolerance_mhz,
    }
    for key, value in non_negative.items():
        if value is None or value < 0:
            raise UserError(f"{key}={value} must be 0 or more")
    if m.min_iters > m.max_iters:
        raise UserError(f"measure.min_iters={m.min_iters} is above measure.max_iters={m.max_iters}")
    parse_sm_clock(d.sm_clock_mhz)
    if d.power_limit_w is not None and d.power_limit_w <= 0:
        raise UserError(f"device.power_limit_w={d.power_limit_w} must be greater than 0")


def one_line(message: str) -> str:
    """Hydra and OmegaConf write several lines (full_key, object_type...); keep what matters."""
    lines = [ln.strip() for ln in str(message).splitlines() if ln.strip()]
    keep = [ln for ln in lines if not ln.startswith(("object_type=", "Set the environment"))]
    return "; ".join(keep[:2]) if keep else str(message)


def hydra_user_error(e: BaseException) -> UserError | None:
    """Turn a Hydra/OmegaConf composition error into a one-line UserError (None: not one)."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    if isinstance(e, UserError):
        return e
    if isinstance(e, (HydraException, OmegaConfBaseException)):
        cause = e.__cause__ if isinstance(e.__cause__, OmegaConfBaseException) else None
        text = one_line(str(e))
        if cause is not None and one_line(str(cause)) not in text:
            text = f"{text}: {one_line(str(cause))}"
        return UserError(text)
    return None


def compose(overrides: list[str] | None = None, config_name: str = "config") -> Any:
    """Compose ``conf/`` with overrides, as ``dvfs sweep`` would (for the non-Hydra commands).

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
