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

matplotlib is imported only inside :func:`write_report`, with the Agg backend and no pyplot.
"""

from __future__ import annotations

import argparse
import base64
import datetime as _dt
import html
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis._frame import DEFAULT_GROUP, OK, fmt_sig, group_positions, is_missing, truthy
from analysis.load import PathsLike, export, load, load_meta
from analysis.pareto import pareto_front
from analysis.recommend import aggregate_repeats, compare, recommend
from analysis.thresholds import thresholds
from orchestrator.errors import UserError

DEFAULT_IMAGE_SIZE = (1600, 1000)
_DPI = 100
_MAX_LISTED = 40  # rows of a long table shown in the report (all of them are in the CSVs)


# -- building blocks, rendered both as Markdown and as HTML -------------------------------------

class _Doc:
    """A report as a list of blocks, rendered to Markdown and to self-contained HTML."""

    def __init__(self) -> None:
        self.blocks: list[tuple[str, Any]] = []

    def h(self, level: int, text: str) -> None:
        self.blocks.append(("h", (level, text)))

    def p(self, text: str) -> None:
        self.blocks.append(("p", text))

    def items(self, items: Sequence[str]) -> None:
        if items:
            self.blocks.append(("ul", list(items)))

    def table(self, df: pd.DataFrame, limit: int = _MAX_LISTED) -> None:
        shown = df.head(limit)
        self.blocks.append(("table", shown))
        if len(df) > limit:
            self.p(f"... and {len(df) - limit} more rows (see the CSV files).")

    def image(self, path: Path, alt: str) -> None:
        self.blocks.append(("img", (path, alt)))

    def markdown(self) -> str:
        out: list[str] = []
        for kind, v in self.blocks:
            if kind == "h":
                out.append("#" * v[0] + " " + v[1])
            elif kind == "p":
                out.append(v)
            elif kind == "ul":
                out.append("\n".join(f"- {i}" for i in v))
            elif kind == "table":
                out.append(_md_table(v))
            elif kind == "img":
                out.append(f"![{v[1]}]({v[0].name})")
        return "\n\n".join(out) + "\n"

    def html(self, title: str) -> str:
        body: list[str] = []
        for kind, v in self.blocks:
            if kind == "h":
                body.append(f"<h{v[0]}>{html.escape(v[1])}</h{v[0]}>")
            elif kind == "p":
                body.append(f"<p>{html.escape(v)}</p>")
            elif kind == "ul":
                body.append("<ul>" + "".join(f"<li>{html.escape(i)}</li>" for i in v) + "</ul>")
            elif kind == "table":
                body.append(v.to_html(index=False, escape=True, na_rep="", border=0,
                                      classes="data"))
            elif kind == "img":
                path, alt = v
                data = base64.b64encode(path.read_bytes()).decode("ascii")
                body.append(f'<figure><img alt="{html.escape(alt)}" '
                            f'src="data:image/png;base64,{data}"><figcaption>'
                            f"{html.escape(alt)}</figcaption></figure>")
        css = (
            "body{font-family:system-ui,sans-serif;max-width:1700px;margin:2em auto;padding:0 1em;"
            "color:#222}table.data{border-collapse:collapse;font-size:13px;margin:.5em 0 1.5em}"
            "table.data th,table.data td{border:1px solid #ccc;padding:3px 7px;text-align:right}"
            "table.data th{background:#f2f2f2}img{max-width:100%;border:1px solid #ddd}"
            "figcaption{font-size:13px;color:#555}"
        )
        return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
                f"<title>{html.escape(title)}</title><style>{css}</style></head><body>\n"
                + "\n".join(body) + "\n</body></html>\n")


def _md_cell(v: object) -> str:
    return str(v).replace("|", "\\|").replace("\n", " ")


def _md_table(df: pd.DataFrame) -> str:
    if not len(df.columns):
        return ""
    head = "| " + " | ".join(_md_cell(c) for c in df.columns) + " |"
    rule = "|" + "|".join("---" for _ in df.columns) + "|"
    rows = ["| " + " | ".join(_md_cell(v) for v in r) + " |"
            for r in df.itertuples(index=False, name=None)]
    return "\n".join([head, rule, *rows])


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


# -- figures -------------------------------------------------------------------------------------

def _grid(n: int) -> tuple[int, int]:
    if n <= 3:
        return 1, n
    cols = 2 if n == 4 else 3
    return math.ceil(n / cols), cols


def _workloads(df: pd.DataFrame) -> list[object]:
    return list(dict.fromkeys(df["workload"].tolist()))


def _rows_of(df: pd.DataFrame, workload: object) -> pd.DataFrame:
    mask = np.array([(w == workload) or (is_missing(w) and is_missing(workload))
                     for w in df["workload"]])
    return df[mask]


def _figure(image_size: tuple[int, int]) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    w, h = image_size
    fig = Figure(figsize=(w / _DPI, h / _DPI), dpi=_DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _pareto_figure(agg: pd.DataFrame, recs: pd.DataFrame, image_size: tuple[int, int],
                   out: Path) -> tuple[Path, Path]:
    from analysis import plots

    workloads = _workloads(agg)
    fig = _figure(image_size)
    nrows, ncols = _grid(len(workloads))
    axes = np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False)).ravel()
    cols = plots.series_columns(agg, DEFAULT_GROUP)
    names = [plots.series_label(k, cols) for k, _ in group_positions(agg, DEFAULT_GROUP)]
    styles = plots.series_styles(names)
    handles: dict[str, Any] = {}
    panels = []
    for ax, w in zip(axes, workloads):
        sub = _rows_of(agg, w)
        handles.update(plots.plot_pareto(ax, sub, styles=styles, recommendations=recs,
                                         series=cols, legend=False, labels=False))
        panels.append((ax, sub))
    for ax in axes[len(workloads):]:
        ax.set_visible(False)
    fig.legend(handles=list(handles.values()), loc="outside lower center",
               ncols=min(len(handles), 5), fontsize=9, frameon=False)
    fig.suptitle("Energy vs time per iteration (lower left is better). Changes in the labels are "
                 "against the default setting, or the highest clock where no default trial ran",
                 fontsize=11)
    fig.draw_without_rendering()
    fig.set_layout_engine("none")  # freeze the layout, then place labels in display space
    for ax, sub in panels:
        plots.label_settings(ax, sub, recs, styles=styles, series=cols)
    png, svg = out / "pareto.png", out / "pareto.svg"
    fig.savefig(png, dpi=_DPI)
    fig.savefig(svg)
    return png, svg


def _clocks_figure(df: pd.DataFrame, thr: pd.DataFrame, image_size: tuple[int, int],
                   out: Path) -> Path:
    from analysis import plots

    workloads = _workloads(df)
    fig = _figure(image_size)
    axes = fig.subplots(len(workloads), 3, squeeze=False)
    cols = plots.series_columns(df, DEFAULT_GROUP)
    styles = plots.series_styles([plots.series_label(k, cols)
                                  for k, _ in group_positions(df, DEFAULT_GROUP)])
    for row, w in zip(axes, workloads):
        sub = _rows_of(df, w)
        t = _rows_of(thr, w) if len(thr) else thr
        handles = plots.plot_clocks(row, sub, styles=styles, thresholds=t, series=cols,
                                    legend=False)
        row[2].legend(handles=list(handles.values()), fontsize=7, loc="center left",
                      bbox_to_anchor=(1.02, 0.5), frameon=False)
    fig.suptitle("Response to the SM clock limit (medians of usable repeats; dots: every repeat)",
                 fontsize=12)
    png = out / "clocks.png"
    fig.savefig(png, dpi=_DPI)
    return png


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
    files["pareto.png"], files["pareto.svg"] = _pareto_figure(front, recs, (w, h), out)
    files["clocks.png"] = _clocks_figure(df, thr, (w, h), out)

    doc = _build_doc(df, stores, front, recs, thr, failed_any, max_slowdown, files)
    (out / "report.md").write_text(doc.markdown(), encoding="utf-8")
    (out / "report.html").write_text(doc.html("dvfs sweep report"), encoding="utf-8")
    files["report.md"], files["report.html"] = out / "report.md", out / "report.html"
    return files


def _build_doc(df: pd.DataFrame, stores: list[dict], front: pd.DataFrame, recs: pd.DataFrame,
               thr: pd.DataFrame, failed_any: bool, max_slowdown: float,
               files: dict[str, Path]) -> _Doc:
    doc = _Doc()
    now = _dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    doc.h(1, "dvfs sweep report")
    n_ok = int((df["status"] == OK).sum())
    doc.p(f"Read {len(df)} trials ({n_ok} ok) from {len(stores)} store(s) at {now}. A sweep that "
          "is still running may have added trials since: run the report again to include them.")
    doc.items([f"{s['sweep_dir']}: {s['rows']} trials" for s in stores])

    doc.h(2, "Sweep configuration")
    any_cfg = False
    for s in stores:
        sweep = s["meta"].get("sweep")
        if sweep:
            any_cfg = True
            flat = _flatten(sweep)
            doc.p(f"{s['sweep_dir']}:")
            doc.table(pd.DataFrame({"key": [k for k, _ in flat],
                                    "value": [fmt_sig(v) for _, v in flat]}))
    if not any_cfg:
        doc.p("No sweep configuration stored (meta key 'sweep').")
    counts = df.groupby(["workload", "framework"], dropna=False).size().reset_index(name="trials")
    doc.table(_display(counts, ["workload", "framework", "trials"]))

    doc.h(2, "Devices")
    dev = []
    for uuid, sub in df.groupby(df["device_uuid"].astype(str), dropna=False, sort=True):
        first = sub.iloc[0]
        dev.append({"device_uuid": uuid, "device_name": first["device_name"],
                    "driver_version": first["driver_version"], "backend": first["backend"],
                    "host": first["host"], "trials": len(sub)})
    doc.table(_display(pd.DataFrame(dev), ["device_uuid", "device_name", "driver_version",
                                           "backend", "host", "trials"]))

    doc.h(2, "Recommended settings")
    doc.p(f"Per group, against the baseline (the device's default setting, or the highest clock "
          f"when no default trial ran): the least energy per iteration, the least EDP "
          f"(energy x time) and ED²P (energy x time²), and the least energy within "
          f"{100 * max_slowdown:g} % of the baseline's time. Medians over repeats; 'beyond spread' "
          "says whether the energy ranges of the setting and the baseline are disjoint.")
    recs = recs.assign(setting=[_setting_label(r) for _, r in recs.iterrows()])
    rec_cols = [*DEFAULT_GROUP, "objective", "setting", "time_per_iter_s", "energy_per_iter_j", "saving_pct", "slowdown_pct",
                "saving_beyond_spread", "n_repeats", "baseline", "note"]
    rec_table, common = _collapse_constant(_display(recs, rec_cols), DEFAULT_GROUP)
    if common:
        doc.p(common)
    doc.table(rec_table.rename(columns={
        "time_per_iter_s": "time/iter (s)", "energy_per_iter_j": "energy/iter (J)",
        "saving_pct": "energy saved (%)", "slowdown_pct": "slowdown (%)",
        "saving_beyond_spread": "beyond spread"}), limit=200)
    doc.image(files["pareto.png"], "Energy vs time per iteration; the step line is each series' "
                                   "Pareto front")

    doc.h(2, "Stability thresholds")
    if failed_any:
        doc.p("Per GPU and computation: the lowest SM clock with every trial ok and none failing "
              "above it, the highest clock with a failure, and a 95 % upper bound on the "
              "per-iteration fault rate at the threshold (rule of three: 3/n after n clean "
              "iterations).")
        thr_table, common = _collapse_constant(_display(thr, [
            "device_uuid", "device_name", "workload", "framework", "dtype", "precision",
            "lowest_stable_mhz", "highest_failing_mhz", "non_monotone", "iterations_at_stable",
            "fault_rate_bound", "failure_statuses", "trials_used", "excluded_invalid_trials",
            "note"]), ["device_uuid", "device_name", "dtype", "precision"])
        if common:
            doc.p(common)
        doc.table(thr_table, limit=200)
    else:
        low = thr["lowest_passing_mhz"].min() if len(thr) else float("nan")
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
            doc.table(cmp_table)

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
                                   "error", "trial_key"]))
        excluded = front[~front["front_excluded_reason"].isna()]
        doc.p(f"{len(excluded)} of {len(front)} settings were kept out of the Pareto fronts "
              "(front.csv says why for each).")

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


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
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
        0 on success; 2 on a usage error or a UserError (a one-line message on stderr).
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
        print(f"dvfs report: {' '.join(str(e).split())}", file=sys.stderr)
        return getattr(e, "exit_code", 2)
    print(f"report written to {out}")
    for name in ("report.html", "report.md", "pareto.png", "clocks.png"):
        print(f"  {files[name]}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
