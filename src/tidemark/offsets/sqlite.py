"""Offsets in a SQLite database: one row per partition key."""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

import msgspec

from tidemark.errors import ConfigError
from tidemark.offsets.store import Offset, decode_json_object

TABLE = "tidemark_offsets"

_CREATE_SQL = f"""
CREATE TABLE IF NOT EXISTS {TABLE} (
    key TEXT PRIMARY KEY,
    "offset" TEXT NOT NULL,
    updated_at TEXT NOT NULL
)
"""
#: A primary-key lookup (SQLite answers it from the key's unique index, never a scan).
LOAD_SQL = f'SELECT "offset" FROM {TABLE} WHERE key = ?'
_SAVE_SQL = f"""
INSERT INTO {TABLE} (key, "offset", updated_at)
VALUES (?, ?, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
ON CONFLICT(key) DO UPDATE SET "offset" = excluded."offset", updated_at = excluded.updated_at
"""


class SqliteOffsetStore:
    """Offsets in table ``tidemark_offsets`` of the SQLite database at *path*.

    The table is ``(key TEXT PRIMARY KEY, offset TEXT NOT NULL, updated_at TEXT NOT
    NULL)``; offsets are JSON, ``updated_at`` an ISO-8601 UTC timestamp. The database is
    created if missing (its directory must exist).

    Durability: the database runs in WAL mode with ``synchronous=FULL`` and every
    :meth:`save` is one autocommitted upsert, so the WAL is fsynced before :meth:`save`
    returns; a crash (of the process or the machine) right after it keeps the offset.
    :meth:`load` is a primary-key lookup, so its cost does not grow with the number of
    keys or saves. Several stores (in several processes) may share one database, one
    writer per key; a store may be used from any thread, one call at a time.
    """

    def __init__(self, path: str | os.PathLike[str], *, busy_timeout: float = 30.0) -> None:
        self.path = Path(path)
        if not self.path.parent.is_dir():
            raise ConfigError("offsets", f"directory {self.path.parent} does not exist")
        if self.path.is_dir():
            raise ConfigError("offsets", f"{self.path} is a directory, not a SQLite database")
        self._lock = threading.Lock()
        try:
            self._conn: sqlite3.Connection | None = sqlite3.connect(
                self.path, timeout=busy_timeout, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as err:
            raise ConfigError("offsets", f"cannot open SQLite database {self.path}: {err}") \
                from None
        try:
            self._setup(self._conn)
        except BaseException:
            self._conn.close()
            self._conn = None
            raise

    def _setup(self, conn: sqlite3.Connection) -> None:
        try:
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute(_CREATE_SQL)
            columns = {row[1] for row in conn.execute(f"PRAGMA table_info({TABLE})")}
        except sqlite3.DatabaseError as err:
            # "file is not a database", "database disk image is malformed", read-only …
            raise ConfigError(
                "offsets", f"{self.path} is not a usable SQLite database ({err})"
            ) from None
        if str(mode).lower() != "wal":
            raise ConfigError("offsets", f"{self.path}: cannot switch SQLite to WAL mode "
                              f"(journal_mode is {mode})")
        missing = {"key", "offset", "updated_at"} - columns
        if missing:
            raise ConfigError("offsets", f"{self.path} has a {TABLE} table that is not "
                              f"tidemark's (missing columns: {', '.join(sorted(missing))})")

    def __str__(self) -> str:
        return f"SQLite offsets database {self.path}"

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise ValueError(f"SqliteOffsetStore({str(self.path)!r}) is closed")
        return self._conn

    def load(self, key: str) -> Offset | None:
        """The last saved offset of *key*, or None (a primary-key lookup)."""
        with self._lock:
            row = self._connection().execute(LOAD_SQL, (key,)).fetchone()
        if row is None:
            return None
        return decode_json_object(row[0], f"{self.path}: the offset of {key!r}")

    def save(self, key: str, offset: Offset) -> None:
        """Replace the offset of *key*; durable (WAL fsynced) when this returns."""
        data = msgspec.json.encode(offset).decode()
        with self._lock:
            self._connection().execute(_SAVE_SQL, (key, data))

    def load_many(self, keys: Sequence[str]) -> dict[str, Offset]:
        """The saved offsets of *keys*, by one query per 500 keys."""
        out: dict[str, Offset] = {}
        with self._lock:
            conn = self._connection()
            for start in range(0, len(keys), 500):
                chunk = list(keys[start:start + 500])
                marks = ", ".join("?" * len(chunk))
                for key, data in conn.execute(
                        f'SELECT key, "offset" FROM {TABLE} WHERE key IN ({marks})', chunk):
                    out[key] = decode_json_object(data, f"{self.path}: the offset of {key!r}")
        return out

    def save_many(self, offsets: Mapping[str, Offset]) -> None:
        """Replace several offsets in one transaction (one fsync)."""
        rows = [(key, msgspec.json.encode(offset).decode()) for key, offset in offsets.items()]
        with self._lock:
            conn = self._connection()
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.executemany(_SAVE_SQL, rows)
                conn.execute("COMMIT")
            except BaseException:
                # A failed COMMIT too: left open, the transaction would take the next
                # saves into it, and they would return without being durable.
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    def close(self) -> None:
        """Close the database (idempotent). Saved offsets are already durable."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> SqliteOffsetStore:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
