"""The results store: durable, idempotent, safe with several writers and after a kill."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # the repository is not installed in the venv
    sys.path.insert(0, str(ROOT))

from orchestrator.errors import UserError  # noqa: E402
from orchestrator.results.store import (  # noqa: E402
    KEYS_PER_QUERY,
    SCHEMA_VERSION,
    STORE_FILENAME,
    CorruptStoreError,
    ResultStore,
    StoreError,
    StoreNotFoundError,
    StoreSchemaError,
    find_stores,
)


def row(key: str, repeat: int = 0, **extra) -> dict:
    return {"trial_key": key, "repeat": repeat, "status": "ok", "workload": "gemm",
            "framework": "jax", "device_uuid": "GPU-1", "started_at": 1.7e9, **extra}


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


WRITER = textwrap.dedent("""
    import sys
    from orchestrator.results.store import ResultStore
    sweep_dir, prefix, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    store = ResultStore(sweep_dir)
    for i in range(n):
        store.put({"trial_key": f"{prefix}-{i}", "repeat": 0, "status": "ok", "payload": "x" * 500})
        print(i, flush=True)  # after put returns: committed
    store.close()
""")


def test_put_then_has_and_rows_round_trip(tmp_path):
    with ResultStore(tmp_path) as store:
        assert store.put(row("a", 0, energy_j=np.float64(1.5), iterations=np.int64(7),
                             samples=np.array([1.0, 2.0]), valid=np.bool_(True), nan=float("nan")))
        assert store.put(row("a", 1))
        assert store.has("a", 0) and store.has("a", 1) and not store.has("a", 2)
        assert not store.has("b")
        assert store.keys() == {("a", 0), ("a", 1)}
        assert len(store) == 2
        first = store.rows()[0]
    assert first["energy_j"] == 1.5 and first["iterations"] == 7
    assert first["samples"] == [1.0, 2.0] and first["valid"] is True
    assert np.isnan(first["nan"])
    assert (tmp_path / STORE_FILENAME).is_file()


def test_put_of_a_stored_key_returns_false_and_keeps_the_first_row(tmp_path):
    with ResultStore(tmp_path) as store:
        assert store.put(row("a", status="ok"))
        assert store.put(row("a", status="wrong")) is False
        assert [r["status"] for r in store.rows()] == ["ok"]
    with ResultStore(tmp_path) as again:  # a re-run into the same directory
        assert again.put(row("a")) is False
        assert len(again) == 1


def test_rows_come_back_in_insertion_order(tmp_path):
    keys = [f"k{i:02d}" for i in (5, 3, 9, 1, 7)]
    with ResultStore(tmp_path) as store:
        for k in keys:
            store.put(row(k))
        assert [r["trial_key"] for r in store.rows()] == keys


def test_a_row_without_its_key_or_with_an_unstorable_value_is_refused(tmp_path):
    with ResultStore(tmp_path) as store:
        with pytest.raises(StoreError, match="trial_key"):
            store.put({"repeat": 0})
        with pytest.raises(StoreError, match="repeat"):
            store.put({"trial_key": "a", "repeat": "0"})
        with pytest.raises(StoreError, match="cannot be stored"):
            store.put(row("a", handle=object()))
        assert len(store) == 0
    assert issubclass(StoreError, UserError)


def test_meta_is_stored_replaced_and_read_back(tmp_path):
    with ResultStore(tmp_path) as store:
        assert store.get_meta("sweep") is None
        store.put_meta("sweep", {"clocks": [510, 1410], "measure": {"window_s": 2.0}})
        store.put_meta("sweep", {"clocks": [510]})
        store.put_meta("versions", {"jax": "0.10.2"})
    with ResultStore(tmp_path, readonly=True) as ro:
        assert ro.get_meta("sweep") == {"clocks": [510]}
        assert ro.meta() == {"sweep": {"clocks": [510]}, "versions": {"jax": "0.10.2"}}
        assert ro.schema_version == SCHEMA_VERSION


def test_readonly_store_refuses_writes_and_a_missing_one_is_not_found(tmp_path):
    with pytest.raises(StoreNotFoundError, match="no results store"):
        ResultStore(tmp_path / "nowhere", readonly=True)
    assert not (tmp_path / "nowhere").exists()
    ResultStore(tmp_path).close()
    with ResultStore(tmp_path, readonly=True) as ro, pytest.raises(StoreError, match="read-only"):
        ro.put(row("a"))


def test_a_reader_sees_rows_committed_while_the_writer_is_still_open(tmp_path):
    with ResultStore(tmp_path) as writer:
        writer.put(row("a"))
        with ResultStore(tmp_path, readonly=True) as reader:
            assert reader.keys() == {("a", 0)}
            writer.put(row("b"))
            assert reader.keys() == {("a", 0), ("b", 0)}


def test_a_writer_killed_mid_stream_leaves_every_committed_row(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), "k", "100000"],
                            stdout=subprocess.PIPE, text=True, env=_env())
    committed = -1
    assert proc.stdout is not None
    for line in proc.stdout:
        committed = int(line)
        if committed >= 150:
            break
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    assert proc.returncode == -signal.SIGKILL
    assert (tmp_path / f"{STORE_FILENAME}-wal").exists()  # the log a killed writer leaves
    with ResultStore(tmp_path, readonly=True) as ro:  # WAL recovery on open
        keys = ro.keys()
    assert {(f"k-{i}", 0) for i in range(committed + 1)} <= keys
    with ResultStore(tmp_path) as again:  # and a resumed sweep can write on
        assert again.put(row("after-kill"))
        assert len(again) == len(keys) + 1


def test_two_writer_processes_at_once_lose_no_row(tmp_path):
    n = 150
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), p, str(n)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              env=_env()) for p in ("a", "b")]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    with ResultStore(tmp_path, readonly=True) as ro:
        assert ro.keys() == {(f"{p}-{i}", 0) for p in ("a", "b") for i in range(n)}


def test_a_store_from_a_newer_schema_is_refused_naming_both_versions(tmp_path):
    ResultStore(tmp_path).close()
    with sqlite3.connect(tmp_path / STORE_FILENAME) as conn:
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    for readonly in (True, False):
        with pytest.raises(StoreSchemaError) as e:
            ResultStore(tmp_path, readonly=readonly)
        assert f"version {SCHEMA_VERSION + 1}" in str(e.value)
        assert f"version {SCHEMA_VERSION} " in str(e.value)


@pytest.mark.parametrize("content", [b"not a database at all\n" * 50, b"\x00" * 4096, b"x"])
def test_a_garbage_file_is_reported_corrupt_and_left_untouched(tmp_path, content):
    path = tmp_path / STORE_FILENAME
    path.write_bytes(content)
    for readonly in (False, True):
        with pytest.raises(CorruptStoreError, match="untouched"):
            ResultStore(tmp_path, readonly=readonly)
    assert path.read_bytes() == content
    assert sorted(p.name for p in tmp_path.iterdir()) == [STORE_FILENAME]


def test_a_malformed_sqlite_file_is_reported_corrupt_and_left_untouched(tmp_path):
    with ResultStore(tmp_path) as store:
        for i in range(300):
            store.put(row(f"k{i}", payload="y" * 300))
    path = tmp_path / STORE_FILENAME
    data = bytearray(path.read_bytes())
    page = 4096
    data[page * 2: page * 6] = os.urandom(page * 4)  # scramble b-tree pages, keep the header
    path.write_bytes(bytes(data))
    before = path.read_bytes()
    with pytest.raises(CorruptStoreError):
        with ResultStore(tmp_path, readonly=True) as ro:
            ro.rows()
    assert path.read_bytes() == before


def test_another_sqlite_database_is_not_taken_for_a_store(tmp_path):
    path = tmp_path / STORE_FILENAME
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE other (x)")
    before = path.read_bytes()
    with pytest.raises(CorruptStoreError, match="not a dvfs results store"):
        ResultStore(tmp_path)
    assert path.read_bytes() == before


def test_find_stores_searches_multirun_directories(tmp_path):
    for sub in ("multirun/0", "multirun/1", "multirun/2/nested"):
        ResultStore(tmp_path / sub).close()
    (tmp_path / "multirun" / "3").mkdir()
    found = find_stores(tmp_path / "multirun")
    assert found == sorted(tmp_path / s / STORE_FILENAME
                           for s in ("multirun/0", "multirun/1", "multirun/2/nested"))
    assert find_stores(tmp_path / "multirun/0") == [tmp_path / "multirun/0" / STORE_FILENAME]
    assert find_stores(found[0]) == [found[0]]
    assert find_stores(tmp_path / "multirun" / "3") == []
    with pytest.raises(StoreNotFoundError):
        find_stores(tmp_path / "missing")


def test_a_store_opened_by_file_path_is_the_same_store(tmp_path):
    with ResultStore(tmp_path) as store:
        store.put(row("a"))
    with ResultStore(tmp_path / STORE_FILENAME, readonly=True) as ro:
        assert ro.path == ResultStore(tmp_path, readonly=True).path
        assert ro.keys() == {("a", 0)}


# --- the rows of given trial keys ---------------------------------------------------------------
def test_rows_for_gives_each_asked_key_its_rows_in_repeat_order(tmp_path):
    with ResultStore(tmp_path) as store:
        for key, repeat in [("b", 2), ("a", 0), ("b", 0), ("c", 0), ("b", 1)]:
            store.put(row(key, repeat))
        found = store.rows_for(iter(["b", "missing", "a", "b"]))  # any iterable, duplicates once
        assert list(found) == ["b", "a"]  # in the order asked; a key with no row is absent
        assert [r["repeat"] for r in found["b"]] == [0, 1, 2]
        assert [(r["trial_key"], r["repeat"]) for r in found["a"]] == [("a", 0)]
        assert store.rows_for([]) == {}
    with ResultStore(tmp_path, readonly=True) as ro:  # a reader asks the same
        assert ro.rows_for(["c"]) == {"c": [{**row("c", 0), "attempt": 1}]}  # the first


def test_rows_for_ten_thousand_keys_is_one_indexed_query_per_batch(tmp_path):
    n = 10_000
    ResultStore(tmp_path).close()
    with sqlite3.connect(tmp_path / STORE_FILENAME) as conn:  # fast setup: one transaction
        conn.executemany(
            "INSERT INTO trials (trial_key, repeat, stored_at, row_json) VALUES (?, ?, 0, ?)",
            ((f"k{i}", r, f'{{"trial_key": "k{i}", "repeat": {r}}}')
             for i in range(n) for r in (1, 0)),
        )
        query = ("SELECT id, trial_key, row_json FROM trials WHERE trial_key IN (?, ?) "
                 "ORDER BY trial_key, repeat")
        plan = conn.execute(f"EXPLAIN QUERY PLAN {query}", ("k1", "k2")).fetchall()
    assert any("USING INDEX" in step[-1] for step in plan), plan  # no scan of the table
    asked = [f"k{i}" for i in range(0, n, 2)] + [f"absent{i}" for i in range(n // 2)]
    selects: list[str] = []
    with ResultStore(tmp_path, readonly=True) as ro:
        ro._conn.set_trace_callback(lambda sql: selects.append(sql) if "SELECT" in sql else None)
        found = ro.rows_for(asked)
    assert len(found) == n // 2
    assert all([r["repeat"] for r in rows] == [0, 1] for rows in found.values())
    batches = -(-len(asked) // KEYS_PER_QUERY)
    assert len(selects) == batches > 1  # one query per batch of keys, none per key


def test_rows_for_on_a_store_with_no_tables_yet_is_empty(tmp_path):
    (tmp_path / STORE_FILENAME).write_bytes(b"")  # a store another process is still creating
    with ResultStore(tmp_path, readonly=True) as ro:
        assert ro.rows_for(["a"]) == {}


# --- a full disk ---------------------------------------------------------------------------------
def test_a_full_store_is_a_storage_error_that_keeps_every_row_and_says_how_to_resume(tmp_path):
    """SQLite's SQLITE_FULL, as a full disk gives it, made by capping the file's page count."""
    from orchestrator.errors import StorageError

    with ResultStore(tmp_path) as store:
        for i in range(20):
            store.put(row(f"k{i}", payload="x" * 3000))
        pages = store._conn.execute("PRAGMA page_count").fetchone()[0]
        store._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        store._conn.execute(f"PRAGMA max_page_count = {pages}")
        with pytest.raises(StorageError) as info:
            for i in range(20, 200):
                store.put(row(f"k{i}", payload="x" * 3000))
        assert not isinstance(info.value, UserError)  # the machine's fault, not the input's
        assert info.value.exit_code == 4
        text = str(info.value)
        assert "database or disk is full" in text and str(store.path) in text
        assert "every trial stored before is kept" in text and "run the same command again" in text
        stored = len(store)
    with ResultStore(tmp_path) as again:  # space freed (a new connection has no cap): resume
        assert len(again) == stored >= 20
        assert again.put(row("after"))


# --- one sweep per directory ---------------------------------------------------------------------
HOLDER = textwrap.dedent("""
    import sys, time
    from orchestrator.launching.sweep_lock import claim_sweep_dir
    claim_sweep_dir(sys.argv[1])
    print("held", flush=True)
    time.sleep(600)
""")


def test_a_sweep_directory_is_claimed_by_one_process_until_it_dies(tmp_path):
    from orchestrator.launching.sweep_lock import (
        SweepDirBusyError,
        claim_sweep_dir,
        release_sweep_dirs,
    )

    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)],
                              stdout=subprocess.PIPE, text=True, env=_env())
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(SweepDirBusyError) as info:
            claim_sweep_dir(tmp_path)
        assert isinstance(info.value, UserError)  # refused like bad input: exit 2, one line
        text = str(info.value)
        assert f"pid {holder.pid} on" in text and "another hydra.sweep.dir" in text
        assert "\n" not in text
    finally:
        holder.kill()  # kill -9: the OS drops the lock
        holder.wait(timeout=10)
    claim_sweep_dir(tmp_path)  # a resume after the crash is never refused
    claim_sweep_dir(tmp_path)  # and a claim this process holds is a no-op
    release_sweep_dirs()
    again = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)],
                             stdout=subprocess.PIPE, text=True, env=_env())
    try:
        assert again.stdout is not None and again.stdout.readline().strip() == "held"  # released
    finally:
        again.kill()
        again.wait(timeout=10)


# --- attempts -------------------------------------------------------------------------------------
def test_a_second_attempt_is_stored_beside_the_first_and_neither_is_rewritten(tmp_path):
    with ResultStore(tmp_path) as store:
        assert store.put(row("k", 0, status="not_measured"))
        assert store.put(row("k", 0, attempt=2, status="ok"))
        assert not store.put(row("k", 0, attempt=2, status="wrong"))  # that attempt is stored
        found = store.rows_for(["k"])["k"]
    assert [(r["attempt"], r["status"]) for r in found] == [(1, "not_measured"), (2, "ok")]


def test_rows_for_orders_a_keys_rows_by_attempt_then_repeat(tmp_path):
    with ResultStore(tmp_path) as store:
        for attempt, repeat in [(2, 1), (1, 1), (2, 0), (1, 0)]:
            store.put(row("k", repeat, attempt=attempt))
        found = store.rows_for(["k"])["k"]
    assert [(r["attempt"], r["repeat"]) for r in found] == [(1, 0), (1, 1), (2, 0), (2, 1)]


@pytest.mark.parametrize("attempt", [0, -1, 1.5, "2", True])
def test_a_row_with_a_bad_attempt_is_refused(tmp_path, attempt):
    with ResultStore(tmp_path) as store, pytest.raises(StoreError, match="'attempt' must be"):
        store.put(row("k", attempt=attempt))


def _version_1_store(path: Path, rows: list[dict]) -> None:
    """A store as schema version 1 wrote it: no attempt column, UNIQUE (trial_key, repeat)."""
    import json

    with sqlite3.connect(path / STORE_FILENAME) as conn:
        conn.execute(
            "CREATE TABLE trials (id INTEGER PRIMARY KEY AUTOINCREMENT, trial_key TEXT NOT NULL, "
            "repeat INTEGER NOT NULL, status TEXT, device_uuid TEXT, workload TEXT, "
            "framework TEXT, started_at REAL, stored_at REAL NOT NULL, row_json TEXT NOT NULL, "
            "UNIQUE (trial_key, repeat))"
        )
        conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value_json TEXT NOT NULL, "
                     "stored_at REAL NOT NULL)")
        conn.executemany(
            "INSERT INTO trials (trial_key, repeat, status, stored_at, row_json) "
            "VALUES (?, ?, ?, 0, ?)",
            [(r["trial_key"], r["repeat"], r["status"], json.dumps(r)) for r in rows],
        )
        conn.execute("PRAGMA user_version = 1")


def test_a_version_1_store_is_read_as_it_is_and_migrated_by_a_writer(tmp_path):
    _version_1_store(tmp_path, [row("a", 0, status="not_measured"), row("b", 0)])
    with ResultStore(tmp_path, readonly=True) as ro:  # a reader changes nothing
        assert ro.schema_version == 1
        assert [r["status"] for r in ro.rows_for(["a"])["a"]] == ["not_measured"]
    with ResultStore(tmp_path) as store:
        assert store.schema_version == SCHEMA_VERSION == 2
        assert store.keys() == {("a", 0), ("b", 0)}  # every row kept, as a first attempt
        assert store.put(row("a", 0, attempt=2))  # a second attempt now fits beside it
        found = store.rows_for(["a"])["a"]
    assert [(r.get("attempt", 1), r["status"]) for r in found] == [(1, "not_measured"), (2, "ok")]
    with sqlite3.connect(tmp_path / STORE_FILENAME) as conn:
        attempts = conn.execute("SELECT trial_key, attempt FROM trials ORDER BY id").fetchall()
        indexes = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='index'")}
    assert attempts == [("a", 1), ("b", 1), ("a", 2)]
    assert {f"trials_{c}" for c in ("status", "device_uuid", "workload")} <= indexes
