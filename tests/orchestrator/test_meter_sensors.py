"""The meter over the simulated GPU with NVML's sensor artifacts on, against the sim's exact energy.

Each window is 2 s of virtual time in which power changes: the GPU idles 0.5 s and then runs a
compute-bound kernel (a load step), or two kernels alternate (a compute-bound and a memory-bound
one, a few milliseconds each). Ground truth is the sim's exact energy (``simDeviceGetEnergyMj``),
which no NVML reading returns. The counter path aligns its ends on counter updates as a trial's
window does; polling samples the instant reading the adapter names. Each case runs at eight
phases of the window against the sensors' 100 ms (20 ms on V100) update grid.
"""

from __future__ import annotations

import pynvml
import pytest

from orchestrator.devices import open_backend
from orchestrator.devices.base import KernelWork, PowerSensing
from orchestrator.devices.sim import nvml as sim
from orchestrator.devices.sim.device import SimBackend
from orchestrator.devices.sim.profile import load_profile
from orchestrator.errors import UserError
from orchestrator.measuring.meter import EnergyMeter, Sample, integrate_readings_j

PROFILES = ["a100_sxm4_40gb", "h100_sxm5_80gb", "h200_141gb", "v100_sxm2_16gb"]
PHASES_S = [k * 0.0137 for k in range(8)]  # where the window starts against the update grid
WINDOW_S = 2.0
IDLE_S = 0.5  # the load step's idle part


@pytest.fixture
def open_gpu(tmp_path, monkeypatch):
    """``open_gpu(profile)`` -> a simulated one-GPU device behind the NVML adapter (the one
    opened before is closed first: the simulated NVML, as NVML, is one machine per process)."""
    opened = []
    count = [0]

    def open_(profile, nvml=None):
        while opened:
            opened.pop().close()
        count[0] += 1
        state = tmp_path / f"sim{count[0]}"
        monkeypatch.setenv("DVFS_SIM_STATE_DIR", str(state))
        backend = open_backend({"backend": "sim", "state_dir": str(state), "profile": profile})
        opened.append(backend)
        if nvml is not None:  # the same GPU through another NVML module
            backend = SimBackend(nvml, "sim")
            opened.append(backend)
        return backend.device(0)

    yield open_
    for backend in reversed(opened):
        backend.close()


def works(device):
    """A compute-bound call (~2 ms) and a memory-bound one (~3 ms) for this board."""
    p = next(load_profile(k) for k in PROFILES if load_profile(k).name == device.identity.name)
    gemm = KernelWork(flops=p.peak_fp32_tflops * 1e12 * 0.002, bytes_moved=1e6, peak="fp32",
                      kernel_class="gemm", framework="jax")
    stream = KernelWork(flops=1e6, bytes_moved=p.memory_bandwidth_gbs * 1e9 * 0.003,
                        peak="fp32", kernel_class="stencil", framework="jax")
    return gemm, stream


class Activity:
    """What the GPU does over the window: a load step or two kernels alternating."""

    def __init__(self, device, scenario):
        self.device, self.scenario = device, scenario
        self.gemm, self.stream = works(device)
        self.t0 = None
        self.turn = 0

    def step(self):
        """One accounted interval (a call, or 1 ms idle) of the activity at the current time."""
        d = self.device
        if self.scenario == "step" and (self.t0 is None or d.now_s() - self.t0 < IDLE_S):
            d.idle(0.001)
        elif self.scenario == "step":
            d.on_kernel_call(self.gemm)
        else:
            self.turn += 1
            d.on_kernel_call(self.gemm if self.turn % 2 else self.stream)


def measure(device, meter, scenario, phase_s):
    """Run one window as a trial does (counter edges at both ends); (Measurement, truth J)."""
    h = sim.nvmlDeviceGetHandleByIndex(0)
    device.idle(1.0 + phase_s)
    activity = Activity(device, scenario)
    meter.arm()

    def until_counter_moves():
        seen = meter.counter_updates()
        while meter.counter_updates() == seen:
            activity.step()
            meter.tick()

    if meter.method == "counter":
        until_counter_moves()
    meter.start()
    e0, activity.t0 = sim.simDeviceGetEnergyMj(h), device.now_s()
    while device.now_s() - activity.t0 < WINDOW_S:
        activity.step()
        meter.tick()
    if meter.method == "counter":
        until_counter_moves()
    m = meter.stop()
    return m, (sim.simDeviceGetEnergyMj(h) - e0) / 1000.0


def errors(open_gpu, profile, method, scenario, meter=EnergyMeter):
    out = []
    for phase_s in PHASES_S:
        device = open_gpu(profile)
        m, truth_j = measure(device, meter(device, method=method), scenario, phase_s)
        out.append(m.energy_j / truth_j - 1)
    return out


@pytest.mark.parametrize("scenario", ["step", "alternating"])
@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.slow
def test_the_counter_is_within_half_a_percent_of_the_exact_energy(open_gpu, profile, scenario):
    errs = errors(open_gpu, profile, "counter", scenario)
    assert max(map(abs, errs)) <= 0.005, errs


@pytest.mark.parametrize("scenario", ["step", "alternating"])
@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.slow
def test_polling_the_instant_reading_is_within_3_percent_over_2_s(open_gpu, profile, scenario):
    errs = errors(open_gpu, profile, "polling", scenario)
    assert max(map(abs, errs)) <= 0.03, errs


class NaiveMeter:
    """The meter this project had: ``nvmlDeviceGetPowerUsage`` at 20 Hz, taken as the power of
    the interval since the previous sample (``sum(p_i * (t_i - t_{i-1}))``)."""

    method = "polling"

    def __init__(self, device, method="polling"):
        self.device, self.samples, self.next_t = device, [], 0.0

    def arm(self):
        pass

    def start(self):
        self.samples = [(self.device.now_s(), self.device.power_mw())]
        self.next_t = self.samples[0][0] + 0.05

    def tick(self):
        if self.device.now_s() >= self.next_t:
            self.samples.append((self.device.now_s(), self.device.power_mw()))
            self.next_t += 0.05

    def stop(self):
        self.samples.append((self.device.now_s(), self.device.power_mw()))
        energy_j = sum(b[1] / 1000 * (b[0] - a[0]) for a, b in zip(self.samples, self.samples[1:]))
        return type("M", (), {"energy_j": energy_j})()


@pytest.mark.parametrize("profile", ["h100_sxm5_80gb", "h200_141gb"])
def test_polling_hoppers_one_second_average_as_if_instant_is_wrong_on_a_load_step(
    open_gpu, profile
):
    errs = errors(open_gpu, profile, "polling", "step", meter=NaiveMeter)
    assert min(map(abs, errs)) > 0.10, errs  # every phase: the 1 s average lags the step
    assert all(e < 0 for e in errs)  # it misses most of the load's first second


class _OldDriver:
    """The simulated NVML under a driver without the power fields (an unknown field id is
    INVALID_ARGUMENT in the field's own return code)."""

    def __getattr__(self, name):
        return getattr(sim, name)

    def nvmlDeviceGetFieldValues(self, handle, fieldIds):
        values = sim.nvmlDeviceGetFieldValues(handle, fieldIds)
        for v in values:
            if v.fieldId in (pynvml.NVML_FI_DEV_POWER_INSTANT, pynvml.NVML_FI_DEV_POWER_AVERAGE):
                v.nvmlReturn = pynvml.NVML_ERROR_INVALID_ARGUMENT
        return values


def test_polling_is_refused_where_the_only_reading_is_a_one_second_average(open_gpu):
    device = open_gpu("h100_sxm5_80gb", nvml=_OldDriver())
    with pytest.raises(UserError, match="1 s average.*measure.meter=counter"):
        EnergyMeter(device, method="polling")
    meter = EnergyMeter(device)  # auto: the counter, which is exact at its edges
    assert meter.method == "counter"
    m, truth_j = measure(device, meter, "step", 0.0)
    assert m.energy_j == pytest.approx(truth_j, rel=0.005)
    assert m.power_reading == "usage (1 s average)"  # its peak power is smeared, and says so


@pytest.mark.parametrize(
    ("profile", "reading"),
    [("a100_sxm4_40gb", "usage"), ("h100_sxm5_80gb", "instant"), ("v100_sxm2_16gb", "usage")],
)
def test_a_measurement_names_the_reading_its_power_figures_come_from(open_gpu, profile, reading):
    device = open_gpu(profile)
    m, _ = measure(device, EnergyMeter(device, method="polling"), "alternating", 0.0)
    assert m.power_reading == reading


@pytest.mark.parametrize(
    ("profile", "method", "interval_s"),
    [("a100_sxm4_40gb", "polling", 0.025), ("v100_sxm2_16gb", "polling", 0.005),
     ("a100_sxm4_40gb", "counter", 0.05)],
)
def test_polling_samples_at_least_four_times_per_update_of_the_reading(
    open_gpu, profile, method, interval_s
):
    meter = EnergyMeter(open_gpu(profile), method=method, poll_hz=20)
    assert meter.period_s == pytest.approx(interval_s)


# --- the integration itself ------------------------------------------------------------------
def samples(points):
    return [Sample(t_s=t, power_mw=mw, energy_mj=None, sm_clock_mhz=0, reasons=0)
            for t, mw in points]


def test_a_steady_reading_integrates_to_power_times_time():
    steady = samples([(t / 40, 250_000) for t in range(81)])
    assert integrate_readings_j(steady, 0.0, 2.0, None) == pytest.approx(500.0)


def test_a_new_value_begins_halfway_between_the_samples_that_saw_it_less_its_lag():
    sensing = PowerSensing("instant", period_s=0.1, window_s=0.02, note="")  # lag 60 ms
    seen = samples([(0.0, 100_000), (0.5, 100_000), (0.6, 300_000), (1.0, 300_000)])
    # 100 W until 0.55 - 0.06 = 0.49 s, then 300 W
    assert integrate_readings_j(seen, 0.0, 1.0, sensing) == pytest.approx(100 * 0.49 + 300 * 0.51)
    assert integrate_readings_j(seen, 0.0, 1.0, None) == pytest.approx(100 * 0.55 + 300 * 0.45)

