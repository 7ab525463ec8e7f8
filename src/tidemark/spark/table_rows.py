"""One table's change rows in its typed shape (:mod:`tidemark.spark.change_schemas`),
built into Arrow record batches from what a read plan gives a sink: encoded row blocks
decoded vectorized, or rows one by one (:class:`tidemark.source.read_plan.ChangeSink`).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from typing import Any, Final

import numpy as np
import pyarrow as pa
from pyspark.sql.types import StructType

from tidemark.event import UNAVAILABLE, TableId, WireTuple
from tidemark.source.read_plan import (
    ROW_SEQ,
    TRUNCATE_SEQ,
    ChangeTable,
    Commit,
    EncodedRows,
)
from tidemark.spark import column_history
from tidemark.spark.change_schemas import META_NAMES, SchemaChangedError, arrow_schema
from tidemark.spark.options import DEFAULT_ARROW_BATCH_BYTES, OnSchemaChange
from tidemark.spark.type_mapping import Converter, converter

log = logging.getLogger(__name__)


@functools.cache
def _op_names() -> pa.Array:
    # Not at import: pyarrow's first pa.array() imports pandas (0.3 s), which Spark's
    # driver-side source process would pay at every query start for nothing.
    return pa.array(["c", "u", "d"], pa.string())


#: A delete's index in :func:`_op_names`.
_DELETE: Final = 2


def _meta_arrays(schema: pa.Schema, ops: pa.Array, lsns: Any, seqs: Any, commit_lsns: Any,
                 commit_ts: Any, xids: Any, unavailable: list[tuple[int, list[str]]]
                 ) -> list[pa.Array]:
    """The change columns of *n* rows (integer columns as lists or numpy arrays);
    *unavailable* lists ``(row, column names)`` for the few rows that have any."""
    n = len(ops)
    if unavailable:
        counts = np.zeros(n, np.int32)
        names: list[str] = []
        for row, row_names in sorted(unavailable):
            counts[row] = len(row_names)
            names.extend(row_names)
        offsets = np.zeros(n + 1, np.int32)
        np.cumsum(counts, out=offsets[1:])
    else:
        offsets, names = np.zeros(n + 1, np.int32), []
    return [
        ops,
        pa.array(lsns, pa.int64()),
        pa.array(commit_lsns, pa.int64()),
        pa.array(seqs, pa.int64()),
        pa.array(commit_ts, pa.int64()).cast(schema.field("_commit_ts").type),
        pa.array(xids, pa.int64()),
        pa.ListArray.from_arrays(pa.array(offsets), pa.array(names, pa.string()),
                                 type=schema.field("_unavailable").type),
    ]


def _snapshot_meta(schema: pa.Schema, op: str, n: int, at: int, seq: int,
                   taken_us: int) -> list[pa.Array]:
    """The change columns of *n* snapshot rows: all at one position, transaction 0."""
    same = np.full(n, at, np.int64)
    ops = pa.array([op], pa.string()).take(pa.array(np.zeros(n, np.int32)))
    return _meta_arrays(schema, ops, same, np.full(n, seq, np.int64), same,
                        np.full(n, taken_us, np.int64), np.zeros(n, np.int64), [])


class MetaColumns:
    """The change columns of rows decoded one by one, as lists."""

    __slots__ = ("commit_lsns", "commit_ts", "lsns", "ops", "seqs", "unavailable", "xids")

    def __init__(self) -> None:
        self.ops: list[str] = []
        self.lsns: list[int] = []
        self.seqs: list[int] = []
        self.commit_lsns: list[int] = []
        self.commit_ts: list[int] = []
        self.xids: list[int] = []
        # (row index, names) for the few rows with unavailable columns.
        self.unavailable: list[tuple[int, list[str]]] = []

    def append(self, op: str, lsn: int, seq: int, txn: Commit) -> None:
        self.ops.append(op)
        self.lsns.append(lsn)
        self.seqs.append(seq)
        self.commit_lsns.append(txn.commit_lsn)
        self.commit_ts.append(txn.commit_ts_us)
        self.xids.append(txn.xid)

    def arrays(self, schema: pa.Schema) -> list[pa.Array]:
        return _meta_arrays(schema, pa.array(self.ops, pa.string()), self.lsns, self.seqs,
                            self.commit_lsns, self.commit_ts, self.xids, self.unavailable)


def _with_absent(unavailable: list[tuple[int, list[str]]], absent: list[str],
                 upserts: np.ndarray[Any, Any]) -> list[tuple[int, list[str]]]:
    """*unavailable* (one entry per row at most) with the *absent* columns added to
    every row that *upserts* marks (a delete carries nothing to keep)."""
    by_row = dict(unavailable)
    return [(row, [*by_row.get(row, ()), *absent])
            for row in np.flatnonzero(upserts).tolist()]


#: Rows decoded one by one are sized by sampling one in this many (``len`` of every
#: value of every row would cost more than the rest of the bookkeeping).
_SIZE_SAMPLE: Final = 32


def _row_bytes(values: WireTuple) -> int:
    """Roughly the Arrow bytes of one row of *values* (text and bytes by length)."""
    return sum(len(v) + 4 if isinstance(v, str | bytes) else 8 for v in values)


def rows_per_slice(rows: int, nbytes: int, max_rows: int, max_bytes: int) -> int:
    """Rows per slice of *rows* rows of *nbytes* bytes so that a slice holds at most
    *max_rows* rows and about *max_bytes* bytes (one row at least)."""
    if nbytes <= max_bytes:
        return max_rows
    return max(1, min(max_rows, rows * max_bytes // nbytes))


def _split_toast(values: WireTuple, names: Sequence[str]) -> tuple[WireTuple, list[str]]:
    missing = [names[i] for i, v in enumerate(values) if v is UNAVAILABLE]
    return tuple(None if v is UNAVAILABLE else v for v in values), missing


class TableRows:
    """One table's pending rows in its typed shape, built into record batches of at most
    *batch_rows* rows and about *batch_bytes* bytes.

    Blocks of encoded rows (:meth:`rows`) are decoded on arrival, vectorized; rows
    decoded one by one (:meth:`add`: key changes, rows with an old tuple, truncates)
    wait as values until :meth:`flush`, which then puts everything back in commit order.
    """

    def __init__(self, table: TableId, schema: StructType, on_schema_change: OnSchemaChange,
                 batch_rows: int, batch_bytes: int = DEFAULT_ARROW_BATCH_BYTES) -> None:
        self.table = table
        self.schema = schema
        self.pa_schema = arrow_schema(schema)
        self.batch_rows = batch_rows
        self.batch_bytes = batch_bytes
        self.columns = [f.name for f in schema.fields if f.name not in META_NAMES]
        self.converters: list[Converter] = [
            converter(f.dataType, self.pa_schema.field(f.name).type)
            for f in schema.fields if f.name not in META_NAMES
        ]
        self.on_schema_change = on_schema_change
        self.layout = column_history.TableLayout.from_metadata(schema.fields[0].metadata) \
            if self.columns else None
        self.relation_id: int | None = None
        self.positions: list[int] = []  # per schema column: index in the relation, or -1
        self.relation_names: tuple[str, ...] = ()
        # Columns of the schema the relation lacks: the table gained them after the
        # change was made, so the change does not know their value (the row holds what
        # the source gives rows older than the column, not NULL).
        self.absent: list[str] = []
        self.built: list[pa.RecordBatch] = []  # in commit order unless self.mixed
        self.built_rows = 0
        self.built_bytes = 0
        self.mixed = False
        self.values: list[WireTuple | None] = []
        self.values_bytes = 0  # estimated from a sample (see _SIZE_SAMPLE)
        self.meta = MetaColumns()
        self.ready: list[pa.RecordBatch] = []

    def __len__(self) -> int:
        return self.built_rows + len(self.values)

    def full(self) -> bool:
        """Whether the pending rows make a whole batch, by rows or by bytes."""
        return (len(self) >= self.batch_rows
                or self.built_bytes + self.values_bytes >= self.batch_bytes)

    def relation(self, rel: ChangeTable, at: int = 0) -> None:
        """The table's (new) column layout, seen in a transaction committing at *at*
        (0: unknown); rows pending in the old one are built first."""
        names = self._current_names(rel, at)
        known = set(self.columns)
        new = [n for n in names if n and n not in known]
        if new and self.on_schema_change is OnSchemaChange.FAIL:
            raise SchemaChangedError(
                f"table {self.table} gained column(s) {', '.join(new)} after this streaming "
                "query fixed its schema: restart the query (from the same checkpoint) to "
                "pick them up; the batch is read again with the new schema, nothing is lost "
                "(or set the option onSchemaChange=drop_new_columns, in pipeline.toml "
                'onSchemaChange = "drop_new_columns" under [source], to ignore new columns)'
            )
        positions = [names.index(c) if c in names else -1 for c in self.columns]
        if self.values and (positions != self.positions or names != self.relation_names):
            self._build_values()
        self.relation_id = rel.relation_id
        self.positions = positions
        self.relation_names = names
        self.absent = [c for c, p in zip(self.columns, positions, strict=True) if p < 0]

    def _current_names(self, rel: ChangeTable, at: int) -> tuple[str, ...]:
        """Today's names of *rel*'s columns (:data:`column_history.DROPPED` for one
        dropped since): its own, unless it is a layout older than the schema."""
        names = tuple(c.name for c in rel.columns)
        layout = self.layout
        if layout is None or not 0 < at < layout.read_at:
            return names  # the schema's layout or a later one: names are current
        if layout.attrs is None and set(names) <= set(self.columns):
            return names  # no column numbers, and nothing to match
        found = column_history.match(layout, rel.relation_id, names,
                                     [getattr(c, "type_oid", 0) for c in rel.columns])
        if not isinstance(found, column_history.Unmatched):
            if found != names:
                log.info("table %s: changes made before the query started name its "
                         "columns as they were then: %s", self.table,
                         column_history.describe(found, names))
            return found
        old = [n for n in names if n not in set(self.columns)] or [
            n for n, now in zip(names, self.columns, strict=False) if n != now]
        if self.on_schema_change is OnSchemaChange.FAIL:
            raise SchemaChangedError(
                f"table {self.table}: changes made before this query read its columns "
                f"carry column(s) {', '.join(old) or ', '.join(names)} that cannot be "
                f"told apart among its columns now ({found.reason}), so restarting does "
                "not help; to go on, set onSchemaChange = \"drop_new_columns\" under "
                "[source] (those changes then lose the values of "
                f"{', '.join(old) or 'those columns'}) and reload the table afterwards "
                f"(tidemark signal execute-snapshot {self.table}, or a new checkpoint with "
                'snapshot = "initial")')
        log.warning("table %s: changes made before the query started carry column(s) %s "
                    "that cannot be told apart among its columns now (%s): their values "
                    "are dropped (onSchemaChange = drop_new_columns); reload the table to "
                    "have them", self.table, ", ".join(old) or ", ".join(names), found.reason)
        return names

    def rows(self, block: EncodedRows) -> None:
        """Encoded row changes of this table (see :class:`EncodedRows`)."""
        decoded = block.decode(len(self.relation_names))
        if decoded is None:
            # One by one: exact errors for malformed messages, and correct rows for
            # anything unusual that is still valid.
            for i in range(len(block)):
                op, values, lsn, seq, txn = block.row(i)
                self.add(op, values, lsn, seq, txn, op == "u")
            return
        n = len(block)
        names = self.relation_names
        known = set(self.columns)
        unavailable = [(row, [names[c] for c in columns if names[c] in known])
                       for row, columns in decoded.unchanged]
        op_indexes = block.op_indexes()
        if self.absent:
            unavailable = _with_absent(unavailable, self.absent, op_indexes != _DELETE)
        texts: list[Any] = [decoded.arrays[p] if p >= 0 else pa.nulls(n, pa.string())
                            for p in self.positions]
        ops = _op_names().take(pa.array(op_indexes))
        meta = _meta_arrays(self.pa_schema, ops, block.lsns, block.seqs, block.commit_lsns,
                            block.commit_ts, block.xids, unavailable)
        # Rows waiting as values may come before these.
        self._append(self._batch(texts, meta), mixed=bool(self.values))

    def add(self, op: str, values: WireTuple | None, lsn: int, seq: int, txn: Commit,
            may_have_toast: bool) -> None:
        """One decoded row change (*values* None for a truncate)."""
        missing: list[str] = []
        if may_have_toast and values is not None and UNAVAILABLE in values:
            values, toasted = _split_toast(values, self.relation_names)
            missing = [n for n in toasted if n in self.columns]
        if self.absent and values is not None and op != "d":
            missing += self.absent
        if missing:
            self.meta.unavailable.append((len(self.values), missing))
        if values is not None and not len(self.values) % _SIZE_SAMPLE:
            self.values_bytes += _SIZE_SAMPLE * _row_bytes(values)
        self.values.append(values)
        self.meta.append(op, lsn, seq, txn)

    def snapshot(self, texts: pa.Table, at: int, taken_us: int, truncate_first: bool) -> None:
        """A snapshot chunk's rows (string columns named as the table's) as reads
        positioned at *at*; with *truncate_first*, a truncate at ``(at, 0)`` first."""
        if truncate_first:
            blank = [pa.nulls(1, pa.string()) for _ in self.columns]
            self._append(self._batch(blank, _snapshot_meta(self.pa_schema, "t", 1, at,
                                                            TRUNCATE_SEQ, taken_us)),
                         mixed=bool(self.values))
        if texts.num_rows:
            columns = [texts.column(c).combine_chunks() for c in self.columns]
            self._append(self._batch(columns, _snapshot_meta(
                self.pa_schema, "r", texts.num_rows, at, ROW_SEQ, taken_us)),
                mixed=bool(self.values))

    def take(self) -> list[pa.RecordBatch]:
        ready, self.ready = self.ready, []
        return ready

    def flush(self) -> None:
        """Build every pending row into record batches (appended to ``ready``)."""
        if self.values:
            self._build_values()
        built, mixed = self.built, self.mixed
        self.built, self.built_rows, self.built_bytes, self.mixed = [], 0, 0, False
        if mixed:
            # Commit order again: a batch stays sorted as the server sent it.
            table = pa.Table.from_batches(built).sort_by(
                [("_commit_lsn", "ascending"), ("_seq", "ascending")]).combine_chunks()
            del built
            self.ready.extend(table.to_batches(self._slice_rows(table.num_rows, table.nbytes)))
            return
        for batch in built:
            step = self._slice_rows(batch.num_rows, batch.nbytes)
            self.ready.extend(batch.slice(i, step) for i in range(0, batch.num_rows, step))

    def _slice_rows(self, rows: int, nbytes: int) -> int:
        return rows_per_slice(rows, nbytes, self.batch_rows, self.batch_bytes)

    def _append(self, batch: pa.RecordBatch, *, mixed: bool) -> None:
        self.built.append(batch)
        self.built_rows += batch.num_rows
        self.built_bytes += batch.nbytes
        self.mixed = self.mixed or mixed

    def _build_values(self) -> None:
        rows, meta = self.values, self.meta
        self.values, self.meta, self.values_bytes = [], MetaColumns(), 0
        n = len(rows)
        width = len(self.relation_names)
        blank: WireTuple = (None,) * width
        full = [blank if r is None else r for r in rows]
        by_position = list(zip(*full, strict=True)) if full else []
        nulls: list[str | None] = [None] * n
        texts: list[Any] = [by_position[p] if p >= 0 and width else nulls
                            for p in self.positions]
        # Blocks built before these rows may hold later rows of the same chunk.
        self._append(self._batch(texts, meta.arrays(self.pa_schema)), mixed=bool(self.built))

    def _batch(self, texts: list[Any], meta: list[pa.Array]) -> pa.RecordBatch:
        arrays = [convert(column) for column, convert in zip(texts, self.converters,
                                                              strict=True)]
        arrays.extend(meta)
        return pa.RecordBatch.from_arrays(arrays, schema=self.pa_schema)
