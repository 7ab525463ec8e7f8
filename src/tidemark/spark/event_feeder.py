"""Change events into the Spark source's sinks: the junction every non-WAL source uses.

The sinks (:mod:`tidemark.spark.arrow_rows`) take what the pgoutput walker gives them:
a relation per table, then row changes with their positions. A source that has
:class:`~tidemark.event.ChangeEvent` s (a MariaDB binlog, a log table) hands them over
here and gets the same typed rows, envelopes, ``apply_changes`` and ``tidemark run``.
"""

from __future__ import annotations

from typing import Any

import msgspec

from tidemark.event import UNAVAILABLE, ChangeEvent, Op, TableSchema
from tidemark.spark.decode import Txn


class FedColumn(msgspec.Struct, frozen=True, gc=False):
    """A column of a :class:`FedRelation`."""

    name: str
    is_key: bool


class FedRelation(msgspec.Struct, frozen=True, gc=False):
    """A table schema as the sinks know a table
    (:class:`~tidemark.spark.arrow_rows.SinkRelation`)."""

    relation_id: int
    namespace: str
    name: str
    columns: tuple[FedColumn, ...]


class EventFeeder:
    """Hands change events to a stream sink as the PostgreSQL walker would: a relation
    per table schema, then one row change at a time. *unchanged_columns*: events may
    hold :data:`~tidemark.event.UNAVAILABLE` values (columns a change left as they
    were), which the sink records so that ``apply_changes`` keeps the target's."""

    def __init__(self, sink: Any, *, unchanged_columns: bool = False) -> None:
        self.sink = sink
        self._relations: dict[int, tuple[TableSchema, int]] = {}
        self._unchanged = unchanged_columns

    def add(self, event: ChangeEvent, lsn: int, seq: int) -> None:
        """*event* at position *lsn*, *seq* within its transaction."""
        schema = event.schema
        assert schema is not None
        entry = self._relations.get(id(schema))
        context = event.context
        if entry is None or entry[0] is not schema:
            relation_id = len(self._relations) + 1
            entry = self._relations[id(schema)] = (schema, relation_id)
            key = set(schema.key_indexes)
            # With the position it commits at: a layout older than the query's schema
            # is told apart from one the table gained since.
            self.sink.relation(FedRelation(
                relation_id, schema.table.schema, schema.table.table,
                tuple(FedColumn(c.name, i in key) for i, c in enumerate(schema.columns))),
                context.commit_lsn or lsn)
        txn = Txn(context.commit_lsn if context.commit_lsn is not None else lsn,
                  context.ts_us, 0)
        op = event.op.value
        if event.op is Op.DELETE:
            values = event.raw_before
            if self._unchanged and values is not None:
                # A delete is applied by its key; the other columns carry nothing.
                values = tuple(None if v is UNAVAILABLE else v for v in values)
        elif event.op is Op.TRUNCATE:
            values = None
        else:
            values = event.raw_after
        self.sink.add(entry[1], op, values, lsn, seq, txn,
                      self._unchanged and event.op is Op.UPDATE,
                      event.raw_before if event.op is Op.UPDATE else None)
