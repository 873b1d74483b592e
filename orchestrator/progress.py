"""The live progress line of a sweep: trials done, failed and left, what each GPU does, and an ETA.

On a terminal the line is redrawn in place on stderr (at most ``redraw_s`` apart); elsewhere (a
log file, CI) a plain line is written at most every ``plain_every_s`` seconds, so a long sweep
leaves a readable log. Per-trial summaries go to stdout through :meth:`Progress.log`, which keeps
them from tearing the live line. The last line names the sweep directory and the report command.

``ETA`` is the mean wall time of the trials finished so far, times the trials left, divided by the
GPUs that are working.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any, TextIO


def format_duration(seconds: float) -> str:
    """``75`` -> ``1:15``; ``3725`` -> ``1:02:05``."""
    if seconds != seconds or seconds == float("inf"):
        return "?"
    s = int(round(max(seconds, 0.0)))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class Progress:
    """Counts a sweep's trials and shows them.

    Args:
        total: how many trials the sweep will record (jobs x GPUs for ``placement=every``).
        enabled: False: show nothing but the final line.
        stream: where the live line goes (stderr).
        out: where :meth:`log` lines go (stdout).
        tty: force terminal (True) or plain (False) mode; default: ``stream.isatty()``.
    """

    def __init__(
        self,
        total: int,
        *,
        enabled: bool = True,
        stream: TextIO | None = None,
        out: TextIO | None = None,
        tty: bool | None = None,
        redraw_s: float = 0.2,
        plain_every_s: float = 10.0,
    ) -> None:
        self.total = total
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.out = out or sys.stdout
        self.tty = self.stream.isatty() if tty is None else tty
        self.redraw_s = redraw_s
        self.plain_every_s = plain_every_s
        self.done = 0
        self.failed = 0
        self.skipped = 0
        self.by_status: dict[str, int] = {}
        self.lanes: dict[str, str] = {}  # GPU label -> what it is doing
        self._trial_s_sum = 0.0
        self._started = time.monotonic()
        self._last_draw = 0.0 if self.tty else self._started  # plain lines: the first after a while
        self._drawn = False

    # --- counting ------------------------------------------------------------------------------
    def set_lane(self, gpu: str, activity: str) -> None:
        """What one GPU is doing now (``gemm/jax 1065 MHz``, ``idle``, ``waiting for lease``...)."""
        self.lanes[gpu] = activity

    def trial_done(self, status: str, trial_s: float | None = None) -> None:
        """One trial finished with this status (``ok``, ``wrong``, ``crash``, ``timeout``...)."""
        self.done += 1
        self.by_status[status] = self.by_status.get(status, 0) + 1
        if status != "ok":
            self.failed += 1
        if trial_s is not None:
            self._trial_s_sum += trial_s
        self.refresh()

    def trial_skipped(self, n: int = 1) -> None:
        """Trials found in the store already (resume): counted as done, not timed."""
        self.skipped += n
        self.done += n

    @property
    def left(self) -> int:
        """Trials not yet done (never negative)."""
        return max(self.total - self.done, 0)

    def eta_s(self) -> float:
        """Seconds left, estimated: mean timed trial time x trials left / GPUs still working.

        NaN until a trial has been timed (skipped trials are not).
        """
        timed = self.done - self.skipped
        working = sum(1 for a in self.lanes.values() if a not in ("retired",)) or 1
        if timed <= 0:
            return float("nan")
        return self._trial_s_sum / timed * self.left / working

    # --- showing -------------------------------------------------------------------------------
    def line(self) -> str:
        """The progress line as text."""
        width = len(str(self.total))
        lanes = "  ".join(f"{gpu}: {act}" for gpu, act in self.lanes.items())
        return (
            f"[{self.done:>{width}}/{self.total}] "
            f"{self.done - self.failed} ok, {self.failed} failed, "
            f"{self.left} left | {lanes} | ETA {format_duration(self.eta_s())}"
        )

    def refresh(self, force: bool = False) -> None:
        """Redraw the live line (terminal) or write a plain line (otherwise) when due."""
        if not self.enabled:
            return
        now = time.monotonic()
        due = self.redraw_s if self.tty else self.plain_every_s
        if not force and now - self._last_draw < due:
            return
        self._last_draw = now
        if self.tty:
            self.stream.write("\r\x1b[2K" + self.line()[:400])
            self._drawn = True
        else:
            self.stream.write(self.line() + "\n")
        self.stream.flush()

    def log(self, text: str) -> None:
        """Write a line to stdout without tearing the live line."""
        self._clear()
        self.out.write(text + "\n")
        self.out.flush()
        if self.tty and self.enabled:
            self._last_draw = 0.0
            self.refresh()

    def note(self, text: str) -> None:
        """Write a line to stderr (a warning, an actor replaced) without tearing the live line."""
        self._clear()
        self.stream.write(text + "\n")
        self.stream.flush()

    def finish(self, text: str) -> None:
        """The last line: replaces the live line."""
        self._clear()
        self.stream.write(text + "\n")
        self.stream.flush()

    def elapsed_s(self) -> float:
        """Wall-clock seconds since this progress display was made."""
        return time.monotonic() - self._started

    def _clear(self) -> None:
        if self._drawn:
            self.stream.write("\r\x1b[2K")
            self.stream.flush()
            self._drawn = False


# --- what a trial's rows tell a person ------------------------------------------------------
def summarise(rows: Sequence[Mapping[str, Any]], label: str) -> str:
    """One line per repeat: status, throughput, power, energy, validity."""
    lines = []
    for r in rows:
        if r.get("iterations"):
            energy = (
                "no energy measured"  # device=cpu without a readable RAPL counter
                if r.get("energy_j") is None
                else f"{r['avg_power_w']:.0f} W avg, {r['energy_per_iter_j']:.4g} J/iter"
            )
            lines.append(
                f"{label} #{r['repeat']}: {r['status']}, "
                f"{r['iterations']} iters in {r['time_s']:.3f} s, "
                f"{r.get('rate') or r['tflops'] or 0:.4g} {r.get('rate_unit') or 'TFLOP/s'}, "
                f"{energy}, "
                f"SM {r['observed_sm_clock_mhz'] or 0:.0f} MHz, {_sizes(r)}"
                + ("" if r["valid"] else f", INVALID: {r['invalid_reason']}")
            )
        else:
            first = (r.get("error") or "").splitlines()[0] if r.get("error") else ""
            lines.append(f"{label} #{r['repeat']}: {r['status']}: {first}")
    return "\n".join(lines)


def _sizes(row: Mapping[str, Any]) -> str:
    """Which size the kernel computed, and on the sim the size its figures model; for a user's
    program (``workload=command``), its energy per item and the result it reported."""
    if row.get("program_wall_s") is not None:
        unit = str(row.get("rate_unit") or "items/s").removesuffix("/s")
        one = unit[:-1] if unit.endswith("s") and not unit.endswith("ss") else unit
        per_item = row.get("energy_per_item_j")
        shown = [] if per_item is None else [f"{per_item * 1e6:.4g} uJ/{one}"]
        result = row.get("result")
        shown.append("no result" if result is None else f"result {json.dumps(result)}")
        return ", ".join(shown)
    if row.get("sim_size") and row["sim_size"] != row.get("size"):
        return f"size {row.get('size')} computed, {row['sim_size']} modelled"
    return f"size {row.get('size')}"
