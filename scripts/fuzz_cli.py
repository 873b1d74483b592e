"""CLI fuzz: odd overrides typed through ``dvfs sweep``, as a user types them; then the ledger.

    .venv/bin/python scripts/fuzz_cli.py --inputs 1000 --seed 31     # the full run
    .venv/bin/python scripts/fuzz_cli.py --inputs 40 --seed 1         # the short form (a test)

The inputs, the children that run them and the verdicts are ``orchestrator.testing.fuzz_cli``
(its docstring says what an input is and what each target counts); this is its command line.
Exit status 0 when every target is met (no traceback, no hang, no run past its bound, no GPU
left changed), 1 when one is not.
"""

from __future__ import annotations

import sys

from orchestrator.testing.fuzz_cli import main

if __name__ == "__main__":
    sys.exit(main())
