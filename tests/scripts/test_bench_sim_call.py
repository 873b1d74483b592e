"""``scripts/bench_sim_call.py`` at its smallest size: each simulated NVML call timed, a line
each."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

from support import REPO

CALLS = ("simDeviceRecordKernelCall", "simDeviceGetTimeS", "Machine.update (store alone)",
         "Machine.read (store alone)", "nvmlDeviceSetGpuLockedClocks")


def test_every_call_is_timed_once_per_round_and_printed(tmp_path):
    out = tmp_path / "calls.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "bench_sim_call.py"), "--rounds", "1",
         "--calls", "20", "--setter-calls", "4", "--json", str(out)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    figures = json.loads(out.read_text())["figures"]
    assert tuple(figures) == CALLS
    for name, f in figures.items():
        assert f["rounds"] == 1 and math.isfinite(f["median_us"]) and f["median_us"] > 0, name
        line = next(ln for ln in proc.stdout.splitlines() if ln.strip().startswith(name))
        assert line.rstrip().endswith(")") and " us " in line
    assert proc.stdout.startswith("simulated a100_sxm4_40gb, median of 1 rounds")
