"""`dvfs sweep device=cpu` end to end, in subprocesses: refused settings, a single run whose RAPL
counter a test thread advances (and wraps), a multirun through the ray_gpus launcher, and
`dvfs devices device=cpu`."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time

import pytest
from support import DVFS

from orchestrator import config as C
from orchestrator.errors import UserError
from orchestrator.results.store import ResultStore

QUICK = ["workload=stencil", "workload.size=tiny", "measure=quick", "measure.settle_s=0"]


def dvfs(tmp_path, *args, env=None, timeout=300):
    return subprocess.run([*DVFS, *args], cwd=tmp_path, env={**os.environ, **(env or {})},
                          capture_output=True, text=True, timeout=timeout)


def cpu_args(tmp_path, powercap_root):
    return ["device=cpu", f"device.powercap_root={powercap_root}",
            f"device.journal_dir={tmp_path / 'journal'}"]


class FakeRapl:
    """A package zone whose counter advances at ``watts`` in wall time, written as sysfs would
    show it (atomically), wrapping at ``range_uj`` as the real counter does.

    Its writer is a thread of the test process, which a loaded machine can keep off a core for
    a while: the file then lags wall time by up to the longest gap between two writes
    (``max_gap_s``), at each end of a measured span. :meth:`energy_of` allows for that lag and
    no more (a quiet machine's gap is about a millisecond)."""

    def __init__(self, root, *, watts, range_uj, start_uj=0):
        self.zone = root / "intel-rapl:0"
        self.zone.mkdir(parents=True)
        (self.zone / "name").write_text("package-0\n")
        (self.zone / "max_energy_range_uj").write_text(f"{range_uj}\n")
        self.watts, self.range_uj, self.start_uj = watts, range_uj, start_uj
        self._write(start_uj)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.max_gap_s = 0.0

    def _write(self, value_uj):
        tmp = self.zone / "energy_uj.tmp"
        tmp.write_text(f"{value_uj}\n")
        os.replace(tmp, self.zone / "energy_uj")

    def _run(self):
        t0 = last = time.monotonic()
        while not self._stop.wait(0.001):
            now = time.monotonic()
            self.max_gap_s, last = max(self.max_gap_s, now - last), now
            used_uj = int(self.watts * 1e6 * (now - t0))
            self._write((self.start_uj + used_uj) % (self.range_uj + 1))

    def energy_of(self, time_s, rel):
        """The energy a meter reads over ``time_s`` of wall time: ``watts * time_s`` within
        ``rel``, or within the file's lag at both ends of the span where that is more."""
        return pytest.approx(self.watts * time_s, rel=rel, abs=2 * self.watts * self.max_gap_s)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


# --- no settings --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "override, shown",
    [
        ("device.sm_clock_mhz=1000", "device.sm_clock_mhz=1000"),
        ("device.sm_clock_mhz=[900,1000]", "device.sm_clock_mhz=[900, 1000]"),
        ("device.mem_clock_mhz=1215", "device.mem_clock_mhz=1215"),
        ("device.power_limit_w=250", "device.power_limit_w=250.0"),
        ("device.clock_offset_mhz=50", "device.clock_offset_mhz=50"),
    ],
)
def test_a_cpu_sweep_that_asks_for_a_setting_is_one_line_exit_2_before_anything_runs(
    tmp_path, override, shown
):
    out = dvfs(tmp_path, "sweep", *QUICK, *cpu_args(tmp_path, tmp_path / "powercap"),
               f"hydra.run.dir={tmp_path / 'run'}", override, timeout=120)
    assert out.returncode == 2, (out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert lines == [
        f"dvfs sweep: error: device=cpu has no settings to change: {shown} (the host CPU is "
        f"measured as it runs; drop the setting or use device=nvml or device=sim)"
    ]
    assert not (tmp_path / "run" / "trials.sqlite").exists()
    assert not (tmp_path / "journal").exists()  # no guard was opened: not even a lease


def test_a_cpu_multirun_that_asks_for_a_setting_is_refused_before_ray_starts(tmp_path):
    ray_tmp = tmp_path / "ray"
    ray_tmp.mkdir()
    out = dvfs(tmp_path, "sweep", "-m", *QUICK, *cpu_args(tmp_path, tmp_path / "powercap"),
               f"hydra.sweep.dir={tmp_path / 'sweep'}", "device.power_limit_w=100,200",
               env={"RAY_TMPDIR": str(ray_tmp)}, timeout=120)
    assert out.returncode == 2, (out.stdout, out.stderr)
    (line,) = out.stderr.strip().splitlines()
    assert "job #0 (device.power_limit_w=100): device=cpu has no settings to change" in line
    assert line.endswith("(and 1 more refused job(s)); nothing was run")
    assert list(ray_tmp.iterdir()) == []  # no Ray instance was started
    assert not (tmp_path / "sweep" / "trials.sqlite").exists()


def test_polling_is_refused_on_the_cpu_which_has_no_power_sensor():
    cfg = C.compose(["device=cpu", "measure.meter=polling"])
    with pytest.raises(UserError, match="measure.meter=polling needs a power sensor"):
        C.validate_static(cfg)
    C.validate_static(C.compose(["device=cpu"]))  # the CPU's defaults are a valid trial


# --- trials -------------------------------------------------------------------------------------
def test_a_single_run_on_the_cpu_measures_the_energy_its_rapl_counter_advanced_by(tmp_path):
    """10 W on a counter that wraps every 0.4 s: the window's energy is 10 W x its length, so
    every wrap inside it was unwrapped."""
    with FakeRapl(tmp_path / "powercap", watts=10.0, range_uj=4_000_000) as rapl:
        out = dvfs(tmp_path, "sweep", *QUICK, *cpu_args(tmp_path, tmp_path / "powercap"),
                   "framework=jax", f"hydra.run.dir={tmp_path / 'run'}")
    assert out.returncode == 0, out.stderr
    assert "stencil/jax float32 [device default] #0: ok" in out.stdout
    with ResultStore(tmp_path / "run", readonly=True) as store:
        (row,) = store.rows()
    assert row["status"] == "ok" and row["backend"] == "cpu" and row["meter"] == "counter"
    assert row["device_uuid"].startswith("CPU-") and row["iterations"] >= 5
    assert row["time_s"] >= 0.5
    assert row["energy_j"] == rapl.energy_of(row["time_s"], rel=0.1)
    assert row["avg_power_w"] * row["time_s"] == rapl.energy_of(row["time_s"], rel=0.1)
    assert row["energy_counter_updates"] >= 10
    assert not list((tmp_path / "journal").glob("*.json"))  # nothing was set, nothing journaled


@pytest.mark.slow
def test_a_cpu_multirun_runs_both_frameworks_on_one_ray_worker(tmp_path):
    sweep = tmp_path / "sweep"
    with FakeRapl(tmp_path / "powercap", watts=5.0, range_uj=262_143_328_850) as rapl:
        out = dvfs(tmp_path, "sweep", "-m", *QUICK, *cpu_args(tmp_path, tmp_path / "powercap"),
                   "framework=jax,tensorflow", f"hydra.sweep.dir={sweep}", timeout=600,
                   env={"CUDA_VISIBLE_DEVICES": ""})  # a shell told to hide its GPUs: Ray still
    assert out.returncode == 0, out.stderr  # starts the logical GPU that stands for the CPU
    assert "ray_gpus: starting 1 worker(s), one per GPU" in out.stderr
    assert "2 trial(s) on 1 GPU(s)" in out.stderr and "(2 ok)" in out.stderr
    with ResultStore(sweep, readonly=True) as store:
        rows = store.rows()
    assert sorted(r["framework"] for r in rows) == ["jax", "tensorflow"]
    assert all(r["status"] == "ok" and r["backend"] == "cpu" for r in rows)
    assert len({r["device_uuid"] for r in rows}) == 1
    assert {r["launch"]["worker_pid"] for r in rows} == {rows[0]["launch"]["worker_pid"]}
    assert {r["launch"]["ray_gpu_id"] for r in rows} == {"0"}
    for r in rows:
        assert r["energy_j"] == rapl.energy_of(r["time_s"], rel=0.1)


def test_dvfs_devices_lists_the_cpu_and_why_it_measures_no_energy(tmp_path):
    out = dvfs(tmp_path, "devices", "device=cpu", f"device.powercap_root={tmp_path / 'none'}",
               "--json", timeout=120)
    assert out.returncode == 0, out.stderr
    listing = json.loads(out.stdout)
    (device,) = listing["devices"]
    assert listing["backend"] == "cpu" and device["backend"] == "cpu"
    assert device["uuid"].startswith("CPU-") and device["name"].endswith(f"({os.cpu_count()} CPUs)")
    assert device["has_energy_counter"] is False and device["has_power_sensor"] is False
    assert device["energy_note"].startswith("no RAPL energy counter: ")
    assert device["energy_j"] is None and device["power_w"] is None
    text = dvfs(tmp_path, "devices", "device=cpu", f"device.powercap_root={tmp_path / 'none'}")
    assert text.returncode == 0, text.stderr
    assert "settings      none (the CPU is measured as it runs)" in text.stdout
    assert "no RAPL energy counter" in text.stdout


def test_without_a_readable_rapl_counter_a_cpu_trial_measures_time_only_and_says_why(tmp_path):
    (tmp_path / "powercap").mkdir()  # a powercap tree with no zone, as in a VM
    out = dvfs(tmp_path, "sweep", *QUICK, *cpu_args(tmp_path, tmp_path / "powercap"),
               "framework=jax", f"hydra.run.dir={tmp_path / 'run'}")
    assert out.returncode == 0, out.stderr
    with ResultStore(tmp_path / "run", readonly=True) as store:
        (row,) = store.rows()
    assert row["status"] == "ok" and row["meter"] == "none"
    assert row["energy_j"] is None and row["energy_per_iter_j"] is None
    assert "RAPL" in row["energy_note"] or "intel-rapl" in row["energy_note"]
    assert row["time_per_iter_s"] > 0 and row["checked_iters"] == row["iterations"]


def test_a_stability_search_on_the_cpu_is_one_line_exit_2(tmp_path):
    out = dvfs(tmp_path, "sweep", "-m", "hydra/sweeper=stability", *QUICK,
               *cpu_args(tmp_path, tmp_path / "powercap"), f"hydra.sweep.dir={tmp_path / 'sweep'}",
               timeout=120)
    assert out.returncode == 2, (out.stdout, out.stderr)
    (line,) = out.stderr.strip().splitlines()
    assert "offers no value of device.sm_clock_mhz to search" in line
