"""Chaos run: a sweep on simulated GPUs under faults, each at a random moment; then the ledger.

    .venv/bin/python scripts/chaos.py --faults 100          # the full run: 4 GPUs, 11 of each kind
    .venv/bin/python scripts/chaos.py --faults 10 --gpus 2  # the suite's short form: each kind once
    .venv/bin/python scripts/chaos.py --kinds gpu_lost --faults 1 --json out.json

The run, its faults and its ledger are ``orchestrator.testing.chaos`` (its docstring says what
each fault kind does and which targets it checks); this is its command line. Exit status 0 when
every target holds, 1 when one does not.
"""

from __future__ import annotations

import sys

from orchestrator.testing.chaos import main

if __name__ == "__main__":
    sys.exit(main())
