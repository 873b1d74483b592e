"""``scripts/fuzz_cli.py`` in its short form: 60 odd inputs through ``dvfs sweep``, as typed.

The targets are read from what the run left, not only from the script's verdicts: each simulated
GPU's state and the journal are read here.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support import REPO

INPUTS = 60
SEED = 1


@pytest.fixture(scope="module")
def fuzz(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz")
    out = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "fuzz_cli.py"), "--inputs", str(INPUTS), "--seed",
         str(SEED), "--dir", str(root / "work"), "--json", str(root / "fuzz.json")],
        capture_output=True, text=True, timeout=1200,
    )
    assert (root / "fuzz.json").exists(), out.stdout[-3000:] + out.stderr[-3000:]
    result = json.loads((root / "fuzz.json").read_text())
    result["stdout"], result["returncode"], result["root"] = out.stdout, out.returncode, root
    return result


@pytest.mark.slow
def test_every_input_is_refused_in_one_line_or_accepted_and_run_within_its_bound(fuzz):
    v = fuzz["verdicts"]
    assert fuzz["returncode"] == 0 and not fuzz["bad"], fuzz["stdout"]
    assert v.get("refused", 0) + v.get("accepted", 0) == INPUTS
    assert v.get("refused", 0) >= INPUTS // 2 and v.get("accepted", 0) >= 1  # both paths taken
    assert "tracebacks 0 | hangs 0 | runs past their bound 0 | GPUs left changed 0" in (
        fuzz["stdout"])


def test_no_simulated_gpu_is_left_changed_and_no_journal_entry_is_left(fuzz):
    from orchestrator.devices.sim.state import Machine

    machines = [p.parent for p in (fuzz["root"] / "work").rglob("machine.json")]
    assert machines  # the accepted inputs ran on simulated GPUs
    for state in machines:
        assert Machine(state).changed() == [], state
    assert not [p for p in (fuzz["root"] / "work").rglob("journal/*.json")]


def test_a_traceback_a_second_line_and_a_hang_are_each_counted_as_failures():
    from orchestrator.testing.fuzz_cli import verdict

    assert verdict([], {"rc": 2, "s": 1.0, "stderr": "dvfs sweep: error: x=1 must be ...\n"}) == (
        "refused")
    assert verdict([], {"rc": 1, "s": 1.0, "stderr": "Traceback (most recent call last):\n"}) == (
        "traceback")
    assert verdict([], {"rc": 2, "s": 1.0, "stderr": "dvfs sweep: error: a\nmore\n"}) == (
        "traceback")
    assert verdict([], {"rc": None, "s": 240.0, "stderr": "", "hang": True}) == "hang"
