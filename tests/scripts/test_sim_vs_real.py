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
    # Each run says what its profile was fitted to and what no fit read.
    assert sum(ln.startswith("Fitted to these rows and ") for ln in lines) == len(runs)
    assert sum(ln.startswith("Held out of every fit: ") for ln in lines) == len(runs)


def test_loo_scores_each_row_by_the_fit_of_the_others(capsys, monkeypatch):
    # In process, without the anchors (their decode steps are most of its 20 s): the table and
    # the verdict are the script's; the H200's only convolution cannot be predicted without it.
    import importlib.util

    from orchestrator.devices.sim import calibration

    path = REPO / "scripts" / "sim_vs_real.py"
    spec = importlib.util.spec_from_file_location("sim_vs_real", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    monkeypatch.setattr(calibration, "ANCHORS", ())
    script.main(["--loo"])
    out = capsys.readouterr().out
    assert "Leave one out: each row predicted by the fit of the other rows" in out
    loo = out.split("Leave one out")[1].splitlines()
    assert len([ln for ln in loo if ln.startswith("| ") and "---" not in ln]) == 1 + 6
    verdict = next(ln for ln in loo if ln.startswith("out of sample"))
    assert "conv3d (time -5" in verdict
