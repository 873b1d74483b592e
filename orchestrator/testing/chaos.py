"""Chaos run: a sweep on 4 simulated GPUs under faults, each at a random moment; then the ledger.

    .venv/bin/python scripts/chaos.py --faults 100      # the full run: 100 faults, 11 of each kind
    .venv/bin/python scripts/chaos.py --faults 10       # the short form CI runs (every kind once)
    .venv/bin/python scripts/chaos.py --kinds gpu_lost --faults 1 --json out.json

One ``dvfs sweep -m`` (the ``ray_gpus`` launcher, one worker per simulated GPU) runs a grid while
this script injects, at random moments, one fault after another:

============== ==============================================================================
kind           what happens
============== ==============================================================================
driver_sigkill ``kill -9`` of the ``dvfs sweep`` process (sometimes while its workers start)
driver_sigterm ``kill -TERM`` of it: it must restore every GPU itself and exit 143
driver_sigint  Ctrl-C, as a terminal sends it (SIGINT to the driver's process group): it must
               restore every GPU itself and exit 130 within ``STOP_BOUND_S``
worker_sigkill ``kill -9`` of one GPU's worker actor (busy if one is)
worker_idle    ``kill -9`` of a worker while no kernel call of a trial runs (it is stopped with
               SIGSTOP, its trace read, and killed only if it shows no kernel call under way):
               the trial it held, if any, must be ``not_measured`` and a resume must measure it
kernel_hang    the next kernel call on one GPU sleeps for an hour (``inject.schedule``)
kernel_crash   the next kernel call on one GPU kills its process (a segfault, the OOM killer)
gpu_lost       one GPU falls off the bus: NVML answers GPU_IS_LOST until it is brought back
disk_full      the filesystem of the results store fills up (a tmpfs and a ballast file)
two_sweeps     the same command again (same directory) and another sweep on the same GPUs
============== ==============================================================================

After a fault that ends the driver, or a sweep that ended with trials not measured, it does what
an operator would: waits for the driver's processes to go (killing Ray agents they orphaned), runs
``dvfs restore``, frees the disk, then runs the same command again into the same directory
(resume, which measures what was not measured: ``hydra.launcher.retry=not_measured``). A lost
GPU is brought back (a reset) once its worker has let go of it, and ``dvfs restore`` puts back
what its failed trial left changed. When a sweep completes before the faults are done, the next
one starts in a new directory. At the end it checks and prints, over every sweep:

- trials expected, measured exactly once, lost (expected, never measured) and duplicated (a job
  measured on more than one GPU, or twice); rows not measured, and those a resume measured;
- rows by status, and the failed rows no injected fault explains (a spurious failure);
- GPUs left with non-default settings, left lost, journal entries left, trials that overlapped on
  one GPU (two sweeps must queue per GPU), and processes of this run left behind.

Exit code 0 when every target holds: 0 lost, 0 duplicated, 0 left not measured, 0 unexplained
failures, 0 GPUs left changed or lost, 0 journal entries, 0 overlapping trials, 0 processes
left, and every fault had the effect its kind promises. ``disk_full`` needs a tmpfs mount (root);
where that is refused it is left out, and said so.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestrator.testing.chaos_watch import (
    Driver,
    Sweep,
    alive,
    cmdline,
    descendants,
    overlaps,
    processes_with_env,
    unexplained,
    wait_for,
)

DVFS = [sys.executable, "-m", "orchestrator.cli"]
KINDS = (
    "driver_sigkill",
    "driver_sigterm",
    "driver_sigint",
    "worker_sigkill",
    "worker_idle",
    "kernel_hang",
    "kernel_crash",
    "gpu_lost",
    "disk_full",
    "two_sweeps",
)
GPUS = 4  # the full run's machine (--gpus); the suite's short form runs on 2
TRIAL_TIMEOUT_S = 15  # hydra.launcher.timeout_s: a hung kernel becomes `timeout` after this
COMMON = [
    "framework=jax",
    "workload.size=tiny",
    "measure=quick",
    "measure.window_s=1",
    "measure.settle_s=0",
    # A short check run after each window: chaos tests what faults leave, not stability, and a
    # full-length one doubles each trial's calls, which on 2 loaded cores nears the timeout below.
    "measure.check_iters=64",
    "quiet=true",
    f"hydra.launcher.timeout_s={TRIAL_TIMEOUT_S}",
    "hydra.launcher.max_restarts=-1",  # a chaos run kills workers on purpose: never retire for it
]
# Above the A100 profile's seeded stability band (thresholds lie at or below 930 MHz), so that
# every failed row is one a fault made.
MAIN_WORKLOADS = ("gemm", "stencil", "selu")
MAIN_CLOCKS = tuple(range(960, 1411, 15))
MIN_LEFT = 16  # a fault strikes a sweep with at least this many jobs left (else the next one)
SIDE_WORKLOADS = ("stencil",)
SIDE_CLOCKS = (1005, 1110, 1215, 1320)
# A stopped sweep's workers stop their trials at the next chunk of kernel calls, put their GPUs
# back and close; the driver waits 15 s for them (orchestrator.launching.pool.CLOSE_WAIT_S), then
# Ray ends.
STOP_BOUND_S = 20.0


# --- the run ------------------------------------------------------------------------------------
class ChaosRun:
    """The machine, the sweeps, the faults and what each did."""

    def __init__(
        self, root: Path, rng: random.Random, kinds: list[str], say: Callable[[str], None],
        gpus: int = GPUS,
    ):
        self.root = root
        self.machine = [f"device.count={gpus}"]
        self.rng = rng
        self.say = say
        self.state = root / "sim"
        self.journal = self.state / "journal"
        self.disk: Path | None = None  # the tmpfs the stores live on (for disk_full)
        self.ballast = None
        self.env = dict(os.environ, DVFS_SIM_STATE_DIR=str(self.state), PYTHONUNBUFFERED="1")
        for var, sub in (("RAY_TMPDIR", "ray"), ("MPLCONFIGDIR", "mpl"), ("KERAS_HOME", "keras")):
            self.env.setdefault(var, str(root / sub))
            Path(self.env[var]).mkdir(parents=True, exist_ok=True)
        os.environ["DVFS_SIM_STATE_DIR"] = str(self.state)  # this process's sim NVML: the same
        self.t0 = time.monotonic()
        self.sweeps: list[Sweep] = []
        self.sides: list[tuple[Driver, Sweep]] = []
        self.driver: Driver | None = None
        self.faults: list[dict[str, Any]] = []
        self.missed: list[dict[str, Any]] = []  # faults that struck nothing, and were struck again
        self.driver_starts = 0
        self.fruitless_exits = 0  # drivers in a row that exited by themselves, storing nothing
        self.orphans_killed = 0
        self.restores: list[str] = []
        self.not_run: dict[str, str] = {}
        self.kinds = kinds
        if "disk_full" in kinds:
            self._mount_tmpfs()

    # --- set-up and tear-down --------------------------------------------------------------
    def _mount_tmpfs(self) -> None:
        disk = self.root / "disk"
        disk.mkdir(parents=True, exist_ok=True)
        out = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m", "tmpfs", str(disk)],
                             capture_output=True, text=True)
        if out.returncode != 0:
            self.not_run["disk_full"] = f"cannot mount a tmpfs here: {out.stderr.strip()}"
            self.kinds = [k for k in self.kinds if k != "disk_full"]
            return
        self.disk = disk

    def close(self) -> None:
        """Tear down: kill the drivers still up and every process of this run, unmount the tmpfs.

        The stores on the tmpfs are copied to ``<root>/stores`` first, so that what the run left
        behind can be read after it (``tests/scripts/test_chaos.py`` reads it).
        """
        for d in [self.driver, *(s for s, _ in self.sides)]:
            if d is not None and d.alive():
                d.proc.kill()
                d.wait(30)
        for pid in processes_with_env("DVFS_SIM_STATE_DIR", str(self.state)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if self.disk is not None:
            shutil.copytree(self.disk, self.root / "stores", dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("ballast*"))
            subprocess.run(["umount", "-l", str(self.disk)], capture_output=True)

    def now(self) -> float:
        """Seconds since the run began (monotonic clock)."""
        return time.monotonic() - self.t0

    def _stores(self) -> Path:
        return self.disk if self.disk is not None else self.root / "stores"

    # --- sweeps ----------------------------------------------------------------------------
    def new_main_sweep(self) -> Sweep:
        """A new main sweep (``sweep-<n>``, the main grid) in a directory of its own."""
        n = sum(s.role == "main" for s in self.sweeps) + 1
        sweep = Sweep(self._stores() / f"sweep-{n}", MAIN_WORKLOADS, MAIN_CLOCKS, "main")
        self.sweeps.append(sweep)
        return sweep

    def start(self, sweep: Sweep) -> Driver:
        """Start ``dvfs sweep -m`` on ``sweep`` in a session of its own, its stderr to a log file.

        Returns:
            The running driver, with the rows its sweep held at the start (a resume counts from
            there).
        """
        log = self.root / "logs" / f"{sweep.directory.name}-{self.driver_starts}.err"
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "w") as err:
            command = sweep.command([*DVFS, "sweep", "-m", *self.machine, *COMMON])
            proc = subprocess.Popen(command, cwd=self.root,
                                    env=self.env,
                                    stdout=subprocess.DEVNULL, stderr=err,
                                    start_new_session=True)
        self.driver_starts += 1
        return Driver(proc, sweep, log, rows_at_start=len(sweep.rows()))

    def start_main(self, sweep: Sweep) -> None:
        """Start ``sweep`` as the main driver, the one the faults strike."""
        self.driver = self.start(sweep)

    def until_trials_flow(self, early: bool, claimed: bool = False) -> None:
        """Wait for a random moment of a running sweep (``early``: perhaps while it starts;
        ``claimed``: as soon as the driver holds its sweep directory, the whole sweep ahead)."""
        while True:
            d = self.driver
            assert d is not None
            if not d.alive():
                rc = d.proc.returncode
                ledger = d.sweep.ledger()
                if rc == 0 and not ledger["lost"]:
                    self.say(f"{d.sweep.directory.name} is complete; the next sweep starts")
                    self.start_main(self.new_main_sweep())
                elif rc == 0:
                    self.say(f"{d.sweep.directory.name} ended with {len(ledger['lost'])} job(s) "
                             f"not measured; the same command again")
                    self.recover(d, set())
                else:
                    self.say(f"the driver exited with {rc} by itself: {last_line(d.stderr())}")
                    stored = len(d.sweep.rows()) > d.rows_at_start
                    self.fruitless_exits = 0 if stored else self.fruitless_exits + 1
                    if self.fruitless_exits >= 3:  # it cannot start here: no fault is tested
                        raise RuntimeError(f"the driver exited with {rc} three times in a row "
                                           f"without storing a trial: {last_line(d.stderr())}")
                    self.recover(d, set())
                continue
            if len(d.sweep.ledger()["lost"]) < MIN_LEFT:  # jobs not measured yet
                d.wait(600)  # nearly done: a fault now could miss; strike the next sweep
                continue
            if claimed:
                if wait_for(lambda: self.claims(d) or not d.alive(), 180, 0.2) and d.alive():
                    return
                continue
            if early and self.rng.random() < 0.4:
                time.sleep(self.rng.uniform(0, 12))
                if d.alive():
                    return
                continue
            if wait_for(lambda: len(d.sweep.rows()) > d.rows_at_start or not d.alive(), 180, 0.5):
                if d.alive():
                    time.sleep(self.rng.uniform(0, 2.5))
                    if d.alive():
                        return
                continue
            raise RuntimeError(f"no trial was stored in 180 s: {last_line(d.stderr())}")

    @staticmethod
    def claims(d: Driver) -> bool:
        """Whether ``d`` holds its sweep directory (the owner file the claim writes names it)."""
        try:
            owner = json.loads((d.sweep.directory / ".dvfs-sweep.owner").read_text())
        except (OSError, ValueError):
            return False
        return isinstance(owner, dict) and owner.get("pid") == d.pid

    def recover(self, d: Driver, pids: set[int]) -> dict[str, Any]:
        """The driver has gone (or is going): clean up, restore, free the disk, resume."""
        rc = d.wait(120)
        if rc is None:
            d.proc.kill()
            rc = d.wait(30)
        wait_for(lambda: not any(alive(p) for p in pids), 5)
        orphans = [p for p in pids if alive(p)]  # Ray agents a killed driver leaves behind
        with contextlib.suppress(ProcessLookupError):
            os.killpg(d.pid, signal.SIGKILL)
        for p in orphans:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
        gone = wait_for(lambda: not any(alive(p) for p in pids), 30)
        self.orphans_killed += len(orphans)
        left_by_driver = len(self.orphaned_entries())
        restored = self.dvfs_restore()
        self.free_disk()
        clean = None
        if not any(s.alive() for s, _ in self.sides):  # nothing else may hold a GPU now
            clean = not self.changed_gpus() and not self.journal_entries()
        self.start_main(d.sweep)
        return {"driver_rc": rc, "workers_gone": gone, "orphans_killed": len(orphans),
                "journal_left_by_driver": left_by_driver, "restore": restored,
                "clean_after_restore": clean}

    def rows_with(self, status: str) -> int:
        """Rows of this status in every sweep so far."""
        return sum(1 for sweep in self.sweeps for r in sweep.rows() if r["status"] == status)

    def dvfs_restore(self) -> str:
        """Run ``dvfs restore`` on the machine, as an operator would after a fault; its last line.

        Raises:
            RuntimeError: ``dvfs restore`` failed.
        """
        out = subprocess.run([*DVFS, "restore", *self.machine], cwd=self.root, env=self.env,
                             capture_output=True, text=True, timeout=120)
        text = (out.stdout + out.stderr).strip()
        self.restores.append(text)
        if out.returncode != 0:
            raise RuntimeError(f"dvfs restore failed ({out.returncode}): {text}")
        return last_line(text)

    # --- the machine -----------------------------------------------------------------------
    def uuids(self) -> list[str]:
        """The simulated GPUs' UUIDs in index order, from the machine's ``machine.json``."""
        gpus = json.loads((self.state / "machine.json").read_text())["gpus"]
        return [g["uuid"] for g in gpus]

    def changed_gpus(self) -> list[str]:
        """GPUs not at their defaults (locked clocks, power limit, offset) or still lost."""
        from orchestrator.devices.sim.state import Machine

        return Machine(self.state).changed()

    def journal_entries(self) -> list[str]:
        """The UUIDs of the GPUs with a journal entry (a setting not yet restored), sorted."""
        return sorted(p.stem for p in self.journal.glob("*.json")) if self.journal.exists() else []

    def orphaned_entries(self) -> list[str]:
        """Journal entries no live process owns (another sweep's workers own theirs)."""
        return [u for u in self.journal_entries() if not self.is_leased(u)]

    def set_lost(self, uuid: str, lost: bool) -> None:
        """Make the GPU ``uuid`` fall off the bus (``lost``) or bring it back (a reset)."""
        from orchestrator.devices.sim import nvml as sim

        sim.nvmlInit()
        try:
            sim.simDeviceSetLost(sim.simDeviceGetHandleByUUID(uuid), lost)  # lost or not
        finally:
            sim.nvmlShutdown()

    def is_leased(self, uuid: str) -> bool:
        """Whether a live process holds the lease on the GPU ``uuid`` right now."""
        from orchestrator.measuring.journal import Journal

        return Journal(self.journal).is_leased(uuid)

    def fill_disk(self) -> int:
        """Fill the tmpfs with a ballast file until not one byte more fits; the bytes written."""
        assert self.disk is not None
        fd = os.open(self.disk / "ballast", os.O_WRONLY | os.O_CREAT, 0o600)
        written = 0
        try:
            for chunk in (1 << 20, 1 << 16, 1 << 12, 1 << 9, 1):
                block = b"\0" * chunk
                with contextlib.suppress(OSError):
                    while True:
                        written += os.write(fd, block)
        finally:
            os.close(fd)
        return written

    def free_disk(self) -> None:
        """Delete the ballast file, so the stores can be written again (no tmpfs: nothing)."""
        if self.disk is not None:
            (self.disk / "ballast").unlink(missing_ok=True)


def last_line(text: str) -> str:
    """The last non-blank line of ``text``, cut to 300 characters (empty if there is none)."""
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


# --- the faults -------------------------------------------------------------------------------
# The launcher's last line when its sweep ran to its end, and the CLI's line for a stopped one.
SUMMARY = "; report: dvfs report "
STOP_LINES = ("interrupted (Ctrl-C)", "terminated (SIGTERM)")


def had_ended(rc: int | None, sig: int, stderr: str) -> bool:
    """Whether a driver sent ``sig`` had already ended its command: it exited 0, or it died of
    ``sig`` itself after its summary and without a stop line.

    The second is Python's own exit: once the command has closed its workers and Ray and put
    back the handlers it had replaced, the interpreter restores the default ones
    (``_PySignal_Fini``) while it tears down Ray's and JAX's modules, for about 0.4 s here, and a
    signal then ends the process as it ends any program, with nothing left to stop (seen in CI:
    a Ctrl-C 0.0 s before the exit, `-2`). A driver stopped mid-sweep has said no summary.
    """
    if rc == 0:
        return True
    return rc == -sig and SUMMARY in stderr and not any(line in stderr for line in STOP_LINES)


def _signal_driver(run: ChaosRun, sig: int, ok: Callable[[dict[str, Any], Driver], bool],
                   group: bool = False) -> dict[str, Any]:
    """Send ``sig`` to the driver (``group``: to its process group, as a terminal's Ctrl-C),
    time how long it takes to exit (``stop_s``), then recover."""
    d = run.driver
    if not d.alive():
        return {"missed": "the sweep had just ended"}
    pids = descendants(d.pid)
    stored = len(d.sweep.rows())
    t0 = time.monotonic()
    (os.killpg if group else os.kill)(d.pid, sig)
    exited = d.wait(120) is not None
    stop_s = round(time.monotonic() - t0, 2) if exited else None
    rc = d.proc.returncode if exited else None
    ended = had_ended(rc, sig, d.stderr())
    ledger = d.sweep.ledger()
    # jobs with no row at all: a sweep stopped midway leaves them (its stopped and queued trials
    # are not stored); one that ended has a row for each, `not_measured` for a job an earlier
    # fault left unmeasured (its worker killed before the trial's kernel calls, its GPU retired),
    # which a resume measures
    unrowed = set(ledger["lost"]) - set(ledger["not_measured_open"])
    if ended and not unrowed and len(ledger["rows"]) == stored:
        # Every job had its row before the signal and none came after: it struck the driver's
        # last second (Ray shutting down, Python exiting, after the command's signal
        # handling), not a running sweep.
        run.recover(d, pids)
        return {"missed": f"the sweep ended as the signal came (exit {rc} after {stop_s} s, "
                          "every job's row stored before it)"}
    rec = {**run.recover(d, pids), "stop_s": stop_s}
    return {"target": f"driver pid {d.pid}{' and its group' if group else ''}", **rec,
            "ok": ok(rec, d)}


def fault_driver_sigkill(run: ChaosRun) -> dict[str, Any]:
    """``kill -9`` the driver, then recover; it worked if the driver died of SIGKILL."""
    return _signal_driver(run, signal.SIGKILL, lambda rec, d: rec["driver_rc"] == -signal.SIGKILL)


def fault_driver_sigterm(run: ChaosRun) -> dict[str, Any]:
    """It must restore every GPU itself: no journal entry left before `dvfs restore` runs."""
    return _signal_driver(run, signal.SIGTERM, lambda rec, d: (
        rec["driver_rc"] == 128 + signal.SIGTERM and "terminated (SIGTERM)" in d.stderr()
        and rec["journal_left_by_driver"] == 0))


def fault_driver_sigint(run: ChaosRun) -> dict[str, Any]:
    """Ctrl-C in the driver's terminal: SIGINT to its process group (its Ray processes share it;
    Ray starts each worker in a group of its own). It must put every GPU back itself (no
    journal entry before `dvfs restore` runs), say so in one line and exit 130, within
    ``STOP_BOUND_S``."""
    return _signal_driver(run, signal.SIGINT, lambda rec, d: (
        rec["driver_rc"] == 130 and "interrupted (Ctrl-C)" in d.stderr()
        and rec["journal_left_by_driver"] == 0 and rec["stop_s"] is not None
        and rec["stop_s"] <= STOP_BOUND_S), group=True)


def fault_worker_sigkill(run: ChaosRun) -> dict[str, Any]:
    """``kill -9`` one GPU's worker (the first one mostly, else any).

    It worked if a new worker started within 60 s, or the sweep ended with 0.
    """
    d = run.driver
    workers = d.workers()
    if not workers:
        return {"missed": "no worker was up yet"}
    pid = workers[0] if run.rng.random() < 0.8 else run.rng.choice(workers)
    busy = ".run" in cmdline(pid)
    news = d.stderr().count("starting a new worker")
    os.kill(pid, signal.SIGKILL)
    # The supervisor sees the death at once if the worker was busy, else at its next job (or at
    # the end of the sweep, when there is none left).
    replaced = wait_for(lambda: d.stderr().count("starting a new worker") > news
                        or not d.alive(), 60)
    return {"target": f"worker pid {pid} ({'busy' if busy else 'idle'})",
            "ok": replaced and (d.alive() or d.proc.returncode == 0)}


def _pre_kernel(run: ChaosRun, pid: int) -> bool:
    """Whether the stopped worker ``pid`` is outside a trial's kernel calls: its GPU's trace
    (``orchestrator.measuring.trial_trace``) is gone (between trials) or shows no kernel call
    begun."""
    for path in run.journal.glob("*.trace"):
        with contextlib.suppress(OSError, ValueError):
            data = json.loads(path.read_text())
            if data.get("pid") == pid:
                return data.get("kernel_calls_at") is None
    return True


def fault_worker_idle(run: ChaosRun) -> dict[str, Any]:
    """``kill -9`` of a worker while no kernel call of a trial runs on it.

    A worker is frozen (SIGSTOP: its trace cannot change any more), its trace read, and it is
    killed only if no kernel call is under way, else let go (SIGCONT) and another moment tried.
    It worked if a new worker started within 60 s (or the sweep ended with 0) and no crash row
    names the killed worker: whatever it held is ``not_measured``.
    """
    d = run.driver
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and d.alive():
        workers = d.workers()
        if not workers:
            time.sleep(0.2)
            continue
        pid = run.rng.choice(workers)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
            if _pre_kernel(run, pid):
                news = d.stderr().count("starting a new worker")
                os.kill(pid, signal.SIGKILL)
                replaced = wait_for(lambda: d.stderr().count("starting a new worker") > news
                                    or not d.alive(), 60)
                crashed = any(r["status"] == "crash" and f"pid {pid} " in (r.get("error") or "")
                              for r in d.sweep.rows())
                return {"target": f"worker pid {pid} (outside its kernel calls)",
                        "ok": replaced and not crashed
                        and (d.alive() or d.proc.returncode == 0)}
            os.kill(pid, signal.SIGCONT)
        time.sleep(run.rng.uniform(0, 0.05))
    return {"missed": "no worker was outside its kernel calls for a moment"}


def _schedule(run: ChaosRun, action: dict[str, Any], status: str) -> dict[str, Any]:
    """Schedule ``action`` on a random GPU; wait until a kernel call takes it and its row is in."""
    from orchestrator.measuring import inject
    uuid = run.rng.choice(run.uuids())
    before = run.rows_with(status)
    inject.schedule(run.state, uuid, action)
    deadline = time.monotonic() + 300
    while inject.pending(run.state, uuid) and time.monotonic() < deadline:
        d = run.driver
        wait_for(lambda: not inject.pending(run.state, uuid) or not d.alive(), 60)
        if inject.pending(run.state, uuid) and not d.alive():
            run.until_trials_flow(early=False)  # the sweep ended first: the next one takes it
    fired = not inject.pending(run.state, uuid)
    effect = wait_for(lambda: run.rows_with(status) > before, TRIAL_TIMEOUT_S + 60)
    return {"target": f"gpu {run.uuids().index(uuid)} ({uuid})", "fired": fired,
            "ok": fired and effect}


def fault_kernel_hang(run: ChaosRun) -> dict[str, Any]:
    """A random GPU's next kernel call hangs an hour; it worked once a ``timeout`` row is in."""
    return _schedule(run, {"hang_s": 3600}, "timeout")


def fault_kernel_crash(run: ChaosRun) -> dict[str, Any]:
    """A random GPU's next kernel call kills its process; it worked once a ``crash`` row is in."""
    return _schedule(run, {"exit_process": True}, "crash")


def fault_gpu_lost(run: ChaosRun) -> dict[str, Any]:
    """A GPU (one the sweep holds, if any) falls off the bus; it is brought back once let go.

    It worked if the sweep let go of the GPU within 120 s (its worker retired, or the sweep
    ended); ``dvfs restore`` then puts back what its failed trial left changed.
    """
    d = run.driver
    uuids = run.uuids()
    in_use = [u for u in uuids if run.is_leased(u)]  # a GPU the sweep still holds, if any
    uuid = run.rng.choice(in_use or uuids)
    retirements = d.stderr().count(f"({uuid}) retired")
    run.set_lost(uuid, True)
    # Its worker finds out at its next NVML call and is retired (its lease freed), or the sweep
    # ends first; then the GPU is reset (brought back) and `dvfs restore` puts back what the
    # trial it failed in left changed.
    let_go = wait_for(lambda: not run.is_leased(uuid) or not d.alive(), 120, 0.5)
    retired = d.stderr().count(f"({uuid}) retired") > retirements
    run.set_lost(uuid, False)
    restored = run.dvfs_restore()
    return {"target": f"gpu {uuids.index(uuid)} ({uuid})", "retired": retired,
            "restore": restored, "ok": let_go}


def fault_disk_full(run: ChaosRun) -> dict[str, Any]:
    """Fill the stores' disk: the driver must exit 4, saying to free space, with no journal left.

    Then recover (restore, free the disk, resume); a sweep that ended with 0 before it wrote
    again is a miss.
    """
    d = run.driver
    pids = descendants(d.pid)
    filled = run.fill_disk()
    rc = d.wait(120)
    if rc == 0:  # it stored its last trial before the disk filled: nothing to see
        run.free_disk()
        return {"missed": "the sweep ended before it wrote again"}
    said = "free space, then run the same command again" in d.stderr()
    rec = run.recover(d, pids)
    return {"target": f"{run.disk} ({filled} bytes of ballast)", **rec,
            "ok": rc == 4 and said and rec["journal_left_by_driver"] == 0}


def fault_two_sweeps(run: ChaosRun) -> dict[str, Any]:
    """Start the same command again (same directory) and a side sweep on the same GPUs.

    It worked if the second ``dvfs sweep`` into the same directory was refused (exit 2, "is being
    written by another sweep"); the side sweep queues per GPU and runs to its end.
    """
    d = run.driver
    same = run.start(d.sweep)  # the same command, the same directory, at once
    n = len(run.sides) + 1
    side = Sweep(run._stores() / f"other-{n}", SIDE_WORKLOADS, SIDE_CLOCKS, "side")
    run.sweeps.append(side)
    run.sides.append((run.start(side), side))
    rc = same.wait(120)
    if rc == 0 and not d.alive():  # the first ended before the second looked: nothing to refuse
        return {"target": f"{d.sweep.directory.name} again and {side.directory.name}",
                "missed": "the sweep ended before the second one started"}
    refused = rc == 2 and "is being written by another sweep" in same.stderr()
    return {"target": f"{d.sweep.directory.name} again and {side.directory.name}",
            "same_dir_rc": rc, "ok": refused}


FAULTS: dict[str, Callable[[ChaosRun], dict[str, Any]]] = {
    "driver_sigkill": fault_driver_sigkill,
    "driver_sigterm": fault_driver_sigterm,
    "driver_sigint": fault_driver_sigint,
    "worker_sigkill": fault_worker_sigkill,
    "worker_idle": fault_worker_idle,
    "kernel_hang": fault_kernel_hang,
    "kernel_crash": fault_kernel_crash,
    "gpu_lost": fault_gpu_lost,
    "disk_full": fault_disk_full,
    "two_sweeps": fault_two_sweeps,
}
EARLY = ("driver_sigkill", "driver_sigterm", "driver_sigint")  # may strike while workers start
# Strikes once the driver holds its directory: a second `dvfs sweep` takes ~30 s to get as far on 2
# cores the workers keep busy, longer than what is left of a sweep once its trials flow.
CLAIMED = ("two_sweeps",)


# --- the end ------------------------------------------------------------------------------------
def finish(run: ChaosRun) -> None:
    """Let the last sweep and the side sweeps run to their end (resuming after a stray death)."""
    from orchestrator.measuring import inject
    for _ in range(5):
        d = run.driver
        rc = d.wait(900)
        if rc == 0 and not d.sweep.ledger()["lost"]:
            break
        run.say(f"the driver ended with {rc} after the last fault ("
                f"{len(d.sweep.ledger()['lost'])} job(s) not measured): {last_line(d.stderr())}")
        run.recover(d, descendants(d.pid))
    for uuid in run.uuids():  # a scheduled fault the last trials never reached
        if inject.pending(run.state, uuid):
            run.say(f"a scheduled fault for {uuid} never fired; removed")
            (run.state / "inject" / f"next-{uuid}.json").unlink(missing_ok=True)
    for n, (side, sweep) in enumerate(run.sides):
        for _ in range(5):  # a side sweep a fault stopped (a full disk) is resumed, as the main one
            rc = side.wait(900)
            if rc == 0 and not sweep.ledger()["lost"]:
                break
            run.say(f"{sweep.directory.name} ended with {rc}: {last_line(side.stderr())}; "
                    f"running it again")
            run.dvfs_restore()
            side = run.start(sweep)
            run.sides[n] = (side, sweep)


def processes_left(run: ChaosRun) -> list[int]:
    """Processes of this run still alive once every sweep has ended (Ray's take a moment)."""
    wait_for(lambda: not processes_with_env("DVFS_SIM_STATE_DIR", str(run.state)), 30, 0.5)
    return processes_with_env("DVFS_SIM_STATE_DIR", str(run.state))


def ledger(run: ChaosRun) -> dict[str, Any]:
    """What the run left, per sweep and in total, and whether every target was met."""
    sweeps = [s.ledger() for s in run.sweeps]
    rows = [r for s in sweeps for r in s.pop("rows")]
    failing_kinds = Counter(f["kind"] for f in run.faults)
    can_fail = sum(failing_kinds[k] for k in ("worker_sigkill", "kernel_hang", "kernel_crash",
                                              "gpu_lost"))
    statuses = Counter(r["status"] for r in rows)
    failed = sum(n for s, n in statuses.items() if s not in ("ok", "not_measured"))
    totals = {
        "faults": len(run.faults),
        "faults_by_kind": dict(failing_kinds),
        "faults_without_effect": [f"#{f['n']} {f['kind']}" for f in run.faults
                                  if not f.get("ok")],
        "faults_struck_again": len(run.missed),
        "sweeps": len(sweeps),
        "driver_starts": run.driver_starts,
        "expected": sum(s["expected"] for s in sweeps),
        "stored_once": sum(s["stored_once"] for s in sweeps),
        "lost": sum(len(s["lost"]) for s in sweeps),
        "duplicated": sum(len(s["duplicated"]) for s in sweeps),
        "unexpected": sum(len(s["unexpected"]) for s in sweeps),
        "not_measured_rows": sum(s["not_measured"] for s in sweeps),
        "not_measured_retried": sum(len(s["not_measured_retried"]) for s in sweeps),
        "not_measured_open": sum(len(s["not_measured_open"]) for s in sweeps),
        "rows_by_status": dict(statuses),
        "failed_rows": failed,
        "failed_rows_faults_could_make": can_fail,
        "unexplained_failed_rows": unexplained(rows),
        "gpus_left_changed": run.changed_gpus(),
        "journal_entries_left": run.journal_entries(),
        "overlapping_trials": overlaps(rows),
        "processes_left": len(processes_left(run)),
        "orphans_killed": run.orphans_killed,
        "kinds_not_run": run.not_run,
        "stop_s_by_kind": {k: [f.get("stop_s") for f in run.faults if f["kind"] == k]
                           for k in ("driver_sigterm", "driver_sigint") if failing_kinds[k]},
    }
    met = (totals["lost"] == 0 and totals["duplicated"] == 0 and totals["unexpected"] == 0
           and totals["not_measured_open"] == 0 and not totals["unexplained_failed_rows"]
           and failed <= can_fail
           and not totals["gpus_left_changed"] and not totals["journal_entries_left"]
           and totals["overlapping_trials"] == 0 and totals["processes_left"] == 0
           and not totals["faults_without_effect"])
    return {"sweeps": sweeps, "totals": totals, "targets_met": met}


def summary(result: dict[str, Any]) -> str:
    """The ledger as the few lines printed at the end of a run."""
    t = result["totals"]
    by_kind = ", ".join(f"{k} {n}" for k, n in sorted(t["faults_by_kind"].items()))
    statuses = ", ".join(f"{k} {n}" for k, n in sorted(t["rows_by_status"].items()))
    lines = [
        f"chaos: {t['faults']} faults ({by_kind}) over {t['sweeps']} sweeps, "
        f"{t['driver_starts']} driver starts, {result['wall_s']:.0f} s",
        f"  trials expected {t['expected']} | measured exactly once {t['stored_once']} | "
        f"lost {t['lost']} | duplicated {t['duplicated']}",
        f"  not measured: {t['not_measured_rows']} row(s); jobs measured by a resume "
        f"{t['not_measured_retried']}; left not measured {t['not_measured_open']}",
        f"  rows: {statuses}; failed rows no fault explains: {len(t['unexplained_failed_rows'])} "
        f"(at most {t['failed_rows_faults_could_make']} could fail, {t['failed_rows']} did)",
        f"  GPUs left changed or lost: {len(t['gpus_left_changed'])} | journal entries left: "
        f"{len(t['journal_entries_left'])} | trials overlapping on a GPU: "
        f"{t['overlapping_trials']} | processes left: {t['processes_left']} "
        f"(Ray agents orphaned by killed drivers, cleaned: {t['orphans_killed']})",
        f"  faults without their effect: {len(t['faults_without_effect'])} "
        f"{' '.join(t['faults_without_effect'])}".rstrip(),
    ]
    stops = t.get("stop_s_by_kind") or {}
    for kind, times in sorted(stops.items()):
        shown = ", ".join("?" if x is None else f"{x:.1f}" for x in times)
        lines.append(f"  {kind}: exited {shown} s after the signal")
    if t["kinds_not_run"]:
        lines.append(f"  not run: {t['kinds_not_run']}")
    lines.append(f"  targets {'met' if result['targets_met'] else 'NOT met'}")
    return "\n".join(lines)


# --- main ---------------------------------------------------------------------------------------
def schedule_of(kinds: list[str], n: int, rng: random.Random) -> list[str]:
    """``n`` faults, every kind as often as the others (within one), in random order."""
    plan = [kinds[i % len(kinds)] for i in range(n)]
    rng.shuffle(plan)
    return plan


def run_chaos(root: Path, faults: int, kinds: list[str], seed: int,
              say: Callable[[str], None], gpus: int = GPUS) -> dict[str, Any]:
    """The whole chaos run: a main sweep, ``faults`` faults at random moments, then the ledger.

    Args:
        root: the work directory (state, stores, logs).
        faults: how many faults to inject.
        kinds: the fault kinds to draw from (``disk_full`` is dropped where no tmpfs mounts).
        seed: seeds the kinds' order and the moments.
        say: prints one progress line.
        gpus: how many simulated GPUs the machine has.

    Returns:
        The ledger, with every fault's record, every ``dvfs restore`` output and the wall time
        in seconds.
    """
    rng = random.Random(seed)
    run = ChaosRun(root, rng, kinds, say, gpus)
    try:
        plan = schedule_of(run.kinds, faults, rng)
        say(f"{len(plan)} faults on {gpus} simulated GPUs, seed {seed}; working in {root}")
        run.start_main(run.new_main_sweep())
        for n, kind in enumerate(plan, 1):
            for _ in range(5):  # a fault that found nothing to strike is struck again
                run.until_trials_flow(early=kind in EARLY, claimed=kind in CLAIMED)
                at = run.now()
                record = {"n": n, "kind": kind, "at_s": round(at, 1), **FAULTS[kind](run)}
                if "missed" not in record:
                    break
                run.missed.append(record)
                say(f"fault {n}/{len(plan)} {kind} missed ({record['missed']}); again")
            record["took_s"] = round(run.now() - at, 1)
            run.faults.append(record)
            say(f"fault {n}/{len(plan)} {kind} at {at:.1f} s: {record.get('target')}"
                f"{'' if record.get('ok') else ' (NO EFFECT SEEN)'}")
        finish(run)
        result = ledger(run)
    finally:
        run.close()
    result["faults"] = run.faults
    result["restores"] = run.restores
    result["root"] = str(root)
    result["wall_s"] = run.now()
    return result


def main(argv: list[str] | None = None) -> int:
    """Run chaos from the command line; exit status 0 when every target was met, else 1."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--faults", type=int, default=100, help="how many faults (default 100)")
    parser.add_argument("--kinds", default=",".join(KINDS), help="comma-separated fault kinds")
    parser.add_argument("--seed", type=int, default=0, help="seeds the kinds' order and moments")
    parser.add_argument("--gpus", type=int, default=GPUS,
                        help=f"simulated GPUs (default {GPUS}; 2 or more)")
    parser.add_argument("--dir", type=Path, help="work here (default: a new temporary directory)")
    parser.add_argument("--json", type=Path, help="also write the full result here")
    args = parser.parse_args(argv)
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown or not kinds or args.faults < 1 or args.gpus < 2:
        parser.error(f"--kinds must name some of {', '.join(KINDS)} (unknown: {unknown}), "
                     f"--faults be 1 or more and --gpus 2 or more")
    root = (args.dir or Path(tempfile.mkdtemp(prefix="dvfs-chaos-"))).resolve()
    root.mkdir(parents=True, exist_ok=True)

    def say(text: str) -> None:
        print(f"chaos: {text}", flush=True)

    signal.signal(signal.SIGTERM, signal.default_int_handler)  # clean up on SIGTERM as on ^C
    result = run_chaos(root, args.faults, kinds, args.seed, say, args.gpus)
    print(summary(result), flush=True)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, default=str))
    return 0 if result["targets_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
