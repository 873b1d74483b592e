"""The durable results store: one row per finished trial, written the moment it ends.

A sweep keeps its results in ``<sweep_dir>/trials.sqlite``, an SQLite database in WAL
(write-ahead log) mode. SQLite, and not a file of appended JSON lines or pickles, because:

- **Durable per row.** Every :meth:`ResultStore.put` is one committed transaction under
  ``synchronous=FULL``: when ``put`` returns, the row is on disk. A sweep killed with SIGKILL (or a
  machine that loses power) loses at most the trial that was in flight, never a stored one.
- **Crash-safe file.** A store left half-written by a killed process still opens: SQLite replays
  or discards the write-ahead log on the next open (WAL recovery), so there is no torn last line
  to repair and no partial row to misread.
- **Readers beside the writer.** In WAL mode readers never block the writer and the writer never
  blocks readers, so ``dvfs report`` can read a sweep that is still running and sees every row
  committed so far.
- **Idempotent re-runs, every attempt kept.** ``(trial_key, repeat, attempt)`` is UNIQUE: an
  attempt is never stored twice (the second ``put`` returns ``False``), and a trial run again
  (``launching.resume``) is a new attempt beside the earlier ones: no row is ever rewritten.
- **Several writers.** Writer processes are serialised by SQLite's own file locking; each waits
  up to ``busy_timeout_s`` for the lock instead of failing, so no row is lost.
- **No pickle.** A row is stored as JSON text (plus a few indexed columns), readable by any
  SQLite client and safe to open from an untrusted source.

Rows are flat dicts of JSON values (:mod:`orchestrator.results.store.values` converts NumPy values,
paths and enums); the SQLite plumbing is :mod:`orchestrator.results.store.sqlite`'s. Sweep-level
context (the config, library versions, the commit) is in a ``meta`` table
(:meth:`ResultStore.put_meta`).

The schema version is SQLite's ``PRAGMA user_version`` (2: rows have an ``attempt``; a store of
version 1 is migrated in one transaction when a writer opens it, each of its rows a first
attempt, and read as it is by a reader). A store written by a newer version of this code is
refused with :class:`StoreSchemaError`; a file that is not an SQLite database, or a
malformed one, with :class:`CorruptStoreError`, and the file is left exactly as it was.

Units: ``started_at`` and ``ended_at`` are Unix seconds; every other unit is in the column's name.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from orchestrator.errors import StorageError, UserError
from orchestrator.results.store import sqlite as store_sqlite
from orchestrator.results.store.sqlite import retry_locked
from orchestrator.results.store.values import (
    RowRecord,
    UnstorableValueError,
    dumps,
    row_record,
    to_json_value,
)

SCHEMA_VERSION = 2
STORE_FILENAME = "trials.sqlite"

# Keys bound in one ``IN (...)`` query: under SQLite's smallest limit on bound parameters (999).
KEYS_PER_QUERY = 500


class StoreError(UserError):
    """A results store cannot be opened, read or written as asked."""


class StoreNotFoundError(StoreError):
    """No results store where one was expected."""


class StoreSchemaError(StoreError):
    """The store was written by a newer schema version than this code reads."""


class CorruptStoreError(StoreError):
    """The file is not an SQLite database, or is a malformed one; it is left in place."""


def _row_record(row: Mapping[str, Any]) -> RowRecord:
    """What ``put`` writes of a row (:func:`orchestrator.results.store.values.row_record`).

    Raises:
        StoreError: The row lacks its key or repeat, has a bad attempt, or holds a value with no
            JSON form.
    """
    try:
        return row_record(row, store_sqlite.INDEXED_COLUMNS)
    except ValueError as e:  # UnstorableValueError, InvalidRowError: the caller's mistake
        raise StoreError(str(e)) from e


def _check_header(path: Path) -> None:
    """Refuses a non-empty file that does not start with SQLite's magic string.

    SQLite would refuse it too, but checking first guarantees that nothing ever writes to it.
    """
    try:
        head = store_sqlite.read_header(path)
    except OSError as e:
        raise StoreError(f"cannot read results store {path}: {e.strerror}") from e
    if head and head != store_sqlite.SQLITE_MAGIC:
        raise CorruptStoreError(
            f"{path} is not an SQLite results store (bad header); it was left untouched"
        )


class ResultStore:
    """The trials of one sweep, in ``<sweep_dir>/trials.sqlite``.

    Example:
        >>> with ResultStore(sweep_dir) as store:  # doctest: +SKIP
        ...     if not store.has(key, repeat):
        ...         store.put(row)

    Attributes:
        path: The store file.
        readonly: Whether this handle refuses writes.
        schema_version: The schema version of the opened store.
    """

    def __init__(
        self,
        sweep_dir: str | Path,
        *,
        readonly: bool = False,
        busy_timeout_s: float = store_sqlite.DEFAULT_BUSY_TIMEOUT_S,
    ) -> None:
        """Opens, or creates, the store of a sweep directory.

        Args:
            sweep_dir: The sweep directory, or the store file itself.
            readonly: Open for reading only: nothing is created and ``put`` is refused.
            busy_timeout_s: How long a write waits for another process's lock, in seconds.

        Raises:
            StoreNotFoundError: ``readonly`` and there is no store there.
            StoreSchemaError: The store is from a newer schema version.
            CorruptStoreError: The file is not an SQLite database or is malformed.
            StoreError: The file or directory cannot be opened.
        """
        p = Path(sweep_dir)
        if p.is_dir() or (not p.is_file() and p.suffix != Path(STORE_FILENAME).suffix):
            p = p / STORE_FILENAME
        self.path = p
        self.readonly = readonly
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        if self.path.is_dir():
            raise StoreError(f"{self.path} is a directory, not a results store")
        if readonly and not self.path.exists():
            raise StoreNotFoundError(f"no results store at {self.path}")
        if self.path.exists():
            _check_header(self.path)
        elif not readonly:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise StoreError(f"cannot create sweep directory {self.path.parent}: {e}") from e
        try:
            self._conn = store_sqlite.connect(
                self.path, readonly=readonly, busy_timeout_s=busy_timeout_s
            )
            self.schema_version = self._prepare()
        except sqlite3.DatabaseError as e:
            self.close()
            raise self._translate_write(e, "the store") from e
        except BaseException:
            self.close()
            raise

    # -- opening ---------------------------------------------------------------------------

    def _prepare(self) -> int:
        """Checks the schema version and creates the tables of a new store.

        Returns:
            The schema version of the store (0 for an uninitialised store opened read-only).
        """
        conn = self._conn
        assert conn is not None
        problems = store_sqlite.integrity_problems(conn)
        if problems:
            detail = "; ".join(problems[:3])
            raise CorruptStoreError(
                f"{self.path} is a malformed SQLite database ({detail}); it was left untouched"
            )
        version = self._schema_version_and_check()  # before anything writes to the file
        if self.readonly:
            return version
        # WAL is a property of the file: set once, kept by every later open.
        retry_locked(lambda: conn.execute("PRAGMA journal_mode = WAL").fetchone())
        conn.execute("PRAGMA synchronous = FULL")
        if version == 0:
            # Creation is one transaction: a creator killed half-way leaves no tables at all.
            def create() -> None:
                if store_sqlite.user_version(conn) == 0:  # another process may have won the race
                    self._check_is_empty()
                    store_sqlite.create_tables(conn, SCHEMA_VERSION)

            retry_locked(lambda: store_sqlite.in_transaction(conn, create, write=True))
            version = self._schema_version_and_check()
        elif version < SCHEMA_VERSION:
            def migrate() -> None:
                found = store_sqlite.user_version(conn)  # another writer may have migrated it
                if found < SCHEMA_VERSION:
                    store_sqlite.migrate(conn, found, SCHEMA_VERSION)

            retry_locked(lambda: store_sqlite.in_transaction(conn, migrate, write=True))
            version = self._schema_version_and_check()
        return version

    def _schema_version_and_check(self) -> int:
        conn = self._conn
        assert conn is not None
        # One read snapshot: another process's creation commits wholly before or after it.
        version, tables = store_sqlite.in_transaction(
            conn, lambda: (store_sqlite.user_version(conn), store_sqlite.user_tables(conn)),
            write=False,
        )
        if version > SCHEMA_VERSION:
            raise StoreSchemaError(
                f"{self.path} was written with store schema version {version}; this "
                f"dvfs-orchestrator reads schema version {SCHEMA_VERSION} and older: "
                "upgrade dvfs-orchestrator to read it"
            )
        if version == 0:
            self._check_is_empty(tables)
        return version

    def _check_is_empty(self, tables: list[str] | None = None) -> None:
        """Refuses an SQLite database that has tables but is not one of our stores."""
        assert self._conn is not None
        tables = store_sqlite.user_tables(self._conn) if tables is None else tables
        if tables:
            raise CorruptStoreError(
                f"{self.path} is an SQLite database but not a dvfs results store "
                f"(tables: {', '.join(sorted(tables))}); it was left untouched"
            )

    def _translate(self, e: sqlite3.DatabaseError) -> StoreError:
        if isinstance(e, sqlite3.OperationalError):
            return StoreError(f"results store {self.path}: {e}")
        return CorruptStoreError(
            f"{self.path} is not a readable SQLite results store ({e}); it was left untouched"
        )

    def _translate_write(self, e: sqlite3.DatabaseError, what: str) -> StorageError | StoreError:
        """A failed write: the machine's storage (``StorageError``) or the store itself."""
        text = str(e).lower()
        if isinstance(e, sqlite3.OperationalError) and ("full" in text or "i/o" in text):
            return StorageError(
                f"cannot write {what} to {self.path}: {e}; every trial stored before is kept: "
                f"free space, then run the same command again to resume"
            )
        return self._translate(e)

    # -- use --------------------------------------------------------------------------------

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreError(f"results store {self.path} is closed")
        return self._conn

    def _has_tables(self) -> bool:
        return self.schema_version > 0

    def _check_writable(self) -> None:
        if self.readonly:
            raise StoreError(f"results store {self.path} was opened read-only")

    def _decode(self, row_id: int, text: str) -> dict[str, Any]:
        """One stored row's JSON, read back; a row that is not JSON is a corrupt store."""
        try:
            return json.loads(text)
        except ValueError as e:
            raise CorruptStoreError(f"{self.path}: row {row_id} is not valid JSON ({e})") from e

    def put(self, row: Mapping[str, Any]) -> bool:
        """Stores one trial row durably, unless its ``(trial_key, repeat, attempt)`` is stored.

        Args:
            row: The trial's row: must hold ``trial_key`` (str) and ``repeat`` (int), and may
                hold ``attempt`` (int >= 1; 1 when absent); every value must have a JSON form
                (NumPy values are converted).

        Returns:
            True if the row was written; False if that attempt was stored before (the first row
            is kept unchanged).

        Raises:
            StoreError: The row lacks its key, holds a value with no JSON form, or the store is
                read-only.
        """
        self._check_writable()
        rec = _row_record(row)
        db = self._db()

        def insert() -> int:
            return db.execute(
                "INSERT INTO trials (trial_key, repeat, attempt, status, device_uuid, workload, "
                "framework, started_at, stored_at, row_json) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (trial_key, repeat, attempt) DO NOTHING",
                (rec.trial_key, rec.repeat, rec.attempt, *rec.indexed, time.time(), rec.text),
            ).rowcount

        with self._lock:
            try:
                written = retry_locked(lambda: store_sqlite.in_transaction(db, insert, write=True))
                return written == 1
            except sqlite3.DatabaseError as e:
                raise self._translate_write(e, "a trial row") from e

    def has(self, trial_key: str, repeat: int = 0) -> bool:
        """Whether a row of this trial key and repeat is stored (of any attempt)."""
        if not self._has_tables():
            return False
        with self._lock:
            cur = self._db().execute(
                "SELECT 1 FROM trials WHERE trial_key = ? AND repeat = ?", (trial_key, int(repeat))
            )
            return cur.fetchone() is not None

    def keys(self) -> set[tuple[str, int]]:
        """Every stored ``(trial_key, repeat)``, of any attempt."""
        if not self._has_tables():
            return set()
        with self._lock:
            found = self._db().execute("SELECT trial_key, repeat FROM trials").fetchall()
        return {(k, int(r)) for k, r in found}

    def rows(self) -> list[dict[str, Any]]:
        """Every stored row, in the order they were stored.

        Raises:
            CorruptStoreError: A stored row is not valid JSON.
        """
        return list(self.iter_rows())

    def iter_rows(self) -> Iterator[dict[str, Any]]:
        """Yields every stored row, in the order they were stored (one read snapshot)."""
        if not self._has_tables():
            return
        with self._lock:
            try:
                query = "SELECT id, row_json FROM trials ORDER BY id"
                fetched = self._db().execute(query).fetchall()
            except sqlite3.DatabaseError as e:
                raise self._translate(e) from e
        for row_id, text in fetched:
            yield self._decode(row_id, text)

    def rows_for(self, keys: Iterable[str]) -> dict[str, list[dict[str, Any]]]:
        """The stored rows of the given trial keys (resume's query): each key's every attempt,
        in attempt order and, within one, in repeat order.

        One indexed query per batch of keys, all batches in one read snapshot: the unique
        index on ``(trial_key, repeat[, attempt])`` serves it in every store ever written, so a
        10,000-key resume costs milliseconds, not a scan of the table per key.

        Args:
            keys: Trial keys; duplicates are asked for once.

        Returns:
            Rows by key, in the order the keys were given; a key with no stored row is absent.

        Raises:
            CorruptStoreError: A stored row is not valid JSON.
        """
        wanted = list(dict.fromkeys(keys))
        if not wanted or not self._has_tables():
            return {}
        db = self._db()

        def select() -> list[tuple[int, str, str]]:
            fetched: list[tuple[int, str, str]] = []
            for at in range(0, len(wanted), KEYS_PER_QUERY):
                batch = wanted[at:at + KEYS_PER_QUERY]
                fetched += db.execute(
                    "SELECT id, trial_key, row_json FROM trials WHERE trial_key IN "
                    f"({', '.join('?' * len(batch))}) ORDER BY trial_key, repeat",
                    batch,
                ).fetchall()
            return fetched

        with self._lock:
            try:
                fetched = store_sqlite.in_transaction(db, select, write=False)
            except sqlite3.DatabaseError as e:
                raise self._translate(e) from e
        found: dict[str, list[dict[str, Any]]] = {k: [] for k in wanted}
        for row_id, key, text in fetched:
            found[key].append(self._decode(row_id, text))
        for rows in found.values():  # stable: a version-1 store's rows (no attempt) keep order
            rows.sort(key=lambda r: (int(r.get("attempt") or 1), int(r["repeat"])))
        return {k: rows for k, rows in found.items() if rows}

    def __len__(self) -> int:
        if not self._has_tables():
            return 0
        with self._lock:
            return int(self._db().execute("SELECT COUNT(*) FROM trials").fetchone()[0])

    def put_meta(self, key: str, value: Mapping[str, Any]) -> None:
        """Stores (or replaces) one item of sweep-level context, e.g. the config or versions.

        Args:
            key: The item's name (``"sweep"``, ``"versions"``, ...).
            value: A dict of JSON values.

        Raises:
            StoreError: The store is read-only or the value has no JSON form.
        """
        self._check_writable()
        if not isinstance(value, Mapping):
            raise StoreError(f"meta {key!r} must be a dict, got {type(value).__name__}")
        try:
            text = dumps(to_json_value(dict(value), f"meta.{key}"))
        except UnstorableValueError as e:  # a value with no JSON form: the caller's mistake
            raise StoreError(str(e)) from e
        db = self._db()

        def upsert() -> None:
            db.execute(
                "INSERT INTO meta (key, value_json, stored_at) VALUES (?, ?, ?) "
                "ON CONFLICT (key) DO UPDATE SET value_json = excluded.value_json, "
                "stored_at = excluded.stored_at",
                (str(key), text, time.time()),
            )

        with self._lock:
            try:
                retry_locked(upsert)
            except sqlite3.DatabaseError as e:
                raise self._translate_write(e, f"meta {key!r}") from e

    def get_meta(self, key: str) -> dict[str, Any] | None:
        """One item of sweep-level context, or None if it was never stored."""
        if not self._has_tables():
            return None
        with self._lock:
            query = "SELECT value_json FROM meta WHERE key = ?"
            found = self._db().execute(query, (key,)).fetchone()
        return None if found is None else json.loads(found[0])

    def meta(self) -> dict[str, dict[str, Any]]:
        """Every item of sweep-level context, by key."""
        if not self._has_tables():
            return {}
        with self._lock:
            found = self._db().execute("SELECT key, value_json FROM meta ORDER BY key").fetchall()
        return {k: json.loads(v) for k, v in found}

    def close(self) -> None:
        """Closes the store; further calls raise StoreError. Closing twice is harmless."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def __enter__(self) -> ResultStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        mode = "readonly" if self.readonly else "readwrite"
        return f"ResultStore({str(self.path)!r}, {mode})"


def find_stores(path: str | Path) -> list[Path]:
    """Finds the results stores under a path.

    Args:
        path: A sweep directory, a directory holding sweep directories (a Hydra multirun
            directory), at any depth, or a store file.

    Returns:
        The store files found, sorted; empty if there are none.

    Raises:
        StoreNotFoundError: The path does not exist.
    """
    p = Path(path)
    if p.is_file():
        return [p]
    if not p.is_dir():
        raise StoreNotFoundError(f"no such file or directory: {p}")
    found = []
    for root, dirs, files in os.walk(p):  # does not follow symlinked directories
        dirs.sort()
        if STORE_FILENAME in files:
            found.append(Path(root) / STORE_FILENAME)
    return sorted(found)

