"""Benchmark the driver at scale: grids of 30 to 10,000 jobs on 4 and 16 simulated GPUs, and 64.

Each grid is one ``dvfs sweep -m`` in a fresh process (``hydra/launcher=ray_gpus``, a local Ray
instance, the simulated GPU): ``workload=selu framework=jax`` at the tiny size with the shortest
valid window, over ``device.sm_clock_mhz`` (up to 50 clocks) x ``seed`` (as many as the size
needs). Printed per grid:

- ``first_s``: from the command's start to the first trial row in the store (polled every 20 ms);
- ``cpu/job``: the driver process's CPU time (user + system, all its threads; ``getrusage`` at
  its exit, so Ray's own processes and the workers are not counted), over the jobs;
- ``peak_rss``: the driver's peak resident memory (``ru_maxrss``);
- ``resume_s``: the same command again, on the finished store (a no-op resume), and whether the
  store then holds each job exactly once (``--reruns`` re-runs, each checked).

The ``--wide`` grid runs 64 simulated GPUs on jobs that wait off-CPU (``device.inject`` sleeps
``--off-cpu-s`` in each trial, as a GPU kernel leaves the host idle), each job on every GPU
(``placement=every``: every worker gets its share however late it came up), and prints the steady
overhead per trial: a GPU's mean idle gap from one trial's end to its next trial's start, after
each worker's first trial, counted once every worker is up (``scripts/bench_launcher.py`` defines
it). With ``hydra.launcher.queue_ahead`` (the default) each GPU's next trial waits in its worker
while the last one runs, so the gap is the worker's reply, Ray's turn to the next call and the
worker's pre-trial work; ``--no-queue-ahead`` measures the round trip through the driver instead
(the result, the dispatch, Ray's submit). The wait is long enough (8 s) that 64 trials' own CPU
(about 0.1 s each on the sim) stays within two cores.

Targets (issue 16, this 2-core machine): first trial under 10 s at every size; driver CPU at most
5 ms per job at 10,000 jobs; peak driver RSS under 1 GB at 10,000 jobs; no-op resume of 10,000
stored jobs under 15 s; 64-GPU steady overhead under 10 ms.

Run: ``.venv/bin/python scripts/bench_scale.py`` (about an hour on 2 cores: 26,000 trials of the
simulated GPU take their CPU too); ``--sizes 30,500 --gpus 4 --no-wide`` for a quick look.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_launcher import figures, trial_spans  # this folder's: the same figures

from orchestrator.results.store import ResultStore

COMMON = [
    "workload=selu", "framework=jax", "workload.size=tiny", "measure=quick",
    "measure.window_s=0.05", "measure.min_iters=1", "measure.warmup_iters=0",
    "measure.settle_s=0", "measure.reference_samples=1", "measure.min_counter_updates=1",
    "measure.check_iters=1", "device.energy_update_period_s=0.01", "quiet=true",
    "hydra.launcher.progress=false",
]
MAX_CLOCKS = 50  # 660..1395 MHz in 15 MHz steps: every one an A100 clock

# The driver, run in-process with its own figures written at exit (after Ray has shut down).
_DRIVER = """
import atexit, json, resource, sys, time
def _figures():
    r = resource.getrusage(resource.RUSAGE_SELF)
    with open(sys.argv[1], "w") as f:
        json.dump({"cpu_s": r.ru_utime + r.ru_stime, "maxrss_mb": r.ru_maxrss / 1024}, f)
atexit.register(_figures)
from orchestrator.cli import main
sys.exit(main(sys.argv[2:]))
"""


def grid(size: int) -> list[str]:
    """Overrides of a ``size``-job grid: clocks x seeds (Hydra's ``range`` sweeps)."""
    clocks = max(c for c in range(1, min(size, MAX_CLOCKS) + 1) if size % c == 0)
    seeds = size // clocks
    return [f"device.sm_clock_mhz=range(660,{660 + 15 * clocks},15)",
            f"seed=range(0,{seeds})" if seeds > 1 else "seed=0"]


def has_rows(db: Path) -> float | None:
    """Whether the store holds a trial yet (None: not yet)."""
    if not db.exists():
        return None
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=0.1) as con:
            return con.execute("SELECT 1 FROM trials LIMIT 1").fetchone()
    except sqlite3.Error:
        return None


def stored_counts(db: Path) -> tuple[int, int]:
    """(rows, distinct trial keys) in the store."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
        return con.execute("SELECT COUNT(*), COUNT(DISTINCT trial_key) FROM trials").fetchone()


def run_sweep(
    args: list[str], sweep_dir: Path, env: dict[str, str], log: Path, first_only: bool = False
) -> dict:
    """One ``dvfs sweep -m`` in a fresh process: wall, first-trial time, driver CPU and RSS
    (``first_only``: interrupted, as Ctrl-C does, once the first trial is stored)."""
    figures = log.with_suffix(".json")
    cmd = [sys.executable, "-c", _DRIVER, str(figures), "sweep", "-m", *args,
           f"hydra.sweep.dir={sweep_dir}"]
    db = sweep_dir / "trials.sqlite"
    had_rows = has_rows(db) is not None
    t0 = time.monotonic()
    first = None
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=log.parent, env=env, stdout=out, stderr=subprocess.STDOUT)
        while proc.poll() is None:
            if first is None and not had_rows and has_rows(db):
                first = time.monotonic() - t0
                if first_only:
                    proc.send_signal(signal.SIGINT)
            time.sleep(0.02)
    wall = time.monotonic() - t0
    if first_only:
        return {"wall_s": wall, "first_s": first, "cpu_s": float("nan"), "maxrss_mb": 0.0}
    if proc.returncode != 0:
        raise SystemExit(f"sweep failed ({proc.returncode}); see {log}:\n"
                         + log.read_text()[-3000:])
    return {"wall_s": wall, "first_s": first, **json.loads(figures.read_text())}


def bench_grid(size: int, gpus: int, reruns: int, scratch: Path, first_only: bool = False) -> dict:
    """Run one grid, then re-run it ``reruns`` times; the figures of both."""
    tag = f"g{gpus}_n{size}"
    while (scratch / tag).exists():  # the same grid asked for twice: a fresh store each time
        tag += "+"
    sweep_dir, state = scratch / tag / "sweep", scratch / tag / "sim"
    sweep_dir.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, DVFS_SIM_STATE_DIR=str(state))
    args = [*COMMON, f"device.count={gpus}", *grid(size)]
    run = run_sweep(args, sweep_dir, env, scratch / tag / "run.log", first_only)
    if first_only:
        return {"size": size, "gpus": gpus, "rows": 0, "keys": 0, **run, "resume_s": []}
    rows, keys = stored_counts(sweep_dir / "trials.sqlite")
    resumes = []
    for i in range(reruns):
        resumes.append(run_sweep(args, sweep_dir, env, scratch / tag / f"rerun{i}.log"))
        again = stored_counts(sweep_dir / "trials.sqlite")
        if again != (size, size):
            raise SystemExit(f"{tag}: after re-run {i + 1} the store holds {again[0]} rows of "
                             f"{again[1]} trials, not {size} of {size}")
    return {"size": size, "gpus": gpus, "rows": rows, "keys": keys, **run,
            "resume_s": [r["wall_s"] for r in resumes]}


def bench_wide(
    gpus: int, per_gpu: int, off_cpu_s: float, scratch: Path, queue_ahead: bool = True
) -> dict:
    """A grid of ``gpus x per_gpu`` jobs that wait off-CPU, on ``gpus`` simulated GPUs."""
    tag = f"wide{gpus}"
    sweep_dir, state = scratch / tag / "sweep", scratch / tag / "sim"
    sweep_dir.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, DVFS_SIM_STATE_DIR=str(state))
    size = per_gpu  # placement=every: each job on every GPU, per_gpu trials on each
    args = [*COMMON, f"device.count={gpus}", *grid(size),
            f"device.inject={{hang_s:{off_cpu_s},times:null}}",
            "hydra.launcher.placement=every", "hydra.launcher.start_timeout_s=900",
            f"hydra.launcher.queue_ahead={str(queue_ahead).lower()}"]
    run = run_sweep(args, sweep_dir, env, scratch / tag / "run.log")
    with ResultStore(sweep_dir, readonly=True) as store:
        lanes = trial_spans(store.rows())  # one lane per worker, its trials' spans on its clock
    # Steady state: once every worker has begun its first trial (before that, the others' boots
    # and framework imports share the two cores with every trial).
    all_up = max(min(start for start, _ in lane) for lane in lanes.values())
    steady = {pid: [t for t in lane if t[0] >= all_up] for pid, lane in lanes.items()}
    res = figures({"way": tag, "gpus": gpus, "trials": size * gpus, "wall_s": run["wall_s"],
                   "lanes": {p: lane for p, lane in steady.items() if lane}, "statuses": {}})
    return {**run, **res, "size": size * gpus, "workers": len(lanes),
            "steady_trials": sum(len(lane) for lane in steady.values())}


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.2f} ms"


def main(argv: list[str] | None = None) -> int:
    """Run the grids asked for and print one table, then the wide grid's overhead."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="30,500,2500,10000")
    p.add_argument("--gpus", default="4,16")
    p.add_argument("--reruns", type=int, default=1, help="no-op re-runs of each finished grid")
    p.add_argument("--wide", type=int, default=64, help="GPUs of the off-CPU grid")
    p.add_argument("--wide-per-gpu", type=int, default=12, help="jobs per GPU of that grid")
    p.add_argument("--off-cpu-s", type=float, default=8.0, help="off-CPU wait per wide trial")
    p.add_argument("--no-wide", action="store_true")
    p.add_argument("--wide-only", action="store_true", help="only the wide grid")
    p.add_argument("--no-queue-ahead", action="store_true",
                   help="the wide grid with hydra.launcher.queue_ahead=false")
    p.add_argument("--first-only", action="store_true",
                   help="stop each sweep at its first stored trial (time to first trial alone)")
    ns = p.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="dvfs-bench-scale-"))
    os.environ.setdefault("RAY_TMPDIR", str(scratch / "ray"))
    print(f"{os.cpu_count()} CPU cores; scratch {scratch}; common: {' '.join(COMMON)}")
    print(f"{'GPUs':>4} {'jobs':>6} {'first_s':>8} {'wall_s':>8} {'cpu/job':>10} "
          f"{'peak_rss':>9} {'resume_s':>9}  stored once")
    for gpus in () if ns.wide_only else (int(g) for g in ns.gpus.split(",")):
        for size in (int(s) for s in ns.sizes.split(",")):
            r = bench_grid(size, gpus, ns.reruns, scratch, ns.first_only)
            first = "-" if r["first_s"] is None else f"{r['first_s']:.1f}"
            resume = " ".join(f"{s:.1f}" for s in r["resume_s"]) or "-"
            once = "yes" if (r["rows"], r["keys"]) == (size, size) else f"{r['rows']} rows"
            once = "-" if ns.first_only else once
            print(f"{gpus:>4} {size:>6} {first:>8} {r['wall_s']:>8.1f} "
                  f"{_ms(r['cpu_s'] / size):>10} {r['maxrss_mb']:>6.0f} MB {resume:>9}  {once}",
                  flush=True)
    if not ns.no_wide and not ns.first_only:
        w = bench_wide(ns.wide, ns.wide_per_gpu, ns.off_cpu_s, scratch, not ns.no_queue_ahead)
        print(f"{ns.wide} GPUs ({w['workers']} workers, queue_ahead="
              f"{str(not ns.no_queue_ahead).lower()}), {w['size']} jobs waiting "
              f"{ns.off_cpu_s:g} s off-CPU: wall {w['wall_s']:.1f} s; once all were up "
              f"({w['steady_trials']} trials): steady overhead {w['steady_ms']:.1f} ms per trial "
              f"(median {w['steady_median_ms']:.1f} ms, p90 {w['steady_p90_ms']:.1f} ms), "
              f"driver CPU {_ms(w['cpu_s'] / w['size'])}/job, peak RSS {w['maxrss_mb']:.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
