"""A MariaDB table's rows as Python values, to compare with a Delta target (the demo's
and tests' proof): string-typed columns read as ``CAST(… AS CHAR)``, ``timestamp``
columns in UTC."""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Sequence
from typing import Any

from tidemark.source.mariadb import client

Row = tuple[Any, ...]


def table_rows(dsn: str, table: str, columns: Sequence[str],
               text_columns: Sequence[str], utc_columns: Sequence[str]) -> list[Row]:
    """*table* (``database.table``)'s rows in *columns*, sorted by ``repr``."""
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
