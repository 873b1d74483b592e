"""``scripts/sim_vs_published.py`` as a user runs it: every published anchor beside the sim."""

from __future__ import annotations

import subprocess
import sys

from support import REPO


def run_script(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "scripts" / "sim_vs_published.py"), *args],
                          capture_output=True, text=True, timeout=120, cwd=cwd)


def test_the_table_has_a_row_per_anchor_each_inside_its_range(tmp_path):
    from orchestrator.devices.sim.calibration import ANCHORS
    from orchestrator.devices.sim.held_out import HELD_OUT

    n, held = len(ANCHORS), len(HELD_OUT)
    proc = run_script("--markdown", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    fitted, held_out = proc.stdout.split("Held out:")
    table = [line for line in fitted.splitlines() if line.startswith("| ")]
    assert table[0].startswith("| source | board | sim profile | kernel |")
    assert len(table) == 1 + n
    assert all(line.endswith("| ok |") for line in table[1:])
    assert f"{n} of {n} anchors inside their accepted range" in proc.stdout
    rows = [line for line in held_out.splitlines() if line.startswith("| ")][1:]
    assert len(rows) == held
    assert all(line.endswith(("| ok |", "| OUT (known miss) |")) for line in rows)


def test_the_terminal_table_says_ok_on_each_anchors_line(tmp_path):
    proc = run_script(cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    fitted = proc.stdout.split("Held out:")[0].splitlines()
    header = next(i for i, line in enumerate(fitted) if line.split()[:2] == ["source", "board"])
    verdicts = [line.rsplit(None, 1)[-1] for line in fitted[header + 1:] if line.strip()][:-1]
    assert verdicts and set(verdicts) == {"ok"}
