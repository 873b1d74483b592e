"""Frames turned into the report's readable text: table cells, setting names, swept values.

Each function takes finished frames (:mod:`analysis.recommend`, :mod:`analysis.thresholds`) and
returns text or a frame of text cells; none computes a front, a recommendation or a threshold,
and none touches a file. The report's sections (:mod:`analysis._sections`) arrange what these
return.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Sequence

import numpy as np
import pandas as pd

from analysis._format import fmt_sig
from analysis._frame import is_missing
from analysis.plot_style import si_scale

READABLE = {
    "time_per_iter_s": "time/iter (s)", "energy_per_iter_j": "energy/iter (J)",
    "saving_pct": "energy saved (%)", "slowdown_pct": "slowdown (%)",
    "saving_beyond_spread": "beyond spread", "n_repeats": "repeats",
    "stable_value": "lowest stable (MHz)", "failing_value": "highest failing (MHz)",
    "non_monotone": "non-monotone", "iterations_at_stable": "clean iterations at stable",
    "fault_rate_bound": "fault rate ≤ (95 %)", "failure_statuses": "failures",
    "trials_used": "trials used", "excluded_invalid_trials": "invalid trials left out",
    "n_settings": "settings", "median_ratio": "median ratio", "min_ratio": "min ratio",
    "max_ratio": "max ratio", "n_beyond_spread": "beyond spread", "n_judged": "judged",
    "p_chance": "p (chance)", "sm_clock_max_mhz": "SM clock (MHz)",
    "power_limit_w": "power cap (W)", "invalid_reason": "invalid because",
}
"""Column names as a table's header writes them."""


def display(df: pd.DataFrame, columns: Sequence[str], rename: dict[str, str] | None = None,
            drop_empty: bool = True) -> pd.DataFrame:
    """A table for reading: chosen columns, numbers to 4 significant digits, text cells."""
    cols = [c for c in columns if c in df.columns]
    out = pd.DataFrame({c: [fmt_sig(v) for v in df[c]] for c in cols}, dtype=object)
    if drop_empty:
        out = out[[c for c in out.columns if (out[c] != "").any()]]
    return out.rename(columns=rename or {})


def collapse_constant(table: pd.DataFrame, columns: Sequence[str]) -> tuple[pd.DataFrame, str]:
    """Drops the listed columns that hold one value in every row, and says them in a sentence."""
    same = [c for c in columns if c in table.columns and len(table) > 1
            and table[c].nunique(dropna=False) == 1]
    if not same:
        return table, ""
    text = "In every row: " + ", ".join(f"{c} = {table[c].iat[0] or '(none)'}" for c in same) + "."
    return table.drop(columns=same), text


def flatten(d: dict, prefix: str = "") -> list[tuple[str, object]]:
    """A nested dict as ``(dotted.key, value)`` pairs, depth first."""
    out: list[tuple[str, object]] = []
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.extend(flatten(v, f"{prefix}{k}."))
        else:
            out.append((f"{prefix}{k}", v))
    return out


def scaled(df: pd.DataFrame, column: str, unit: str) -> tuple[list[str], str]:
    """A column in the SI prefix that suits it (as the figures do), and the prefixed unit."""
    values = pd.to_numeric(df[column], errors="coerce") if column in df else pd.Series(dtype=float)
    factor, label = si_scale(values.to_numpy(dtype=float, na_value=np.nan), unit)
    return [fmt_sig(v / factor) if not is_missing(v) else "" for v in values], label


def setting_label(r: pd.Series) -> str:
    """A setting in words: ``"default"``, ``"1185 MHz"``, ``"1185 MHz, 250 W cap"``."""
    if is_missing(r.get("objective")):
        return ""
    parts = []
    lo, hi = r.get("sm_clock_min_mhz"), r.get("sm_clock_max_mhz")
    if not is_missing(hi):
        same = is_missing(lo) or float(lo) == float(hi)
        parts.append(f"{fmt_sig(hi)} MHz" if same else f"{fmt_sig(lo)}-{fmt_sig(hi)} MHz")
    if not is_missing(r.get("clock_offset_mhz")):
        parts.append(f"offset {float(r['clock_offset_mhz']):+g} MHz")
    if not is_missing(r.get("power_limit_w")):
        parts.append(f"{fmt_sig(r['power_limit_w'])} W cap")
    if not is_missing(r.get("mem_clock_mhz")):
        parts.append(f"memory {fmt_sig(r['mem_clock_mhz'])} MHz")
    if not parts:
        return "default" if bool(r.get("default_setting")) else "(none recorded)"
    return ", ".join(parts)


def _clock_order(v: str) -> tuple:
    try:
        return (0, float(v))
    except ValueError:
        return (1, v)


def config_tables(df: pd.DataFrame, stores: list[dict]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """What varied across the trials' configs, and what every trial shared.

    The store's ``sweep`` meta is written by the sweep's first job, so its ``config`` is that
    job's; the trials' own configs tell the whole sweep. Other ``sweep`` meta items are listed
    among the shared settings (``started_at`` as a date).
    """
    seen: dict[str, list[str]] = {}
    configs = [c for c in (df["config"] if "config" in df else []) if isinstance(c, dict)]
    for cfg in configs:
        for k, v in flatten(cfg):
            vals = seen.setdefault(k, [])
            text = "default" if is_missing(v) and k.endswith(("_mhz", "_w")) else fmt_sig(v)
            if text not in vals:
                vals.append(text)
    shared: list[tuple[str, str]] = []
    for s in stores:
        for k, v in flatten(s["meta"].get("sweep") or {}):
            if k.startswith("config.") and configs:
                continue
            if k.endswith("_at") and isinstance(v, (int, float)) and not is_missing(v):
                v = _dt.datetime.fromtimestamp(float(v)).astimezone().strftime("%Y-%m-%d %H:%M %Z")
            shared.append((k, fmt_sig(v)))
    swept = [(k, v) for k, v in seen.items() if len(v) > 1]
    shared += [(k, v[0]) for k, v in seen.items() if len(v) == 1 and v[0] != ""]
    swept_df = pd.DataFrame({"setting": [k for k, _ in swept],
                             "values": [", ".join(sorted(v, key=_clock_order)) for _, v in swept],
                             "count": [str(len(v)) for _, v in swept]})
    return swept_df, pd.DataFrame({"key": [k for k, _ in shared], "value": [v for _, v in shared]})


def versions_table(df: pd.DataFrame, stores: list[dict]) -> pd.DataFrame:
    """Every library, framework, driver and commit version the trials and stores recorded."""
    found: dict[str, list[str]] = {}

    def add(key: str, value: object) -> None:
        vals = found.setdefault(key, [])
        if str(value) not in vals:
            vals.append(str(value))

    for d in [s["meta"].get("versions") for s in stores] + list(df["versions"]):
        if isinstance(d, dict):
            for k, v in flatten(d):
                add(k, v)
    for (fw, ver), _ in df.groupby(["framework", "framework_version"], dropna=True):
        add(str(fw), ver)
    for column, key in (("git_commit", "git_commit"), ("driver_version", "driver")):
        for value in dict.fromkeys(df[column].tolist()):
            if not is_missing(value):
                add(key, value)
    if not found:
        return pd.DataFrame({"library": ["(none recorded)"], "version": [""]})
    return pd.DataFrame({"library": list(found), "version": [", ".join(v) for v in found.values()]})


def devices_table(df: pd.DataFrame, retired: dict[str, dict]) -> pd.DataFrame:
    """One row per GPU the trials ran on: identity, backend, host, trials, and why it retired."""
    dev = []
    for uuid, sub in df.groupby(df["device_uuid"].astype(str), dropna=False, sort=True):
        first = sub.iloc[0]
        dev.append({"device_uuid": uuid, "device_name": first["device_name"],
                    "driver_version": first["driver_version"], "backend": first["backend"],
                    "host": first["host"], "trials": len(sub),
                    "retired": retired[uuid]["reason"] if uuid in retired else None})
    return display(pd.DataFrame(dev), ["device_uuid", "device_name", "driver_version",
                                       "backend", "host", "trials", "retired"])


def sim_provenance(df: pd.DataFrame) -> list[str]:
    """What a simulated GPU put into these trials: its boards, and the faults it was told to plant.

    Empty when no trial ran on ``device=sim``. A threshold the sim planted (a ``scenario`` such
    as ``seed_claims``, or ``device.planted_thresholds``) and that the analysis finds again shows
    the search works; it is no finding about a GPU, so the report names it beside the finding.
    """
    sim = df[df["backend"].astype(str) == "sim"] if "backend" in df else df.iloc[:0]
    if not len(sim):
        return []
    names = ", ".join(sorted({str(n) for n in sim["device_name"] if not is_missing(n)}))
    lines = [f"{len(sim)} of {len(df)} trials ran on a simulated GPU (device=sim: {names}): their "
             "times, energies and faults come from the simulator's model, fitted to published "
             "measurements (docs/simulator.md), not from hardware."]
    planted: dict[str, None] = {}
    for cfg in sim["config"] if "config" in sim else []:
        device = cfg.get("device", {}) if isinstance(cfg, dict) else {}
        if device.get("scenario"):
            planted[f"scenario {device['scenario']}"] = None
        if device.get("planted_thresholds"):
            planted[f"device.planted_thresholds={device['planted_thresholds']}"] = None
    if planted:
        lines.append("Stability thresholds were planted in the simulated GPUs ("
                     + "; ".join(planted) + "): a threshold found there shows that the search "
                     "finds what was planted, and says nothing about a real GPU.")
    return lines
