"""Building change rows and reading Delta tables back, for the lake tests."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable

from delta_rows import live_table
from tidemark.lake.change_rows import change_rows_schema

TABLE = pa.schema([pa.field("id", pa.int64()), pa.field("name", pa.string()),
                   pa.field("body", pa.string())])
_TS = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def change(op: str, commit_lsn: int, seq: int = 1, unavailable: tuple[str, ...] = (),
           **values: Any) -> dict[str, Any]:
    """One change row; the transaction id and commit time follow the commit LSN."""
    return {**values, "_op": op, "_lsn": commit_lsn * 100 + seq, "_commit_lsn": commit_lsn,
            "_seq": seq, "_commit_ts": _TS + dt.timedelta(seconds=commit_lsn),
            "_txid": commit_lsn, "_unavailable": list(unavailable)}


def rows(*changes: dict[str, Any], table: pa.Schema = TABLE) -> pa.Table:
    return pa.Table.from_pylist(list(changes), schema=change_rows_schema(table))


def read(path: Path | str, *columns: str, sort: tuple[str, ...] = ("id",)) -> list[dict[str, Any]]:
    """The table's rows (only *columns* if given), sorted."""
    table = live_table(DeltaTable(str(path)))
    if columns:
        table = table.select(list(columns))
    return table.sort_by([(c, "ascending") for c in sort]).to_pylist()
