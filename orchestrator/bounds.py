"""Every numeric setting has a range a user would accept, and the reason for it.

A typo must not run for a year: ``measure.window_s=999999999999`` holds a locked clock until
someone notices, ``measure.repeats=${now:%Y}`` runs one trial 2,025 times. Each numeric field of
a schema (``orchestrator.config``, the ``hydra.launcher`` and ``hydra.sweeper`` keys) is declared
with :func:`bounded`, so its default, its range and the reason for the range are read in one
place, and :func:`check_fields` checks a whole section after its interpolations are resolved.
The ranges are generous for real studies (a window of up to an hour, a thousand repeats); a value
outside one is a one-line ``UserError`` (exit code 2) naming the key, the value and the range,
before anything runs.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from orchestrator.errors import UserError

BOUND = "dvfs_bound"
"""The key of a field's metadata that holds its :class:`Bound`."""


@dataclass(frozen=True)
class Bound:
    """A closed range ``[lo, hi]`` (``above``: ``(lo, hi]``) and why it is that range.

    Attributes:
        lo: the lowest value accepted (or the value every accepted one is above).
        hi: the highest value accepted.
        why: the reason, shown with the refusal.
        above: ``lo`` itself is refused (a window of 0 s).
        unit: shown after the numbers (``" s"``, ``" MHz"``).
    """

    lo: float
    hi: float
    why: str
    above: bool = False
    unit: str = ""

    def describe(self) -> str:
        """E.g. ``greater than 0 and at most 3600 s`` or ``between 1 and 1000``."""
        lo, hi = _number(self.lo), _number(self.hi)
        if self.above:
            return f"greater than {lo} and at most {hi}{self.unit}"
        return f"between {lo} and {hi}{self.unit}"

    def admits(self, value: Any) -> bool:
        """Whether ``value`` is a number in range (NaN and booleans never are)."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        low_ok = value > self.lo if self.above else value >= self.lo
        return bool(low_ok and value <= self.hi)  # NaN compares False both ways

    def check(self, key: str, value: Any) -> None:
        """Refuse ``value`` for ``key`` unless it is in range (None: unset, accepted).

        Raises:
            UserError: one line: the key, the value, the range and why.
        """
        if value is None or self.admits(value):
            return
        raise UserError(f"{key}={_show(value)} must be {self.describe()} ({self.why})")


def bounded(default: Any, lo: float, hi: float, why: str, *, above: bool = False,
            unit: str = "") -> Any:
    """A dataclass field with ``default`` and the range ``[lo, hi]`` (``above``: ``(lo, hi]``)."""
    return dataclasses.field(default=default,
                             metadata={BOUND: Bound(lo, hi, why, above=above, unit=unit)})


def bounds(schema: Any) -> dict[str, Bound]:
    """Every bounded field of ``schema``, by name."""
    return {f.name: f.metadata[BOUND] for f in dataclasses.fields(schema) if BOUND in f.metadata}


def check_fields(prefix: str, node: Any, schema: Any) -> None:
    """Check every bounded field of ``schema`` in ``node`` (a DictConfig, dict or instance).

    Args:
        prefix: the section's key as a user types it (``"measure."``, ``"hydra.launcher."``).
        node: the section's values; a field it lacks is not checked (its default is in range).

    Raises:
        UserError: the first value out of its range.
    """
    for name, bound in bounds(schema).items():
        if isinstance(node, dict) or hasattr(node, "_get_node"):
            if name not in node:
                continue
            value = node[name]
        else:
            value = getattr(node, name)
        bound.check(prefix + name, value)


def _number(x: float) -> str:
    """``3600``, ``0.001``, ``4294967295``, ``1,000,000,000`` for big whole numbers."""
    if isinstance(x, float) and x.is_integer():
        x = int(x)
    if isinstance(x, int):
        return f"{x:,}" if abs(x) >= 100_000 and x % 1000 == 0 else str(x)
    return f"{x:g}"


def _show(value: Any) -> str:
    """A refused value for a one-line message (a huge number in full, a string quoted)."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return str(int(value)) if abs(value) < 1e18 else f"{value:g}"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
