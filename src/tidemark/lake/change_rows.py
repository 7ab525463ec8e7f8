"""The change-row contract between a change source and :func:`apply_changes`.

A batch of change rows is a ``pyarrow.Table`` holding the captured table's own columns
with their own types, plus these change-metadata columns:

========================  ===================================================================
``_op``                   ``c`` insert, ``u`` update, ``d`` delete (row = the before image, at
                          least the key), ``r`` snapshot read (an upsert), ``t`` truncate (all
                          table columns null)
``_lsn``                  int64: the change's own position in the source's log
``_commit_lsn``           int64: its transaction's commit position
``_seq``                  int64: 1-based order of the change within its transaction
``_commit_ts``            timestamp[us, tz=UTC]: its transaction's commit time
``_txid``                 int64: its transaction id (0 where the source has none)
``_unavailable``          list<string>: columns whose value was not sent because it is an
                          unchanged TOASTed value (the column holds null there, meaning
                          "unchanged", not NULL)
========================  ===================================================================

A batch holds whole transactions only; a primary-key change is a ``d`` of the old key then
a ``c`` of the new key in the same transaction.

Positions are int64s that grow in commit order on one server, each source encoding its
own: PostgreSQL's LSN; MariaDB's binlog file number and byte position (``number << 32 |
pos``). ``apply_changes`` orders by them only within one source, so compare them only
within one source.
"""

from __future__ import annotations

from typing import Final

import pyarrow as pa

from tidemark.serde.arrow_changes import METADATA_FIELDS as ARROW_METADATA_FIELDS

OP: Final = "_op"
LSN: Final = "_lsn"
COMMIT_LSN: Final = "_commit_lsn"
SEQ: Final = "_seq"
COMMIT_TS: Final = "_commit_ts"
TXID: Final = "_txid"
UNAVAILABLE: Final = "_unavailable"

#: The change-metadata columns and their Arrow types, in the contract's order (one
#: definition, shared with the engine's Arrow converter).
METADATA_FIELDS: Final = ARROW_METADATA_FIELDS
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
