"""Numbers as the report and the figures write them: significant digits and percentages.

One home for the text of a number, so that a saving reads the same in the summary sentence, in
the table and in the Pareto figure's label: a figure that says ``−3 %`` beside a sentence that
says ``−3.4 %`` makes a reader wonder which one is wrong.
"""

from __future__ import annotations

import numpy as np

from analysis._frame import is_missing


def fmt_sig(value: object, digits: int = 4) -> str:
    """A number with ``digits`` significant digits, or "" when missing.

    Whole floats print without a decimal point (``1185``, not ``1185.0``), booleans as
    ``yes``/``no``, anything else as its ``str``.
    """
    if is_missing(value):
        return ""
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        if float(value).is_integer() and abs(value) < 1e6:
            return str(int(value))
        return f"{float(value):.{digits}g}"
    return str(value)


def signed_pct(v: float) -> str:
    """A signed change in percent, as prose and figure labels write it.

    One decimal under 10 % (where a tenth of a percent is a fair share of the change), none
    from 10 % up; a true minus sign; ``±0 %`` for anything that rounds to zero, so that a
    rounding error never reads as ``−0.0 %``: ``−24 %``, ``+3.4 %``, ``+0.4 %``, ``±0 %``.
    """
    if abs(v) < 0.05:
        return "±0 %"
    return (f"{v:+.1f}" if abs(v) < 9.95 else f"{v:+.0f}").replace("-", "−") + " %"


def pct_cell(v: object) -> str:
    """A percentage for a table cell: one decimal, no sign or unit (the header has them).

    ``""`` when missing; ``0.0``, never ``-0.0``.
    """
    if is_missing(v):
        return ""
    x = round(float(v), 1)
    return f"{0.0 if x == 0 else x:.1f}"
