"""A ``tidemark-repair``'s rows from log tables' databases (:mod:`tidemark.source.repair`):
the listed keys' current rows, read and converted as
:meth:`~tidemark.source.logtable.database.LogDatabase.snapshot` reads a table's rows
(PostgreSQL: each column's output text; SQLite: each stored value's wire text), with a
key filter in place of the whole table."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from typing import Any

from tidemark.source.logtable.config import is_sqlite
from tidemark.source.logtable.database import LogTable
from tidemark.source.logtable.reader import open_database
from tidemark.source.read_plan import ChangeSink, ReadOptions
from tidemark.source.repair import RepairRead, RepairRequest, emit_repair, key_text
from tidemark.source.repair_signal import KeyValue

log = logging.getLogger(__name__)

Row = tuple[str | None, ...]


def key_columns(entry: LogTable) -> list[str]:
    """The key columns of a captured table, in key order."""
    return [entry.schema.columns[i].name for i in entry.schema.key_indexes]


def key_rows(dsn: str, entry: LogTable, request: RepairRequest) -> list[Row]:
    """The current rows of *request*'s keys in *entry*'s table (its columns in order),
    as the log tables' snapshot hands rows on."""
    if is_sqlite(dsn):
        return _sqlite_rows(dsn, entry, request.key_columns, request.keys)
    return _postgres_rows(dsn, entry, request.key_columns, request.keys)


def _postgres_rows(dsn: str, entry: LogTable, columns: Sequence[str],
                   keys: Sequence[Sequence[KeyValue]]) -> list[Row]:
    from psycopg import sql  # noqa: PLC0415

    from tidemark.postgres_connection import connect  # noqa: PLC0415
    from tidemark.source.logtable.postgres import _as_text  # noqa: PLC0415

    names = sql.SQL(", ").join(_as_text(c) for c in entry.schema.columns)
    key = sql.SQL(", ").join(sql.Identifier(c) for c in columns)
    # Literals of unknown type: the server reads them with the key columns' own types.
    wanted = sql.SQL(", ").join(
        sql.SQL("({})").format(sql.SQL(", ").join(sql.Literal(key_text(v)) for v in k))
        for k in keys)
    query = sql.SQL("SELECT {} FROM {} WHERE ({}) IN ({})").format(
        names, sql.Identifier(entry.table.schema, entry.table.table), key, wanted)
    with contextlib.closing(connect(dsn, application_name="tidemark-logtable-repair")) \
            as conn:
        conn.autocommit = True
        return [tuple(row) for row in conn.execute(query).fetchall()]


def _sqlite_rows(dsn: str, entry: LogTable, columns: Sequence[str],
                 keys: Sequence[Sequence[KeyValue]]) -> list[Row]:
    from tidemark.source.logtable import sqlite_install as install  # noqa: PLC0415
    from tidemark.source.logtable.sqlite import connect, snapshot_row  # noqa: PLC0415

    q = install.quote
    # Each key compared column by column: a comparison with a column applies its
    # affinity to the value (5 finds '5' stored in a TEXT key, '5' finds 5).
    one = "(" + " AND ".join(f"{q(c)} = ?" for c in columns) + ")"
    names = ", ".join(q(c.name) for c in entry.schema.columns)
    params: list[Any] = [int(v) if isinstance(v, bool) else v for k in keys for v in k]
    with contextlib.closing(connect(dsn)) as conn:
        rows = conn.execute(f"SELECT {names} FROM {q(entry.table.table)} WHERE "
                            f"{' OR '.join([one] * len(keys))}", params).fetchall()
    return [snapshot_row(entry, row) for row in rows]


def read_repair(options: ReadOptions, part: RepairRead, sink: ChangeSink) -> Iterator[None]:
    """The change rows of the partition's repairs, into *sink*."""
    with contextlib.closing(open_database(options.dsn)) as db:
        entries = {str(e.table): e for e in db.tables([r.table for r in part.requests])}
    for request in part.requests:
        entry = entries[request.table]
        rows = key_rows(options.dsn, entry, request)
        emit_repair(sink, request, entry.schema.column_names, rows, part.commit_lsn,
                    seq=part.seq)
        yield
