"""A PostgreSQL table's rows as Python values, to compare with a Delta target (the
demo's and tests' proof): columns the Spark type mapping carries as strings are read as
``::text``, exactly the text pgoutput sent."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from psycopg import sql

from tidemark.postgres_connection import connect as pg_connect

Row = tuple[Any, ...]


def table_rows(dsn: str, table: str, columns: Sequence[str],
               text_columns: Sequence[str] = ()) -> list[Row]:
    """*table*'s rows in *columns*, sorted by ``repr``."""
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
