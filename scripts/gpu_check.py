#!/usr/bin/env python
"""One short, observe-only check of an NVIDIA GPU: who it is, how often NVML's energy and power
readings update, and what every workload measures on it.

Sections (each with its own time budget; a failing one is recorded and the others still run):

- ``identity``: NVML name, UUID, PCI bus id, driver, architecture, supported clocks, power-limit
  range, current power limit and sensors (read-only queries, through our NVML adapter).
- ``energy_counter``: polls the cumulative energy counter (``nvmlDeviceGetTotalEnergyConsumption``,
  mJ) every ``--poll-ms`` for ``--counter-s``, idle and then while a kernel runs, and records when
  it changes: the number of updates, the median/min/max interval between them (the counter's
  update period, resolved to one poll) and the mean power the counter implies (W).
- ``power``: samples ``power_readings_mw`` (``usage`` = ``nvmlDeviceGetPowerUsage``, ``instant``
  and ``average`` = the NVML field values ``NVML_FI_DEV_POWER_INSTANT`` / ``_AVERAGE``) at
  ``--power-hz`` for ``--power-s``, idle, under the kernel, and right after the kernel stops
  (``after_load``): mean/min/max W of each, how often it changed (its update period, resolved to
  one sample interval) and, after the load, how long it took to settle within 10% of its idle
  value: the semantics observed (an instant reading settles within ~0.1-0.2 s, a one-second
  average in about a second; Hopper's ``nvmlDeviceGetPowerUsage`` is the latter). The identity
  section says which reading the adapter takes for instant (``power_sensing``).
- ``sweep``: every workload at the ``gpu`` preset in JAX and TensorFlow through
  ``dvfs sweep -m device=nvml device.observe_only=true hydra/launcher=basic`` (one-second
  windows, one repeat; one GPU needs no Ray), read back
  from its store: status, time per iteration, TFLOP/s or GB/s, energy per iteration, mean power,
  relative error, determinism mismatches.
- ``window_overhead``: ``scripts/bench_window.py --device nvml --preset gpu --json ...``: the time
  per iteration a trial measures against the bare kernel loop, and their ratio.

Observe-only: it sets nothing, ever (no clock, no power limit, no reset). The device is wrapped in
``ObserveOnlyDevice``, whose setters refuse; the sweep runs with ``device.observe_only=true``; the
load is a JAX GEMM looping in a subprocess at whatever settings the GPU has.

It writes ``gpu_check.json`` and ``gpu_check.md`` into ``--out`` and prints where; it finishes in
under 5 minutes on one GPU. Without an NVIDIA GPU it says so in one line and exits 0.
``--device sim`` runs the identity, energy-counter and power sections over a simulated A100 (its
time is virtual: waits advance the sim's clock, and "a kernel runs" means modelled calls).

Usage::

    python scripts/gpu_check.py --out gpu_check/
    python scripts/gpu_check.py --device sim --out /tmp/gpu_check
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import re
import selectors
import signal
import statistics
import subprocess
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a file, the script's folder comes first, not the repo.
    sys.path.insert(0, str(REPO))

from orchestrator.devices import open_backend, select_devices  # noqa: E402
from orchestrator.devices.base import Device, KernelWork  # noqa: E402
from orchestrator.errors import DeviceNotFoundError, DvfsError  # noqa: E402
from orchestrator.provenance import git_commit  # noqa: E402

WORKLOADS = ("stencil", "gemm", "selu", "conv3d", "mlp_train", "hessian")
FRAMEWORKS = ("jax", "tensorflow")
SECTIONS = ("identity", "energy_counter", "power", "sweep", "window_overhead")
SIM_SECTIONS = ("identity", "energy_counter", "power")  # --device sim, unless --sections says
SIM_LOAD_PRESET = "gpu"  # the size the simulated load models (as workload.sim_size)
TOTAL_BUDGET_S = 285.0  # the whole run, under 5 minutes
GRACE_S = 15.0  # a subprocess past its budget gets SIGTERM, then this long before SIGKILL
ROW_FIELDS = (
    "workload", "framework", "status", "iterations", "time_per_iter_s", "tflops", "gbps",
    "energy_per_iter_j", "avg_power_w", "peak_power_w", "observed_sm_clock_mhz",
    "throttle_reasons", "rel_error", "determinism_mismatches", "valid", "invalid_reason",
    "energy_counter_updates", "error",
)


# --- observe-only device ----------------------------------------------------------------------
class ObserveOnlyError(RuntimeError):
    """Something asked this script to change a device setting; it never does."""


class ObserveOnlyDevice:
    """A ``Device``'s reads and none of its setters: any other attribute raises ObserveOnlyError.

    ``idle`` and ``on_kernel_call`` change no setting: they let device time pass (a sleep on
    hardware; the simulated GPU's virtual clock and modelled kernel calls).
    """

    READS = frozenset({
        "capabilities", "settings", "energy_mj", "power_mw", "power_readings_mw",
        "sm_clock_mhz", "mem_clock_mhz", "temperature_c", "clock_event_reasons", "telemetry",
        "health", "now_s", "idle", "on_kernel_call",
    })

    def __init__(self, device: Device) -> None:
        self._device = device
        self.identity = device.identity

    def __getattr__(self, name: str) -> Any:
        if name in self.READS:
            return getattr(self._device, name)
        raise ObserveOnlyError(f"gpu_check is observe-only: it never calls {name}")


# --- phases: the GPU idle, or running a kernel --------------------------------------------------
@dataclass(frozen=True)
class Phase:
    """A state of the GPU while a section samples it, and how device time passes in it."""

    name: str  # "idle" or "load"
    wait: Callable[[float], None]  # let this many seconds of device time pass
    detail: str  # what the GPU is doing, for the summary
    alive: Callable[[], bool] = lambda: True  # False once a load has stopped early


def idle_phase(device: Device) -> Phase:
    """The GPU with nothing to do: waits sleep on hardware and advance the sim's clock."""
    return Phase("idle", device.idle, "nothing running")


@contextlib.contextmanager
def simulated_load(device: Device, workload: str) -> Iterator[Phase]:
    """A kernel on the simulated GPU: each wait runs modelled calls back to back.

    The calls are modelled at the ``gpu`` preset whatever ``--preset`` says, as a sweep's
    ``workload.sim_size`` does (milliseconds each: a tiny kernel would take thousands of state
    updates per simulated second).
    """
    from kernels import get_spec

    preset = SIM_LOAD_PRESET
    spec = get_spec(workload)
    counts = spec.counts(preset=preset, dtype="float32")
    work = KernelWork(
        flops=float(counts.flops), bytes_moved=float(counts.bytes_moved),
        peak=spec.peak("float32"), kernel_class=workload, framework="jax",
    )

    def wait(seconds: float) -> None:
        end_s = device.now_s() + seconds
        while device.now_s() < end_s:
            device.on_kernel_call(work)

    yield Phase("load", wait, f"simulated {workload} calls ({preset} preset), back to back")


@contextlib.contextmanager
def kernel_load(device: Device, cfg: CheckConfig, timeout_s: float) -> Iterator[Phase]:
    """A JAX kernel looping in a subprocess on this GPU (picked by UUID) while the phase lasts.

    Raises:
        RuntimeError: the load did not start within ``timeout_s`` (the message has its log).
    """
    log_path = cfg.out_dir / "load.log"
    cmd = [
        sys.executable, str(Path(__file__).resolve()), "--load-worker", cfg.load_workload,
        "--preset", cfg.preset, "--load-seconds", str(int(timeout_s + 120)),
    ]
    env = subprocess_env()
    env["CUDA_VISIBLE_DEVICES"] = device.identity.uuid  # CUDA takes UUIDs: never by position
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=log, bufsize=0, env=env, cwd=REPO,
            start_new_session=True,
        )
        try:
            _await_ready(proc, timeout_s, log_path)
            time.sleep(cfg.load_ramp_s)  # let clocks and power reach the load's level
            yield Phase(
                "load", time.sleep,
                f"JAX {cfg.load_workload} ({cfg.preset} preset) looping in pid {proc.pid}",
                alive=lambda: proc.poll() is None,
            )
        finally:
            stop_process(proc)


def _await_ready(proc: subprocess.Popen[bytes], timeout_s: float, log_path: Path) -> None:
    """Wait for the load worker's "ready" line (it prints it after compiling and one call).

    Reads the pipe unbuffered, so a line already read is never left waiting in a buffer.
    """
    assert proc.stdout is not None
    fd, seen = proc.stdout.fileno(), b""
    deadline = time.monotonic() + timeout_s
    # poll(2), not select(2): select refuses a descriptor numbered 1024 or more, which a long-lived
    # process (a test session, a notebook) can hand out.
    with selectors.PollSelector() as watch:
        watch.register(fd, selectors.EVENT_READ)
        while (left := deadline - time.monotonic()) > 0:
            if not watch.select(left):
                break
            chunk = os.read(fd, 4096)
            seen += chunk
            if b"ready" in seen.splitlines():
                return
            if not chunk:  # EOF: the worker ended
                proc.wait(timeout=5)
                raise RuntimeError(
                    f"the load exited {proc.returncode} before it ran: {_tail(log_path, 400)}"
                )
    raise RuntimeError(f"the load did not start within {timeout_s:.0f} s: {_tail(log_path, 400)}")


def run_load_worker(workload: str, preset: str, seconds: float) -> int:
    """The load subprocess: build one JAX kernel, say "ready", call it until ``seconds`` pass."""
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    from kernels import build_kernel

    kernel = build_kernel(workload, "jax", preset=preset)
    kernel.call_device()
    print("ready", flush=True)
    end_s = time.monotonic() + seconds
    while time.monotonic() < end_s:
        kernel.call_device()
    return 0


# --- measurements over a device -----------------------------------------------------------------
def interval_stats(values_s: list[float]) -> dict[str, float] | None:
    """Median, min and max of some intervals in s; None when there are none."""
    if not values_s:
        return None
    return {
        "median_s": statistics.median(values_s), "min_s": min(values_s), "max_s": max(values_s),
        "count": len(values_s),
    }


def measure_counter_period(device: Device, phase: Phase, duration_s: float, poll_s: float) -> dict:
    """Poll the energy counter every ``poll_s`` for ``duration_s`` and time its updates.

    Returns:
        ``updates`` (changes seen), ``interval_s`` (stats of the time between changes: the
        update period, resolved to one poll), ``polls``, ``mean_poll_s`` and ``counter_power_w``
        (energy between the first and last update over their time apart).
    """
    start_s = now_s = device.now_s()
    last_mj = device.energy_mj()
    changes: list[tuple[float, int]] = []
    polls = 0
    while now_s - start_s < duration_s:
        phase.wait(poll_s)
        energy_mj = device.energy_mj()
        now_s = device.now_s()
        polls += 1
        if energy_mj != last_mj:
            changes.append((now_s, energy_mj))
            last_mj = energy_mj
    intervals = [b[0] - a[0] for a, b in zip(changes, changes[1:])]
    power_w = None
    if len(changes) >= 2 and changes[-1][0] > changes[0][0]:
        power_w = (changes[-1][1] - changes[0][1]) / (changes[-1][0] - changes[0][0]) / 1000.0
    return {
        "phase": phase.name, "detail": phase.detail, "duration_s": now_s - start_s,
        "poll_s": poll_s, "polls": polls, "mean_poll_s": (now_s - start_s) / max(polls, 1),
        "updates": len(changes), "interval_s": interval_stats(intervals),
        "counter_power_w": power_w,
    }


def sample_power(
    device: Device, phase: Phase, duration_s: float, rate_hz: float, *, after_step: bool = False
) -> dict:
    """Sample every power reading at ``rate_hz`` for ``duration_s``; how each moves.

    Returns:
        Per reading (``usage``, ``instant``, ``average``): ``supported``, ``samples``, mean/min/max
        W, ``changes`` and ``update_interval_s`` (stats of the time between changes, resolved to
        one sample interval); with ``after_step`` (the power has just stepped, at the start),
        ``settle_s`` and ``semantics`` too (see ``settle_s``).
    """
    interval_s = 1.0 / rate_hz
    samples: dict[str, list[tuple[float, int]]] = {}
    start_s = now_s = device.now_s()
    next_s, count = start_s, 0
    while now_s - start_s < duration_s:
        readings = device.power_readings_mw()
        now_s = device.now_s()
        count += 1
        for key, value_mw in readings.items():
            samples.setdefault(key, [])
            if value_mw is not None:
                samples[key].append((now_s, value_mw))
        next_s += interval_s
        phase.wait(max(0.0, next_s - device.now_s()))
        now_s = device.now_s()
    return {
        "phase": phase.name, "detail": phase.detail, "duration_s": now_s - start_s,
        "rate_hz": rate_hz, "samples": count, "sample_interval_s": (now_s - start_s) / count,
        "readings": {
            key: _describe_series(series, start_s if after_step else None)
            for key, series in samples.items()
        },
    }


INSTANT_SETTLE_S = 0.3  # a reading that settles after a step faster than this is instantaneous


def settle_s(series: list[tuple[float, int]], start_s: float) -> float | None:
    """How long after ``start_s`` a reading came to stay within 10% of the step it made (from
    its first to its last value); None when it did not move by 5% of its first value."""
    if len(series) < 2:
        return None
    first, last = series[0][1], series[-1][1]
    if abs(first - last) < 0.05 * max(abs(first), 1):
        return None
    band = 0.1 * abs(first - last)
    settled_at = series[-1][0]
    for t_s, value in reversed(series):
        if abs(value - last) > band:
            break
        settled_at = t_s
    return settled_at - start_s


def _describe_series(series: list[tuple[float, int]], step_at_s: float | None = None) -> dict:
    """What one power reading did over a sampling run (values in mW in, W out); after a step
    at ``step_at_s``, also how long it took to settle and what that says it is."""
    if not series:
        return {"supported": False}
    watts = [v / 1000.0 for _, v in series]
    change_s = [t for (t, v), (_, prev) in zip(series[1:], series) if v != prev]
    described = {
        "supported": True, "samples": len(series), "mean_w": statistics.fmean(watts),
        "min_w": min(watts), "max_w": max(watts), "changes": len(change_s),
        "update_interval_s": interval_stats([b - a for a, b in zip(change_s, change_s[1:])]),
    }
    if step_at_s is not None:
        settled = settle_s(series, step_at_s)
        described["settle_s"] = settled
        described["semantics"] = (
            None if settled is None
            else "instant" if settled <= INSTANT_SETTLE_S else f"average (~{settled:.1f} s)"
        )
    return described


def read_identity(device: Device) -> dict:
    """NVML identity, what may be set (read, never set) and one reading of every sensor."""
    ident, caps, settings = device.identity, device.capabilities(), device.settings()
    sm_mhz = caps.supported_sm_clocks_mhz()
    return {
        "index": ident.index, "name": ident.name, "uuid": ident.uuid,
        "pci_bus_id": ident.pci_bus_id, "driver_version": ident.driver_version,
        "architecture": ident.architecture, "backend": ident.backend,
        "mem_clocks_mhz": sorted(caps.mem_clocks_mhz),
        "sm_clocks_count": len(sm_mhz),
        "sm_clock_range_mhz": [sm_mhz[0], sm_mhz[-1]] if sm_mhz else None,
        "power_limit_min_w": caps.power_limit_min_w, "power_limit_max_w": caps.power_limit_max_w,
        "power_limit_default_w": caps.power_limit_default_w,
        "power_limit_w": settings.power_limit_w,
        "clock_offset_range_mhz": caps.clock_offset_range_mhz,
        "has_energy_counter": caps.has_energy_counter,
        "power_sensing": None if caps.power_sensing is None else {
            "instant_reading": caps.power_sensing.reading,
            "period_s": caps.power_sensing.period_s, "window_s": caps.power_sensing.window_s,
            "note": caps.power_sensing.note,
        },
        "temperature_c": device.temperature_c(), "sm_clock_mhz": device.sm_clock_mhz(),
        "mem_clock_mhz": device.mem_clock_mhz(),
        "clock_event_reasons": device.clock_event_reasons().names(),
    }


def telemetry_sections(
    device: Device, load: Callable[[], contextlib.AbstractContextManager[Phase]], cfg: CheckConfig
) -> dict[str, dict]:
    """The energy-counter and power sections: every one idle first, then all under one load.

    Returns:
        Per section asked for: ``{"phases": {phase: result}, "problems": [...]}``.
    """
    measures = {
        "energy_counter": lambda ph: measure_counter_period(device, ph, cfg.counter_s, cfg.poll_s),
        "power": lambda ph: sample_power(device, ph, cfg.power_s, cfg.power_hz),
    }
    measures = {name: fn for name, fn in measures.items() if name in cfg.sections}
    results: dict[str, dict] = {name: {"phases": {}, "problems": []} for name in measures}

    def measure_in(phase: Phase) -> None:
        for name, measure in measures.items():
            try:
                results[name]["phases"][phase.name] = measure(phase)
            except Exception as e:  # noqa: BLE001 - one failed measurement, the others go on
                results[name]["problems"].append(f"{phase.name}: {describe(e)}")
            if not phase.alive():
                results[name]["problems"].append(f"{phase.name}: the load stopped early")

    if not measures:
        return results
    measure_in(idle_phase(device))
    try:
        with load() as phase:
            measure_in(phase)
    except Exception as e:  # noqa: BLE001 - no load: the idle figures stand
        for result in results.values():
            result["problems"].append(f"load: {describe(e)}")
        return results
    if "power" in results:  # the load has just stopped: how fast each reading follows the step
        after = Phase("after_load", device.idle, "the load just ended: power falls to idle")
        try:
            results["power"]["phases"][after.name] = sample_power(
                device, after, cfg.power_s, cfg.power_hz, after_step=True
            )
        except Exception as e:  # noqa: BLE001 - the other phases stand
            results["power"]["problems"].append(f"{after.name}: {describe(e)}")
    return results


# --- subprocess sections -----------------------------------------------------------------------
@dataclass(frozen=True)
class ProcessResult:
    """How a bounded subprocess ended."""

    returncode: int  # its exit status (negative: ended by that signal)
    timed_out: bool
    elapsed_s: float
    log: str  # path of its output


def subprocess_env() -> dict[str, str]:
    """The environment for our subprocesses: this checkout first on the path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


def stop_process(proc: subprocess.Popen[Any]) -> None:
    """SIGTERM (``dvfs sweep`` restores and exits 143 on it), then SIGKILL to its group."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=GRACE_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: only what it started
        proc.wait()


def run_bounded(
    cmd: list[str], timeout_s: float, log_path: Path, env: dict[str, str]
) -> ProcessResult:
    """Run ``cmd`` with its output in ``log_path``, stopped once ``timeout_s`` has passed."""
    start = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO, start_new_session=True
        )
        try:
            proc.wait(timeout=max(1.0, timeout_s))
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
            stop_process(proc)
    return ProcessResult(proc.returncode, timed_out, time.monotonic() - start, str(log_path))


def _tail(path: Path | str, chars: int) -> str:
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return ""
    return " | ".join(line for line in text[-chars:].splitlines() if line.strip())


def sweep_overrides(cfg: CheckConfig) -> list[str]:
    """The device part of the sweep's command line: observe-only, on this GPU or the sim."""
    if cfg.device == "sim":
        device = [
            "device=sim", f"device.state_dir={cfg.out_dir / 'sweep-sim'}",
            f"device.profile={cfg.sim_profile}",
        ]
        if cfg.sim_energy_update_period_s is not None:
            device.append(f"device.energy_update_period_s={cfg.sim_energy_update_period_s}")
    else:
        device = ["device=nvml", f"device.gpus=['{cfg.gpu}']"]  # quoted: a PCI id has colons
    return [*device, "device.observe_only=true"]


def run_sweep(cfg: CheckConfig, timeout_s: float) -> dict:
    """Every workload x framework through ``dvfs sweep``, observe-only; its rows, summarised."""
    sweep_dir = cfg.out_dir / "sweep"
    cmd = [
        sys.executable, "-m", "orchestrator.cli", "sweep", "-m", *sweep_overrides(cfg),
        "hydra/launcher=basic",  # one GPU, one process: no Ray to start (nor to install)
        f"workload={','.join(cfg.workloads)}", f"framework={','.join(cfg.frameworks)}",
        f"workload.size={cfg.preset}", "measure.window_s=1.0", "measure.repeats=1",
        "measure.settle_s=0.2", "measure.warmup_iters=2", f"hydra.sweep.dir={sweep_dir}",
    ]
    result = run_bounded(cmd, timeout_s, cfg.out_dir / "sweep.log", subprocess_env())
    rows = read_rows(sweep_dir)
    expected = len(cfg.workloads) * len(cfg.frameworks)
    problems = []
    if result.timed_out:
        problems.append(f"dvfs sweep ran past its {timeout_s:.0f} s and was stopped")
    elif result.returncode != 0:
        problems.append(f"dvfs sweep exited {result.returncode}: {_tail(result.log, 300)}")
    if len(rows) < expected:
        problems.append(f"{len(rows)} of {expected} trials stored")
    return {
        "command": cmd, "sweep_dir": str(sweep_dir), "log": result.log,
        "returncode": result.returncode, "timed_out": result.timed_out,
        "elapsed_s": result.elapsed_s, "expected_trials": expected,
        "statuses": dict(Counter(str(r.get("status")) for r in rows)), "rows": rows,
        "problems": problems,
    }


def read_rows(sweep_dir: Path) -> list[dict]:
    """The stored trials of a sweep directory (every one committed, even after a failure)."""
    from orchestrator.store import ResultStore, find_stores

    if not sweep_dir.exists():
        return []
    rows = []
    for path in find_stores(sweep_dir):
        with ResultStore(path, readonly=True) as store:
            for row in store.iter_rows():
                kept = {k: row.get(k) for k in ROW_FIELDS}
                kept.update({k: v for k, v in row.items() if k.startswith("energy_counter")})
                rows.append(kept)
    return sorted(rows, key=lambda r: (str(r["workload"]), str(r["framework"])))


def run_window_bench(cfg: CheckConfig, timeout_s: float, script: Path | None = None) -> dict:
    """``scripts/bench_window.py`` on this GPU: trial vs bare time per iteration, per pair.

    One round of one-second windows per pair, to fit the run's budget. Its exit code 1 (a pair
    over its 1.03 target) is a finding, shown in the rows, not a failure of this section. If it
    is stopped before it writes its JSON, the ratios it printed per pair are kept.

    Raises:
        FileNotFoundError: the script is not in this checkout.
        RuntimeError: it measured no pair (the message has the end of its log).
    """
    script = script or REPO / "scripts" / "bench_window.py"
    if not script.exists():
        raise FileNotFoundError(f"{script.name} is not in this checkout ({script})")
    json_path = cfg.out_dir / "bench_window.json"
    json_path.unlink(missing_ok=True)
    cmd = [
        sys.executable, str(script), "--device", cfg.device, "--preset", cfg.preset,
        "--window-s", "1", "--rounds", "1", "--json", str(json_path),
        "--frameworks", *cfg.frameworks,
    ]
    result = run_bounded(cmd, timeout_s, cfg.out_dir / "bench_window.log", subprocess_env())
    if json_path.exists():
        rows = json.loads(json_path.read_text())
    else:
        rows = _printed_ratios(Path(result.log))
    if not rows:
        how = "ran past its budget" if result.timed_out else f"exited {result.returncode}"
        raise RuntimeError(f"{script.name} {how} and measured no pair: {_tail(result.log, 300)}")
    problems = []
    if result.timed_out:
        problems.append(f"{script.name} ran past its {timeout_s:.0f} s and was stopped")
    elif result.returncode not in (0, 1):
        problems.append(f"{script.name} exited {result.returncode}: {_tail(result.log, 300)}")
    problems += [
        f"{r.get('workload')}/{r.get('framework')}: {r['error']}" for r in rows if "error" in r
    ]
    ratios = [r["ratio"] for r in rows if isinstance(r.get("ratio"), (int, float))]
    return {
        "command": cmd, "log": result.log, "returncode": result.returncode,
        "elapsed_s": result.elapsed_s, "rows": rows,
        "max_ratio": max(ratios) if ratios else None, "problems": problems,
    }


def _printed_ratios(log_path: Path) -> list[dict]:
    """The ``workload/framework: ratio R`` lines bench_window.py prints as each pair ends."""
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        return []
    found = re.findall(r"^(\w+)/(\w+): ratio ([0-9.]+)$", text, flags=re.MULTILINE)
    return [{"workload": w, "framework": f, "ratio": float(r)} for w, f, r in found]


# --- running sections -------------------------------------------------------------------------
@dataclass
class CheckConfig:
    """What to check and how long each part may take."""

    out_dir: Path
    device: str = "nvml"  # "nvml" (a real GPU) or "sim"
    gpu: str = "0"  # NVML index, UUID or PCI bus id
    sections: tuple[str, ...] = SECTIONS
    preset: str = "gpu"  # kernel size preset for the load, the sweep and the bench
    counter_s: float = 2.5  # energy-counter polling per phase
    poll_s: float = 0.001
    power_s: float = 2.0  # power sampling per phase
    power_hz: float = 100.0
    load_workload: str = "gemm"
    load_start_s: float = 60.0  # the load's import, compile and first call
    load_ramp_s: float = 1.0  # running before the load phase's measurements start
    sweep_s: float = 150.0
    window_s: float = 100.0
    workloads: tuple[str, ...] = WORKLOADS
    frameworks: tuple[str, ...] = FRAMEWORKS
    sim_profile: str = "a100_sxm4_40gb"
    sim_state_dir: Path | None = None  # default: <out_dir>/sim
    sim_energy_update_period_s: float | None = None  # None: the sim's default
    total_s: float = TOTAL_BUDGET_S
    started: float = field(default_factory=time.monotonic)

    def budget_s(self, want_s: float) -> float:
        """``want_s``, or what is left of the whole run's budget if that is less."""
        return max(0.0, min(want_s, self.total_s - (time.monotonic() - self.started)))


def describe(e: BaseException) -> str:
    """One line: the exception's type and message."""
    return f"{type(e).__name__}: {e}"


def section_result(data: dict, elapsed_s: float) -> dict:
    """A section that ran. Its data may carry ``problems`` (caveats): then it is ``partial``,
    or ``failed`` if it measured nothing (no ``phases``, no ``rows``)."""
    data = dict(data)
    problems = list(data.pop("problems", []))
    measured = bool(data.get("phases") or data.get("rows"))
    status = "ok" if not problems else ("partial" if measured else "failed")
    return {
        "status": status, "elapsed_s": elapsed_s,
        "error": "; ".join(problems) if status == "failed" else None,
        "problems": problems, "data": data,
    }


def failed_section(error: BaseException, elapsed_s: float) -> dict:
    """A section that raised: how, and where."""
    trace = "".join(traceback.format_exception(error, limit=8))
    return {
        "status": "failed", "elapsed_s": elapsed_s, "error": describe(error),
        "traceback": trace, "data": None,
    }


def run_section(fn: Callable[[], dict]) -> dict:
    """Run one section; its result, never its exception (a failed section is a result)."""
    start = time.monotonic()
    try:
        data = fn()
    except Exception as e:  # noqa: BLE001 - one section's failure stops no other
        return failed_section(e, time.monotonic() - start)
    return section_result(data, time.monotonic() - start)


def skipped(reason: str) -> dict:
    """A section that did not run, and why."""
    return {"status": "skipped", "elapsed_s": 0.0, "error": reason, "data": None}


def run_check(device: Device, cfg: CheckConfig) -> dict[str, dict]:
    """Every section asked for, in order, each within its budget; one result per section."""
    device = ObserveOnlyDevice(device)  # type: ignore[assignment]  # a Device's reads only
    results: dict[str, dict] = {}
    if "identity" in cfg.sections:
        results["identity"] = run_section(lambda: read_identity(device))

    def load() -> contextlib.AbstractContextManager[Phase]:
        if device.identity.backend == "sim":
            return simulated_load(device, cfg.load_workload)
        return kernel_load(device, cfg, cfg.budget_s(cfg.load_start_s))

    # The counter and power sections share their phases (and the one load): both are timed
    # together, and each gets the block's elapsed time.
    start = time.monotonic()
    try:
        telemetry: dict[str, dict | Exception] = dict(telemetry_sections(device, load, cfg))
    except Exception as e:  # noqa: BLE001 - the idle phase itself broke: both sections say so
        telemetry = {name: e for name in ("energy_counter", "power") if name in cfg.sections}
    for name, part in telemetry.items():
        elapsed_s = time.monotonic() - start
        results[name] = (
            failed_section(part, elapsed_s) if isinstance(part, Exception)
            else section_result(part, elapsed_s)
        )
    for name, want_s, fn in (
        ("sweep", cfg.sweep_s, run_sweep),
        ("window_overhead", cfg.window_s, run_window_bench),
    ):
        if name not in cfg.sections:
            continue
        budget = cfg.budget_s(want_s) - GRACE_S
        if name == "window_overhead" and cfg.device == "sim":
            results[name] = skipped("bench_window.py offers no sim (virtual time hides host work)")
        elif budget < 10:
            results[name] = skipped(f"no time left in the run's {cfg.total_s:.0f} s budget")
        else:
            results[name] = run_section(lambda fn=fn, budget=budget: fn(cfg, budget))
    for name in SECTIONS:
        results.setdefault(name, skipped("not asked for (--sections)"))
    return {name: results[name] for name in SECTIONS}


# --- the summary --------------------------------------------------------------------------------
def _clean(value: Any) -> Any:
    """JSON-safe: non-finite floats become None, tuples lists, other objects text."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if value is None or isinstance(value, (str, int, bool)):
        return value
    return str(value)


def _fmt(value: Any, scale: float = 1.0, digits: int = 4) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)):
        return f"{value * scale:.{digits}g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(_fmt(v) for v in value) or "-"
    return str(value).replace("|", "/").replace("\n", " ")


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_fmt(c) for c in row) + " |" for row in rows]
    return lines


def _ms(stats: dict | None, key: str) -> str:
    return "-" if not stats else _fmt(stats[key], 1000.0)


def render_identity(data: dict) -> list[str]:
    """The identity section as a Markdown table, one row per field."""
    return _table(["field", "value"], [[k, v] for k, v in data.items()])


def render_energy_counter(data: dict) -> list[str]:
    """The energy-counter section as a Markdown table: one row per phase, intervals in ms.

    Each row: what ran, how often the counter updated (median, min and max interval), how often
    and how fast it was polled, and the mean power the counter implies in watts.
    """
    rows = [
        [name, p["detail"], p["updates"], _ms(p["interval_s"], "median_s"),
         _ms(p["interval_s"], "min_s"), _ms(p["interval_s"], "max_s"), p["polls"],
         _fmt(p["mean_poll_s"], 1000.0), p["counter_power_w"]]
        for name, p in data["phases"].items()
    ]
    return _table(
        ["phase", "running", "updates", "median interval ms", "min ms", "max ms", "polls",
         "mean poll ms", "counter power W"], rows,
    )


def render_power(data: dict) -> list[str]:
    """The power section as a Markdown table: one row per phase and reading, in watts.

    Each row: samples, mean/min/max, how often it changed and its median update interval in ms,
    and (after the load) how long it took to settle; then the sample interval of each phase.
    """
    rows = []
    for name, p in data["phases"].items():
        for key, r in p["readings"].items():
            if not r["supported"]:
                rows.append([name, key, "not supported", "-", "-", "-", "-", "-", "-"])
                continue
            period = _ms(r["update_interval_s"], "median_s") if r["changes"] else "never changed"
            settle = "-"
            if "settle_s" in r:
                settle = "no step" if r["settle_s"] is None else (
                    f"{_fmt(r['settle_s'], 1000.0)} ({r['semantics']})"
                )
            rows.append([
                name, key, r["samples"], r["mean_w"], r["min_w"], r["max_w"], r["changes"], period,
                settle,
            ])
    lines = _table(
        ["phase", "reading", "samples", "mean W", "min W", "max W", "changes",
         "median update interval ms", "settle ms after the load"], rows,
    )
    rates = ", ".join(
        f"{name}: {_fmt(p['sample_interval_s'], 1000.0)} ms" for name, p in data["phases"].items()
    )
    return [*lines, "", f"Sample interval (the update period's resolution): {rates}."]


def render_sweep(data: dict) -> list[str]:
    """The sweep section: how many trials were stored, then a Markdown table of every row."""
    rows = [
        [r["workload"], r["framework"], r["status"], _fmt(r["time_per_iter_s"], 1000.0),
         r["tflops"], r["gbps"], r["energy_per_iter_j"], r["avg_power_w"], r["rel_error"],
         r["determinism_mismatches"], r["invalid_reason"] or r["valid"], r["error"]]
        for r in data["rows"]
    ]
    lines = _table(
        ["workload", "framework", "status", "time/iter ms", "TFLOP/s", "GB/s", "J/iter",
         "mean W", "rel. error", "mismatches", "valid", "error"], rows,
    )
    head = (
        f"{len(data['rows'])} of {data['expected_trials']} trials stored in "
        f"`{data['sweep_dir']}` (exit {data['returncode']}, {data['elapsed_s']:.0f} s; "
        f"log `{data['log']}`)."
    )
    return [head, "", *lines]


def render_window_overhead(data: dict) -> list[str]:
    """The window-overhead section: the largest trial/bare ratio, then every pair's."""
    keys = ["workload", "framework", "trial_s_per_iter", "bare_s_per_iter", "ratio",
            "host_digest_ratio", "error"]
    lines = _table(keys, [[r.get(k) for k in keys] for r in data["rows"]])
    return [f"Largest ratio: {_fmt(data['max_ratio'])} (log `{data['log']}`).", "", *lines]


RENDERERS: dict[str, Callable[[dict], list[str]]] = {
    "identity": render_identity,
    "energy_counter": render_energy_counter,
    "power": render_power,
    "sweep": render_sweep,
    "window_overhead": render_window_overhead,
}
TITLES = {
    "identity": "NVML identity",
    "energy_counter": "Energy counter update period",
    "power": "Power readings (usage, instant, average)",
    "sweep": "Workloads (dvfs sweep, observe-only)",
    "window_overhead": "Window overhead (scripts/bench_window.py)",
}


def render_markdown(report: dict) -> str:
    """The summary as Markdown; a section that failed, or fails to render, says so in place."""
    dev = report.get("device", {})
    lines = [f"# GPU check: {dev.get('name', '?')} ({dev.get('uuid', '?')})", ""]
    if dev.get("backend") == "sim":
        sim = dev.get("sim") or {}
        lines += [
            f"> Simulated GPU (profile `{sim.get('profile')}`, energy counter period "
            f"{_fmt(sim.get('energy_update_period_s'))} s as configured): every figure below "
            "comes from the sim's model, not from hardware.", "",
        ]
    lines += [
        f"Observe-only: nothing was set. Host `{report.get('host')}`, started "
        f"{report.get('started_at')}, {_fmt(report.get('elapsed_s'))} s in all.", "",
    ]
    for name, section in report["sections"].items():
        lines += [f"## {TITLES.get(name, name)}: {section['status']}", ""]
        if section["status"] in ("failed", "skipped"):
            lines += [f"**{section['status']}**: {_fmt(section.get('error'))}", ""]
            continue
        for problem in section.get("problems") or []:
            lines.append(f"- problem: {_fmt(problem)}")
        try:
            body = RENDERERS[name](section["data"])
        except Exception as e:  # noqa: BLE001 - one bad section never hides the others
            body = [f"**failed to render** ({describe(e)}); the JSON summary has its data."]
        lines += [*body, ""]
    return "\n".join(lines).rstrip() + "\n"


def write_summary(report: dict, out_dir: Path) -> tuple[Path, Path]:
    """Write ``gpu_check.json`` and ``gpu_check.md`` into ``out_dir``; return both paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out_dir / "gpu_check.json", out_dir / "gpu_check.md"
    clean = _clean(report)
    json_path.write_text(json.dumps(clean, indent=2) + "\n")
    md_path.write_text(render_markdown(clean))
    return json_path, md_path


# --- main -------------------------------------------------------------------------------------
class NoGpu(Exception):
    """This machine has no NVIDIA GPU NVML can see."""


def open_device(cfg: CheckConfig) -> tuple[Any, Device, dict | None]:
    """The backend, the one device to check, and on the sim what it was built with.

    Raises:
        NoGpu: no NVIDIA driver or library, or NVML sees no GPU.
        DvfsError: NVML failed otherwise, or ``--gpu`` names no GPU.
    """
    if cfg.device == "sim":
        from orchestrator.devices.sim.nvml import counter_period_s
        from orchestrator.devices.sim.state import Machine

        state_dir = cfg.sim_state_dir or cfg.out_dir / "sim"
        sim: dict[str, Any] = {
            "backend": "sim", "profile": cfg.sim_profile, "count": 1, "state_dir": str(state_dir),
        }
        if cfg.sim_energy_update_period_s is not None:
            sim["energy_update_period_s"] = cfg.sim_energy_update_period_s
        backend = open_backend(sim)
        planted = {  # what the sim was built with, for the summary's first lines
            "profile": cfg.sim_profile, "state_dir": str(state_dir),
            "energy_update_period_s": counter_period_s(Machine(state_dir), 0),
        }
        return backend, backend.device(0), planted
    try:
        backend = open_backend({"backend": "nvml"})
    except DeviceNotFoundError as e:
        cause = e.__cause__ or e
        raise NoGpu(f"no NVIDIA GPU here (NVML: {cause}); nothing to check") from e
    if backend.count() == 0:
        backend.close()
        raise NoGpu("no NVIDIA GPU here (NVML sees none); nothing to check")
    try:
        return backend, select_devices(backend, [cfg.gpu])[0], None
    except BaseException:
        backend.close()
        raise


def _versions() -> dict[str, str | None]:
    from importlib import metadata

    out: dict[str, str | None] = {"python": platform.python_version()}
    for dist in ("nvidia-ml-py", "jax", "jaxlib", "tensorflow", "tensorflow-cpu"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[dist] = metadata.version(dist)
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line, parsed (the hidden ``--load-worker`` is the load subprocess's)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], prog="gpu_check.py")
    p.add_argument("--out", type=Path, default=Path("gpu_check"), help="output dir (gpu_check/)")
    p.add_argument("--device", choices=("nvml", "sim"), default="nvml")
    p.add_argument("--gpu", default="0", help="NVML index, UUID or PCI bus id (default 0)")
    p.add_argument("--sections", help=f"comma-separated, of: {','.join(SECTIONS)} (or all)")
    p.add_argument("--preset", default="gpu", help="kernel size preset (default gpu)")
    p.add_argument("--workloads", default=",".join(WORKLOADS), help="workloads of the sweep")
    p.add_argument("--frameworks", default=",".join(FRAMEWORKS), help="frameworks of the sweep")
    p.add_argument("--counter-s", type=float, default=2.5, help="counter polling per phase")
    p.add_argument("--poll-ms", type=float, default=1.0, help="counter poll interval")
    p.add_argument("--power-s", type=float, default=2.0, help="power sampling per phase")
    p.add_argument("--power-hz", type=float, default=100.0, help="power sampling rate")
    p.add_argument("--sweep-timeout-s", type=float, default=150.0)
    p.add_argument("--bench-timeout-s", type=float, default=100.0)
    p.add_argument("--sim-profile", default="a100_sxm4_40gb")
    p.add_argument("--sim-state-dir", type=Path, help="the sim's state (default <out>/sim)")
    p.add_argument("--sim-energy-update-period-s", type=float,
                   help="the sim's energy counter period (device.energy_update_period_s)")
    p.add_argument("--load-worker", metavar="WORKLOAD", help=argparse.SUPPRESS)
    p.add_argument("--load-seconds", type=float, default=180.0, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def config_from(args: argparse.Namespace) -> CheckConfig:
    """The run's configuration from the command line."""
    if args.sections in (None, ""):
        sections = SIM_SECTIONS if args.device == "sim" else SECTIONS
    elif args.sections == "all":
        sections = SECTIONS
    else:
        sections = tuple(s.strip() for s in args.sections.split(",") if s.strip())
        unknown = sorted(set(sections) - set(SECTIONS))
        if unknown:
            raise SystemExit(f"gpu_check: unknown section(s) {unknown}; choose from {SECTIONS}")
    return CheckConfig(
        out_dir=args.out.resolve(), device=args.device, gpu=str(args.gpu), sections=sections,
        preset=args.preset, counter_s=args.counter_s, poll_s=args.poll_ms / 1000.0,
        power_s=args.power_s, power_hz=args.power_hz, sweep_s=args.sweep_timeout_s,
        window_s=args.bench_timeout_s, workloads=tuple(args.workloads.split(",")),
        frameworks=tuple(args.frameworks.split(",")), sim_profile=args.sim_profile,
        sim_state_dir=args.sim_state_dir,
        sim_energy_update_period_s=args.sim_energy_update_period_s,
    )


def main(argv: list[str] | None = None) -> int:
    """Run the check; 0 when every section ran (ok, partial or skipped), 1 when one failed."""
    args = parse_args(argv)
    if args.load_worker:
        return run_load_worker(args.load_worker, args.preset, args.load_seconds)
    cfg = config_from(args)
    try:
        backend, device, sim = open_device(cfg)
    except NoGpu as e:
        print(f"gpu_check: {e}")
        return 0
    except DvfsError as e:
        print(f"gpu_check: error: {e}", file=sys.stderr)
        return int(getattr(e, "exit_code", 1))
    started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    try:
        sections = run_check(device, cfg)
    finally:
        device.close()
        backend.close()
    ident = device.identity
    report = {
        "tool": "scripts/gpu_check.py", "observe_only": True, "started_at": started_at,
        "elapsed_s": time.monotonic() - cfg.started, "host": platform.node(),
        "versions": _versions(), "git_commit": git_commit(),
        "device": {
            "backend": ident.backend, "name": ident.name, "uuid": ident.uuid,
            "selector": cfg.gpu if cfg.device == "nvml" else None, "sim": sim,
        },
        "sections": sections,
    }
    json_path, md_path = write_summary(report, cfg.out_dir)
    print("gpu_check: " + ", ".join(f"{n} {s['status']}" for n, s in sections.items()))
    print(f"gpu_check: summary in {md_path} and {json_path}")
    return 1 if any(s["status"] == "failed" for s in sections.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
