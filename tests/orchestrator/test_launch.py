"""The ray_gpus launcher on a real local Ray instance: 4 logical GPUs over 4 simulated GPUs.

One Ray instance and one simulated machine serve the whole module (Ray takes seconds to start);
each test runs a real ``dvfs sweep -m`` in-process through Hydra, so the pool of workers is reused
from test to test as it is from batch to batch of one sweep. Kernel seeds differ per test, so each
test's kernels are new to every worker.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest
from support import BRIEF_SIM, BRIEF_TRIAL

pytestmark = pytest.mark.slow

BASE = ["device.count=4", "workload.size=tiny", "measure=quick", "quiet=true", *BRIEF_TRIAL]
# measure=quick's own window and check run, for the tests whose assertion needs trials that last:
# one that overlaps another, a call sent while one runs, slowed calls that outlast a wait
QUICK_TRIAL = ("measure.window_s=0.5", "measure.check_iters=null")


@pytest.fixture(scope="module")
def sim4(tmp_path_factory):
    """A local Ray instance declaring 4 GPUs, over a 4-GPU simulated machine, started as the
    launcher starts its own: workers at this process's priority, none started ahead. (At Ray's
    nice 15, beside two busy loops on 2 cores, this module's tests took 100-400 s each instead of
    10-40 s.)"""
    import ray

    from orchestrator.devices import open_backend
    from orchestrator.launching.pool import NICENESS_ENV, PRESTART_ENV, close_pool

    state = tmp_path_factory.mktemp("launch") / "sim"
    with pytest.MonkeyPatch.context() as env:
        env.setenv("DVFS_SIM_STATE_DIR", str(state))
        # the machine every sweep here runs on
        open_backend({"backend": "sim", "count": 4, **BRIEF_SIM}).close()
        env.setenv(NICENESS_ENV, "0")  # read by the raylet as ray.init starts it
        env.setenv(PRESTART_ENV, "0")
        ray.init(address="local", num_cpus=2, num_gpus=4, include_dashboard=False,
                 log_to_driver=False)
        try:
            yield state
        finally:
            close_pool()
            ray.shutdown()


def sweep(*overrides: str) -> int:
    from orchestrator.app import run_sweep

    return run_sweep(["-m", *BASE, *overrides])


def stored(sweep_dir: Path) -> list[dict]:
    from orchestrator.results.store import ResultStore

    if not (sweep_dir / "trials.sqlite").exists():
        return []
    with ResultStore(sweep_dir, readonly=True) as store:
        return store.rows()


def uuids_in_pci_order(state: Path) -> list[str]:
    gpus = json.loads((state / "machine.json").read_text())["gpus"]
    return [g["uuid"] for g in sorted(gpus, key=lambda g: g["pci_bus_id"])]


def sim_gpu(state: Path, index: int) -> dict:
    from orchestrator.devices.sim.state import Machine

    return Machine(state).read(index)


def assert_no_overlap(rows: list[dict]) -> None:
    by_gpu = defaultdict(list)
    for r in rows:
        if r["launch"].get("trial_started_at") is not None:
            by_gpu[r["device_uuid"]].append(
                (r["launch"]["trial_started_at"], r["launch"]["trial_ended_at"])
            )
    for spans in by_gpu.values():
        spans.sort()
        for (_, end), (start, _) in zip(spans, spans[1:]):
            assert start >= end, f"two trials overlapped on one GPU: {spans}"


def test_a_grid_runs_each_job_once_on_the_gpu_its_worker_is_pinned_to(sim4, tmp_path, capsys):
    d = tmp_path / "grid"
    rc = sweep(
        "workload=gemm,stencil",
        "framework=jax,tensorflow",
        "device.sm_clock_mhz=1065,1410",
        "seed=11",
        f"hydra.sweep.dir={d}",
    )
    assert rc == 0
    rows = stored(d)
    grid = {
        (w, f, c) for w in ("gemm", "stencil") for f in ("jax", "tensorflow") for c in (1065, 1410)
    }
    assert sorted((r["workload"], r["framework"], r["sm_clock_min_mhz"]) for r in rows) == sorted(
        grid
    )
    assert len({r["trial_key"] for r in rows}) == len(rows) == 8
    assert all(r["status"] == "ok" for r in rows), [(r["status"], r["error"]) for r in rows]
    by_pci = uuids_in_pci_order(sim4)
    for r in rows:  # Ray's logical GPU k is the k-th simulated GPU in PCI order
        assert r["device_uuid"] == by_pci[int(r["launch"]["ray_gpu_id"])]
    pid_gpu = defaultdict(set)
    for r in rows:
        pid_gpu[r["launch"]["worker_pid"]].add(r["device_uuid"])
    assert all(len(g) == 1 for g in pid_gpu.values())  # one worker, one GPU
    from orchestrator.results.columns import undeclared

    assert [undeclared(r) for r in rows] == [[]] * len(rows)  # the launch facts included
    assert_no_overlap(rows)
    # Each kernel is built once per worker: the counter grows exactly at a new
    # (workload, framework).
    for pid in pid_gpu:
        mine = sorted(
            (r for r in rows if r["launch"]["worker_pid"] == pid),
            key=lambda r: r["launch"]["trial_started_at"],
        )
        seen, before = set(), mine[0]["launch"]["builds"] - 1
        for r in mine:
            pair = (r["workload"], r["framework"])
            assert r["launch"]["builds"] - before == (pair not in seen), (pid, pair)
            seen.add(pair)
            before = r["launch"]["builds"]
    err = capsys.readouterr().err
    assert "ray_gpus: 8 trial(s) on 4 GPU(s)" in err
    assert f"results in {d}; report: dvfs report {d}" in err.strip().splitlines()[-1]


def test_placement_every_gives_one_row_per_job_per_gpu_and_a_rerun_resumes(sim4, tmp_path, capsys):
    d = tmp_path / "every"
    args = (
        "hydra.launcher.placement=every",
        "device.sm_clock_mhz=1065,1410",
        "seed=12",
        f"hydra.sweep.dir={d}",
    )
    assert sweep(*args) == 0
    rows = stored(d)
    uuids = set(uuids_in_pci_order(sim4))
    pairs = sorted((r["sm_clock_min_mhz"], r["device_uuid"]) for r in rows)
    assert pairs == sorted((c, u) for c in (1065, 1410) for u in uuids)
    assert_no_overlap(rows)
    capsys.readouterr()
    assert sweep(*args) == 0  # the same sweep again: everything is stored already
    assert len(stored(d)) == 8
    assert "8 trial(s) already in the store, skipped (resume)" in capsys.readouterr().err


def _sent_while_the_one_before_ran(rows: list[dict]) -> list[bool]:
    """Per GPU, for each trial after its first: was it sent before the one before it ended."""
    by_gpu = defaultdict(list)
    for r in rows:
        by_gpu[r["device_uuid"]].append(r["launch"])
    sent = []
    for lane in by_gpu.values():
        lane.sort(key=lambda launch: launch["trial_started_at"])
        sent += [b["dispatched_at"] < a["trial_ended_at"] for a, b in zip(lane, lane[1:])]
    return sent


@pytest.mark.parametrize("queue_ahead", [True, False])
def test_a_busy_gpu_is_sent_its_next_trial_to_start_as_the_last_returns(
    sim4, tmp_path, queue_ahead
):
    """With ``queue_ahead`` a GPU's next trial is sent while its last one runs (Ray runs the
    worker's calls in order), never run beside it; without, only once the GPU is idle."""
    d = tmp_path / f"queue_{queue_ahead}"
    rc = sweep(
        "hydra.launcher.placement=every",
        f"hydra.launcher.queue_ahead={str(queue_ahead).lower()}",
        *QUICK_TRIAL,
        "workload=selu",
        "device.sm_clock_mhz=1110,1185,1260",
        "seed=16",
        f"hydra.sweep.dir={d}",
    )
    assert rc == 0
    rows = stored(d)
    assert len(rows) == len({r["trial_key"] for r in rows}) == 12
    assert {r["status"] for r in rows} == {"ok"}
    assert_no_overlap(rows)
    sent = _sent_while_the_one_before_ran(rows)
    assert len(sent) == 8
    assert all(sent) if queue_ahead else not any(sent)


def test_a_hung_kernel_is_a_timeout_the_sweep_completes_and_the_trial_queued_behind_it_is_resent(
    sim4, tmp_path
):
    """One sweep for both (each waits out a 30 s limit): the hung trial is killed at its limit,
    not after its 300 s hang; the trial queued behind it never ran, so it is sent to the new worker
    as its first attempt; every other trial is ok and the hung GPU is put back."""
    d = tmp_path / "hang"
    rc = sweep(
        "hydra.launcher.placement=every",
        "hydra.launcher.timeout_s=30",  # a healthy tiny trial: < 8 s; beside two busy loops, 20
        "device.sm_clock_mhz=1065,1140",
        "device.inject={hang_s:300,gpu:2}",  # its first trial on GPU 2 only (times: 1)
        "seed=17",
        f"hydra.sweep.dir={d}",
    )
    assert rc == 0
    rows = stored(d)
    assert len(rows) == len({r["trial_key"] for r in rows}) == 8  # each job once on each GPU
    assert sorted(r["status"] for r in rows) == ["ok"] * 7 + ["timeout"]
    gpu2 = uuids_in_pci_order(sim4)[2]
    (timed_out,) = [r for r in rows if r["status"] == "timeout"]
    assert timed_out["device_uuid"] == gpu2 and "30 s" in timed_out["error"]
    launch = timed_out["launch"]  # killed at its 30 s limit, not after the 300 s hang
    # (the limit counts on the monotonic clock from just before the call is sent; dispatched_at is
    # the wall clock just after it: a few ms of the two clocks' difference are not early)
    assert 30 - 0.05 <= launch["killed_at"] - launch["dispatched_at"] < 90
    (after,) = [r for r in rows if r["device_uuid"] == gpu2 and r["status"] == "ok"]
    # queued behind the hung trial, it was taken back and sent again after the kill
    assert after["launch"]["dispatched_at"] > launch["killed_at"]
    assert after["launch"]["worker_pid"] != launch["worker_pid"]
    assert after["attempt"] == 1  # its first run: the queued call never ran
    assert sim_gpu(sim4, 2)["locked_sm_mhz"] is None  # the new worker restored it as it started
    assert not list((sim4 / "journal").glob("*.json"))


def _when_a_trial_runs(journal: Path, then) -> None:
    """In a thread: once a worker's trace shows a trial in its kernel calls, call ``then()``."""

    def watch():
        while not any(_in_kernel_calls(p) for p in journal.glob("*.trace")):
            time.sleep(0.02)
        then()

    threading.Thread(target=watch, daemon=True).start()


def _in_kernel_calls(trace: Path) -> bool:
    try:
        return json.loads(trace.read_text()).get("kernel_calls_at") is not None
    except (OSError, ValueError):  # being written, or gone
        return False


def test_an_interrupted_sweep_stops_each_running_trial_and_never_starts_the_queued_one(
    sim4, tmp_path
):
    """Ctrl-C: every worker stops the trial it runs at its next chunk of kernel calls, puts its
    GPU back and closes; the trial queued behind it is never run (it would pause 60 s first).
    Every kernel call is slowed by 20 ms (a trial of a minute of wall time, as on a real GPU,
    where the sim's virtual clock makes it a second): without the stop each would outlast the
    driver's 15 s wait, and be killed with its GPU still set; had the queued gemm trial begun,
    it would outlast it too."""
    import _thread

    from orchestrator.measuring.trial_trace import mark_closing

    journal = sim4 / "journal"
    # each trial's ~2,000 slowed calls are what would outlast the driver's wait
    common = ("hydra.launcher.placement=every", "workload=selu,gemm", "seed=18", *QUICK_TRIAL)
    # every worker up and both kernels built first: the interrupt then finds selu running
    assert sweep(*common, "device.sm_clock_mhz=1140", f"hydra.sweep.dir={tmp_path / 'warm'}") == 0
    assert not list(journal.glob("*.trace"))
    interrupted_at = []

    def interrupt():
        interrupted_at.append(time.monotonic())
        _thread.interrupt_main()

    _when_a_trial_runs(journal, interrupt)
    with pytest.raises(KeyboardInterrupt):
        sweep(
            *common,  # selu runs first on every GPU, gemm waits behind it
            "device.sm_clock_mhz=1065",
            "device.inject={slow_s:0.02,times:null}",
            f"hydra.sweep.dir={tmp_path / 'interrupted'}",
        )
        time.sleep(600)  # not reached: the interrupt comes while the sweep runs
    # not the 15 s after which a worker is killed: each trial stopped at a chunk's end
    assert time.monotonic() - interrupted_at[0] < 15
    assert not list(journal.glob("*.trace"))  # every trial ended
    assert all(sim_gpu(sim4, i)["locked_sm_mhz"] is None for i in range(4))
    assert not list(journal.glob("*.json")) and not list(journal.glob("*.closing"))
    assert stored(tmp_path / "interrupted") == []  # the stopped trials are not stored
    # a mark some stopped sweep left behind (its worker killed first) holds no later sweep back
    mark_closing(journal, uuids_in_pci_order(sim4)[0])
    assert sweep(*common, "device.sm_clock_mhz=1215", f"hydra.sweep.dir={tmp_path / 'after'}") == 0
    assert {r["status"] for r in stored(tmp_path / "after")} == {"ok"}


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the drop itself
def test_a_ctrl_c_that_python_dropped_in_a_gc_callback_still_stops_the_sweep(sim4, tmp_path):
    """The driver's Ctrl-C lands in a garbage-collector callback (JAX's, in the issue's run) and
    Python drops its KeyboardInterrupt: the launcher's loop still stops the sweep, and every GPU
    is put back."""
    import signal

    from support import signal_in_a_gc_callback

    journal = sim4 / "journal"
    common = ("hydra.launcher.placement=every", "workload=selu", "seed=19")
    assert sweep(*common, "device.sm_clock_mhz=1140", f"hydra.sweep.dir={tmp_path / 'warm'}") == 0
    with signal_in_a_gc_callback(signal.SIGINT) as gc_signal:
        _when_a_trial_runs(journal, gc_signal.arm)
        with pytest.raises(KeyboardInterrupt):
            sweep(*common, "device.sm_clock_mhz=range(1065,1411,15)",
                  f"hydra.sweep.dir={tmp_path / 'dropped'}")
    assert gc_signal.sent == [signal.SIGINT]
    assert len(stored(tmp_path / "dropped")) < 4 * 24  # it stopped
    assert all(sim_gpu(sim4, i)["locked_sm_mhz"] is None for i in range(4))
    assert not list(journal.glob("*.json")) and not list(journal.glob("*.trace"))


def test_a_grid_longer_than_a_chunk_streams_and_two_reruns_store_each_job_once(
    sim4, tmp_path, capsys
):
    # 90 jobs: more than one chunk of the supervisor's stream (64) and of the no-op resume's.
    d = tmp_path / "stream"
    args = ("workload=selu", "device.sm_clock_mhz=range(1110,1411,75)", "seed=range(100,118,1)",
            f"hydra.sweep.dir={d}")
    assert sweep(*args) == 0
    rows = stored(d)
    assert len(rows) == len({r["trial_key"] for r in rows}) == 90
    assert len({r["device_uuid"] for r in rows}) == 4
    assert sorted(r["launch"]["job_num"] for r in rows) == list(range(90))
    capsys.readouterr()
    for _ in range(2):  # nothing to run: found in the store without starting any worker
        assert sweep(*args) == 0
        assert "all 90 trial(s) already stored (resume)" in capsys.readouterr().err
    assert len(stored(d)) == 90


def test_a_fresh_pool_gives_every_gpu_work_and_its_rerun_measures_no_stored_trial_again(
    sim4, tmp_path
):
    """A fresh local pool starts trials on its first worker up while the others join one by one
    (early start). A short sweep still reaches every GPU (each takes its share while the others
    come up), and a re-run finds the trials stored by GPUs that have not joined yet: the store's
    recorded GPUs are asked too."""
    from collections import Counter

    from orchestrator.launching.pool import close_pool

    d = tmp_path / "joining"
    common = ("workload=selu", "device.sm_clock_mhz=1110,1260", f"hydra.sweep.dir={d}")
    close_pool()
    assert sweep(*common, "seed=range(40,44)") == 0
    rows = stored(d)
    assert len(rows) == 8 and len({r["device_uuid"] for r in rows}) == 4
    close_pool()  # a new process's pool: its workers join one by one again
    assert sweep(*common, "seed=range(40,47)") == 0
    again = stored(d)
    assert len(again) == 14
    assert set(Counter(r["config_hash"] for r in again).values()) == {1}  # none measured twice
    assert {r["trial_key"] for r in rows} <= {r["trial_key"] for r in again}


def test_a_refused_combination_stops_the_sweep_with_one_line_and_keeps_what_ran(
    sim4, tmp_path, capsys
):
    # Each value is valid alone; hessian has no tf32 precision: that job is refused when made.
    d = tmp_path / "combo"
    rc = sweep("workload=gemm,hessian", "framework.precision=default,tf32", "seed=13",
               f"hydra.sweep.dir={d}")
    assert rc == 2
    err = capsys.readouterr().err
    line = next(ln for ln in err.splitlines() if ln.startswith("dvfs sweep:"))
    assert "job #3 (workload=hessian framework.precision=tf32)" in line and "tf32" in line
    assert "the sweep stops here" in line
    assert len(stored(d)) <= 3
    for i in range(4):
        assert sim_gpu(sim4, i)["locked_sm_mhz"] is None


def test_one_bad_value_anywhere_refuses_the_whole_sweep_before_anything_runs(
    sim4, tmp_path, capsys
):
    d = tmp_path / "bad"
    assert sweep("device.sm_clock_mhz=1065,1066,1410", f"hydra.sweep.dir={d}") == 2
    err = capsys.readouterr().err
    assert "SM clock 1066 MHz is not supported" in err and "nothing was run" in err
    assert stored(d) == []
    assert sweep("measure.repeats=1,0", f"hydra.sweep.dir={d}") == 2  # refused on the driver
    assert "job #1 (measure.repeats=0" in capsys.readouterr().err
    assert sweep("framework=jax,jx", f"hydra.sweep.dir={d}") == 2  # refused as it is composed
    assert "Could not find 'framework/jx'" in capsys.readouterr().err
    assert stored(d) == []


def test_a_worker_killed_mid_trial_is_a_crash_and_its_gpu_is_restored(sim4, tmp_path, capsys):
    d = tmp_path / "kill"
    rc = sweep(
        "hydra.launcher.placement=every",
        "device.sm_clock_mhz=1065,1140",
        "device.power_limit_w=250",
        "device.inject={exit_process:true,at_call:2,gpu:1}",
        "seed=13",
        f"hydra.sweep.dir={d}",
    )
    assert rc == 0
    rows = stored(d)
    assert len(rows) == 8
    gpu1 = uuids_in_pci_order(sim4)[1]
    crashed = [r for r in rows if r["status"] != "ok"]
    assert [(r["status"], r["device_uuid"]) for r in crashed] == [("crash", gpu1)]
    assert "worker process died" in crashed[0]["error"]
    # its trace showed the trial inside its kernel calls: the kernel's crash, the setting's
    assert "it died in the trial's kernel calls" in crashed[0]["error"]
    assert crashed[0]["failed_by"] == "setting"
    assert (
        len({r["launch"]["worker_pid"] for r in rows if r["device_uuid"] == gpu1}) == 2
    )  # replaced
    err = capsys.readouterr().err
    assert "restored" in err and "left changed by a killed worker" in err  # by the new worker
    state = sim_gpu(sim4, 1)
    assert state["locked_sm_mhz"] is None and state["power_limit_w"] == 400
    assert not list((sim4 / "journal").glob("*.json"))


def test_a_kernel_that_raised_is_a_failed_trial_and_the_worker_goes_on(sim4, tmp_path):
    d = tmp_path / "raise"
    rc = sweep(
        "hydra.launcher.placement=[" + uuids_in_pci_order(sim4)[0] + "]",
        "device.sm_clock_mhz=1065,1140,1215",
        "device.inject={raise_error:boom}",
        "seed=15",
        f"hydra.sweep.dir={d}",
    )
    assert rc == 0
    rows = stored(d)
    assert sorted(r["status"] for r in rows) == ["crash", "ok", "ok"]
    assert "injected fault: boom" in next(r["error"] for r in rows if r["status"] == "crash")
    assert len({r["launch"]["worker_pid"] for r in rows}) == 1  # the same worker ran all three


def test_a_second_sweep_waits_for_a_gpu_another_process_holds(sim4, tmp_path):
    from filelock import FileLock

    from orchestrator.launching.pool import close_pool

    close_pool()  # this module's workers hold every lease between tests
    gpu3 = uuids_in_pci_order(sim4)[3]
    lease = FileLock(
        str(sim4 / "journal" / f"{gpu3}.lease"), thread_local=False
    )  # released by the timer
    lease.acquire(timeout=30)
    released = {}
    d = tmp_path / "lease"

    def release() -> None:
        # Hold GPU 3 until the other three GPUs have stored their trials (or 120 s): the sweep
        # must make progress elsewhere while one GPU is held, however slowly workers start.
        deadline = time.time() + 120
        while time.time() < deadline and len(stored(d)) < 3:
            time.sleep(0.2)
        released["at"] = time.time()
        lease.release()

    timer = threading.Thread(target=release)
    timer.start()
    try:
        rc = sweep(
            "hydra.launcher.placement=every",
            "device.sm_clock_mhz=1065",
            "seed=16",
            f"hydra.sweep.dir={d}",
        )
    finally:
        timer.join()
    assert rc == 0
    rows = stored(d)
    assert len(rows) == 4 and all(r["status"] == "ok" for r in rows)
    waited = [r for r in rows if r["device_uuid"] == gpu3]
    assert waited[0]["launch"]["trial_started_at"] >= released["at"]
    assert all(
        r["launch"]["trial_started_at"] < released["at"] for r in rows if r["device_uuid"] != gpu3
    )


def test_optunas_sweeper_drives_the_launcher_with_each_jobs_objective(sim4, tmp_path):
    d = tmp_path / "optuna"
    rc = sweep(
        "hydra/sweeper=optuna",
        "hydra.sweeper.n_trials=4",
        "hydra.sweeper.n_jobs=2",
        "device.sm_clock_mhz=choice(1065,1215,1410)",
        "seed=17",
        f"hydra.sweep.dir={d}",
    )
    assert rc == 0
    results = (d / "optimization_results.yaml").read_text()
    assert "best_value" in results and "inf" not in results.split("best_value:")[1].split()[0]
    assert 1 <= len(stored(d)) <= 4


def test_jobs_pinned_to_different_gpus_share_one_batch_and_run_only_there(sim4, tmp_path, capsys):
    d = tmp_path / "pinned"
    by_pci = uuids_in_pci_order(sim4)
    rc = sweep(
        "workload=gemm",
        f"device.gpus=[0],[{by_pci[2]}]",  # by NVML index and by UUID
        "device.sm_clock_mhz=1005,1110,1215,1410",
        "measure.settle_s=0.5",
        *QUICK_TRIAL,
        "seed=17",
        f"hydra.sweep.dir={d}",
    )
    assert rc == 0
    rows = stored(d)
    assert len(rows) == 8 and all(r["status"] == "ok" for r in rows)
    by_gpu = defaultdict(list)
    for r in rows:
        by_gpu[r["device_index"]].append(r["sm_clock_min_mhz"])
        assert r["config"]["device"]["gpus"] == {0: [0], 2: [by_pci[2]]}[r["device_index"]]
    assert sorted(by_gpu) == [0, 2], by_gpu  # GPUs 1 and 3 took none of them
    assert sorted(by_gpu[0]) == sorted(by_gpu[2]) == [1005, 1110, 1215, 1410]
    assert_no_overlap(rows)
    spans = {
        i: [(r["launch"]["trial_started_at"], r["launch"]["trial_ended_at"]) for r in rows
            if r["device_index"] == i]
        for i in (0, 2)
    }
    side_by_side = any(a0 < b1 and a1 < b0 for a0, b0 in spans[0] for a1, b1 in spans[2])
    assert side_by_side, spans  # the two GPUs' jobs ran at the same time, not one after the other
    err = capsys.readouterr().err
    assert "ray_gpus: 8 trial(s) on 2 GPU(s)" in err


def test_a_job_that_selects_no_gpu_is_refused_before_anything_runs(sim4, tmp_path, capsys):
    d = tmp_path / "nogpu"
    rc = sweep("workload=stencil", "device.gpus=[0],[7]", f"hydra.sweep.dir={d}")
    assert rc == 2
    err = capsys.readouterr().err
    assert "device.gpus=[7]" in err and "no GPU with index 7" in err
    assert stored(d) == []


def test_a_gpu_that_falls_off_the_bus_takes_no_further_trials_and_the_report_names_it(
    sim4, tmp_path, capsys
):
    """GPU 1 is lost inside its first trial (clock locked): that trial is `device_error`, the GPU
    is retired, every other job runs on GPUs 0, 2 and 3; once it is back, `dvfs restore` puts back
    the clock the failed restore left locked. Last in the module: it leaves GPU 1 retired in the
    pool, which it closes."""
    from analysis.report import main as report_main
    from orchestrator.devices import journal_dir, open_backend
    from orchestrator.devices.sim import nvml as sim
    from orchestrator.launching.pool import close_pool
    from orchestrator.measuring.journal import Journal, restore_journal
    from orchestrator.results.store import ResultStore

    d = tmp_path / "lost"
    gpu1 = uuids_in_pci_order(sim4)[1]
    try:
        rc = sweep(
            "workload=gemm",
            "device.sm_clock_mhz=range(1005,1411,45)",
            "device.inject={lose_gpu:true,at_call:2,gpu:1}",
            "seed=23",
            f"hydra.sweep.dir={d}",
        )
        assert rc == 0
        rows = stored(d)
        assert len(rows) == 10  # every job has its row
        lost = [r for r in rows if r["device_uuid"] == gpu1]
        assert [r["status"] for r in lost] == ["device_error"]  # one trial, then no further
        assert "fallen off the bus" in lost[0]["error"]
        assert all(r["status"] == "ok" for r in rows if r["device_uuid"] != gpu1)
        assert len({r["device_uuid"] for r in rows}) == 4
        err = capsys.readouterr().err
        assert f"gpu1 ({gpu1}) retired:" in err and "fallen off the bus" in err
        with ResultStore(d, readonly=True) as store:
            retired = store.get_meta("retired_gpus")
        assert list(retired) == [gpu1] and "fallen off the bus" in retired[gpu1]["reason"]
        assert report_main([str(d)]) == 0
        text = (d / "report" / "report.md").read_text()
        assert f"gpu1 ({gpu1}) on" in text and "was retired during the sweep" in text
        # the restore inside the lost trial failed: the journal still names the locked clock
        journal = Journal(sim4 / "journal")
        assert journal.uuids() == [gpu1] and journal.read(gpu1)["changed"] == ["sm_clock"]
        assert sim_gpu(sim4, 1)["locked_sm_mhz"] is not None
    finally:
        close_pool()
        sim.nvmlInit()
        try:
            sim.simDeviceSetLost(sim.simDeviceGetHandleByUUID(gpu1), False)  # a reset, a reboot
        finally:
            sim.nvmlShutdown()
    backend = open_backend({"backend": "sim", "count": 4, **BRIEF_SIM})
    try:
        actions = restore_journal(
            Journal(journal_dir({"backend": "sim"})), lambda u: backend.device(uuid=u)
        )
    finally:
        backend.close()
    assert [(a.uuid, a.restored) for a in actions] == [(gpu1, ("sm_clock",))]
    assert sim_gpu(sim4, 1)["locked_sm_mhz"] is None and not list((sim4 / "journal").glob("*.json"))


# --- resume that loses nothing ------------------------------------------------------------------
def _kill_when_paused(trace: Path, killed: list[dict], timeout_s: float = 120) -> None:
    """SIGKILL the worker whose trace shows a trial that has not begun its kernel calls."""
    import signal

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not killed:
        try:
            data = json.loads(trace.read_text())
        except (FileNotFoundError, ValueError):
            data = None
        if data is not None and data["kernel_calls_at"] is None:
            os.kill(data["pid"], signal.SIGKILL)
            killed.append(data)
        time.sleep(0.02)


def test_a_worker_killed_from_outside_before_its_kernel_calls_is_not_measured_and_rerun(
    sim4, tmp_path
):
    from orchestrator.launching.pool import close_pool
    from orchestrator.measuring.trial_trace import trace_path

    d = tmp_path / "outside"
    gpu3 = uuids_in_pci_order(sim4)[3]
    args = ["hydra.launcher.placement=every", "device.sm_clock_mhz=1065,1140",
            "device.inject={pause_s:120,gpu:3}", "seed=31", f"hydra.sweep.dir={d}"]
    killed: list[dict] = []
    watcher = threading.Thread(target=_kill_when_paused,
                               args=(trace_path(sim4 / "journal", gpu3), killed))
    watcher.start()
    try:
        assert sweep(*args) == 0
    finally:
        watcher.join()
    assert len(killed) == 1  # killed from outside while its trial waited for its first call
    rows = stored(d)
    assert len(rows) == 8
    (lost,) = [r for r in rows if r["status"] != "ok"]
    assert (lost["status"], lost["failed_by"], lost["device_uuid"], lost["attempt"]) == (
        "not_measured", "circumstances", gpu3, 1)
    assert "died before the trial began its kernel calls" in lost["error"]
    assert lost["trial_key"] == killed[0]["trial_key"]

    close_pool()  # the same command again, as a user runs it: a new process, new workers
    assert sweep(*args) == 0
    again = stored(d)
    by_key = defaultdict(list)
    for r in again:
        by_key[r["trial_key"]].append((r["attempt"], r["status"]))
    assert sorted(by_key.pop(lost["trial_key"])) == [(1, "not_measured"), (2, "ok")]
    assert sorted(by_key.values()) == [[(1, "ok")]] * 7  # the measured ones were not run again


def test_a_gpu_lost_and_brought_back_gets_its_skipped_jobs_run_by_the_rerun(sim4, tmp_path):
    from orchestrator.devices import journal_dir, open_backend
    from orchestrator.devices.sim import nvml as sim
    from orchestrator.launching.pool import close_pool
    from orchestrator.measuring.journal import Journal, restore_journal

    d = tmp_path / "lost-back"
    gpu2 = uuids_in_pci_order(sim4)[2]
    args = ["hydra.launcher.placement=every", "device.sm_clock_mhz=1065,1140,1215",
            "device.inject={lose_gpu:true,at_call:2,gpu:2}", "seed=37", f"hydra.sweep.dir={d}"]
    try:
        assert sweep(*args) == 0
        on_gpu2 = [r for r in stored(d) if r["device_uuid"] == gpu2]
        assert sorted((r["status"], r["failed_by"]) for r in on_gpu2) == [
            ("device_error", "device"),  # lost during its kernel calls: kept, not retried
            ("not_measured", "circumstances"), ("not_measured", "circumstances")]
        close_pool()
        sim.nvmlInit()
        try:  # the GPU is reset (back on the bus), and `dvfs restore` undoes the failed trial
            sim.simDeviceSetLost(sim.simDeviceGetHandleByUUID(gpu2), False)
        finally:
            sim.nvmlShutdown()
        backend = open_backend({"backend": "sim"}, join_existing=True)
        try:
            restore_journal(Journal(journal_dir({"backend": "sim"})),
                            lambda u: backend.device(uuid=u))
        finally:
            backend.close()
        assert sweep(*args) == 0
        again = [r for r in stored(d) if r["device_uuid"] == gpu2]
        assert sorted((r["attempt"], r["status"]) for r in again) == [
            (1, "device_error"), (1, "not_measured"), (1, "not_measured"), (2, "ok"), (2, "ok")]
        assert len(stored(d)) == 12 + 2  # 3 jobs x 4 GPUs once, and the two re-run beside them
    finally:
        close_pool()


def test_a_sim_fault_below_the_threshold_is_the_settings_failure_and_is_not_retried(
    sim4, tmp_path
):
    from orchestrator.devices.sim import nvml as sim
    from orchestrator.launching.pool import close_pool

    sim.nvmlInit()
    try:  # GPU 2's seeded GEMM threshold: 600 MHz lies far below it
        threshold = sim.simDeviceGetStabilityThresholdMhz(sim.nvmlDeviceGetHandleByIndex(2), "gemm")
    finally:
        sim.nvmlShutdown()
    assert threshold > 700
    d = tmp_path / "below"
    args = ["workload=gemm", "device.gpus=[2]", "device.sm_clock_mhz=600", "seed=41",
            f"hydra.sweep.dir={d}"]
    assert sweep(*args) == 0
    (row,) = stored(d)
    assert row["status"] in ("wrong", "nondeterministic", "crash") and row["failed_by"] == "setting"
    close_pool()
    assert sweep(*args) == 0  # default retry=not_measured: the setting's failure is a result
    assert [(r["attempt"], r["status"]) for r in stored(d)] == [(1, row["status"])]
    assert sweep(*args, "hydra.launcher.retry=failed") == 0  # asked for: it runs again
    assert [r["attempt"] for r in stored(d)] == [1, 2]
    close_pool()
