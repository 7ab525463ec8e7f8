"""Binlog events -> change events, one whole transaction at a time.

A MariaDB transaction in the binlog is a GTID event, table maps and rows events, and an
XID event (InnoDB) or a ``COMMIT`` query (non-transactional engines); a DDL statement is
a GTID event marked standalone and one query. Rows are held until the transaction's
end, because its commit position and time are only known there and every event carries
them. A transaction is handed on whole, unless it outgrows *max_rows_in_memory*: then
the rest of its rows events wait, as the binlog's bytes, in a temporary file, and the
committed transaction comes out in chunks (:meth:`ChangeBuilder.rest`), so memory does
not grow with it.

Events follow Debezium's MariaDB/MySQL connectors: ``source`` has ``server_id``,
``gtid``, ``file``, ``pos`` (the rows event's position), ``row`` (the row's index in
it), ``thread`` and ``query``; ``transaction.id`` is the GTID. ``TRUNCATE TABLE``
becomes a truncate event (op ``t``) for a captured table, so that tables kept in step
downstream are emptied too.
"""

from __future__ import annotations

import logging
import re
import struct
import tempfile
from collections.abc import Callable, Iterator
from typing import IO, Final

from tidemark.event import (
    Op,
    TableId,
    TableSchema,
    TransactionBoundary,
    WireTuple,
)
from tidemark.key_change import key_changed
from tidemark.source.mariadb import binlog as b
from tidemark.source.mariadb.binlog import EventHeader
from tidemark.source.mariadb.json_lines import EventRows, LineWriter
from tidemark.source.mariadb.position import (
    BinlogPosition,
    format_gtid_state,
    ordering_key,
    parse_gtid_state,
)
from tidemark.source.mariadb.row_decoder import RowDecoder
from tidemark.source.mariadb.table_map import TableMap, parse_table_map
from tidemark.source.mariadb.transaction_records import Made, TransactionRecords
from tidemark.source.mariadb.types import table_column

log = logging.getLogger(__name__)

_OPS: Final = {"c": Op.CREATE, "u": Op.UPDATE, "d": Op.DELETE}
_TRUNCATE: Final = re.compile(
    r"^\s*TRUNCATE\s+(?:TABLE\s+)?(?:`((?:[^`]|``)+)`|(\w+))(?:\s*\.\s*(?:`((?:[^`]|``)+)`|(\w+)))?",
    re.IGNORECASE)
_TABLE_MAP_CACHE_SIZE: Final = 1024
#: A spooled rows event: its table (index in the transaction's list), event type,
#: position and body length; the body follows.
_SPOOLED: Final = struct.Struct("<IBQI")

#: One decoded row of a transaction: schema, op, before, after, ordering key of its
#: rows event, file, position, row index in the event.
_Row = tuple[TableSchema, Op, WireTuple | None, WireTuple | None, int, str, int, int]


class _Table:
    """A table map, decoded once, and the table schema its events carry."""

    __slots__ = ("decoder", "key", "schema")

    def __init__(self, table_map: TableMap, version: int) -> None:
        self.decoder = RowDecoder(table_map)
        key = table_map.primary_key
        #: The key's positions in a row image (empty for a table without a key).
        self.key: tuple[int, ...] = tuple(key)
        columns = tuple(table_column(c, i in key) for i, c in enumerate(table_map.columns))
        self.schema = TableSchema(TableId(table_map.database, table_map.table), columns,
                                  key, "default", version)


class _Transaction:
    __slots__ = ("count", "file", "gtid", "held", "rows", "server_id", "spool", "tables",
                 "thread")

    def __init__(self, gtid: b.Gtid | None, server_id: int) -> None:
        self.gtid = gtid
        self.server_id = server_id
        self.rows: list[_Row | EventRows] = []
        self.count = 0  # rows in rows
        self.held = 0  # binlog bytes of the rows events in rows
        self.thread: int | None = None
        #: Rows events past the in-memory limit, as read (see _SPOOLED), and their tables.
        self.spool: IO[bytes] | None = None
        self.tables: dict[_Table, int] = {}
        self.file = ""  # of the spooled events: a transaction never spans binlog files

    def close(self) -> None:
        if self.spool is not None:
            self.spool.close()
            self.spool = None


def _append_rows(append: Callable[[_Row | EventRows], None], table: _Table,
                 event_type: int, body: bytes, file: str, position: int,
                 lines: LineWriter | None = None) -> int:
    """The rows of one rows event, decoded, through *append*: one entry per change, or
    with *lines* one for the event (see :meth:`LineWriter.hold`); the number of rows."""
    rows_event = b.parse_rows(body, event_type)
    if lines is not None:
        return lines.hold(append, table.schema, table.decoder, rows_event, file, position)
    rows = table.decoder.rows(rows_event)
    key = ordering_key(file, position)
    op = _OPS[rows_event.op]
    schema = table.schema
    key_at = table.key if op is Op.UPDATE else ()
    for index, (before, after) in enumerate(rows):
        if key_at and before is not None and after is not None \
                and key_changed(key_at, before, after):
            append((schema, Op.DELETE, before, None, key, file, position, index))
            append((schema, Op.CREATE, None, after, key, file, position, index))
        else:
            append((schema, op, before, after, key, file, position, index))
    return len(rows)


class ChangeBuilder:
    """Feeds on a dump's events in order; :meth:`handle` returns the records of each
    completed transaction, with the position to resume from after them.

    *captured*: whether a table is captured (its rows are skipped otherwise, cheaply:
    before decoding). *position*: where the dump started (its file name is needed until
    the first ROTATE event names it again). *max_rows_in_memory*: rows of an open
    transaction held decoded; the rest go to a temporary file (None: no limit);
    *max_bytes_in_memory*: the same in binlog bytes of its rows events, so wide rows are
    held fewer. *skipped_operations*: Debezium's ``skipped.operations`` (but never the
    inserts of *signal_table*). *lines*: the rows of rows events come as Debezium JSON
    lines written by it (:mod:`~tidemark.source.mariadb.json_lines`), the signal table's
    and truncates as change events still.
    """

    def __init__(self, *, name: str, position: BinlogPosition,
                 captured: Callable[[TableId], bool],
                 transaction_metadata: bool = False,
                 max_rows_in_memory: int | None = None,
                 max_bytes_in_memory: int | None = None,
                 skipped_operations: frozenset[Op] = frozenset(),
                 signal_table: TableId | None = None,
                 lines: LineWriter | None = None) -> None:
        if lines is not None and transaction_metadata:
            raise ValueError("JSON lines are written without transaction metadata")
        self.name = name
        self._lines = lines
        # Debezium's binlog connectors skip by rows event, before decoding (an update
        # that changes the key goes with the updates); the signal table's inserts are
        # signals, never skipped.
        self._skipped_types = frozenset(
            event_type for event_type, (code, _) in b.ROWS_EVENTS.items()
            if _OPS[code] in skipped_operations)
        self._skip_truncates = Op.TRUNCATE in skipped_operations
        self._signal_table = signal_table
        self.file = position.file
        self.next_pos = position.pos
        self.gtid_state = parse_gtid_state(position.gtids)
        self._captured = captured
        self._metadata = transaction_metadata
        self._decoder = b.EventDecoder()
        self._maps: dict[bytes, _Table | None] = {}
        self._by_id: dict[int, _Table | None] = {}
        self._versions: dict[TableId, int] = {}
        self._schemas: dict[TableId, tuple[str, ...]] = {}
        self._keyless: set[TableId] = set()
        self._tx: _Transaction | None = None
        self._max_rows = max_rows_in_memory
        self._max_bytes = max_bytes_in_memory
        #: The spooled part of the transaction handle() completed last, made into
        #: records by rest().
        self._rest: tuple[_Transaction, TransactionRecords] | None = None
        #: Commit time (µs since the epoch) of the last transaction handled.
        self.commit_us: int | None = None

    @property
    def checksum(self) -> int:
        return self._decoder.checksum

    @checksum.setter
    def checksum(self, value: int) -> None:
        self._decoder.checksum = value

    @property
    def position(self) -> BinlogPosition:
        """The position after the last complete transaction handled."""
        return BinlogPosition(self.file, self.next_pos, format_gtid_state(self.gtid_state))

    @property
    def lines(self) -> LineWriter | None:
        """The writer of rows events' JSON lines, if the builder writes them."""
        return self._lines

    @property
    def in_transaction(self) -> bool:
        return self._tx is not None

    @property
    def has_rest(self) -> bool:
        """The transaction handle() completed last outgrew memory: :meth:`rest` has
        more of its records."""
        return self._rest is not None

    def rest(self, chunk: int, chunk_bytes: int | None = None) -> Iterator[Made]:
        """The rest of the records of the transaction handle() completed last, *chunk*
        rows or about *chunk_bytes* binlog bytes at a time (the transaction's END record
        comes with the last chunk); nothing unless it outgrew memory."""
        pending, self._rest = self._rest, None
        if pending is None:
            return
        tx, made = pending
        spool = tx.spool
        assert spool is not None
        try:
            tables = list(tx.tables)
            spool.seek(0)
            rows: list[_Row | EventRows] = []
            append = rows.append
            read = spool.read
            held = count = 0
            most = chunk_bytes if chunk_bytes is not None else 1 << 62
            while header := read(_SPOOLED.size):
                table, event_type, position, size = _SPOOLED.unpack(header)
                count += _append_rows(append, tables[table], event_type, read(size),
                                      tx.file, position, self._lines_of(tables[table]))
                held += size
                if count >= chunk or held >= most:
                    yield self._made(made, rows)
                    rows = []
                    append = rows.append
                    held = count = 0
            records = self._made(made, rows)
            if made.metadata:
                records.append(made.end())
            yield records
        finally:
            tx.close()

    def with_rest(self, records: Made, chunk: int,
                  chunk_bytes: int | None = None) -> Iterator[Made]:
        """*records*, what :meth:`handle` returned, then :meth:`rest`."""
        yield records
        yield from self.rest(chunk, chunk_bytes)

    def close(self) -> None:
        """Remove an open or not yet handed on transaction's temporary file."""
        for tx in (self._tx, self._rest[0] if self._rest else None):
            if tx is not None:
                tx.close()
        self._tx = self._rest = None

    def handle(self, event: bytes) -> Made | None:
        """The records of the transaction this event completes (possibly none, for a
        transaction of uncaptured tables), or None when it completes nothing. Of a
        transaction that outgrew memory, its first part: :meth:`rest` has the others."""
        header, body = self._decoder.split(event)
        kind = header.type
        if kind in b.ROWS_EVENTS:
            self._rows(header, body)
            return None
        if kind == b.TABLE_MAP_EVENT:
            self._table_map(body)
            return None
        if kind == b.GTID_EVENT:
            gtid = b.parse_gtid(body, header.server_id)
            if self._tx is not None:  # a group the binlog never ended (a crashed writer)
                self._tx.close()
            self._tx = _Transaction(gtid, header.server_id)
            return None
        if kind == b.XID_EVENT:
            return self._commit(header)
        if kind == b.XA_PREPARE_LOG_EVENT:
            # The first phase of an XA transaction ends its binlog group; XA COMMIT
            # comes later as a group of its own, without the rows. Its changes go out
            # here, as Debezium's connector sends them.
            log.debug("XA PREPARE %s", b.parse_xa_prepare(body))
            return self._commit(header)
        if kind == b.QUERY_EVENT:
            return self._query(header, body)
        if kind == b.ROTATE_EVENT:
            rotate = b.parse_rotate(body)
            self.file = rotate.file
            if self._tx is None:
                self.next_pos = rotate.position
            return None
        if kind == b.GTID_LIST_EVENT and self._tx is None:
            for domain, server, sequence in b.parse_gtid_list(body).gtids:
                if sequence >= self.gtid_state.get(domain, (0, -1))[1]:
                    self.gtid_state[domain] = (server, sequence)
        if self._tx is None and header.next_position:
            # Between transactions every event moves the resume position (a new file's
            # description, heartbeats): a reader waiting for a position past them
            # knows when it is there.
            self.next_pos = header.next_position
        return None

    @property
    def position_key(self) -> int:
        """The int64 ordering key of :attr:`position` (cheap: for a check per event)."""
        return ordering_key(self.file, self.next_pos)

    # -- events ----------------------------------------------------------------------
    def _table_map(self, body: bytes) -> None:
        if body in self._maps:
            table = self._maps[body]
        else:
            table_map = parse_table_map(body)
            table_id = TableId(table_map.database, table_map.table)
            if not self._captured(table_id):
                table = None
            else:
                names = tuple(c.name for c in table_map.columns)
                version = self._versions.get(table_id, -1)
                if self._schemas.get(table_id) != names or version < 0:
                    version += 1
                    self._versions[table_id] = version
                    self._schemas[table_id] = names
                    if version:
                        log.info("schema of %s changed: columns now %s", table_id,
                                 ", ".join(names))
                table = _Table(table_map, version)
                if not table_map.primary_key and table_id not in self._keyless:
                    self._keyless.add(table_id)
                    log.warning("table %s has no primary key: its events have no key (as in "
                                "Debezium), so keyed consumers (tidemark run, compacted "
                                "topics) cannot apply them; add one (ALTER TABLE ... ADD "
                                "PRIMARY KEY (...)) or leave the table out", table_id)
            if len(self._maps) >= _TABLE_MAP_CACHE_SIZE:
                self._maps.clear()
            self._maps[body] = table
        self._by_id[int.from_bytes(body[0:6], "little")] = table

    def _rows(self, header: EventHeader, body: bytes) -> None:
        table_id = int.from_bytes(body[0:6], "little")
        table = self._by_id.get(table_id)
        if table is None:
            return  # not captured (or a table map we never saw: a dump mid-transaction)
        if header.type in self._skipped_types and table.schema.table != self._signal_table:
            return
        tx = self._tx
        if tx is None:  # rows outside a GTID group: a server without GTIDs
            tx = self._tx = _Transaction(None, header.server_id)
        position = header.next_position - header.size
        if tx.spool is not None or (self._max_rows is not None
                                    and tx.count >= self._max_rows) or (
                self._max_bytes is not None and tx.held >= self._max_bytes):
            self._spool(tx, table, header.type, body, position)
            return
        tx.count += _append_rows(tx.rows.append, table, header.type, body, self.file,
                                 position, self._lines_of(table))
        tx.held += len(body)

    def _lines_of(self, table: _Table) -> LineWriter | None:
        """The writer of *table*'s rows' JSON lines (a signal's must stay an event)."""
        return self._lines if table.schema.table != self._signal_table else None

    def _made(self, made: TransactionRecords, rows: list[_Row | EventRows]) -> Made:
        return made.records(rows) if self._lines is None else self._lines.lines(rows, made)

    def _spool(self, tx: _Transaction, table: _Table, event_type: int, body: bytes,
               position: int) -> None:
        if tx.spool is None:
            log.info("transaction %s holds more than %d rows or %d bytes: the rest of it "
                     "waits in a temporary file until its commit", tx.gtid or self.file,
                     tx.count, tx.held)
            tx.spool = tempfile.TemporaryFile(prefix="tidemark-transaction-")  # noqa: SIM115
            tx.file = self.file
        index = tx.tables.setdefault(table, len(tx.tables))
        tx.spool.write(_SPOOLED.pack(index, event_type, position, len(body)))
        tx.spool.write(body)

    def _query(self, header: EventHeader, body: bytes) -> Made | None:
        query = b.parse_query(body)
        sql = query.sql.lstrip()
        head = sql[:8].upper()
        if head.startswith("BEGIN"):
            if self._tx is None:
                self._tx = _Transaction(None, header.server_id)
            self._tx.thread = query.thread_id
            return None
        upper = sql[:16].upper()
        if head.startswith("COMMIT") or (head.startswith("ROLLBACK")
                                          and not upper.startswith("ROLLBACK TO")):
            return self._commit(header)
        open_tx = self._tx
        if open_tx is not None and (open_tx.gtid is None or not open_tx.gtid.standalone):
            # A statement inside a transaction (SAVEPOINT, ROLLBACK TO SAVEPOINT,
            # RELEASE SAVEPOINT, which ORMs write for nested transactions): part of it,
            # never its end; only XID or COMMIT ends it.
            log.debug("statement inside a transaction: %s", sql[:100])
            return None
        # DDL, or another statement: a group of its own (GTID event standalone).
        if upper.startswith("XA ROLLBACK"):
            log.warning("%s in the binlog: the changes of that XA transaction were sent "
                        "when it was prepared (as Debezium does) and are not undone; "
                        "consumers hold them although the database rolled them back",
                        sql[:200])
        truncated = self._truncated(query.database, sql)
        tx = self._tx or _Transaction(None, header.server_id)
        self._tx = tx
        if truncated is not None and not self._skip_truncates:
            tx.rows.append((truncated, Op.TRUNCATE, None, None,
                            ordering_key(self.file, header.next_position - header.size),
                            self.file, header.next_position - header.size, 0))
            tx.count += 1
        elif head.startswith(("ALTER", "CREATE", "DROP", "RENAME")):
            log.info("DDL in the binlog (%s): %s", tx.gtid or self.file, sql[:200])
        tx.thread = query.thread_id
        return self._commit(header)

    def _truncated(self, database: str, sql: str) -> TableSchema | None:
        match = _TRUNCATE.match(sql)
        if match is None:
            return None
        first = (match.group(1) or match.group(2) or "").replace("``", "`")
        second = (match.group(3) or match.group(4) or "").replace("``", "`")
        table = TableId(first, second) if second else TableId(database, first)
        if not self._captured(table):
            return None
        known = next((t.schema for t in self._by_id.values()
                      if t is not None and t.schema.table == table), None)
        return known or TableSchema(table, (), (), "default", self._versions.get(table, 0))

    def _commit(self, header: EventHeader) -> Made:
        tx, self._tx = self._tx, None
        self.next_pos = header.next_position
        commit_key = ordering_key(self.file, header.next_position)
        if tx is None:
            return []
        gtid = tx.gtid
        if gtid is not None:
            self.gtid_state[gtid.domain] = (gtid.server_id, gtid.sequence)
        ts_us = self.commit_us = header.timestamp * 1_000_000
        if not tx.rows and tx.spool is None:
            return []
        tx_id = str(gtid) if gtid is not None else f"{self.file}:{header.next_position}"
        made = TransactionRecords(self.name, str(gtid) if gtid is not None else None,
                                  tx.server_id, tx.thread, tx_id, ts_us, commit_key,
                                  self._metadata)
        records = self._made(made, tx.rows)
        tx.rows = []
        if made.metadata:
            records.insert(0, TransactionBoundary("BEGIN", tx_id, ts_us, commit_key,
                                                  topic_prefix=self.name))
        if tx.spool is not None:
            self._rest = (tx, made)
        elif made.metadata:
            records.append(made.end())
        return records
