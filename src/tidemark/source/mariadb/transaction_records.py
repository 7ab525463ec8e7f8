"""The change events of one committed MariaDB transaction, as
:class:`~tidemark.source.mariadb.change_builder.ChangeBuilder` hands them on: each row
with its own source context (``source.row`` differs per row), and with transaction
metadata the transaction's END record."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Final

from tidemark.event import ChangeEvent, Record, SourceContext, TableId, TransactionBoundary
from tidemark.source.mariadb.source_fields import MARIADB_BLOCK, MariaDbSourceFields

CONNECTOR: Final = "mariadb"
#: What a completed transaction becomes: change events (and BEGIN/END records); with
#: JSON lines, the lines of its rows events and the change events of other rows.
Made = list[Record | str]


class TransactionRecords:
    """The change events of one committed transaction, made chunk by chunk: the order
    in the transaction and the per-table counts run on from one chunk to the next."""

    __slots__ = ("commit_key", "gtid_text", "metadata", "name", "order", "per_table",
                 "server_id", "thread", "ts_us", "tx_id")

    def __init__(self, name: str, gtid_text: str | None, server_id: int, thread: int | None,
                 tx_id: str, ts_us: int, commit_key: int, metadata: bool) -> None:
        self.name = name
        self.tx_id = tx_id
        self.gtid_text = gtid_text
        self.server_id, self.thread = server_id, thread
        self.ts_us = ts_us
        self.commit_key = commit_key
        self.metadata = metadata
        self.order = 0
        self.per_table: dict[TableId, int] = {}

    def context(self, table: TableId, file: str, pos: int, row: int) -> SourceContext:
        """The source context of row *row* of the rows event at *pos* of *table*."""
        return SourceContext(
            CONNECTOR, self.name, table.schema, self.ts_us, None, None, self.tx_id,
            self.commit_key, None, MariaDbSourceFields(self.server_id, self.gtid_text, file,
                                                       pos, row, self.thread), MARIADB_BLOCK)

    def records(self, rows: Sequence[Any]) -> Made:
        """The change events of *rows* (one entry per change, none a rows event's)."""
        now_us = time.time_ns() // 1000
        records: Made = []
        per_table = self.per_table
        server_id, thread, name, gtid_text = self.server_id, self.thread, self.name, \
            self.gtid_text
        tx_id, ts_us, commit_key = self.tx_id, self.ts_us, self.commit_key
        for order, (schema, op, before, after, key, file, pos, row) in enumerate(
                rows, self.order + 1):
            table = schema.table
            count = per_table.get(table, 0) + 1
            per_table[table] = count
            context = SourceContext(
                CONNECTOR, name, table.schema, ts_us, None, None, tx_id, commit_key, None,
                MariaDbSourceFields(server_id, gtid_text, file, pos, row, thread), MARIADB_BLOCK)
            records.append(ChangeEvent(op, schema, before, after, context, key, order, count,
                                       now_us))
        self.order += len(rows)
        return records

    def end(self) -> TransactionBoundary:
        return TransactionBoundary(
            "END", self.tx_id, self.ts_us, self.commit_key, self.order,
            tuple((str(t), n) for t, n in self.per_table.items()), self.name)
