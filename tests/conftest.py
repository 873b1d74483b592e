"""Shared test setup: scratch homes for every tool that writes outside the tree, and a fresh
simulated machine per test.

Ray, Keras, matplotlib and pip write under the home directory and the system temp folder by
default; the suite points them at one scratch folder so two runs never share state, and removes
it when the session ends (after shutting down a Ray instance a test left running in it), so a
test run leaves nothing behind.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

_SCRATCH = Path(tempfile.mkdtemp(prefix="dvfs-tests-"))
for var, sub in (
    ("RAY_TMPDIR", "ray"),
    ("MPLCONFIGDIR", "mpl"),
    ("KERAS_HOME", "keras"),
    ("XDG_CACHE_HOME", "cache"),
):
    os.environ.setdefault(var, str(_SCRATCH / sub))
    Path(os.environ[var]).mkdir(parents=True, exist_ok=True)
os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.pop("DVFS_SIM_STATE_DIR", None)
os.environ.pop("DVFS_JOURNAL_DIR", None)


def pytest_unconfigure(config):
    """Remove the scratch folder, once nothing of the session writes there any more."""
    if "ray" in sys.modules:
        import ray

        ray.shutdown()
    shutil.rmtree(_SCRATCH, ignore_errors=True)


_DEVICE_HIDING = ("CUDA_VISIBLE_DEVICES", "JAX_PLATFORMS")


@pytest.fixture(autouse=True)
def _no_test_leaves_the_devices_hidden():
    """``device=cpu`` hides the GPUs process-wide (``CUDA_VISIBLE_DEVICES=""``); a test that
    opens it in this process must put them back (monkeypatch), or every later test that starts
    Ray with GPUs fails far from the cause. Such a test fails here, and the variables are put
    back for the rest of the session."""
    before = {name: os.environ.get(name) for name in _DEVICE_HIDING}
    yield
    changed = {name: os.environ.get(name) for name in _DEVICE_HIDING
               if os.environ.get(name) != before[name]}
    for name in changed:
        if before[name] is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before[name]
    if changed:
        pytest.fail(f"the test left {changed} set in the test process (was {before})")


@pytest.fixture
def sim_dir(tmp_path, monkeypatch):
    """A fresh simulated machine's state directory, exported as DVFS_SIM_STATE_DIR."""
    state = tmp_path / "sim"
    monkeypatch.setenv("DVFS_SIM_STATE_DIR", str(state))
    return state


def _keep_absl_off_pytests_capture() -> None:
    """absl (imported by TensorFlow) logs to the ``sys.stderr`` of the moment it is imported:
    under pytest that is the capture stream. When Hydra later reconfigures logging, every old
    handler is closed, and absl's closes its stream (it spares only the real stderr/stdout),
    which closes pytest's capture for the rest of the session. Point absl at the real stderr."""
    import absl.logging

    absl.logging.get_absl_handler().python_handler.stream = sys.__stderr__


_keep_absl_off_pytests_capture()


def pytest_collection_modifyitems(config, items):
    """Modules with a slow test run first, each module's tests kept together and in order.

    ``scripts/test`` runs the suite on several processes (pytest-xdist, ``--dist loadfile``: a
    module's tests stay on one process, so a module's Ray instance or chaos run is made once);
    a process takes the next module when it is free. Started last, a module of minutes leaves
    the other processes idle at the end; started first, the short modules fill in around it
    (longest first). The order inside a module is untouched, and so is the order of a run
    in one process apart from the modules' order."""
    def has_slow(item):
        return item.get_closest_marker("slow") is not None

    slow_modules = {item.nodeid.split("::")[0] for item in items if has_slow(item)}
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in slow_modules)
