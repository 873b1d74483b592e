"""Reading results stores into a DataFrame, and writing frames out.

One row of the frame is one trial (one repeat of one setting), exactly as the trial wrote it, plus
``sweep_dir``: the directory of the store it came from, and ``peak_memory_per_item_bytes``: the
trial's peak device memory per sample (or token) of one call, for workloads that count them. Every
column of the row schema is present even when no row had it (filled with missing values), so the
analysis functions can rely on it. Stores are opened read-only, so a sweep that is still running can
be read: the frame holds every trial committed so far.

A trial run again (a re-run of one stored as not measured) is stored as a new attempt beside the
old; by default the frame holds each trial's latest attempt (:func:`latest_attempts`), and a
not-measured trial that its job measured since on another GPU is left out too.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from analysis._frame import NOT_MEASURED
from orchestrator.errors import UserError
from orchestrator.results.rows import failed_by
from orchestrator.results.store import (
    STORE_FILENAME,
    ResultStore,
    StoreError,
    StoreNotFoundError,
    find_stores,
)

ROW_COLUMNS: list[str] = [
    # identity
    "schema_version", "sweep_id", "trial_key", "repeat", "attempt", "host", "started_at",
    "ended_at",
    "device_index", "device_uuid", "device_name", "driver_version", "backend", "framework",
    "framework_version", "workload", "size", "dtype", "precision",
    # settings asked (None: the device's default)
    "sm_clock_min_mhz", "sm_clock_max_mhz", "mem_clock_mhz", "power_limit_w", "clock_offset_mhz",
    "default_setting",
    # observed
    "observed_sm_clock_mhz", "avg_power_w", "peak_power_w", "temperature_start_c", "temperature_c",
    "throttle_reasons",
    # measured
    "iterations", "time_s", "time_per_iter_s", "throughput", "tflops", "gbps", "energy_j",
    "energy_per_iter_j", "energy_per_tflop_j", "energy_per_gb_j",
    # in the workload's own unit (samples/s, tokens/s...)
    "rate_unit", "rate", "items_per_call", "energy_per_item_j",
    # device memory
    "peak_memory_bytes", "framework_peak_bytes", "memory_source", "memory_used_before_bytes",
    "memory_used_after_bytes",
    # checks
    "rel_error", "max_abs_error", "nonfinite_count", "determinism_mismatches", "status",
    "failed_by", "error", "digest", "checked_iters", "check_time_s", "outputs_sampled",
    "outputs_compared", "samples_note", "bytes_to_host",
    # validity
    "valid", "invalid_reason", "meter", "energy_counter_updates", "energy_counter_period_s",
    "window_aligned", "energy_note",
    # the work of one call as compiled (charged on the sim; kernels/cost.py)
    "charged_flops", "charged_bytes", "charged_launches", "charged_transcendentals", "work_kind",
    "work_source", "work_note",
    # where the trial's wall time went (orchestrator.measuring.phases.PHASES)
    "phase_build_s", "phase_settings_s", "phase_steady_s", "phase_warmup_s", "phase_edge_wait_s",
    "phase_window_s", "phase_check_run_s", "phase_compare_s", "phase_restore_s", "wall_s",
    # context
    "config", "versions", "git_commit", "config_hash",
]
"""The columns of a trial row the frame shows first, in its order: a selection of the one
declaration, ``orchestrator.results.columns.ROW_COLUMNS`` (a test ties the two)."""


class EmptyStoreError(StoreError):
    """The stores exist but hold no trials yet."""


PathsLike = str | Path | Sequence[str | Path]


def _as_paths(paths: PathsLike) -> list[Path]:
    if isinstance(paths, (str, Path)):
        return [Path(paths)]
    out = [Path(p) for p in paths]
    if not out:
        raise UserError("no sweep directory given")
    return out


def store_paths(paths: PathsLike) -> list[Path]:
    """The store files under one or many paths, each once.

    Args:
        paths: Sweep directories, multirun directories holding sweep directories, or store files.

    Returns:
        The store files, in the order found.

    Raises:
        StoreNotFoundError: A path does not exist or holds no store.
    """
    seen: set[Path] = set()
    found: list[Path] = []
    for p in _as_paths(paths):
        stores = find_stores(p)
        if not stores:
            raise StoreNotFoundError(f"no results store ({STORE_FILENAME}) found under {p}")
        for s in stores:
            key = s.resolve()
            if key not in seen:
                seen.add(key)
                found.append(s)
    return found


def load(
    paths: PathsLike, *, include_invalid: bool = True, attempts: str = "latest"
) -> pd.DataFrame:
    """Loads the trials of one or many stores into one frame.

    Args:
        paths: Sweep directories, multirun directories, or store files.
        include_invalid: If False, keep only rows whose ``valid`` is True (this also drops
            crashed trials whose writer marked them invalid).
        attempts: ``latest`` (each trial's latest attempt, see :func:`latest_attempts`) or
            ``all`` (every attempt ever stored).

    Returns:
        One row per trial, with every row-schema column and ``sweep_dir``.

    Raises:
        StoreNotFoundError: A path holds no store.
        EmptyStoreError: The stores hold no trials.
        StoreSchemaError, CorruptStoreError: A store cannot be read.
    """
    records: list[dict[str, Any]] = []
    stores = store_paths(paths)
    for path in stores:
        with ResultStore(path, readonly=True) as store:
            sweep_dir = str(path.parent)
            for row in store.iter_rows():
                row["sweep_dir"] = sweep_dir
                records.append(row)
    if not records:
        names = ", ".join(str(s) for s in stores)
        raise EmptyStoreError(f"no trials stored yet in {names}")
    df = pd.DataFrame.from_records(records)
    extra = [c for c in df.columns if c not in ROW_COLUMNS and c != "sweep_dir"]
    for c in ROW_COLUMNS:
        if c not in df.columns:
            df[c] = pd.Series([None] * len(df), index=df.index, dtype=object)
    df = df[ROW_COLUMNS + extra + ["sweep_dir"]]
    df = df.assign(  # rows stored before attempts and failed_by existed
        attempt=[1 if _missing(a) else int(a) for a in df["attempt"]],
        failed_by=[failed_by(s) if _missing(f) else f
                   for s, f in zip(df["status"], df["failed_by"])],
    )
    peak = pd.to_numeric(df["peak_memory_bytes"], errors="coerce")
    items = pd.to_numeric(df["items_per_call"], errors="coerce")
    df["peak_memory_per_item_bytes"] = peak / items  # per sample or token (NaN: no items)
    if attempts == "latest":
        df = latest_attempts(df)
    elif attempts != "all":
        raise UserError(f"attempts={attempts!r} is not one of: latest, all")
    if not include_invalid:
        keep = [v is True or (isinstance(v, bool) and v) for v in df["valid"].tolist()]
        df = df[keep]
    return df.reset_index(drop=True)


def _missing(value: object) -> bool:
    return value is None or (isinstance(value, float) and value != value)


def latest_attempts(df: pd.DataFrame) -> pd.DataFrame:
    """Each trial's latest attempt; and no not-measured trial whose job was measured since.

    A trial key's rows of its highest ``attempt`` stand for it. With ``placement=any`` a job run
    again may land on another GPU (another trial key): its old key's not-measured rows are then
    dropped too when the same job (``config_hash``) in the same store has a measured row that
    started later.
    """
    if not len(df):
        return df
    latest = df.groupby("trial_key", dropna=False)["attempt"].transform("max")
    df = df[df["attempt"] == latest]
    not_measured = (df["status"] == NOT_MEASURED).to_numpy()
    if not not_measured.any():
        return df.reset_index(drop=True)
    started = pd.to_numeric(df["started_at"], errors="coerce")
    measured = df[~not_measured].assign(_t=started[~not_measured])
    last = measured.groupby(["sweep_dir", "config_hash"], dropna=False)["_t"].max()
    drop = [nm and (sd, ch) in last.index and last[(sd, ch)] > t
            for nm, sd, ch, t in zip(not_measured, df["sweep_dir"], df["config_hash"], started)]
    return df[~pd.Series(drop, index=df.index)].reset_index(drop=True)


def load_meta(paths: PathsLike) -> list[dict[str, Any]]:
    """The sweep-level context of each store.

    Args:
        paths: As for :func:`load`.

    Returns:
        One dict per store: ``store`` (path), ``sweep_dir``, ``rows`` (count) and ``meta``
        (every item stored with ``ResultStore.put_meta``, by key).
    """
    out = []
    for path in store_paths(paths):
        with ResultStore(path, readonly=True) as store:
            out.append(
                {
                    "store": path,
                    "sweep_dir": str(path.parent),
                    "rows": len(store),
                    "meta": store.meta(),
                }
            )
    return out


def _cell_to_text(value: object) -> object:
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value, sort_keys=True, default=str)
    return value


def flatten_for_file(df: pd.DataFrame) -> pd.DataFrame:
    """Returns ``df`` with list and dict cells (throttle reasons, config) as JSON text."""
    out = df.copy()
    for c in out.columns:
        if out[c].dtype == object and any(isinstance(v, (list, tuple, dict)) for v in out[c]):
            out[c] = out[c].map(_cell_to_text)
    return out


def export(df: pd.DataFrame, path: str | Path) -> Path:
    """Writes a frame to ``.csv`` or ``.parquet``, chosen by the path's suffix.

    List and dict cells are written as JSON text, so both formats hold the same table.

    Args:
        df: The frame.
        path: The file to write; its directory is created.

    Returns:
        The path written.

    Raises:
        UserError: The suffix is neither ``.csv`` nor ``.parquet``.
    """
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix not in (".csv", ".parquet"):
        raise UserError(f"cannot export to {p}: give a .csv or .parquet file name")
    p.parent.mkdir(parents=True, exist_ok=True)
    flat = flatten_for_file(df)
    if suffix == ".csv":
        flat.to_csv(p, index=False)
    else:
        for c in flat.columns:  # parquet wants one type per column: mixed objects become text
            if flat[c].dtype == object:
                kinds = {type(v) for v in flat[c] if v is not None and not pd.isna(v)}
                if len(kinds) > 1:
                    flat[c] = flat[c].map(lambda v: v if v is None or pd.isna(v) else str(v))
        flat.to_parquet(p, index=False)
    return p
