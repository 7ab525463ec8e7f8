"""Incremental snapshots while the stream runs: DBLog's watermark algorithm (seed 001).

A table is read chunk by chunk in primary-key order. For each chunk a *window* is
opened and closed around the chunk's SELECT with two logical decoding messages
(``pg_logical_emit_message``, prefix :data:`WATERMARK_PREFIX`), each committed in its own
transaction, so they arrive in the stream in commit order like any change:

* changes committed before the opening mark were visible to the SELECT and were
  streamed before it: the chunk's rows, emitted after them, are at least as new;
* changes committed inside the window may or may not be in the SELECT's result: each
  streamed change of the table inside the window removes its key from the chunk, so the
  streamed change stands and no older row follows it;
* at the closing mark the chunk's remaining rows are emitted as reads (``op: "r"``,
  ``source.snapshot: "incremental"``) — the stream never stops for a snapshot.

Watermarks are logical decoding messages rather than rows of a signal table: they write
nothing to user tables, need no table, and carry a window id that a later run ignores.
Their transactions carry nothing else and are left out of the stream handed on.

"Visible to the SELECT" needs a check of its own. A transaction's commit record is in
the WAL (and on its way to us) a moment before the transaction leaves the server's list
of running transactions; only then do new snapshots see it. The moment can be long: a
committing transaction waits there for synchronous standbys. So a transaction that
commits before the opening mark can still be invisible to the chunk's SELECT, which
would then hand on a row older than that transaction's change, streamed before the
window. The SELECT therefore runs in a snapshot whose running transactions are known
(``pg_current_snapshot()``). It does not see the transactions it lists as running, nor
any at or above its ``xmax``, which it does not list: one that took its xid after the
opening mark's, wrote its commit record before the mark's commit and is still waiting
(for its WAL flush or a standby) when the snapshot is taken. A change of the table by
such a transaction is handled by where it comes in the stream: one that comes before
the opening mark takes its key out of the chunk, as a change inside the window does (a
change left out of the stream, or whose key cannot be matched, has the chunk read again
when the window closes); one already streamed when the chunk is read means the chunk is
not used, and it is read again a moment later, in a new snapshot.

The state (tables left, the current table's maximum key and last key sent) travels in
the connector's offset (``incremental_snapshot``), so a restart continues from the chunk
after the last one emitted; a chunk emitted but not yet saved is emitted again
(at-least-once, as Debezium).

Signals (Debezium's signal table: ``execute-snapshot``, ``stop-snapshot``,
``pause-snapshot``, ``resume-snapshot``, ``log``) are read from the stream: an Insert into
the signal table, which is published but not captured, so its rows are never events.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import struct
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Final

import psycopg
from psycopg import sql

from tidemark.errors import DecodeError, SourceUnavailableError, TidemarkError, first_line
from tidemark.event import (
    UNAVAILABLE,
    ChangeEvent,
    Op,
    SnapshotMarker,
    SourceContext,
    TableId,
    TableSchema,
)
from tidemark.postgres_connection import Connection, on_standby
from tidemark.source.chunk_size import ChunkSizer
from tidemark.source.postgres import catalog, pgoutput
from tidemark.source.postgres.change_builder import CONNECTOR_NAME
from tidemark.source.postgres.chunk_query import chunk_queries
from tidemark.source.postgres.key_order import IndexOrder
from tidemark.source.postgres.snapshot import register_text_types
from tidemark.source.postgres.source_block import POSTGRES_BLOCK
from tidemark.source.signals import (
    SIGNAL_TABLE_COLUMNS,
    ExecuteSnapshot,
    SignalError,
    parse_signal,
    quoted_name,
    signal_table_ddl,
)
from tidemark.source.snapshot_progress import SignalledSnapshots, TableProgress

log = logging.getLogger(__name__)

#: Prefix of the watermark messages; their content is ``open:<id>`` or ``close:<id>``.
WATERMARK_PREFIX: Final = "tidemark-snapshot-window"
#: Windows read ahead of the stream: the next chunk's SELECT and marks need not wait for
#: the previous chunk's closing mark to come back through the stream (its round trip
#: was most of a chunk's time). In the stream the windows still come one after another,
#: each opening after the previous one closed, since their marks commit in that order.
WINDOWS_AHEAD: Final = 4

#: Transactions streamed lately that changed a table, remembered for the check above.
#: Those that began before the oldest transaction still running are forgotten (no new
#: snapshot can list them as running); the limit bounds memory when a transaction stays
#: open for long: a transaction streamed this many changes ago that is still finishing
#: its commit is not a case to plan for.
RECENT_CHANGES_LIMIT: Final = 50_000
#: How soon a chunk that missed a committed transaction is read again (doubling up to
#: a second while it keeps missing it: each try writes an opening mark).
_INVISIBLE_RETRY_S: Final = 0.01
_INVISIBLE_RETRY_MAX_S: Final = 1.0

_U32: Final = struct.Struct(">I")
_XID_AT: Final = 17  # Begin: 'B', final LSN (8), commit time (8), xid (4)
_BEGIN, _COMMIT, _MESSAGE = ord("B"), ord("C"), ord("M")
_INSERT, _UPDATE, _DELETE, _TRUNCATE = ord("I"), ord("U"), ord("D"), ord("T")
_CHANGES: Final = frozenset({_INSERT, _UPDATE, _DELETE, _TRUNCATE})
_PREFIX_BYTES: Final = WATERMARK_PREFIX.encode() + b"\x00"

Message = tuple[bytes, int]
Key = tuple[Any, ...]


class SnapshotTableError(TidemarkError):
    """A table cannot be snapshotted (no key, not captured, gone): it is skipped."""


@dataclasses.dataclass
class Window:
    """One chunk's buffer between its two watermarks."""

    window_id: str
    schema: TableSchema
    relation_oid: int
    rows: list[tuple[str | None, ...]]
    """The chunk's rows, in key order."""
    last_key: list[str | None] | None
    done_after: bool
    """The chunk reached the table's maximum key: the table is finished at close."""
    start_key: list[str | None] | None
    """The chunk's lower bound (exclusive): where it is read again from if it must be."""
    match_indexes: tuple[int, ...]
    """Positions of the columns that identify a row in both the chunk and the stream: the
    primary key, or for a table without one the surrogate key (under REPLICA IDENTITY
    FULL a delete carries it)."""
    opened: bool = False
    reread: bool = False
    """A change inside the window could not be matched to a chunk row (its key was not
    sent, or the table's columns changed): the chunk is dropped and read again."""
    invisible: frozenset[int] = frozenset()
    """Transactions listed as running for the chunk's SELECT (32-bit xids): one that
    changes the table and commits before the opening mark makes the chunk stale."""
    xmax: int | None = None
    """The SELECT's snapshot's xmax (32-bit): transactions at or above it are not listed
    in :attr:`invisible` but are not seen either."""
    removed: set[Key] = dataclasses.field(default_factory=set)
    """Keys changed in the stream inside the window: their rows are not emitted (kept
    as a set of keys rather than a dict of rows: a window that nothing hits costs no
    per-row key at all)."""
    truncated: bool = False

    def sees_not(self, xid: int) -> bool:
        """The chunk's SELECT did not see transaction *xid* (32-bit)."""
        return xid in self.invisible or (self.xmax is not None and _at_or_after(xid, self.xmax))


@dataclasses.dataclass
class Split:
    """A batch of stream messages cut at a window's close: the messages before it, the
    snapshot rows it releases, and the messages after it (None when no window closed)."""

    before: list[Message]
    reads: list[ChangeEvent]
    after: list[Message] | None


class IncrementalSnapshot(SignalledSnapshots):
    """The incremental snapshots of one connector: signals in, watermarked chunks out."""

    def __init__(self, *, dsn_connect: Callable[[], Connection],
                 captured: Sequence[TableId], keys: dict[TableId, tuple[str, ...]],
                 signal_table: TableId | None, chunk_size: int, topic_prefix: str,
                 database: str, state: dict[str, Any] | None = None,
                 generated: bool = False, skipped: frozenset[Op] = frozenset(),
                 adaptive_chunks: bool = True) -> None:
        super().__init__(set(captured).__contains__, state)
        # Row changes that skipped_operations leaves out of the stream do not take their
        # key out of an open chunk (Debezium's EventDispatcher hands a skipped operation
        # to the incremental snapshot neither): a row whose only change in the window is
        # skipped must still come as a read. (A truncate, skipped by default, still
        # drops the chunk: the rows read before it are gone.)
        self._kept_kinds = frozenset(
            kind for kind, op in ((_INSERT, Op.CREATE), (_UPDATE, Op.UPDATE),
                                  (_DELETE, Op.DELETE)) if op not in skipped) | {_TRUNCATE}
        self._connect = dsn_connect
        self._conn: Connection | None = None
        self._keys = keys
        self.signal_table = signal_table
        self._signal_prefix: bytes | None = None
        self._signal_columns: tuple[str, ...] = ()
        self._sizer = ChunkSizer(chunk_size, adaptive=adaptive_chunks)
        self._prefix = topic_prefix
        self._database = database
        self.windows: list[Window] = []
        """Windows read and not closed yet, in the order of their marks."""
        self._drop_commit = False  # the next message is a watermark's Commit to leave out
        self._table_cache: dict[TableId, tuple[TableSchema, int]] = {}
        self._index_order = IndexOrder("incremental snapshot")
        self._retry_at = 0.0
        self._retry_delay = 0.5
        self._generated = generated  # the stream carries stored generated columns
        self._xid = 0  # the transaction whose messages are being split
        self._recent: dict[int, None] = {}
        """``xid << 32 | relation oid`` of changes streamed lately (see
        :data:`RECENT_CHANGES_LIMIT`), in the order they came."""
        self._suspects: frozenset[int] = frozenset()
        """The union of the ``invisible`` sets of the windows not opened yet."""
        self._suspect_xmax: int | None = None
        """The lowest ``xmax`` of the windows not opened yet: transactions at or above it
        are suspects too."""
        self._newest: dict[int, int] = {}
        """Relation oid -> the newest xid (32-bit order) of its changes streamed lately."""
        self._missed_logged: set[int] = set()
        self._invisible_delay = _INVISIBLE_RETRY_S

    # -- state --------------------------------------------------------------------------
    @property
    def scanning(self) -> bool:
        """Messages must be looked at: a window is open, or signals may arrive."""
        return bool(self.windows) or self._signal_prefix is not None

    def open(self) -> None:
        """Look up the signal table (its Inserts are the signals)."""
        if self.signal_table is None:
            return
        oid, self._signal_columns = signal_table_layout(self._connection(), self.signal_table)
        self._signal_prefix = b"I" + _U32.pack(oid)

    def close(self) -> None:
        """Close the snapshot's connection (a new one registers its types again)."""
        self._table_cache.clear()
        self._index_order.clear()
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None

    def _connection(self) -> Connection:
        if self._conn is None or self._conn.closed:
            self._conn = self._connect()
            self._conn.autocommit = True
            with self._conn.cursor() as cur:
                # A watermark's commit flushes the WAL, so the stream brings it at once:
                # with the server's synchronous_commit off it would wait for the WAL
                # writer (up to wal_writer_delay, 200 ms, per mark).
                # Local, not on: waiting for a synchronous standby adds nothing to a mark
                # (one lost in a failover only makes its window be read again).
                cur.execute("SET synchronous_commit = local")
        return self._conn

    # -- signals ------------------------------------------------------------------------
    def refusal(self, table: TableId, signal: ExecuteSnapshot) -> str | None:
        if not self._keys.get(table) and signal.surrogate_key is None:
            return "has no primary key; give a surrogate-key to snapshot it incrementally"
        if self._on_standby():
            return ("cannot be snapshotted incrementally on a standby: the snapshot's "
                    "watermarks are written to the WAL (pg_logical_emit_message), which "
                    "only the primary can do; capture from the primary for that")
        return None

    def _on_standby(self) -> bool:
        try:
            return on_standby(self._connection())
        except (psycopg.Error, SourceUnavailableError):
            return False  # reading the chunk will tell, and is retried

    def stopped(self, tables: set[TableId]) -> None:
        # Their windows' marks, when they come, are ignored.
        self.windows = [w for w in self.windows if w.schema.table not in tables]

    def _read_signal(self, payload: bytes) -> None:
        try:
            row = pgoutput.parse_insert(payload).new
            values = dict(zip(self._signal_columns, row, strict=False))
            data = values.get("data")
            signal = parse_signal(str(values.get("id")), str(values.get("type")),
                                  data if isinstance(data, str) else None)
        except SignalError as err:
            log.error("signal skipped: %s", err)
            return
        except DecodeError as err:
            log.error("signal skipped: the signal table's row cannot be read: %s", err)
            return
        self.on_signal(signal)

    # -- windows ------------------------------------------------------------------------
    def split(self, messages: list[Message], context: SourceContext | None) -> Split:
        """Read signals and window marks in *messages*; cut them at a window's close.

        Watermark transactions are left out of what is returned."""
        window = self.windows[0] if self.windows else None
        signal_prefix = self._signal_prefix
        kept: list[Message] = []
        for i, message in enumerate(messages):
            payload = message[0]
            kind = payload[0]
            if self._drop_commit:
                # Only when its Begin was dropped too: a Begin already handed to the
                # builder needs its Commit, or the builder would stay in a transaction.
                self._drop_commit = False
                if kind == _COMMIT:
                    continue
            if kind == _BEGIN:
                self._xid = _U32.unpack_from(payload, _XID_AT)[0]
            elif kind in _CHANGES:
                self._note_change(payload, kind)
            if kind == _MESSAGE and payload.find(_PREFIX_BYTES, 0, 64) != -1:
                mark = pgoutput.parse_logical_message(payload)
                if mark.prefix == WATERMARK_PREFIX:
                    # A watermark's transaction holds nothing else: Begin and Commit go too.
                    if kept and kept[-1] is messages[i - 1] and kept[-1][0][0] == _BEGIN:
                        kept.pop()
                        self._drop_commit = True
                    text = mark.content.decode(errors="replace")
                    if window is not None and text == f"open:{window.window_id}":
                        window.opened = True
                        self._refresh_suspects()
                    elif window is not None and text == f"close:{window.window_id}":
                        reads = self._close(window, mark.lsn, context)
                        rest = messages[i + 1:]
                        if self._drop_commit and rest and rest[0][0][0] == _COMMIT:
                            self._drop_commit = False
                            rest = rest[1:]
                        return Split(kept, reads, rest)
                    continue
            if signal_prefix is not None and payload[:5] == signal_prefix:
                # Kept in the batch: the builder skips the uncaptured table, and the
                # messages of a transaction are counted the same way everywhere
                # (partial_transaction).
                self._read_signal(payload)
                window = self.windows[0] if self.windows else None  # a stop may drop it
            if window is not None and window.opened and kind in self._kept_kinds:
                self._dedupe(window, payload, kind)
            kept.append(message)
        return Split(kept, [], None)

    def observe(self, messages: list[Message]) -> None:
        """Take note of transactions handed on before a restart (skipped now): their
        changes count for the visibility check as streamed ones do."""
        for payload, _ in messages:
            kind = payload[0]
            if kind == _BEGIN:
                self._xid = _U32.unpack_from(payload, _XID_AT)[0]
            elif kind in _CHANGES:
                self._note_change(payload, kind)

    def _note_change(self, payload: bytes, kind: int) -> None:
        """Remember which table the current transaction changed; a window whose SELECT
        did not see this transaction, and whose opening mark has not come yet, is stale
        if the table is its own."""
        xid = self._xid
        oids = pgoutput.parse_truncate(payload).relation_ids if kind == _TRUNCATE \
            else (_U32.unpack_from(payload, 1)[0],)
        recent, newest = self._recent, self._newest
        for oid in oids:
            recent[xid << 32 | oid] = None
            top = newest.get(oid)
            if top != xid and (top is None or _at_or_after(xid, top)):
                newest[oid] = xid
        if len(recent) > RECENT_CHANGES_LIMIT:
            del recent[next(iter(recent))]
        bound = self._suspect_xmax
        if xid in self._suspects or (bound is not None and _at_or_after(xid, bound)):
            for w in self.windows:
                if not w.opened and w.sees_not(xid) and w.relation_oid in oids \
                        and not w.reread:
                    if kind in self._kept_kinds:
                        # Its change is handed on before the window; the chunk's row of
                        # that key is older: it leaves the chunk, as if changed inside
                        # the window (on a durable server a commit stays invisible for
                        # its WAL flush, so this is common under concurrent writes).
                        self._dedupe(w, payload, kind)
                        continue
                    log.info("incremental snapshot of %s: transaction %d committed before "
                             "the window opened but was not visible to the chunk's SELECT "
                             "yet; reading the chunk again", w.schema.table, xid)
                    w.reread = True

    def _refresh_suspects(self) -> None:
        waiting = [w for w in self.windows if not w.opened]
        self._suspects = frozenset().union(*(w.invisible for w in waiting))
        # Windows are read in order, and a later snapshot's xmax is never lower.
        self._suspect_xmax = waiting[0].xmax if waiting else None

    def _forget_before(self, xmin: int) -> None:
        """Forget changes of transactions that began before *xmin* (32-bit): no snapshot
        taken from now on lists them as running."""
        # Nor is any at or above a later snapshot's xmax; a table's newest xid kept past
        # 2^31 transactions would compare as older than every new one.
        newest = self._newest
        for oid in [o for o, xid in newest.items() if not _at_or_after(xid, xmin)]:
            del newest[oid]
        recent = self._recent
        while recent:
            first = next(iter(recent))
            if (first >> 32) - xmin & 0xFFFFFFFF < 0x80000000:  # not before xmin
                return
            del recent[first]

    def _dedupe(self, window: Window, payload: bytes, kind: int) -> None:
        """A change of the window's table inside the window: its key leaves the buffer."""
        if kind == _TRUNCATE:
            if window.relation_oid in pgoutput.parse_truncate(payload).relation_ids:
                window.truncated = True
            return
        if _U32.unpack_from(payload, 1)[0] != window.relation_oid:
            return
        rows: list[Any] = []
        if kind == _INSERT:
            rows.append(pgoutput.parse_insert(payload).new)
        elif kind == _UPDATE:
            update = pgoutput.parse_update(payload)
            rows.append(update.new)
            if update.old is not None:
                rows.append(update.old)
        else:
            rows.append(pgoutput.parse_delete(payload).old)
        indexes = window.match_indexes
        for row in rows:
            if len(row) != len(window.schema.columns):
                # The table's columns changed: its cached layout no longer matches.
                window.reread = True
                self._table_cache.pop(window.schema.table, None)
                return
            key = tuple(row[i] for i in indexes)
            if any(v is None or v is UNAVAILABLE for v in key):
                window.reread = True  # a delete that did not send the key columns
                return
            window.removed.add(key)

    def _close(self, window: Window, lsn: int, context: SourceContext | None) -> list[ChangeEvent]:
        if not self.windows or self.windows[0] is not window:
            return []  # stopped meanwhile (a stop-snapshot in the same batch)
        self.windows.pop(0)
        progress = self.queue[0] if self.queue else None
        if progress is None or progress.table != window.schema.table:
            return []
        if window.reread:
            # Read this chunk again, and the ones read ahead after it.
            log.info("incremental snapshot of %s: a change inside a window could not be "
                     "matched to the chunk's rows; reading the chunk again", progress.table)
            self.windows = []
            progress.last_key = progress.read_key = window.start_key
            progress.read_all = False
            self.changed = True
            return []
        now_us = time.time_ns() // 1000
        # The reads' source.sequence: the last commit before the closing mark, as every
        # change handed on before them has had (the mark's own transaction is left out).
        source = SourceContext(CONNECTOR_NAME, self._prefix, self._database, now_us, None,
                               context.last_commit_lsn if context else None,
                               block=POSTGRES_BLOCK)
        rows = [] if window.truncated else window.rows
        if window.removed and rows:
            removed, indexes = window.removed, window.match_indexes
            rows = [r for r in rows if tuple(r[i] for i in indexes) not in removed]
        reads = [ChangeEvent(Op.READ, window.schema, None, row, source, lsn, 0, 0, now_us,
                             SnapshotMarker.INCREMENTAL) for row in rows]
        progress.last_key = window.last_key
        if window.done_after:
            self.queue.pop(0)
            self._table_cache.pop(progress.table, None)
            log.info("incremental snapshot of %s finished", progress.table)
        self.changed = True
        return reads

    def abandon_windows(self) -> None:
        """The stream restarts at the last committed offset: windows whose marks were
        not seen yet are read again (from the last key emitted)."""
        self.windows = []
        for progress in self.queue:
            progress.read_key, progress.read_all = progress.last_key, False

    def maybe_open_window(self) -> None:
        """Read chunks ahead between fresh watermarks, up to :data:`WINDOWS_AHEAD`
        windows, for the current table (the next table starts once it is done)."""
        while len(self.windows) < WINDOWS_AHEAD and self.queue and not self.paused:
            progress = self.queue[0]
            if progress.read_all:
                return  # the rest of its windows are on their way
            if time.monotonic() < self._retry_at:
                return
            try:
                window = self._read_chunk(progress)
            except (psycopg.OperationalError, psycopg.InterfaceError,
                    SourceUnavailableError) as err:
                # The server went away (a restart): try again later, from the last key
                # emitted; the table stays queued.
                self.close()
                self.abandon_windows()
                self._retry_at = time.monotonic() + self._retry_delay
                log.warning("incremental snapshot of %s: %s; retrying in %.1f s",
                            progress.table, first_line(err), self._retry_delay)
                self._retry_delay = min(self._retry_delay * 2, 30.0)
                return
            except (SnapshotTableError, psycopg.Error) as err:
                log.error("incremental snapshot of %s skipped: %s", progress.table,
                          first_line(err))
                self.queue.pop(0)
                self.windows = [w for w in self.windows if w.schema.table != progress.table]
                self.changed = True
                if isinstance(err, psycopg.Error):
                    self.close()
                continue
            self._retry_delay = 0.5
            if window is not None:
                self.windows.append(window)
                self._refresh_suspects()

    def _read_chunk(self, progress: TableProgress) -> Window | None:
        conn = self._connection()
        record_key = self._keys.get(progress.table, ())
        # Chunks follow the surrogate key when there is one; the events keep the table's
        # own record key, as its streamed events have it (as in Debezium).
        key = (progress.surrogate_key,) if progress.surrogate_key else record_key
        if not key:
            raise SnapshotTableError(f"table {progress.table} has no primary key")
        cached = self._table_cache.get(progress.table)
        if cached is None:
            # Once per table's snapshot: its columns and OID (the Relation id of its
            # stream messages); a change of its columns found in a window drops this.
            schema = catalog.table_schema(conn, progress.table, record_key,
                                          generated=self._generated)
            with conn.cursor() as cur:
                cur.execute("SELECT %s::regclass::oid", (quoted_name(progress.table),))
                row = cur.fetchone()
            assert row is not None
            cached = self._table_cache[progress.table] = (schema, int(row[0]))
        schema, oid = cached
        key_sql = sql.SQL(", ").join(sql.Identifier(k) for k in key)
        table_sql = sql.SQL("{}.{}").format(sql.Identifier(progress.table.schema),
                                             sql.Identifier(progress.table.table))
        condition = sql.SQL(" AND ({})").format(sql.SQL(progress.condition)) \
            if progress.condition else sql.SQL("")
        names = schema.column_names
        if any(k not in names for k in key):
            raise SnapshotTableError(f"table {progress.table} has no column "
                                     f"{', '.join(k for k in key if k not in names)}")
        key_indexes = tuple(names.index(k) for k in key)
        match_indexes = schema.key_indexes or key_indexes
        casts = [schema.columns[i].type_name for i in key_indexes]
        not_null = sql.SQL(" AND ").join(sql.SQL("{} IS NOT NULL").format(sql.Identifier(k))
                                         for k in key)
        if progress.max_key is None:
            # NULLs sort first in descending order: a surrogate key's NULL rows would
            # make the bound NULL and the chunks empty.
            query = sql.SQL("SELECT {} FROM {} WHERE {}{} ORDER BY {} LIMIT 1").format(
                key_sql, table_sql, not_null, condition, sql.SQL(", ").join(
                    sql.SQL("{} DESC").format(sql.Identifier(k)) for k in key))
            with conn.cursor() as cur:
                register_text_types(cur)  # keys as text, like the stream's
                cur.execute(query)
                top = cur.fetchone()
            if top is None:
                log.info("incremental snapshot of %s: the table is empty", progress.table)
                self.queue.pop(0)
                self.changed = True
                return None
            progress.max_key = list(top)
            self._sizer.reset()
            self.changed = True
            log.info("incremental snapshot of %s started (up to key %s)", progress.table,
                     progress.max_key)
        window_id = uuid.uuid4().hex
        bounds = [sql.SQL("({}) <= ({})").format(key_sql, _typed(casts))]
        params: list[Any] = list(progress.max_key)
        if progress.read_key is not None:
            bounds.insert(0, sql.SQL("({}) > ({})").format(key_sql, _typed(casts)))
            params = [*progress.read_key, *params]
        limit = self._sizer.rows()
        queries = chunk_queries(schema.columns, table_sql, sql.SQL("{}{}").format(
            sql.SQL(" AND ").join(bounds), condition), key, limit,
            self._sizer.chunk_most_bytes)
        # The opening mark, then the chunk's transaction, in one round trip. The mark's
        # commit need not wait for its WAL flush: its place in the WAL is what counts,
        # and the closing mark's flushed commit flushes it too (the stream brings
        # neither sooner).
        begin = (f"BEGIN; SET LOCAL synchronous_commit = off; "
                 f"{_mark_sql(conn, f'open:{window_id}')}; COMMIT; {_BEGIN_CHUNK}"
                 f"{self._index_order.settings(conn, progress.table, key)}")
        rows: list[tuple[Any, ...]] = []
        read_s = 0.0
        more = False
        with conn.cursor() as cur:
            register_text_types(cur)
            try:
                # One snapshot for both: the running transactions it does not see, and
                # the chunk read in it.
                self._send(cur, begin)
                cur.execute(_SNAPSHOT_QUERY if conn.info.server_version >= 130000
                            else _SNAPSHOT_QUERY_12)
                snapshot = cur.fetchone()
                assert snapshot is not None
                xmin = int(snapshot[0]) & 0xFFFFFFFF
                invisible = frozenset(int(x) & 0xFFFFFFFF
                                      for x in snapshot[1].split(",") if x)
                xmax = int(snapshot[2]) & 0xFFFFFFFF
                self._forget_before(xmin)
                missed = [x for x in invisible if x << 32 | oid in self._recent]
                # Not listed either: a streamed transaction at or above xmax (its xid
                # came after the opening mark's, its commit record before the mark's).
                top = self._newest.get(oid)
                if top is not None and _at_or_after(top, xmax) \
                        and top << 32 | oid in self._recent:
                    missed.append(top)
                if not missed:
                    started = time.monotonic()
                    cur.execute(queries.size, params)
                    size = cur.fetchone()
                    # (Text: the cursor loads every type as text.)
                    within = size is None or size[0] is None \
                        or int(size[0]) <= self._sizer.chunk_most_bytes
                    cur.execute(queries.plain if within else queries.within, params)
                    rows = cur.fetchall()
                    read_s = time.monotonic() - started
                    if rows and len(rows) < limit:
                        # Short: the table's end, or the byte budget (rows left).
                        more = self._rows_after(cur, rows[-1], key_indexes, progress,
                                                table_sql, key_sql, casts, condition)
            except BaseException:
                # The error in flight says what happened (a ROLLBACK on a lost
                # connection would replace it).
                with contextlib.suppress(psycopg.Error):
                    cur.execute("ROLLBACK")
                raise
            cur.execute("ROLLBACK")
            if not missed:
                # The closing mark: a flushed commit, so the stream brings it at once.
                self._send(cur, _mark_sql(conn, f"close:{window_id}"))
        if missed:
            # Streamed already, so committed before the opening mark, yet not visible:
            # its commit is still finishing (a synchronous standby's answer, say). The
            # chunk would be older than its change; read it again in a moment.
            if set(missed) != self._missed_logged:
                self._missed_logged = set(missed)
                log.info("incremental snapshot of %s: transaction(s) %s committed but are "
                         "not visible to the chunk's SELECT yet; reading the chunk again",
                         progress.table, ", ".join(map(str, sorted(missed))))
            self._retry_at = time.monotonic() + self._invisible_delay
            self._invisible_delay = min(self._invisible_delay * 2, _INVISIBLE_RETRY_MAX_S)
            return None
        self._invisible_delay = _INVISIBLE_RETRY_S
        start = progress.read_key
        last = list(rows[-1][i] for i in key_indexes) if rows else start
        done = (len(rows) < limit and not more) or last == progress.max_key
        self._sizer.saw(rows, limit, read_s)
        progress.read_key, progress.read_all = last, done
        return Window(window_id, schema, oid, rows, last, done, start, match_indexes,
                      invisible=invisible, xmax=xmax)

    @staticmethod
    def _rows_after(cur: psycopg.Cursor[Any], row: tuple[Any, ...],
                    key_indexes: tuple[int, ...], progress: TableProgress,
                    table_sql: sql.Composable, key_sql: sql.Composable, casts: list[str],
                    condition: sql.Composable) -> bool:
        """Rows of the snapshot are left after *row* (a chunk cut by its byte budget)."""
        last = [row[i] for i in key_indexes]
        if last == progress.max_key:
            return False
        assert progress.max_key is not None
        cur.execute(sql.SQL("SELECT 1 FROM {} WHERE ({}) > ({}) AND ({}) <= ({}){} "
                            "LIMIT 1").format(table_sql, key_sql, _typed(casts), key_sql,
                                              _typed(casts), condition),
                    [*last, *progress.max_key])
        return cur.fetchone() is not None

    @staticmethod
    def _send(cur: psycopg.Cursor[Any], statements: str) -> None:
        """Run *statements* (a window's marks go through here: one place to watch)."""
        cur.execute(statements)


def signal_table_layout(conn: Connection,
                        table: TableId) -> tuple[int, tuple[str, ...]]:
    """The signal table's OID and column names; a clear error if it is missing or is
    not laid out as Debezium's."""
    with conn.cursor() as cur:
        cur.execute("SELECT c.oid, array_agg(a.attname::text ORDER BY a.attnum) "
                    "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                    "JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 "
                    "AND NOT a.attisdropped WHERE n.nspname = %s AND c.relname = %s "
                    "GROUP BY c.oid", (table.schema, table.table))
        row = cur.fetchone()
    if row is None:
        raise SnapshotTableError(f"signal table {table} does not exist: create it with "
                                 f"{signal_table_ddl(table)}")
    oid, columns = row
    missing = {"id", "type", "data"} - set(columns)
    if missing:
        raise SnapshotTableError(f"signal table {table} lacks column(s) "
                                 f"{', '.join(sorted(missing))}; Debezium's layout is "
                                 f"{SIGNAL_TABLE_COLUMNS}")
    return int(oid), tuple(columns)


_BEGIN_CHUNK: Final = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"

# The snapshot's oldest running transaction, the running ones below its xmax, and its
# xmax (xid8 as text; PostgreSQL 12 has only the txid_ forms).
_SNAPSHOT_QUERY: Final = ("SELECT pg_snapshot_xmin(s)::text, "
                          "array_to_string(ARRAY(SELECT pg_snapshot_xip(s)), ','), "
                          "pg_snapshot_xmax(s)::text FROM pg_current_snapshot() s")
_SNAPSHOT_QUERY_12: Final = ("SELECT txid_snapshot_xmin(s)::text, "
                             "array_to_string(ARRAY(SELECT txid_snapshot_xip(s)), ','), "
                             "txid_snapshot_xmax(s)::text FROM txid_current_snapshot() s")


def _at_or_after(xid: int, bound: int) -> bool:
    """32-bit xid *xid* is *bound* or later (modulo 2**32, as PostgreSQL compares)."""
    return (xid - bound) & 0xFFFFFFFF < 0x80000000


def _mark_sql(conn: Connection, content: str) -> str:
    """The statement writing a watermark with *content* (inlined: it goes in a string of
    several statements, which takes no parameters)."""
    return sql.SQL("SELECT pg_logical_emit_message(true, {}, {})").format(
        sql.Literal(WATERMARK_PREFIX), sql.Literal(content)).as_string(conn)


def _typed(casts: Sequence[str]) -> sql.Composable:
    # Keys travel as text (the snapshot's and the stream's common form): each is cast
    # back to its column's type so the comparison uses the type's own order.
    return sql.SQL(", ").join(sql.SQL("CAST(%s AS {})").format(sql.SQL(c)) for c in casts)

