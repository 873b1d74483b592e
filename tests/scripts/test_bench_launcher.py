"""``scripts/bench_launcher.py --quick``: the launcher's figures read from the rows the sweeps
stored, on a 4-trial grid, each way in its own ``dvfs sweep -m`` (``ray_gpus`` starts a local Ray
instance of its own there, as every subprocess sweep of the tests does).

The CPU-bound grid alone: it runs all three ways, and so both sources of a trial's span (the
worker's ``launch`` times and the basic launcher's phases); the device-bound grid adds only
``device.inject``'s sleep, at the cost of two more Ray starts.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
from support import REPO

pytestmark = pytest.mark.slow


def test_each_way_is_timed_from_its_stored_rows_and_the_speed_up_is_said(tmp_path):
    out = tmp_path / "ways.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "bench_launcher.py"), "--quick", "--grids",
         "cpu", "--json", str(out)],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    ways = json.loads(out.read_text())
    assert [(w["grid"], w["way"], w["gpus"]) for w in ways] == [
        ("cpu-bound", "ray_gpus x2", 2), ("cpu-bound", "ray_gpus x1", 1),
        ("cpu-bound", "basic", 1)]
    for w in ways:
        assert w["trials"] == 4 and w["statuses"] == {"ok": 4}, w
        spans = [s for lane in w["lanes"].values() for s in lane]
        assert len(spans) == 4 and all(end > start for start, end in spans), w["lanes"]
        assert 0 < w["inside_s"] <= w["span_s"] * w["gpus"] < w["wall_s"] * w["gpus"], w
        assert math.isfinite(w["steady_ms"]) and w["steady_ms"] >= 0, w  # trials one at a time
    lines = proc.stdout.splitlines()
    assert lines[2].split()[:3] == ["grid", "way", "GPUs"] and "steady overhead" in lines[2]
    for w in ways:
        (line,) = [ln for ln in lines if ln.startswith(f"{w['grid']:<13} {w['way']:<12}")]
        assert f" {w['wall_s']:.1f} " in line and line.endswith('{"ok": 4}')
    (speed_up,) = [ln for ln in lines if "speed-up of 2 GPUs over 1" in ln]
    assert "x wall" in speed_up and "nan" not in speed_up

