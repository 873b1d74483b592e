"""The sweep report: ``dvfs report DIR... [--out DIR] [--max-slowdown 0.1]``.

:func:`write_report` reads one or more stores (a sweep still running included: it reads what is
committed) and writes, into one directory:

- ``pareto.png`` / ``pareto.svg``: energy vs time per iteration, one panel per workload, with the
  Pareto front of each series and the default and recommended settings labelled;
- ``clocks.png``: throughput, power and energy per unit of work against the SM clock, one row
  per workload, with the clock ranges where failures were seen shaded;
- ``report.md`` and ``report.html`` (one self-contained file: images inline as base64 data URIs);
- ``trials.csv`` (every row), ``front.csv`` (every setting, with ``on_front`` and why a setting
  was excluded), ``recommendations.csv`` and, when any trial failed, ``thresholds.csv``;
- when the trials ran on two boards or more (GPU models): ``boards.csv`` and ``boards.png``,
  each board at its own best setting per computation (:mod:`analysis.boards`).

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
import sys
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from analysis._figures import boards_figure, clocks_figure, pareto_figure
from analysis._sections import ReportData, build_doc
from analysis.boards import compare_boards, sweep_objective
from analysis.load import PathsLike, export, load, load_meta
from analysis.pareto import pareto_front
from analysis.phases import sweep_phases
from analysis.recommend import aggregate_repeats, recommend
from analysis.setting_labels import label_texts
from analysis.thresholds import thresholds
from orchestrator.errors import UserError

DEFAULT_IMAGE_SIZE = (1600, 1000)


def write_report(
    paths: PathsLike,
    out_dir: str | Path,
    *,
    max_slowdown: float = 0.10,
    image_size: tuple[int, int] = DEFAULT_IMAGE_SIZE,
) -> dict[str, Path]:
    """Writes the report of one or more sweeps.

    Every frame (settings and their front, recommendations, thresholds, the figure's labels) is
    computed once here and handed to the figures and the sections, which only arrange them.

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
    front = front if front.index.is_unique else front.reset_index(drop=True)
    recs = recommend(agg, max_slowdown=max_slowdown)
    thr, boards = thresholds(df), compare_boards(agg, sweep_objective(df))  # boards: 2 or more
    data = ReportData(df, stores, front, recs, thr, max_slowdown, {}, boards, sweep_phases(df))

    files = data.files
    files["trials.csv"] = export(df, out / "trials.csv")
    files["front.csv"] = export(front, out / "front.csv")
    files["recommendations.csv"] = export(recs, out / "recommendations.csv")
    if data.failed_any:
        files["thresholds.csv"] = export(thr, out / "thresholds.csv")
    texts = label_texts(front, recs)
    files["pareto.png"], files["pareto.svg"] = pareto_figure(front, recs, texts, (w, h), out)
    files["clocks.png"] = clocks_figure(df, agg, thr, (w, h), out)
    files.update(_board_files(boards, agg, (w, h), out))

    doc = build_doc(data)
    (out / "report.md").write_text(doc.markdown(), encoding="utf-8")
    (out / "report.html").write_text(doc.html("dvfs sweep report"), encoding="utf-8")
    files["report.md"], files["report.html"] = out / "report.md", out / "report.html"
    return files


def _board_files(boards: pd.DataFrame, agg: pd.DataFrame, image_size: tuple[int, int],
                 out: Path) -> dict[str, Path]:
    """``boards.csv`` and ``boards.png`` when the trials ran on two boards or more."""
    if not len(boards):
        return {}
    return {"boards.csv": export(boards, out / "boards.csv"),
            "boards.png": boards_figure(boards, agg, image_size, out)}


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
    for name in ("report.html", "report.md", "pareto.png", "clocks.png", "boards.png"):
        if name in files:
            print(f"  {files[name]}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
