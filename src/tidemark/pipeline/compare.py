"""Compare a Delta target with its source table (the demo's and tests' proof).

Values are compared as Python objects after one normalisation: columns that the Spark
type mapping carries as strings (json, jsonb, uuid, interval, …) are read from
PostgreSQL as ``::text``, which is exactly the text pgoutput sent; from MariaDB as
``CAST(… AS CHAR)``, and its ``timestamp`` columns in UTC.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from psycopg import sql

from tidemark.postgres_connection import connect as pg_connect
from tidemark.source.registry import source_kind

Row = tuple[Any, ...]


def delta_rows(path: str, columns: Sequence[str], *, scd2: bool = False) -> list[Row]:
    """The target's rows (SCD2: the current versions, ``__END_AT`` null), sorted."""
    table = DeltaTable(path).to_pyarrow_table()
    if scd2:
        table = table.filter(pc.is_null(table.column("__END_AT")))
    return sorted(zip(*(table.column(c).to_pylist() for c in columns), strict=True),
                  key=repr) if table.num_rows else []


def source_rows(dsn: str, table: str, columns: Sequence[str],
                text_columns: Sequence[str] = (), utc_columns: Sequence[str] = ()) -> list[Row]:
    """The source table's rows, sorted like :func:`delta_rows`."""
    if source_kind(dsn) == "mariadb":
        return _mariadb_rows(dsn, table, columns, text_columns, utc_columns)
    if source_kind(dsn) == "logtable":  # a sqlite: DSN
        return _sqlite_rows(dsn, table, columns)
    schema, name = table.split(".", 1)
    selected = sql.SQL(", ").join(
        sql.SQL("{}::text").format(sql.Identifier(c)) if c in text_columns
        else sql.Identifier(c) for c in columns)
    query = sql.SQL("SELECT {} FROM {}.{}").format(selected, sql.Identifier(schema),
                                                   sql.Identifier(name))
    with contextlib.closing(pg_connect(dsn, application_name="tidemark compare")) as conn, \
            conn.cursor() as cur:
        cur.execute(query)
        return sorted((tuple(r) for r in cur.fetchall()), key=repr)


def _sqlite_rows(dsn: str, table: str, columns: Sequence[str]) -> list[Row]:
    from tidemark.source.logtable.sqlite import connect  # noqa: PLC0415
    from tidemark.source.logtable.sqlite_install import quote  # noqa: PLC0415

    name = table.split(".", 1)[-1]
    with contextlib.closing(connect(dsn)) as conn:
        rows = conn.execute(f"SELECT {', '.join(quote(c) for c in columns)} FROM "
                            f"{quote(name)}").fetchall()
    return sorted((tuple(r) for r in rows), key=repr)


def _mariadb_rows(dsn: str, table: str, columns: Sequence[str],
                  text_columns: Sequence[str], utc_columns: Sequence[str]) -> list[Row]:
    from tidemark.source.mariadb import client  # noqa: PLC0415

    def quote(name: str) -> str:
        return "`" + name.replace("`", "``") + "`"

    database, name = table.split(".", 1)
    selected = ", ".join(f"CAST({quote(c)} AS CHAR)" if c in text_columns else quote(c)
                         for c in columns)
    utc = [i for i, c in enumerate(columns) if c in utc_columns]
    with contextlib.closing(client.connect(client.parse_url(dsn))) as conn, \
            conn.cursor() as cur:
        cur.execute("SET time_zone = '+00:00'")
        cur.execute(f"SELECT {selected} FROM {quote(database)}.{quote(name)}")
        rows = [list(r) for r in cur.fetchall()]
    for row in rows:
        for i in utc:
            if isinstance(row[i], dt.datetime):
                row[i] = row[i].replace(tzinfo=dt.UTC)
    return sorted((tuple(r) for r in rows), key=repr)


def utc_columns(path: str) -> list[str]:
    """Columns the target stores as UTC instants."""
    schema = pa.schema(DeltaTable(path).schema().to_arrow())
    return [f.name for f in schema if pa.types.is_timestamp(f.type) and f.type.tz]


def string_columns(path: str) -> list[str]:
    """Columns the target stores as strings (read as ``::text`` from the source)."""
    # deltalake returns an arro3 schema; pyarrow imports it through the C data interface.
    schema = pa.schema(DeltaTable(path).schema().to_arrow())
    return [f.name for f in schema if pa.types.is_string(f.type)
            or pa.types.is_large_string(f.type) or pa.types.is_string_view(f.type)]


def compare(dsn: str, table: str, path: str, columns: Sequence[str], *,
            scd2: bool = False) -> tuple[list[Row], list[Row]]:
    """``(source rows, target rows)`` of *columns*, ready to compare with ``==``."""
    text = string_columns(path)
    return (source_rows(dsn, table, columns, text, utc_columns(path)),
            delta_rows(path, columns, scd2=scd2))
