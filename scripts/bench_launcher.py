"""Benchmark the ray_gpus launcher against itself on one GPU and against Hydra's basic launcher.

The same 48-trial grid on the simulated GPU (3 workloads x 2 frameworks x 8 SM clocks, tiny
kernels, ``measure=quick``), each way in a fresh ``dvfs sweep -m`` process, one after the other:

- ``ray_gpus x4``: this launcher, 4 simulated GPUs (``--gpus``; a local Ray instance with as
  many logical GPUs);
- ``ray_gpus x1``: this launcher, 1 simulated GPU;
- ``basic``: Hydra's basic launcher (in-process, one job after another, one GPU).

and, by default, twice: once as it is (``cpu-bound``: on the sim the kernels really run on this
machine's CPU, so four workers share its cores), and once with ``--off-cpu-s`` of waiting added
to every trial (``device-bound``: what a real GPU kernel looks like to the host, whose CPU is idle
while the GPU works; made with the sim's fault-injection sleep).

Figures, per way:

- ``wall_s``: the command, from process start to exit (Python, Hydra, Ray, workers, trials);
- ``span_s``: first trial start to last trial end;
- ``inside_s``: time inside trials (settings, build, warm-up, windows, checks, restore), summed;
- ``overhead/trial``: (wall x GPUs - inside) / trials: everything that is not a trial, per trial;
- ``steady overhead``: the mean idle gap of a GPU between one trial's end and the next one's
  start, after the first trial on each worker (dispatch, result, store write, progress).

Every figure is read from what the sweep stored, nothing of the package is replaced: a
``ray_gpus`` row carries its trial's span on the worker's clock (``launch.trial_started_at`` and
``trial_ended_at``, around ``run_trial``, one lane per worker process); a row of Hydra's basic
launcher has no ``launch``, and its trial's span is rebuilt from its phases
(``orchestrator/measuring/phases.py``): it began its first row's build, settings, thermal start,
warm-up and reference (``phase_<name>_s``) before that row's window started (``started_at``),
and lasted the sum of its rows' phases (each row's ``wall_s``). That leaves out the few
milliseconds of ``run_trial`` outside its phases (the health check, the row's base), which count
as overhead.

``device.inject`` is armed by the ``ray_gpus`` workers only (``orchestrator/measuring/inject.py``):
Hydra's basic launcher runs its trials in the driver, where nothing arms it, so the device-bound
grid has no ``basic`` row (said in the table) rather than one that did not wait.

Run: ``.venv/bin/python scripts/bench_launcher.py`` (about 7 minutes on 2 cores);
``--quick`` runs the smallest grid (4 stable clocks of selu in JAX, short windows, 2 GPUs for
``ray_gpus xN``), as its test does.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from orchestrator.results.store import ResultStore

GRID = [
    "workload=gemm,stencil,selu",
    "framework=jax,tensorflow",
    "device.sm_clock_mhz=510,630,750,870,990,1110,1230,1350",
]
# --quick: the smallest grid that still has a gap between trials on each GPU of ``ray_gpus x2``;
# clocks above the A100 profile's seeded stability band (every trial ok), the shortest windows.
QUICK_GRID = [
    "workload=selu",
    "framework=jax",
    "device.sm_clock_mhz=1110,1230,1350,1410",
]
QUICK_MEASURE = [
    "measure.window_s=0.05", "measure.min_iters=1", "measure.warmup_iters=0",
    "measure.reference_samples=1", "measure.min_counter_updates=1", "measure.check_iters=1",
    "device.energy_update_period_s=0.01",
]
COMMON = ["device=sim", "workload.size=tiny", "measure=quick", "quiet=true"]
PRE_WINDOW = ("build", "settings", "steady", "warmup", "compare")
"""The phases a trial runs before its first window (``phase_<name>_s`` of its first row)."""


def ways(gpus: int) -> dict[str, tuple[int, list[str]]]:
    """The three ways: ``ray_gpus`` on ``gpus`` GPUs and on 1, and Hydra's basic launcher."""
    def ray(n: int) -> list[str]:
        return ["hydra/launcher=ray_gpus", f"device.count={n}", "hydra.launcher.progress=false"]

    return {
        f"ray_gpus x{gpus}": (gpus, ray(gpus)),
        "ray_gpus x1": (1, ray(1)),
        "basic": (1, ["hydra/launcher=basic", "device.count=1"]),
    }


def run_way(name: str, way: tuple[int, list[str]], grid: list[str], scratch: Path) -> dict:
    """Run one way in a fresh ``dvfs sweep -m`` process (its sweep and its simulated machine
    under ``scratch``); its wall time, its rows' statuses and trial spans.

    Raises:
        SystemExit: the sweep failed (its stderr's end is said).
    """
    gpus, args = way
    sweep_dir, state = scratch / "sweep", scratch / "sim"
    env = dict(os.environ, DVFS_SIM_STATE_DIR=str(state))
    cmd = [sys.executable, "-m", "orchestrator.cli", "sweep", "-m", *COMMON, *args, *grid,
           f"hydra.sweep.dir={sweep_dir}"]
    t0 = time.monotonic()
    scratch.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(cmd, cwd=scratch, env=env, capture_output=True, text=True)
    wall_s = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    with ResultStore(sweep_dir, readonly=True) as store:
        rows = store.rows()
    statuses: dict[str, int] = {}
    for r in rows:
        statuses[r["status"]] = statuses.get(r["status"], 0) + 1
    return {"way": name, "gpus": gpus, "trials": len({_trial_of(r) for r in rows}),
            "wall_s": wall_s, "lanes": trial_spans(rows), "statuses": statuses}


def _trial_of(row: dict[str, Any]) -> tuple[str, str, int]:
    return row["device_uuid"], row["trial_key"], int(row.get("attempt") or 1)


def trial_spans(rows: list[dict[str, Any]]) -> dict[Any, list[tuple[float, float]]]:
    """Each lane's trials as (start, end) in Unix seconds, from the rows a sweep stored.

    A ``ray_gpus`` row's ``launch`` holds its trial's span on the worker (one lane per worker
    process); a row without it (Hydra's basic launcher: one lane per GPU) gets its trial's span
    from its phases: the pre-window phases of the trial's first row before that row's
    ``started_at``, and the sum of the trial's rows' ``wall_s`` in all.

    Args:
        rows: a sweep's rows (``ResultStore.rows()``), every repeat of each trial.
    """
    trials: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for r in rows:
        trials.setdefault(_trial_of(r), []).append(r)
    lanes: dict[Any, list[tuple[float, float]]] = {}
    for (uuid, _, _), trial in trials.items():
        first = min(trial, key=lambda r: r["repeat"])
        launch = first.get("launch") or {}
        if launch.get("trial_started_at") is not None:
            span = (launch["trial_started_at"], launch["trial_ended_at"])
            lane = launch["worker_pid"]
        else:
            start = first["started_at"] - sum(first.get(f"phase_{p}_s") or 0.0
                                              for p in PRE_WINDOW)
            span, lane = (start, start + sum(r.get("wall_s") or 0.0 for r in trial)), uuid
        lanes.setdefault(lane, []).append(span)
    return lanes


def figures(res: dict) -> dict:
    """wall, span, inside, overhead per trial (all and steady) from one way's trial spans."""
    spans = [s for lane in res["lanes"].values() for s in lane]
    inside_s = sum(end - start for start, end in spans)
    gaps = []
    for lane in res["lanes"].values():
        lane = sorted(lane)
        gaps += [b[0] - a[1] for a, b in zip(lane, lane[1:])]  # after each worker's first trial
    return {
        **res,
        "span_s": max(e for _, e in spans) - min(s for s, _ in spans),
        "inside_s": inside_s,
        "overhead_ms": (res["wall_s"] * res["gpus"] - inside_s) / res["trials"] * 1000,
        "steady_ms": statistics.mean(gaps) * 1000 if gaps else float("nan"),
        "steady_median_ms": statistics.median(gaps) * 1000 if gaps else float("nan"),
        "steady_p90_ms": statistics.quantiles(gaps, n=10)[-1] * 1000
        if len(gaps) >= 10
        else float("nan"),
    }


def _row(*cells: object) -> str:
    widths = (13, 12, 4, 6, 7, 7, 8, 14, 15, 6)
    head = [
        f"{c!s:<{w}}" if i < 2 else f"{c!s:>{w}}" for i, (c, w) in enumerate(zip(cells, widths))
    ]
    return " ".join(head) + "  " + str(cells[-1])


HEADER = ("grid", "way", "GPUs", "trials", "wall_s", "span_s", "inside_s", "overhead/trial",
          "steady overhead", "p90", "statuses")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--grids", choices=("cpu", "device", "both"), default="both")
    parser.add_argument(
        "--off-cpu-s", type=float, default=1.0, help="device-bound grid: off-CPU wait per trial"
    )
    parser.add_argument("--gpus", type=int, help="GPUs of the many-GPU way (default 4, --quick 2)")
    parser.add_argument("--quick", action="store_true",
                        help="the smallest grid: 4 trials of selu in JAX, short windows")
    parser.add_argument("--json", type=Path, help="also write each way's figures here")
    ns = parser.parse_args(argv)
    if ns.gpus is not None and ns.gpus < 2:
        parser.error("--gpus must be 2 or more (ray_gpus x1 is a way of its own)")
    return ns


def print_way(grid: str, f: dict) -> None:
    """One way's line of the table."""
    print(_row(grid, f["way"], f["gpus"], f["trials"], f"{f['wall_s']:.1f}", f"{f['span_s']:.1f}",
               f"{f['inside_s']:.1f}", f"{f['overhead_ms']:.0f} ms", f"{f['steady_ms']:.1f} ms",
               f"{f['steady_p90_ms']:.0f} ms", json.dumps(f["statuses"])), flush=True)


def main(argv: list[str] | None = None) -> int:
    """Run every way on each grid asked for and print its figures, then the many-GPU speed-up."""
    ns = parse_args(argv)
    grid = [*QUICK_GRID, *QUICK_MEASURE] if ns.quick else GRID
    all_ways = ways(ns.gpus or (2 if ns.quick else 4))
    scratch = Path(tempfile.mkdtemp(prefix="dvfs-bench-launcher-"))
    os.environ.setdefault("RAY_TMPDIR", str(scratch / "ray"))
    grids = {"cpu-bound": []} if ns.grids in ("cpu", "both") else {}
    if ns.grids in ("device", "both"):
        grids["device-bound"] = [f"device.inject={{hang_s:{ns.off_cpu_s},times:null}}"]
    print(f"grid: {' '.join(grid)} ({' '.join(COMMON)})")
    print(f"{os.cpu_count()} CPU cores; scratch {scratch}")
    print(_row(*HEADER))
    written = []
    for name, extra in grids.items():
        results = {}
        for way, spec in all_ways.items():
            if extra and way == "basic":  # device.inject: armed by ray_gpus workers only
                print(_row(name, way, 1, "-", "-", "-", "-", "-", "-", "-",
                           "not run: nothing arms device.inject in the basic launcher's trials"))
                continue
            where = scratch / name / way.replace(" ", "_")
            results[way] = figures(run_way(way, spec, [*grid, *extra], where))
            print_way(name, results[way])
            written.append({"grid": name, **results[way]})
        many, one = results[next(iter(all_ways))], results["ray_gpus x1"]
        print(
            f"{name:<13} speed-up of {many['gpus']} GPUs over 1: "
            f"{one['wall_s'] / many['wall_s']:.2f}x wall, "
            f"{one['span_s'] / many['span_s']:.2f}x from first trial to last",
            flush=True,
        )
    if ns.json:
        ns.json.write_text(json.dumps(written, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
