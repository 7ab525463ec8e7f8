"""Offsets in a PostgreSQL table: one row per partition key."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar

import msgspec
import psycopg
from psycopg import sql

from tidemark.errors import ConfigError, SourceUnavailableError, TerminalError, first_line
from tidemark.offsets.store import Offset
from tidemark.postgres_connection import (
    Connection,
    check_identifier,
    connect,
    cursor,
    redact_dsn,
)

_T = TypeVar("_T")


class PostgresOffsetStore:
    """Offsets in table *schema*.*table* (default ``public.tidemark_offsets``) of *dsn*.

    The table is ``(key text PRIMARY KEY, "offset" jsonb NOT NULL, updated_at timestamptz
    NOT NULL)``. It is created if missing (which needs the CREATE privilege on the
    schema); a table created beforehand needs only SELECT, INSERT and UPDATE. The schema
    must exist. *table* and *schema* must be plain lower-case names (they are validated,
    then quoted as identifiers; nothing from them is ever spliced into SQL as text).

    Durability: every :meth:`save` is one upsert in its own transaction, committed before
    :meth:`save` returns (the session uses ``synchronous_commit=on`` if the server's
    default is ``off``), so a crash of tidemark or of the server right after it keeps the
    offset. :meth:`load` is a primary-key lookup, never a scan of history.

    The store connects lazily: building it opens no connection, so a store whose
    server is down can be built (a :class:`~tidemark.offsets.layered.LayeredOffsetStore`
    then serves loads from its local store). The first call, or :meth:`connect`, opens
    the connection and checks (or creates) the table; a configuration error (a missing
    schema, a foreign table, a wrong password) is raised there.

    A lost connection is reopened once per call (both statements are idempotent); if
    that fails too the call raises :class:`~tidemark.errors.SourceUnavailableError`,
    which the engine retries per its ``errors_max_retries`` (the offset is confirmed to
    the source only once saved). Errors never contain the password. Use from one thread
    at a time.
    """

    def __init__(self, dsn: str, table: str = "tidemark_offsets",
                 schema: str = "public") -> None:
        self.table = check_identifier("offsets.table", table)
        self.schema = check_identifier("offsets.schema", schema)
        self._dsn = dsn
        self._name = sql.Identifier(self.schema, self.table)
        self._load_sql = sql.SQL('SELECT "offset"::text FROM {} WHERE key = %s').format(
            self._name)
        self._save_sql = sql.SQL(
            'INSERT INTO {} (key, "offset", updated_at) VALUES (%s, %s::jsonb, now()) '
            'ON CONFLICT (key) DO UPDATE SET "offset" = excluded."offset", '
            "updated_at = excluded.updated_at"
        ).format(self._name)
        self._load_many_sql = sql.SQL(
            'SELECT key, "offset"::text FROM {} WHERE key = ANY(%s::text[])').format(self._name)
        self._save_many_sql = sql.SQL(
            'INSERT INTO {} (key, "offset", updated_at) '
            "SELECT k, o::jsonb, now() FROM unnest(%s::text[], %s::text[]) AS u(k, o) "
            'ON CONFLICT (key) DO UPDATE SET "offset" = excluded."offset", '
            "updated_at = excluded.updated_at"
        ).format(self._name)
        self._conn: Connection | None = None
        self._closed = False
        self._table_checked = False

    @property
    def qualified_name(self) -> str:
        """``schema.table`` (both are plain names, so this is also valid SQL)."""
        return f"{self.schema}.{self.table}"

    # -- connection ------------------------------------------------------------------
    def connect(self) -> None:
        """Open the connection and check (or create) the table now, rather than at the
        first load or save: to find a configuration error early. Raises
        :class:`~tidemark.errors.SourceUnavailableError` if the server cannot be
        reached."""
        self._run("open", lambda cur: None)

    def _open(self) -> Connection:
        conn = connect(self._dsn, application_name="tidemark-offsets")
        try:
            with cursor(conn) as cur:
                cur.execute("SHOW synchronous_commit")
                if cur.fetchone()[0] == "off":
                    cur.execute("SET synchronous_commit = on")
        except BaseException:
            conn.close()
            raise
        return conn

    def _create_table(self, conn: Connection) -> None:
        where = f"{self.qualified_name} ({redact_dsn(self._dsn)})"
        with cursor(conn) as cur:
            cur.execute("SELECT oid FROM pg_namespace WHERE nspname = %s", (self.schema,))
            if cur.fetchone() is None:
                raise ConfigError("offsets.schema",
                                  f"schema {self.schema!r} does not exist ({where})")
            cur.execute(
                "SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = %s AND c.relname = %s", (self.schema, self.table))
            row = cur.fetchone()
            if row is None:
                try:
                    cur.execute(sql.SQL(
                        'CREATE TABLE IF NOT EXISTS {} (key text PRIMARY KEY, '
                        '"offset" jsonb NOT NULL, updated_at timestamptz NOT NULL)'
                    ).format(self._name))
                except (psycopg.errors.UniqueViolation, psycopg.errors.DuplicateTable):
                    pass  # created concurrently by another store
                except psycopg.errors.InsufficientPrivilege:
                    raise ConfigError(
                        "offsets.table", f"table {where} does not exist and this user may "
                        "not create it: grant CREATE on the schema or create the table"
                    ) from None
                return
            # An existing table must have our columns and a unique index on key alone
            # (upserts need it, and it is what makes load a lookup).
            cur.execute(
                "SELECT attname FROM pg_attribute WHERE attrelid = %s AND attnum > 0 "
                "AND NOT attisdropped", (row[0],))
            columns = {r[0] for r in cur.fetchall()}
            cur.execute(
                "SELECT EXISTS (SELECT 1 FROM pg_index i JOIN pg_attribute a "
                "ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0] "
                "WHERE i.indrelid = %s AND i.indisunique AND i.indnkeyatts = 1 "
                "AND i.indpred IS NULL AND a.attname = 'key')", (row[0],))
            unique_key = bool(cur.fetchone()[0])
        missing = {"key", "offset", "updated_at"} - columns
        if missing:
            raise ConfigError("offsets.table", f"table {where} is not a tidemark offsets "
                              f"table (missing columns: {', '.join(sorted(missing))})")
        if not unique_key:
            raise ConfigError("offsets.table", f"table {where} has no primary key or unique "
                              "index on column key")

    def _run(self, action: str, call: Callable[[Any], _T]) -> _T:
        """Run *call* with a cursor, reconnecting once if the connection was lost."""
        if self._closed:
            raise ValueError(f"PostgresOffsetStore({self.qualified_name}) is closed")
        for attempt in (1, 2):
            try:
                if self._conn is None or self._conn.closed:
                    self._drop_connection()
                    self._conn = self._open()
                if not self._table_checked:
                    self._create_table(self._conn)
                    self._table_checked = True
                with cursor(self._conn) as cur:
                    return call(cur)
            except (psycopg.OperationalError, psycopg.InterfaceError,
                    SourceUnavailableError) as err:
                self._drop_connection()
                if attempt == 2:
                    raise SourceUnavailableError(
                        f"cannot {action} offsets in {self.qualified_name} "
                        f"({redact_dsn(self._dsn)}): {first_line(err)}") from None
            except psycopg.Error as err:
                raise TerminalError(
                    f"cannot {action} offsets in {self.qualified_name} "
                    f"({redact_dsn(self._dsn)}): {first_line(err)}") from None
        raise AssertionError("unreachable")

    def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.closed:
            conn.close()

    def __str__(self) -> str:
        return f"offsets table {self.qualified_name}"

    # -- OffsetStore -----------------------------------------------------------------
    def load(self, key: str) -> Offset | None:
        """The last saved offset of *key*, or None (a primary-key lookup)."""

        def query(cur: Any) -> str | None:
            cur.execute(self._load_sql, (key,))
            row = cur.fetchone()
            return None if row is None else str(row[0])

        text = self._run("load", query)
        if text is None:
            return None
        offset = msgspec.json.decode(text)
        if not isinstance(offset, dict):
            raise TerminalError(f"the offset of {key!r} in {self.qualified_name} is not a "
                                "JSON object")
        return offset

    def save(self, key: str, offset: Offset) -> None:
        """Replace the offset of *key*; committed (durable) when this returns."""
        data = msgspec.json.encode(offset).decode()

        def upsert(cur: Any) -> None:
            cur.execute(self._save_sql, (key, data))

        self._run("save", upsert)

    def load_many(self, keys: Sequence[str]) -> dict[str, Offset]:
        """The saved offsets of *keys*, in one query."""

        def query(cur: Any) -> list[tuple[str, str]]:
            cur.execute(self._load_many_sql, (list(keys),))
            return [(str(k), str(v)) for k, v in cur.fetchall()]

        out: dict[str, Offset] = {}
        for key, text in self._run("load", query):
            offset = msgspec.json.decode(text)
            if not isinstance(offset, dict):
                raise TerminalError(f"the offset of {key!r} in {self.qualified_name} is not "
                                    "a JSON object")
            out[key] = offset
        return out

    def save_many(self, offsets: Mapping[str, Offset]) -> None:
        """Replace several offsets in one statement (one commit)."""
        keys = list(offsets)
        data = [msgspec.json.encode(offsets[key]).decode() for key in keys]

        def upsert(cur: Any) -> None:
            cur.execute(self._save_many_sql, (keys, data))

        self._run("save", upsert)

    def close(self) -> None:
        """Close the connection (idempotent). Saved offsets are already committed."""
        self._closed = True
        self._drop_connection()

    def __enter__(self) -> PostgresOffsetStore:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
