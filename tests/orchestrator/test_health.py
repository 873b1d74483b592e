"""Device health: the sim's NVML health calls, ``Device.health()``, and a trial on a sick GPU."""

from __future__ import annotations

import pynvml
import pytest

from orchestrator.config import compose
from orchestrator.devices import journal_dir, open_backend
from orchestrator.devices.base import Health
from orchestrator.devices.sim import nvml as sim
from orchestrator.jobs.job import JobSpec
from orchestrator.measuring.guard import SettingsGuard
from orchestrator.measuring.journal import Journal
from orchestrator.measuring.trial import TrialContext, run_trial


@pytest.fixture
def backend(tmp_path):
    """A two-GPU simulated A100 machine, opened through the adapter."""
    b = open_backend({
        "backend": "sim",
        "state_dir": str(tmp_path / "sim"),
        "profile": "a100_sxm4_40gb",
        "count": 2,
    })
    yield b
    b.close()


def handle(index=0):
    return sim.nvmlDeviceGetHandleByIndex(index)


# --- the simulated NVML, as a pynvml client sees it -------------------------------------------
def test_the_sim_answers_pynvmls_health_calls_with_pynvmls_constants(backend):
    h = handle()
    assert sim.nvmlDeviceGetEccMode(h) == [pynvml.NVML_FEATURE_ENABLED] * 2
    for error in (
        pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    ):
        for counter in (pynvml.NVML_VOLATILE_ECC, pynvml.NVML_AGGREGATE_ECC):
            assert sim.nvmlDeviceGetTotalEccErrors(h, error, counter) == 0
    assert (
        sim.nvmlDeviceGetTemperatureThreshold(h, pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN) == 89
    )
    with pytest.raises(pynvml.NVMLError_NotSupported):
        sim.nvmlDeviceGetTemperatureThreshold(h, pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        sim.nvmlDeviceGetTotalEccErrors(h, 7, pynvml.NVML_VOLATILE_ECC)


def test_injected_ecc_errors_count_on_one_gpu_only(backend):
    sim.simDeviceInjectEccErrors(handle(0), 3)
    sim.simDeviceInjectEccErrors(handle(0), 5, pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED)
    unc, cor = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
    assert sim.nvmlDeviceGetTotalEccErrors(handle(0), unc, pynvml.NVML_AGGREGATE_ECC) == 3
    assert sim.nvmlDeviceGetTotalEccErrors(handle(0), cor, pynvml.NVML_VOLATILE_ECC) == 5
    assert sim.nvmlDeviceGetTotalEccErrors(handle(1), unc, pynvml.NVML_VOLATILE_ECC) == 0


def test_xids_arrive_as_events_registered_before_them(backend):
    early = sim.nvmlEventSetCreate()
    sim.nvmlDeviceRegisterEvents(handle(0), pynvml.nvmlEventTypeXidCriticalError, early)
    sim.simDeviceInjectXid(handle(0), 48)
    late = sim.nvmlEventSetCreate()
    sim.nvmlDeviceRegisterEvents(handle(0), pynvml.nvmlEventTypeXidCriticalError, late)
    sim.simDeviceInjectXid(handle(0), 94)
    got = sim.nvmlEventSetWait_v2(early, 0)
    assert (got.eventType, got.eventData, got.device) == (
        pynvml.nvmlEventTypeXidCriticalError, 48, handle(0)
    )
    assert sim.nvmlEventSetWait_v2(early, 0).eventData == 94
    with pytest.raises(pynvml.NVMLError_Timeout):
        sim.nvmlEventSetWait_v2(early, 0)
    assert sim.nvmlEventSetWait_v2(late, 0).eventData == 94  # it never sees the XID before it
    assert sim.simDeviceGetXidErrors(handle(0)) == [48, 94]
    assert sim.simDeviceGetXidErrors(handle(1)) == []
    sim.nvmlEventSetFree(early)
    sim.nvmlEventSetFree(late)


def test_a_lost_gpu_logs_xid_79(backend):
    h = handle(1)  # taken before the loss: NVML hands out no handle to a lost GPU
    sim.simDeviceSetLost(h, True)
    assert sim.simDeviceGetXidErrors(h) == [79]
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        sim.nvmlDeviceGetTotalEccErrors(h, 1, 0)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        handle(1)


# --- Device.health() -------------------------------------------------------------------------
def test_a_fresh_gpu_is_healthy(backend):
    assert backend.device(0).health() == Health(ok=True, reason=None, kind=None)


@pytest.mark.parametrize(
    "fault, kind, words",
    [
        (lambda h: sim.simDeviceSetLost(h, True), "lost", "is lost"),
        (lambda h: sim.simDeviceInjectXid(h, 48), "xid", "XID 48 (double-bit ECC error)"),
        (
            lambda h: sim.simDeviceInjectEccErrors(h, 2),
            "ecc",
            "2 uncorrected ECC error(s) since it was opened",
        ),
        (
            lambda h: sim.simDeviceSetTemperatureC(h, 95),
            "thermal",
            "at 95 C, at or above its slowdown threshold of 89 C",
        ),
    ],
)
def test_each_fault_makes_that_gpu_unhealthy_and_names_it(backend, fault, kind, words):
    d0, d1 = backend.device(0), backend.device(1)
    fault(handle(0))
    health = d0.health()
    assert not health.ok and health.kind == kind
    assert words in health.reason
    assert health.reason.startswith(f"GPU 0 ({d0.identity.uuid})") and "\n" not in health.reason
    assert d1.health().ok


def test_ecc_errors_and_xids_from_before_the_device_was_opened_do_not_count(backend):
    sim.simDeviceInjectEccErrors(handle(0), 4)
    sim.simDeviceInjectXid(handle(0), 48)
    assert backend.device(0).health().ok


def test_application_xids_and_corrected_ecc_errors_are_not_device_faults(backend):
    d = backend.device(0)
    for xid in (13, 31, 43, 45):
        sim.simDeviceInjectXid(handle(0), xid)
    sim.simDeviceInjectEccErrors(handle(0), 100, pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED)
    assert d.health().ok


def test_unhealthy_is_sticky_for_the_device_object(backend):
    d = backend.device(0)
    sim.simDeviceSetTemperatureC(handle(0), 91)
    first = d.health()
    sim.simDeviceSetTemperatureC(handle(0), 40)
    assert d.health() == first and not first.ok
    assert backend.device(0).health().ok  # a new Device starts afresh


def test_health_changes_nothing_on_the_device(backend):
    d = backend.device(0)
    before = sim.simDeviceGetTimeS(handle(0)), d.settings(), d.energy_mj()
    for _ in range(3):
        d.health()
    assert (sim.simDeviceGetTimeS(handle(0)), d.settings(), d.energy_mj()) == before


# --- a trial on a sick GPU --------------------------------------------------------------------
class NoKernels:
    """A kernel cache that fails the test if a trial gets as far as building a kernel."""

    def get(self, *a, **k):
        raise AssertionError("the trial ran on an unhealthy GPU")


class LosesTheGpu:
    """A kernel whose first call makes the GPU fall off the bus (as an XID 79 would)."""

    framework_version = "fake"

    def __init__(self, h):
        self.h = h

    def get(self, *a, **k):
        return self

    def dispatch(self):
        sim.simDeviceSetLost(self.h, True)
        return None

    def sync(self, handle):
        del handle


@pytest.fixture
def gpu0(tmp_path):
    """A TrialContext on GPU 0 of a fresh sim (its device opened now, as a worker's is)."""
    backend = open_backend(compose(SIM(tmp_path)).device)
    device = backend.device(0)
    guard = SettingsGuard(device, Journal(journal_dir(compose(SIM(tmp_path)).device))).__enter__()
    yield TrialContext(device=device, guard=guard, kernels=NoKernels(), sweep_id="test")
    sim.simDeviceSetLost(sim.simDeviceGetHandleByIndex(0), False)
    guard.close()
    backend.close()


def SIM(tmp_path):
    return ["workload.size=tiny", "measure=quick", f"device.state_dir={tmp_path / 'sim'}"]


def trial(ctx, tmp_path, kernels, *overrides):
    cfg = compose([*SIM(tmp_path), *overrides])
    ctx.kernels = kernels
    return run_trial(ctx, JobSpec.from_config(cfg))


def test_an_unhealthy_gpu_gives_not_measured_rows_and_no_setting_is_touched(gpu0, tmp_path):
    sim.simDeviceInjectEccErrors(handle(0), 1)
    rows = trial(gpu0, tmp_path, NoKernels(), "device.power_limit_w=250", "measure.repeats=2")
    assert [(r["status"], r["failed_by"]) for r in rows] == [("not_measured", "circumstances")] * 2
    uuid = gpu0.device.identity.uuid
    assert rows[0]["error"].startswith(f"not run: GPU 0 ({uuid}) had 1 uncorrected ECC error(s)")
    assert gpu0.device.settings().power_limit_w == 400
    assert gpu0.guard.journal.uuids() == []


def test_a_gpu_lost_during_a_trial_takes_no_further_trials(gpu0, tmp_path):
    rows = trial(gpu0, tmp_path, LosesTheGpu(handle(0)))
    assert rows[0]["status"] == "device_error" and "fallen off the bus" in rows[0]["error"]
    assert rows[0]["failed_by"] == "device"  # during its kernel calls: kept, no evidence
    # back on the bus (a lost GPU has no NVML handle: the sim's own lookup): still retired here
    sim.simDeviceSetLost(sim.simDeviceGetHandleByIndex(0), False)
    again = trial(gpu0, tmp_path, NoKernels())
    assert again[0]["status"] == "not_measured"  # before it began: nothing measured
    assert again[0]["error"].startswith(
        f"not run: GPU 0 ({gpu0.device.identity.uuid}) is lost"
    ), again[0]["error"]


def test_a_sweep_on_a_gpu_over_its_slowdown_temperature_records_why_and_a_rerun_measures_it(
    tmp_path,
):
    import os
    import subprocess

    from support import DVFS

    from orchestrator.results.store import ResultStore

    state = tmp_path / "sim"
    with open_backend({"backend": "sim", "state_dir": str(state)}):  # the sweep's own machine spec
        sim.simDeviceSetTemperatureC(handle(0), 95)
    sweep = [*DVFS, "sweep", "-m", "hydra/launcher=basic", *SIM(tmp_path), "measure.settle_s=0",
             f"hydra.sweep.dir={tmp_path / 'sweep'}", "device.sm_clock_mhz=1200,1305"]
    env = dict(os.environ, DVFS_SIM_STATE_DIR=str(state))
    out = subprocess.run(sweep, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    with ResultStore(tmp_path / "sweep", readonly=True) as store:
        rows = store.rows()
    assert [r["status"] for r in rows] == ["not_measured", "not_measured"]
    assert all("is at 95 C, at or above its slowdown threshold of 89 C" in r["error"] for r in rows)
    assert "not_measured: not run: GPU 0 (GPU-" in out.stdout
    assert not list((state / "journal").glob("*.json"))
    with open_backend({"backend": "sim", "state_dir": str(state)}):  # cooled down
        sim.simDeviceSetTemperatureC(handle(0), 40)
    again = subprocess.run(sweep, cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=300)
    assert again.returncode == 0, again.stderr
    with ResultStore(tmp_path / "sweep", readonly=True) as store:
        rows = store.rows()
    assert sorted((r["attempt"], r["status"]) for r in rows) == [
        (1, "not_measured"), (1, "not_measured"), (2, "ok"), (2, "ok")]  # both attempts kept
