"""``scripts/sim_vs_real.py`` as a user runs it: each real-GPU run of ``data/measured/`` beside the
simulated GPU, a row per measured row, every ratio a finite number."""

from __future__ import annotations

import math
import re
import subprocess
import sys

from support import REPO


def test_each_measured_run_has_its_table_with_a_finite_ratio_per_figure(tmp_path):
    from orchestrator.realgpu import measured

    runs = measured.runs()
    assert runs  # data/measured/ holds the real-GPU runs
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "sim_vs_real.py")],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert [ln.split(":")[0] for ln in lines if ln.startswith("## ")] == [
        f"## {run.path.name}" for run in runs]
    heads = [ln for ln in lines if ln.startswith("| workload |")]
    assert len(heads) == len(runs) and "ms/iter sim / real" in heads[0]
    rows = [ln for ln in lines if ln.startswith("| ") and not ln.startswith("| workload |")]
    assert len(rows) == sum(len(run.rows) for run in runs)
    for row in rows:
        ratios = [float(x) for x in re.findall(r"\(([-+0-9.e]+|nan|inf)\)", row)]
        assert len(ratios) == 4 and all(math.isfinite(r) and r > 0 for r in ratios), row
