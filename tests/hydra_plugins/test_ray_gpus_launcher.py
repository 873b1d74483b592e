"""The ray_gpus Hydra launcher as a user meets it: discovered by Hydra, the default for multiruns,
run through ``dvfs sweep -m`` in a fresh process that starts its own local Ray instance.

(Hydra's plugin scanner may import this module as ``hydra_plugins.test_...`` too, since ``tests/``
is on the path: it does nothing at import time.)
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from support import DVFS, REPO

QUICK = ["workload.size=tiny", "measure=quick", "quiet=true"]


def run(*args: str, timeout_s: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*DVFS, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout_s
    )


def test_ray_gpus_is_discovered_and_is_the_default_multirun_launcher():
    from hydra import compose, initialize_config_dir

    from orchestrator.config import CONF_DIR, register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(
            config_name="config",
            return_hydra_config=True,
            overrides=["hydra.launcher.placement=[GPU-aaaa-1,GPU-bbbb-2]"],
        )
    launcher = cfg.hydra.launcher
    assert launcher._target_ == "hydra_plugins.dvfs.ray_gpus_launcher.RayGpusLauncher"
    assert list(launcher.placement) == ["GPU-aaaa-1", "GPU-bbbb-2"]
    assert launcher.address is None and launcher.timeout_s is None and launcher.num_cpus == 0
    assert launcher.max_restarts == 5 and launcher.lease_wait_s is None and launcher.progress


def test_importing_the_plugin_imports_no_ray():
    code = (
        "import sys, hydra_plugins.dvfs.ray_gpus_launcher, orchestrator.cli; "
        "print(json.dumps([m for m in ('ray', 'jax', 'tensorflow') if m in sys.modules]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", "import json; " + code], capture_output=True, text=True, check=True
    )
    assert json.loads(out.stdout) == []


@pytest.mark.slow
def test_dvfs_sweep_m_starts_a_local_ray_and_stores_a_row_for_every_job(sim_dir, tmp_path):
    from orchestrator.store import ResultStore

    d = tmp_path / "sweep"
    proc = run(
        "sweep",
        "-m",
        "device.count=2",
        *QUICK,
        "workload=gemm,stencil",
        "device.sm_clock_mhz=1065,1410",
        f"hydra.sweep.dir={d}",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    with ResultStore(d, readonly=True) as store:
        rows = store.rows()
    assert len(rows) == 4 and all(r["status"] == "ok" for r in rows)
    assert len({r["device_uuid"] for r in rows}) <= 2 and all(
        r["launch"]["launcher"] == "ray_gpus" for r in rows
    )
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ray_gpus: 4 trial(s) on 2 GPU(s)") and last.endswith(
        f"report: dvfs report {d}"
    )
    assert "Traceback" not in proc.stderr


def test_a_refused_job_exits_2_with_one_line_before_ray_starts(sim_dir, tmp_path):
    t0 = time.monotonic()
    proc = run("sweep", "-m", *QUICK, "measure.repeats=1,0", f"hydra.sweep.dir={tmp_path / 's'}")
    assert proc.returncode == 2
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("dvfs sweep: error:")]
    assert (
        len(errors) == 1
        and "job #1 (measure.repeats=0): measure.repeats=0 must be greater than 0" in errors[0]
    )
    assert "starting" not in proc.stderr and time.monotonic() - t0 < 60


def test_a_bad_launcher_setting_exits_2(sim_dir, tmp_path):
    proc = run(
        "sweep",
        "-m",
        *QUICK,
        "hydra.launcher.placement=somewhere",
        f"hydra.sweep.dir={tmp_path / 's'}",
    )
    assert proc.returncode == 2
    assert (
        "hydra.launcher.placement='somewhere' is not one of: any, every, [GPU UUIDs]" in proc.stderr
    )
