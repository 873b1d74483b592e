"""Fixtures of the analysis tests: a scratch matplotlib config and synthetic sweeps.

The synthetic sweep follows the simulated GPU's model (docs/simulator.md): a roofline time with a
clock-scaled compute roof, and power = idle + memory term + dynamic term x f x V(f)², with V flat
below a knee. ``gemm`` is compute-bound, ``stencil`` memory-bound. JAX gemm fails its check below
1065 MHz (the study's claim), TensorFlow holds.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[2]
if str(_ROOT) not in sys.path:  # the repository is not installed in the venv
    sys.path.insert(0, str(_ROOT))
os.environ.setdefault("MPLCONFIGDIR", tempfile.mkdtemp(prefix="mpl-analysis-tests-"))
os.environ.setdefault("MPLBACKEND", "Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

F_MAX_MHZ = 1410.0
CLOCKS_MHZ = [510, 645, 780, 915, 1050, 1185, 1320, 1410]


def _volt(f: float) -> float:
    knee = 900.0
    return 0.7 if f <= knee else 0.7 + 0.3 * (f - knee) / (F_MAX_MHZ - knee)


def synthetic_rows(
    workloads=("gemm", "stencil"),
    frameworks=("jax", "tensorflow"),
    clocks=CLOCKS_MHZ,
    repeats: int = 3,
    seed: int = 0,
    with_default: bool = True,
    jax_fails_below_mhz: float | None = 1065.0,
    invalid_clock_mhz: float | None = 645.0,
) -> list[dict]:
    """Rows in the trial schema, one per repeat of each (workload, framework, clock)."""
    rng = np.random.default_rng(seed)
    rows = []
    work = {"gemm": (2.0e12, 0.2e9), "stencil": (0.05e12, 8.0e9)}  # FLOP, bytes per iteration
    fw_speed = {"jax": 1.0, "tensorflow": 1.15}
    settings = [(float(c), False) for c in clocks]
    if with_default:
        settings.append((None, True))
    for w in workloads:
        flop, nbytes = work[w]
        for fw in frameworks:
            for clock, default in settings:
                f = F_MAX_MHZ if clock is None else clock
                for r in range(repeats):
                    noise = 1.0 + 0.01 * rng.standard_normal()
                    t_compute = flop / (19.5e12 * f / F_MAX_MHZ)
                    t_mem = nbytes / 1555e9
                    t = (max(t_compute, t_mem) * fw_speed[fw] + 50e-6) * noise
                    util_c = t_compute / max(t_compute, t_mem)
                    util_m = t_mem / max(t_compute, t_mem)
                    p = 60 + 90 * util_m + 250 * util_c * (f / F_MAX_MHZ) * (_volt(f) / 1.0) ** 2
                    p *= 1.0 + 0.01 * rng.standard_normal()
                    e = p * t
                    iters = int(max(10, 2.0 / t))
                    status, valid, why, err = "ok", True, None, None
                    if (jax_fails_below_mhz and fw == "jax" and w == "gemm"
                            and f < jax_fails_below_mhz):
                        status, err = "wrong", "rel_error 3.2e-02 > tolerance 1e-4"
                    if invalid_clock_mhz and clock == invalid_clock_mhz and fw == "tensorflow" \
                            and w == "stencil" and r == 0:
                        valid, why = False, "observed SM clock 600 MHz, asked 645 MHz"
                    rows.append({
                        "schema_version": 1, "sweep_id": "synthetic", "host": "node0",
                        "trial_key": f"{w}-{fw}-{clock}-{default}", "repeat": r,
                        "started_at": 1.7e9 + len(rows), "ended_at": 1.7e9 + len(rows) + t * iters,
                        "device_index": 0, "device_uuid": "GPU-sim-0001",
                        "device_name": "A100-SXM4-40GB", "driver_version": "sim-1.0",
                        "backend": "sim", "framework": fw, "framework_version": "0.10.2"
                        if fw == "jax" else "2.21.0", "workload": w, "size": "large",
                        "dtype": "float32", "precision": "highest",
                        "sm_clock_min_mhz": clock, "sm_clock_max_mhz": clock, "mem_clock_mhz": None,
                        "power_limit_w": None, "clock_offset_mhz": None, "default_setting": default,
                        "observed_sm_clock_mhz": f, "avg_power_w": p, "peak_power_w": p * 1.1,
                        "temperature_c": 40 + p / 10, "throttle_reasons": [],
                        "iterations": iters, "time_s": t * iters, "time_per_iter_s": t,
                        "throughput": 1 / t, "tflops": flop / t / 1e12, "gbps": nbytes / t / 1e9,
                        "energy_j": e * iters, "energy_per_iter_j": e,
                        "energy_per_tflop_j": e / (flop / 1e12),
                        "energy_per_gb_j": e / (nbytes / 1e9),
                        "rel_error": 1e-7 if status == "ok" else 3.2e-2, "max_abs_error": 1e-6,
                        "nonfinite_count": 0, "determinism_mismatches": 0,
                        "status": status, "error": err, "valid": valid, "invalid_reason": why,
                        "meter": "counter", "energy_counter_updates": 40,
                        "config": {"workload": w, "framework": fw}, "versions": {"numpy": "2.4.6"},
                        "git_commit": "abc1234", "config_hash": "h" + w + fw,
                    })
    return rows


@pytest.fixture(scope="session")
def make_rows():
    """The synthetic sweep generator (see :func:`synthetic_rows`)."""
    return synthetic_rows


@pytest.fixture(scope="session")
def sim_sweep(tmp_path_factory):
    """A real sweep on the simulated GPU and its reports (``report_support.run_sim_sweep``).

    Session-scoped: the sweep runs once (about a minute on two cores) for every module that
    reads its report.
    """
    from report_support import run_sim_sweep

    return run_sim_sweep(tmp_path_factory.mktemp("sim-sweep"))
