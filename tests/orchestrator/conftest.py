"""Fixtures for the orchestrator's tests: one trial on a fresh simulated A100."""

from __future__ import annotations

import pytest

from kernels import KernelCache
from orchestrator.config import compose
from orchestrator.devices import journal_dir, open_backend
from orchestrator.jobs.job import JobSpec
from orchestrator.measuring.guard import SettingsGuard
from orchestrator.measuring.journal import Journal
from orchestrator.measuring.trial import TrialContext, run_trial

KERNELS = KernelCache()  # one cache for the module: each kernel compiles once, as on a worker


@pytest.fixture
def kernel_cache():
    """The module-wide kernel cache the ``run`` fixture uses (each kernel compiles once)."""
    return KERNELS


@pytest.fixture
def run(tmp_path):
    """run(*overrides, before=None, kernels=None, on_kernel_calls=None, cfg=None) -> (rows, ctx)
    of one trial on a simulated A100 (one machine per test; ``before(device)`` runs first, e.g.
    to idle the GPU into another counter phase; ``kernels`` replaces the module's kernel cache;
    ``on_kernel_calls()`` runs inside the trial, its settings applied, before its first call;
    ``cfg``: a config from ``run.compose(*overrides)``, edited, instead of composing again)."""
    opened = []

    def _compose(*overrides: str):
        return compose(
            [
                "workload.size=tiny",
                "measure=quick",
                f"device.state_dir={tmp_path / 'sim'}",
                *overrides,
            ]
        )

    def _run(*overrides: str, before=None, kernels=None, on_kernel_calls=None, cfg=None):
        while opened:  # one guard per GPU at a time, as in a worker
            backend, guard = opened.pop()
            guard.close()
            backend.close()
        if cfg is None:
            cfg = _compose(*overrides)
        backend = open_backend(cfg.device)
        device = backend.device(0)
        guard = SettingsGuard(device, Journal(journal_dir(cfg.device))).__enter__()
        opened.append((backend, guard))
        ctx = TrialContext(device=device, guard=guard, sweep_id="test",
                           kernels=KERNELS if kernels is None else kernels)
        ctx.on_kernel_calls = on_kernel_calls
        if before is not None:
            before(device)
        rows = run_trial(ctx, JobSpec.from_config(cfg))
        return rows, ctx

    _run.compose = _compose  # a test that runs one config at many settings composes it once
    yield _run
    for backend, guard in opened:
        guard.close()
        backend.close()


