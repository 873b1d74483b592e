"""The guard's policy file: which clock, power and offset ranges a sweep may set, per GPU model.

A policy narrows what the device itself supports (it never widens it). The file is YAML or JSON::

    default:                         # every GPU model
      power_range_w: [150, 400]
    "NVIDIA A100-SXM4-40GB":         # one model, by the name NVML reports
      sm_clock_range_mhz: [900, 1410]
      clock_offset_range_mhz: [0, 0]

Because a policy is a safety limit, it is read only from a file that nobody but its owner (the
current user or root) can write: a file writable by group or others is refused, as ``ssh`` refuses
a loose ``authorized_keys``. Parsed with a safe YAML loader; nothing here unpickles anything.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from orchestrator.errors import UserError
from orchestrator.guard import Policy


def load_policy(path: str | os.PathLike[str] | None, device_name: str) -> Policy:
    """The policy for one GPU model (the file's ``default`` merged with the model's entry)."""
    if path is None:
        return Policy()
    p = Path(path).expanduser()
    try:
        st = p.stat()
    except FileNotFoundError:
        raise UserError(f"device.policy_file={p} does not exist") from None
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UserError(
            f"device.policy_file={p} is writable by others (mode {stat.filemode(st.st_mode)}); "
            f"a safety policy must be writable only by its owner: chmod go-w {p}"
        )
    if st.st_uid not in (0, os.geteuid()):
        raise UserError(f"device.policy_file={p} is owned by uid {st.st_uid}, neither you nor root")
    data = _parse(p)
    if not isinstance(data, dict):
        raise UserError(f"device.policy_file={p} must map GPU model names (or 'default') to ranges")
    merged: dict[str, Any] = dict(data.get("default") or {})
    merged.update(data.get(device_name) or {})
    try:
        return Policy.from_mapping(merged)
    except (TypeError, ValueError) as e:
        raise UserError(f"device.policy_file={p}: {e}") from e


def _parse(p: Path) -> Any:
    import yaml

    try:
        return yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        first = str(e).splitlines()[0]
        raise UserError(f"device.policy_file={p} is not valid YAML/JSON: {first}") from e
