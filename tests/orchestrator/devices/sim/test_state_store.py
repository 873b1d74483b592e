"""The simulated GPU's state store: consistent under concurrent processes, whole after a kill."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading

import pytest

from orchestrator.devices.sim import state_file
from orchestrator.devices.sim.state import (
    SLOT_BYTES,
    Machine,
    StateCorruptError,
    StateTooLargeError,
    create_machine,
    state_file_name,
)


@pytest.fixture
def machine(tmp_path):
    return create_machine(tmp_path / "sim", "a100_sxm4_40gb", count=2)


def store_of(m: Machine, index: int = 0):
    return m._gpu_store(index)


def derived(n: int, width: int) -> list[float]:
    """Values that only a whole state agrees with: a torn one would not match its counter."""
    return [n * 0.5 + k for k in range(width)]


def bump(width: int):
    def change(s):
        n = s.get("n", 0) + 1
        s.update(n=n, square=n * n, values=derived(n, width))
        return n

    return change


def assert_whole(s, width: int) -> None:
    n = s.get("n", 0)
    if n:
        assert s["square"] == n * n and s["values"] == derived(n, width), n


# --- what the store keeps -------------------------------------------------------------------
def test_an_update_is_read_back_by_a_fresh_machine_as_json_would_give_it(machine):
    import numpy as np

    plain = {"extra": [0.1, 2.5, float("inf")], "nested": {"a": [1, None, True, "s"]}}
    machine.update(0, lambda s: s.update(plain))
    machine.update(0, lambda s: s.update(power_w=np.float64(312.5), window=(1, 2), by_gpu={3: "x"}))
    again = Machine(machine.state_dir).read(0)
    for key in plain:
        assert again[key] == plain[key]
    assert again["power_w"] == 312.5 and type(again["power_w"]) is float  # not its raw bytes
    assert again["window"] == [1, 2] and again["by_gpu"] == {"3": "x"}  # as JSON gives them
    assert "extra" not in machine.read(1)
    with pytest.raises(TypeError):
        machine.update(0, lambda s: s.update(bad=object()))


def test_a_read_is_a_copy_and_a_failed_change_writes_nothing(machine):
    before = machine.read(0)
    before["power_limit_w"] = 1.0
    assert machine.read(0)["power_limit_w"] == 400

    def fails(s):
        s["power_limit_w"] = 2.0
        raise RuntimeError("no")

    with pytest.raises(RuntimeError):
        machine.update(0, fails)
    assert machine.read(0)["power_limit_w"] == 400


def test_an_update_nested_in_another_on_one_thread_loses_neither(machine):
    runs = []

    def outer(s):
        runs.append(dict(s))
        s["calls"] += 1
        if len(runs) == 1:  # as a signal handler's setter would, in the middle of a call
            machine.update(0, lambda t: t.update(locked_sm_mhz=None, restored=True), sync=True)

    machine.update(0, lambda s: s.update(locked_sm_mhz=[1005, 1005]))
    machine.update(0, outer)
    s = machine.read(0)
    assert s["restored"] is True and s["locked_sm_mhz"] is None and s["calls"] == 1
    assert len(runs) == 2 and runs[1]["restored"] is True  # the outer change ran again on top


def test_a_state_too_large_for_a_slot_is_refused_and_nothing_is_written(machine):
    with pytest.raises(StateTooLargeError, match="does not fit"):
        machine.update(0, lambda s: s.update(blob="x" * SLOT_BYTES))
    assert "blob" not in machine.read(0)
    machine.update(0, lambda s: s.update(calls=7))
    assert machine.read(0)["calls"] == 7


def _as_an_older_version_left_it(tmp_path, calls: int):
    """A machine whose GPU 0 is a gpu-0.json file (before .state files) with ``calls`` set."""
    root = tmp_path / "sim"
    create_machine(root, "a100_sxm4_40gb")
    state = Machine(root).read(0)
    state["calls"] = calls
    (root / state_file_name(0)).unlink()
    (root / "gpu-0.json").write_text(json.dumps(state))
    state_file.forget_state_file((root / state_file_name(0)).resolve())
    return root


def test_a_state_directory_of_json_files_is_converted_on_open(tmp_path):
    root = _as_an_older_version_left_it(tmp_path, 41)
    assert Machine(root).read(0)["calls"] == 41
    assert not (root / "gpu-0.json").exists() and (root / state_file_name(0)).exists()


def test_re_creating_a_machine_of_json_files_converts_them_and_keeps_the_state(tmp_path):
    # What a sweep does with a state directory an older version left (it re-creates its machine
    # with the same spec): the conversion must not deadlock on create_machine's own lock.
    root = _as_an_older_version_left_it(tmp_path, 9)
    assert create_machine(root, "a100_sxm4_40gb").read(0)["calls"] == 9


# --- a kill at any instant ------------------------------------------------------------------
def tear_the_slot_being_written(m: Machine, index: int, state: dict, cut: int) -> None:
    """Leave GPU ``index``'s state as a process killed ``cut`` bytes into a write would."""
    store = store_of(m, index)
    k, gen, _ = store.current()
    header, payload = state_file.slot_bytes(state_file.encode_state(state), gen + 1)
    off = (1 - k) * SLOT_BYTES
    whole = payload + header  # the order the store writes them: payload, then the header
    start = off + len(header)
    for pos in range(min(cut, len(whole))):
        if pos < len(payload):
            store.mm[start + pos] = whole[pos]
        else:
            store.mm[off + pos - len(payload)] = whole[pos]


@pytest.mark.parametrize("where", ["payload", "header"])
def test_a_write_torn_anywhere_leaves_the_previous_state(machine, where):
    machine.update(0, bump(64))
    good = machine.read(0)
    torn = dict(good, n=99, square=1, values=[])
    size = len(state_file.encode_state(torn))
    for cut in [1, size // 2, size - 1] if where == "payload" else [size + 1, size + 12, size + 27]:
        tear_the_slot_being_written(machine, 0, torn, cut)
        assert Machine(machine.state_dir).read(0) == good, cut
    assert machine.update(0, bump(64)) == 2  # the next update writes over the torn slot
    assert_whole(machine.read(0), 64)


def test_a_file_with_no_valid_slot_is_an_error_not_a_state(machine):
    store = store_of(machine, 1)
    store.mm[0:8] = b"\0" * 8
    store.mm[SLOT_BYTES : SLOT_BYTES + 8] = b"\0" * 8
    with pytest.raises(StateCorruptError, match="no valid simulated GPU state"):
        machine.read(1)


PAD_REPEATS = 90_000  # an ~720 kB string: JSON encodes it at memcpy speed, so a kill often
# lands in the slot write itself rather than in encoding or decoding


def bump_padded(width: int):
    plain = bump(width)

    def change(s):
        n = plain(s)
        s["pad"] = f"{n:08d}" * PAD_REPEATS
        return n

    return change


def _loop_updates(root, width: int, started_w: int, die_after_cpu_s: float | None = None) -> None:
    """In a forked child: update GPU 0 as fast as it can until killed; its pid, a line on
    ``started_w``, says its first update is in. With ``die_after_cpu_s``, it is killed once it
    has run that long on a CPU (SIGPROF, whose default action ends it where it stands, as
    SIGKILL does: no handler, no cleanup)."""
    try:
        m = Machine(root)
        m.update(0, bump_padded(width))
        os.write(started_w, b"%d\n" % os.getpid())
        if die_after_cpu_s is not None:
            signal.setitimer(signal.ITIMER_PROF, die_after_cpu_s)
        while True:
            m.update(0, bump_padded(width), sync=random.random() < 0.01)
    finally:
        os._exit(1)


# The writers are forked from a small process of their own, not from pytest's: a fork of a pytest
# process that has loaded TensorFlow and PyTorch costs ~100 ms (the 450 kills took 59 s in the
# whole suite, 9 s alone), and forking a process that runs JAX's threads can deadlock.
FORKER = """
import importlib.util, os, sys
spec = importlib.util.spec_from_file_location("state_store_tests", sys.argv[1])
tests = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tests)
while line := sys.stdin.readline():  # a line, its CPU time to live: fork one writer
    pid = os.fork()
    if pid == 0:
        tests._loop_updates(sys.argv[2], int(sys.argv[3]), 1, float(line))
    os.write(1, b"%d\\n" % os.waitpid(pid, 0)[1])  # after the writer's pid, its status
"""


@pytest.mark.slow
def test_processes_killed_at_random_instants_never_leave_a_torn_state(machine):
    """Each writer dies at a random instant of its own CPU time, 0-12 ms after its first update
    (an update takes ~6 ms): a kill timed on the wall clock from here lands, on a loaded machine,
    mostly while the writer waits for a CPU between two updates, and tears nothing."""
    width = 1_000  # with the pad, a ~730 kB state: a write is long enough to be killed inside
    rng = random.Random(14)
    last, torn_slots = 0, 0
    forker = subprocess.Popen([sys.executable, "-c", FORKER, __file__, str(machine.state_dir),
                               str(width)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, bufsize=1)
    try:
        for _ in range(450):
            forker.stdin.write(f"{rng.uniform(0, 0.012)!r}\n")
            forker.stdout.readline()  # its pid: its first update is in
            status = int(forker.stdout.readline())
            assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGPROF
            last, torn_slots = _whole_after_a_kill(machine, width, last, torn_slots)
    finally:
        forker.kill()
        forker.wait()
    assert torn_slots > 0, "no kill landed inside a write: the test did not test the tear"


def _whole_after_a_kill(machine, width: int, last: int, torn_slots: int) -> tuple[int, int]:
    """What a fresh reader sees after a writer was killed: a whole state, newer than the last."""
    s = Machine(machine.state_dir).read(0)
    assert_whole(s, width)
    assert s["pad"] == f"{s['n']:08d}" * PAD_REPEATS
    assert s["n"] > last  # every child got at least its first update in
    store = store_of(machine, 0)
    return s["n"], torn_slots + sum(store.valid_payload(k) is None for k in (0, 1))


# --- concurrent writers -----------------------------------------------------------------------
def _increment(root, times: int) -> None:
    try:
        m = Machine(root)
        for _ in range(times):
            m.update(0, lambda s: s.update(counter=s.get("counter", 0) + 1))
            assert_whole(m.read(1), 8)
    finally:
        os._exit(0)


def test_processes_incrementing_at_once_lose_no_increment(machine):
    workers, times = 4, 300
    pids = []
    for _ in range(workers):
        pid = os.fork()
        if pid == 0:
            _increment(machine.state_dir, times)
        pids.append(pid)
    for _ in range(100):  # meanwhile this process writes GPU 1, which the workers read
        machine.update(1, bump(8))
    for pid in pids:
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert machine.read(0)["counter"] == workers * times
    assert machine.read(1)["n"] == 100


def test_threads_of_one_process_incrementing_at_once_lose_no_increment(machine):
    def work():
        for _ in range(500):
            machine.update(0, lambda s: s.update(counter=s.get("counter", 0) + 1))
            machine.read(0)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert machine.read(0)["counter"] == 2000


# --- what a process holds -------------------------------------------------------------------
def open_descriptors_of(directory) -> int:
    found = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            found += os.readlink(f"/proc/self/fd/{fd}").startswith(str(directory))
        except OSError:  # the listing's own descriptor, closed by now
            pass
    return found


def test_machines_opened_in_turn_leave_no_descriptor_once_let_go(tmp_path):
    """A test session or a notebook opens machine after machine: none may stay open (a quiet CI
    run went past descriptor 1024 this way, and select(2) refused it)."""
    for i in range(40):
        m = create_machine(tmp_path / f"sim{i}", "a100_sxm4_40gb", count=2)
        m.update(1, lambda s: s.update(n=1))
        assert open_descriptors_of(tmp_path / f"sim{i}") > 0  # held while the machine is
        del m
    assert open_descriptors_of(tmp_path) == 0


def test_two_machines_on_one_directory_share_one_view_and_its_locks(tmp_path):
    """flock belongs to an open file description: a second descriptor for the same file in the
    same process would lock against the first, so held views are shared, never opened twice."""
    first = create_machine(tmp_path / "sim", "a100_sxm4_40gb")
    second = Machine(tmp_path / "sim")
    assert store_of(first) is store_of(second)
    with store_of(first).locked(exclusive=True):  # would block forever on a second descriptor
        second.update(0, lambda s: s.update(inner=1))
    assert Machine(tmp_path / "sim").read(0)["inner"] == 1
    del first, second
    assert open_descriptors_of(tmp_path) == 0
