"""Change events into a read plan's sink: the junction of sources that decode their log
into :class:`~tidemark.event.ChangeEvent` s (a MariaDB binlog, log tables).

Each table schema becomes a :class:`~tidemark.source.read_plan.Layout` the first time
one of its events arrives, then each event one change row, with the positions the
source gives.
"""

from __future__ import annotations

from tidemark.event import UNAVAILABLE, ChangeEvent, Op, TableSchema
from tidemark.source.read_plan import ChangeSink, Commit, Layout, LayoutColumn


class ChangeFeed:
    """Hands change events to a sink: a layout per table schema, then one row change at a
    time. *unchanged_columns*: events may hold :data:`~tidemark.event.UNAVAILABLE` values
    (columns a change left as they were), which the sink records so that
    ``apply_changes`` keeps the target's."""

    def __init__(self, sink: ChangeSink, *, unchanged_columns: bool = False) -> None:
        self.sink = sink
        self._layouts: dict[int, tuple[TableSchema, int]] = {}
        self._unchanged = unchanged_columns

    def add(self, event: ChangeEvent, lsn: int, seq: int) -> None:
        """*event* at position *lsn*, *seq* within its transaction."""
        schema = event.schema
        assert schema is not None
        entry = self._layouts.get(id(schema))
        context = event.context
        if entry is None or entry[0] is not schema:
            layout_id = len(self._layouts) + 1
            entry = self._layouts[id(schema)] = (schema, layout_id)
            key = set(schema.key_indexes)
            # With the position it commits at: a layout older than the query's schema
            # is told apart from one the table gained since.
            self.sink.relation(Layout(
                layout_id, schema.table.schema, schema.table.table,
                tuple(LayoutColumn(c.name, i in key) for i, c in enumerate(schema.columns))),
                context.commit_lsn or lsn)
        commit = Commit(context.commit_lsn if context.commit_lsn is not None else lsn,
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
        self.sink.add(entry[1], op, values, lsn, seq, commit,
                      self._unchanged and event.op is Op.UPDATE,
                      event.raw_before if event.op is Op.UPDATE else None)
