"""The chaos runner (and the CLI fuzzer), used by the tests and by ``scripts/chaos.py``
(``scripts/fuzz_cli.py``).

``chaos`` runs a sweep on simulated GPUs under faults injected at random moments and keeps the
ledger of what they left (nothing lost, nothing stored twice, no GPU left changed);
``chaos_watch`` finds a sweep's processes and reads what each sweep must hold; ``fuzz_cli`` types
odd overrides through ``dvfs sweep`` and judges each answer. The tests import them
(``tests/scripts/test_chaos.py`` and ``test_fuzz_cli.py`` run the short forms; the launcher's
tests find a sweep's processes with ``chaos_watch``); the scripts are their command lines.
Nothing of the package imports this wing: it drives ``dvfs`` from outside, as a user or an
operator would, on the simulated GPU only.
"""
