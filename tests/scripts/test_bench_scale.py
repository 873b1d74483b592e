"""``scripts/bench_scale.py`` at its smallest size: a 4-job grid on 2 simulated GPUs, its no-op
resume, and the off-CPU grid on 2 GPUs; each ``dvfs sweep -m`` starts a local Ray instance of its
own, as every subprocess sweep of the tests does."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from support import REPO

pytestmark = pytest.mark.slow


def test_a_grid_its_no_op_resume_and_the_off_cpu_grid_are_each_measured(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "bench_scale.py"), "--sizes", "4", "--gpus", "2",
         "--reruns", "1", "--wide", "2", "--wide-per-gpu", "2", "--off-cpu-s", "0.3"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[1].split() == ["GPUs", "jobs", "first_s", "wall_s", "cpu/job", "peak_rss",
                                "resume_s", "stored", "once"]
    cells = lines[2].split()
    assert cells[:2] == ["2", "4"] and cells[-1] == "yes", lines[2]  # each job stored once
    first_s, wall_s, resume_s = float(cells[2]), float(cells[3]), float(cells[8])
    assert 0 < first_s < wall_s and 0 < resume_s
    assert float(cells[4]) > 0 and cells[5] == "ms"  # the driver's CPU per job
    wide = lines[3]
    assert wide.startswith("2 GPUs (2 workers, queue_ahead=true), 4 jobs waiting 0.3 s off-CPU")
    steady = re.search(r"steady overhead ([0-9.]+) ms per trial", wide)
    assert steady and float(steady.group(1)) >= 0, wide
