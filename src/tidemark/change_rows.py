"""The change-row contract: what every source's change rows carry besides the table's
own columns, whoever makes them (the engine's Arrow converter, the Spark source, the
Debezium JSON reader) and whoever reads them (:func:`tidemark.lake.apply_changes`).

========================  ===================================================================
``_op``                   ``c`` insert, ``u`` update, ``d`` delete (row = the before image, at
                          least the key), ``r`` snapshot read (an upsert), ``t`` truncate (all
                          table columns null)
``_lsn``                  int64: the change's own position in the source's log
``_commit_lsn``           int64: its transaction's commit position
``_seq``                  int64: 1-based order of the change within its transaction
``_commit_ts``            timestamp[us, tz=UTC]: its transaction's commit time
``_txid``                 int64: its transaction id (0 where the source has none)
``_unavailable``          list<string>: columns whose value the change did not carry (an
                          unchanged TOASTed value, a column a log-table update left alone,
                          a column the table gained after the change was made): the
                          column holds null there, meaning "unchanged", not NULL
========================  ===================================================================

One nullability: ``_op`` is never null; the positions, time and id may be null where a
producer has none (the engine's Arrow rows of a snapshot have no commit position). The
Spark source fills every column (its fields are :data:`CHANGE_FIELDS` made non-null).

**Positions** are int64s that order one source's changes; each source encodes its own,
and ``apply_changes`` compares them only within one source:

===============================  ==============================  ==========================
source                           ``_lsn``                        ``_commit_lsn``
===============================  ==============================  ==========================
PostgreSQL (pgoutput)            the change's LSN                its commit's LSN
MariaDB (binlog)                 ``file number << 32 | pos``     the same of the commit
log tables, engine and capture   ``cdc$time``                    ``cdc$time``
log tables, Spark source         ``cdc$time``                    the batch's position key
===============================  ==============================  ==========================

``_commit_lsn`` grows from one Spark micro-batch to the next for every source, which is
what the high-water mark of ``apply_changes`` needs; log tables have no transactions, so
their Spark rows take the batch end's key (a late commit lands in a later batch, above
the mark) and ``_seq`` = ``cdc$time``, which orders one key's changes.
"""

from __future__ import annotations

from typing import Final

import pyarrow as pa

OP: Final = "_op"
LSN: Final = "_lsn"
COMMIT_LSN: Final = "_commit_lsn"
SEQ: Final = "_seq"
COMMIT_TS: Final = "_commit_ts"
TXID: Final = "_txid"
UNAVAILABLE: Final = "_unavailable"

#: The change columns and their Arrow types, in the contract's order.
CHANGE_FIELDS: Final[tuple[pa.Field, ...]] = (
    pa.field(OP, pa.string(), nullable=False),
    pa.field(LSN, pa.int64()),
    pa.field(COMMIT_LSN, pa.int64()),
    pa.field(SEQ, pa.int64()),
    pa.field(COMMIT_TS, pa.timestamp("us", tz="UTC")),
    pa.field(TXID, pa.int64()),
    pa.field(UNAVAILABLE, pa.list_(pa.string())),
)
CHANGE_COLUMNS: Final = tuple(f.name for f in CHANGE_FIELDS)
