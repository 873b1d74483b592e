"""The guard: journal before change, restore always, policy before the device, one owner per GPU."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest
from support import DVFS, REPO

from orchestrator.devices import open_backend
from orchestrator.devices.base import KernelWork
from orchestrator.errors import (
    DeviceBusyError,
    DeviceError,
    InvalidSettingError,
    PolicyViolationError,
    UnrestoredDeviceError,
    UserError,
)
from orchestrator.jobs.policy import Policy
from orchestrator.jobs.request import SettingsRequest
from orchestrator.measuring.guard import SettingsGuard
from orchestrator.measuring.journal import Journal, restore_journal

# memory-bound: never capped at 400 W
GEMM = KernelWork(flops=3 * 2**28, bytes_moved=8 * 2**28, peak="fp32", kernel_class="stencil")


def backend(state):
    return open_backend(
        {"backend": "sim", "state_dir": str(state), "profile": "a100_sxm4_40gb", "count": 2}
    )


def device_state(state, index=0):
    """What the simulated GPU is set to, read by a fresh backend (as another process would)."""
    with backend(state) as b:
        d = b.device(index)
        s = d.settings()
        d.on_kernel_call(GEMM)  # NVML cannot read locked clocks back: observe the clock instead
        clock = d.sm_clock_mhz()
        return {
            "power_limit_w": s.power_limit_w,
            "offset": s.clock_offset_mhz,
            "locked": None if clock == 1410 else clock,
        }


@pytest.fixture
def state(tmp_path):
    return tmp_path / "sim"


def test_apply_then_exit_restores_the_device_and_clears_the_journal(state, tmp_path):
    journal = Journal(tmp_path / "journal")
    before = device_state(state)
    with backend(state) as b, SettingsGuard(b.device(0), journal) as guard:
        guard.apply(
            SettingsRequest(sm_clock_mhz=(900, 900), power_limit_w=250, clock_offset_mhz=100)
        )
        entry = json.loads(journal.entry_path(b.device(0).identity.uuid).read_text())
        assert entry["original"]["power_limit_w"] == 400
        assert entry["changed"] == ["clock_offset", "power_limit", "sm_clock"]
        assert entry["pid"] == os.getpid()
        during = device_state(state)
        assert (
            during["power_limit_w"] == 250
            and during["offset"] == 100
            and during["locked"] is not None
        )
    assert device_state(state) == before
    assert journal.uuids() == []


def test_a_new_request_resets_what_the_previous_one_changed(state, tmp_path):
    with backend(state) as b, SettingsGuard(b.device(0), Journal(tmp_path / "j")) as guard:
        guard.apply(SettingsRequest(power_limit_w=250))
        guard.apply(SettingsRequest(sm_clock_mhz=(1200, 1200)))
        now = device_state(state)
        assert now["power_limit_w"] == 400 and now["locked"] == 1200
        guard.apply(SettingsRequest())
        assert device_state(state)["locked"] is None
        assert guard.journal.uuids() == []


def test_an_exception_inside_the_guard_still_restores(state, tmp_path):
    before = device_state(state)
    with (
        pytest.raises(RuntimeError),
        backend(state) as b,
        SettingsGuard(b.device(0), Journal(tmp_path / "j")) as guard,
    ):
        guard.apply(SettingsRequest(power_limit_w=200))
        raise RuntimeError("kernel blew up")
    assert device_state(state) == before


def refuse(device, method):
    """``device.<method>`` fails from now on, as a driver call that would not answer does."""

    def refused(*args):
        raise DeviceError(f"{method} on GPU {device.identity.index} failed: no answer")

    setattr(device, method, refused)


def test_a_setting_that_will_not_restore_keeps_no_other_setting_changed(state, tmp_path):
    """The power limit will not go back: the clock still does, the error is raised after, and
    the journal entry stays for `dvfs restore` (was: the first failure ended the restore, and the
    clock, restored after the power limit, stayed locked)."""
    journal = Journal(tmp_path / "j")
    with backend(state) as b:
        device = b.device(0)
        guard = SettingsGuard(device, journal).__enter__()
        guard.apply(SettingsRequest(sm_clock_mhz=(900, 900), power_limit_w=200))
        refuse(device, "set_power_limit_w")
        with pytest.raises(DeviceError, match="set_power_limit_w"):
            guard.close()
        assert device_state(state)["locked"] is None
        assert journal.uuids() == [device.identity.uuid]
        [action] = restore_journal(journal, lambda uuid: b.device(uuid=uuid))
        assert action.restored == ("power_limit", "sm_clock")
    assert device_state(state)["power_limit_w"] == 400


def test_a_failed_restore_is_a_note_on_the_error_that_ended_the_block_not_its_replacement(
    state, tmp_path
):
    with backend(state) as b:
        device = b.device(0)
        with pytest.raises(RuntimeError, match="kernel blew up") as raised:
            with SettingsGuard(device, Journal(tmp_path / "j")) as guard:
                guard.apply(SettingsRequest(sm_clock_mhz=(900, 900)))
                refuse(device, "reset_locked_sm_clocks")
                raise RuntimeError("kernel blew up")
        assert "restoring GPU 0 failed too" in "".join(raised.value.__notes__)
        restore_journal(Journal(tmp_path / "j"), lambda uuid: b.device(uuid=uuid))


@pytest.mark.parametrize(
    "request_, error, message",
    [
        (
            SettingsRequest(sm_clock_mhz=(99999, 99999)),
            InvalidSettingError,
            "99999 MHz is not supported.*210-1410 MHz in 15 MHz steps",
        ),
        (SettingsRequest(sm_clock_mhz=(1001, 1001)), InvalidSettingError, "e.g. 990 or 1005"),
        (
            SettingsRequest(power_limit_w=1000),
            InvalidSettingError,
            "1000 W is out of range.*100-400 W",
        ),
        (SettingsRequest(clock_offset_mhz=5000), InvalidSettingError, "out of range"),
        (SettingsRequest(mem_clock_mhz=5), InvalidSettingError, "supported: 1215 MHz"),
    ],
)
def test_bad_values_are_refused_before_the_device_is_touched(
    state, tmp_path, request_, error, message
):
    before = device_state(state)
    journal = Journal(tmp_path / "j")
    with backend(state) as b, SettingsGuard(b.device(0), journal) as guard:
        with pytest.raises(error, match=message):
            guard.apply(request_)
        assert journal.uuids() == []
    assert device_state(state) == before


def test_the_policy_narrows_the_device_range(state, tmp_path):
    policy = Policy(sm_clock_range_mhz=(900, 1410), power_range_w=(300, 400))
    with backend(state) as b, SettingsGuard(b.device(0), Journal(tmp_path / "j"), policy) as guard:
        with pytest.raises(
            PolicyViolationError,
            match="SM clock 510 MHz is outside the policy's allowed range 900-1410",
        ):
            guard.apply(SettingsRequest(sm_clock_mhz=(510, 510)))
        with pytest.raises(PolicyViolationError, match="power limit 200 W"):
            guard.apply(SettingsRequest(power_limit_w=200))
        guard.apply(SettingsRequest(sm_clock_mhz=(1005, 1005), power_limit_w=350))
        assert device_state(state)["power_limit_w"] == 350


def test_observe_only_changes_nothing_and_refuses_a_setting(state, tmp_path):
    before = device_state(state)
    with (
        backend(state) as b,
        SettingsGuard(b.device(0), Journal(tmp_path / "j"), observe_only=True) as guard,
    ):
        guard.apply(SettingsRequest())
        with pytest.raises(UserError, match="observe_only"):
            guard.apply(SettingsRequest(sm_clock_mhz=(900, 900)))
    assert device_state(state) == before


HOLDER = textwrap.dedent(
    """
    import sys, time
    from orchestrator.devices import open_backend
    from orchestrator.jobs.request import SettingsRequest
    from orchestrator.measuring.guard import SettingsGuard
    from orchestrator.measuring.journal import Journal
    state, journal = sys.argv[1], sys.argv[2]
    b = open_backend("""
    """{"backend": "sim", "state_dir": state, "profile": "a100_sxm4_40gb", "count": 2})
    g = SettingsGuard(b.device(0), Journal(journal)).__enter__()
    g.apply(SettingsRequest(sm_clock_mhz=(510, 510), power_limit_w=150))
    print("applied", flush=True)
    time.sleep(60)
    """
)


def start_holder(state, journal):
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(state), str(journal)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().strip() == "applied"
    return proc


def test_two_processes_never_drive_one_gpu(state, tmp_path):
    journal = tmp_path / "j"
    proc = start_holder(state, journal)
    try:
        with backend(state) as b:
            with pytest.raises(DeviceBusyError, match="in use by another process"):
                SettingsGuard(b.device(0), Journal(journal)).__enter__()
            with SettingsGuard(b.device(1), Journal(journal)):  # another GPU is free
                pass
    finally:
        proc.kill()
        proc.wait()


def test_sigkill_leaves_a_journal_that_dvfs_restore_undoes(state, tmp_path):
    journal = tmp_path / "j"
    before = device_state(state)
    proc = start_holder(state, journal)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert device_state(state)["power_limit_w"] == 150  # left changed by the dead process
    with backend(state) as b:  # a new sweep refuses the device until it is restored
        with pytest.raises(UnrestoredDeviceError, match="dvfs restore"):
            SettingsGuard(b.device(0), Journal(journal)).__enter__()
    env = dict(os.environ, DVFS_SIM_STATE_DIR=str(state), DVFS_JOURNAL_DIR=str(journal))
    out = subprocess.run(
        [*DVFS, "restore"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert "restored power_limit, sm_clock" in out.stdout
    assert "restored 1 device(s)" in out.stdout
    assert device_state(state) == before
    assert Journal(journal).uuids() == []


def test_sigterm_restores_at_once(state, tmp_path):
    journal = tmp_path / "j"
    before = device_state(state)
    proc = start_holder(state, journal)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == -signal.SIGTERM
    assert device_state(state) == before
    assert Journal(journal).uuids() == []


def test_restore_skips_a_device_whose_owner_is_alive(state, tmp_path):
    journal = tmp_path / "j"
    proc = start_holder(state, journal)
    try:
        with backend(state) as b:
            actions = restore_journal(Journal(journal), lambda uuid: b.device(uuid=uuid))
        assert [a.skipped_reason for a in actions] == ["in use by a live process"]
        assert device_state(state)["power_limit_w"] == 150
    finally:
        proc.kill()
        proc.wait()


def test_a_corrupt_journal_entry_is_reported_and_left_in_place(state, tmp_path):
    journal = Journal(tmp_path / "j")
    with backend(state) as b:
        uuid = b.device(0).identity.uuid
        journal.entry_path(uuid).write_text("{not json")
        with pytest.raises(UserError, match="corrupt.*left in place"):
            SettingsGuard(b.device(0), journal).__enter__()
    assert journal.entry_path(uuid).read_text() == "{not json"


def test_a_session_puts_back_every_gpu_even_after_one_that_will_not_go_back(state, tmp_path):
    """One GPU's restore fails: the next GPU's guard still restores and releases its lease (was:
    the first failure ended the loop, the other GPU kept its settings and its lease)."""
    from orchestrator.measuring.session import GpuSession

    cfg = {"backend": "sim", "state_dir": str(state), "profile": "a100_sxm4_40gb", "count": 2,
           "journal_dir": str(tmp_path / "j"), "policy_file": None, "observe_only": False,
           "gpus": "all"}
    with backend(state) as b:
        uuids = [b.device(i).identity.uuid for i in range(2)]
    session = GpuSession()
    first, second = (session.context(cfg, device_uuid=u) for u in uuids)
    for ctx in (first, second):
        ctx.guard.apply(SettingsRequest(power_limit_w=200))
    refuse(first.device, "set_power_limit_w")
    with pytest.raises(DeviceError, match="set_power_limit_w"):
        session.close()
    assert device_state(state, 1)["power_limit_w"] == 400
    with backend(state) as b:
        assert restore_journal(Journal(tmp_path / "j"), lambda u: b.device(uuid=u))[0].restored
    assert device_state(state, 0)["power_limit_w"] == 400
