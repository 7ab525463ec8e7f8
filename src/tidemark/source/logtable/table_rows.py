"""A SQLite table's rows as Python values, to compare with a Delta target (the demo's
and tests' proof); log tables on PostgreSQL are read as PostgreSQL's."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from tidemark.source.logtable.sqlite import connect
from tidemark.source.logtable.sqlite_install import quote

Row = tuple[Any, ...]


def sqlite_rows(dsn: str, table: str, columns: Sequence[str]) -> list[Row]:
    """*table*'s rows in *columns* (its schema, ``main``, is left out), sorted by
    ``repr``."""
    name = table.split(".", 1)[-1]
    with contextlib.closing(connect(dsn)) as conn:
        rows = conn.execute(f"SELECT {', '.join(quote(c) for c in columns)} FROM "
                            f"{quote(name)}").fetchall()
    return sorted((tuple(r) for r in rows), key=repr)
