"""A ``tidemark-repair``'s rows from PostgreSQL (:mod:`tidemark.source.repair`): the
listed keys' current rows, read as a snapshot chunk is (``COPY`` as CSV, the text the
types' output functions print, which is what pgoutput sends) with a key filter in place
of the chunk's key range, under the exported snapshot whose point the batch ends at
(:mod:`tidemark.source.postgres.repair_hold`)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from typing import Any

import psycopg
import pyarrow as pa
from psycopg import sql

from tidemark.event import TableId
from tidemark.postgres_connection import server_timeout
from tidemark.source.postgres import wal_reads as wal
from tidemark.source.postgres.chunked_snapshot import (
    _key_list,
    _row,
    copy_out,
    import_snapshot,
    parse_csv,
)
from tidemark.source.postgres.repair_hold import ExportedRepairRead
from tidemark.source.read_plan import ChangeSink, ReadOptions
from tidemark.source.repair import RepairRequest, emit_repair, key_text

log = logging.getLogger(__name__)


def read_keys_text(conn: psycopg.Connection[Any], request: RepairRequest,
                   columns: Sequence[str]) -> pa.Table:
    """The current rows of *request*'s keys, one string column per column of
    *columns* (null for NULL)."""
    table = TableId.parse(request.table)
    keys = sql.SQL(", ").join(_row([key_text(v) for v in key]) for key in request.keys)
    query = sql.SQL("COPY (SELECT {columns} FROM {table} WHERE ({key}) IN ({keys})) "
                    "TO STDOUT (FORMAT csv)").format(
        columns=sql.SQL(", ").join(sql.Identifier(c) for c in columns),
        table=sql.Identifier(table.schema, table.table),
        key=_key_list(request.key_columns), keys=keys)
    return parse_csv(copy_out(conn, query.as_bytes(conn), server_timeout(conn)), columns)


def read_repair(options: ReadOptions, part: ExportedRepairRead,
                sink: ChangeSink) -> Iterator[None]:
    """The change rows of the partition's repairs, read under its exported snapshot,
    into *sink*."""
    with wal.connect(options.dsn, purpose="repair",
                     server_timeout_s=options.server_timeout_ms / 1000) as conn:
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        try:
            import_snapshot(conn, part.export, "of a repair",
                            "the repair is read again under a new snapshot")
            read = [(request, read_keys_text(conn, request, sink.columns(request.table)))
                    for request in part.requests]
        except BaseException:
            with contextlib.suppress(psycopg.Error):
                conn.execute("COMMIT")
            raise
        conn.execute("COMMIT")
    for request, texts in read:
        columns = texts.column_names
        rows = list(zip(*(texts.column(c).to_pylist() for c in columns), strict=True))
        emit_repair(sink, request, columns, rows, part.commit_lsn)
        yield


def key_problem(conn: psycopg.Connection[Any], request: RepairRequest) -> str | None:
    """Why PostgreSQL cannot read a key of *request* (a value its key column's type
    does not take, such as ``1.0`` or ``"abc"`` for an integer key), or None. Asked on
    the driver when the signal is taken: a key the executors' read would fail on would
    otherwise fail every replay of the batch that holds it."""
    table = TableId.parse(request.table)
    types = dict(conn.execute(
        "SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
        "JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0 AND NOT a.attisdropped",
        (table.schema, table.table)).fetchall())
    for index, column in enumerate(request.key_columns):
        type_name = types.get(column)
        if type_name is None:
            return f"{request.table} has no column {column}"
        # The type as the catalog prints it is SQL (format_type quotes what needs it).
        cast = sql.SQL("SELECT CAST(x AS {}) FROM unnest(%s::text[]) AS u(x)").format(
            sql.SQL(type_name))
        for key in request.keys:
            try:
                with conn.transaction():
                    conn.execute(cast, ([key_text(key[index])],))
            except psycopg.DataError as err:
                named = dict(zip(request.key_columns, key, strict=True))
                first = str(err).splitlines()[0] if str(err) else type(err).__name__
                return (f"key {named} is not a value of {column} ({type_name}): {first}; "
                        f"give it as the text PostgreSQL reads as {type_name}")
    return None

