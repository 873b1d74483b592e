"""A worker's trace of the trial it is running, on its node's disk, for whoever finds it dead.

When a worker process dies (killed from outside, the OOM killer, a crashing kernel), the driver
learns only that it is gone. Whether the death says anything about the setting the trial ran at
depends on what the trial was doing: dead inside a kernel call of the trial, it is the trial's
``crash``; dead before its first kernel call (taking the GPU, settling, compiling) or between
trials, nothing was measured. The worker writes what it is doing to a small file per GPU in the
node's journal directory (beside the guard's journal entry, which a dead worker also leaves):

- ``begin`` when a trial starts: its key and the worker's pid, no kernel call yet;
- ``kernel_calls`` just before the trial's first kernel call (the warm-up);
- ``end`` when the trial returns: the file is removed.

The next worker on that GPU (a replacement on the same node) reads it with ``take_trace`` if its
writer is dead, and reports it to the driver, which then records the dead worker's trial as a
crash of the kernel or as not measured. Three small atomic writes a trial, none inside the
measurement window.

**Closing.** A worker may hold a trial queued behind the one it runs (``hydra.launcher.
queue_ahead``), and Ray cannot take back a call an actor has received. A driver that stops
(Ctrl-C, SIGTERM) marks each such GPU ``closing`` on its node's disk (``mark_closing``); the
worker then runs no further trial, so it restores the GPU as soon as the running trial returns.
A worker clears the mark when it takes the GPU and when it lets it go.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class TrialTrace:
    """What a worker was doing when it last wrote its trace.

    Attributes:
        trial_key: the trial it was running.
        pid: the worker's process id.
        began_at: Unix seconds the trial began.
        kernel_calls_at: Unix seconds its first kernel call began (None: none had begun).
    """

    trial_key: str
    pid: int
    began_at: float
    kernel_calls_at: float | None = None

    @property
    def in_kernel_calls(self) -> bool:
        """Whether the trial had begun its kernel calls."""
        return self.kernel_calls_at is not None


def trace_path(directory: str | os.PathLike[str], uuid: str) -> Path:
    """The trace file of GPU ``uuid`` in a node's journal directory."""
    return Path(directory) / f"{uuid}.trace"  # not .json: the journal's entries are


def _write(path: Path, trace: TrialTrace) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(asdict(trace)))
    os.replace(tmp, path)


def begin(directory: str | os.PathLike[str], uuid: str, trial_key: str) -> TrialTrace:
    """Record that this process starts trial ``trial_key`` on GPU ``uuid`` (no kernel call yet)."""
    trace = TrialTrace(trial_key, os.getpid(), time.time())
    _write(trace_path(directory, uuid), trace)
    return trace


def kernel_calls(directory: str | os.PathLike[str], uuid: str, trace: TrialTrace) -> TrialTrace:
    """Record that ``trace``'s trial begins its kernel calls now."""
    trace = TrialTrace(trace.trial_key, trace.pid, trace.began_at, time.time())
    _write(trace_path(directory, uuid), trace)
    return trace


def end(directory: str | os.PathLike[str], uuid: str) -> None:
    """The trial returned: nothing to report if this process dies now."""
    with contextlib.suppress(FileNotFoundError):
        trace_path(directory, uuid).unlink()


def closing_path(directory: str | os.PathLike[str], uuid: str) -> Path:
    """The mark that says GPU ``uuid``'s worker is to run no further trial."""
    return Path(directory) / f"{uuid}.closing"


def mark_closing(directory: str | os.PathLike[str], uuid: str) -> None:
    """Tell GPU ``uuid``'s worker on this node to run no further trial (the sweep stops)."""
    path = closing_path(directory, uuid)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()


def closing(directory: str | os.PathLike[str], uuid: str) -> bool:
    """Whether GPU ``uuid``'s worker is to run no further trial."""
    return closing_path(directory, uuid).exists()


def clear_closing(directory: str | os.PathLike[str], uuid: str) -> None:
    """Remove the mark (a worker that takes the GPU, or lets it go)."""
    closing_path(directory, uuid).unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, someone else's
        return True
    return True


def take_trace(directory: str | os.PathLike[str], uuid: str) -> TrialTrace | None:
    """The trace a dead worker left on GPU ``uuid``, removed once read (None: none, or its
    writer lives). A file that cannot be read as a trace is removed and ignored."""
    path = trace_path(directory, uuid)
    try:
        data = json.loads(path.read_text())
        trace = TrialTrace(str(data["trial_key"]), int(data["pid"]), float(data["began_at"]),
                           None if data.get("kernel_calls_at") is None
                           else float(data["kernel_calls_at"]))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError):
        path.unlink(missing_ok=True)
        return None
    if trace.pid != os.getpid() and _alive(trace.pid):
        return None
    path.unlink(missing_ok=True)
    return trace
