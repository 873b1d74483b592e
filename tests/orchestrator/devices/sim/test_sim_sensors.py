"""NVML's power readings and the power-cap lag on the simulated GPU, per generation.

Each test drives the sim through its pynvml-shaped API and checks a reading against the energy
the sim accounted (the window mean, computed by hand from the modelled powers), or the clock
against ``model.operating_point``'s steady state.
"""

from __future__ import annotations

import pynvml
import pytest
from support import isothermal_profile

from orchestrator.devices.base import ClockEventReason, KernelWork
from orchestrator.devices.sim import model
from orchestrator.devices.sim import nvml as sim
from orchestrator.devices.sim.profile import load_profile
from orchestrator.devices.sim.state import create_machine

CALL_S = 0.002  # the compute-bound calls below last about this long at f_max
INSTANT = pynvml.NVML_FI_DEV_POWER_INSTANT
AVERAGE = pynvml.NVML_FI_DEV_POWER_AVERAGE


def gemm(profile, seconds=CALL_S):
    """A compute-bound call of about ``seconds`` at the board's max clock."""
    return KernelWork(
        flops=profile.peak_fp32_tflops * 1e12 * seconds, bytes_moved=1e6, peak="fp32",
        kernel_class="gemm", framework="jax",
    )


def stream(profile, seconds=CALL_S):
    """A memory-bound call of about ``seconds``: under every board's default limit."""
    nbytes = profile.memory_bandwidth_gbs * 1e9 * seconds
    return KernelWork(flops=nbytes / 8, bytes_moved=nbytes, peak="fp32", kernel_class="stencil",
                      framework="jax")


@pytest.fixture
def open_gpu(tmp_path, monkeypatch):
    """``open_gpu(profile)``: a one-GPU machine, nvmlInit'ed; returns (handle, profile). Its die
    holds the leakage reference temperature (``support.isothermal_profile``), so the sensors can
    be checked exactly against the steady-state model."""
    opened = []

    def open_(profile):
        state = tmp_path / f"sim{len(opened)}"
        create_machine(state, isothermal_profile(profile, tmp_path))
        monkeypatch.setenv("DVFS_SIM_STATE_DIR", str(state))
        sim.nvmlInit()
        opened.append(state)
        return sim.nvmlDeviceGetHandleByIndex(0), load_profile(profile)

    yield open_
    for _ in opened:
        sim.nvmlShutdown()


def field_mw(h, field):
    (value,) = sim.nvmlDeviceGetFieldValues(h, [field])
    return value.value.uiVal if value.nvmlReturn == pynvml.NVML_SUCCESS else None


def run_until(h, work, t_s):
    """Back-to-back calls until the virtual clock reaches ``t_s``; the last call's power (mW)."""
    power_mw = None
    while sim.simDeviceGetTimeS(h) < t_s:
        power_mw = sim.simDeviceRecordKernelCall(h, work).power_mw
    return power_mw


# --- the readings ----------------------------------------------------------------------------
@pytest.mark.parametrize("profile", ["a100_sxm4_40gb", "h100_sxm5_80gb", "v100_sxm2_16gb"])
def test_a_reading_is_the_mean_power_over_its_window_before_its_latest_update(open_gpu, profile):
    h, p = open_gpu(profile)
    sensor = p.sensors.power_instant or p.sensors.power_usage  # the field, else power usage
    period, window = sensor.period_s, sensor.window_s
    update = 10 * period
    step = update - 0.4 * window  # the load starts inside the window of the update at 10 periods
    sim.simDeviceIdle(h, step)
    t_start = sim.simDeviceGetTimeS(h)
    load_mw = run_until(h, gemm(p, 0.0001), update)  # short calls: the window ends mid-call
    t_now = sim.simDeviceGetTimeS(h)
    assert update <= t_now < update + period
    idle_s, load_s = t_start - (update - window), update - t_start
    expected_w = (p.idle_power_w * idle_s + load_mw / 1000 * load_s) / window
    reading = field_mw(h, INSTANT) if p.sensors.power_instant else sim.nvmlDeviceGetPowerUsage(h)
    assert reading == pytest.approx(expected_w * 1000, abs=2)
    assert p.idle_power_w * 1000 < reading < load_mw


@pytest.mark.parametrize(
    "profile", ["a100_sxm4_40gb", "h100_sxm5_80gb", "h200_141gb", "v100_sxm2_16gb"]
)
def test_a_step_in_power_shows_in_the_instant_reading_within_a_period_and_a_window(
    open_gpu, profile
):
    h, p = open_gpu(profile)
    sensor = p.sensors.power_instant or p.sensors.power_usage

    def read():
        if p.sensors.power_instant:
            return field_mw(h, INSTANT)
        return sim.nvmlDeviceGetPowerUsage(h)

    sim.simDeviceIdle(h, 1.0 + 0.37 * sensor.period_s)  # a step between two updates
    step_s = sim.simDeviceGetTimeS(h)
    work = stream(p, 0.0005)  # under the limit: a capped load's power moves once the cap acts
    load_mw = None
    while True:
        load_mw = sim.simDeviceRecordKernelCall(h, work).power_mw
        if read() == load_mw:
            break
    seen_after_s = sim.simDeviceGetTimeS(h) - step_s
    assert seen_after_s <= sensor.period_s + sensor.window_s + 0.0005
    assert seen_after_s >= sensor.window_s  # never before a whole window of the load


def test_hoppers_power_usage_is_a_one_second_average_with_a_one_second_rise(open_gpu):
    h, p = open_gpu("h100_sxm5_80gb")
    assert p.sensors.power_usage.window_s == 1.0
    sim.simDeviceIdle(h, 2.0)
    idle_mw = sim.nvmlDeviceGetPowerUsage(h)
    work = gemm(p, 0.001)
    load_mw = run_until(h, work, 2.5)
    half = sim.nvmlDeviceGetPowerUsage(h)
    assert field_mw(h, INSTANT) == load_mw  # the instant field has long seen the load
    # after 0.5 s the 1 s average has risen about half way (0.4-0.5 s of load in its window)
    assert 0.35 < (half - idle_mw) / (load_mw - idle_mw) < 0.55
    rise_s = None
    while rise_s is None:
        sim.simDeviceRecordKernelCall(h, work)
        if sim.nvmlDeviceGetPowerUsage(h) >= idle_mw + 0.9 * (load_mw - idle_mw):
            rise_s = sim.simDeviceGetTimeS(h) - 2.0
    assert 0.85 <= rise_s <= 1.05  # the ~900 ms rise Yang et al. measured
    run_until(h, work, 3.2)
    assert sim.nvmlDeviceGetPowerUsage(h) == field_mw(h, AVERAGE) == load_mw


def test_a_reading_holds_between_updates_whatever_the_power_does(open_gpu):
    h, p = open_gpu("a100_sxm4_40gb")
    sim.simDeviceIdle(h, 0.101)  # just past an update
    held = sim.nvmlDeviceGetPowerUsage(h)
    run_until(h, gemm(p, 0.001), 0.19)
    assert sim.nvmlDeviceGetPowerUsage(h) == held == int(p.idle_power_w * 1000)
    run_until(h, gemm(p, 0.001), 0.201)
    assert sim.nvmlDeviceGetPowerUsage(h) > held


def test_a_long_interval_across_many_updates_is_still_exact(open_gpu):
    h, p = open_gpu("h100_sxm5_80gb")
    load_mw = run_until(h, gemm(p, 0.001), 2.0)
    load_end = sim.simDeviceGetTimeS(h)
    sim.simDeviceIdle(h, 0.4)  # one interval across 4 updates of the 1 s average
    t = sim.simDeviceGetTimeS(h)
    last_update = int(t / 0.1 + 1e-9) * 0.1
    idle_part = last_update - load_end  # of the window (last_update - 1, last_update]
    expected_w = (p.idle_power_w * idle_part + load_mw / 1000 * (1.0 - idle_part)) / 1.0
    assert sim.nvmlDeviceGetPowerUsage(h) == pytest.approx(expected_w * 1000, abs=2)
    sim.simDeviceIdle(h, 10.0)
    assert sim.nvmlDeviceGetPowerUsage(h) == field_mw(h, INSTANT) == int(p.idle_power_w * 1000)


@pytest.mark.parametrize(
    ("profile", "offered"),
    [
        ("a100_sxm4_40gb", [True, False]),  # GA100: no average field
        ("h100_sxm5_80gb", [True, True]),
        ("v100_sxm2_16gb", [True, False]),  # instant: "all architectures" (nvml.h)
    ],
)
def test_the_power_fields_each_generation_offers(open_gpu, profile, offered):
    h, _ = open_gpu(profile)
    assert [field_mw(h, f) is not None for f in (INSTANT, AVERAGE)] == offered


# --- the power-cap filter --------------------------------------------------------------------
def trace(h, work, until_s):
    """(time at the call's end, SM clock, power W, reasons) of back-to-back calls."""
    out = []
    while sim.simDeviceGetTimeS(h) < until_s:
        r = sim.simDeviceRecordKernelCall(h, work)
        out.append((sim.simDeviceGetTimeS(h), r.sm_clock_mhz, r.power_mw / 1000,
                    sim.nvmlDeviceGetCurrentClocksEventReasons(h)))
    return out


def first_throttled(points, clock_mhz):
    return next(t for t, c, _, _ in points if c < clock_mhz)


@pytest.mark.parametrize("profile", ["a100_sxm4_40gb", "h100_sxm5_80gb", "v100_sxm2_16gb"])
def test_a_load_starting_under_a_low_cap_runs_above_it_for_the_filter_time(open_gpu, profile):
    h, p = open_gpu(profile)
    filter_s = p.sensors.power_cap_filter_s
    work = gemm(p)
    free = model.operating_point(p, work)
    cap_w = max(round((p.idle_power_w + free.power_w) / 2), p.power_limit_min_w)
    capped = model.operating_point(p, work, power_limit_w=cap_w)
    assert capped.sm_clock_mhz < free.sm_clock_mhz
    sim.nvmlDeviceSetPowerManagementLimit(h, cap_w * 1000)
    sim.simDeviceIdle(h, 2 * filter_s)
    start_s = sim.simDeviceGetTimeS(h)
    points = trace(h, work, start_s + 3 * filter_s)
    drop_s = first_throttled(points, free.sm_clock_mhz) - start_s
    assert filter_s <= drop_s <= filter_s + 2 * free.duration_s
    before = [pt for pt in points if pt[0] - start_s < filter_s]
    after = [pt for pt in points if pt[0] - start_s > drop_s]
    assert all(w > cap_w and c == free.sm_clock_mhz for _, c, w, _ in before)
    assert not any(r & ClockEventReason.SW_POWER_CAP for *_, r in before)
    # then the steady state is what the model says
    assert {(c, w) for _, c, w, _ in after} == {(capped.sm_clock_mhz, round(capped.power_w, 3))}
    assert all(r & ClockEventReason.SW_POWER_CAP for *_, r in after)


def test_lowering_the_cap_under_a_running_load_takes_the_filter_time_to_bite(open_gpu):
    h, p = open_gpu("h100_sxm5_80gb")  # Hopper: ~1 s
    work = gemm(p)
    free = model.operating_point(p, work)
    cap_w = round(free.power_w * 0.7)
    run_until(h, work, 2.0)  # a steady load under the default cap
    sim.nvmlDeviceSetPowerManagementLimit(h, cap_w * 1000)
    points = trace(h, work, 4.0)
    drop_s = first_throttled(points, free.sm_clock_mhz) - 2.0
    assert 1.0 <= drop_s <= 1.0 + 2 * free.duration_s
    # the instant reading sees the board above the new cap meanwhile, and at it after
    assert field_mw(h, INSTANT) / 1000 <= cap_w


def test_the_controller_forgets_after_the_filter_time_under_the_cap(open_gpu):
    h, p = open_gpu("a100_sxm4_40gb")
    work = gemm(p)
    free = model.operating_point(p, work)
    sim.nvmlDeviceSetPowerManagementLimit(h, round(free.power_w * 0.7) * 1000)
    run_until(h, work, 0.5)  # throttled by now
    sim.simDeviceIdle(h, 0.04)  # a short pause: the integrator drains by 40 ms of its 100
    resumed = sim.simDeviceGetTimeS(h)
    drop_s = first_throttled(trace(h, work, resumed + 0.3), free.sm_clock_mhz) - resumed
    assert 0.04 <= drop_s <= 0.04 + 2 * free.duration_s
    sim.simDeviceIdle(h, 0.5)  # a long one: it starts afresh
    resumed = sim.simDeviceGetTimeS(h)
    drop_s = first_throttled(trace(h, work, resumed + 0.3), free.sm_clock_mhz) - resumed
    assert 0.1 <= drop_s <= 0.1 + 2 * free.duration_s


def test_a_call_longer_than_the_filter_runs_in_two_phases(open_gpu):
    h, p = open_gpu("a100_sxm4_40gb")
    work = gemm(p, 0.5)
    free = model.operating_point(p, work)
    cap_w = round(free.power_w * 0.7)
    capped = model.operating_point(p, work, power_limit_w=cap_w)
    sim.nvmlDeviceSetPowerManagementLimit(h, cap_w * 1000)
    e0 = sim.simDeviceGetEnergyMj(h)
    result = sim.simDeviceRecordKernelCall(h, work)
    filter_s = p.sensors.power_cap_filter_s
    rest_s = (1 - filter_s / free.duration_s) * capped.duration_s
    assert result.duration_s == pytest.approx(filter_s + rest_s, rel=1e-12)
    expected_mj = (free.power_w * filter_s + capped.power_w * rest_s) * 1e3
    assert result.energy_mj == pytest.approx(expected_mj)
    assert sim.simDeviceGetEnergyMj(h) - e0 == pytest.approx(result.energy_mj)
    assert result.sm_clock_mhz == capped.sm_clock_mhz  # where the call ended
