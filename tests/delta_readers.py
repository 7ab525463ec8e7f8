"""A Delta table's live rows as three independent readers see them: delta-rs (DataFusion,
``DeltaTable.scan``), Polars (``read_delta``) and DuckDB's delta extension (built on
delta-kernel-rs, loaded from the ``duckdb-extension-delta`` package, never downloaded).
Merge-on-read tests check after every batch that all three read the same rows."""

from __future__ import annotations

import datetime
import decimal
import functools
import math
from pathlib import Path
from typing import Any

import duckdb
import duckdb_extension_delta
import polars
import pyarrow as pa
from deltalake import DeltaTable


@functools.cache
def _delta_extension() -> str:
    found = sorted(Path(duckdb_extension_delta.__file__).parent.rglob("delta.duckdb_extension"))
    assert found, "duckdb-extension-delta ships no delta.duckdb_extension file"
    return str(found[0])


def duckdb_rows(path: Path | str) -> pa.Table:
    """The live rows by DuckDB's delta extension."""
    con = duckdb.connect(config={"allow_unsigned_extensions": "true"})
    try:
        con.execute(f"LOAD '{_delta_extension()}'")
        return con.execute("SELECT * FROM delta_scan(?)", [str(path)]).to_arrow_table()
    finally:
        con.close()


def deltalake_rows(path: Path | str) -> pa.Table:
    """The live rows by delta-rs (DataFusion: reads deletion vectors)."""
    return pa.table(DeltaTable(str(path)).scan().read_all())


def polars_rows(path: Path | str) -> pa.Table:
    """The live rows by Polars."""
    return polars.read_delta(str(path)).to_arrow()


def _canonical(value: Any) -> Any:
    if isinstance(value, datetime.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(datetime.UTC).replace(tzinfo=None)
        return ("ts", value.isoformat())
    if isinstance(value, decimal.Decimal):
        return ("dec", str(value))
    if isinstance(value, float) and math.isnan(value):
        return ("nan",)
    if isinstance(value, list):
        return tuple(_canonical(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _canonical(v)) for k, v in value.items()))
    if isinstance(value, bytes | bytearray | memoryview):
        return ("b", bytes(value).hex())
    return value


def canonical_rows(table: pa.Table) -> list[tuple[Any, ...]]:
    """*table*'s rows as comparable tuples (columns by name), sorted."""
    names = sorted(table.column_names)
    rows = table.select(names).to_pylist()
    return sorted((tuple(_canonical(r[n]) for n in names) for r in rows), key=repr)


def check_readers_agree(path: Path | str) -> list[tuple[Any, ...]]:
    """The table's rows, after checking that the three readers return the same rows."""
    by_delta = canonical_rows(deltalake_rows(path))
    by_polars = canonical_rows(polars_rows(path))
    by_duckdb = canonical_rows(duckdb_rows(path))
    assert by_polars == by_delta, f"Polars and delta-rs read different rows of {path}"
    assert by_duckdb == by_delta, f"DuckDB's delta extension and delta-rs read different " \
                                  f"rows of {path}"
    return by_delta
