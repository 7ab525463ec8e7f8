"""The stream reader: offsets, admission control, partitions, reading and committing.

Where each method runs (pyspark 4.3): ``initialOffset``, ``latestOffset``,
``partitions``, ``commit`` and ``prepareForTriggerAvailableNow`` in one long-lived
Python process on the driver, which may keep a connection; ``read`` on executors, in
other processes, on a pickled copy of a reader that never ran any other method — so
``read`` opens its own connection and uses nothing but the options, the schema and the
partition.

Design (see :mod:`tidemark.spark.offsets` for the offset rule):

* ``latestOffset`` returns the server's flush position (peeks decode only that far), or,
  under ``maxChangesPerTrigger``, the end of the last whole transaction that fits, found
  by a server-side scan that returns one row per transaction and is cached for the
  following batches.
* ``partitions(start, end)`` cuts the range into up to ``numPartitions`` WAL slices. Each
  ``read`` peeks its own temporary copy of the slot fast-forwarded to its slice, so the
  server-side decoding and the Python decoding of one batch both run in parallel.
* ``commit(end)`` is the only place the slot moves (``pg_replication_slot_advance``):
  Spark calls it after the batch is committed to the checkpoint, so a batch Spark may
  still replay is never released.
"""

from __future__ import annotations

import contextlib
import gc
import logging
from collections.abc import Iterator, Sequence
from typing import Any, Final

import psycopg
import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from tidemark import faults
from tidemark.source.postgres.pgoutput import lsn_to_str
from tidemark.spark import wal
from tidemark.spark.arrow_rows import (
    EnvelopeSink,
    PackedEnvelopeSink,
    StructEnvelopeSink,
    TypedSink,
    envelope_table_schemas,
)
from tidemark.spark.decode import TransactionWalker
from tidemark.spark.offsets import (
    TxnIndex,
    end_for_limit,
    from_offset,
    split_range,
    to_offset,
)
from tidemark.spark.options import RowFormat, SourceOptions

log = logging.getLogger(__name__)

#: Messages one admission-control scan may decode before it stops (whole transactions).
_MIN_SCAN_ROWS: Final = 200_000

#: WAL below which a batch is not cut into more partitions: each partition costs a
#: connection, a slot copy and its fast-forward, more than decoding a few MB in
#: parallel saves (the empty or small batches of a running pipeline).
MIN_SLICE_BYTES: Final = 4 << 20


class WalSlice(InputPartition):
    """One partition: the transactions committing in ``[lo, hi)``, as plain integers."""

    def __init__(self, index: int, lo: int, hi: int) -> None:
        super().__init__((index, lo, hi))
        self.index = index
        self.lo = lo
        self.hi = hi

    def __repr__(self) -> str:
        return f"WalSlice({self.index}, {lsn_to_str(self.lo)}, {lsn_to_str(self.hi)})"


class TidemarkStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of whole PostgreSQL transactions from one logical slot."""

    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema
        self._conn: psycopg.Connection[Any] | None = None
        self._index = TxnIndex()
        self._target: int | None = None  # Trigger.AvailableNow's end, once prepared
        self._commits = 0  # commit() calls so far, for tidemark.faults

    def __getstate__(self) -> dict[str, Any]:
        # The driver's connection must not travel (nor fail pickling).
        state = dict(self.__dict__)
        state["_conn"] = None
        return state

    # -- driver side -------------------------------------------------------------------
    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = wal.connect(self.options.dsn, purpose="driver",
                                     server_timeout_s=self.options.server_timeout_ms / 1000)
        return self._conn

    def initialOffset(self) -> dict[str, str]:  # noqa: N802 - pyspark API name
        """A new query starts where the slot is, creating the slot if missing."""
        position = wal.ensure_slot(self._connection(), self.options.slot)
        log.info("slot %s starts at %s", self.options.slot, lsn_to_str(position))
        return to_offset(position)

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802 - pyspark API name
        limit = self.options.max_changes_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802 - pyspark API name
        """Trigger.AvailableNow: read what is flushed now, then stop."""
        self._target = wal.flush_lsn(self._connection())
        log.info("AvailableNow: reading up to %s", lsn_to_str(self._target))

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, str]:  # noqa: N802 - pyspark API name
        """The end of the next batch: everything flushed, or whole transactions up to
        ``maxChangesPerTrigger`` changes."""
        start_lsn = from_offset(start)
        available = self._available()
        if available <= start_lsn:
            return dict(start)
        if isinstance(limit, ReadMaxRows):
            return to_offset(self._end_for_limit(start_lsn, available, limit.max_rows))
        # Everything flushed. When only other tables wrote WAL the batch is empty, and
        # committing it still lets the slot release that WAL.
        return to_offset(available)

    def reportLatestOffset(self) -> dict[str, str]:  # noqa: N802 - pyspark API name
        return to_offset(self._available())

    def _available(self) -> int:
        flushed = wal.flush_lsn(self._connection())
        return flushed if self._target is None else min(flushed, self._target)

    def _end_for_limit(self, start: int, available: int, max_changes: int) -> int:
        if self._index.covers(start):
            planned = self._index.plan(start, max_changes)
            if planned is not None:
                return planned
        conn = self._connection()
        budget = max(_MIN_SCAN_ROWS, 2 * max_changes)
        with wal.slot_copy_at(conn, self.options.slot, start) as copy:
            txns, truncated = wal.scan(conn, copy, self.options.publication, available, budget)
        # A truncated scan knows every commit up to its last transaction only.
        known_until = txns[-1].commit_lsn + 1 if truncated and txns else available
        self._index = TxnIndex(start, known_until, txns)
        end = end_for_limit(txns, start, max_changes)
        log.debug("scan from %s: %d transactions, batch ends at %s", lsn_to_str(start),
                  len(txns), lsn_to_str(end if end is not None else known_until))
        return end if end is not None else known_until

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[WalSlice]:
        """Up to ``numPartitions`` equal WAL slices of the batch, each at least
        :data:`MIN_SLICE_BYTES` (one slice for a small batch)."""
        first, last = from_offset(start), from_offset(end)
        parts = min(self.options.num_partitions, max(1, (last - first) // MIN_SLICE_BYTES))
        slices = split_range(first, last, parts)
        return [WalSlice(i, lo, hi) for i, (lo, hi) in enumerate(slices)]

    def commit(self, end: dict[str, Any]) -> None:
        """Spark has committed every batch up to *end*: release the WAL before it."""
        lsn = from_offset(end)
        faults.crash_point("before_advance", self._commits)
        self._commits += 1
        wal.advance_slot(self._connection(), self.options.slot, lsn)
        log.info("slot %s advanced to %s", self.options.slot, lsn_to_str(lsn))

    def stop(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # -- executor side -----------------------------------------------------------------
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Arrow batches of the transactions committing in the partition's slice."""
        assert isinstance(partition, WalSlice)
        return read_slice(self.options, self.schema, partition.lo, partition.hi)


def read_slice(options: SourceOptions, schema: StructType, lo: int,
               hi: int) -> Iterator[pa.RecordBatch]:
    """Decode the transactions committing in ``[lo, hi)`` into record batches of *schema*."""
    sink: TypedSink | StructEnvelopeSink | EnvelopeSink
    if options.table is not None:
        sink = TypedSink(options.table, schema, options.arrow_batch_rows,
                         options.on_schema_change)
    elif options.row_format is not RowFormat.JSON:
        kind = StructEnvelopeSink if options.row_format is RowFormat.STRUCT else \
            PackedEnvelopeSink
        sink = kind(schema, envelope_table_schemas(schema), options.arrow_batch_rows,
                    options.on_schema_change)
    else:
        sink = EnvelopeSink(options.tables, options.arrow_batch_rows)
    walker = TransactionWalker(lo, hi, sink)
    with _gc_paused(), wal.connect(options.dsn, purpose="reader",
                                   server_timeout_s=options.server_timeout_ms / 1000) as conn, \
            wal.slot_copy_at(conn, options.slot, lo) as copy:
        for chunk in wal.peek(conn, copy, options.publication, hi):
            walker.feed(chunk)
            # Hand finished batches on between chunks: memory stays bounded by the
            # batch size, not the partition's size.
            yield from sink.take()
    yield from sink.finish()
    log.debug("slice %s-%s: %d rows", lsn_to_str(lo), lsn_to_str(hi), walker.rows)


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """No cyclic garbage collection while decoding.

    Decoding allocates millions of short-lived, acyclic objects (freed by reference
    counting); in a Spark Python worker, whose heap holds pyspark, pandas and pyarrow,
    each full collection walks all of it. Pausing the collector cut decode time by a
    quarter to a third in measurements here.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
