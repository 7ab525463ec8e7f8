"""Reading a Delta target's live rows in tests, deletion vectors honoured (delta-rs's
``to_pyarrow_table()`` / ``to_pyarrow_dataset()`` refuse a merge-on-read target)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from tidemark.lake.delta_read import LiveRows, live_rows


def live(table: DeltaTable | str | Path, version: int | None = None) -> LiveRows:
    """The live rows of *table* (a DeltaTable, or its path opened at *version*)."""
    if not isinstance(table, DeltaTable):
        table = DeltaTable(str(table), version=version)
    return live_rows(table)


def live_table(table: DeltaTable | str | Path, columns: list[str] | None = None,
               filter: pc.Expression | None = None, *,
               version: int | None = None) -> pa.Table:
    """The live rows of *table* as one Arrow table (what ``to_pyarrow_table()`` gave)."""
    return live(table, version).to_table(columns=columns, filter=filter)


def live_count(table: DeltaTable | str | Path) -> int:
    """The number of live rows of *table*."""
    return live(table).count_rows()
