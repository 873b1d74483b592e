"""Fault injection, for tests and chaos runs on the simulated GPU only.

``device.inject`` makes one kernel call of a trial misbehave the way real hardware and drivers do,
so that the launcher's failure handling can be exercised on the sim::

    device.inject={hang_s: 30, at_call: 5, gpu: 1}          # a hung kernel (-> `timeout`)
    device.inject={exit_process: true, at_call: 2, gpu: 0}  # SIGKILL of the worker (-> `crash`)
    device.inject={raise_error: boom}                       # a kernel that raised (-> `crash`)
    device.inject={lose_gpu: true, at_call: 3, gpu: 2}      # GPU 2 falls off the bus (-> retired)
    device.inject={pause_s: 60, gpu: 1}                     # a minute before the first call
    device.inject={slow_s: 0.02, times: null}               # every call 20 ms slower

Keys:

- ``at_call`` (default 1): which kernel call of the trial misbehaves, counting warm-up calls from 1.
- ``gpu`` (default: any): the GPU it happens on, by NVML index or UUID.
- ``workload`` (default: any): only trials of this workload.
- ``times`` (default 1): how many trials it hits on each GPU in one sweep; ``null``: every trial.
  The count is kept on disk in the simulated machine's state directory, so a worker that was
  killed by the fault and replaced does not fire it again.
- one action: ``hang_s`` (sleep this many seconds inside the call), ``exit_process`` (the worker
  sends itself SIGKILL: what a segfault or the OOM killer does), ``raise_error`` (the call raises
  :class:`InjectedFault` with this message), ``lose_gpu`` (the simulated GPU falls off the bus
  inside the call: NVML answers ``GPU_IS_LOST`` until it is brought back) or ``pause_s`` (the
  trial waits this many seconds before its first kernel call, as a slow compile would: a window
  in which a worker killed from outside has measured nothing; ``at_call`` does not apply) or
  ``slow_s`` (every kernel call of the trial sleeps this long: a trial that lasts seconds to
  minutes of wall time, as on a real GPU, where the sim's virtual clock makes it short;
  ``at_call`` does not apply).

**Scheduled faults** (``schedule``): a chaos run, from its own process and at a moment of its
choosing, drops one action for one GPU into the simulated machine's state directory; the next
kernel call on that GPU, in whichever worker runs it, takes it and fires it. Nothing in the sweep's
configuration changes, so a resumed sweep is the same sweep.

Faults are armed per trial by whoever runs it (the ``ray_gpus`` launcher's worker, which is the
one that supervises hangs and deaths) and fire from one hook in the trial's kernel call. They are
refused on ``backend=nvml``: nothing here ever runs against a real GPU.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.errors import UserError
from orchestrator.jobs.checks import FAULT_ACTIONS, validate_inject

SIM_STATE_ENV = "DVFS_SIM_STATE_DIR"  # as orchestrator.devices.SIM_STATE_ENV (no import: floor 1)


class InjectedFault(RuntimeError):
    """A kernel call that raised because ``device.inject`` said so."""


@dataclass
class _Plan:
    spec: dict[str, Any]
    at_call: int
    counter: Path | None  # where the fired count lives (None: not persisted)
    calls: int = 0


_armed: dict[str, _Plan] = {}  # device UUID -> the plan of the trial running on it


def arm(spec: Any, device: Any, *, sweep_id: str = "", workload: str | None = None) -> bool:
    """Arm (or clear) the fault for the next trial on ``device``; True if it will fire.

    Args:
        spec: the job's ``device.inject`` as ``jobs.checks.validate_inject`` returned it when
            the job was made (``JobSpec.inject``; None: nothing); not checked again per trial.
        device: the ``Device`` the trial runs on.
        sweep_id: scopes the ``times`` count to one sweep.
        workload: the trial's workload name (for the ``workload`` filter).
    """
    ident = device.identity
    _armed.pop(ident.uuid, None)
    if not spec or ident.backend != "sim":  # any other was refused with the job
        return False
    gpu = spec.get("gpu")
    if gpu is not None and str(gpu) not in (str(ident.index), ident.uuid):
        return False
    if spec.get("workload") is not None and spec["workload"] != workload:
        return False
    counter = _counter_path(spec, ident.uuid, sweep_id)
    times = spec.get("times", 1)
    if times is not None and _fired(counter) >= times:
        return False
    if spec.get("pause_s") is not None:  # before the trial's first call: nothing to arm
        _record_fired(counter)
        time.sleep(float(spec["pause_s"]))
        return False
    _armed[ident.uuid] = _Plan(spec=spec, at_call=int(spec.get("at_call", 1)), counter=counter)
    return True


def disarm(device: Any) -> None:
    """Drop whatever is armed on ``device`` (after its trial)."""
    _armed.pop(device.identity.uuid, None)


def on_kernel_call(device: Any) -> None:
    """The hook at the start of every kernel call (``window.KernelCalls.run``): fires a scheduled
    or an armed fault."""
    ident = device.identity
    if ident.backend == "sim":
        scheduled = _take_scheduled(ident.uuid)
        if scheduled is not None:
            _fire(scheduled, ident.uuid)
    if not _armed:
        return
    plan = _armed.get(ident.uuid)
    if plan is None:
        return
    plan.calls += 1
    if plan.spec.get("slow_s") is not None:  # every call of the trial, counted at its first
        if plan.calls == 1:
            _record_fired(plan.counter)
        time.sleep(float(plan.spec["slow_s"]))
        return
    if plan.calls != plan.at_call:
        return
    _armed.pop(ident.uuid, None)
    _record_fired(plan.counter)  # before acting: a process killed by its own fault still counts
    _fire(plan.spec, ident.uuid)


def _fire(spec: dict[str, Any], uuid: str) -> None:
    if spec.get("hang_s") is not None:
        time.sleep(float(spec["hang_s"]))
    elif spec.get("exit_process"):
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)  # SIGKILL is asynchronous for an instant
    elif spec.get("raise_error") is not None:
        raise InjectedFault(f"injected fault: {spec['raise_error']}")
    elif spec.get("lose_gpu"):
        from orchestrator.devices.sim import nvml as sim  # the sim only: validate_inject said so

        sim.simDeviceSetLost(sim.nvmlDeviceGetHandleByUUID(uuid), True)


# --- scheduled faults (chaos runs) ------------------------------------------------------------
def schedule(state_dir: str | os.PathLike[str], uuid: str, spec: dict[str, Any]) -> Path:
    """Make the next kernel call on one simulated GPU misbehave, from any process, now.

    Args:
        state_dir: the simulated machine's state directory.
        uuid: the GPU.
        spec: one action (``hang_s``, ``exit_process``, ``raise_error`` or ``lose_gpu``).

    Returns:
        The file that holds it until a kernel call takes it.

    Raises:
        UserError: not exactly one action, or another key.
    """
    spec = validate_inject(dict(spec), "sim") or {}
    extra = sorted(set(spec) - set(FAULT_ACTIONS) | ({"pause_s", "slow_s"} & set(spec)))
    if extra:  # pause_s and slow_s belong to a trial; a scheduled fault fires in one call
        raise UserError(f"a scheduled fault is one action; {', '.join(extra)} do not apply")
    path = _scheduled_path(Path(state_dir), uuid)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(spec))
    os.replace(tmp, path)
    return path


def pending(state_dir: str | os.PathLike[str], uuid: str) -> bool:
    """True while a scheduled fault waits for its GPU's next kernel call."""
    return _scheduled_path(Path(state_dir), uuid).exists()


def _scheduled_path(state_dir: Path, uuid: str) -> Path:
    return state_dir / "inject" / f"next-{uuid}.json"


def _take_scheduled(uuid: str) -> dict[str, Any] | None:
    """The fault scheduled for this GPU, if any, taken so that exactly one call fires it."""
    state = os.environ.get(SIM_STATE_ENV)
    if not state:
        return None
    path = _scheduled_path(Path(state), uuid)
    taken = path.with_suffix(f".taken{os.getpid()}")
    try:
        os.rename(path, taken)  # atomic: of two callers, one gets it
    except FileNotFoundError:
        return None
    try:
        return json.loads(taken.read_text())
    finally:
        taken.unlink(missing_ok=True)


def _counter_path(spec: dict[str, Any], uuid: str, sweep_id: str) -> Path | None:
    state = os.environ.get(SIM_STATE_ENV)
    if not state:
        return None
    tag = hashlib.sha1(repr((sweep_id, sorted(spec.items(), key=str))).encode()).hexdigest()[:12]
    return Path(state) / "inject" / f"{tag}-{uuid}.count"


def _fired(counter: Path | None) -> int:
    if counter is None:
        return 0
    try:
        return int(counter.read_text() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def _record_fired(counter: Path | None) -> None:
    if counter is None:
        return
    counter.parent.mkdir(parents=True, exist_ok=True)
    tmp = counter.with_suffix(f".tmp{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(str(_fired(counter) + 1))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, counter)
