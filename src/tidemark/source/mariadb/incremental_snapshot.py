"""Incremental snapshots of a MariaDB source while the binlog streams (seed 001, MISSION C3).

A signalled table is read chunk by chunk in key order, between the stream's
transactions, and the stream never stops. PostgreSQL's connector brackets each chunk's
SELECT with two watermarks (DBLog) and removes from the chunk the keys changed between
them. MariaDB needs no watermark: a chunk is read inside ``START TRANSACTION WITH
CONSISTENT SNAPSHOT``, and the server reports the binlog position that read view
corresponds to (``binlog_snapshot_file``/``binlog_snapshot_position``) -- exactly: every
transaction that ends at or before it is in the chunk, none after it. So the chunk's
rows are handed on at that point of the stream: after every transaction up to it, before
every later one. Nothing is written to the server (read-only, as Debezium's read-only
incremental snapshots with GTIDs), and no row can be older than a change handed on
before it.

The server sends a transaction to replicas once it is in the binlog, an instant before
its commit becomes visible to readers; a reader that is already past the read view's
position when the chunk is read would hand the chunk on too late, so the chunk is read
again (a few milliseconds later) until its read view is at or past the reader.

A chunk's rows are read unbuffered and kept while their memory stays within
:data:`~tidemark.source.chunk_size.CHUNK_MOST_BYTES` (the first row always): a chunk
sized by narrower rows before it ends at the last row kept, the rest of the result is
read and dropped inside the same read view, and the next chunk starts after that row.

Chunks follow the primary key, or a signal's ``surrogate-key``. The keys travel in the
offset (``incremental_snapshot``, as for PostgreSQL) in the form the next chunk's query
compares them in: integers (BIT, ENUM and SET by their numbers, the order ``ORDER BY``
gives them), text, and bytes as ``{"hex": ...}``. A restart continues after the last
chunk handed on; a chunk handed on but not saved comes again (at-least-once, as
Debezium).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Final

import pymysql
import pymysql.cursors
import pymysql.err

from tidemark.errors import SourceError, SourceUnavailableError, first_line
from tidemark.event import (
    ChangeEvent,
    Op,
    SnapshotMarker,
    SourceContext,
    TableId,
    TableSchema,
    WireValue,
)
from tidemark.source.chunk_size import ChunkSizer, row_memory, rows_memory
from tidemark.source.mariadb import binlog as b
from tidemark.source.mariadb import snapshot as snap
from tidemark.source.mariadb.position import BinlogPosition
from tidemark.source.mariadb.source_fields import MARIADB_BLOCK, MariaDbSourceFields
from tidemark.source.mariadb.table_map import TableColumn
from tidemark.source.mariadb.transaction_records import CONNECTOR
from tidemark.source.snapshot_progress import SignalledSnapshots, TableProgress

log = logging.getLogger(__name__)

#: Reads of one chunk while the reader is past its read view, before giving up for now.
_CATCH_UP_ATTEMPTS: Final = 50
_ER_TABLE_DEF_CHANGED: Final = 1412  # the table was altered after the read view began
#: Server errors that pass (shutdown, a killed connection or query, lock waits, too many
#: connections, max_statement_time): read again later.
_PASSING: Final = frozenset({1040, 1053, 1203, 1205, 1213, 1317, 1927, 1969})
_BY_NUMBER: Final = frozenset({b.T_BIT, b.T_ENUM, b.T_SET})
_INTEGERS: Final = frozenset({b.T_TINY, b.T_SHORT, b.T_INT24, b.T_LONG, b.T_LONGLONG,
                              b.T_YEAR})
_PLACEHOLDER: Final = "\x00"  # where a parameter goes, until the query is built
#: Rows taken from the unbuffered chunk read at a time.
_FETCH_ROWS: Final = 256

Key = list[Any]


@dataclasses.dataclass
class Chunk:
    """Rows of one table read in one read view, waiting for the stream to reach it."""

    progress: TableProgress
    schema: TableSchema
    rows: list[tuple[WireValue, ...]]
    position_key: int
    """The ordering key of the read view's binlog position."""
    last_key: Key | None
    done: bool
    """The chunk reached the table's maximum key: the table is finished with it."""


class ChunkedSnapshots(SignalledSnapshots):
    """The incremental snapshots of one MariaDB connector: signals in, chunks out at
    the stream position their read view has."""

    def __init__(self, *, connect: Callable[[], pymysql.Connection[Any]],
                 captured: Callable[[TableId], bool], chunk_size: int, name: str,
                 state: dict[str, Any] | None = None, adaptive_chunks: bool = True) -> None:
        super().__init__(captured, state)
        self._connect = connect
        self._conn: pymysql.Connection[Any] | None = None
        self._sizer = ChunkSizer(chunk_size, adaptive=adaptive_chunks)
        self._name = name
        self.pending: Chunk | None = None
        self._retry_at = 0.0
        self._retry_delay = 0.5

    def stopped(self, tables: set[TableId]) -> None:
        if self.pending is not None and self.pending.progress.table in tables:
            self.pending = None

    def close(self) -> None:
        """Close the chunks' connection."""
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    # -- chunks ---------------------------------------------------------------------------
    def due(self, reached: int) -> Chunk | None:
        """The chunk to hand on now that the stream has reached ordering key *reached*
        (between two transactions), reading the next one if none is waiting."""
        if self.pending is None and self.queue and not self.paused \
                and time.monotonic() >= self._retry_at:
            self.pending = self._next_chunk(reached)
        chunk = self.pending
        if chunk is None or chunk.position_key > reached:
            return None
        self.pending = None
        return chunk

    def emit(self, chunk: Chunk, position: BinlogPosition) -> list[ChangeEvent]:
        """*chunk*'s rows as read events at the stream's *position*; the table's
        progress moves past them."""
        ts_us = time.time_ns() // 1000
        table = chunk.schema.table
        context = SourceContext(
            CONNECTOR, self._name, table.schema, ts_us, None, None, None, None, None,
            MariaDbSourceFields(0, None, position.file, position.pos, 0, None), MARIADB_BLOCK)
        key = position.key
        events = [ChangeEvent(Op.READ, chunk.schema, None, row, context, key, 0, 0, ts_us,
                              SnapshotMarker.INCREMENTAL) for row in chunk.rows]
        progress = chunk.progress
        progress.last_key = progress.read_key = chunk.last_key
        if chunk.done and self.queue and self.queue[0] is progress:
            self.queue.pop(0)
            log.info("incremental snapshot of %s finished", table)
        self.changed = True
        return events

    def _next_chunk(self, reached: int) -> Chunk | None:
        while self.queue:
            progress = self.queue[0]
            try:
                chunk = self._read_chunk(progress, reached)
            except (SourceUnavailableError, pymysql.err.OperationalError,
                    pymysql.err.InterfaceError) as err:
                code = err.args[0] if err.args else 0
                if isinstance(err, pymysql.err.OperationalError) and isinstance(code, int) \
                        and code < 2000 and code not in _PASSING:
                    self._skip(progress, err)  # a server-side error about the query
                    continue
                # The server went away (a restart): try again later from the last key
                # handed on; the table stays queued.
                self.close()
                self._retry_at = time.monotonic() + self._retry_delay
                log.warning("incremental snapshot of %s: %s; retrying in %.1f s",
                            progress.table, first_line(err), self._retry_delay)
                self._retry_delay = min(self._retry_delay * 2, 30.0)
                return None
            except (SourceError, pymysql.err.MySQLError) as err:
                self._skip(progress, err)
                continue
            self._retry_delay = 0.5
            if chunk is None:  # the table is empty
                self.queue.pop(0)
                self.changed = True
                continue
            return chunk
        return None

    def _skip(self, progress: TableProgress, err: Exception) -> None:
        log.error("incremental snapshot of %s skipped: %s", progress.table, first_line(err))
        self.queue.pop(0)
        self.changed = True
        with contextlib.suppress(Exception):
            if self._conn is not None:
                self._conn.rollback()

    def _connection(self) -> pymysql.Connection[Any]:
        if self._conn is None:
            self._conn = self._connect()
        return self._conn

    def _read_chunk(self, progress: TableProgress, reached: int) -> Chunk | None:
        conn = self._connection()
        for attempt in range(_CATCH_UP_ATTEMPTS):
            position = snap.begin_snapshot(conn)
            if position.key < reached:
                # A transaction the stream already handed on is not visible yet.
                conn.rollback()
                time.sleep(0.002 * (attempt + 1))
                continue
            try:
                chunk = self._select(conn, progress, position)
            except pymysql.err.MySQLError as err:
                conn.rollback()
                if err.args and err.args[0] == _ER_TABLE_DEF_CHANGED:
                    continue  # altered meanwhile: read it again with its new columns
                raise
            conn.commit()
            if chunk is not None:
                # Only now: a chunk lost with a failed COMMIT is read again from here.
                progress.read_key = chunk.last_key
            return chunk
        raise SourceUnavailableError(
            f"the server's read views stayed behind the binlog read for "
            f"{_CATCH_UP_ATTEMPTS} attempts")

    def _select(self, conn: pymysql.Connection[Any], progress: TableProgress,
                position: BinlogPosition) -> Chunk | None:
        table = progress.table
        columns = snap.describe(conn, table)
        primary = snap.primary_key(conn, table)
        key_names = (progress.surrogate_key,) if progress.surrogate_key else primary
        if not key_names:
            raise SourceError("the table has no primary key; give a surrogate-key in the "
                              "signal to snapshot it incrementally")
        by_name = {c.name: c for c in columns}
        missing = [k for k in key_names if k not in by_name]
        if missing:
            raise SourceError(f"the table has no column {', '.join(missing)} (the "
                              "signal's surrogate-key)")
        key_columns = [by_name[k] for k in key_names]
        exprs = [_key_expression(c) for c in key_columns]
        table_sql = f"{snap.quote(table.schema)}.{snap.quote(table.table)}"
        filters = [f"{snap.quote(k)} IS NOT NULL" for k in key_names]
        if progress.condition:
            filters.append(f"({progress.condition})")
        with conn.cursor() as cur:
            if progress.max_key is None:
                # The table's largest key now: rows added later arrive by the stream.
                cur.execute(  # no parameters: PyMySQL leaves a % in it alone
                    f"SELECT {', '.join(exprs)} FROM {table_sql} WHERE "
                    f"{' AND '.join(filters)} ORDER BY "
                    f"{', '.join(snap.quote(k) + ' DESC' for k in key_names)} LIMIT 1")
                top = cur.fetchone()
                if top is None:
                    log.info("incremental snapshot of %s: the table is empty", table)
                    return None
                progress.max_key = [_stored(v, c) for v, c in zip(top, key_columns,
                                                                   strict=True)]
                self._sizer.reset()
                self.changed = True
                log.info("incremental snapshot of %s started (up to key %s)", table,
                         progress.max_key)
            params: list[Any] = []
            where = list(filters)
            if progress.read_key is not None:
                clause, values = _after(exprs, key_columns, progress.read_key)
                where.append(clause)
                params += values
            clause, values = _after(exprs, key_columns, progress.max_key)
            where.append(f"NOT {clause}")
            params += values
            limit = self._sizer.rows()
        started = time.monotonic()
        rows, cut = _read_within(conn, _with_placeholders(
            f"SELECT {', '.join(snap.select_expression(c) for c in columns)}, "
            f"{', '.join(exprs)} FROM {table_sql} WHERE {' AND '.join(where)} "
            f"ORDER BY {', '.join(snap.quote(k) for k in key_names)} "
            f"LIMIT {limit}"), params, self._sizer.chunk_most_bytes)
        self._sizer.saw(rows, limit, time.monotonic() - started)
        width = len(columns)
        normalize = [snap.normalizer(c) for c in columns]
        values_out = [tuple(None if v is None else f(v)
                            for f, v in zip(normalize, row[:width], strict=True))
                      for row in rows]
        last = [_stored(v, c) for v, c in zip(rows[-1][width:], key_columns, strict=True)] \
            if rows else progress.read_key
        # A chunk cut at the memory bound is shorter than asked without being the last.
        done = last == progress.max_key or (len(rows) < limit and not cut)
        return Chunk(progress, snap.schema_of(table, columns, primary), values_out,
                     position.key, last, done)


def _read_within(conn: pymysql.Connection[Any], query: str, params: Sequence[Any],
                 most_bytes: int) -> tuple[list[tuple[Any, ...]], bool]:
    """The rows of *query*, in order, up to the last that keeps their
    :func:`~tidemark.source.chunk_size.row_memory` within *most_bytes* (the first row
    always: the snapshot could not go on without it), and whether rows were left out.

    The chunk's size comes from the rows before it; where the rows get wider further
    on, reading it whole would hold up to that many rows of the new width. Unbuffered,
    the rows past the bound are read from the connection and dropped, never held: the
    chunk ends at the last row kept, as a shorter chunk (same read view)."""
    rows: list[tuple[Any, ...]] = []
    held = 0
    cur = conn.cursor(pymysql.cursors.SSCursor)
    try:
        cur.execute(query, params)
        while batch := cur.fetchmany(_FETCH_ROWS):
            size = rows_memory(batch)  # a bound, a column at a time: cheap
            if held + size <= most_bytes:
                held += size
                rows += batch
                continue
            for row in batch:  # the batch that reaches the bound, row by row
                held += row_memory(row)
                if held > most_bytes and rows:
                    return rows, True
                rows.append(row)
        return rows, False
    finally:
        # Reads what is left of the result without keeping it: the connection takes
        # no other query before the result's end.
        cur.close()


def _key_expression(column: TableColumn) -> str:
    # BIT, ENUM and SET sort by number in ORDER BY; compared with text they would not.
    name = snap.quote(column.name)
    return f"{name} + 0" if column.type in _BY_NUMBER else name


def _placeholder(column: TableColumn) -> str:
    if column.type == b.T_NEWDECIMAL:
        # Text against a DECIMAL compares as a double, which rounds wide keys.
        return (f"CAST({_PLACEHOLDER} AS DECIMAL({column.metadata >> 8}, "
                f"{column.metadata & 0xFF}))")
    return _PLACEHOLDER


def _after(exprs: Sequence[str], columns: Sequence[TableColumn],
           key: Key) -> tuple[str, list[Any]]:
    """SQL for "the key is after *key*" (row comparisons written out: MariaDB's range
    optimizer uses an index for these, not for ``(a, b) > (x, y)``) and its
    parameters."""
    terms: list[str] = []
    params: list[Any] = []
    for i, expr in enumerate(exprs):
        equal = [f"{exprs[j]} = {_placeholder(columns[j])}" for j in range(i)]
        terms.append("(" + " AND ".join([*equal, f"{expr} > {_placeholder(columns[i])}"])
                     + ")")
        params += [_param(key[j]) for j in range(i + 1)]
    return "(" + " OR ".join(terms) + ")", params


def _stored(value: Any, column: TableColumn) -> Any:
    """A key value as the text protocol gives it, in the offset's JSON form."""
    if column.type in _BY_NUMBER or column.type in _INTEGERS:
        return int(value)
    if isinstance(value, bytes | bytearray):
        return {"hex": bytes(value).hex()} if column.charset == 63 else bytes(value).decode()
    return str(value)


def _param(value: Any) -> Any:
    if isinstance(value, dict):
        return bytes.fromhex(str(value["hex"]))
    return value


def _with_placeholders(query: str) -> str:
    # PyMySQL formats a query that has parameters with %: a % in a name or an
    # additional condition must stay a %, and only our placeholders become %s.
    return query.replace("%", "%%").replace(_PLACEHOLDER, "%s")
