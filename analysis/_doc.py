"""A report document: headings, paragraphs, lists, tables and images, as Markdown and HTML.

The report's content is built once as a list of blocks (:class:`Doc`) and rendered twice: to
Markdown (images referenced by file name, beside the report) and to one self-contained HTML file
(images inline as base64 data URIs, so the file can be mailed or attached on its own).

The HTML is for reading in a browser: numeric columns right-aligned and text columns left-aligned,
striped rows, headers and long text cells that wrap, wide tables that scroll inside their own box
rather than widening the page, images scaled to the page width but never beyond their own.
"""

from __future__ import annotations

import base64
import html
import re
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

MAX_LISTED = 40
"""Rows of a long table shown in the report (all of them are in the CSV files)."""

_NUMBER = re.compile(r"^[−+-]?(\d+(\.\d*)?|\.\d+)([eE][−+-]?\d+)?( ?%)?$")
_WIDE_TEXT = 28  # characters: text cells longer than this wrap within a bounded width

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;max-width:1660px;
margin:1.5em auto;padding:0 1.2em;color:#1b1b1b;line-height:1.45}
h1{font-size:1.7em;margin:.2em 0 .4em}h2{font-size:1.3em;margin:1.6em 0 .5em;
border-bottom:1px solid #ddd;padding-bottom:.15em}
p,li{max-width:75em}ul{padding-left:1.4em}li{margin:.2em 0}
.scroll{overflow-x:auto;margin:.4em 0 1.2em}
table.data{border-collapse:collapse;font-size:13px;font-variant-numeric:tabular-nums}
table.data th,table.data td{border:1px solid #d4d4d4;padding:3px 8px;vertical-align:top}
table.data th{background:#eef1f4;text-align:left;font-weight:600;vertical-align:bottom;
min-width:4em;max-width:10em}
table.data tbody tr:nth-child(even){background:#f8f9fa}
table.data .num{text-align:right}table.data td.num{white-space:nowrap}
table.data .text{text-align:left}
table.data td.wide{min-width:16em;max-width:34em}
figure{margin:.8em 0 1.6em}
figure img{display:block;width:100%;height:auto;border:1px solid #ddd}
figcaption{font-size:13px;color:#555;margin-top:.3em}
details summary{cursor:pointer;color:#333;margin:.3em 0}
"""


class Doc:
    """A report as a list of blocks, rendered to Markdown and to self-contained HTML."""

    def __init__(self) -> None:
        self.blocks: list[tuple[str, Any]] = []

    def h(self, level: int, text: str) -> None:
        """A heading of ``level`` (1 for the title)."""
        self.blocks.append(("h", (level, text)))

    def p(self, text: str) -> None:
        """A paragraph of plain text."""
        self.blocks.append(("p", text))

    def items(self, items: Sequence[str]) -> None:
        """A bulleted list (nothing when empty)."""
        if items:
            self.blocks.append(("ul", list(items)))

    def table(self, df: pd.DataFrame, limit: int = MAX_LISTED, folded: str | None = None) -> None:
        """A table of text cells, cut at ``limit`` rows with a note.

        Args:
            df: The table, cells already formatted as text.
            limit: The most rows shown.
            folded: If given, a line that leads the table: in the HTML the table is folded
                under it (a click shows it), in the Markdown it is a paragraph before it.
        """
        shown = df.head(limit)
        self.blocks.append(("table", (shown, folded)))
        if len(df) > limit:
            self.p(f"... and {len(df) - limit} more rows (see the CSV files).")

    def image(self, path: Path, alt: str) -> None:
        """A PNG image with a caption (inline in the HTML, by file name in the Markdown)."""
        self.blocks.append(("img", (path, alt)))

    def markdown(self) -> str:
        """The document as Markdown."""
        out: list[str] = []
        for kind, v in self.blocks:
            if kind == "h":
                out.append("#" * v[0] + " " + v[1])
            elif kind == "p":
                out.append(v)
            elif kind == "ul":
                out.append("\n".join(f"- {i}" for i in v))
            elif kind == "table":
                if v[1]:
                    out.append(v[1] + ":")
                out.append(md_table(v[0]))
            elif kind == "img":
                out.append(f"![{v[1]}]({v[0].name})")
        return "\n\n".join(out) + "\n"

    def html(self, title: str) -> str:
        """The document as one self-contained HTML page."""
        body: list[str] = []
        for kind, v in self.blocks:
            if kind == "h":
                body.append(f"<h{v[0]}>{html.escape(v[1])}</h{v[0]}>")
            elif kind == "p":
                body.append(f"<p>{html.escape(v)}</p>")
            elif kind == "ul":
                body.append("<ul>" + "".join(f"<li>{html.escape(i)}</li>" for i in v) + "</ul>")
            elif kind == "table":
                table, folded = v
                block = f'<div class="scroll">{html_table(table)}</div>'
                if folded:
                    block = f"<details><summary>{html.escape(folded)}</summary>{block}</details>"
                body.append(block)
            elif kind == "img":
                body.append(_html_image(*v))
        return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
                f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
                f"<title>{html.escape(title)}</title><style>{' '.join(_CSS.split())}</style>"
                "</head><body>\n" + "\n".join(body) + "\n</body></html>\n")


def _html_image(path: Path, alt: str) -> str:
    data = path.read_bytes()
    width = ""
    if data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR":
        w, h = struct.unpack(">II", data[16:24])
        width = f' width="{w}" height="{h}" style="max-width:{w}px"'
    src = base64.b64encode(data).decode("ascii")
    return (f'<figure><img alt="{html.escape(alt)}"{width} src="data:image/png;base64,{src}">'
            f"<figcaption>{html.escape(alt)}</figcaption></figure>")


def _md_cell(v: object) -> str:
    return str(v).replace("|", "\\|").replace("\n", " ")


def md_table(df: pd.DataFrame) -> str:
    """A table as GitHub-flavoured Markdown."""
    if not len(df.columns):
        return ""
    head = "| " + " | ".join(_md_cell(c) for c in df.columns) + " |"
    rule = "|" + "|".join("---" for _ in df.columns) + "|"
    rows = ["| " + " | ".join(_md_cell(v) for v in r) + " |"
            for r in df.itertuples(index=False, name=None)]
    return "\n".join([head, rule, *rows])


def is_number_text(text: object) -> bool:
    """Whether a formatted cell reads as a number (``12``, ``-0.5``, ``1.2e-05``, ``35 %``)."""
    return bool(_NUMBER.match(str(text).strip()))


def html_table(df: pd.DataFrame) -> str:
    """A table as HTML: numeric columns right-aligned, text left, long text wrapping."""
    kinds = []
    for c in df.columns:
        cells = [str(v) for v in df[c] if str(v) not in ("", "nan", "None")]
        numeric = bool(cells) and all(is_number_text(v) for v in cells)
        wide = not numeric and any(len(v) > _WIDE_TEXT for v in cells)
        kinds.append("num" if numeric else "text wide" if wide else "text")
    head = "".join(f'<th class="{k.split()[0]}">{html.escape(str(c))}</th>'
                   for c, k in zip(df.columns, kinds))
    rows = []
    for r in df.itertuples(index=False, name=None):
        cells = "".join(f'<td class="{k}">{html.escape("" if _blank(v) else str(v))}</td>'
                        for v, k in zip(r, kinds))
        rows.append(f"<tr>{cells}</tr>")
    return (f'<table class="data"><thead><tr>{head}</tr></thead><tbody>'
            + "".join(rows) + "</tbody></table>")


def _blank(v: object) -> bool:
    if v is None:
        return True
    try:
        return bool(pd.isna(v))
    except (TypeError, ValueError):
        return False
