"""The simulated GPU's profiles and physics, checked against the datasheets and the stated laws.

Expected values are computed here from the formulas in DESIGN.md ("The simulated GPU"), not by
calling the model's helpers, so a wrong helper cannot agree with itself.
"""

from __future__ import annotations

import dataclasses
import math
import re

import pytest
import yaml

from orchestrator.devices.base import ClockEventReason, Fault, KernelWork
from orchestrator.devices.sim import model
from orchestrator.devices.sim.profile import (
    ProfileError,
    available_profiles,
    load_profile,
    parse_profile,
    profile_dir,
)

DATASHEET = {
    # profile: (NVML name, arch, f_min, f_max, n clocks, mem, (min, default, max W), fp32, bf16, BW)
    "a100_sxm4_40gb": (
        "NVIDIA A100-SXM4-40GB", "ampere", 210, 1410, 81, 1215, (100, 400, 400), 19.5, 312, 1555
    ),
    "h100_sxm5_80gb": (
        "NVIDIA H100 80GB HBM3", "hopper", 345, 1980, 110, 2619, (200, 700, 700), 67, 989, 3350
    ),
    "h200_141gb": ("NVIDIA H200", "hopper", 345, 1980, 110, 3201, (200, 700, 700), 67, 989, 4800),
    "v100_sxm2_16gb": (
        "Tesla V100-SXM2-16GB", "volta", 135, 1530, 187, 877, (150, 300, 300), 15.7, 15.7, 900
    ),
}
MAIN = sorted(DATASHEET)


def compute_bound(p, seconds=0.1):
    """fp32 work that keeps the compute roof busy for ``seconds`` at f_max."""
    return KernelWork(p.peak_fp32_tflops * 1e12 * seconds, 1e6, "fp32", "gemm", "jax")


def memory_bound(p, seconds=0.1):
    """Work that keeps the memory roof busy for ``seconds`` (0.05 flop/byte)."""
    nbytes = p.memory_bandwidth_gbs * 1e9 * seconds
    return KernelWork(0.05 * nbytes, nbytes, "fp32", "stencil", "jax")


def expected_power_w(p, work, f_mhz):
    """DESIGN.md's roofline and power law, written out independently (reference temperature)."""
    a = p.achieved
    rate = {"matmul": a.matmul, "conv": a.conv, "elementwise": a.elementwise}[work.kind]
    flops = work.flops + (a.transcendental_flops - 1) * work.transcendentals
    t_c = flops / (p.peak_tflops(work.peak) * 1e12 * f_mhz / p.f_max_mhz * rate)
    t_m = work.bytes_moved / (p.memory_bandwidth_gbs * 1e9 * a.memory)
    busy = max(t_c, t_m) if work.launches == 1 else t_c + t_m
    t = busy + a.launch_overhead_s * work.launches
    if f_mhz <= p.vf_knee_mhz:
        v = p.v_min_v
    else:
        v = p.v_min_v + (p.v_max_v - p.v_min_v) * (f_mhz - p.vf_knee_mhz) / (
            p.f_max_mhz - p.vf_knee_mhz
        )
    c, vr, fr = p.power, v / p.v_max_v, f_mhz / p.f_max_mhz
    static = c.idle + c.leakage * (vr - p.v_min_v / p.v_max_v)
    core = (c.clock + c.sm * t_c / t + c.alu * rate * t_c / t) * fr * vr**2
    core += c.l2 * (t_m / t) * vr**2
    return static + c.context + core + c.hbm * t_m / t


@pytest.mark.parametrize("key", MAIN)
def test_each_profile_carries_its_datasheet_values(key):
    name, arch, f_min, f_max, n, mem, limits, fp32, bf16, bw = DATASHEET[key]
    p = load_profile(key)
    assert (p.name, p.architecture, p.f_min_mhz, p.f_max_mhz, len(p.sm_clocks_mhz)) == (
        name, arch, f_min, f_max, n
    )
    assert p.mem_clocks_mhz == (mem,)
    assert (p.power_limit_min_w, p.power_limit_default_w, p.power_limit_max_w) == limits
    assert (p.peak_tflops("fp32"), p.peak_tflops("bf16"), p.memory_bandwidth_gbs) == (
        fp32, bf16, bw
    )
    assert p.has_energy_counter


def test_the_v100_clock_table_alternates_eight_and_seven_mhz_steps_as_nvmls_does():
    clocks = load_profile("v100_sxm2_16gb").sm_clocks_mhz[::-1]
    assert clocks[:5] == (1530, 1522, 1515, 1507, 1500)
    assert {a - b for a, b in zip(clocks, clocks[1:])} == {7, 8}


def test_the_pascal_profile_has_no_energy_counter_and_no_offsets():
    p = load_profile("p100_pcie_16gb")
    assert "p100_pcie_16gb" in available_profiles()
    assert (p.architecture, p.f_min_mhz, p.f_max_mhz, p.power_limit_default_w) == (
        "pascal", 544, 1328, 250
    )
    assert not p.has_energy_counter and p.clock_offset_range_mhz is None


def test_offsets_exist_on_ampere_and_hopper_only():
    assert {k: load_profile(k).clock_offset_range_mhz is not None for k in MAIN} == {
        "a100_sxm4_40gb": True, "h100_sxm5_80gb": True, "h200_141gb": True, "v100_sxm2_16gb": False,
    }


def test_volta_has_no_tf32_or_bf16_units_and_falls_back_to_the_fp32_roof():
    p = load_profile("v100_sxm2_16gb")
    assert p.peak_tflops("tf32") == p.peak_tflops("bf16") == 15.7
    assert p.peak_tflops("fp16") == 125


FITTED_TO_REAL = {"h200_141gb"}  # profiles fitted to this project's real measurements


@pytest.mark.parametrize("key", MAIN)
def test_power_is_calibrated_to_the_default_limit(key):
    p = load_profile(key)
    compute = model.operating_point(p, compute_bound(p)).power_w / p.power_limit_default_w
    memory = model.operating_point(p, memory_bound(p)).power_w / p.power_limit_default_w
    if key in FITTED_TO_REAL:
        # The real H200 ran its TF32 GEMM power-capped at 1578 MHz: the compute roof at f_max
        # wants more than the limit, and under it the board sits at the controller's set point.
        capped = model.operating_point(p, compute_bound(p), power_limit_w=p.power_limit_default_w)
        assert compute > 1.0 and capped.reasons & ClockEventReason.SW_POWER_CAP
        assert capped.power_w <= p.power_limit_default_w * (1 - p.power_cap_hold)
        assert capped.sm_clock_mhz < p.f_max_mhz
    else:
        # A kernel at the compute roof draws close to the board's limit (V100: 0.78, fitted to
        # Zeus' training traces from a 250 W V100 while the profile is the 300 W SXM2).
        assert 0.75 <= compute <= 1.0
    assert 0.45 <= memory <= 0.7  # one at the memory roof well under it (H200 decode: 137-300 W)
    assert 35 <= p.idle_power_w <= 90


@pytest.mark.parametrize("key", MAIN)
def test_the_model_follows_the_stated_power_law_at_every_clock(key):
    p = load_profile(key)
    for work in (compute_bound(p), memory_bound(p)):
        for f in p.sm_clocks_mhz[::9]:
            op = model.operating_point(p, work, max_clock_mhz=f)
            assert op.power_w == pytest.approx(expected_power_w(p, work, f), rel=1e-9)


@pytest.mark.parametrize("cap_w", [350, 300, 250, 200, 150])
def test_a_power_cap_runs_the_highest_supported_clock_that_fits_and_says_so(cap_w):
    p = load_profile("a100_sxm4_40gb")
    work = compute_bound(p)
    fitting = [f for f in p.sm_clocks_mhz if expected_power_w(p, work, f) <= cap_w]
    op = model.operating_point(p, work, power_limit_w=cap_w)
    assert op.sm_clock_mhz == max(fitting) < p.f_max_mhz
    assert op.power_w <= cap_w
    assert op.reasons & ClockEventReason.SW_POWER_CAP


def test_no_cap_and_no_lock_runs_at_the_max_clock_with_no_reason():
    p = load_profile("a100_sxm4_40gb")
    op = model.operating_point(p, compute_bound(p), power_limit_w=p.power_limit_default_w)
    assert (op.sm_clock_mhz, op.reasons) == (1410, ClockEventReason.NONE)


def test_a_cap_nothing_fits_under_clamps_to_the_min_clock():
    p = load_profile("a100_sxm4_40gb")
    op = model.operating_point(p, memory_bound(p), power_limit_w=100)
    assert op.sm_clock_mhz == p.f_min_mhz
    assert op.reasons & ClockEventReason.SW_POWER_CAP


def test_the_cap_searches_below_the_locked_max_not_the_board_max():
    p = load_profile("a100_sxm4_40gb")
    op = model.operating_point(p, compute_bound(p), max_clock_mhz=1200, power_limit_w=400)
    assert op.sm_clock_mhz == 1200
    assert op.reasons == ClockEventReason.APPLICATIONS_CLOCKS_SETTING


def test_compute_bound_time_scales_as_one_over_f_and_memory_bound_barely_moves():
    p = load_profile("h100_sxm5_80gb")
    for f in (1305, 990, 660):
        c = model.operating_point(p, compute_bound(p, 1.0), max_clock_mhz=f).duration_s
        m = model.operating_point(p, memory_bound(p, 1.0), max_clock_mhz=f).duration_s
        rates = p.achieved  # of each roof, what real kernels reach on this board
        assert c == pytest.approx((p.f_max_mhz / f) / rates.elementwise + 5e-6, rel=1e-6)
        assert m == pytest.approx(1.0 / rates.memory + 5e-6, rel=1e-6)


def test_a_clock_offset_speeds_the_sms_up_at_the_voltage_of_the_unshifted_clock():
    p = load_profile("a100_sxm4_40gb")
    work = compute_bound(p)
    plain = model.operating_point(p, work, max_clock_mhz=1200)
    shifted = model.operating_point(p, work, max_clock_mhz=1200, offset_mhz=90)
    assert (shifted.base_clock_mhz, shifted.sm_clock_mhz) == (1200, 1290)
    assert shifted.duration_s < plain.duration_s
    # cheaper than reaching 1290 MHz by the curve: the offset undervolts
    assert shifted.power_w < model.operating_point(p, work, max_clock_mhz=1290).power_w


def test_above_the_slowdown_temperature_the_clock_is_held_to_a_steady_state_power():
    hot = dataclasses.replace(load_profile("a100_sxm4_40gb"), thermal_resistance_c_per_w=0.25)
    limit_w = (hot.slowdown_temp_c - hot.ambient_c) / hot.thermal_resistance_c_per_w
    op = model.operating_point(hot, compute_bound(hot), thermal_slowdown=True)
    assert op.power_w <= limit_w < model.operating_point(hot, compute_bound(hot)).power_w
    assert op.reasons & ClockEventReason.SW_THERMAL_SLOWDOWN


def test_temperature_lags_towards_ambient_plus_r_times_p():
    p = load_profile("a100_sxm4_40gb")
    target = p.ambient_c + p.thermal_resistance_c_per_w * 400
    t1 = model.temperature_after(p, 40.0, 400, p.thermal_time_constant_s)
    assert t1 == pytest.approx(target + (40.0 - target) / math.e)
    assert model.temperature_after(
        p, 40.0, 400, 100 * p.thermal_time_constant_s
    ) == pytest.approx(target)


def test_the_fault_law_is_exactly_zero_at_and_above_the_threshold_and_exponential_below():
    p = load_profile("a100_sxm4_40gb")  # 15 MHz steps: scale 30 MHz
    T = 900
    for f in (900, 915, 1410):
        assert model.fault_probability(p, f, T) == model.FaultProbability(crash=0.0, corrupt=0.0)
    for f in (885, 840, 700, 601):
        prob = model.fault_probability(p, f, T)
        assert prob.crash == 0.0
        assert prob.corrupt == pytest.approx(1 - math.exp(-(T - f) / 30))
    deep = model.fault_probability(p, 510, T)
    assert deep.crash == pytest.approx(1 - math.exp(-(T - 300 - 510) / 30))


def test_drawn_faults_occur_at_the_rate_the_law_gives():
    p = load_profile("a100_sxm4_40gb")
    prob = model.fault_probability(p, 885, 900)  # corrupt 0.39, no crash
    n = 4000
    faults = [model.draw_fault(prob, model.call_uniform(7, "GPU-x", k)) for k in range(n)]
    rate = faults.count(Fault.CORRUPT) / n
    assert Fault.CRASH not in faults
    assert abs(rate - prob.corrupt) < 4 * math.sqrt(prob.corrupt * (1 - prob.corrupt) / n)


def test_thresholds_precedence_planted_then_scenario_then_lottery():
    p = load_profile("a100_sxm4_40gb")
    uuid = "GPU-00000000-0000-0000-0000-000000000000"
    seeded = model.stability_threshold_mhz(p, uuid, "gemm", "jax")
    assert seeded in p.sm_clocks_mhz
    assert model.stability_threshold_mhz(p, uuid, "gemm", "jax", scenario="seed_claims") == 1065
    assert (
        model.stability_threshold_mhz(p, uuid, "gemm", "tensorflow", scenario="seed_claims") == 510
    )
    assert model.stability_threshold_mhz(p, uuid, "gemm", "numpy", scenario="seed_claims") == seeded
    planted = {"0": {"*": 600}, uuid: {"gemm": 1200}}
    assert model.stability_threshold_mhz(
        p, uuid, "gemm", "jax", device_index=0, planted=planted, scenario="seed_claims"
    ) == 1200
    assert model.stability_threshold_mhz(
        p, uuid, "selu", "jax", device_index=0, planted=planted
    ) == 600


def test_seed_claims_applies_to_the_a100_only():
    h100 = load_profile("h100_sxm5_80gb")
    uuid = "GPU-11111111-0000-0000-0000-000000000000"
    assert model.stability_threshold_mhz(h100, uuid, "gemm", "jax", scenario="seed_claims") == (
        model.stability_threshold_mhz(h100, uuid, "gemm", "jax")
    )


def test_offsets_above_the_max_stable_offset_fault_by_the_same_law():
    a100, v100 = load_profile("a100_sxm4_40gb"), load_profile("v100_sxm2_16gb")
    uuid = "GPU-22222222-0000-0000-0000-000000000000"
    stable = model.max_stable_offset_mhz(a100, uuid, "gemm")
    assert 100 <= stable <= 500
    assert model.max_stable_offset_mhz(v100, uuid, "gemm") is None
    at = model.fault_probability(
        a100, 1410 + stable, 300, offset_mhz=stable, max_stable_offset_mhz=stable
    )
    over = model.fault_probability(
        a100, 1440 + stable, 300, offset_mhz=stable + 30, max_stable_offset_mhz=stable
    )
    assert at.any == 0.0
    assert over.corrupt == pytest.approx(1 - math.exp(-1))


# --- achieved rates (fitted to the real H200) ---------------------------------------------------
def test_a_call_runs_at_its_kinds_achieved_rate_and_several_kernels_add_up():
    p = load_profile("h200_141gb")
    a = p.achieved
    peak = p.peak_tflops("tf32") * 1e12
    one = KernelWork(peak * 0.01, 1e6, "tf32", "gemm", kind="matmul")
    conv = dataclasses.replace(one, kind="conv")
    t_one = model.roofline(p, one, p.f_max_mhz).duration_s - a.launch_overhead_s
    t_conv = model.roofline(p, conv, p.f_max_mhz).duration_s - a.launch_overhead_s
    assert t_one == pytest.approx(0.01 / a.matmul) and t_conv == pytest.approx(0.01 / a.conv)
    # A step of GEMMs and elementwise fusions: its kernels meet their roofs one after another.
    nbytes = p.memory_bandwidth_gbs * 1e9 * a.memory * 0.004  # 4 ms of streaming
    step = KernelWork(peak * 0.01, nbytes, "tf32", "mlp", kind="matmul", launches=3)
    fused = dataclasses.replace(step, launches=1)
    assert model.roofline(p, step, p.f_max_mhz).duration_s == pytest.approx(
        0.01 / a.matmul + 0.004 + 3 * a.launch_overhead_s)
    assert model.roofline(p, fused, p.f_max_mhz).duration_s == pytest.approx(
        0.01 / a.matmul + a.launch_overhead_s)


def test_a_transcendental_costs_the_profiles_alu_flops():
    p = load_profile("h200_141gb")
    exps = KernelWork(1e9, 1.0, "fp32", "selu", transcendentals=1e9)  # every FLOP an exp
    t = model.roofline(p, exps, p.f_max_mhz).duration_s - p.achieved.launch_overhead_s
    rate = p.peak_tflops("fp32") * 1e12 * p.achieved.elementwise
    assert t == pytest.approx(1e9 * p.achieved.transcendental_flops / rate)


def test_the_power_controller_holds_its_margin_under_the_limit():
    p = load_profile("h200_141gb")
    for limit in (700, 500, 300):
        op = model.operating_point(p, compute_bound(p), power_limit_w=limit)
        above = model.operating_point(p, compute_bound(p), max_clock_mhz=op.base_clock_mhz + 15)
        assert op.power_w <= limit * (1 - p.power_cap_hold) < above.power_w


# --- operand types --------------------------------------------------------------------------
def _raw(key="h200_141gb"):
    return yaml.safe_load((profile_dir() / f"{key}.yaml").read_text())


def test_an_operand_without_its_own_terms_uses_matmul_and_alu():
    raw = _raw()
    raw["achieved"].pop("matmul_fp8")
    raw["power_w"].pop("alu_fp8")
    p = parse_profile("no-fp8-terms", raw)
    assert p.achieved.of("matmul", "fp8") == p.achieved.matmul
    assert p.power.alu_of("fp8") == p.power.alu
    shipped = load_profile("h200_141gb")
    assert shipped.achieved.of("matmul", "fp8") == 0.83 != p.achieved.of("matmul", "fp8")
    assert shipped.achieved.of("conv", "bf16") == shipped.achieved.conv  # per operand: matmul


def test_a_board_without_fp8_runs_it_at_its_fp16_roof():
    p = load_profile("a100_sxm4_40gb")
    assert p.peak_fp8_tflops is None and p.peak_tflops("fp8") == p.peak_tflops("fp16") == 312
    assert load_profile("h100_sxm5_80gb").peak_tflops("fp8") == 1979


@pytest.mark.parametrize("section, key, value, message", [
    ("achieved", "matmul_bf16", 1.2, "matmul_bf16 must be a fraction"),
    ("power_w", "alu_bf16", -5, "terms must be 0 W or more: alu_bf16"),
    ("achieved", "matmul_fp4", 0.5, "unknown ['matmul_fp4']"),
    ("power_w", "alu_int8", 5, "unknown alu_int8"),
])
def test_an_operand_term_out_of_range_is_refused_naming_it(section, key, value, message):
    raw = _raw()
    raw[section][key] = value
    with pytest.raises(ProfileError, match=re.escape(message)):
        parse_profile("bad", raw, "bad.yaml")


def test_a_provenance_entry_names_its_kind():
    raw = _raw()
    raw["provenance"] = {"power_w.idle": "guessed: no figure"}
    with pytest.raises(ProfileError, match="power_w.idle: each entry starts with one of"):
        parse_profile("bad", raw, "bad.yaml")
