"""Where a trial's wall time goes: its phases, timed on the host's clock.

A sweep's physical limit is the sum of its windows and the check runs its checks need; every
other second (building the kernel, applying settings, a thermal start, warm-up, waiting for the
energy counter's edges, comparing, restoring) is overhead that only a timed row shows. Each row
carries its phases (``phase_<name>_s``) and their sum ``wall_s``: the trial's own phases (build,
settings, thermal start, warm-up) on its first repeat, the restore on its last, each repeat's on
its own row, so rows add up to trials (``analysis.phases`` sums them per sweep).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from typing import Any

PHASES = ("build", "settings", "steady", "warmup", "edge_wait", "window", "check_run", "compare",
          "restore")
"""A trial's phases, in the order they run (each a ``phase_<name>_s`` column)."""


@contextmanager
def timed(into: MutableMapping[str, float], name: str) -> Iterator[None]:
    """Add the wall time of the ``with`` block to ``into[name]`` (None counts as 0; even when it
    raises)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        into[name] = (into.get(name) or 0.0) + time.perf_counter() - start


def fill_phases(rows: list[dict[str, Any]], trial: Mapping[str, float]) -> None:
    """Put the trial's own phase times on its rows and sum each row's ``wall_s``.

    ``trial`` holds the phases that belong to no repeat: build, settings, the thermal start and
    warm-up go to the first row, the restore to the last; each row already holds its repeat's.
    """
    if not rows:
        return
    for name, seconds in trial.items():
        row = rows[-1] if name == "restore" else rows[0]
        key = f"phase_{name}_s"
        row[key] = (row.get(key) or 0.0) + seconds
    for row in rows:
        times = [row.get(f"phase_{name}_s") for name in PHASES]
        row["wall_s"] = sum(t for t in times if t is not None)
