"""Binlog events -> change events, one whole transaction at a time.

A MariaDB transaction in the binlog is a GTID event, table maps and rows events, and an
XID event (InnoDB) or a ``COMMIT`` query (non-transactional engines); a DDL statement is
a GTID event marked standalone and one query. Rows are held until the transaction's
end, because its commit position and time are only known there and every event carries
them, and handed on together: a consumer never sees part of a transaction.

Events follow Debezium's MariaDB/MySQL connectors: ``source`` has ``server_id``,
``gtid``, ``file``, ``pos`` (the rows event's position), ``row`` (the row's index in
it), ``thread`` and ``query``; ``transaction.id`` is the GTID. ``TRUNCATE TABLE``
becomes a truncate event (op ``t``) for a captured table, so that tables kept in step
downstream are emptied too.
"""

from __future__ import annotations

import logging
import operator
import re
import time
from collections.abc import Callable
from typing import Final

from tidemark.event import (
    ChangeEvent,
    Op,
    Record,
    SourceContext,
    TableId,
    TableSchema,
    TransactionBoundary,
    WireTuple,
)
from tidemark.source.mariadb import binlog as b
from tidemark.source.mariadb.binlog import EventHeader, TableMap
from tidemark.source.mariadb.position import (
    BinlogPosition,
    format_gtid_state,
    ordering_key,
    parse_gtid_state,
)
from tidemark.source.mariadb.row_decoder import RowDecoder
from tidemark.source.mariadb.source_fields import MariaDbSourceFields
from tidemark.source.mariadb.types import table_column

log = logging.getLogger(__name__)

CONNECTOR: Final = "mariadb"
_OPS: Final = {"c": Op.CREATE, "u": Op.UPDATE, "d": Op.DELETE}
_TRUNCATE: Final = re.compile(
    r"^\s*TRUNCATE\s+(?:TABLE\s+)?(?:`((?:[^`]|``)+)`|(\w+))(?:\s*\.\s*(?:`((?:[^`]|``)+)`|(\w+)))?",
    re.IGNORECASE)
_TABLE_MAP_CACHE_SIZE: Final = 1024


class _Table:
    """A table map, decoded once, and the table schema its events carry."""

    __slots__ = ("decoder", "key_of", "schema")

    def __init__(self, table_map: TableMap, version: int) -> None:
        self.decoder = RowDecoder(table_map)
        key = table_map.primary_key
        #: The key's values of a row image (None for a table without a key).
        self.key_of: Callable[[WireTuple], object] | None = \
            operator.itemgetter(*key) if key else None
        columns = tuple(table_column(c, i in key) for i, c in enumerate(table_map.columns))
        self.schema = TableSchema(TableId(table_map.database, table_map.table), columns,
                                  key, "default", version)


class _Transaction:
    __slots__ = ("gtid", "rows", "server_id", "thread")

    def __init__(self, gtid: b.Gtid | None, server_id: int) -> None:
        self.gtid = gtid
        self.server_id = server_id
        # (schema, op, before, after, position key, file, pos, row index)
        self.rows: list[tuple[TableSchema, Op, WireTuple | None, WireTuple | None, int, str,
                              int, int]] = []
        self.thread: int | None = None


class ChangeBuilder:
    """Feeds on a dump's events in order; :meth:`handle` returns the records of each
    completed transaction, with the position to resume from after them.

    *captured*: whether a table is captured (its rows are skipped otherwise, cheaply:
    before decoding). *position*: where the dump started (its file name is needed until
    the first ROTATE event names it again).
    """

    def __init__(self, *, name: str, position: BinlogPosition,
                 captured: Callable[[TableId], bool],
                 transaction_metadata: bool = False) -> None:
        self.name = name
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
    def in_transaction(self) -> bool:
        return self._tx is not None

    def handle(self, event: bytes) -> list[Record] | None:
        """The records of the transaction this event completes (possibly none, for a
        transaction of uncaptured tables), or None when it completes nothing."""
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
            table_map = b.parse_table_map(body)
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
        tx = self._tx
        if tx is None:  # rows outside a GTID group: a server without GTIDs
            tx = self._tx = _Transaction(None, header.server_id)
        rows_event = b.parse_rows(body, header.type)
        position = header.next_position - header.size
        key = ordering_key(self.file, position)
        op = _OPS[rows_event.op]
        schema = table.schema
        append = tx.rows.append
        key_of = table.key_of if op is Op.UPDATE else None
        for index, (before, after) in enumerate(table.decoder.rows(rows_event)):
            if key_of is not None and before is not None and after is not None \
                    and key_of(before) != key_of(after):
                # A primary-key change is a delete of the old key and a create of the
                # new one (Debezium's events), so that keyed consumers see both keys.
                append((schema, Op.DELETE, before, None, key, self.file, position, index))
                append((schema, Op.CREATE, None, after, key, self.file, position, index))
            else:
                append((schema, op, before, after, key, self.file, position, index))

    def _query(self, header: EventHeader, body: bytes) -> list[Record] | None:
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
        if truncated is not None:
            tx.rows.append((truncated, Op.TRUNCATE, None, None,
                            ordering_key(self.file, header.next_position - header.size),
                            self.file, header.next_position - header.size, 0))
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

    def _commit(self, header: EventHeader) -> list[Record]:
        tx, self._tx = self._tx, None
        self.next_pos = header.next_position
        commit_key = ordering_key(self.file, header.next_position)
        if tx is None:
            return []
        gtid = tx.gtid
        if gtid is not None:
            self.gtid_state[gtid.domain] = (gtid.server_id, gtid.sequence)
        ts_us = self.commit_us = header.timestamp * 1_000_000
        if not tx.rows:
            return []
        tx_id = str(gtid) if gtid is not None else f"{self.file}:{header.next_position}"
        gtid_text = str(gtid) if gtid is not None else None
        now_us = time.time_ns() // 1000
        records: list[Record] = []
        per_table: dict[TableId, int] = {}
        server_id, thread, name = tx.server_id, tx.thread, self.name
        for order, (schema, op, before, after, key, file, pos, row) in enumerate(tx.rows, 1):
            table = schema.table
            count = per_table.get(table, 0) + 1
            per_table[table] = count
            context = SourceContext(
                CONNECTOR, name, table.schema, ts_us, None, None, tx_id, commit_key, None,
                MariaDbSourceFields(server_id, gtid_text, file, pos, row, thread))
            records.append(ChangeEvent(op, schema, before, after, context, key, order, count,
                                       now_us))
        if self._metadata:
            begin = TransactionBoundary("BEGIN", tx_id, ts_us, commit_key,
                                        topic_prefix=self.name)
            end = TransactionBoundary(
                "END", tx_id, ts_us, commit_key, len(tx.rows),
                tuple((str(t), n) for t, n in per_table.items()), self.name)
            records = [begin, *records, end]
        return records
