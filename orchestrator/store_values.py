"""What a stored row may hold: the JSON form of row and meta values.

The results store (:mod:`orchestrator.store`) keeps every row as JSON text, so that any SQLite
client can read it and nothing is ever unpickled. Trials hand it NumPy scalars and arrays,
paths, sets and enums; this module turns each into plain JSON types on the way in, once, and
refuses anything with no faithful JSON form rather than storing its ``repr``. Non-finite floats
are written as Python's JSON writes them (``NaN``, ``Infinity``) and read back as floats.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
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
