"""``scripts/gpu_check.py`` without a GPU: the one-line exit, and its sections over the sim.

The script's sections take a ``Device`` and its summary writer takes plain dicts, so everything but
the NVML calls of a real GPU runs here: over a simulated A100 (whose clock is virtual: the
counter-period section drives it with idle steps), a P100 (no energy counter), and fakes of the
subprocesses it starts.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest
from support import REPO

SCRIPT = REPO / "scripts" / "gpu_check.py"


def _load_script():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


gc = _load_script()


def run_script(*args, timeout=120):
    return subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, args)],
        capture_output=True, text=True, timeout=timeout, cwd=REPO,
    )


@pytest.fixture
def sim_device(tmp_path, monkeypatch):
    """Open a simulated GPU (``profile``, counter ``period_s``) behind the NVML adapter."""
    monkeypatch.setenv("DVFS_SIM_STATE_DIR", str(tmp_path / "sim"))
    opened = []

    def open_sim(profile="a100_sxm4_40gb", period_s=0.02):
        backend = gc.open_backend({
            "backend": "sim", "profile": profile, "state_dir": str(tmp_path / "sim"),
            "energy_update_period_s": period_s,
        })
        opened.append(backend)
        return backend.device(0)

    yield open_sim
    for backend in opened:
        backend.close()


def short_config(tmp_path, **kw):
    """A configuration with short phases (virtual seconds on the sim)."""
    values = {"out_dir": tmp_path / "out", "device": "sim", "sections": gc.SIM_SECTIONS,
              "counter_s": 0.5, "power_s": 0.2}
    values.update(kw)
    (tmp_path / "out").mkdir(exist_ok=True)
    return gc.CheckConfig(**values)


# --- the script as a user runs it -------------------------------------------------------------
def test_without_a_gpu_it_says_so_in_one_line_exits_0_and_writes_nothing(tmp_path):
    from orchestrator.devices import nvml_available

    if nvml_available():
        pytest.skip("this machine has an NVIDIA GPU")
    done = run_script("--out", tmp_path / "out")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu_check: no NVIDIA GPU here (NVML: ")
    assert "nothing to check" in lines[0]
    assert not (tmp_path / "out").exists()


def test_on_the_sim_it_writes_json_and_markdown_with_the_identity_and_the_counter_period(tmp_path):
    out = tmp_path / "out"
    done = run_script(
        "--device", "sim", "--out", out, "--sim-energy-update-period-s", "0.05",
        "--counter-s", "1.0", "--power-s", "0.3",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"summary in {out / 'gpu_check.md'} and {out / 'gpu_check.json'}" in done.stdout
    report = json.loads((out / "gpu_check.json").read_text())
    sections = report["sections"]
    assert {n: s["status"] for n, s in sections.items()} == {
        "identity": "ok", "energy_counter": "ok", "power": "ok",
        "sweep": "skipped", "window_overhead": "skipped",
    }
    ident = sections["identity"]["data"]
    assert ident["name"] == "NVIDIA A100-SXM4-40GB" and ident["uuid"].startswith("GPU-")
    assert ident["architecture"] == "ampere" and ident["backend"] == "sim"
    assert ident["sm_clocks_count"] == 81 and ident["sm_clock_range_mhz"] == [210, 1410]
    assert (ident["power_limit_min_w"], ident["power_limit_max_w"]) == (100, 400)
    idle = sections["energy_counter"]["data"]["phases"]["idle"]
    assert idle["interval_s"]["median_s"] == pytest.approx(0.05, abs=0.0015)
    assert idle["updates"] in (19, 20, 21)
    load = sections["energy_counter"]["data"]["phases"]["load"]
    assert load["counter_power_w"] > 2 * idle["counter_power_w"]
    power = sections["power"]["data"]["phases"]
    assert power["idle"]["readings"]["instant"]["supported"] is True
    idle_w, load_w = (power[ph]["readings"]["instant"]["mean_w"] for ph in ("idle", "load"))
    assert load_w > idle_w
    md = (out / "gpu_check.md").read_text()
    head = md.splitlines()[:4]
    assert head[0].startswith("# GPU check: NVIDIA A100-SXM4-40GB (GPU-")
    assert any(line.startswith("> Simulated GPU") and "period 0.05 s" in line for line in head)
    assert report["device"]["sim"]["energy_update_period_s"] == 0.05
    assert "## Energy counter update period: ok" in md and "| idle | nothing running |" in md
    assert "## Workloads (dvfs sweep, observe-only): skipped" in md


# --- measurements over a device ---------------------------------------------------------------
@pytest.mark.parametrize("period_s", [0.02, 0.1])
def test_the_counter_period_measured_on_the_sims_clock_is_the_configured_one(sim_device, period_s):
    device = sim_device(period_s=period_s)
    result = gc.measure_counter_period(device, gc.idle_phase(device), 1.0, 0.001)
    assert result["interval_s"]["median_s"] == pytest.approx(period_s, abs=0.0015)
    assert result["interval_s"]["min_s"] >= period_s - 0.0015
    assert result["updates"] == pytest.approx(1.0 / period_s, abs=1)
    assert result["counter_power_w"] == pytest.approx(device.power_mw() / 1000, rel=0.02)


def test_power_sampling_sees_the_load_and_says_which_readings_exist(sim_device):
    device = sim_device()  # an A100: usage and instant are one sensor, no average field
    idle = gc.sample_power(device, gc.idle_phase(device), 0.2, 100.0)
    with gc.simulated_load(device, "gemm") as phase:
        phase.wait(0.2)  # past the sensor's next update
        busy = gc.sample_power(device, phase, 0.2, 100.0)
    assert set(idle["readings"]) == {"usage", "instant", "average"}
    assert idle["samples"] == pytest.approx(20, abs=1)
    assert idle["sample_interval_s"] == pytest.approx(0.01, rel=0.05)
    assert idle["readings"]["average"] == {"supported": False}  # NOT_SUPPORTED on GA100
    for key in ("usage", "instant"):
        assert busy["readings"][key]["mean_w"] > 3 * idle["readings"][key]["mean_w"]
        assert idle["readings"][key]["changes"] == 0  # the sim's idle power is flat


@pytest.mark.parametrize(
    ("profile", "semantics"),
    [
        ("a100_sxm4_40gb", {"usage": "instant", "instant": "instant"}),
        ("h100_sxm5_80gb", {"usage": "average", "instant": "instant", "average": "average"}),
    ],
)
def test_after_the_load_it_tells_an_instant_reading_from_a_one_second_average(
    sim_device, tmp_path, profile, semantics
):
    device = sim_device(profile=profile)
    parts = gc.telemetry_sections(
        device, lambda: gc.simulated_load(device, "gemm"), short_config(tmp_path, power_s=2.0)
    )
    after = parts["power"]["phases"]["after_load"]["readings"]
    seen = {k: r["semantics"].split(" ")[0] for k, r in after.items() if r["supported"]}
    assert seen == semantics
    for key, kind in semantics.items():
        settle = after[key]["settle_s"]
        assert settle <= 0.2 if kind == "instant" else 0.8 <= settle <= 1.1, (key, settle)


def test_the_device_the_script_checks_refuses_every_setter(sim_device):
    device = sim_device()
    guarded = gc.ObserveOnlyDevice(device)
    before = device.settings()
    for call in (
        lambda: guarded.set_locked_sm_clocks(900, 900), lambda: guarded.reset_locked_sm_clocks(),
        lambda: guarded.set_locked_mem_clocks(1215, 1215),
        lambda: guarded.reset_locked_mem_clocks(), lambda: guarded.set_power_limit_w(250),
        lambda: guarded.set_clock_offset_mhz(50),
    ):
        with pytest.raises(gc.ObserveOnlyError, match="observe-only"):
            call()
    assert device.settings() == before
    assert guarded.power_readings_mw() == device.power_readings_mw()


# --- sections fail alone ------------------------------------------------------------------------
def test_a_gpu_without_an_energy_counter_fails_that_section_and_the_others_still_run(
    sim_device, tmp_path
):
    device = sim_device(profile="p100_pcie_16gb")
    results = gc.run_check(device, short_config(tmp_path))
    assert results["identity"]["status"] == "ok"
    assert results["identity"]["data"]["has_energy_counter"] is False
    assert results["energy_counter"]["status"] == "failed"
    assert "idle: DeviceNotSupportedError" in results["energy_counter"]["error"]
    assert "load: DeviceNotSupportedError" in results["energy_counter"]["error"]
    assert results["power"]["status"] == "ok"
    assert set(results["power"]["data"]["phases"]) == {"idle", "load", "after_load"}


def test_a_load_that_cannot_start_leaves_the_idle_figures_standing(sim_device, tmp_path):
    device = sim_device()

    @contextlib.contextmanager
    def broken_load():
        raise RuntimeError("the load exited 1 before it ran")
        yield

    parts = gc.telemetry_sections(device, broken_load, short_config(tmp_path))
    for name in ("energy_counter", "power"):
        result = gc.section_result(parts[name], 0.0)
        assert result["status"] == "partial"
        assert result["problems"] == ["load: RuntimeError: the load exited 1 before it ran"]
        assert set(result["data"]["phases"]) == {"idle"}


def test_a_missing_or_failing_bench_script_is_a_failed_section_not_an_exception(tmp_path):
    cfg = short_config(tmp_path, device="nvml")
    missing = gc.run_section(lambda: gc.run_window_bench(cfg, 10, script=tmp_path / "nope.py"))
    assert missing["status"] == "failed"
    assert "nope.py is not in this checkout" in missing["error"]
    failing = tmp_path / "failing.py"
    failing.write_text("import sys\nsys.exit('bench_window.py: error: argument --device')\n")
    failed = gc.run_section(lambda: gc.run_window_bench(cfg, 10, script=failing))
    assert failed["status"] == "failed"
    assert "failing.py exited 1 and measured no pair" in failed["error"]
    assert "bench_window.py: error: argument --device" in failed["error"]


def test_a_bench_stopped_past_its_budget_keeps_the_ratios_it_printed(tmp_path):
    cfg = short_config(tmp_path, device="nvml")
    slow = tmp_path / "slow.py"
    slow.write_text(textwrap.dedent("""\
        import sys, time
        print("stencil/jax: ratio 1.012", file=sys.stderr, flush=True)
        print("gemm/jax: ratio 1.004", file=sys.stderr, flush=True)
        time.sleep(60)
    """))
    result = gc.run_section(lambda: gc.run_window_bench(cfg, 2, script=slow))
    assert result["status"] == "partial"
    assert result["problems"] == ["slow.py ran past its 2 s and was stopped"]
    assert [(r["workload"], r["ratio"]) for r in result["data"]["rows"]] == [
        ("stencil", 1.012), ("gemm", 1.004)
    ]
    assert result["data"]["max_ratio"] == 1.012


# --- the summary --------------------------------------------------------------------------------
def test_the_summary_renders_a_failed_section_as_failed_and_every_other_in_place(tmp_path):
    report = {
        "host": "h", "started_at": "2026-01-01T00:00:00+00:00", "elapsed_s": 12.5,
        "device": {"backend": "nvml", "name": "NVIDIA H200", "uuid": "GPU-1"},
        "sections": {
            "identity": gc.section_result({"name": "NVIDIA H200", "power_limit_max_w": 700.0}, 0.1),
            "energy_counter": gc.run_section(lambda: 1 / 0),
            "power": gc.section_result({"phases": {"idle": {"readings": None}}}, 0.1),
            "sweep": gc.section_result({"rows": [], "problems": ["dvfs sweep exited 3: boom"]}, 1),
            "window_overhead": gc.skipped("not asked for (--sections)"),
        },
    }
    json_path, md_path = gc.write_summary(report, tmp_path / "out")
    md = md_path.read_text()
    assert md.startswith("# GPU check: NVIDIA H200 (GPU-1)")
    assert "Simulated" not in md
    assert "| power_limit_max_w | 700 |" in md
    assert "## Energy counter update period: failed" in md
    assert "**failed**: ZeroDivisionError: division by zero" in md
    assert "## Power readings (usage, instant, average): ok" in md
    assert "**failed to render** (AttributeError" in md  # bad data, yet the sections after it
    assert "**failed**: dvfs sweep exited 3: boom" in md
    assert "**skipped**: not asked for (--sections)" in md
    saved = json.loads(json_path.read_text())
    assert [s["status"] for s in saved["sections"].values()] == [
        "ok", "failed", "ok", "failed", "skipped"
    ]
    assert "ZeroDivisionError" in saved["sections"]["energy_counter"]["traceback"]


def test_non_finite_figures_are_written_as_null_json(tmp_path):
    report = {"device": {}, "sections": {"sweep": gc.section_result(
        {"rows": [{"workload": "gemm", "rel_error": float("nan")}]}, 0.0)}}
    json_path, _ = gc.write_summary(report, tmp_path)
    text = json_path.read_text()
    assert "NaN" not in text
    assert json.loads(text)["sections"]["sweep"]["data"]["rows"][0]["rel_error"] is None


# --- the subprocesses it starts -----------------------------------------------------------------
def test_the_kernel_load_runs_in_a_subprocess_and_is_stopped_after_its_phase(sim_device, tmp_path):
    device = sim_device()
    cfg = short_config(tmp_path, preset="tiny", load_ramp_s=0.0)
    with gc.kernel_load(device, cfg, timeout_s=90) as phase:
        assert phase.name == "load" and "looping in pid" in phase.detail
        assert phase.alive()
        pid = int(phase.detail.rsplit(" ", 1)[1])
    assert not phase.alive()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # reaped: the load never outlives its phase


def test_the_ready_line_is_read_from_a_pipe_numbered_past_1024(tmp_path):
    """select(2) refuses descriptors from 1024 up; a long test session or notebook reaches them."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "print('compiling'); print('ready', flush=True)"],
        stdout=subprocess.PIPE, bufsize=0,
    )
    high = os.dup2(proc.stdout.fileno(), 1500)
    proc.stdout.close()
    proc.stdout = os.fdopen(high, "rb", buffering=0)
    try:
        gc._await_ready(proc, timeout_s=60, log_path=tmp_path / "load.log")
    finally:
        proc.stdout.close()
        proc.wait(timeout=30)


@pytest.mark.slow
def test_the_sweep_section_runs_dvfs_sweep_observe_only_and_reads_back_its_rows(tmp_path):
    cfg = short_config(tmp_path, preset="tiny", workloads=("gemm",), frameworks=("jax",))
    result = gc.run_section(lambda: gc.run_sweep(cfg, 240))
    assert result["status"] == "ok", result
    data = result["data"]
    assert "device.observe_only=true" in data["command"]
    assert data["statuses"] == {"ok": 1}
    (row,) = data["rows"]
    assert (row["workload"], row["framework"], row["status"]) == ("gemm", "jax", "ok")
    assert row["time_per_iter_s"] > 0 and row["tflops"] > 0 and row["energy_per_iter_j"] > 0
    assert row["determinism_mismatches"] == 0 and row["rel_error"] < 1e-4
