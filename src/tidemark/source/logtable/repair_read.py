"""A ``tidemark-repair``'s rows from log tables' databases (:mod:`tidemark.source.repair`):
the listed keys' rows, read and converted as
:meth:`~tidemark.source.logtable.database.LogDatabase.snapshot` reads a table's rows
(PostgreSQL: each column's output text; SQLite: each stored value's wire text), with a
key filter in place of the whole table.

**At the batch's end, exactly.** The rows must be the state every change of the batch
leaves and none after: a row read later, on the executor, may hold a change committed
after the batch's end (an SCD2 version that starts too early, repeated when the change
itself arrives). So the driver reads them when it takes the repair, in one read view
(:meth:`~tidemark.source.logtable.database.LogDatabase.read_view`) whose position becomes
the end of every group in that batch (:func:`rows_at_end`), and the batch's repair
partition carries them (:class:`HeldRepairRead`). The rows live only in the driver that
read them: a batch replayed by a new driver has none, and the next batch takes the
repair again at its own end (:class:`~tidemark.source.logtable.read_plan.LogTableReadPlan`;
a repair applied twice is idempotent, one applied at a later end is exact there).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from tidemark.source.logtable.config import is_sqlite
from tidemark.source.logtable.database import LogDatabase, LogTable, Position
from tidemark.source.read_plan import ChangeSink
from tidemark.source.repair import RepairRead, RepairRequest, emit_repair, key_text
from tidemark.source.repair_keys import key_type_problem
from tidemark.source.repair_signal import KeyValue

log = logging.getLogger(__name__)

Row = tuple[str | None, ...]


def key_columns(entry: LogTable) -> list[str]:
    """The key columns of a captured table, in key order."""
    return [entry.schema.columns[i].name for i in entry.schema.key_indexes]


class HeldRepairRead(RepairRead):
    """A repair partition whose rows the driver read at the batch's end: per request,
    its table's column names and the rows found (values in that order)."""

    def __init__(self, index: int, requests: Sequence[RepairRequest], commit_lsn: int,
                 seq: int, names: Sequence[Sequence[str]],
                 rows: Sequence[Sequence[Row]]) -> None:
        super().__init__(index, requests, commit_lsn, seq)
        self.names = tuple(tuple(n) for n in names)
        self.rows = tuple(tuple(r) for r in rows)


def key_check(dsn: str, entries: Sequence[LogTable]
              ) -> Callable[[RepairRequest], str | None]:
    """Why the source cannot read a request's keys (a ``1.5`` or ``"abc"`` for an
    integer key), or None: checked when the driver takes a signal, as the rows are read
    then and a key the read (or the pipeline, for its ``d``) fails on would fail every
    retry. PostgreSQL also casts each key to its column's type."""
    types = {str(e.table): {c.name: c.logical for c in e.schema.columns} for e in entries}

    def check(request: RepairRequest) -> str | None:
        problem = key_type_problem(request, types.get(request.table, {}))
        if problem is not None or is_sqlite(dsn):
            return problem
        from tidemark.postgres_connection import connect  # noqa: PLC0415
        from tidemark.source.postgres.repair_read import key_problem  # noqa: PLC0415

        with contextlib.closing(connect(dsn, application_name="tidemark-logtable-repair")) \
                as conn:
            conn.autocommit = True
            return key_problem(conn, request)
    return check


def rows_at_end(db: LogDatabase, sqlite: bool, entries: Sequence[LogTable],
                requests: Sequence[RepairRequest]) -> tuple[Position, list[list[Row]]]:
    """A position for the end of the batch that takes *requests* and, read in the same
    view, each request's rows (*entries*: the requests' tables, in the same order). The
    position is above every earlier one (:meth:`LogDatabase.tick`), even when nothing
    was logged since the last batch: an SCD2 target takes a change at its current
    version's own position for one it has applied, and would skip the repair."""
    db.tick()
    with db.read_view() as (position, conn):
        rows = [(_sqlite_rows if sqlite else _postgres_rows)(
            conn, entry, request.key_columns, request.keys)
            for entry, request in zip(entries, requests, strict=True)]
    return position, rows


def _postgres_rows(conn: Any, entry: LogTable, columns: Sequence[str],
                   keys: Sequence[Sequence[KeyValue]]) -> list[Row]:
    from psycopg import sql  # noqa: PLC0415

    from tidemark.source.logtable.postgres_text import output_text  # noqa: PLC0415

    names = sql.SQL(", ").join(output_text(c) for c in entry.schema.columns)
    key = sql.SQL(", ").join(sql.Identifier(c) for c in columns)
    # Literals of unknown type: the server reads them with the key columns' own types.
    wanted = sql.SQL(", ").join(
        sql.SQL("({})").format(sql.SQL(", ").join(sql.Literal(key_text(v)) for v in k))
        for k in keys)
    query = sql.SQL("SELECT {} FROM {} WHERE ({}) IN ({})").format(
        names, sql.Identifier(entry.table.schema, entry.table.table), key, wanted)
    return [tuple(row) for row in conn.execute(query).fetchall()]


def _sqlite_rows(conn: Any, entry: LogTable, columns: Sequence[str],
                 keys: Sequence[Sequence[KeyValue]]) -> list[Row]:
    from tidemark.source.logtable import sqlite_install as install  # noqa: PLC0415
    from tidemark.source.logtable.sqlite import snapshot_row  # noqa: PLC0415

    q = install.quote
    # Each key compared column by column: a comparison with a column applies its
    # affinity to the value (5 finds '5' stored in a TEXT key, '5' finds 5).
    one = "(" + " AND ".join(f"{q(c)} = ?" for c in columns) + ")"
    names = ", ".join(q(c.name) for c in entry.schema.columns)
    params: list[Any] = [int(v) if isinstance(v, bool) else v for k in keys for v in k]
    rows = conn.execute(f"SELECT {names} FROM {q(entry.table.table)} WHERE "
                        f"{' OR '.join([one] * len(keys))}", params).fetchall()
    return [snapshot_row(entry, row) for row in rows]


def read_repair(part: HeldRepairRead, sink: ChangeSink) -> Iterator[None]:
    """The change rows of the partition's repairs, into *sink*."""
    for request, names, rows in zip(part.requests, part.names, part.rows, strict=True):
        emit_repair(sink, request, names, rows, part.commit_lsn, seq=part.seq)
        yield
