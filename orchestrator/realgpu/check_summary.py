"""``dvfs check``'s summary: the report as JSON (every figure) and as Markdown (what a person
reads first: the board, how its readings behave, each workload's figures beside the sim's)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any


def clean(value: Any) -> Any:
    """JSON-safe: non-finite floats become None, tuples lists, other objects text."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    if value is None or isinstance(value, (str, int, bool)):
        return value
    return str(value)


def _fmt(value: Any, scale: float = 1.0, digits: int = 4) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)):
        return f"{value * scale:.{digits}g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(_fmt(v) for v in value) or "-"
    return str(value).replace("|", "/").replace("\n", " ")


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_fmt(c) for c in row) + " |" for row in rows]
    return lines


def _ms(stats: dict | None, key: str) -> str:
    return "-" if not stats else _fmt(stats[key], 1000.0)


def render_identity(data: dict) -> list[str]:
    """The identity section: one row per field."""
    return _table(["field", "value"], [[k, v] for k, v in data.items()])


def render_readings(data: dict) -> list[str]:
    """The counter's update period per phase, then each power reading per phase (in W, its
    update interval in ms and, after the load, how long it took to settle)."""
    counter = [
        [name, p["detail"], p["updates"], _ms(p["interval_s"], "median_s"),
         _ms(p["interval_s"], "min_s"), _ms(p["interval_s"], "max_s"), p["polls"],
         _fmt(p["mean_poll_s"], 1000.0), p["counter_power_w"]]
        for name, p in data["phases"]["energy_counter"].items()
    ]
    lines = ["### Energy counter", ""] + _table(
        ["phase", "running", "updates", "median interval ms", "min ms", "max ms", "polls",
         "mean poll ms", "counter power W"], counter)
    power = []
    for name, p in data["phases"]["power"].items():
        for key, r in p["readings"].items():
            if not r["supported"]:
                power.append([name, key, "not supported", "-", "-", "-", "-", "-"])
                continue
            period = _ms(r["update_interval_s"], "median_s") if r["changes"] else "never changed"
            settle = "-"
            if "settle_s" in r:
                settle = "no step" if r["settle_s"] is None else (
                    f"{_fmt(r['settle_s'], 1000.0)} ({r['semantics']})")
            power.append([name, key, r["samples"], r["mean_w"], r["min_w"], r["max_w"], period,
                          settle])
    return lines + ["", "### Power readings", ""] + _table(
        ["phase", "reading", "samples", "mean W", "min W", "max W", "median update interval ms",
         "settle ms after the load"], power)


def render_trials(data: dict) -> list[str]:
    """Each trial's figures and where its wall time went, then each beside the sim's."""
    rows = [
        [r["workload"], r["framework"], r["dtype"], r["status"], _fmt(r["time_per_iter_s"], 1e3),
         f"{_fmt(r['rate'])} {r['rate_unit'] or ''}", r["energy_per_iter_j"], r["avg_power_w"],
         r["observed_sm_clock_mhz"], r["rel_error"], r["determinism_mismatches"],
         r["wall_s"], r["phase_window_s"], r["wall_over_window"], r["bytes_to_host"]]
        for r in data["rows"]
    ]
    lines = _table(
        ["workload", "framework", "dtype", "status", "ms/iter", "rate", "J/iter", "mean W",
         "SM MHz", "rel. error", "mismatches", "wall s", "window s",
         "wall / (window + check run)", "bytes to host"], rows)
    sim = data["beside_sim"]
    if not sim["profile"]:
        return [*lines, "", "No simulated profile is shipped for this board: nothing beside."]
    beside = [[r["workload"], r["framework"], r["dtype"],
               *(f"{_fmt(s)} / {_fmt(real)} ({_fmt(s / real if real else None, digits=3)})"
                 for s, real in (r[k] for k in ("ms_per_iter", "power_w", "j_per_iter",
                                                "sm_clock_mhz")))]
              for r in sim["rows"]]
    return [*lines, "", f"### Beside the simulated `{sim['profile']}` (sim / real, ratio)", "",
            *_table(["workload", "framework", "dtype", "ms/iter", "W", "J/iter", "SM MHz"],
                    beside)]


RENDERERS: dict[str, Callable[[dict], list[str]]] = {
    "identity": render_identity, "readings": render_readings, "trials": render_trials,
}
TITLES = {"identity": "NVML identity", "readings": "How the energy and power readings behave",
          "trials": "Every workload, as trials (observe-only)"}


def render_markdown(report: dict) -> str:
    """The summary as Markdown; a section that failed, or fails to render, says so in place."""
    dev = report["device"]
    lines = [f"# dvfs check: {dev['name']} ({dev['uuid']})", ""]
    if dev["backend"] == "sim":
        lines += ["> The simulated GPU: every figure below comes from the sim's model.", ""]
    lines += [f"Observe-only: nothing was set. Host `{report['host']}`, Python "
              f"{report['python']}, frameworks {', '.join(report['frameworks']) or 'none'}; "
              f"started {report['started_at']}, {_fmt(report['elapsed_s'])} s in all.", ""]
    for name, section in report["sections"].items():
        lines += [f"## {TITLES.get(name, name)}: {section['status']}", ""]
        if section["status"] in ("failed", "skipped"):
            lines += [f"**{section['status']}**: {_fmt(section.get('error'))}", ""]
            continue
        lines += [f"- problem: {_fmt(p)}" for p in section.get("problems") or []]
        try:
            body = RENDERERS[name](section["data"])
        except Exception as e:  # noqa: BLE001 - one bad section never hides the others
            body = [f"**failed to render** ({type(e).__name__}: {e}); check.json has its data."]
        lines += [*body, ""]
    return "\n".join(lines).rstrip() + "\n"


def write_summary(report: dict, out: Path) -> Path:
    """Write ``check.json`` and ``check.md`` into ``out``; return the Markdown's path."""
    report = clean(report)
    (out / "check.json").write_text(json.dumps(report, indent=2) + "\n")
    md = out / "check.md"
    md.write_text(render_markdown(report))
    return md
