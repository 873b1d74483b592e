"""The launcher's pieces that need no Ray: GPU mapping, settings, fault injection, progress."""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import pytest

from orchestrator.devices.mapping import gpu_uuid_for, pci_order_key
from orchestrator.errors import DeviceNotFoundError, UserError
from orchestrator.jobs.checks import validate_inject
from orchestrator.launching.batch import distinct_overrides
from orchestrator.launching.settings import LaunchSettings
from orchestrator.measuring import inject
from orchestrator.progress import Progress, format_duration


@dataclass
class Identity:
    index: int
    uuid: str
    pci_bus_id: str
    backend: str = "sim"


@dataclass
class Dev:
    identity: Identity


# NVML's index order (here: made up) is not what CUDA numbers under PCI_BUS_ID.
DEVICES = [
    Dev(Identity(0, "GPU-c", "00000000:C1:00.0")),
    Dev(Identity(1, "GPU-a", "00000000:07:00.0")),
    Dev(Identity(2, "GPU-b", "00000000:41:00.0")),
]


def test_a_ray_gpu_ordinal_is_the_gpu_in_pci_bus_order_never_the_nvml_index():
    assert [gpu_uuid_for(DEVICES, k) for k in (0, 1, 2)] == ["GPU-a", "GPU-b", "GPU-c"]
    assert gpu_uuid_for(DEVICES, "2") == "GPU-c"
    assert (
        pci_order_key("0000:07:00.0")
        < pci_order_key("0000:41:00.0")
        < pci_order_key("0001:01:00.0")
    )


def test_a_ray_gpu_id_that_is_a_uuid_names_the_gpu_and_an_unknown_one_is_refused():
    assert gpu_uuid_for(DEVICES, "GPU-b") == "GPU-b"
    with pytest.raises(DeviceNotFoundError, match="NVML does not list"):
        gpu_uuid_for(DEVICES, "GPU-zzz")
    with pytest.raises(DeviceNotFoundError, match="this node has 3 GPU"):
        gpu_uuid_for(DEVICES, 3)


def test_a_lost_gpu_keeps_its_place_in_the_order_and_its_ordinal_says_it_is_lost():
    """NVML refuses a lost GPU's handle, so nothing of it (not its PCI id) can be read: it keeps
    its NVML index's place (NVML lists GPUs in PCI order), and the others map as before."""
    from orchestrator.errors import DeviceLostError

    ordered = [Dev(Identity(0, "GPU-a", "00000000:07:00.0")), 1,
               Dev(Identity(2, "GPU-c", "00000000:C1:00.0"))]
    assert [gpu_uuid_for(ordered, k) for k in (0, 2)] == ["GPU-a", "GPU-c"]
    with pytest.raises(DeviceLostError, match="Ray gave this worker GPU 1, which has fallen off"):
        gpu_uuid_for(ordered, 1)


def test_launcher_settings_accept_any_every_or_uuids_and_refuse_the_rest():
    assert LaunchSettings.from_mapping({"placement": "every"}).placement == "every"
    assert LaunchSettings.from_mapping({"placement": ["GPU-a", "GPU-b"]}).placement == (
        "GPU-a",
        "GPU-b",
    )
    assert LaunchSettings.from_mapping({"address": "null", "_target_": "x"}).address is None
    with pytest.raises(UserError, match="placement='some' is not one of"):
        LaunchSettings.from_mapping({"placement": "some"})
    with pytest.raises(UserError, match="list of GPU UUIDs"):
        LaunchSettings.from_mapping({"placement": [0, 1]})
    with pytest.raises(UserError, match="timeout_s=-1 must be greater than 0 and at most 86400 s"):
        LaunchSettings.from_mapping({"timeout_s": -1})


def test_messages_name_only_what_sets_a_job_apart():
    jobs = [["measure=quick", "seed=1", "x=1"], ["measure=quick", "seed=1", "x=2"]]
    assert distinct_overrides(jobs) == ["x=1", "x=2"]
    assert distinct_overrides([["a=1"]]) == ["a=1"]


def test_fault_injection_is_refused_on_real_gpus_and_checked_for_typos():
    assert validate_inject(None, "nvml") is None and validate_inject({}, "nvml") is None
    with pytest.raises(UserError, match="refused on device.backend=nvml"):
        validate_inject({"hang_s": 1}, "nvml")
    with pytest.raises(UserError, match="unknown key"):
        validate_inject({"hang": 1}, "sim")
    with pytest.raises(UserError, match="exactly one of"):
        validate_inject({"hang_s": 1, "exit_process": True}, "sim")


def test_an_armed_fault_fires_at_its_call_on_its_gpu_and_only_times_times(tmp_path, monkeypatch):
    monkeypatch.setenv("DVFS_SIM_STATE_DIR", str(tmp_path))
    gpu0, gpu1 = DEVICES[0], DEVICES[1]
    spec = {"raise_error": "boom", "at_call": 2, "gpu": 1, "times": 1}
    assert not inject.arm(spec, gpu0, sweep_id="s")  # another GPU
    assert inject.arm(spec, gpu1, sweep_id="s")
    inject.on_kernel_call(gpu1)  # call 1: nothing
    with pytest.raises(inject.InjectedFault, match="boom"):
        inject.on_kernel_call(gpu1)
    assert not inject.arm(spec, gpu1, sweep_id="s")  # fired once: counted on disk, not again
    assert inject.arm(spec, gpu1, sweep_id="another sweep")
    inject.disarm(gpu1)
    inject.on_kernel_call(gpu1)
    inject.on_kernel_call(gpu1)  # disarmed: nothing fires


def test_progress_writes_plain_lines_off_a_terminal_and_a_final_line():
    err, out = io.StringIO(), io.StringIO()
    p = Progress(3, stream=err, out=out, tty=False, plain_every_s=0.0)
    p.set_lane("gpu0", "gemm/jax@1065")
    p.set_lane("gpu1", "idle")
    p.trial_done("ok", 2.0)
    p.trial_done("timeout", 4.0)
    p.log("a summary")
    p.finish("done: dvfs report DIR")
    lines = err.getvalue().splitlines()
    assert lines[0].startswith(
        "[1/3] 1 ok, 0 failed, 2 left | gpu0: gemm/jax@1065  gpu1: idle | ETA 0:02"
    )
    assert lines[1].startswith("[2/3] 1 ok, 1 failed, 1 left")
    assert lines[-1] == "done: dvfs report DIR" and "\r" not in err.getvalue()
    assert out.getvalue() == "a summary\n"
    assert format_duration(75) == "1:15" and format_duration(3725) == "1:02:05"


def test_progress_redraws_one_line_in_place_on_a_terminal():
    err = io.StringIO()
    p = Progress(2, stream=err, out=io.StringIO(), tty=True, redraw_s=0.0)
    p.trial_done("ok", 1.0)
    p.finish("end")
    text = err.getvalue()
    assert text.startswith("\r\x1b[2K[1/2]") and text.endswith("\r\x1b[2Kend\n")


def test_worker_module_imports_neither_ray_nor_a_framework():
    import subprocess
    import sys

    code = (
        "import sys, orchestrator.launching.launch; "
        "print(sorted(m for m in ('ray', 'jax', 'tensorflow') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert out.stdout.strip() == "[]"


def _busy_slot():
    from support import sim_slot

    from orchestrator.launching.slot import Call

    slot = sim_slot(0, actor="worker")
    slot.begin(Call.ACQUIRE, "acquire-ref")
    slot.end_call()
    slot.begin(Call.WARM, "warm-ref")
    slot.end_call()
    slot.mark_idle()
    slot.begin(Call.RUN, "ref-1", deadline=10.0, job="job-1")
    return slot


def test_a_busy_slot_queues_one_trial_that_is_in_flight_once_the_one_before_is_answered():
    from orchestrator.launching.slot import SlotState, SlotStateError

    slot = _busy_slot()
    assert slot.may_queue
    slot.queue("ref-2", "job-2")
    assert not slot.may_queue and slot.queued.job == "job-2"
    with pytest.raises(SlotStateError, match="one queued already"):
        slot.queue("ref-3", "job-3")
    assert (slot.ref, slot.job, slot.deadline) == ("ref-1", "job-1", 10.0)
    with pytest.raises(SlotStateError, match="call still in flight"):
        slot.promote(20.0)  # not before the trial ahead of it is answered
    slot.end_call()
    assert slot.take_trial().job == "job-1"
    promoted = slot.promote(20.0)
    assert (promoted.job, slot.ref, slot.job, slot.deadline) == ("job-2", "ref-2", "job-2", 20.0)
    assert slot.state is SlotState.BUSY and slot.queued is None and slot.may_queue
    slot.end_call()
    assert slot.take_trial().job == "job-2"
    slot.mark_idle()
    with pytest.raises(SlotStateError, match="IDLE"):
        slot.queue("ref-4", "job-4")  # an idle GPU is sent a trial to run, not to queue


def test_a_queued_trial_is_taken_back_before_its_worker_is_replaced_or_its_gpu_retired():
    from orchestrator.launching.slot import Call, SlotStateError

    slot = _busy_slot()
    slot.queue("ref-2", "job-2")
    slot.end_call()
    slot.take_trial()
    with pytest.raises(SlotStateError, match="trial queued"):
        slot.begin(Call.IDENTIFY, "identify-ref")  # a new worker would never run it
    with pytest.raises(SlotStateError, match="trial queued"):
        slot.retire("lost")
    assert slot.unqueue().job == "job-2" and slot.unqueue() is None
    assert slot.retire("lost") == ["worker"]
