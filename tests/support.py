"""What the tests share (imported as ``support``; ``tests/`` is on pytest's pythonpath)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DVFS = [sys.executable, "-m", "orchestrator.cli"]

# A trial as short as a test of the orchestration needs it (its row, status, GPU and times; not
# a figure anyone reads): 0.1 virtual seconds of timed calls over a simulated energy counter that
# updates every 10 ms (10 updates: a valid window at measure=quick's 4), then 4 checked calls.
# measure=quick alone (0.5 s over the A100's 100 ms counter, then as many checked calls as timed)
# costs each trial ~5x the host time in kernel calls: ~0.5 s of CPU. Tests of the window, the meter,
# the checks and the sim's counters use the presets themselves. The simulated machine must be
# made with the same counter period (``BRIEF_SIM``): its spec is compared when a sweep opens it.
BRIEF_SIM = {"energy_update_period_s": 0.01}
BRIEF_TRIAL = ("measure.window_s=0.1", "measure.check_iters=4",
               f"device.energy_update_period_s={BRIEF_SIM['energy_update_period_s']}")


def sim_slot(index: int, selections: set[str] | None = None, actor: object = None):
    """A pool slot for simulated GPU ``index`` (``GPU-<index>``), as its worker's identify makes
    it; no Ray."""
    from orchestrator.devices.base import DeviceIdentity
    from orchestrator.jobs.replies import WorkerInfo
    from orchestrator.launching.slot import Slot

    uuid = f"GPU-{index}"
    identity = DeviceIdentity(index, uuid, f"00000000:0{index}:00.0", "A100", "ampere", "550",
                              "sim")
    info = WorkerInfo(uuid, identity, str(index), None, "host", 100 + index)
    return Slot(info, actor=actor, selections=selections)


class GcSignal:
    """Deliver a signal inside a garbage-collector callback of the main thread, where it landed
    in JAX's ``_xla_gc_callback``: the handler's KeyboardInterrupt is raised there and Python
    drops it ("Exception ignored"). ``arm()`` (from any thread) makes the next collection in the
    main thread send it; until then collections pass by. A driver waiting in ``ray.wait`` frees
    what it allocates and may not collect for minutes, so an armed one collects at every
    allocation until it has sent the signal."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.sent: list[int] = []
        self._armed = False
        self._threshold = None

    def arm(self) -> None:
        """Send the signal at the main thread's next collection (made to come at once)."""
        import gc

        self._armed = True
        self._threshold = gc.get_threshold()
        gc.set_threshold(1)

    def _callback(self, phase: str, info: dict) -> None:
        import os
        import threading

        if phase != "start" or threading.current_thread() is not threading.main_thread():
            return  # signals are handled in the main thread only
        if self.sent or not self._armed:
            return
        self.sent.append(self.signum)
        self._disarm()
        os.kill(os.getpid(), self.signum)  # handled at the callback's next instruction: dropped

    def _disarm(self) -> None:
        import gc

        if self._threshold is not None:
            gc.set_threshold(*self._threshold)
            self._threshold = None


@contextlib.contextmanager
def signal_in_a_gc_callback(signum: int) -> Iterator[GcSignal]:
    """A ``GcSignal`` whose callback is installed for the block (``arm`` it to send)."""
    import gc

    sender = GcSignal(signum)
    gc.callbacks.append(sender._callback)
    try:
        yield sender
    finally:
        gc.callbacks.remove(sender._callback)
        sender._disarm()


def isothermal_profile(name: str, directory: Path) -> str:
    """The path of a copy of shipped profile ``name`` whose die holds the leakage reference
    temperature whatever it draws: ambient set so that the idle die sits at 60 C, and a thermal
    time constant of ~30 years. ``model.operating_point`` without a temperature is then exact for
    it: for tests of sensor and counter semantics against the steady-state model, which the die's
    heating (a simulated call's leakage follows it) would blur by a fraction of a percent."""
    import yaml

    from orchestrator.devices.sim.model import LEAKAGE_REF_C
    from orchestrator.devices.sim.profile import load_profile, profile_dir

    data = yaml.safe_load((profile_dir() / f"{name}.yaml").read_text())
    profile = load_profile(name)
    data["thermal"]["ambient_c"] = LEAKAGE_REF_C - profile.thermal_resistance_c_per_w * (
        profile.idle_power_w)
    data["thermal"]["time_constant_s"] = 1e9
    path = Path(directory) / f"{name}_isothermal.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def measured_as(profile, real: dict, lock: int | None, limit: float | None = None) -> dict:
    """What a board that *is* ``profile`` measures of ``real``'s work in its steady state at a
    locked SM clock and power limit (None: the board's default): ``real``, a measured row, with
    the model's time, power, energy, clock and throttle reasons in place of its own."""
    from orchestrator.devices.sim import calibration, model
    from orchestrator.realgpu.calibrate import peak_of

    row = dict(real, sm_clock_max_mhz=lock, power_limit_w=limit, throttle_reasons=None)
    point = model.operating_point(
        profile, calibration.row_work(row, peak_of(row)), max_clock_mhz=lock,
        power_limit_w=limit or profile.power_limit_default_w)
    row.update(time_per_iter_s=point.duration_s, avg_power_w=point.power_w,
               energy_per_iter_j=point.energy_mj / 1e3, observed_sm_clock_mhz=point.sm_clock_mhz,
               throttle_reasons=point.reasons.names() or None)
    return row
