"""The sweep report: ``dvfs report DIR... [--out DIR] [--max-slowdown 0.1]``.

:func:`write_report` reads one or more stores (a sweep still running included: it reads what is
committed) and writes, into one directory:

- ``pareto.png`` / ``pareto.svg``: energy vs time per iteration, one panel per workload, with the
  Pareto front of each series and the default and recommended settings labelled;
- ``clocks.png``: throughput, power and energy per unit of work against the SM clock, one row
  per workload, with the clock ranges where failures were seen shaded;
- ``report.md`` and ``report.html`` (one self-contained file: images inline as base64 data URIs);
- ``trials.csv`` (every row), ``front.csv`` (every setting, with ``on_front`` and why a setting
  was excluded), ``recommendations.csv`` and, when any trial failed, ``thresholds.csv``.

The report reads top-down as a user asks: a summary (per workload and framework: the setting of
least energy, of least EDP and of least energy within the slowdown budget, with their changes in
energy and time, and where checks failed), the recommendations table and the Pareto figure, the
stability thresholds and the clock figure, comparisons, failed trials; then the context: what
was swept and what every trial shared (from the trials' own configs), devices and versions.

matplotlib is imported only when a figure is drawn (:mod:`analysis._figures`), with the Agg
canvas and no pyplot. ``dvfs report`` prints bad input (no store, an empty, unreadable or newer
store, a bad option, an output directory it cannot write) on one line and exits with code 2.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from analysis._doc import Doc
from analysis._figures import clocks_figure, pareto_figure
from analysis._frame import DEFAULT_GROUP, OK, fmt_sig, group_positions, is_missing, truthy
from analysis.load import PathsLike, export, load, load_meta
from analysis.pareto import pareto_front
from analysis.recommend import aggregate_repeats, compare, recommend
from analysis.thresholds import thresholds
from orchestrator.errors import UserError

DEFAULT_IMAGE_SIZE = (1600, 1000)


# -- tables for reading ---------------------------------------------------------------------

def _display(df: pd.DataFrame, columns: Sequence[str], rename: dict[str, str] | None = None,
             drop_empty: bool = True) -> pd.DataFrame:
    """A table for reading: chosen columns, numbers to 4 significant digits, text cells."""
    cols = [c for c in columns if c in df.columns]
    out = pd.DataFrame({c: [fmt_sig(v) for v in df[c]] for c in cols}, dtype=object)
    if drop_empty:
        out = out[[c for c in out.columns if (out[c] != "").any()]]
    return out.rename(columns=rename or {})


def _collapse_constant(table: pd.DataFrame, columns: Sequence[str]) -> tuple[pd.DataFrame, str]:
    """Drops the listed columns that hold one value in every row, and says them in a sentence."""
    same = [c for c in columns if c in table.columns and len(table) > 1
            and table[c].nunique(dropna=False) == 1]
    if not same:
        return table, ""
    text = "In every row: " + ", ".join(f"{c} = {table[c].iat[0] or '(none)'}" for c in same) + "."
    return table.drop(columns=same), text


def _flatten(d: dict, prefix: str = "") -> list[tuple[str, object]]:
    out: list[tuple[str, object]] = []
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.extend(_flatten(v, f"{prefix}{k}."))
        else:
            out.append((f"{prefix}{k}", v))
    return out


# -- the report ----------------------------------------------------------------------------------

def write_report(
    paths: PathsLike,
    out_dir: str | Path,
    *,
    max_slowdown: float = 0.10,
    image_size: tuple[int, int] = DEFAULT_IMAGE_SIZE,
) -> dict[str, Path]:
    """Writes the report of one or more sweeps.

    Args:
        paths: Sweep directories, multirun directories or store files.
        out_dir: The directory to write into (created).
        max_slowdown: The slowdown budget of the "least energy within a slowdown" recommendation,
            as a fraction of the baseline's time per iteration.
        image_size: (width, height) of each PNG in pixels.

    Returns:
        The files written, by name (``"pareto.png"``, ``"report.html"``, ...).

    Raises:
        StoreNotFoundError, EmptyStoreError, StoreSchemaError, CorruptStoreError: As
            :func:`analysis.load`.
        UserError: A bad ``max_slowdown`` or ``image_size``.
    """
    w, h = (int(v) for v in image_size)
    if not (100 <= w <= 10000 and 100 <= h <= 10000):
        raise UserError(f"image size must be between 100 and 10000 px a side, got {w}x{h}")
    if not max_slowdown >= 0:
        raise UserError(f"max slowdown must be a fraction >= 0 (0.1 for 10 %), got {max_slowdown}")
    df = load(paths)
    stores = load_meta(paths)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    agg = aggregate_repeats(df)
    front = pareto_front(agg)
    recs = recommend(agg, max_slowdown=max_slowdown)
    thr = thresholds(df)
    failed_any = bool((df["status"] != OK).any())

    files: dict[str, Path] = {}
    files["trials.csv"] = export(df, out / "trials.csv")
    files["front.csv"] = export(front, out / "front.csv")
    files["recommendations.csv"] = export(recs, out / "recommendations.csv")
    if failed_any:
        files["thresholds.csv"] = export(thr, out / "thresholds.csv")
    files["pareto.png"], files["pareto.svg"] = pareto_figure(front, recs, (w, h), out)
    files["clocks.png"] = clocks_figure(df, thr, (w, h), out)

    doc = _build_doc(df, stores, front, recs, thr, failed_any, max_slowdown, files)
    (out / "report.md").write_text(doc.markdown(), encoding="utf-8")
    (out / "report.html").write_text(doc.html("dvfs sweep report"), encoding="utf-8")
    files["report.md"], files["report.html"] = out / "report.md", out / "report.html"
    return files


_READABLE = {
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


def _fmt_pct(v: object) -> str:
    """A percentage to one decimal (``""`` when missing; no ``-0.0``)."""
    if is_missing(v):
        return ""
    x = round(float(v), 1)
    return f"{0.0 if x == 0 else x:.1f}"


def _signed_pct(v: float) -> str:
    if abs(v) < 0.05:
        return "±0 %"
    return (f"{v:+.1f}" if abs(v) < 9.95 else f"{v:+.0f}").replace("-", "−") + " %"


def _scaled(df: pd.DataFrame, column: str, unit: str) -> tuple[list[str], str]:
    """A column in the SI prefix that suits it (as the figures do), and the prefixed unit."""
    from analysis.plots import si_scale

    values = pd.to_numeric(df[column], errors="coerce") if column in df else pd.Series(dtype=float)
    factor, label = si_scale(values.to_numpy(dtype=float, na_value=np.nan), unit)
    return [fmt_sig(v / factor) if not is_missing(v) else "" for v in values], label


def _group_name(key: dict, multi_device: bool) -> str:
    parts = [str(key.get("workload")), str(key.get("framework"))]
    if multi_device and not is_missing(key.get("device_name")):
        parts.append(str(key["device_name"]))
    return " / ".join(parts)


def _findings(recs: pd.DataFrame, thr: pd.DataFrame, max_slowdown: float) -> list[str]:
    """One sentence per group: what to set, what it saves and costs, and where checks failed."""
    multi = recs["device_name"].nunique(dropna=True) > 1 if "device_name" in recs else False
    out = []
    for key, pos in group_positions(recs, DEFAULT_GROUP):
        sub = recs.iloc[pos]
        by_obj = {o: r for o, r in zip(sub["objective"], (r for _, r in sub.iterrows()))
                  if not is_missing(o)}
        name = _group_name(key, multi)
        if not by_obj:
            out.append(f"{name}: {sub['note'].iat[0]}.")
            continue
        base = by_obj.get("baseline")
        against = "the default setting" if base is not None and base.get("baseline") == "default" \
            else f"the highest clock ({_setting_label(base)})" if base is not None else "nothing"
        text = [name + ":"]

        picks: dict[str, list[str]] = {}  # setting and its changes -> the objectives it wins
        for obj, lead in (("min_energy", "least energy per iteration"), ("min_edp", "least EDP"),
                          ("min_energy_within_slowdown",
                           f"least energy within {100 * max_slowdown:g} % of the baseline's time")):
            r = by_obj.get(obj)
            if r is None or is_missing(r.get("saving_pct")):
                continue
            what = (f"{_setting_label(r)} ({_signed_pct(-float(r['saving_pct']))} energy, "
                    f"{_signed_pct(float(r['slowdown_pct']))} time)")
            picks.setdefault(what, []).append(lead)
        parts = [f"{' and '.join(leads)} at {what}" for what, leads in picks.items()]
        text.append("; ".join(parts) + f", against {against}." if parts else
                    f"no saving to report against {against}.")
        t = thr
        if len(thr):
            t = thr[(thr["workload"] == key.get("workload"))
                    & (thr["framework"] == key.get("framework"))]
        if "device_name" in t and not is_missing(key.get("device_name")):
            t = t[t["device_name"] == key["device_name"]]
        for _, r in t.iterrows():
            hf, ls = r["failing_value"], r["stable_value"]
            if not is_missing(hf) and not is_missing(ls):
                text.append(f"Checks failed at {fmt_sig(hf)} MHz and stayed clean from "
                            f"{fmt_sig(ls)} MHz up.")
            elif not is_missing(hf):
                text.append(f"Checks failed up to {fmt_sig(hf)} MHz.")
            elif not is_missing(r["lowest_passing_value"]):
                text.append(f"No check failed down to {fmt_sig(r['lowest_passing_value'])} MHz.")
            break
        out.append(" ".join(text))
    return out


def _config_tables(df: pd.DataFrame, stores: list[dict]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """What varied across the trials' configs, and what every trial shared.

    The store's ``sweep`` meta is written by the sweep's first job, so its ``config`` is that
    job's; the trials' own configs tell the whole sweep. Other ``sweep`` meta items are listed
    among the shared settings (``started_at`` as a date).
    """
    seen: dict[str, list[str]] = {}
    n_rows = 0
    for cfg in df["config"] if "config" in df else []:
        if not isinstance(cfg, dict):
            continue
        n_rows += 1
        for k, v in _flatten(cfg):
            vals = seen.setdefault(k, [])
            text = "default" if is_missing(v) and k.endswith(("_mhz", "_w")) else fmt_sig(v)
            if text not in vals:
                vals.append(text)
    shared: list[tuple[str, str]] = []
    for s in stores:
        for k, v in _flatten(s["meta"].get("sweep") or {}):
            if k.startswith("config.") and n_rows:
                continue
            if k.endswith("_at") and isinstance(v, (int, float)) and not is_missing(v):
                v = _dt.datetime.fromtimestamp(float(v)).astimezone().strftime("%Y-%m-%d %H:%M %Z")
            shared.append((k, fmt_sig(v)))
    swept = [(k, v) for k, v in seen.items() if len(v) > 1]
    shared += [(k, v[0]) for k, v in seen.items() if len(v) == 1 and v[0] != ""]

    def clock_order(v: str) -> tuple:
        try:
            return (0, float(v))
        except ValueError:
            return (1, v)

    swept_df = pd.DataFrame({"setting": [k for k, _ in swept],
                             "values": [", ".join(sorted(v, key=clock_order)) for _, v in swept],
                             "count": [str(len(v)) for _, v in swept]})
    return swept_df, pd.DataFrame({"key": [k for k, _ in shared], "value": [v for _, v in shared]})


def _build_doc(df: pd.DataFrame, stores: list[dict], front: pd.DataFrame, recs: pd.DataFrame,
               thr: pd.DataFrame, failed_any: bool, max_slowdown: float,
               files: dict[str, Path]) -> Doc:
    doc = Doc()
    now = _dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    doc.h(1, "dvfs sweep report")
    n_ok = int((df["status"] == OK).sum())
    doc.p(f"Read {len(df)} trials ({n_ok} ok) from {len(stores)} store(s) at {now}. A sweep that "
          "is still running may have added trials since: run the report again to include them.")
    doc.items([f"{s['sweep_dir']}: {s['rows']} trials" for s in stores])

    doc.h(2, "Summary")
    doc.items(_findings(recs, thr, max_slowdown))
    repeats = pd.to_numeric(recs.get("n_repeats", pd.Series(dtype=float)), errors="coerce")
    if len(repeats.dropna()) and repeats.max() < 2:
        doc.p("One repeat per setting: the spread of a measurement is unknown, so differences of "
              "a few percent may be noise (set measure.repeats=3 or more to judge them).")

    doc.h(2, "Recommended settings")
    doc.p(f"Per group, against the baseline (the device's default setting, or the highest clock "
          f"when no default trial ran): the least energy per iteration, the least EDP "
          f"(energy x time) and ED²P (energy x time²), and the least energy within "
          f"{100 * max_slowdown:g} % of the baseline's time. Medians over repeats; 'beyond spread' "
          "says whether the energy ranges of the setting and the baseline are disjoint.")
    shown = recs.assign(setting=[_setting_label(r) for _, r in recs.iterrows()])
    times, tunit = _scaled(shown, "time_per_iter_s", "s")
    energies, eunit = _scaled(shown, "energy_per_iter_j", "J")
    rec_cols = [*DEFAULT_GROUP, "objective", "setting", "time_per_iter_s", "energy_per_iter_j",
                "saving_pct", "slowdown_pct", "saving_beyond_spread", "n_repeats", "baseline",
                "note"]
    rec_table = _display(shown, rec_cols)
    for col, values in (("time_per_iter_s", times), ("energy_per_iter_j", energies)):
        if col in rec_table:
            rec_table[col] = values
    for col in ("saving_pct", "slowdown_pct"):
        if col in rec_table:
            rec_table[col] = [_fmt_pct(v) for v in shown[col]]
    rec_table, common = _collapse_constant(rec_table, DEFAULT_GROUP)
    if common:
        doc.p(common)
    doc.table(rec_table.rename(columns={**_READABLE, "time_per_iter_s": f"time/iter ({tunit})",
                                        "energy_per_iter_j": f"energy/iter ({eunit})"}),
              limit=200)
    doc.image(files["pareto.png"], "Energy vs time per iteration; the step line is each series' "
                                   "Pareto front, small numbers are SM clock limits in MHz")

    doc.h(2, "Stability thresholds")
    if failed_any:
        doc.p("Per GPU and computation: the lowest SM clock with every trial ok and none failing "
              "above it, the highest clock with a failure, and a 95 % upper bound on the "
              "per-iteration fault rate at the threshold (rule of three: 3/n after n clean "
              "iterations).")
        thr_table, common = _collapse_constant(_display(thr, [
            "device_uuid", "device_name", "workload", "framework", "dtype", "precision",
            "stable_value", "failing_value", "non_monotone", "iterations_at_stable",
            "fault_rate_bound", "failure_statuses", "trials_used", "excluded_invalid_trials",
            "note"]), ["device_uuid", "device_name", "dtype", "precision"])
        if common:
            doc.p(common)
        doc.table(thr_table.rename(columns=_READABLE), limit=200)
    else:
        low = thr["lowest_passing_value"].min() if len(thr) else float("nan")
        doc.p(f"No trial failed: no threshold was reached (lowest clock passing: {fmt_sig(low)} MHz).")
    doc.image(files["clocks.png"], "Throughput, power and energy per unit of work vs SM clock")

    if df["framework"].nunique() >= 2 or df["device_name"].nunique() >= 2:
        doc.h(2, "Comparisons")
        for on in ("framework", "device_name"):
            vals = [v for v in dict.fromkeys(df[on].tolist()) if not is_missing(v)]
            if len(vals) < 2:
                continue
            a, b = vals[0], vals[1]
            try:
                cmp = compare(df, a, b, on=on)
            except UserError:
                continue
            doc.p(f"{a} / {b}: ratio of medians at matched settings (time and energy per "
                  "iteration); 'significant' needs every judged setting's repeat ranges disjoint "
                  "in the same direction, and enough repeats for that to be unlikely by chance.")
            cmp_table, common = _collapse_constant(_display(cmp, [
                c for c in DEFAULT_GROUP if c != on] + [
                "metric", "n_settings", "median_ratio", "min_ratio", "max_ratio",
                "n_beyond_spread", "n_judged", "p_chance", "significant"], drop_empty=False),
                [c for c in DEFAULT_GROUP if c != on])
            if common:
                doc.p(common)
            doc.table(cmp_table.rename(columns=_READABLE))

    doc.h(2, "Failed and invalid trials")
    bad = df[(df["status"] != OK) | ~truthy(df["valid"])]
    if not len(bad):
        doc.p("None.")
    else:
        why = [f"status={s}" if s != OK else f"invalid: {r if not is_missing(r) else 'no reason'}"
               for s, r in zip(bad["status"], bad["invalid_reason"])]
        summary = pd.Series(why).value_counts()
        doc.items([f"{n} x {reason}" for reason, n in summary.items()])
        shown = bad.assign(error=[(str(e)[:120] if not is_missing(e) else None) for e in bad["error"]])
        doc.table(_display(shown, ["workload", "framework", "device_name", "sm_clock_max_mhz",
                                   "power_limit_w", "repeat", "status", "valid", "invalid_reason",
                                   "error", "trial_key"]).rename(columns=_READABLE))
        excluded = front[~front["front_excluded_reason"].isna()]
        doc.p(f"{len(excluded)} of {len(front)} settings were kept out of the Pareto fronts "
              "(front.csv says why for each).")

    doc.h(2, "Sweep configuration")
    swept, shared = _config_tables(df, stores)
    counts = df.groupby(["workload", "framework"], dropna=False).size().reset_index(name="trials")
    doc.table(_display(counts, ["workload", "framework", "trials"]))
    if len(swept):
        doc.p("Swept (the values the trials' configurations took):")
        doc.table(swept, limit=200)
    if len(shared):
        doc.table(shared, limit=200, folded=f"Shared by every trial ({len(shared)} settings)")
    if not len(swept) and not len(shared):
        doc.p("No sweep configuration stored (meta key 'sweep', row key 'config').")

    doc.h(2, "Devices")
    retired = {uuid: r for st in stores for uuid, r in (st["meta"].get("retired_gpus") or {}).items()}
    dev = []
    for uuid, sub in df.groupby(df["device_uuid"].astype(str), dropna=False, sort=True):
        first = sub.iloc[0]
        dev.append({"device_uuid": uuid, "device_name": first["device_name"],
                    "driver_version": first["driver_version"], "backend": first["backend"],
                    "host": first["host"], "trials": len(sub),
                    "retired": retired[uuid]["reason"] if uuid in retired else None})
    doc.table(_display(pd.DataFrame(dev), ["device_uuid", "device_name", "driver_version",
                                           "backend", "host", "trials", "retired"]))
    if retired:
        doc.items([f"{r.get('label', 'GPU')} ({uuid}) on {r.get('host', '?')} was retired during "
                   f"the sweep and took no further trials: {r['reason']}"
                   for uuid, r in sorted(retired.items())])

    doc.h(2, "Library versions")
    doc.table(_versions(df, stores))
    doc.p("Files: " + ", ".join(sorted(files)) + ", report.md, report.html.")
    return doc


def _setting_label(r: pd.Series) -> str:
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


def _versions(df: pd.DataFrame, stores: list[dict]) -> pd.DataFrame:
    found: dict[str, list[str]] = {}

    def add(d: object) -> None:
        if isinstance(d, dict):
            for k, v in _flatten(d):
                vals = found.setdefault(k, [])
                if str(v) not in vals:
                    vals.append(str(v))

    for s in stores:
        add(s["meta"].get("versions"))
    for v in df["versions"]:
        add(v)
    for (fw, ver), _ in df.groupby(["framework", "framework_version"], dropna=True):
        vals = found.setdefault(str(fw), [])
        if str(ver) not in vals:
            vals.append(str(ver))
    commits = [c for c in dict.fromkeys(df["git_commit"].tolist()) if not is_missing(c)]
    if commits:
        found["git_commit"] = [str(c) for c in commits]
    drivers = [c for c in dict.fromkeys(df["driver_version"].tolist()) if not is_missing(c)]
    if drivers:
        found["driver"] = [str(c) for c in drivers]
    if not found:
        return pd.DataFrame({"library": ["(none recorded)"], "version": [""]})
    return pd.DataFrame({"library": list(found), "version": [", ".join(v) for v in found.values()]})


# -- command line --------------------------------------------------------------------------------

def _size(text: str) -> tuple[int, int]:
    try:
        w, h = text.lower().split("x")
        return int(w), int(h)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected WIDTHxHEIGHT in pixels, got {text!r}") from None


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error on one line (as every other bad input of ``dvfs``)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"dvfs report: error: {message} (see dvfs report --help)", file=sys.stderr)
        raise SystemExit(2)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="dvfs report",
        description="Turn sweep directories into plots, tables and a report (Markdown and HTML).")
    p.add_argument("paths", nargs="+", metavar="DIR",
                   help="sweep directory, multirun directory or trials.sqlite file")
    p.add_argument("--out", metavar="DIR",
                   help="where to write the report (default: DIR/report for the first DIR)")
    p.add_argument("--max-slowdown", type=float, default=0.10, metavar="FRACTION",
                   help="slowdown budget of the 'least energy within a slowdown' pick (0.1 = 10%%)")
    p.add_argument("--size", type=_size, default=DEFAULT_IMAGE_SIZE, metavar="WxH",
                   help="image size in pixels (default 1600x1000)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Runs ``dvfs report``.

    Args:
        argv: The arguments after ``report`` (default ``sys.argv[1:]``).

    Returns:
        0 on success; 2 on a usage error, a UserError (no store, an empty or unreadable store,
        a newer schema) or an output directory that cannot be written (a one-line message on
        stderr).
    """
    parser = _parser()
    try:
        args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as e:  # argparse has printed its message
        return int(e.code or 0)
    first = Path(args.paths[0])
    out = Path(args.out) if args.out else (first.parent if first.is_file() else first) / "report"
    try:
        files = write_report(args.paths, out, max_slowdown=args.max_slowdown, image_size=args.size)
    except UserError as e:
        print(f"dvfs report: error: {' '.join(str(e).split())}", file=sys.stderr)
        return getattr(e, "exit_code", 2)
    except OSError as e:  # --out names a file, or a directory we may not write to
        where = e.filename or out
        print(f"dvfs report: error: cannot write the report to {where}: {e.strerror or e}",
              file=sys.stderr)
        return 2
    print(f"report written to {out}")
    for name in ("report.html", "report.md", "pareto.png", "clocks.png"):
        print(f"  {files[name]}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
