"""``scripts/bench_pool_start.py`` at its smallest: one GPU, one round, every way's figures."""

from __future__ import annotations

import math
import subprocess
import sys

from support import REPO

WAYS = ("pool", "bare, env as argument", "bare, env as runtime_env")


def test_each_way_starts_its_actors_and_the_runtime_envs_cost_is_said(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "bench_pool_start.py"), "--gpus", "1",
         "--rounds", "1"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("1 actors a round, 1 rounds, local Ray")
    for way in WAYS:
        (line,) = [ln for ln in lines if ln.startswith(way + " ")]
        ready, actor, ray_own, total = (float(x) for x in line[len(way):].split())
        assert 0 < ready < 120 and actor > 0 and ray_own >= 0  # an actor's start costs CPU
        assert math.isclose(total, actor + ray_own, abs_tol=0.015)
    assert lines[-1].startswith("runtime_env / argument: ready ") and "x, CPU " in lines[-1]
