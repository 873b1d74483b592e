"""Benchmark the ray_gpus launcher against itself on one GPU and against Hydra's basic launcher.

The same 48-trial grid on the simulated GPU (3 workloads x 2 frameworks x 8 SM clocks, tiny
kernels, ``measure=quick``), each way in a fresh ``dvfs sweep -m`` process, one after the other:

- ``ray_gpus x4``: this launcher, 4 simulated GPUs (a local Ray instance with 4 logical GPUs);
- ``ray_gpus x1``: this launcher, 1 simulated GPU;
- ``basic``: Hydra's basic launcher (in-process, one job after another, one GPU).

and, by default, twice: once as it is (``cpu-bound``: on the sim the kernels really run on this
machine's CPU, so four workers share its cores), and once with ``--off-cpu-s`` of waiting added
to every trial (``device-bound``: what a real GPU kernel looks like to the host, whose CPU is idle
while the GPU works; made with the sim's fault-injection sleep).

Figures, per way:

- ``wall_s``: the command, from process start to exit (Python, Hydra, Ray, workers, trials);
- ``span_s``: first trial start to last trial end;
- ``inside_s``: time inside trials (``run_trial`` on the worker: settings, warm-up, windows,
  checks, restore), summed;
- ``overhead/trial``: (wall x GPUs - inside) / trials: everything that is not a trial, per trial;
- ``steady overhead``: the mean idle gap of a GPU between one trial's end and the next one's
  start, after the first trial on each worker (dispatch, result, store write, progress).

Run: ``.venv/bin/python scripts/bench_launcher.py`` (about 7 minutes on 2 cores).
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

REPO = Path(__file__).resolve().parents[1]
GRID = [
    "workload=gemm,stencil,selu",
    "framework=jax,tensorflow",
    "device.sm_clock_mhz=510,630,750,870,990,1110,1230,1350",
]
COMMON = ["device=sim", "workload.size=tiny", "measure=quick", "quiet=true"]
WAYS = {
    "ray_gpus x4": (
        4,
        ["hydra/launcher=ray_gpus", "device.count=4", "hydra.launcher.progress=false"],
    ),
    "ray_gpus x1": (
        1,
        ["hydra/launcher=ray_gpus", "device.count=1", "hydra.launcher.progress=false"],
    ),
    "basic": (1, ["hydra/launcher=basic", "device.count=1"]),
}

# Hydra's basic launcher runs trials in its own process: time run_trial there, as the workers do.
_TIMED_CLI = """
import json, sys, time
import orchestrator.measuring.trial as trial
from orchestrator.measuring import inject
spans = []
_run_trial = trial.run_trial
def timed(ctx, cfg, resolved):
    # device.inject is armed by ray_gpus workers only: arm it here too, so both ways wait alike.
    spec = resolved["device"].get("inject")
    inject.arm(spec, ctx.device, sweep_id=ctx.sweep_id, workload=cfg.workload.name)
    t0, p0 = time.time(), time.perf_counter()
    try:
        return _run_trial(ctx, cfg, resolved)
    finally:
        spans.append((t0, t0 + time.perf_counter() - p0))
trial.run_trial = timed
from orchestrator.cli import main
rc = main(sys.argv[2:])
with open(sys.argv[1], "w") as f:
    json.dump(spans, f)
sys.exit(rc)
"""


def run_way(name: str, extra: list[str], scratch: Path) -> dict:
    """Run one way in a fresh process; returns its rows' trial spans and the wall time."""
    gpus, args = WAYS[name]
    tag = name.replace(" ", "_") + (
        "_" + extra[0].split("=")[0].rsplit(".", 1)[-1] if extra else ""
    )
    sweep_dir, state = scratch / tag / "sweep", scratch / tag / "sim"
    env = dict(os.environ, DVFS_SIM_STATE_DIR=str(state))
    cmd_args = ["sweep", "-m", *COMMON, *args, *GRID, *extra, f"hydra.sweep.dir={sweep_dir}"]
    spans_file = scratch / tag / "spans.json"
    spans_file.parent.mkdir(parents=True, exist_ok=True)
    if name == "basic":
        cmd = [sys.executable, "-c", _TIMED_CLI, str(spans_file), *cmd_args]
    else:
        cmd = [sys.executable, "-m", "orchestrator.cli", *cmd_args]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    wall_s = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    rows = _rows(sweep_dir)
    if name == "basic":
        lanes = {"main": [tuple(s) for s in json.loads(spans_file.read_text())]}
    else:
        lanes = {}
        for r in rows:
            launch = r["launch"]
            lanes.setdefault(launch["worker_pid"], []).append(
                (launch["trial_started_at"], launch["trial_ended_at"])
            )
    statuses: dict[str, int] = {}
    for r in rows:
        statuses[r["status"]] = statuses.get(r["status"], 0) + 1
    return {
        "way": name,
        "gpus": gpus,
        "trials": len(rows),
        "wall_s": wall_s,
        "lanes": lanes,
        "statuses": statuses,
    }


def _rows(sweep_dir: Path) -> list[dict]:
    sys.path.insert(0, str(REPO))
    from orchestrator.results.store import ResultStore

    with ResultStore(sweep_dir, readonly=True) as store:
        return store.rows()


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


def main(argv: list[str] | None = None) -> int:
    """Run every way on each grid asked for and print its figures, then the 4-GPU speed-up."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--grids", choices=("cpu", "device", "both"), default="both")
    parser.add_argument(
        "--off-cpu-s", type=float, default=1.0, help="device-bound grid: off-CPU wait per trial"
    )
    ns = parser.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="dvfs-bench-launcher-"))
    os.environ.setdefault("RAY_TMPDIR", str(scratch / "ray"))
    grids = {"cpu-bound": []} if ns.grids == "cpu" else {}
    if ns.grids in ("device", "both"):
        grids["device-bound"] = [f"device.inject={{hang_s:{ns.off_cpu_s},times:null}}"]
    if ns.grids == "both":
        grids = {"cpu-bound": [], **grids}
    print(f"48-trial grid: {' '.join(GRID)} ({' '.join(COMMON)})")
    print(f"{os.cpu_count()} CPU cores; scratch {scratch}")
    print(
        _row(
            "grid",
            "way",
            "GPUs",
            "trials",
            "wall_s",
            "span_s",
            "inside_s",
            "overhead/trial",
            "steady overhead",
            "p90",
            "statuses",
        )
    )
    for grid, extra in grids.items():
        results = {}
        for way in WAYS:
            f = results[way] = figures(run_way(way, extra, scratch))
            print(
                _row(
                    grid,
                    way,
                    f["gpus"],
                    f["trials"],
                    f"{f['wall_s']:.1f}",
                    f"{f['span_s']:.1f}",
                    f"{f['inside_s']:.1f}",
                    f"{f['overhead_ms']:.0f} ms",
                    f"{f['steady_ms']:.1f} ms",
                    f"{f['steady_p90_ms']:.0f} ms",
                    json.dumps(f["statuses"]),
                ),
                flush=True,
            )
        four, one = results["ray_gpus x4"], results["ray_gpus x1"]
        print(
            f"{grid:<13} speed-up of 4 GPUs over 1: {one['wall_s'] / four['wall_s']:.2f}x wall, "
            f"{one['span_s'] / four['span_s']:.2f}x from first trial to last",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
