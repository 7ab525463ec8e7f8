"""Compare a Delta target with its source table (the demo's and tests' proof).

Values are compared as Python objects after one normalisation: columns that the Spark
type mapping carries as strings (json, jsonb, uuid, interval, …) are read from
PostgreSQL as ``::text``, which is exactly the text pgoutput sent; from MariaDB as
``CAST(… AS CHAR)``, and its ``timestamp`` columns in UTC.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from tidemark.lake.delta_read import live_rows
from tidemark.source.registry import kind_of

Row = tuple[Any, ...]


def delta_rows(path: str, columns: Sequence[str], *, scd2: bool = False) -> list[Row]:
    """The target's rows (SCD2: the current versions, ``__END_AT`` null), sorted."""
    table = live_rows(DeltaTable(path)).to_table()
    if scd2:
        table = table.filter(pc.is_null(table.column("__END_AT")))
    return sorted(zip(*(table.column(c).to_pylist() for c in columns), strict=True),
                  key=repr) if table.num_rows else []


def source_rows(dsn: str, table: str, columns: Sequence[str],
                text_columns: Sequence[str] = (), utc_columns: Sequence[str] = ()) -> list[Row]:
    """The source table's rows, sorted like :func:`delta_rows`."""
    return kind_of(dsn).table_rows(dsn, table, columns, text_columns, utc_columns)


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
