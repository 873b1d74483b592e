"""The chaos runner, used by the tests and by ``scripts/chaos.py``.

``chaos`` runs a sweep on simulated GPUs under faults injected at random moments and keeps the
ledger of what they left (nothing lost, nothing stored twice, no GPU left changed);
``chaos_watch`` finds a sweep's processes and reads what each sweep must hold. The tests import
both (``tests/scripts/test_chaos.py`` runs the short form; the launcher's tests find a sweep's
processes with ``chaos_watch``); the script is their command line. Nothing of the package imports
this wing: it drives ``dvfs`` from outside, as an operator would, on the simulated GPU only.
"""
