"""What a stored row may hold: the JSON form of row and meta values.

The results store (:mod:`orchestrator.results.store`) keeps every row as JSON text, so that any
SQLite client can read it and nothing is ever unpickled. Trials hand it NumPy scalars and arrays,
paths, sets and enums; this module turns each into plain JSON types on the way in, once, and
refuses anything with no faithful JSON form rather than storing its ``repr``. Non-finite floats
are written as Python's JSON writes them (``NaN``, ``Infinity``) and read back as floats.
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any


class UnstorableValueError(ValueError):
    """A row value has no JSON form; the message names its path in the row."""


def to_json_value(value: Any, where: str) -> Any:
    """Converts one row value to plain JSON types.

    Args:
        value: The value to convert.
        where: Its path in the row, for the error message.

    Returns:
        The value as ``None``, ``bool``, ``int``, ``float``, ``str``, ``list`` or ``dict``.

    Raises:
        UnstorableValueError: The value has no JSON form.
    """
    if value is None:
        return None
    if isinstance(value, enum.Enum):  # before the base types: str- and int-valued enums
        return to_json_value(value.value, where)
    for base in (bool, int, float, str):  # also NumPy's float64, a float subclass
        if isinstance(value, base):
            return base(value)
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, Mapping):
        return _mapping_to_json(value, where)
    if isinstance(value, (list, tuple)):
        return [to_json_value(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, (set, frozenset)):
        return sorted((to_json_value(v, f"{where}[]") for v in value), key=repr)
    # NumPy without importing it: scalars have .item(), arrays .tolist().
    tolist = getattr(value, "tolist", None)
    if callable(tolist) and hasattr(value, "dtype"):
        return to_json_value(tolist(), where)
    item = getattr(value, "item", None)
    if callable(item) and hasattr(value, "dtype"):
        return to_json_value(item(), where)
    raise UnstorableValueError(
        f"row field {where!r}: a {type(value).__name__} cannot be stored; "
        "rows hold JSON values (numbers, strings, lists, dicts, None)"
    )


def _mapping_to_json(value: Mapping[Any, Any], where: str) -> dict[str, Any]:
    """A mapping as a JSON object: keys must be strings (or scalars and enums, made strings)."""
    out = {}
    for k, v in value.items():
        if isinstance(k, enum.Enum):
            k = k.value
        if not isinstance(k, (str, int, float, bool)) and k is not None:
            raise UnstorableValueError(f"row field {where!r}: key {k!r} is not a string")
        out[str(k)] = to_json_value(v, f"{where}.{k}")
    return out


def dumps(value: Any) -> str:
    """The compact JSON text of a value already in JSON types (as :func:`to_json_value` gives)."""
    return json.dumps(value, sort_keys=False, separators=(",", ":"))


class InvalidRowError(ValueError):
    """A row lacks what identifies it (its key, repeat or attempt)."""


@dataclass(frozen=True)
class RowRecord:
    """What the store writes of one row: its identity, its indexed columns and its JSON text."""

    trial_key: str
    repeat: int
    attempt: int
    indexed: list[Any]
    text: str


def _count(value: Any, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def _indexed(value: Any, column: str) -> Any:
    """A row value as its indexed column holds it: a finite float for ``started_at``, else text."""
    if column == "started_at":
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        v = float(value) if number else None
        return v if v is None or math.isfinite(v) else None
    return value if value is None or isinstance(value, str) else str(value)


def row_record(row: Mapping[str, Any], indexed_columns: Sequence[str]) -> RowRecord:
    """One trial row in the store's terms: identity, indexed columns, JSON text.

    A row without ``attempt`` is its trial's first (1).

    Raises:
        UnstorableValueError: A value has no JSON form.
        InvalidRowError: No non-empty ``trial_key``, no integer ``repeat`` >= 0, or an
            ``attempt`` that is not an integer >= 1.
    """
    clean = to_json_value(dict(row), "row")
    key = clean.get("trial_key")
    repeat = clean.get("repeat")
    attempt = clean.setdefault("attempt", 1)
    if not isinstance(key, str) or not key:
        raise InvalidRowError(f"a trial row needs a non-empty string 'trial_key', got {key!r}")
    if not _count(repeat, 0):
        raise InvalidRowError(f"a trial row needs an integer 'repeat' >= 0, got {repeat!r}")
    if not _count(attempt, 1):
        raise InvalidRowError(
            f"a trial row's 'attempt' must be an integer >= 1, got {attempt!r}"
        )
    indexed = [_indexed(clean.get(c), c) for c in indexed_columns]
    return RowRecord(key, repeat, attempt, indexed, dumps(clean))
