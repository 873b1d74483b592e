"""The simulated GPU's physics: roofline time, power, power cap, thermal lag and faults.

Pure functions over a ``GpuProfile`` (no I/O, no state): the simulated NVML (``nvml.py``) calls
them with a GPU's current settings and stores what they return.

Time (roofline with a clock-scaled compute roof, at the rates real kernels reach)::

    t_c = (flops + (tau - 1) * transcendentals) / (peak * f/f_max * achieved[kind])
    t_m = bytes / (bw * mem_f/mem_f_max * achieved.memory)
    t   = max(t_c, t_m) + launches * launch_overhead        # one kernel: compute and memory overlap
    t   = t_c + t_m + launches * launch_overhead            # several: one after another

``achieved`` (the profile's section) is the fraction of each roof real kernels reach: a large
cuBLAS GEMM ~0.8 of the tensor-core peak, a convolution as XLA lowers it ~0.3, a stream ~0.75 of
the HBM bandwidth on the H200 this project measured. ``tau`` is the ALU FLOPs one transcendental
costs (XLA counts an exp as one). A call of several kernels (a training step: GEMMs, then
elementwise fusions) runs its compute-bound and its memory-bound kernels one after another; the
sum is the bound for work split between kernels that each meet one roof.

Compute and memory utilisation are each term divided by ``t``: the fraction of the call that roof
is busy at the rate it reaches; ``flop_rate`` is ``compute_util * achieved[kind]``, the fraction
of the clock's peak FLOP rate the call sustains. The SMs' issue and data paths draw with the busy
fraction, the arithmetic units with the FLOP rate: the real H200 drew 669 W at 1869 MHz on a
convolution at 0.24 of the tensor-core peak, 675 W at 1578 MHz on a GEMM at 0.83. Power while a
kernel is resident, with ``f`` and ``V`` relative to f_max and V_max, ``traffic`` the memory
roof's busy fraction at the memory clock::

    P = idle + leakage * (V * 2^((T - 60 C) / 40 C) - V_min)  # static: rises with V and T
      + context                                           # SMs awake, a context resident
      + clock * f * V^2                                   # clock tree, schedulers, L2/NoC clocks
      + sm * compute_util * f * V^2                       # SM issue, registers, shared memory
      + alu[operand] * flop_rate * f * V^2                # the arithmetic units
      + l2 * traffic * V^2 + hbm * traffic                # L2/crossbar (core V), HBM + PHY

``T`` is the die temperature: a simulated GPU's calls are evaluated at the temperature its
telemetry has reached (whole degrees), so a hot board draws more for the same work and a trial that
follows a hot one is biased as on hardware; steady-state figures with no history (``dvfs boards``,
the estimate, calibration) use the 60 C reference.

(A profile without the ``sm`` term and without ``achieved:`` has ``flop_rate = compute_util``:
the model before real measurements.)

The operand type matters twice (``work.peak``: FP32 on the CUDA cores; TF32, BF16, FP16, FP8 on
the tensor cores): each has its own roof (``peak_tflops``), matrix work its own achieved share
(``achieved.matmul_<operand>``, else ``matmul``), and the arithmetic units their own power at
that operand's full rate (``power_w.alu_<operand>``, else ``alu``), so an operation's energy at
f_max and V_max is ``alu[operand] / peak[operand]``: a BF16 tensor-core FLOP costs a fraction of
a TF32 one, and far less than an FP32 FMA on the CUDA cores.

The clock term does not scale with ALU utilisation, so a memory-bound kernel saves power at a
lower SM clock at almost no cost in time, as published decode and stencil measurements show.
Each profile's terms are fitted to published figures (``calibration.py``, ``docs/simulator.md``).
``V`` is flat at ``v_min`` below the knee of the V-f curve (0.55-0.77 of f_max) and linear up to
``v_max`` at ``f_max``. A GPC clock offset shifts the V-f curve: the board runs at ``f + offset``
at the voltage of ``f``, so time uses the shifted clock and the voltage term the unshifted one.

Power cap: the board runs at the highest supported clock at or below its locked max (or
``f_max``) whose power fits under the cap less the profile's ``hold_below`` margin (the
controller's set point: the real H200 held 673-675 W under its 700 W limit; the lowest supported
clock if none fits) and reports
``SW_POWER_CAP``. Above the profile's slowdown temperature it also caps power at the value whose
steady-state temperature is the slowdown temperature (``SW_THERMAL_SLOWDOWN``). Locked clocks
report ``APPLICATIONS_CLOCKS_SETTING`` (NVML's ``UserDefinedClocks`` alias of that bit).

Faults (the silicon lottery): each (GPU UUID, kernel class) has a stability threshold ``T``,
seeded from a hash of both, uniform between 20% and 60% of the way from ``f_min`` to ``f_max`` and
rounded to a supported clock, unless planted in the machine config or set by a scenario. At an
effective clock ``f >= T`` a call never faults. Below it a call corrupts its output with
probability ``1 - exp(-(T - f) / scale)`` (``scale`` = 2 clock steps), and crashes with the same
law counted from ``T - 300 MHz``. Clock offsets above a seeded max stable offset fault by the same
law. Units: MHz, W, s, mJ.
"""

from __future__ import annotations

import functools
import hashlib
import math
from bisect import bisect_right
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from orchestrator.devices.base import ClockEventReason, Fault, KernelWork
from orchestrator.devices.sim.profile import GpuProfile

Scenario = Literal["seed_claims"]
SCENARIOS: tuple[str, ...] = ("seed_claims",)
# The study's claim, as a scenario: on an A100, JAX kernels fail below 1065 MHz, TF holds to 510.
SEED_CLAIMS_THRESHOLDS_MHZ: dict[str, int] = {"jax": 1065, "tensorflow": 510}

THRESHOLD_BAND = (0.20, 0.60)  # seeded threshold: this fraction of the way from f_min to f_max
OFFSET_BAND = (0.10, 0.50)  # seeded max stable offset: this fraction of the max offset
FAULT_SCALE_STEPS = 2.0  # fault probability rises by 1 - 1/e over this many clock steps
CRASH_MARGIN_MHZ = 300  # crashes start this far below the threshold (or above the max offset)
WILDCARD_CLASS = "*"  # a planted threshold for every kernel class of a device
LEAKAGE_REF_C = 60.0  # the temperature a profile's leakage coefficient is given at
LEAKAGE_DOUBLING_C = 40.0  # leakage doubles every this many degrees (estimate)


# --- time and power ---------------------------------------------------------------------------


def voltage_v(profile: GpuProfile, sm_clock_mhz: float) -> float:
    """Core voltage at a clock: flat at v_min below the knee, linear to v_max at f_max."""
    knee, f_max = profile.vf_knee_mhz, profile.f_max_mhz
    if sm_clock_mhz <= knee or f_max <= knee:
        return profile.v_min_v
    frac = min(1.0, (sm_clock_mhz - knee) / (f_max - knee))
    return profile.v_min_v + frac * (profile.v_max_v - profile.v_min_v)


@dataclass(frozen=True)
class Roofline:
    """How long one call takes at a clock, and how busy it keeps each roof."""

    duration_s: float  # modelled time of one call, launch overhead included
    compute_util: float  # compute term / duration, in [0, 1]
    memory_util: float  # memory term / duration, in [0, 1]
    flop_rate: float = 0.0  # compute_util * the kind's achieved fraction of the peak rate


def roofline(
    profile: GpuProfile, work: KernelWork, sm_clock_mhz: float, mem_clock_mhz: float | None = None
) -> Roofline:
    """Roofline time of one call at an (effective) SM clock and a memory clock."""
    mem = profile.mem_max_mhz if mem_clock_mhz is None else mem_clock_mhz
    achieved = profile.achieved
    rate = achieved.of(work.kind, work.peak)
    peak_flops = profile.peak_tflops(work.peak) * 1e12 * (sm_clock_mhz / profile.f_max_mhz) * rate
    bandwidth = profile.memory_bandwidth_gbs * 1e9 * (mem / profile.mem_max_mhz) * achieved.memory
    flops = work.flops + (achieved.transcendental_flops - 1) * work.transcendentals
    t_compute = flops / peak_flops if flops > 0 else 0.0
    t_memory = work.bytes_moved / bandwidth if work.bytes_moved > 0 else 0.0
    busy = max(t_compute, t_memory) if work.launches <= 1 else t_compute + t_memory
    duration = busy + max(1, work.launches) * profile.launch_overhead_s
    compute_util = t_compute / duration
    return Roofline(duration, compute_util, t_memory / duration, compute_util * rate)


def leakage_w(profile: GpuProfile, voltage: float, temperature_c: float | None = None) -> float:
    """Static power at a core voltage and die temperature (None: the reference temperature).

    Linear in V (the lead form of ``docs/calibration.md``), doubling every
    ``LEAKAGE_DOUBLING_C`` above ``LEAKAGE_REF_C`` (an estimate: subthreshold leakage of a
    FinFET die roughly doubles every 30-50 C).
    """
    scale = 1.0
    if temperature_c is not None:
        scale = 2.0 ** ((min(temperature_c, 110.0) - LEAKAGE_REF_C) / LEAKAGE_DOUBLING_C)
    return profile.power.leakage * (voltage / profile.v_max_v) * scale


def power_w(
    profile: GpuProfile,
    compute_util: float,
    memory_util: float,
    sm_clock_mhz: float,
    voltage_clock_mhz: float | None = None,
    *,
    mem_clock_mhz: float | None = None,
    temperature_c: float | None = None,
    flop_rate: float | None = None,
    peak: str | None = None,
) -> float:
    """Board power while a kernel is resident, at a utilisation and an (effective) clock.

    Args:
        profile: the board.
        compute_util: fraction of the call the compute roof is busy.
        memory_util: fraction of the call the memory roof is busy (at the memory clock).
        sm_clock_mhz: the clock the SMs run at (the offset included).
        voltage_clock_mhz: the clock whose voltage applies (without the offset); defaults to
            ``sm_clock_mhz``.
        mem_clock_mhz: the memory clock (None: the max), which scales the bandwidth a busy
            memory roof moves.
        temperature_c: the die temperature, for leakage (None: the reference temperature).
        flop_rate: the fraction of the clock's peak FLOP rate sustained (None: compute_util).
        peak: the operand type of the arithmetic (``work.peak``), whose ALU term applies
            (``PowerCoefficients.alu_of``; None: ``alu``).
    """
    c = profile.power
    v_clock = sm_clock_mhz if voltage_clock_mhz is None else voltage_clock_mhz
    volts = voltage_v(profile, v_clock)
    v2 = (volts / profile.v_max_v) ** 2
    f = sm_clock_mhz / profile.f_max_mhz
    mem = profile.mem_max_mhz if mem_clock_mhz is None else mem_clock_mhz
    traffic = memory_util * (mem / profile.mem_max_mhz)  # bytes/s over the peak bandwidth
    base = c.idle - leakage_w(profile, profile.v_min_v)  # idle holds leakage at v_min
    return (
        base
        + leakage_w(profile, volts, temperature_c)
        + c.context
        + (c.clock + c.sm * compute_util
           + c.alu_of(peak) * (compute_util if flop_rate is None else flop_rate)) * f * v2
        + c.l2 * traffic * v2
        + c.hbm * traffic
    )


def thermal_power_limit_w(profile: GpuProfile) -> float:
    """The power whose steady-state temperature is the slowdown temperature."""
    return (profile.slowdown_temp_c - profile.ambient_c) / profile.thermal_resistance_c_per_w


def temperature_after(
    profile: GpuProfile, temperature_c: float, power: float, dt_s: float
) -> float:
    """Die temperature after ``dt_s`` at ``power`` W: first-order lag to ambient + R * P."""
    if dt_s <= 0:
        return temperature_c
    target = profile.ambient_c + profile.thermal_resistance_c_per_w * power
    return target + (temperature_c - target) * math.exp(-dt_s / profile.thermal_time_constant_s)


def idle_temperature_c(profile: GpuProfile) -> float:
    """The steady-state temperature of an idle board."""
    return profile.ambient_c + profile.thermal_resistance_c_per_w * profile.idle_power_w


@dataclass(frozen=True)
class OperatingPoint:
    """Where one kernel call ran and what it cost."""

    base_clock_mhz: int  # the supported clock the board chose (before the offset)
    sm_clock_mhz: int  # the clock the SMs ran at: base + offset
    mem_clock_mhz: int  # the memory clock
    duration_s: float  # modelled time of the call
    power_w: float  # modelled board power during the call
    compute_util: float
    memory_util: float
    reasons: ClockEventReason  # why the clock is below f_max (power cap, thermal, locked)

    @property
    def energy_mj(self) -> float:
        """Energy of the call in mJ."""
        return self.power_w * self.duration_s * 1e3


def _evaluate(
    profile: GpuProfile, work: KernelWork, base_mhz: int, offset_mhz: int, mem_mhz: int,
    temperature_c: int | None = None,
) -> tuple[float, Roofline, int]:
    effective = max(1, base_mhz + offset_mhz)
    r = roofline(profile, work, effective, mem_mhz)
    watts = power_w(
        profile, r.compute_util, r.memory_util, effective, base_mhz, mem_clock_mhz=mem_mhz,
        flop_rate=r.flop_rate, temperature_c=temperature_c, peak=work.peak,
    )
    return watts, r, effective


def _highest_fitting(
    profile: GpuProfile, work: KernelWork, top: int, limit_w: float, offset_mhz: int, mem_mhz: int,
    temperature_c: int | None = None,
) -> int:
    """Index of the highest supported clock <= clocks[top] whose power fits (0 if none).

    A call's power rises with the clock (every term is non-decreasing in f at fixed work: a
    memory-bound call's compute share falls as 1/f while its f·V² rises), so the search bisects.
    """
    clocks = profile.sm_clocks_mhz

    def fits(i: int) -> bool:
        return _evaluate(profile, work, clocks[i], offset_mhz, mem_mhz, temperature_c)[0] <= limit_w

    if fits(top):
        return top
    low, high = 0, top  # clocks[high] does not fit; clocks[low] may not either
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


@functools.lru_cache(maxsize=16384)
def operating_point(
    profile: GpuProfile,
    work: KernelWork,
    max_clock_mhz: int | None = None,
    mem_clock_mhz: int | None = None,
    power_limit_w: float | None = None,
    offset_mhz: int = 0,
    thermal_slowdown: bool = False,
    temperature_c: int | None = None,
) -> OperatingPoint:
    """The clock a call runs at under the settings, and its time, power and reasons.

    Args:
        profile: the board.
        work: the call's size.
        max_clock_mhz: the locked max SM clock (rounded down to a supported one); None: f_max.
        mem_clock_mhz: the memory clock; None: the max memory clock.
        power_limit_w: the enforced power limit; None: no cap.
        offset_mhz: the GPC clock offset.
        thermal_slowdown: the die is at or above the slowdown temperature.
        temperature_c: the die temperature in whole degrees, for leakage (None: the reference
            temperature, ``LEAKAGE_REF_C``; whole degrees keep the memo small).
    """
    clocks = profile.sm_clocks_mhz
    f_max = profile.f_max_mhz
    top_clock = f_max if max_clock_mhz is None else min(max_clock_mhz, f_max)
    top = max(0, bisect_right(clocks, top_clock) - 1)
    mem = profile.mem_max_mhz if mem_clock_mhz is None else mem_clock_mhz
    reasons = ClockEventReason.NONE
    if clocks[top] < profile.f_max_mhz:
        reasons |= ClockEventReason.APPLICATIONS_CLOCKS_SETTING
    chosen = top
    if power_limit_w is not None:
        target = power_limit_w * (1 - profile.power_cap_hold)
        chosen = _highest_fitting(profile, work, top, target, offset_mhz, mem, temperature_c)
        if chosen < top:
            reasons |= ClockEventReason.SW_POWER_CAP
    if thermal_slowdown:
        thermal = _highest_fitting(
            profile, work, chosen, thermal_power_limit_w(profile), offset_mhz, mem, temperature_c
        )
        if thermal < chosen:
            reasons |= ClockEventReason.SW_THERMAL_SLOWDOWN
            chosen = thermal
    watts, r, effective = _evaluate(profile, work, clocks[chosen], offset_mhz, mem, temperature_c)
    return OperatingPoint(
        base_clock_mhz=clocks[chosen],
        sm_clock_mhz=effective,
        mem_clock_mhz=mem,
        duration_s=r.duration_s,
        power_w=watts,
        compute_util=r.compute_util,
        memory_util=r.memory_util,
        reasons=reasons,
    )


# --- faults -----------------------------------------------------------------------------------


def _unit_hash(*parts: Any) -> float:
    """A uniform number in [0, 1) from the parts (stable across processes and runs)."""
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def _planted(
    planted: Mapping[Any, Any] | None, uuid: str, index: int | None, cls: str
) -> int | None:
    if not planted:
        return None
    for key in (uuid, index, None if index is None else str(index)):
        per_class = planted.get(key) if key is not None else None
        if per_class:
            for c in (cls, WILDCARD_CLASS):
                if c in per_class:
                    return int(per_class[c])
    return None


def stability_threshold_mhz(
    profile: GpuProfile,
    uuid: str,
    kernel_class: str,
    framework: str = "",
    *,
    device_index: int | None = None,
    planted: Mapping[Any, Mapping[str, int]] | None = None,
    scenario: str | None = None,
) -> int:
    """The lowest clock at which a kernel class never faults on one GPU (ground truth).

    Precedence: a planted threshold for the device (by UUID or index) and class (or ``"*"``),
    then the scenario (``seed_claims``: on an A100, 1065 MHz under JAX, 510 MHz under
    TensorFlow), then the seeded silicon lottery.
    """
    planted_mhz = _planted(planted, uuid, device_index, kernel_class)
    if planted_mhz is not None:
        return planted_mhz
    if scenario == "seed_claims" and "A100" in profile.name:
        claim = SEED_CLAIMS_THRESHOLDS_MHZ.get(framework)
        if claim is not None:
            return claim
    lo, hi = THRESHOLD_BAND
    frac = lo + (hi - lo) * _unit_hash("threshold", uuid, kernel_class)
    raw = profile.f_min_mhz + frac * (profile.f_max_mhz - profile.f_min_mhz)
    return min(profile.sm_clocks_mhz, key=lambda c: abs(c - raw))


def max_stable_offset_mhz(
    profile: GpuProfile,
    uuid: str,
    kernel_class: str,
    *,
    device_index: int | None = None,
    planted_offsets: Mapping[Any, Mapping[str, int]] | None = None,
) -> int | None:
    """The highest GPC clock offset at which a kernel class never faults; None: no offsets."""
    if profile.clock_offset_range_mhz is None:
        return None
    planted_mhz = _planted(planted_offsets, uuid, device_index, kernel_class)
    if planted_mhz is not None:
        return planted_mhz
    lo, hi = OFFSET_BAND
    frac = lo + (hi - lo) * _unit_hash("offset", uuid, kernel_class)
    raw = frac * profile.clock_offset_range_mhz[1]
    step = max(1, round(profile.clock_step_mhz))
    return int(round(raw / step) * step)


@dataclass(frozen=True)
class FaultProbability:
    """The chance that one call crashes, or (not crashing) corrupts its output."""

    crash: float
    corrupt: float

    @property
    def any(self) -> float:
        """The chance that the call is faulted at all."""
        return self.crash + self.corrupt


def _rising(excess_mhz: float, scale_mhz: float) -> float:
    return 0.0 if excess_mhz <= 0 else -math.expm1(-excess_mhz / scale_mhz)


def fault_probability(
    profile: GpuProfile,
    sm_clock_mhz: float,
    threshold_mhz: float,
    *,
    offset_mhz: int = 0,
    max_stable_offset_mhz: int | None = None,
) -> FaultProbability:
    """The fault law at an effective clock (and offset): exactly zero at or above the threshold.

    Args:
        profile: the board (its clock step sets the scale of the law).
        sm_clock_mhz: the effective clock the call ran at (offset included).
        threshold_mhz: the stability threshold of this GPU and kernel class.
        offset_mhz: the GPC clock offset in force.
        max_stable_offset_mhz: the highest offset that never faults (None: offsets never fault).
    """
    scale = FAULT_SCALE_STEPS * profile.clock_step_mhz
    below = threshold_mhz - sm_clock_mhz
    over = 0.0 if max_stable_offset_mhz is None else offset_mhz - max_stable_offset_mhz
    corrupt = 1 - (1 - _rising(below, scale)) * (1 - _rising(over, scale))
    crash = 1 - (1 - _rising(below - CRASH_MARGIN_MHZ, scale)) * (
        1 - _rising(over - CRASH_MARGIN_MHZ, scale)
    )
    return FaultProbability(crash=crash, corrupt=(1 - crash) * corrupt)


def call_uniform(seed: int, uuid: str, call_index: int) -> float:
    """The uniform draw of one call, from (machine seed, UUID, call counter): reproducible."""
    return _unit_hash("call", seed, uuid, call_index)


def draw_fault(probability: FaultProbability, uniform: float) -> Fault:
    """The fault of a call given its probability and its uniform draw in [0, 1)."""
    if uniform < probability.crash:
        return Fault.CRASH
    if uniform < probability.crash + probability.corrupt:
        return Fault.CORRUPT
    return Fault.NONE
