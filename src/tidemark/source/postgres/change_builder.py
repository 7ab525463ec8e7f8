"""Turns decoded pgoutput messages into change events.

pgoutput (protocol v1) sends whole committed transactions in commit order: Begin, the
changes, Commit. This module keeps the little state that needs — the table schemas
announced by Relation messages, the open transaction's commit position and its event
counters — and emits :class:`~tidemark.event.ChangeEvent` objects (and, when transaction
metadata is on, BEGIN/END :class:`~tidemark.event.TransactionBoundary` records).

Debezium's rules are followed: an update that changes the key becomes a delete and a
create; TRUNCATE becomes one ``t`` event per table; a logical decoding message becomes
an ``m`` event.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Final

from tidemark.errors import DecodeError
from tidemark.event import (
    UNAVAILABLE,
    ChangeEvent,
    Op,
    Record,
    SourceContext,
    TableId,
    TableSchema,
    TransactionBoundary,
    WireTuple,
)
from tidemark.key_change import key_changed
from tidemark.source.postgres import pgoutput
from tidemark.source.postgres.source_block import POSTGRES_BLOCK
from tidemark.source.postgres.types import pg_column

log = logging.getLogger(__name__)

CONNECTOR_NAME = "postgresql"



class ChangeEventBuilder:
    """Stateful converter of pgoutput messages to change events.

    ``key_columns(table)`` returns the table's primary-key columns (or None);
    ``not_null_columns(table)`` its NOT NULL columns; ``type_info(oid)`` a type's name and
    the built-in type it decodes as (see :func:`catalog.type_info`).
    They are asked only when a Relation message arrives, i.e. once per table and after
    DDL.
    """

    def __init__(
        self,
        *,
        topic_prefix: str,
        database: str,
        key_columns: Callable[[TableId], tuple[str, ...] | None],
        type_info: Callable[[int], tuple[str, int]],
        captured: frozenset[TableId] | None = None,
        not_null_columns: Callable[[TableId], frozenset[str]] = lambda table: frozenset(),
        transaction_metadata: bool = False,
        last_commit_lsn: int | None = None,
        skipped_operations: frozenset[Op] = frozenset(),
    ) -> None:
        self._prefix = topic_prefix
        self._database = database
        self._key_columns = key_columns
        self._type_info = type_info
        # A publication may send more than we capture (FOR ALL TABLES, shared, or
        # left over from an earlier include list); those relations are skipped.
        self._captured = captured
        self._skipped: set[int] = set()
        self._not_null_columns = not_null_columns
        self._metadata = transaction_metadata
        #: Operations left out (Debezium's skipped.operations): as in Debezium's
        #: dispatcher, per event, before it is counted in the transaction's orders.
        self.skipped_operations = skipped_operations
        self._relations: dict[int, TableSchema] = {}
        self._versions: dict[TableId, int] = {}
        # open transaction
        self.in_transaction = False
        self._orders = TransactionOrders()
        self._last_commit_lsn = last_commit_lsn
        self._context = SourceContext(CONNECTOR_NAME, topic_prefix, database, 0, None, None,
                                      block=POSTGRES_BLOCK)
        #: End LSN of the last transaction whose Commit has been processed: the position
        #: a resumed stream starts from once everything up to here is handed on.
        self.last_end_lsn: int | None = None
        #: Commits processed (for metrics).
        self.commits = 0

    @property
    def context(self) -> SourceContext:
        """What the events of the open (or last) transaction share."""
        return self._context

    @property
    def schemas(self) -> Mapping[int, TableSchema]:
        """The current schema of each captured relation, by relation id (read-only)."""
        return self._relations

    # -- schemas --------------------------------------------------------------------
    def schema_for(self, relation_id: int) -> TableSchema | None:
        """The current schema of a relation announced by a Relation message (None for a
        relation that is published but not captured)."""
        try:
            return self._relations[relation_id]
        except KeyError:
            if relation_id in self._skipped:
                return None
            raise DecodeError(
                "change", 0,
                f"relation {relation_id} was used before its Relation message",
            ) from None

    def _on_relation(self, msg: pgoutput.Relation) -> None:
        table = TableId(msg.namespace, msg.name)
        if self._captured is not None and table not in self._captured:
            self._skipped.add(msg.relation_id)
            return
        self._skipped.discard(msg.relation_id)
        pk = self._key_columns(table)
        names = [c.name for c in msg.columns]
        # No primary key, no record key: as in Debezium, and as the snapshot does.
        key = tuple(names.index(k) for k in pk) if pk and all(k in names for k in pk) else ()
        not_null = self._not_null_columns(table)
        version = self._versions.get(table, -1) + 1
        self._versions[table] = version
        infos = [self._type_info(c.type_oid) for c in msg.columns]
        columns = tuple(
            pg_column(c.name, decoding, c.type_modifier, name, i in key,
                      c.name not in not_null)
            for i, (c, (name, decoding)) in enumerate(zip(msg.columns, infos, strict=True))
        )
        old = self._relations.get(msg.relation_id)
        self._relations[msg.relation_id] = TableSchema(
            table, columns, key, msg.replica_identity, version
        )
        if old is not None and old.columns != columns:
            log.info("schema of %s changed: columns now %s", table,
                     ", ".join(c.name for c in columns))

    # -- the main loop --------------------------------------------------------------
    def process(self, messages: Sequence[tuple[bytes, int]], now_us: int) -> list[Record]:
        """Convert a batch of ``(pgoutput payload, data_start LSN)`` pairs; returns the
        records in order."""
        out: list[Record] = []
        append = out.append
        relations = self._relations
        skipped = self.skipped_operations
        for data, lsn in messages:
            kind = data[0] if data else 0
            if kind == 0x49:  # Insert
                if Op.CREATE in skipped:
                    continue
                ins = pgoutput.parse_insert(data)
                schema = relations.get(ins.relation_id) or self.schema_for(ins.relation_id)
                if schema is None:
                    continue
                append(self._event(Op.CREATE, schema, None, ins.new, lsn,
                                   now_us))
            elif kind == 0x55:  # Update
                upd = pgoutput.parse_update(data)
                schema = relations.get(upd.relation_id) or self.schema_for(upd.relation_id)
                if schema is None:
                    continue
                old = upd.old
                new = upd.new
                if upd.old_kind == "O" and old is not None and UNAVAILABLE in new:
                    # REPLICA IDENTITY FULL sent the old row: an unchanged TOASTed value
                    # is known, so use it, in a key change's create too (as Debezium
                    # does; confirmed by capture).
                    new = tuple(o if n is UNAVAILABLE else n
                                for o, n in zip(old, new, strict=True))
                if old is not None and key_changed(schema.key_indexes, old, new):
                    # Debezium's PostgreSQL connector skips per event: a key change is a
                    # delete and a create, each skipped by its own code.
                    if Op.DELETE not in skipped:
                        append(self._event(Op.DELETE, schema, old, None, lsn,
                                           now_us))
                    if Op.CREATE not in skipped:
                        append(self._event(Op.CREATE, schema, None, new,
                                           lsn, now_us))
                elif Op.UPDATE not in skipped:
                    before = old if upd.old_kind == "O" else None
                    append(self._event(Op.UPDATE, schema, before, new, lsn, now_us))
            elif kind == 0x44:  # Delete
                if Op.DELETE in skipped:
                    continue
                dele = pgoutput.parse_delete(data)
                schema = relations.get(dele.relation_id) or self.schema_for(dele.relation_id)
                if schema is None:
                    continue
                append(self._event(Op.DELETE, schema, dele.old, None, lsn,
                                   now_us))
            elif kind == 0x42:  # Begin
                self._on_begin(pgoutput.parse_begin(data), out, now_us)
            elif kind == 0x43:  # Commit
                self._on_commit(pgoutput.parse_commit(data), out, now_us)
            else:
                self._on_other(pgoutput.decode_message(data), lsn, out, now_us)
        return out

    def _on_begin(self, msg: pgoutput.Begin, out: list[Record], now_us: int) -> None:
        self.in_transaction = True
        tx_id = f"{msg.xid}:{msg.final_lsn}"
        self._orders = TransactionOrders()
        self._context = SourceContext(CONNECTOR_NAME, self._prefix, self._database,
                                      msg.commit_ts, msg.xid, self._last_commit_lsn,
                                      tx_id, msg.final_lsn, block=POSTGRES_BLOCK)
        if self._metadata:
            out.append(TransactionBoundary("BEGIN", tx_id, msg.commit_ts, msg.final_lsn,
                                           topic_prefix=self._prefix))

    def _on_commit(self, msg: pgoutput.Commit, out: list[Record], now_us: int) -> None:
        if self._metadata:
            out.append(TransactionBoundary(
                "END", self._context.tx_id or "", msg.commit_ts, msg.commit_lsn,
                self._orders.total,
                tuple((str(t), cell[0]) for t, cell in self._orders.per_table.items()),
                topic_prefix=self._prefix,
            ))
        self.in_transaction = False
        # source.sequence's lastCommitLsn: Debezium's is the commit's end LSN, where the
        # server puts the Commit message (its XLogData position), not the commit
        # record's own LSN (seen in a capture of Debezium 3.6.3).
        self._last_commit_lsn = msg.end_lsn
        self.last_end_lsn = msg.end_lsn
        self.commits += 1

    def _on_other(self, msg: pgoutput.Message, lsn: int, out: list[Record],
                  now_us: int) -> None:
        if isinstance(msg, pgoutput.Relation):
            self._on_relation(msg)
        elif isinstance(msg, pgoutput.Type):
            pass  # type_info() reads names from the catalog, which also knows domains
        elif isinstance(msg, pgoutput.Truncate):
            if Op.TRUNCATE in self.skipped_operations:
                return
            for relation_id in msg.relation_ids:
                schema = self.schema_for(relation_id)
                if schema is not None:
                    out.append(self._event(Op.TRUNCATE, schema, None, None, lsn, now_us))
        elif isinstance(msg, pgoutput.LogicalMessage):
            out.append(self._message_event(msg, now_us))
        elif isinstance(msg, pgoutput.Origin):
            c = self._context
            self._context = SourceContext(c.connector, c.name, c.db, c.ts_us, c.txid,
                                          c.last_commit_lsn, c.tx_id, c.commit_lsn, msg.name,
                                          block=c.block)
        else:
            # Stream* messages only arrive when streaming was requested, which the
            # connector never does; getting one means the protocol state is confused.
            raise DecodeError(type(msg).__name__, 0,
                              "streamed transactions were not requested (protocol v1)")

    @property
    def orders(self) -> TransactionOrders:
        """The event counts of the open transaction (a new object at every Begin). For
        builders of events that bypass :meth:`process` (the fused path): counting in
        it keeps the orders right for both paths."""
        return self._orders

    def _event(self, op: Op, schema: TableSchema, before: WireTuple | None,
               after: WireTuple | None, lsn: int, now_us: int) -> ChangeEvent:
        orders = self._orders
        orders.total += 1
        cell = orders.cell(schema.table)
        cell[0] += 1
        return ChangeEvent(op, schema, before, after, self._context, lsn, orders.total,
                           cell[0], now_us)

    def _message_event(self, msg: pgoutput.LogicalMessage, now_us: int) -> ChangeEvent:
        if msg.transactional and self.in_transaction:
            total = self._orders.total = self._orders.total + 1
            # Debezium counts a transaction's messages as one data collection of their
            # own (confirmed by capture).
            cell = self._orders.cell(MESSAGES_COLLECTION)
            cell[0] += 1
            return ChangeEvent(Op.MESSAGE, None, None, None, self._context, msg.lsn,
                               total, cell[0], now_us, message_prefix=msg.prefix,
                               message_content=msg.content)
        context = SourceContext(CONNECTOR_NAME, self._prefix, self._database, now_us, None,
                                self._last_commit_lsn, block=POSTGRES_BLOCK)
        return ChangeEvent(Op.MESSAGE, None, None, None, context, msg.lsn, 0, 0, now_us,
                           message_prefix=msg.prefix, message_content=msg.content)


#: The data collection that transaction metadata counts logical decoding messages under:
#: Debezium's name for it (its ``toString()``, less the Java identity hash that Debezium
#: appends, ``…MessageId@6c82be78``, which changes from one run to the next).
MESSAGES_COLLECTION: Final = TableId("io.debezium.connector.postgresql",
                                     "LogicalDecodingMessageMonitor$LogicalDecodingMessageId")


class TransactionOrders:
    """How many events a transaction has had: in all (``total``) and per table (a
    one-element list per table, so that a hot loop can keep and bump it)."""

    __slots__ = ("per_table", "total")

    def __init__(self) -> None:
        self.total = 0
        self.per_table: dict[TableId, list[int]] = {}

    def cell(self, table: TableId) -> list[int]:
        """The count of *table*'s events, as a mutable one-element list."""
        cell = self.per_table.get(table)
        if cell is None:
            cell = self.per_table[table] = [0]
        return cell

