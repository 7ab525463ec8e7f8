"""The change-row contract as :func:`apply_changes` reads it: the names and fields of
:mod:`tidemark.change_rows` (where the contract and each source's positions are
described), the default ``sequence_by``, and the SCD type 2 and working columns.

A batch of change rows is a ``pyarrow.Table`` holding the captured table's own columns
with their own types, plus the change columns. A batch from a transactional source
holds whole transactions only; a primary-key change is a ``d`` of the old key then a
``c`` of the new key.
"""

from __future__ import annotations

from typing import Final

import pyarrow as pa

from tidemark.change_rows import (
    CHANGE_FIELDS,
    COMMIT_LSN,
    COMMIT_TS,
    LSN,
    OP,
    SEQ,
    TXID,
    UNAVAILABLE,
)

__all__ = ["COMMIT_LSN", "COMMIT_TS", "LSN", "OP", "SEQ", "TXID", "UNAVAILABLE"]

#: The change-metadata columns and their Arrow types, in the contract's order.
METADATA_FIELDS: Final = CHANGE_FIELDS
METADATA_COLUMNS: Final = frozenset(f.name for f in METADATA_FIELDS)

#: Default ``sequence_by``: the transaction's commit LSN, then the order within it.
DEFAULT_SEQUENCE: Final = (COMMIT_LSN, SEQ)

#: SCD type 2 validity columns (Databricks' names).
START_AT: Final = "__START_AT"
END_AT: Final = "__END_AT"

#: Prefix of the working columns the writer adds to a merge source; never stored.
WORK_PREFIX: Final = "__tm_"


def change_rows_schema(table_schema: pa.Schema) -> pa.Schema:
    """The schema of change rows for a table with *table_schema*."""
    return pa.schema([*table_schema, *METADATA_FIELDS])
