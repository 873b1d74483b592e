"""The energy meter's own mechanics over the simulated A100: counter wrap-around, the background
reader a hardware GPU gets, and an idle gap inside a window.

Ground truth is the sim's exact energy (``simDeviceGetEnergyMj``), which no NVML reading returns.
Where the sim does not do what a real driver does (its counter never wraps; its GPUs declare
themselves simulated, so the meter samples on ``tick()`` instead of a thread), the test puts the
sim behind a thin NVML module that differs in that one respect only: a counter offset as a
driver loaded long ago shows it, or a backend named ``nvml``. Everything else is the sim's.
"""

from __future__ import annotations

import threading
import time

import pytest

from orchestrator.devices import open_backend
from orchestrator.devices.base import KernelWork
from orchestrator.devices.sim import nvml as sim
from orchestrator.devices.sim.device import SimBackend
from orchestrator.devices.sim.profile import load_profile
from orchestrator.errors import DeviceError
from orchestrator.measuring.meter import COUNTER_MODULUS_MJ, EnergyMeter, metered

PROFILE = load_profile("a100_sxm4_40gb")
GEMM = KernelWork(flops=PROFILE.peak_fp32_tflops * 1e12 * 0.002, bytes_moved=1e6, peak="fp32",
                  kernel_class="gemm", framework="jax")  # ~2 ms, compute-bound
WAIT_S = 30.0  # the longest the test waits (wall time) for the meter's thread to take a reading


@pytest.fixture
def machine(tmp_path, monkeypatch):
    """``machine(nvml=None, backend="sim")`` -> GPU 0 of a fresh simulated A100, behind ``nvml``
    (a module over the sim's) and declaring ``backend`` when given. The machine opened before is
    closed first: the simulated NVML, as NVML, is one machine per process."""
    opened = []

    def open_(nvml=None, backend="sim"):
        while opened:
            opened.pop().close()
        state = tmp_path / f"sim{len(list(tmp_path.iterdir()))}"
        monkeypatch.setenv("DVFS_SIM_STATE_DIR", str(state))
        opened.append(open_backend({"backend": "sim", "state_dir": str(state),
                                    "profile": "a100_sxm4_40gb"}))
        if nvml is not None or backend != "sim":  # the same GPU through another NVML module
            opened.append(SimBackend(nvml or sim, backend))
        return opened[-1].device(0)

    yield open_
    for backend in reversed(opened):
        backend.close()


def exact_mj() -> float:
    """The simulated GPU 0's exact energy so far (mJ)."""
    return sim.simDeviceGetEnergyMj(sim.nvmlDeviceGetHandleByIndex(0))


def run_until(device, meter, seconds, *, idle_s=0.0):
    """Kernel calls (or ``idle_s`` idle steps) for ``seconds`` of device time, ticking the meter."""
    t0 = device.now_s()
    while device.now_s() - t0 < seconds:
        if idle_s:
            device.idle(idle_s)
        else:
            device.on_kernel_call(GEMM)
        meter.tick()


def until_counter_moves(device, meter):
    """Run kernel calls until the energy counter updates (a window's edges sit on updates)."""
    seen = meter.counter_updates()
    while meter.counter_updates() == seen:
        device.on_kernel_call(GEMM)
        meter.tick()


# --- wrap-around -----------------------------------------------------------------------------
class LongLoadedDriver:
    """The simulated NVML as a driver loaded long ago shows it: the energy counter is an unsigned
    64-bit value that started ``offset_mj`` below the sim's and wraps at 2**64 (the sim's never
    does). Everything else is the sim's own."""

    def __init__(self, offset_mj: int) -> None:
        self.offset_mj = offset_mj

    def __getattr__(self, name):
        return getattr(sim, name)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        """The sim's counter, offset and wrapped as an unsigned 64-bit value."""
        return (sim.nvmlDeviceGetTotalEnergyConsumption(handle) + self.offset_mj) % (
            COUNTER_MODULUS_MJ)


def wrap_after(driver: LongLoadedDriver, energy_j: float) -> None:
    """Set ``driver``'s offset so that its counter wraps ``energy_j`` from now."""
    raw = sim.nvmlDeviceGetTotalEnergyConsumption(sim.nvmlDeviceGetHandleByIndex(0))
    driver.offset_mj = COUNTER_MODULUS_MJ - raw - int(energy_j * 1000)


def measure_counter(device, meter, seconds):
    """A window of ``seconds`` of load, its edges on counter updates; (Measurement, truth J)."""
    meter.arm()
    until_counter_moves(device, meter)
    meter.start()
    e0 = exact_mj()
    run_until(device, meter, seconds)
    until_counter_moves(device, meter)
    m = meter.stop()
    return m, (exact_mj() - e0) / 1000.0


def test_a_counter_that_wraps_inside_the_window_is_unwrapped(machine):
    driver = LongLoadedDriver(0)
    device = machine(nvml=driver)
    device.idle(1.0)  # a machine that has run a while
    wrap_after(driver, 100.0)
    m, truth_j = measure_counter(device, EnergyMeter(device, method="counter"), 1.0)
    start_mj, end_mj = m.samples[0].energy_mj, m.samples[-1].energy_mj
    assert start_mj > COUNTER_MODULUS_MJ - 100_000 and end_mj < start_mj  # it did wrap
    assert truth_j > 100.0  # ~400 W for 1 s: far past the wrap
    assert m.energy_j == pytest.approx(truth_j, rel=0.005)
    assert m.avg_power_w == pytest.approx(truth_j / m.time_s, rel=0.005)


def test_a_counter_about_to_wrap_reads_the_same_joules_as_one_far_from_it(machine):
    """The same work on two fresh machines, one behind a counter that wraps 50 J into it."""
    results = []
    for wraps in (False, True):
        driver = LongLoadedDriver(0)
        device = machine(nvml=driver)
        if wraps:
            wrap_after(driver, 50.0)
        m, _ = measure_counter(device, EnergyMeter(device, method="counter"), 0.5)
        results.append(m.energy_j)
    assert results[0] > 50.0 and results[1] == pytest.approx(results[0], rel=1e-9)


# --- the background reader -------------------------------------------------------------------
class WatchedDriver:
    """The simulated NVML, with a log of every sensor reading: (thread name, device time, call,
    value). The GPU it opens declares backend ``nvml``, so the meter reads it from its thread."""

    SENSORS = ("nvmlDeviceGetPowerUsage", "nvmlDeviceGetTotalEnergyConsumption")

    def __init__(self) -> None:
        self.log: list[tuple[str, float, str, int]] = []
        self.lock = threading.Lock()

    def __getattr__(self, name):
        fn = getattr(sim, name)
        if name not in self.SENSORS:
            return fn

        def read(handle):
            value = fn(handle)
            with self.lock:
                self.log.append((threading.current_thread().name, sim.simDeviceGetTimeS(handle),
                                 name, value))
            return value

        return read

    def thread_reads(self, call: str) -> list[tuple[float, int]]:
        """(device time, value) of the readings of ``call`` the meter's thread took."""
        with self.lock:
            return [(t, v) for who, t, name, v in self.log if who == "dvfs-meter" and name == call]

    def wait_for_thread_read(self, call: str, at_s: float) -> None:
        """Block until the meter's thread has read ``call`` at device time ``at_s`` or later."""
        deadline = time.monotonic() + WAIT_S
        while not any(t >= at_s for t, _ in self.thread_reads(call)):
            assert time.monotonic() < deadline, f"the meter's thread took no {call} at {at_s}"
            time.sleep(0.001)

    def wait_for_thread_value(self, call: str, value: int) -> None:
        """Block until the meter's thread has read ``value`` (or more) from ``call``: the time a
        read is logged at is taken after its value, so a read logged after a change may still
        hold the value from before it (the race a loaded machine showed)."""
        deadline = time.monotonic() + WAIT_S
        while not any(v >= value for _, v in self.thread_reads(call)):
            assert time.monotonic() < deadline, f"the meter's thread never read {value}"
            time.sleep(0.001)


def meter_threads() -> list[threading.Thread]:
    """The meter's background readers alive now (each is named ``dvfs-meter``)."""
    return [t for t in threading.enumerate() if t.name == "dvfs-meter" and t.is_alive()]


def test_on_hardware_a_thread_samples_power_and_the_window_integrates_it(machine):
    driver = WatchedDriver()
    device = machine(nvml=driver, backend="nvml")
    meter = EnergyMeter(device, method="polling")
    run_until(device, meter, 1.0)  # a steady load before the window, so every reading is of it
    meter.arm()
    assert len(meter_threads()) == 1
    meter.start()
    e0, t0 = exact_mj(), device.now_s()
    due = t0 + meter.period_s
    while device.now_s() - t0 < 1.0:
        device.on_kernel_call(GEMM)
        meter.tick()  # returns at once on hardware: the thread does the sampling
        if device.now_s() >= due:  # a sample is due: the device waits for the thread's reading
            driver.wait_for_thread_read("nvmlDeviceGetPowerUsage", device.now_s())
            due += meter.period_s * (1 + (device.now_s() - due) // meter.period_s)
    m = meter.stop()
    truth_j = (exact_mj() - e0) / 1000.0
    taken = driver.thread_reads("nvmlDeviceGetPowerUsage")
    assert meter_threads() == []  # stop() ended the thread
    assert len(taken) >= 1.0 / meter.period_s - 1  # one per period, all from the thread
    assert len(m.samples) == len(taken) + 2  # plus the window's two edges, read by the caller
    times = [s.t_s for s in m.samples]
    periods = [int((t - times[0]) / meter.period_s) for t in times[1:-1]]
    assert times == sorted(times) and len(set(periods)) == len(periods)  # one per period
    assert m.method == "polling" and m.energy_j == pytest.approx(truth_j, rel=0.01)
    device.idle(1.0)  # after stop() nothing reads the device any more
    time.sleep(0.05)
    assert driver.thread_reads("nvmlDeviceGetPowerUsage") == taken


def test_on_hardware_a_thread_watches_the_counter_and_records_its_update_period(machine):
    driver = WatchedDriver()
    device = machine(nvml=driver, backend="nvml")
    meter = EnergyMeter(device, method="counter")
    meter.arm()
    until_counter_moves(device, meter)
    meter.start()
    t0 = device.now_s()
    last = m0 = sim.nvmlDeviceGetTotalEnergyConsumption(sim.nvmlDeviceGetHandleByIndex(0))
    moved = 0
    while device.now_s() - t0 < 1.0:
        device.on_kernel_call(GEMM)  # no tick() and no counter_updates() here: only the thread
        now = sim.nvmlDeviceGetTotalEnergyConsumption(sim.nvmlDeviceGetHandleByIndex(0))
        if now != last:  # the counter updated: the device waits until the thread has seen it
            driver.wait_for_thread_value("nvmlDeviceGetTotalEnergyConsumption", now)
            last, moved = now, moved + 1
    m = meter.stop()
    assert meter_threads() == []
    assert moved >= 9 and m.counter_updates == moved  # every update, seen by the thread
    assert m.samples[0].energy_mj == m0 and m.samples[-1].energy_mj == last
    assert m.counter_period_s == pytest.approx(PROFILE.energy_counter_period_s, abs=0.005)


def test_close_stops_the_thread_and_may_be_called_twice(machine):
    meter = EnergyMeter(machine(backend="nvml"), method="polling")
    meter.arm()
    assert len(meter_threads()) == 1
    meter.close()
    meter.close()
    assert meter_threads() == []


def test_metered_measures_all_of_what_it_runs_and_closes_its_meter_whatever_happens(machine):
    """One call meters a span: what ``run`` returns, and the counter's energy over all of it
    (no edge to wait for: the span's own ends); its reader is stopped after a failure too."""
    device = machine()
    t0 = device.now_s()

    def run(meter):
        run_until(device, meter, 0.5)
        return "ran"

    done, m = metered(device, run, method="counter")
    assert done == "ran" and m.method == "counter"
    assert m.time_s == pytest.approx(device.now_s() - t0, abs=1e-3)
    assert m.energy_j > 0 and m.counter_updates >= 3  # ~100 ms updates over 0.5 s

    def fail(meter):
        assert len(meter_threads()) == 1  # a hardware GPU's reader runs while it runs
        raise RuntimeError("the program broke")

    with pytest.raises(RuntimeError, match="the program broke"):
        metered(machine(backend="nvml"), fail, method="polling")
    assert meter_threads() == []


class OneBadReadDriver:
    """The simulated NVML whose energy read fails once, after ``fail`` is set, with NVML's own
    error for a driver that did not answer (the read after it succeeds). Everything else is the
    sim's."""

    def __init__(self) -> None:
        self.fail = threading.Event()

    def __getattr__(self, name):
        return getattr(sim, name)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        if self.fail.is_set():
            self.fail.clear()
            raise sim.NVMLError(sim.NVML_ERROR_UNKNOWN)
        return sim.nvmlDeviceGetTotalEnergyConsumption(handle)


def test_a_reader_thread_that_fails_mid_window_fails_the_window_not_silently(machine):
    """A thread that raises dies with a line on stderr and nothing else happens: the window would
    close on a good final read, every counter update after the error unseen, and be stored. The
    error reaches ``stop()`` instead."""
    driver = OneBadReadDriver()
    device = machine(nvml=driver, backend="nvml")
    meter = EnergyMeter(device, method="counter")
    meter.arm()
    meter.start()
    run_until(device, meter, 0.1)
    driver.fail.set()
    deadline = time.monotonic() + WAIT_S
    while meter_threads() and time.monotonic() < deadline:
        time.sleep(0.01)  # the reader's next read raises and ends it
    assert meter_threads() == [] and not driver.fail.is_set()
    with pytest.raises(DeviceError, match="nvmlDeviceGetTotalEnergyConsumption"):
        meter.stop()
    meter.close()  # never raises: it runs in finally blocks


def test_on_the_sim_no_thread_is_started_and_tick_samples(machine):
    device = machine()
    meter = EnergyMeter(device, method="polling")
    meter.arm()
    assert meter_threads() == []
    meter.start()
    run_until(device, meter, 0.5)
    m = meter.stop()
    assert len(m.samples) >= 0.5 / meter.period_s


# --- an idle gap inside a window -------------------------------------------------------------
def measure_with_gap(device, meter, gap_s, idle_step_s):
    """A window of 0.4 s of load, ``gap_s`` idle (in steps of ``idle_step_s``), 0.4 s of load,
    its edges on counter updates where the meter has a counter; (Measurement, truth J)."""
    meter.arm()
    if meter.method == "counter":
        until_counter_moves(device, meter)
    meter.start()
    e0 = exact_mj()
    run_until(device, meter, 0.4)
    run_until(device, meter, gap_s, idle_s=idle_step_s)
    run_until(device, meter, 0.4)
    if meter.method == "counter":
        until_counter_moves(device, meter)
    m = meter.stop()
    return m, (exact_mj() - e0) / 1000.0


@pytest.mark.parametrize("idle_step_s", [0.6, 0.001], ids=["one idle call", "idle in 1 ms steps"])
def test_the_counter_counts_an_idle_gap_at_idle_power(machine, idle_step_s):
    device = machine()
    m, truth_j = measure_with_gap(device, EnergyMeter(device, method="counter"), 0.6, idle_step_s)
    assert m.time_s >= 1.4
    assert m.energy_j == pytest.approx(truth_j, rel=0.005)
    load_w = max(s.power_mw for s in m.samples) / 1000.0
    assert PROFILE.idle_power_w < m.avg_power_w < load_w  # the gap pulled the mean down
    # the update period is the median gap between updates: one long gap does not move it
    assert m.counter_period_s == pytest.approx(PROFILE.energy_counter_period_s, abs=0.005)


def test_polling_samples_an_idle_gap_and_integrates_it(machine):
    device = machine()
    meter = EnergyMeter(device, method="polling")
    m, truth_j = measure_with_gap(device, meter, 0.6, 0.001)
    assert m.energy_j == pytest.approx(truth_j, rel=0.03)
    idle = [s for s in m.samples if s.power_mw / 1000.0 < PROFILE.idle_power_w * 1.05]
    assert len(idle) >= 0.4 / meter.period_s  # most of the gap's samples read idle power


# --- the window on hardware: the loop reads no sensor ---------------------------------------------
class PacedDriver(WatchedDriver):
    """``WatchedDriver`` that also logs every kernel call (as ``call``) and makes each take a
    millisecond of wall time, as a GPU's would, so the meter's thread sees the counter move
    within a call or two, as on hardware."""

    def __getattr__(self, name):
        if name != "simDeviceRecordKernelCall":
            return super().__getattr__(name)

        def call(handle, work):
            time.sleep(0.001)
            result = sim.simDeviceRecordKernelCall(handle, work)
            with self.lock:
                self.log.append((threading.current_thread().name,
                                 sim.simDeviceGetTimeS(handle), "call", 0))
            return result

        return call


def test_on_hardware_the_window_reads_no_sensor_between_its_calls(machine):
    """An NVML read takes milliseconds on some machines (~5 ms on one H200 VM), during which a
    GPU whose host waits runs nothing: inside a window, edge waits included, only the meter's
    thread reads; the window opens and closes at the counter edges that thread saw, and counts
    only the calls between them."""
    import numpy as np

    from kernels import KernelCache, KernelOptions
    from orchestrator.config import compose
    from orchestrator.jobs.job import JobSpec
    from orchestrator.measuring.window import measure_window

    driver = PacedDriver()
    device = machine(nvml=driver, backend="nvml")
    kernel = KernelCache().get(KernelOptions("stencil", framework="jax", preset="tiny",
                                             dtype="float32", precision="default", seed=0,
                                             xla=False))
    m = JobSpec.from_config(compose(["measure=quick", "measure.window_s=0.5",
                                     "measure.check_iters=4"])).config.measure
    window = measure_window(kernel, device, GEMM, m, np.random.default_rng(0))
    assert meter_threads() == []
    main = [name for who, _, name, _ in driver.log if who == "MainThread"]
    after_first_call = main[main.index("call"):]
    runs = "".join("c" if name == "call" else "r" for name in after_first_call)
    # every read of the main thread after the window's first call is one block: stop()'s,
    # between the window's last call and the check run's first; none between two window calls
    assert runs.strip("c").count("r") == len(runs.strip("c")) > 0, runs
    assert runs.rstrip("c").lstrip("c").count("c") == 0
    assert runs.endswith("c" * m.check_iters)
    measurement = window.measurement
    edges = [t for who, t, name, v in driver.log
             if who == "dvfs-meter" and name == "nvmlDeviceGetTotalEnergyConsumption"]
    assert window.aligned is True and measurement.counter_updates >= 4
    assert measurement.samples[0].t_s >= min(edges) and measurement.time_s > 0.4
    assert measurement.samples[-1].t_s <= max(t for _, t, name, _ in driver.log if name == "call")
