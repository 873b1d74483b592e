"""Simulated GPU profiles: datasheet values, loaded from ``conf/device/profile/<name>.yaml``.

A ``GpuProfile`` is everything the GPU model (``model.py``) and the simulated NVML (``nvml.py``)
need to know about one kind of board: how NVML names it, which clocks and power limits it
supports, its compute roofs and memory bandwidth, the power-model coefficients, its
voltage-frequency curve and its thermal constants. Each YAML file names its sources and which
numbers are estimates.

Units are in the names: MHz for clocks, W for power, TFLOP/s for peak rates, GB/s (1e9 bytes/s)
for bandwidth, V for voltages, degrees C, C/W and s for the thermal model.

Profiles are parsed once per process and cached (``load_profile`` is called on every simulated
NVML call).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.devices.base import Peak

ARCHITECTURES = ("kepler", "maxwell", "pascal", "volta", "turing", "ampere", "ada", "hopper")
OPERANDS = ("fp32", "tf32", "bf16", "fp16", "fp8")
"""Operand types whose matrix work has its own achieved rate (``achieved.matmul_<operand>``)
and its own energy per operation (``power_w.alu_<operand>``): FP32 on the CUDA cores, TF32,
BF16, FP16 and FP8 on the tensor cores. A profile that gives neither uses ``matmul`` and
``alu`` for every operand type."""


class ProfileError(ValueError):
    """A profile is missing, unknown or malformed (the message names the file and the key)."""


@dataclass(frozen=True)
class PowerCoefficients:
    """The power model's terms (the ``power_w:`` section of a profile), in W; see ``model.py``.

    Every term but ``idle`` is the term's value at f_max and V_max (and, for the traffic terms,
    at the board's full memory bandwidth, for ``alu`` at full compute utilisation).

    The arithmetic units' power depends on the operand type: ``alu_<operand>`` (``OPERANDS``) is
    the ALU term at that operand's full peak rate, so its energy per operation at f_max and V_max
    is ``alu_<operand> / peak_<operand>``; an operand without its own term draws ``alu``.
    """

    idle: float  # bare idle: no context, idle clock, v_min (leakage at v_min included)
    context: float  # a kernel resident: SMs awake, a CUDA context active, whatever the clock
    clock: float  # clock tree, warp schedulers, L2/NoC clocking: f·V², not ALU-bound
    leakage: float  # static power at v_max and the reference temperature (rises with V and T)
    alu: float  # the arithmetic units at the full peak FLOP rate
    l2: float  # L2 and crossbar traffic at full bandwidth (core voltage domain: scales with V²)
    hbm: float  # HBM and its PHY at full bandwidth (memory domain: no core-voltage term)
    sm: float = 0.0  # SM issue and data paths while the compute roof is busy, whatever its rate
    alu_fp32: float | None = None  # the arithmetic units at the full FP32 (CUDA-core) rate
    alu_tf32: float | None = None  # ... at the full TF32 tensor-core rate
    alu_bf16: float | None = None  # ... at the full BF16 tensor-core rate
    alu_fp16: float | None = None  # ... at the full FP16 tensor-core rate
    alu_fp8: float | None = None  # ... at the full FP8 tensor-core rate (Hopper)

    def alu_of(self, peak: str | None) -> float:
        """The ALU term at the full rate of an operand type (``alu`` where it has none)."""
        own = getattr(self, f"alu_{peak}", None) if peak else None
        return self.alu if own is None else float(own)


@dataclass(frozen=True)
class PowerSensor:
    """How one of NVML's power readings is made on a board (Yang et al., SC'24; NVML's docs).

    The reading is the mean power over the last ``window_s`` before its latest update, and it
    updates every ``period_s``: an "instant" reading has a short window (~25 ms on GA100 and
    Hopper's ``NVML_FI_DEV_POWER_INSTANT``, 10 ms on Volta), a "1 s average" (Hopper's and
    non-GA100 Ampere's ``nvmlDeviceGetPowerUsage``) has ``window_s`` = 1.
    """

    period_s: float  # the reading updates this often
    window_s: float  # ... to the mean power over this long before the update


@dataclass(frozen=True)
class Sensors:
    """What a board's NVML measures, and how (the ``sensors:`` section of a profile).

    ``power_instant`` and ``power_average`` are ``nvmlDeviceGetFieldValues``'s
    ``NVML_FI_DEV_POWER_INSTANT`` and ``NVML_FI_DEV_POWER_AVERAGE``; None: the board answers
    ``NVML_ERROR_NOT_SUPPORTED`` for that field.
    """

    power_usage: PowerSensor  # nvmlDeviceGetPowerUsage
    power_instant: PowerSensor | None
    power_average: PowerSensor | None
    energy_counter_period_s: float  # nvmlDeviceGetTotalEnergyConsumption updates this often
    power_cap_filter_s: float  # the power-cap controller acts on power filtered over this long


@dataclass(frozen=True)
class Achieved:
    """What real kernels reach of the board's roofs (the ``achieved:`` section of a profile).

    A datasheet roof is never reached: cuBLAS's large GEMM runs at ~0.8 of the tensor-core peak,
    a convolution as the frameworks lower it far less, a streaming kernel at 0.7-0.9 of the HBM
    bandwidth. Each figure is a fraction of its roof at the clock the call runs at; each belongs
    to a kind of work (``KernelWork.kind``), never to a workload. Without the section a profile
    reaches every roof (the model before real measurements).
    """

    matmul: float = 1.0  # matrix products, of the tensor-core (or fp32) peak
    matmul_fp32: float | None = None  # FP32 matrix products on the CUDA cores (None: matmul)
    matmul_tf32: float | None = None  # TF32 on the tensor cores (None: matmul)
    matmul_bf16: float | None = None  # BF16 (None: matmul)
    matmul_fp16: float | None = None  # FP16 (None: matmul)
    matmul_fp8: float | None = None  # FP8 (None: matmul)
    conv: float = 1.0  # convolutions as XLA and cuDNN run them, of the same peak
    elementwise: float = 1.0  # other arithmetic, of the ALU peak
    memory: float = 1.0  # of the memory bandwidth, for the bytes a call moves
    transcendental_flops: float = 1.0  # ALU FLOPs one exp, log or tanh costs (XLA counts one)
    launch_overhead_s: float = 5e-6  # fixed time per kernel launched: dispatch, fill and tail

    def of(self, kind: str, peak: str | None = None) -> float:
        """The fraction of the compute roof a kind of work reaches (matrix work: for its operand
        type ``peak`` where the profile gives one, else ``matmul``)."""
        if kind == "matmul" and peak:
            own = getattr(self, f"matmul_{peak}", None)
            if own is not None:
                return float(own)
        return float(getattr(self, kind))


@dataclass(frozen=True)
class GpuProfile:
    """One kind of simulated GPU. Clock tuples are ascending; peaks are dense TFLOP/s.

    Hashes by ``key`` only (cheap: the model memoises operating points on the profile).
    """

    key: str  # profile file stem, e.g. "a100_sxm4_40gb"
    name: str  # as nvmlDeviceGetName reports it, e.g. "NVIDIA A100-SXM4-40GB"
    architecture: str  # "ampere", "hopper", "volta", "pascal"
    pci_device_id: int  # nvmlPciInfo_t.pciDeviceId (device << 16 | 0x10DE)
    sm_clocks_mhz: tuple[int, ...]  # supported SM clocks, ascending
    mem_clocks_mhz: tuple[int, ...]  # supported memory clocks, ascending
    power_limit_min_w: float  # lowest settable power limit
    power_limit_default_w: float  # the board's default limit
    power_limit_max_w: float  # highest settable power limit
    has_energy_counter: bool  # nvmlDeviceGetTotalEnergyConsumption supported (Volta+)
    clock_offset_range_mhz: tuple[int, int] | None  # GPC VF offset (min, max); None: unsupported
    peak_fp64_tflops: float
    peak_fp32_tflops: float
    peak_tf32_tflops: float | None  # None: no such unit, the fp32 roof applies
    peak_bf16_tflops: float | None
    peak_fp16_tflops: float | None
    memory_bandwidth_gbs: float  # at the max memory clock
    power: PowerCoefficients  # the power model's terms
    v_min_v: float  # voltage below the knee of the V-f curve
    v_max_v: float  # voltage at the max SM clock
    vf_knee_mhz: float  # below this clock the voltage is flat at v_min
    ambient_c: float  # inlet temperature the die cools towards
    thermal_resistance_c_per_w: float  # steady-state rise per watt
    thermal_time_constant_s: float  # first-order lag of the die temperature
    slowdown_temp_c: float  # above this the clock is slowed (HW thermal slowdown)
    sensors: Sensors  # NVML's power and energy readings on this board
    achieved: Achieved = Achieved()  # what real kernels reach of the roofs
    power_cap_hold: float = 0.0  # the power controller holds this fraction under the limit
    peak_fp8_tflops: float | None = None  # dense FP8 tensor-core rate (Hopper); None: no FP8
    provenance: dict[str, str] = dataclasses.field(default_factory=dict, compare=False)
    # term -> where its value comes from (the ``provenance:`` section; see ``PROVENANCE_KINDS``)

    @property
    def launch_overhead_s(self) -> float:
        """Fixed time per kernel launched (``achieved.launch_overhead_s``)."""
        return self.achieved.launch_overhead_s

    def __hash__(self) -> int:
        return hash(self.key)

    @property
    def idle_power_w(self) -> float:
        """Board power with nothing running (``power.idle``)."""
        return self.power.idle

    @property
    def energy_counter_period_s(self) -> float:
        """How often the energy counter updates (``sensors.energy_counter_period_s``)."""
        return self.sensors.energy_counter_period_s

    @property
    def f_min_mhz(self) -> int:
        """The lowest supported SM clock."""
        return self.sm_clocks_mhz[0]

    @property
    def f_max_mhz(self) -> int:
        """The highest supported SM clock (the boost clock)."""
        return self.sm_clocks_mhz[-1]

    @property
    def mem_max_mhz(self) -> int:
        """The highest supported memory clock (the one the board runs at by default)."""
        return self.mem_clocks_mhz[-1]

    @property
    def clock_step_mhz(self) -> float:
        """The mean spacing of the SM clock table (15 MHz on A100/H100, 7.5 on V100)."""
        clocks = self.sm_clocks_mhz
        return (clocks[-1] - clocks[0]) / max(1, len(clocks) - 1)

    def peak_tflops(self, peak: Peak) -> float:
        """The compute roof for a precision; a unit the board lacks falls back to fp32 (FP8 to
        FP16 first: a board without FP8 units runs it in FP16)."""
        value = getattr(self, f"peak_{peak}_tflops", None)
        if value is None and peak == "fp8":
            return self.peak_tflops("fp16")
        return self.peak_fp32_tflops if value is None else float(value)


def conf_dir() -> Path:
    """The package's configs (``orchestrator.config.CONF_DIR``: the checkout's ``conf/``, or the
    copy a wheel carries).

    Raises:
        ProfileError: it does not exist (a copy of the package without its package data).
    """
    from orchestrator.config import CONF_DIR

    if not CONF_DIR.is_dir():
        raise ProfileError(
            f"the config directory {CONF_DIR} does not exist: the simulated GPU's profiles live "
            "in conf/device/profile/, which the package carries (reinstall dvfs-orchestrator)"
        )
    return CONF_DIR


def profile_dir() -> Path:
    """Where the profile YAML files live (``conf/device/profile``)."""
    return conf_dir() / "device" / "profile"


@functools.cache
def available_profiles() -> tuple[str, ...]:
    """The names of every profile shipped (file stems), sorted."""
    return tuple(sorted(p.stem for p in profile_dir().glob("*.yaml")))


def _clock_table(spec: Any, where: str) -> tuple[int, ...]:
    """Clocks from an explicit list or from ``{min, max, step}`` (NVML: ``floor(max - k*step)``)."""
    if isinstance(spec, dict):
        try:
            lo, hi, step = float(spec["min"]), float(spec["max"]), float(spec["step"])
        except KeyError as e:
            raise ProfileError(f"{where}: needs min, max and step (missing {e})") from None
        if not (0 < lo <= hi and step > 0):
            raise ProfileError(f"{where}: need 0 < min <= max and step > 0, got {spec}")
        clocks = {int(lo)}
        k = 0
        while (f := math.floor(hi - k * step + 1e-6)) >= lo:
            clocks.add(f)
            k += 1
        return tuple(sorted(clocks))
    if isinstance(spec, list) and spec and all(isinstance(c, int) and c > 0 for c in spec):
        return tuple(sorted(set(spec)))
    raise ProfileError(f"{where}: expected a list of MHz or {{min, max, step}}, got {spec!r}")


def _power_coefficients(raw: Any, where: str) -> PowerCoefficients:
    names = [f.name for f in dataclasses.fields(PowerCoefficients)]
    if not isinstance(raw, dict):
        raise ProfileError(f"{where}: expected a mapping of the terms {', '.join(names)}")
    optional = {"sm"} | {f"alu_{o}" for o in OPERANDS}  # sm: 0 W; alu_<operand>: alu
    missing = [n for n in names if n not in raw and n not in optional]
    unknown = sorted(set(raw) - set(names))
    if missing or unknown:
        said = [f"missing {', '.join(missing)}"] if missing else []
        said += [f"unknown {', '.join(map(str, unknown))}"] if unknown else []
        raise ProfileError(f"{where}: {'; '.join(said)} (the terms: {', '.join(names)})")
    coefficients = PowerCoefficients(**{n: float(raw[n]) for n in names
                                         if raw.get(n) is not None})
    negative = [n for n in names if getattr(coefficients, n) is not None
                and not getattr(coefficients, n) >= 0]
    if negative:
        raise ProfileError(f"{where}: terms must be 0 W or more: {', '.join(negative)}")
    return coefficients


def _power_sensor(spec: Any, where: str) -> PowerSensor | None:
    if spec is None:
        return None
    if not isinstance(spec, dict) or set(spec) != {"period_s", "window_s"}:
        raise ProfileError(f"{where}: expected {{period_s, window_s}} or null, got {spec!r}")
    sensor = PowerSensor(float(spec["period_s"]), float(spec["window_s"]))
    if not (sensor.period_s > 0 and sensor.window_s > 0):
        raise ProfileError(f"{where}: period_s and window_s must be positive, got {spec!r}")
    return sensor


def _sensors(raw: Any, where: str) -> Sensors:
    if not isinstance(raw, dict):
        raise ProfileError(f"{where}: expected a mapping, got {raw!r}")
    usage = _power_sensor(raw["power_usage"], f"{where}.power_usage")
    if usage is None:
        raise ProfileError(f"{where}.power_usage: every board reads its power (not null)")
    sensors = Sensors(
        power_usage=usage,
        power_instant=_power_sensor(raw.get("power_instant"), f"{where}.power_instant"),
        power_average=_power_sensor(raw.get("power_average"), f"{where}.power_average"),
        energy_counter_period_s=float(raw["energy_counter_period_s"]),
        power_cap_filter_s=float(raw["power_cap_filter_s"]),
    )
    if not sensors.energy_counter_period_s >= 0:
        raise ProfileError(f"{where}.energy_counter_period_s must be 0 or more")
    if not sensors.power_cap_filter_s >= 0:
        raise ProfileError(f"{where}.power_cap_filter_s must be 0 or more")
    return sensors


def _achieved(raw: Any, where: str) -> Achieved:
    if raw is None:
        return Achieved()
    names = [f.name for f in dataclasses.fields(Achieved)]
    if not isinstance(raw, dict) or set(raw) - set(names):
        unknown = sorted(set(raw) - set(names)) if isinstance(raw, dict) else raw
        raise ProfileError(f"{where}: unknown {unknown!r} (the terms: {', '.join(names)})")
    achieved = Achieved(**{n: float(v) for n, v in raw.items() if v is not None})
    fractions = [n for n in ("matmul", "conv", "elementwise", "memory",
                             *(f"matmul_{o}" for o in OPERANDS))
                 if getattr(achieved, n) is not None and not 0 < getattr(achieved, n) <= 1]
    if fractions:
        raise ProfileError(f"{where}: {', '.join(fractions)} must be a fraction in (0, 1]")
    if not (achieved.transcendental_flops >= 1 and achieved.launch_overhead_s >= 0):
        raise ProfileError(f"{where}: transcendental_flops must be 1 or more and "
                           "launch_overhead_s 0 or more")
    return achieved


PROVENANCE_KINDS = ("measured", "published", "carried", "fitted", "estimate")
"""Where a profile term's value comes from, the first word of its ``provenance:`` entry:
``measured`` (fitted to real rows of this board), ``published`` (a figure published for this
board), ``carried`` (carried over from another board's fit, saying why it transfers),
``fitted`` (fitted by ``dvfs calibrate`` to a user's rows), ``estimate`` (no figure)."""


def _provenance(raw: Any, where: str) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ProfileError(f"{where}: expected a mapping of term -> where its value comes from")
    out = {str(k): str(v) for k, v in raw.items()}
    bad = sorted(k for k, v in out.items() if v.split(":")[0].strip() not in PROVENANCE_KINDS)
    if bad:
        raise ProfileError(f"{where}: {', '.join(bad)}: each entry starts with one of "
                           f"{', '.join(PROVENANCE_KINDS)} and a colon")
    return out


def parse_profile(key: str, raw: dict[str, Any], where: str = "<profile>") -> GpuProfile:
    """Build a profile from a YAML mapping (the layout of ``conf/device/profile/*.yaml``).

    Raises:
        ProfileError: a key is missing or a value is out of range (names the key).
    """
    try:
        peaks = raw["peak_tflops"]
        power = raw["power_w"]
        limits = raw["power_limit_w"]
        vf = raw["vf_curve"]
        thermal = raw["thermal"]
        offsets = raw.get("clock_offset_range_mhz")
        arch = str(raw["architecture"])
        if arch not in ARCHITECTURES:
            raise ProfileError(f"{where}: architecture {arch!r} is not one of {ARCHITECTURES}")
        profile = GpuProfile(
            key=key,
            name=str(raw["name"]),
            architecture=arch,
            pci_device_id=int(raw["pci_device_id"]),
            sm_clocks_mhz=_clock_table(raw["sm_clocks_mhz"], f"{where}: sm_clocks_mhz"),
            mem_clocks_mhz=_clock_table(raw["mem_clocks_mhz"], f"{where}: mem_clocks_mhz"),
            power_limit_min_w=float(limits["min"]),
            power_limit_default_w=float(limits["default"]),
            power_limit_max_w=float(limits["max"]),
            has_energy_counter=bool(raw["has_energy_counter"]),
            clock_offset_range_mhz=None if offsets is None else (int(offsets[0]), int(offsets[1])),
            peak_fp64_tflops=float(peaks["fp64"]),
            peak_fp32_tflops=float(peaks["fp32"]),
            peak_tf32_tflops=None if peaks.get("tf32") is None else float(peaks["tf32"]),
            peak_bf16_tflops=None if peaks.get("bf16") is None else float(peaks["bf16"]),
            peak_fp16_tflops=None if peaks.get("fp16") is None else float(peaks["fp16"]),
            memory_bandwidth_gbs=float(raw["memory_bandwidth_gbs"]),
            power=_power_coefficients(power, f"{where}: power_w"),
            v_min_v=float(vf["v_min"]),
            v_max_v=float(vf["v_max"]),
            vf_knee_mhz=float(vf["knee_mhz"]),
            ambient_c=float(thermal["ambient_c"]),
            thermal_resistance_c_per_w=float(thermal["resistance_c_per_w"]),
            thermal_time_constant_s=float(thermal["time_constant_s"]),
            slowdown_temp_c=float(thermal["slowdown_c"]),
            sensors=_sensors(raw["sensors"], f"{where}: sensors"),
            achieved=_achieved(raw.get("achieved"), f"{where}: achieved"),
            power_cap_hold=float(limits.get("hold_below", 0.0)),
            peak_fp8_tflops=None if peaks.get("fp8") is None else float(peaks["fp8"]),
            provenance=_provenance(raw.get("provenance"), f"{where}: provenance"),
        )
    except KeyError as e:
        raise ProfileError(f"{where}: missing key {e}") from None
    except (TypeError, ValueError) as e:
        if isinstance(e, ProfileError):
            raise
        raise ProfileError(f"{where}: {e}") from None
    _check_ranges(profile, where)
    return profile


def _check_ranges(profile: GpuProfile, where: str) -> None:
    """What a parsed profile must hold across its values (ordered limits, a sane V-f curve)."""
    if not (
        profile.power_limit_min_w <= profile.power_limit_default_w <= profile.power_limit_max_w
    ):
        raise ProfileError(f"{where}: power_limit_w needs min <= default <= max")
    if not 0 <= profile.power_cap_hold < 0.2:
        raise ProfileError(f"{where}: power_limit_w.hold_below is a fraction in [0, 0.2)")
    if not 0 < profile.v_min_v <= profile.v_max_v:
        raise ProfileError(f"{where}: vf_curve needs 0 < v_min <= v_max")
    if profile.clock_offset_range_mhz is not None:
        lo, hi = profile.clock_offset_range_mhz
        if not lo <= 0 <= hi:
            raise ProfileError(
                f"{where}: clock_offset_range_mhz must contain 0, got {[lo, hi]}"
            )


def is_profile_file(name: str) -> bool:
    """Whether ``device.profile`` is a user's file (a path, or a .yaml name), not a shipped one."""
    return name.endswith((".yaml", ".yml")) or "/" in name or "\\" in name


def resolve_profile_name(name: str) -> str:
    """A shipped profile's name as it is; a user's file as an absolute path (every process of a
    sweep, whatever its working directory, then reads the same file)."""
    return str(Path(name).expanduser().resolve()) if is_profile_file(name) else name


@functools.cache
def load_profile(name: str) -> GpuProfile:
    """A shipped profile (``conf/device/profile/<name>.yaml``) or a user's own file, parsed once.

    ``name`` is a shipped profile's name, or the path of a YAML file with the same schema
    (``device.profile=/path/board.yaml``); a user's profile is keyed by its absolute path.

    Raises:
        ProfileError: no such profile or file (the message lists the shipped ones), a file that is
            not YAML, or a malformed profile (the message names the file and the key).
    """
    if is_profile_file(name):
        path = Path(name).expanduser().resolve()
        key = str(path)
        if not path.is_file():
            raise ProfileError(
                f"no such profile file {path}; a profile is a shipped name "
                f"({', '.join(available_profiles())}) or a YAML file with their schema"
            )
    else:
        path, key = profile_dir() / f"{name}.yaml", name
        if not path.is_file():
            raise ProfileError(
                f"no simulated GPU profile {name!r} (in {path.parent}); "
                f"available: {', '.join(available_profiles())}, or the path of your own YAML file"
            )
    import yaml  # lazily: only the sim needs it

    try:
        with path.open() as f:
            raw = yaml.safe_load(f)
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        at = f" (line {where.line + 1})" if where is not None else ""
        raise ProfileError(f"{path}: not valid YAML{at}: {getattr(e, 'problem', e)}") from None
    except OSError as e:
        raise ProfileError(f"{path}: cannot be read: {e.strerror or e}") from None
    if not isinstance(raw, dict):
        raise ProfileError(f"{path}: expected a mapping at the top level")
    return parse_profile(key, raw, str(path))
