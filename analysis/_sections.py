"""The report's sections, in the order a reader asks: one function each, over finished frames.

:func:`build_doc` runs :data:`SECTIONS` over one :class:`ReportData` (the trial rows and the
frames :func:`analysis.report.write_report` computed once: settings with their front,
recommendations, thresholds, and the figure files). A section adds headings, paragraphs, tables
and images to a :class:`analysis._doc.Doc`; it computes nothing the report has computed already.
"""

from __future__ import annotations

import datetime as _dt
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from analysis._doc import Doc
from analysis._format import fmt_sig, pct_cell, signed_pct
from analysis._frame import (
    DEFAULT_GROUP,
    NOT_MEASURED,
    OK,
    OUT_OF_MEMORY,
    group_positions,
    is_missing,
    truthy,
)
from analysis._tables import (
    READABLE,
    collapse_constant,
    config_tables,
    devices_table,
    display,
    scaled,
    setting_label,
    sim_provenance,
    versions_table,
)
from analysis.compare import compare
from orchestrator.errors import UserError


@dataclass(frozen=True)
class ReportData:
    """What every section reads: computed once by ``write_report``.

    Attributes:
        df: every trial row.
        stores: the stores' meta (:func:`analysis.load_meta`).
        front: the settings (repeats reduced) with their Pareto front marked.
        recs: :func:`analysis.recommend` of the settings.
        thr: :func:`analysis.thresholds` of the rows.
        max_slowdown: the slowdown budget, a fraction.
        files: the files written so far, by name (the figures among them).
    """

    df: pd.DataFrame
    stores: list[dict]
    front: pd.DataFrame
    recs: pd.DataFrame
    thr: pd.DataFrame
    max_slowdown: float
    files: dict[str, Path]
    boards: pd.DataFrame | None = None  # :func:`analysis.boards.compare_boards`; None: not run
    phases: pd.DataFrame | None = None  # :func:`analysis.phases.sweep_phases`; None: not run

    @property
    def failed_any(self) -> bool:
        """Whether any trial's status is other than ok."""
        return bool((self.df["status"] != OK).any())


def _group_name(key: dict, multi_device: bool) -> str:
    parts = [str(key.get("workload")), str(key.get("framework"))]
    if multi_device and not is_missing(key.get("device_name")):
        parts.append(str(key["device_name"]))
    return " / ".join(parts)


def _picks(by_obj: dict[str, pd.Series], max_slowdown: float) -> list[str]:
    """The recommended settings of one group in words, each with the objectives it wins."""
    picks: dict[str, list[str]] = {}  # setting and its changes -> the objectives it wins
    for obj, lead in (("min_energy", "least energy per iteration"), ("min_edp", "least EDP"),
                      ("min_energy_within_slowdown",
                       f"least energy within {100 * max_slowdown:g} % of the baseline's time")):
        r = by_obj.get(obj)
        if r is None or is_missing(r.get("saving_pct")):
            continue
        what = (f"{setting_label(r)} ({signed_pct(-float(r['saving_pct']))} energy, "
                f"{signed_pct(float(r['slowdown_pct']))} time)")
        picks.setdefault(what, []).append(lead)
    return [f"{' and '.join(leads)} at {what}" for what, leads in picks.items()]


def _threshold_sentence(thr: pd.DataFrame, key: dict) -> str | None:
    """Where the group's checks failed, from its first threshold row; None without one."""
    t = thr
    if len(thr):
        t = thr[(thr["workload"] == key.get("workload"))
                & (thr["framework"] == key.get("framework"))]
    if "device_name" in t and not is_missing(key.get("device_name")):
        t = t[t["device_name"] == key["device_name"]]
    for _, r in t.iterrows():
        hf, ls = r["failing_value"], r["stable_value"]
        if not is_missing(hf) and not is_missing(ls):
            return f"Checks failed at {fmt_sig(hf)} MHz and stayed clean from {fmt_sig(ls)} MHz up."
        if not is_missing(hf):
            return f"Checks failed up to {fmt_sig(hf)} MHz."
        if not is_missing(r["lowest_passing_value"]):
            return f"No check failed down to {fmt_sig(r['lowest_passing_value'])} MHz."
        return None
    return None


def findings(recs: pd.DataFrame, thr: pd.DataFrame, max_slowdown: float) -> list[str]:
    """One sentence per group: what to set, what it saves and costs, and where checks failed."""
    multi = recs["device_name"].nunique(dropna=True) > 1 if "device_name" in recs else False
    out = []
    for key, pos in group_positions(recs, DEFAULT_GROUP):
        sub = recs.iloc[pos]
        by_obj = {o: r for o, (_, r) in zip(sub["objective"], sub.iterrows()) if not is_missing(o)}
        name = _group_name(key, multi)
        if not by_obj:
            out.append(f"{name}: {sub['note'].iat[0]}.")
            continue
        base = by_obj.get("baseline")
        against = ("nothing" if base is None else "the default setting"
                   if base.get("baseline") == "default"
                   else f"the highest clock ({setting_label(base)})")
        parts = _picks(by_obj, max_slowdown)
        text = [name + ":", "; ".join(parts) + f", against {against}." if parts
                else f"no saving to report against {against}."]
        sentence = _threshold_sentence(thr, key)
        if sentence:
            text.append(sentence)
        out.append(" ".join(text))
    return out


# --- the sections, in order ---------------------------------------------------------------------
def header(doc: Doc, d: ReportData) -> None:
    """The title, what was read from where, and whether the GPU was simulated."""
    now = _dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    doc.h(1, "dvfs sweep report")
    for line in sim_provenance(d.df):
        doc.p(line)
    n_ok = int((d.df["status"] == OK).sum())
    n_nm = int((d.df["status"] == NOT_MEASURED).sum())
    unmeasured = f", {n_nm} not measured" if n_nm else ""
    doc.p(f"Read {len(d.df)} trials ({n_ok} ok{unmeasured}; each trial's latest attempt) from "
          f"{len(d.stores)} store(s) at {now}. A sweep that is still running may have added "
          "trials since: run the report again to include them.")
    doc.items([f"{s['sweep_dir']}: {s['rows']} trials" for s in d.stores])


def summary(doc: Doc, d: ReportData) -> None:
    """One sentence per workload and framework, and a warning when repeats cannot judge noise."""
    doc.h(2, "Summary")
    doc.items(findings(d.recs, d.thr, d.max_slowdown))
    repeats = pd.to_numeric(d.recs.get("n_repeats", pd.Series(dtype=float)), errors="coerce")
    if len(repeats.dropna()) and repeats.max() < 2:
        doc.p("One repeat per setting: the spread of a measurement is unknown, so differences of "
              "a few percent may be noise (set measure.repeats=3 or more to judge them).")


def _per_iteration_table(frame: pd.DataFrame, columns: list[str]) -> tuple[pd.DataFrame, dict]:
    """``frame``'s ``columns`` for display, each row's setting labelled, time and energy per
    iteration in the units that suit their range; with the renames that name those units."""
    shown = frame.assign(setting=[setting_label(r) for _, r in frame.iterrows()])
    times, tunit = scaled(shown, "time_per_iter_s", "s")
    energies, eunit = scaled(shown, "energy_per_iter_j", "J")
    table = display(shown, columns)
    for col, values in (("time_per_iter_s", times), ("energy_per_iter_j", energies)):
        if col in table:
            table[col] = values
    return table, {"time_per_iter_s": f"time/iter ({tunit})",
                   "energy_per_iter_j": f"energy/iter ({eunit})"}


def recommendations(doc: Doc, d: ReportData) -> None:
    """The recommendations table, in the figures' units, and the Pareto figure."""
    doc.h(2, "Recommended settings")
    doc.p(f"Per group, against the baseline (the device's default setting, or the highest clock "
          f"when no default trial ran): the least energy per iteration, the least EDP "
          f"(energy x time) and ED²P (energy x time²), and the least energy within "
          f"{100 * d.max_slowdown:g} % of the baseline's time. Medians over repeats; 'beyond "
          "spread' says whether the energy ranges of the setting and the baseline are disjoint.")
    table, units = _per_iteration_table(d.recs, [
        *DEFAULT_GROUP, "objective", "setting", "time_per_iter_s", "energy_per_iter_j",
        "saving_pct", "slowdown_pct", "saving_beyond_spread", "n_repeats", "baseline", "note"])
    for col in ("saving_pct", "slowdown_pct"):
        if col in table:
            table[col] = [pct_cell(v) for v in d.recs[col]]
    table, common = collapse_constant(table, DEFAULT_GROUP)
    if common:
        doc.p(common)
    doc.table(table.rename(columns={**READABLE, **units}), limit=200)
    doc.image(d.files["pareto.png"], "Energy vs time per iteration; the step line is each "
                                     "series' Pareto front, small numbers are SM clock limits "
                                     "in MHz")


_OBJECTIVE_WORDS = {"energy_per_work": "least energy per iteration", "time_per_work":
                    "least time per iteration", "edp": "least EDP", "ed2p": "least ED²P"}


def boards(doc: Doc, d: ReportData) -> None:
    """Each board at its own best setting, per computation (only when there are two boards)."""
    if d.boards is None or not len(d.boards):
        return
    doc.h(2, "Boards side by side")
    objective = str(d.boards["objective"].iat[0])
    doc.p(f"Per computation, each board at the setting that is best on it for the sweep's "
          f"objective ({_OBJECTIVE_WORDS.get(objective, objective)}), among its usable settings: "
          "one iteration is the same work on every board, so time and energy per iteration are "
          "per unit of work. 'x best' is the board's value over the least of the boards "
          "(1: the best board).")
    table, units = _per_iteration_table(d.boards, [
        *DEFAULT_GROUP, "setting", "time_per_iter_s", "time_vs_best", "energy_per_iter_j",
        "energy_vs_best", "avg_power_w", "observed_sm_clock_mhz", "n_settings"])
    table, common = collapse_constant(table, [c for c in DEFAULT_GROUP if c != "device_name"])
    if common:
        doc.p(common)
    doc.table(table.rename(columns={
        **READABLE, **units, "device_name": "board", "time_vs_best": "time x best",
        "energy_vs_best": "energy x best", "avg_power_w": "power (W)",
        "observed_sm_clock_mhz": "SM clock seen (MHz)", "n_settings": "usable settings"}),
        limit=200)
    if "boards.png" in d.files:
        doc.image(d.files["boards.png"], "Each board at its best setting (filled) and at its "
                                         "default setting (hollow), per computation")


def stability(doc: Doc, d: ReportData) -> None:
    """The stability thresholds table (or that none was reached) and the clock figure."""
    doc.h(2, "Stability thresholds")
    if d.failed_any:
        doc.p("Per GPU and computation: the lowest SM clock with every trial ok and none failing "
              "above it, the highest clock with a failure, and a 95 % upper bound on the "
              "per-iteration fault rate at the threshold (rule of three: 3/n after n clean "
              "iterations).")
        table, common = collapse_constant(display(d.thr, [
            "device_uuid", "device_name", "workload", "framework", "dtype", "precision",
            "stable_value", "failing_value", "non_monotone", "iterations_at_stable",
            "fault_rate_bound", "failure_statuses", "trials_used", "excluded_invalid_trials",
            "note"]), ["device_uuid", "device_name", "dtype", "precision"])
        if common:
            doc.p(common)
        doc.table(table.rename(columns=READABLE), limit=200)
    else:
        low = d.thr["lowest_passing_value"].min() if len(d.thr) else float("nan")
        doc.p(f"No trial failed: no threshold was reached (lowest clock passing: "
              f"{fmt_sig(low)} MHz).")
    doc.image(d.files["clocks.png"], "Throughput, power and energy per unit of work vs SM clock")


def comparisons(doc: Doc, d: ReportData) -> None:
    """Two frameworks (or two GPU models) side by side at matched settings, where there are two."""
    df = d.df
    if df["framework"].nunique() < 2 and df["device_name"].nunique() < 2:
        return
    doc.h(2, "Comparisons")
    for on in ("framework", "device_name"):
        vals = [v for v in dict.fromkeys(df[on].tolist()) if not is_missing(v)]
        pairs = list(itertools.combinations(vals, 2)) if on == "framework" else [vals[:2]]
        for pair in pairs:  # every pair of frameworks (JAX / TF, JAX / PyTorch, TF / PyTorch)
            if len(pair) == 2:
                _comparison(doc, df, pair, on)


def _comparison(doc: Doc, df: pd.DataFrame, pair: Sequence[object], on: str) -> None:
    """One pair of values of ``on`` compared at matched settings (nothing where none match)."""
    a, b = pair
    try:
        cmp = compare(df, a, b, on=on)
    except UserError:
        return
    doc.p(f"{a} / {b}: ratio of medians at matched settings (time and energy per "
          "iteration); 'significant' needs every judged setting's repeat ranges disjoint "
          "in the same direction, and enough repeats for that to be unlikely by chance.")
    others = [c for c in DEFAULT_GROUP if c != on]
    table, common = collapse_constant(display(cmp, [
        *others, "metric", "n_settings", "median_ratio", "min_ratio", "max_ratio",
        "n_beyond_spread", "n_judged", "p_chance", "significant"], drop_empty=False), others)
    if common:
        doc.p(common)
    doc.table(table.rename(columns=READABLE))


def memory(doc: Doc, d: ReportData) -> None:
    """Frameworks side by side: throughput in each workload's own unit, energy per item and peak
    device memory at the settings every framework ran, with the study's published figures
    beside ours (absent when no trial recorded memory)."""
    from analysis.frameworks import framework_table

    peak = pd.to_numeric(d.df.loc[d.df["status"] == OK, "peak_memory_bytes"], errors="coerce")
    if not peak.notna().any():
        return
    doc.h(2, "Frameworks side by side")
    table = framework_table(d.df)
    rows = [{
        "workload": r["workload"], "framework": r["framework"], "device_name": r["device_name"],
        "settings matched": r["n_matched"],
        "throughput": f"{fmt_sig(r['rate'])} {r['rate_unit']}",
        "energy per item (J)": fmt_sig(r["energy_per_item_j"]),
        "peak memory (GiB)": fmt_sig(r["peak_memory_bytes"] / 2**30),
        "peak per item (MiB)": fmt_sig(r["peak_memory_per_item_bytes"] / 2**20),
        "NVML used after (GiB)": fmt_sig(r["memory_used_after_bytes"] / 2**30),
        "from": str(r["memory_source"]),
        "published": "-" if is_missing(r["published"]) else r["published"],
    } for _, r in table.iterrows()]
    doc.p("Medians over the settings every framework of the workload ran ok (peak: the "
          "largest). 'published' is the study's figure for that framework, theirs, with the "
          "version and board they ran: not a measurement of this sweep. On the simulated GPU "
          "the peak is the workload's modelled footprint at its sim_size, the same for every "
          "framework, and NVML's used memory adds each framework's allocator policy: it cannot "
          "tell which framework needs less memory (docs/workloads.md, Memory).")
    doc.table(pd.DataFrame(rows))


def not_measured(doc: Doc, d: ReportData) -> None:
    """The trials that measured nothing (their GPU was unhealthy, their worker was killed from
    outside): no result, no failure, listed apart; absent when there are none."""
    _set_apart(doc, d, NOT_MEASURED, "Not measured", (
        "{n} trial row(s) measured nothing, because of the circumstances and not the "
        "setting: they are neither results nor failures, and are left out of the fronts, the "
        "recommendations and the thresholds. Running the same command again measures them "
        "(hydra.launcher.retry=not_measured, the default), as a new attempt beside these."),
        ["workload", "framework", "device_name", "device_uuid", "sm_clock_max_mhz",
         "power_limit_w", "repeat", "attempt", "error", "trial_key"], error_chars=160)


def out_of_memory(doc: Doc, d: ReportData) -> None:
    """The trials whose size did not fit the device's (or the host's) memory: no evidence about
    their setting, listed apart from the failures; absent when there are none."""
    _set_apart(doc, d, OUT_OF_MEMORY, "Out of memory", (
        "{n} trial row(s) did not fit the memory of their device or host at their "
        "size: they say nothing about the setting, are left out of the fronts and the "
        "thresholds, and a re-run does not run them again at the same size "
        "(workload.size=auto picks the largest size that fits)."),
        ["workload", "framework", "size", "device_name", "sm_clock_max_mhz", "power_limit_w",
         "repeat", "error"], error_chars=200)


def _set_apart(doc: Doc, d: ReportData, status: str, title: str, text: str,
               columns: list[str], error_chars: int) -> None:
    """A section of the rows of one status that are neither results nor failures (``text``
    says why, ``{n}`` their count); absent when there are none."""
    rows = d.df[d.df["status"] == status]
    if not len(rows):
        return
    doc.h(2, title)
    doc.p(text.format(n=len(rows)))
    shown = rows.assign(error=[(str(e)[:error_chars] if not is_missing(e) else None)
                               for e in rows["error"]])
    doc.table(display(shown, columns).rename(columns=READABLE))


def failures(doc: Doc, d: ReportData) -> None:
    """The failed and invalid trials, counted by reason, and what was kept off the fronts."""
    doc.h(2, "Failed and invalid trials")
    bad = d.df[((d.df["status"] != OK) | ~truthy(d.df["valid"]))
               & ~d.df["status"].isin([NOT_MEASURED, OUT_OF_MEMORY])]
    if not len(bad):
        doc.p("None.")
        return
    why = [f"status={s}" if s != OK else f"invalid: {r if not is_missing(r) else 'no reason'}"
           for s, r in zip(bad["status"], bad["invalid_reason"])]
    doc.items([f"{n} x {reason}" for reason, n in pd.Series(why).value_counts().items()])
    shown = bad.assign(error=[(str(e)[:120] if not is_missing(e) else None) for e in bad["error"]])
    doc.table(display(shown, ["workload", "framework", "device_name", "sm_clock_max_mhz",
                              "power_limit_w", "repeat", "status", "failed_by", "valid",
                              "invalid_reason", "error", "trial_key"]).rename(columns=READABLE))
    excluded = d.front[~d.front["front_excluded_reason"].isna()]
    doc.p(f"{len(excluded)} of {len(d.front)} settings were kept out of the Pareto fronts "
          "(front.csv says why for each).")


def time_spent(doc: Doc, d: ReportData) -> None:
    """Each sweep's efficiency: its windows' share of its trials' wall time, and what else took
    the most (rows without phase times, from older stores, are left out)."""
    if d.phases is None or not len(d.phases):
        return
    doc.h(2, "Where the time went")
    doc.p("Wall time of the trials, phase by phase (seconds, summed over each sweep's rows); the "
          "efficiency is the windows' share of it. The physical limit of a sweep is its windows "
          "and the check runs its checks need; every other phase is overhead. On the simulated "
          "GPU a window's device time is virtual: these are the host's seconds.")
    items = []
    for r in d.phases.itertuples():
        items.append(f"{r.sweep_id}: {r.trials} trials in {r.wall_s:.1f} s; windows "
                     f"{r.phase_window_s:.1f} s ({100 * r.efficiency:.0f} %); the biggest other "
                     f"phase: {r.biggest_other.replace('_', ' ')}, {r.biggest_other_s:.1f} s")
    doc.items(items)
    table = d.phases.drop(columns=["biggest_other", "biggest_other_s"]).rename(
        columns=lambda c: c.removeprefix("phase_"))
    doc.table(display(table, list(table.columns)))


def configuration(doc: Doc, d: ReportData) -> None:
    """Trials per workload and framework, what was swept, and what every trial shared."""
    doc.h(2, "Sweep configuration")
    swept, shared = config_tables(d.df, d.stores)
    counts = d.df.groupby(["workload", "framework"], dropna=False).size().reset_index(name="trials")
    doc.table(display(counts, ["workload", "framework", "trials"]))
    if len(swept):
        doc.p("Swept (the values the trials' configurations took):")
        doc.table(swept, limit=200)
    if len(shared):
        doc.table(shared, limit=200, folded=f"Shared by every trial ({len(shared)} settings)")
    if not len(swept) and not len(shared):
        doc.p("No sweep configuration stored (meta key 'sweep', row key 'config').")


def devices(doc: Doc, d: ReportData) -> None:
    """Every GPU the trials ran on, and those retired during the sweep and why."""
    doc.h(2, "Devices")
    retired = {uuid: r for st in d.stores
               for uuid, r in (st["meta"].get("retired_gpus") or {}).items()}
    doc.table(devices_table(d.df, retired))
    doc.items([f"{r.get('label', 'GPU')} ({uuid}) on {r.get('host', '?')} was retired during "
               f"the sweep and took no further trials: {r['reason']}"
               for uuid, r in sorted(retired.items())])


def versions(doc: Doc, d: ReportData) -> None:
    """The library versions, and the files of the report."""
    doc.h(2, "Library versions")
    doc.table(versions_table(d.df, d.stores))
    doc.p("Files: " + ", ".join(sorted(d.files)) + ", report.md, report.html.")


SECTIONS: tuple[Callable[[Doc, ReportData], None], ...] = (
    header, summary, recommendations, boards, stability, comparisons, memory, failures,
    out_of_memory, not_measured, time_spent, configuration, devices, versions,
)
"""The report's sections, in reading order."""


def build_doc(data: ReportData) -> Doc:
    """The whole report as one document: every section of :data:`SECTIONS` in order."""
    doc = Doc()
    for section in SECTIONS:
        section(doc, data)
    return doc
