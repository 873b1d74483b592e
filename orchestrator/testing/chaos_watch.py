"""What the chaos run (``chaos``) watches: the processes of a sweep, and what each sweep must hold.

Kept apart from the chaos run itself (faults, recovery, the report) so that a test can find a
sweep's processes the same way (``descendants``, ``cmdline``).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# What a failed row's error says when a fault made it (anything else is unexplained).
EXPLAINED = {
    "crash": ("the worker process died", "injected fault"),
    "timeout": ("no result after",),
    "device_error": ("fallen off the bus", "is lost", "GPU_IS_LOST"),
    "not_measured": ("the worker process died", "not run:", "its node was lost"),
}


# --- processes ----------------------------------------------------------------------------------
def _ppids() -> dict[int, int]:
    out = {}
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                out[int(p.name)] = int((p / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    return out


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid``."""
    children = defaultdict(list)
    for child, parent in _ppids().items():
        children[parent].append(child)
    found, todo = set(), [pid]
    while todo:
        for c in children.get(todo.pop(), ()):
            if c not in found:
                found.add(c)
                todo.append(c)
    return found


def cmdline(pid: int) -> str:
    """The command line of ``pid``, its arguments joined by spaces (empty once it has gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def alive(pid: int) -> bool:
    """Whether ``pid`` runs: it exists and is not a zombie (a killed child not yet reaped)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def processes_with_env(key: str, value: str) -> list[int]:
    """Live processes (not this one) whose environment has ``key=value``."""
    needle = f"{key}={value}".encode()
    found = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit() or int(p.name) == os.getpid():
            continue
        try:
            if needle in (p / "environ").read_bytes().split(b"\0") and alive(int(p.name)):
                found.append(int(p.name))
        except OSError:
            pass
    return found


def wait_for(cond: Callable[[], bool], timeout_s: float, every_s: float = 0.2) -> bool:
    """Poll ``cond`` every ``every_s`` seconds for up to ``timeout_s``; whether it came true.

    ``cond`` is asked once more at the deadline, so a late success still counts.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(every_s)
    return cond()


@dataclass
class Driver:
    """One ``dvfs sweep -m`` process, in a process group of its own."""

    proc: subprocess.Popen
    sweep: Sweep
    log: Path
    started: float = field(default_factory=time.monotonic)
    rows_at_start: int = 0

    @property
    def pid(self) -> int:
        """The driver's process id, also its process group's (it starts a session of its own)."""
        return self.proc.pid

    def alive(self) -> bool:
        """Whether the driver process is still running."""
        return self.proc.poll() is None

    def wait(self, timeout_s: float) -> int | None:
        """Wait up to ``timeout_s`` seconds for the driver to exit; its exit code, or None."""
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def stderr(self) -> str:
        """Everything the driver has written to stderr so far (empty if the log cannot be read)."""
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def workers(self) -> list[int]:
        """Its GPU workers (Ray actors), busy ones first."""
        pids = [p for p in descendants(self.pid) if cmdline(p).startswith("ray::GpuWorker")]
        return sorted(pids, key=lambda p: (".run" not in cmdline(p), p))


# --- sweeps and their ledgers ------------------------------------------------------------------
@dataclass
class Sweep:
    """One sweep directory and the grid it must end up holding."""

    directory: Path
    workloads: tuple[str, ...]
    clocks: tuple[int, ...]
    role: str  # "main" (faults target it) or "side" (another sweep on the same GPUs)

    def command(self, base: list[str]) -> list[str]:
        """``base`` (``dvfs sweep -m`` and the run's common overrides), then this grid."""
        return [
            *base,
            f"workload={','.join(self.workloads)}",
            f"device.sm_clock_mhz={','.join(map(str, self.clocks))}",
            f"hydra.sweep.dir={self.directory}",
        ]

    def expected(self) -> set[tuple[str, int]]:
        """Every (workload, SM clock in MHz) job of the grid: what the sweep must end up holding."""
        return {(w, c) for w in self.workloads for c in self.clocks}

    def rows(self) -> list[dict[str, Any]]:
        """The rows stored in the sweep's directory so far (none while it has no readable store)."""
        from orchestrator.results.store import ResultStore, StoreError

        try:
            with ResultStore(self.directory, readonly=True) as store:
                return store.rows()
        except StoreError:
            return []

    def ledger(self) -> dict[str, Any]:
        """Per job: measured exactly once, lost (never measured), duplicated (measured twice, or
        one repeat stored twice); not-measured rows, and those a later attempt measured."""
        by_job: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
        rows = self.rows()
        for r in rows:
            by_job[(r["workload"], int(r["sm_clock_max_mhz"]))].append(r)
        expected = self.expected()
        measured = {j: [r for r in rs if r["status"] != "not_measured"] for j, rs in by_job.items()}
        once = [j for j in expected if len(measured.get(j, [])) == 1]
        twice = [j for j, rs in measured.items() if len(rs) > 1]
        unmeasured = [j for j, rs in by_job.items() if len(rs) > len(measured[j])]
        return {
            "dir": str(self.directory),
            "role": self.role,
            "expected": len(expected),
            "stored_once": len(once),
            "lost": sorted(f"{w}@{c}" for w, c in expected if not measured.get((w, c))),
            "duplicated": sorted(f"{w}@{c}" for w, c in twice),
            "unexpected": sorted(f"{w}@{c}" for w, c in set(by_job) - expected),
            "not_measured": sum(len(by_job[j]) - len(measured[j]) for j in unmeasured),
            "not_measured_retried": sorted(f"{w}@{c}" for w, c in unmeasured if measured[(w, c)]),
            "not_measured_open": sorted(f"{w}@{c}" for w, c in unmeasured if not measured[(w, c)]),
            "statuses": dict(Counter(r["status"] for r in rows)),
            "rows": rows,
        }


# --- what the rows of every sweep must not show ---------------------------------------------
def overlaps(rows: list[dict[str, Any]]) -> int:
    """Pairs of trials that ran on one GPU at the same time (over every sweep's rows)."""
    spans = defaultdict(list)
    for r in rows:
        launch = r.get("launch") or {}
        if launch.get("trial_started_at") is not None:
            spans[r["device_uuid"]].append((launch["trial_started_at"], launch["trial_ended_at"]))
    n = 0
    for s in spans.values():
        s.sort()
        n += sum(1 for (_, end), (start, _) in zip(s, s[1:]) if start < end)
    return n


def unexplained(rows: list[dict[str, Any]]) -> list[str]:
    """The failed rows no injected fault explains (the error lacks the fault's sign), as text."""
    out = []
    for r in rows:
        if r["status"] == "ok":
            continue
        signs = EXPLAINED.get(r["status"], ())
        if not any(s in (r.get("error") or "") for s in signs):
            out.append(f"{r['workload']}@{r['sm_clock_max_mhz']}: {r['status']}: "
                       f"{(r.get('error') or '')[:160]}")
    return out
