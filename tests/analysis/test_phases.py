"""``analysis.sweep_phases``: each sweep's windows against its trials' wall time."""

from __future__ import annotations

import pandas as pd
import pytest

from analysis.phases import COLUMNS, sweep_phases


def _row(sweep, key, **phases):
    row = {"sweep_id": sweep, "trial_key": key, **{c: None for c in COLUMNS}}
    row.update({f"phase_{k}_s": v for k, v in phases.items()})
    timed = [v for v in phases.values() if v is not None]
    row["wall_s"] = sum(timed) if timed else None
    return row


def test_a_sweeps_efficiency_is_its_windows_share_and_the_biggest_other_phase_is_named():
    df = pd.DataFrame([
        _row("a", "t1", build=2.0, window=1.0, check_run=0.5, compare=3.0),
        _row("a", "t1", window=1.0, check_run=0.5, compare=0.1, restore=0.1),  # its 2nd repeat
        _row("a", "t2", build=0.1, window=1.0, check_run=0.5, compare=0.2),
        _row("b", "t3", window=2.0, edge_wait=2.5),
        _row("old", "t4"),  # stored before rows had phase times: left out
    ])
    out = sweep_phases(df).set_index("sweep_id")
    assert list(out.index) == ["a", "b"]
    a = out.loc["a"]
    assert a["trials"] == 2
    assert a["wall_s"] == pytest.approx(10.0)
    assert a["phase_window_s"] == pytest.approx(3.0)
    assert a["efficiency"] == pytest.approx(0.3)
    assert (a["biggest_other"], a["biggest_other_s"]) == ("compare", pytest.approx(3.3))
    b = out.loc["b"]
    assert b["efficiency"] == pytest.approx(2.0 / 4.5)
    assert b["biggest_other"] == "edge_wait"


def test_rows_without_phase_times_give_an_empty_frame():
    assert sweep_phases(pd.DataFrame([_row("old", "t")])).empty
    assert sweep_phases(pd.DataFrame({"sweep_id": ["x"], "trial_key": ["k"]})).empty
    (only,) = sweep_phases(pd.DataFrame([_row("x", "k", window=1.0)])).itertuples()
    assert only.efficiency == 1.0
