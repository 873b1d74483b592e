"""Every script is run by a test at its smallest size, so none can rot unseen.

A script counts as run when a test of ``tests/scripts/`` names its file (and so runs it as a
subprocess); ``scripts/test``, the test command itself, is the one left out: it runs this suite.
"""

from __future__ import annotations

from pathlib import Path

from support import REPO

NOT_RUN = {"scripts/test": "the test command itself: it runs these tests"}


def test_every_script_is_named_by_a_test_of_tests_scripts():
    here = Path(__file__).resolve()
    tests = "\n".join(p.read_text(encoding="utf-8")
                      for p in sorted((REPO / "tests" / "scripts").glob("test_*.py")) if p != here)
    scripts = sorted(str(p.relative_to(REPO)) for p in (REPO / "scripts").rglob("*")
                     if p.is_file() and "__pycache__" not in p.parts)
    assert scripts  # the folder is there
    unrun = [s for s in scripts if s not in NOT_RUN and f'"{Path(s).name}"' not in tests]
    assert unrun == []
