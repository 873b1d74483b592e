"""The SQLite file under the results store: connections, lock waits and transactions.

:mod:`orchestrator.results.store` says what a store holds and which errors a user sees; this module
is the plumbing it stands on. A writer's connection is in autocommit mode
(``isolation_level=None``) so that every transaction is explicit, and a read-only one opens the
file with ``mode=ro`` plus ``query_only`` so that not even SQLite's own recovery writes to it.
Writers serialise on SQLite's file lock; ``retry_locked`` waits out the cases where SQLite
returns ``SQLITE_BUSY`` at once instead of waiting ``busy_timeout``. Every helper raises
``sqlite3`` errors unchanged: the store translates them into its own.

Units: every timeout is in seconds.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

SQLITE_MAGIC = b"SQLite format 3\x00"
DEFAULT_BUSY_TIMEOUT_S = 60.0

T = TypeVar("T")

# Columns copied out of the row beside its JSON, so that SQL queries can filter on them. The
# UNIQUE (trial_key, repeat, attempt) constraint's own index serves every query by trial key.
INDEXED_COLUMNS = ("status", "device_uuid", "workload", "framework", "started_at")

_TRIALS_COLUMNS = """
        id          INTEGER PRIMARY KEY AUTOINCREMENT,
        trial_key   TEXT    NOT NULL,
        repeat      INTEGER NOT NULL,
        attempt     INTEGER NOT NULL DEFAULT 1,
        status      TEXT,
        device_uuid TEXT,
        workload    TEXT,
        framework   TEXT,
        started_at  REAL,
        stored_at   REAL    NOT NULL,
        row_json    TEXT    NOT NULL,
        UNIQUE (trial_key, repeat, attempt)"""
_INDEX_STATEMENTS = tuple(f"CREATE INDEX trials_{col} ON trials ({col})" for col in INDEXED_COLUMNS)
_SCHEMA_STATEMENTS = (
    f"CREATE TABLE trials ({_TRIALS_COLUMNS}\n    )",
    *_INDEX_STATEMENTS,
    """CREATE TABLE meta (
        key        TEXT PRIMARY KEY,
        value_json TEXT NOT NULL,
        stored_at  REAL NOT NULL
    )""",
)
# Version 1 had no ``attempt`` column and a UNIQUE (trial_key, repeat): every row of it was its
# trial's first attempt. SQLite cannot change a table's constraints, so the table is rebuilt.
_MIGRATE_1_TO_2 = (
    f"CREATE TABLE trials_v2 ({_TRIALS_COLUMNS}\n    )",
    "INSERT INTO trials_v2 (id, trial_key, repeat, attempt, status, device_uuid, workload, "
    "framework, started_at, stored_at, row_json) SELECT id, trial_key, repeat, 1, status, "
    "device_uuid, workload, framework, started_at, stored_at, row_json FROM trials",
    "DROP TABLE trials",
    "ALTER TABLE trials_v2 RENAME TO trials",
    *_INDEX_STATEMENTS,
)


def connect(path: Path, *, readonly: bool, busy_timeout_s: float) -> sqlite3.Connection:
    """Opens one connection to the store file, usable from any thread (the store locks it)."""
    if readonly:
        uri = f"file:{path.resolve().as_posix()}?mode=ro"
        conn = sqlite3.connect(
            uri, uri=True, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False
        )
        conn.execute("PRAGMA query_only = ON")
    else:
        conn = sqlite3.connect(
            path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False
        )
    conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
    return conn


def read_header(path: Path) -> bytes:
    """The first bytes of a file, as many as SQLite's magic string has (fewer if it is short).

    Raises:
        OSError: The file cannot be read.
    """
    with open(path, "rb") as f:
        return f.read(len(SQLITE_MAGIC))


def retry_locked(fn: Callable[[], T], timeout_s: float = DEFAULT_BUSY_TIMEOUT_S) -> T:
    """Runs ``fn``, retrying while another process holds a lock SQLite did not wait on."""
    deadline = time.monotonic() + timeout_s
    delay_s = 0.005
    while True:
        try:
            return fn()
        except sqlite3.OperationalError as e:
            msg = str(e).lower()
            if ("locked" not in msg and "busy" not in msg) or time.monotonic() > deadline:
                raise
            time.sleep(delay_s)
            delay_s = min(delay_s * 2, 0.2)


def in_transaction(conn: sqlite3.Connection, fn: Callable[[], T], *, write: bool) -> T:
    """Runs ``fn`` in one transaction: committed if it returns, rolled back if it raises.

    Args:
        conn: An autocommit connection (``isolation_level=None``).
        fn: The statements to run.
        write: Take the write lock first (``BEGIN IMMEDIATE``), so a writer never fails on a
            stale read snapshot; else a deferred transaction, one read snapshot for all of ``fn``.
    """
    conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
    try:
        result = fn()
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return result


def create_tables(conn: sqlite3.Connection, schema_version: int) -> None:
    """Creates the store's tables and indexes and stamps the schema version.

    The caller runs it inside one transaction (executescript would commit on its own, so the
    statements run one by one): a creator killed half-way leaves no tables at all.
    """
    for statement in _SCHEMA_STATEMENTS:
        conn.execute(statement)
    conn.execute(f"PRAGMA user_version = {int(schema_version)}")


def migrate(conn: sqlite3.Connection, from_version: int, to_version: int) -> None:
    """Brings an older store's tables to ``to_version`` and stamps it; the caller runs it in one
    transaction (a migration killed half-way leaves the store as it was)."""
    if from_version == 1 and to_version == 2:
        for statement in _MIGRATE_1_TO_2:
            conn.execute(statement)
        conn.execute(f"PRAGMA user_version = {int(to_version)}")
    elif from_version != to_version:
        raise ValueError(f"no migration from store schema {from_version} to {to_version}")


def user_version(conn: sqlite3.Connection) -> int:
    """The file's ``PRAGMA user_version``: the store's schema version, 0 for a new file."""
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def user_tables(conn: sqlite3.Connection) -> list[str]:
    """The names of the tables in the file, less SQLite's own."""
    return [
        r[0]
        for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
        )
    ]


def integrity_problems(conn: sqlite3.Connection) -> list[str]:
    """What ``PRAGMA quick_check`` finds wrong with the file; empty when it is sound."""
    check = conn.execute("PRAGMA quick_check").fetchall()
    return [] if check == [("ok",)] else [str(r[0]) for r in check]
