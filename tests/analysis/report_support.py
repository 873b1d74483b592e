"""What the report tests share: a real sweep on the simulated GPU, PNG sizes, the CLI."""

from __future__ import annotations

import os
import struct
import subprocess
import time
from pathlib import Path

from support import DVFS

SWEEP_WORKLOADS = ("gemm", "stencil")
SWEEP_FRAMEWORKS = ("jax", "tensorflow")
SWEEP_CLOCKS = "null,510,660,810,960,1110,1260,1410"  # the quickstart's: the default and 7 clocks
SWEEP_TRIALS = len(SWEEP_WORKLOADS) * len(SWEEP_FRAMEWORKS) * len(SWEEP_CLOCKS.split(","))
REPORT_SIZE = (1200, 750)
MID_SIZE = (640, 400)


def png_size(path: Path) -> tuple[int, int]:
    """The (width, height) of a PNG file, from its header."""
    data = Path(path).read_bytes()[:24]
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


def dvfs_cli(*args: str, cwd: Path, env: dict | None = None, timeout: float = 120.0):
    """Runs ``dvfs ARGS...`` as a user does (a subprocess), capturing its output."""
    return subprocess.run([*DVFS, *args], cwd=cwd, env=env or dict(os.environ),
                          capture_output=True, text=True, timeout=timeout)


def _stored(sweep: Path) -> int:
    from orchestrator.results.store import ResultStore

    if not (sweep / "trials.sqlite").exists():
        return 0
    with ResultStore(sweep, readonly=True) as store:
        return len(store)


def run_sim_sweep(root: Path) -> dict:
    """One real ``dvfs sweep -m`` on the simulated A100, with ``dvfs report`` run twice on it.

    The quickstart's grid (2 workloads x 2 frameworks x the default and 7 SM clocks), tiny size,
    quick measurement (0.5 s windows) with no settle time, Hydra's basic launcher. While the
    sweep runs, once at least 4 trials are stored, ``dvfs report`` reads it (into ``mid``); when
    it has finished, ``dvfs report --size 1200x750`` writes the report most tests read (``out``).

    Returns:
        ``root``, ``sweep`` (its directory), ``out`` (the report), ``mid`` (the report of the
        running sweep), ``mid_run`` and ``final_run`` (each report's CompletedProcess),
        ``mid_rows_before`` (trials stored when the mid-sweep report started),
        ``mid_sweep_still_running`` (the sweep had not finished when that report returned).
    """
    env = dict(os.environ, DVFS_SIM_STATE_DIR=str(root / "sim"), PYTHONUNBUFFERED="1")
    sweep = root / "sweep"
    args = [
        "sweep", "-m", "hydra/launcher=basic",
        f"workload={','.join(SWEEP_WORKLOADS)}", f"framework={','.join(SWEEP_FRAMEWORKS)}",
        "workload.size=tiny", "measure=quick", "measure.settle_s=0",
        f"device.sm_clock_mhz={SWEEP_CLOCKS}", f"hydra.sweep.dir={sweep}",
    ]
    with open(root / "sweep.out", "w") as out, open(root / "sweep.err", "w") as err:
        proc = subprocess.Popen([*DVFS, *args], cwd=root, env=env, stdout=out, stderr=err)
        try:
            stored, deadline = 0, time.monotonic() + 240
            while stored < 4 and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
                stored = _stored(sweep)
            mid_run = dvfs_cli("report", str(sweep), "--out", str(root / "mid"),
                               "--size", "x".join(map(str, MID_SIZE)), cwd=root, env=env)
            still_running = proc.poll() is None
            rc = proc.wait(timeout=300)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    stderr = (root / "sweep.err").read_text()
    assert rc == 0, f"dvfs sweep failed ({rc}):\n{stderr[-3000:]}"
    final_run = dvfs_cli("report", str(sweep), "--out", str(root / "out"),
                         "--size", "x".join(map(str, REPORT_SIZE)), cwd=root, env=env)
    return {
        "root": root, "sweep": sweep, "out": root / "out", "mid": root / "mid",
        "mid_run": mid_run, "final_run": final_run, "mid_rows_before": stored,
        "mid_sweep_still_running": still_running,
    }
