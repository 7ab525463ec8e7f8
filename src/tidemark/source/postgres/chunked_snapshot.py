"""Snapshots in the Spark source: a table's existing rows, then its changes (MISSION S5, C3).

**Where the snapshot meets the stream.** The driver creates a *temporary* logical slot
that exports its snapshot (``CREATE_REPLICATION_SLOT … TEMPORARY LOGICAL pgoutput
EXPORT_SNAPSHOT``). PostgreSQL guarantees that this snapshot sees exactly the
transactions that commit before the slot's consistent point ``C``. So:

* every snapshot row is a read (``_op = 'r'``) positioned at ``C`` (``_lsn`` and
  ``_commit_lsn`` = ``C``, ``_seq`` = 1): it sorts after every change it already holds
  and before every change it does not;
* the stream drops the table's changes that commit before ``C`` (the snapshot holds
  them) and keeps the rest;
* while a snapshot runs, the stream's batches end at ``C`` at the latest, so every change
  of the table that is not in the snapshot reaches the sink after the snapshot's rows.

A pair of watermarks around each chunk's SELECT (DBLog, Flink CDC) would not need the
slot, but leaves a race on PostgreSQL: a transaction whose commit record precedes the low
watermark can still be invisible to the SELECT, for the moment between writing that
record and leaving the proc array; its change would be streamed before the window and
then overwritten by the chunk's older row. The exported snapshot has no such moment.

**Parallel reads.** The export stays importable while the driver keeps the replication
connection open and idle. Each table is cut into key-range chunks of
``snapshotChunkRows`` rows; the boundaries come from the server (an index scan returning
one key per chunk), never from rows brought to the driver. A micro-batch carries up to
``snapshotChunksPerTrigger`` chunks and each chunk is one Spark partition: an executor
imports the snapshot (``SET TRANSACTION SNAPSHOT``), copies its key range out as CSV,
which Arrow's CSV reader parses, and converts the text with the stream's own converters
(the text PostgreSQL prints is the text pgoutput sends).

**Restarts.** The export dies with the driver, so a query restarted in the middle of a
snapshot cannot read the chunks of its last planned batch again: that batch brings no
snapshot rows, and the next one starts a new *generation* (a new export and ``C``) at the
first chunk the lost batch held. A table restarted from its first chunk begins with a
truncate (``_op = 't'`` at ``(C, 0)``): rows loaded by the earlier generation may have
changed since, and the new snapshot replaces them. Tables finished by the earlier
generation keep its ``C`` and stream from there.
"""

from __future__ import annotations

import contextlib
import io
import logging
import select
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, Final

import psycopg
import pyarrow as pa
import pyarrow.csv as pa_csv
from psycopg import pq, sql

from tidemark.errors import SourceError, TerminalError, TidemarkError
from tidemark.event import TableId, WireTuple
from tidemark.postgres_connection import ServerTimeoutError, connect, server_timeout
from tidemark.source.postgres.pgoutput import lsn_to_str
from tidemark.source.postgres.replication import ReplicationStream
from tidemark.source.postgres.snapshot_plan import ChunkRange, KeyText
from tidemark.source.read_plan import ChangeSink, ChangeTable, Commit, EncodedRows

log = logging.getLogger(__name__)

#: After how long a slot still waiting for transactions to end is worth a warning.
_PENDING_NOTE_S: Final = 10.0



class SnapshotLostError(TerminalError):
    """A chunk's exported snapshot is gone (the driver that held it ended)."""


class SnapshotChunk:
    """One chunk as a partition of a read plan: everything an executor needs to read it."""

    def __init__(self, index: int, chunk: ChunkRange, keys: tuple[str, ...], at: int,
                 export: str, taken_us: int, truncate_first: bool) -> None:
        self.index = index
        self.chunk = chunk
        self.keys = keys
        """The primary key's columns in its index's order (chunks are ranges of it)."""
        self.at = at
        self.export = export
        self.taken_us = taken_us
        self.truncate_first = truncate_first

    def __repr__(self) -> str:
        return (f"SnapshotChunk({self.index}, {self.chunk.table}, {self.chunk.after} .. "
                f"{self.chunk.upto}, at {lsn_to_str(self.at)})")


# -- the driver ------------------------------------------------------------------------
class SnapshotExport:
    """A temporary slot exporting its snapshot, held open on the driver while chunks are
    read under it."""

    def __init__(self, dsn: str, slot: str, publication: str) -> None:
        self._stream = ReplicationStream(dsn, slot, publication)
        self._stream.connect()
        started = time.monotonic()
        try:
            self.at, self.name = self._stream.create_slot(temporary=True)
        except Exception:
            self._stream.close()
            raise
        self.taken_us = time.time_ns() // 1000
        log.info("snapshot %s exported at %s (slot creation took %.2f s: it waits for "
                 "transactions running when it started)", self.name, lsn_to_str(self.at),
                 time.monotonic() - started)

    def close(self) -> None:
        """Release the export (and its temporary slot)."""
        self._stream.close()


class PendingExport:
    """A :class:`SnapshotExport` made on a thread of its own. Creating its slot waits
    until every transaction that holds an id when it starts has ended, and a long one
    (a batch job, a session idle in a transaction) must not stop the stream meanwhile:
    the driver asks :meth:`result` at each batch and goes on without it."""

    def __init__(self, dsn: str, slot: str, publication: str) -> None:
        self._dsn = dsn
        self._slot = slot
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._export: SnapshotExport | None = None
        self._error: BaseException | None = None
        self._abandoned = False
        self._started = time.monotonic()
        self._noted = False
        # A daemon: a process that ends must not wait for a transaction to end.
        threading.Thread(target=self._create, args=(publication,), daemon=True,
                         name=f"tidemark-export-{slot}").start()

    def _create(self, publication: str) -> None:
        try:
            export = SnapshotExport(self._dsn, self._slot, publication)
        except BaseException as err:  # handed to result()
            self._error = err
            self._done.set()
            return
        with self._lock:
            abandoned = self._abandoned
            self._export = export
        if abandoned:
            export.close()
        self._done.set()

    def result(self, wait_s: float | None = 0.0) -> SnapshotExport | None:
        """The export, or None while its slot waits (up to *wait_s* seconds; None: until
        it is made); raises what making it raised."""
        end = None if wait_s is None else time.monotonic() + wait_s
        while not self._done.is_set():
            if not self._noted and time.monotonic() - self._started > _PENDING_NOTE_S:
                self._noted = True
                log.warning("slot %s has waited %.0f s for transactions running when it "
                            "was created to end (pg_stat_activity: backend_xid, "
                            "xact_start)", self._slot, time.monotonic() - self._started)
            left = _PENDING_NOTE_S if end is None else end - time.monotonic()
            if left <= 0:
                return None
            self._done.wait(min(left, _PENDING_NOTE_S))
        if self._error is not None:
            raise self._error
        return self._export

    def abandon(self) -> None:
        """Drop the export, made or still waiting (its walsender is ended)."""
        with self._lock:
            self._abandoned = True
            export = self._export
        if export is not None:
            export.close()
            return
        if self._done.is_set():
            return
        # Best effort: a server out of reach ends the walsender with the connection.
        with contextlib.suppress(psycopg.Error, TidemarkError), contextlib.closing(
                connect(self._dsn, application_name="tidemark-export")) as conn:
            conn.autocommit = True
            conn.execute("SELECT pg_terminate_backend(active_pid) FROM "
                         "pg_replication_slots WHERE slot_name = %s AND active_pid IS NOT "
                         "NULL", (self._slot,))


def next_boundary(conn: psycopg.Connection[Any], table: TableId, keys: Sequence[str],
                  after: KeyText | None, rows: int) -> KeyText | None:
    """The key of the *rows*-th row after *after* in key order (the server walks the
    primary key's index), or None when fewer rows remain: the last chunk."""
    query = sql.SQL("SELECT {texts} FROM {table}{where} ORDER BY {keys} "
                    "OFFSET {skip} LIMIT 1").format(
        # Aliased: ORDER BY would take an output column named like the key, ordering
        # the text instead of the key.
        texts=sql.SQL(", ").join(sql.SQL("{}::text AS {}").format(
            sql.Identifier(k), sql.Identifier(f"tidemark_key_{i}")) for i, k in enumerate(keys)),
        table=sql.Identifier(table.schema, table.table),
        where=_range_sql(keys, after, None), keys=_key_list(keys),
        skip=sql.Literal(rows - 1))
    row = conn.execute(query).fetchone()
    return None if row is None else tuple(str(v) for v in row)


def primary_key(conn: psycopg.Connection[Any], table: TableId) -> tuple[str, ...]:
    """The primary key columns of *table*, in index order."""
    rows = conn.execute(
        "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
        "AND a.attnum = ANY(i.indkey) WHERE i.indrelid = %s::regclass AND i.indisprimary "
        "ORDER BY array_position(i.indkey, a.attnum)",
        (sql.Identifier(table.schema, table.table).as_string(conn),)).fetchall()
    if not rows:
        raise SourceError(f"table {table} has no primary key: a snapshot reads it in key "
                          "ranges; add one (ALTER TABLE ... ADD PRIMARY KEY (...))")
    return tuple(str(r[0]) for r in rows)


def estimated_rows(conn: psycopg.Connection[Any], table: TableId) -> int:
    """The planner's row count of *table* (``pg_class.reltuples``; 0 if never analysed)."""
    row = conn.execute("SELECT greatest(reltuples, 0)::bigint FROM pg_class "
                       "WHERE oid = %s::regclass",
                       (sql.Identifier(table.schema, table.table).as_string(conn),)).fetchone()
    return int(row[0]) if row else 0


def _key_list(keys: Sequence[str]) -> sql.Composable:
    return sql.SQL(", ").join(sql.Identifier(k) for k in keys)


def _row(values: Sequence[str]) -> sql.Composable:
    # Literals of unknown type: the server reads them with the key columns' own types.
    return sql.SQL("({})").format(sql.SQL(", ").join(sql.Literal(v) for v in values))


def _range_sql(keys: Sequence[str], after: KeyText | None,
               upto: KeyText | None) -> sql.Composable:
    columns = sql.SQL("({})").format(_key_list(keys))
    terms: list[sql.Composable] = []
    if after is not None:
        terms.append(sql.SQL("{} > {}").format(columns, _row(after)))
    if upto is not None:
        terms.append(sql.SQL("{} <= {}").format(columns, _row(upto)))
    if not terms:
        return sql.SQL("")
    return sql.SQL(" WHERE ") + sql.SQL(" AND ").join(terms)


# -- the executors ---------------------------------------------------------------------
def import_snapshot(conn: psycopg.Connection[Any], export: str, what: str,
                    afterwards: str) -> None:
    """Take the exported snapshot *export* into *conn*'s open REPEATABLE READ
    transaction; SnapshotLostError (naming *what* the snapshot is for and what happens
    *afterwards*) once the driver that exported it has ended."""
    try:
        conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(export)))
    except (psycopg.errors.InvalidParameterValue,
            psycopg.errors.ObjectNotInPrerequisiteState) as err:
        raise SnapshotLostError(
            f"snapshot {export} {what} is gone ({str(err).strip()}): the query's driver "
            f"ended; restart the query, {afterwards}") from None


def read_chunk_text(conn: psycopg.Connection[Any], export: str, chunk: ChunkRange,
                    columns: Sequence[str], keys: Sequence[str]) -> pa.Table:
    """The chunk's rows under the exported snapshot, as one string column per column
    (null for NULL): the text the types' output functions print."""
    table = TableId.parse(chunk.table)
    conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
    try:
        import_snapshot(conn, export, f"of {chunk.table}",
                        "its snapshot goes on in a new generation")
        query = sql.SQL("COPY (SELECT {columns} FROM {table}{where} ORDER BY {keys}) "
                        "TO STDOUT (FORMAT csv)").format(
            columns=sql.SQL(", ").join(sql.Identifier(c) for c in columns),
            table=sql.Identifier(table.schema, table.table),
            where=_range_sql(keys, chunk.after, chunk.upto), keys=_key_list(keys))
        data = copy_out(conn, query.as_bytes(conn), server_timeout(conn))
    except BaseException:
        # The error in flight says what happened; ending the transaction on a connection
        # it closed (a server timeout) would only replace it.
        with contextlib.suppress(psycopg.Error):
            conn.execute("COMMIT")
        raise
    conn.execute("COMMIT")
    return parse_csv(data, columns)


def copy_out(conn: psycopg.Connection[Any], query: bytes, timeout_s: float | None) -> bytes:
    """The data of ``COPY … TO STDOUT``, taken from libpq's buffer in a tight loop.

    The server sends one message per row; psycopg's ``Copy`` passes each through its
    generator and wait machinery, which was two thirds of a chunk's read time. No wait
    for the server lasts longer than *timeout_s* (``serverTimeoutMs``).
    """
    pgconn = conn.pgconn
    pgconn.send_query(query)
    while pgconn.flush():  # a non-blocking connection may not have sent it all
        select.select([], [pgconn.socket], [], timeout_s)
    result = _next_result(pgconn, timeout_s)
    if result is None or result.status != pq.ExecStatus.COPY_OUT:
        _drain(pgconn, timeout_s)
        if result is not None and result.status == pq.ExecStatus.FATAL_ERROR:
            raise psycopg.errors.error_from_result(result)
        raise psycopg.OperationalError("COPY did not start")
    parts: list[bytes] = []
    append = parts.append
    get = pgconn.get_copy_data
    while True:
        size, block = get(1)
        if size > 0:
            append(bytes(block))
        elif size == 0:  # nothing buffered: wait for the socket
            _wait_readable(pgconn, timeout_s)
            pgconn.consume_input()
        elif size == -1:  # done
            break
        else:
            raise psycopg.OperationalError(str(pgconn.get_error_message()))
    result = _next_result(pgconn, timeout_s)
    _drain(pgconn, timeout_s)
    if result is not None and result.status == pq.ExecStatus.FATAL_ERROR:
        raise psycopg.errors.error_from_result(result)
    return b"".join(parts)


def _wait_readable(pgconn: pq.abc.PGconn, timeout_s: float | None) -> None:
    ready, _, _ = select.select([pgconn.socket], [], [], timeout_s)
    if not ready:
        pgconn.finish()  # the protocol state is unknown: the connection goes
        raise ServerTimeoutError.after(timeout_s or 0)


def _next_result(pgconn: pq.abc.PGconn, timeout_s: float | None) -> pq.abc.PGresult | None:
    pgconn.consume_input()
    while pgconn.is_busy():
        _wait_readable(pgconn, timeout_s)
        pgconn.consume_input()
    return pgconn.get_result()


def _drain(pgconn: pq.abc.PGconn, timeout_s: float | None) -> None:
    while _next_result(pgconn, timeout_s) is not None:
        pass


def parse_csv(data: bytes, columns: Sequence[str]) -> pa.Table:
    """PostgreSQL's CSV (``COPY … (FORMAT csv)``) as string columns: an unquoted empty
    field is NULL, a quoted one the empty string."""
    if not data:
        return pa.table({c: pa.array([], pa.string()) for c in columns})
    return pa_csv.read_csv(
        io.BytesIO(data),
        read_options=pa_csv.ReadOptions(column_names=list(columns), block_size=8 << 20),
        parse_options=pa_csv.ParseOptions(newlines_in_values=True),
        convert_options=pa_csv.ConvertOptions(
            column_types=dict.fromkeys(columns, pa.string()), null_values=[""],
            strings_can_be_null=True, quoted_strings_can_be_null=False))


class SkippingSink:
    """Drops the stream's changes of snapshotted tables that commit before their
    snapshot's consistent point (the snapshot holds them); passes on everything else."""

    def __init__(self, sink: ChangeSink, skip: Mapping[str, int]) -> None:
        self.sink = sink
        self.skip = dict(skip)
        self.limits: dict[int, int] = {}

    def relation(self, rel: ChangeTable, at: int = 0) -> None:
        limit = self.skip.get(f"{rel.namespace}.{rel.name}")
        if limit is None:
            self.limits.pop(rel.relation_id, None)
        else:
            self.limits[rel.relation_id] = limit
        self.sink.relation(rel, at)

    def rows(self, relation_id: int, block: EncodedRows) -> None:
        limit = self.limits.get(relation_id)
        if limit is not None:
            keep = block.commit_lsns >= limit
            if not keep.any():
                return
            if not keep.all():
                block = block.select(keep)
        self.sink.rows(relation_id, block)

    def add(self, relation_id: int, op: str, values: WireTuple | None, lsn: int, seq: int,
            txn: Commit, may_have_toast: bool, old: WireTuple | None) -> None:
        limit = self.limits.get(relation_id)
        if limit is not None and txn.commit_lsn < limit:
            return
        self.sink.add(relation_id, op, values, lsn, seq, txn, may_have_toast, old)

    def snapshot(self, table: str, texts: pa.Table, at: int, taken_us: int,
                 truncate_first: bool, keys: Sequence[str]) -> None:
        self.sink.snapshot(table, texts, at, taken_us, truncate_first, keys)

    def columns(self, table: str) -> list[str]:
        return self.sink.columns(table)
