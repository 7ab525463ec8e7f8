"""Row changes -> Arrow record batches in the shape of the stream's Spark schema.

Two shapes (the column contract ``apply_changes`` consumes — keep names and types):

**Typed table** (one captured table): the table's own columns with their Spark types
(:mod:`tidemark.spark.type_mapping`), then

=================  ==============  ====================================================
``_op``            string          ``c`` insert, ``u`` update, ``d`` delete, ``t`` truncate
``_lsn``           bigint          LSN of the change
``_commit_lsn``    bigint          commit LSN of its transaction (the batch assignment)
``_seq``           bigint          1-based order of the row in its transaction
``_commit_ts``     timestamp       commit time of the transaction
``_txid``          bigint          PostgreSQL transaction id
``_unavailable``   array<string>   columns whose value is an unchanged TOASTed value the
                                   server did not send, or that the table gained after
                                   the change (an insert or update made before
                                   ``ADD COLUMN``): null there means "unchanged",
                                   not NULL. Empty (never null) when there are none.
=================  ==============  ====================================================

For ``d`` the columns hold the old row as the server sent it (at least the key); for
``t`` all table columns are null.

**Envelope** (many tables in one stream), in one of two row formats:

* ``json`` (the default): ``table`` (``schema.table``), the same ``_op`` … ``_txid``,
  then ``key``, ``before``, ``after`` as JSON objects of column name -> PostgreSQL's
  text of the value (or null), and ``_unavailable``. An unavailable column is absent
  from ``after``. Readable by anything; costs a JSON encoding per row here and a parse
  per row in :func:`tidemark.spark.table_changes`.
* ``struct``: ``table``, ``_op`` … ``_txid``, then **one struct column per captured
  table**, named ``schema.table``, holding the row in that table's typed shape (its own
  columns and types; null in the rows of other tables), and ``_unavailable``. No text
  round trip: :func:`tidemark.spark.table_changes` just selects the struct's fields.
  Each Arrow batch holds rows of one table, so the other tables' columns cost nothing.

* ``arrow``: ``table``, ``rows``, ``data``: each Spark row carries a whole Arrow IPC
  stream (zstd-compressed) of up to ``arrowBatchRows`` rows of one table in its typed shape. For
  consumers that collect each micro-batch to the driver (``tidemark run``): Spark moves
  a few large binary values instead of converting every row to its row format and
  back, which was most of Spark's CPU time per change. Unpack with
  :func:`typed_rows`.

Rows of one table keep commit order (commit LSN, then ``_seq``) within an Arrow batch.
"""

from __future__ import annotations

import functools
import json
import logging
import struct
from collections.abc import Iterator, Sequence
from typing import Any, Final, Protocol

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from tidemark.change_rows import CHANGE_FIELDS
from tidemark.errors import TerminalError
from tidemark.event import UNAVAILABLE, TableId, WireTuple
from tidemark.source.postgres import pgoutput
from tidemark.spark import column_history
from tidemark.spark.decode import OP_OF_KIND, RowBlock, Txn
from tidemark.spark.options import DEFAULT_ARROW_BATCH_BYTES, OnSchemaChange
from tidemark.spark.snapshot_plan import ROW_SEQ, TRUNCATE_SEQ
from tidemark.spark.tuple_columns import TupleLayoutError, decode_tuples
from tidemark.spark.type_mapping import Converter, converter

log = logging.getLogger(__name__)


class SinkColumn(Protocol):
    """A column as the sinks know it: its name, and whether it is part of the key."""

    @property
    def name(self) -> str: ...

    @property
    def is_key(self) -> bool: ...


class SinkRelation(Protocol):
    """A table as the sinks know it (pgoutput's Relation is one; other sources pass
    :class:`~tidemark.spark.event_feeder.FedRelation`): its id in the stream, schema,
    name and columns. The sinks never read a column's type: that comes from the
    stream's Spark schema."""

    @property
    def relation_id(self) -> int: ...

    @property
    def namespace(self) -> str: ...

    @property
    def name(self) -> str: ...

    @property
    def columns(self) -> Sequence[SinkColumn]: ...

#: Spark's types of the contract's Arrow types (:mod:`tidemark.change_rows`).
_SPARK_OF_ARROW: Final = {
    pa.string(): StringType(), pa.int64(): LongType(),
    pa.timestamp("us", tz="UTC"): TimestampType(),
    pa.list_(pa.string()): ArrayType(StringType(), False),
}
#: The change columns every typed table gets after its own columns: the contract's,
#: all filled (non-null) by the Spark source.
META_FIELDS: Final = tuple(StructField(f.name, _SPARK_OF_ARROW[f.type], False)
                           for f in CHANGE_FIELDS)
META_NAMES: Final = frozenset(f.name for f in META_FIELDS)

#: The envelope stream's schema.
ENVELOPE_SCHEMA: Final = StructType([
    StructField("table", StringType(), False),
    *META_FIELDS[:6],
    StructField("key", StringType(), True),
    StructField("before", StringType(), True),
    StructField("after", StringType(), True),
    META_FIELDS[6],
])


#: Metadata key on the envelope's ``after`` (``json``) or ``table`` (``struct``) field:
#: table name -> typed schema (JSON).
TABLE_SCHEMAS_KEY: Final = "tidemark.table_schemas"


def envelope_table_schemas(schema: StructType, *,
                           layouts: bool = False) -> dict[str, StructType]:
    """The typed schemas an envelope stream's schema carries, by ``schema.table``; with
    *layouts*, as the source's sinks need them (the column layouts the query read at
    start, which must not reach a target's schema)."""
    for carrier in ("after", "table"):
        if carrier in schema.fieldNames():
            raw = (schema[carrier].metadata or {}).get(TABLE_SCHEMAS_KEY)
            if isinstance(raw, dict):
                schemas = {name: StructType.fromJson(json.loads(text))
                           for name, text in raw.items()}
                return schemas if layouts else {
                    name: column_history.without_layout(s) for name, s in schemas.items()}
    raise ValueError("not a tidemark envelope stream (it carries no table schemas): use "
                     "tidemark.spark.read_changes")


def is_struct_envelope(schema: StructType) -> bool:
    """True for an envelope of the ``struct`` row format."""
    return "after" not in schema.fieldNames() and not is_packed_envelope(schema.fieldNames())


def is_packed_envelope(names: Sequence[str]) -> bool:
    """True for the column names of an envelope of the ``arrow`` row format."""
    return list(names) == [f.name for f in PACKED_SCHEMA.fields]


#: The envelope schema of the ``arrow`` row format.
PACKED_SCHEMA: Final = StructType([
    StructField("table", StringType(), False),
    StructField("rows", LongType(), False),
    StructField("data", BinaryType(), False),
])


def _unpacked(envelope: pa.Table, table: str, schema: StructType | None) -> pa.Table:
    mine = envelope.filter(pc.equal(envelope.column("table"), table))
    batches: list[pa.RecordBatch] = []
    for blob in mine.column("data").chunks:
        for i in range(len(blob)):
            # Zero copy: the batches keep referencing the collected buffer.
            with pa.ipc.open_stream(blob[i].as_buffer()) as stream:
                batches.extend(stream)
    if batches:
        return pa.Table.from_batches(batches)
    if schema is None:
        raise ValueError(f"no rows of {table}: pass its typed schema to type the empty table")
    return arrow_schema(schema).empty_table()


def typed_rows(envelope: pa.Table, table: str, schema: StructType | None = None) -> pa.Table:
    """The rows of *table* (``schema.table``) of a collected ``struct`` or ``arrow``
    envelope, in the table's typed shape (what :func:`tidemark.spark.table_changes`
    gives in Spark). An ``arrow`` envelope needs the table's typed *schema* (from
    :func:`envelope_table_schemas`) to type an empty result."""
    if is_packed_envelope(envelope.column_names):
        return _unpacked(envelope, table, schema)
    if table not in envelope.column_names:
        raise ValueError(f"table {table} is not in this envelope")
    rows = envelope.filter(pc.equal(envelope.column("table"), table))
    struct = rows.column(table).combine_chunks()
    fields = list(struct.type) if rows.num_rows else list(envelope.schema.field(table).type)
    columns = struct.flatten() if rows.num_rows else [pa.array([], f.type) for f in fields]
    names = [f.name for f in fields] + [f.name for f in META_FIELDS]
    return pa.Table.from_arrays([*columns, *(rows.column(f.name) for f in META_FIELDS)],
                                names=names)


def struct_envelope_schema(tables: dict[str, StructType]) -> StructType:
    """The envelope schema of the ``struct`` row format for typed *tables* (by
    ``schema.table``, each a :func:`typed_schema`)."""
    structs = [StructField(name, StructType([f for f in schema.fields
                                             if f.name not in META_NAMES]), True)
               for name, schema in tables.items()]
    return StructType([ENVELOPE_SCHEMA["table"], *META_FIELDS[:6], *structs, META_FIELDS[6]])


class SchemaChangedError(TerminalError):
    """A table's columns changed after the query fixed its schema."""


def typed_schema(columns: Sequence[StructField]) -> StructType:
    """A typed table's schema: its columns (all nullable: deletes carry only the key,
    truncates nothing) followed by :data:`META_FIELDS`."""
    clash = [c.name for c in columns if c.name in META_NAMES]
    if clash:
        raise SchemaChangedError(f"column(s) {clash} clash with tidemark's change columns")
    return StructType([StructField(c.name, c.dataType, True, c.metadata) for c in columns]
                      + list(META_FIELDS))


def arrow_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema pyspark requires batches of *schema* to have, exactly (but for
    the column layout the query read at start, which must not reach a target's schema:
    :func:`tidemark.spark.column_history.without_layout`)."""
    return to_arrow_schema(column_history.without_layout(schema), timezone="UTC")


@functools.cache
def _op_names() -> pa.Array:
    # Not at import: pyarrow's first pa.array() imports pandas (0.3 s), which Spark's
    # driver-side source process would pay at every query start for nothing.
    return pa.array(["c", "u", "d"], pa.string())


_OP_INDEX: Final = np.zeros(256, np.int8)
_OP_INDEX[[0x49, 0x55, 0x44]] = [0, 1, 2]  # Insert, Update, Delete -> position in _op_names()


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


class _Meta:
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

    def append(self, op: str, lsn: int, seq: int, txn: Txn) -> None:
        self.ops.append(op)
        self.lsns.append(lsn)
        self.seqs.append(seq)
        self.commit_lsns.append(txn.commit_lsn)
        self.commit_ts.append(txn.commit_ts_us)
        self.xids.append(txn.xid)

    def arrays(self, schema: pa.Schema) -> list[pa.Array]:
        return _meta_arrays(schema, pa.array(self.ops, pa.string()), self.lsns, self.seqs,
                            self.commit_lsns, self.commit_ts, self.xids, self.unavailable)


_DELETE: Final = 0x44  # pgoutput's Delete message kind


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
        self.meta = _Meta()
        self.ready: list[pa.RecordBatch] = []

    def __len__(self) -> int:
        return self.built_rows + len(self.values)

    def full(self) -> bool:
        """Whether the pending rows make a whole batch, by rows or by bytes."""
        return (len(self) >= self.batch_rows
                or self.built_bytes + self.values_bytes >= self.batch_bytes)

    def relation(self, rel: SinkRelation, at: int = 0) -> None:
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

    def _current_names(self, rel: SinkRelation, at: int) -> tuple[str, ...]:
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

    def rows(self, block: RowBlock) -> None:
        """Encoded row changes of this table (see :class:`RowBlock`)."""
        try:
            decoded = decode_tuples(block.buf, block.starts, block.lengths,
                                    len(self.relation_names))
        except TupleLayoutError:
            # One by one: exact errors for malformed messages, and correct rows for
            # anything unusual that is still valid.
            for i in range(len(block)):
                op = OP_OF_KIND[int(block.kinds[i])]
                self.add(op, pgoutput.parse_row(block.message(i)), int(block.lsns[i]),
                         int(block.seqs[i]), block.txn(i), op == "u")
            return
        n = len(block)
        names = self.relation_names
        known = set(self.columns)
        unavailable = [(row, [names[c] for c in columns if names[c] in known])
                       for row, columns in decoded.unchanged]
        if self.absent:
            unavailable = _with_absent(unavailable, self.absent, block.kinds != _DELETE)
        texts: list[Any] = [decoded.arrays[p] if p >= 0 else pa.nulls(n, pa.string())
                            for p in self.positions]
        ops = _op_names().take(pa.array(_OP_INDEX[block.kinds]))
        meta = _meta_arrays(self.pa_schema, ops, block.lsns, block.seqs, block.commit_lsns,
                            block.commit_ts, block.xids, unavailable)
        # Rows waiting as values may come before these.
        self._append(self._batch(texts, meta), mixed=bool(self.values))

    def add(self, op: str, values: WireTuple | None, lsn: int, seq: int, txn: Txn,
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
        self.values, self.meta, self.values_bytes = [], _Meta(), 0
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


class RowBatches(Protocol):
    """What the reader needs of a sink: the finished record batches."""

    def take(self) -> Iterator[pa.RecordBatch]:
        """The batches finished so far."""

    def finish(self) -> Iterator[pa.RecordBatch]:
        """Every remaining batch (the end of the partition)."""


class TypedSink:
    """Builds record batches of one table's typed shape (see the module docstring)."""

    def __init__(self, table: TableId, schema: StructType, batch_rows: int,
                 on_schema_change: OnSchemaChange,
                 batch_bytes: int = DEFAULT_ARROW_BATCH_BYTES) -> None:
        self.table_rows = TableRows(table, schema, on_schema_change, batch_rows, batch_bytes)
        self.pa_schema = self.table_rows.pa_schema
        self.batch_rows = batch_rows

    def relation(self, rel: SinkRelation, at: int = 0) -> None:
        table = self.table_rows.table
        if (rel.namespace, rel.name) == (table.schema, table.table):
            self.table_rows.relation(rel, at)

    def rows(self, relation_id: int, block: RowBlock) -> None:
        table_rows = self.table_rows
        if relation_id == table_rows.relation_id:
            table_rows.rows(block)

    def add(self, relation_id: int, op: str, values: WireTuple | None, lsn: int, seq: int,
            txn: Txn, may_have_toast: bool, old: WireTuple | None) -> None:
        table_rows = self.table_rows
        if relation_id == table_rows.relation_id:
            table_rows.add(op, values, lsn, seq, txn, may_have_toast)

    def snapshot(self, table: str, texts: pa.Table, at: int, taken_us: int,
                 truncate_first: bool, keys: Sequence[str]) -> None:
        """A snapshot chunk's rows (see :meth:`TableRows.snapshot`)."""
        if table == str(self.table_rows.table):
            self.table_rows.snapshot(texts, at, taken_us, truncate_first)

    def take(self) -> Iterator[pa.RecordBatch]:
        """The batches of *batch_rows* rows (or *batch_bytes* bytes) and more, between
        chunks: a chunk's rows arrive in blocks and one by one out of commit order, so
        batches are built only once the chunk is complete."""
        if self.table_rows.full():
            self.table_rows.flush()
        yield from self.table_rows.take()

    def finish(self) -> Iterator[pa.RecordBatch]:
        """Every remaining batch."""
        if len(self.table_rows):
            self.table_rows.flush()
        yield from self.table_rows.take()


class StructEnvelopeSink:
    """Builds envelope batches of the ``struct`` row format (see the module docstring)."""

    def __init__(self, schema: StructType, tables: dict[str, StructType], batch_rows: int,
                 on_schema_change: OnSchemaChange,
                 batch_bytes: int = DEFAULT_ARROW_BATCH_BYTES) -> None:
        self.pa_schema = arrow_schema(schema)
        self.batch_rows = batch_rows
        self.batch_bytes = batch_bytes
        self.by_name = {name: TableRows(TableId.parse(name), typed, on_schema_change,
                                        batch_rows, batch_bytes)
                        for name, typed in tables.items()}
        self.by_id: dict[int, TableRows] = {}
        self.ready: list[pa.RecordBatch] = []

    def relation(self, rel: SinkRelation, at: int = 0) -> None:
        table_rows = self.by_name.get(f"{rel.namespace}.{rel.name}")
        if table_rows is None:
            self.by_id.pop(rel.relation_id, None)
            return
        table_rows.relation(rel, at)
        self.by_id[rel.relation_id] = table_rows

    def rows(self, relation_id: int, block: RowBlock) -> None:
        table_rows = self.by_id.get(relation_id)
        if table_rows is not None:
            table_rows.rows(block)

    def add(self, relation_id: int, op: str, values: WireTuple | None, lsn: int, seq: int,
            txn: Txn, may_have_toast: bool, old: WireTuple | None) -> None:
        table_rows = self.by_id.get(relation_id)
        if table_rows is not None:
            table_rows.add(op, values, lsn, seq, txn, may_have_toast)

    def snapshot(self, table: str, texts: pa.Table, at: int, taken_us: int,
                 truncate_first: bool, keys: Sequence[str]) -> None:
        """A snapshot chunk's rows (see :meth:`TableRows.snapshot`)."""
        table_rows = self.by_name.get(table)
        if table_rows is not None:
            table_rows.snapshot(texts, at, taken_us, truncate_first)

    def take(self) -> Iterator[pa.RecordBatch]:
        """The batches of tables with *batch_rows* rows (or *batch_bytes* bytes) and
        more (see :meth:`TypedSink.take`)."""
        for table_rows in self.by_name.values():
            if table_rows.full():
                table_rows.flush()
                self._collect(table_rows)
        ready, self.ready = self.ready, []
        yield from ready

    def finish(self) -> Iterator[pa.RecordBatch]:
        for table_rows in self.by_name.values():
            if len(table_rows):
                table_rows.flush()
            self._collect(table_rows)
        ready, self.ready = self.ready, []
        yield from ready

    def _collect(self, table_rows: TableRows) -> None:
        name = str(table_rows.table)
        for typed in table_rows.take():
            n = typed.num_rows
            arrays: list[pa.Array] = [pa.array([name] * n, pa.string())]
            arrays += [typed.column(m) for m in ("_op", "_lsn", "_commit_lsn", "_seq",
                                                 "_commit_ts", "_txid")]
            for field in self.pa_schema:
                if field.name == name:
                    data = typed.columns[:len(table_rows.columns)]
                    arrays.append(pa.StructArray.from_arrays(data, fields=list(field.type)))
                elif pa.types.is_struct(field.type):
                    arrays.append(pa.nulls(n, field.type))
            arrays.append(typed.column("_unavailable"))
            self.ready.append(pa.RecordBatch.from_arrays(arrays, schema=self.pa_schema))


#: Compressed blobs: Spark copies each blob several times on its way to the driver
#: (Python worker -> executor -> task result -> driver -> Python), at about 1 s per 60 MB
#: here, while zstd shrinks typical change rows 6-7x in a fraction of that.
_BLOB_OPTIONS: Final = pa.ipc.IpcWriteOptions(compression="zstd")


class PackedEnvelopeSink(StructEnvelopeSink):
    """Builds envelope batches of the ``arrow`` row format: one row per flush of a
    table, holding its batches as one Arrow IPC stream of at most *batch_rows* rows
    and about *batch_bytes* bytes before compression (a flush may make several rows)."""

    def _collect(self, table_rows: TableRows) -> None:
        group: list[pa.RecordBatch] = []
        rows = held = 0
        for batch in table_rows.take():
            if group and (held + batch.nbytes > self.batch_bytes
                          or rows + batch.num_rows > self.batch_rows):
                self._pack(table_rows, group)
                group, rows, held = [], 0, 0
            group.append(batch)
            rows += batch.num_rows
            held += batch.nbytes
        if group:
            self._pack(table_rows, group)

    def _pack(self, table_rows: TableRows, batches: list[pa.RecordBatch]) -> None:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table_rows.pa_schema, options=_BLOB_OPTIONS) as writer:
            for batch in batches:
                writer.write_batch(batch)
        data = sink.getvalue()
        blob = pa.Array.from_buffers(pa.binary(), 1, [
            None, pa.py_buffer(struct.pack("=ii", 0, data.size)), data])
        rows = sum(batch.num_rows for batch in batches)
        self.ready.append(pa.RecordBatch.from_arrays(
            [pa.array([str(table_rows.table)], pa.string()), pa.array([rows], pa.int64()),
             blob], schema=self.pa_schema))


#: Arrow bytes of a JSON envelope row besides its JSON (table name, change columns).
_META_BYTES: Final = 80


class EnvelopeSink:
    """Builds record batches of the ``json`` envelope shape for every captured table."""

    def __init__(self, tables: Sequence[TableId], batch_rows: int,
                 batch_bytes: int = DEFAULT_ARROW_BATCH_BYTES) -> None:
        self.wanted = {(t.schema, t.table) for t in tables}
        self.pa_schema = arrow_schema(ENVELOPE_SCHEMA)
        self.batch_rows = batch_rows
        self.batch_bytes = batch_bytes
        self.pending_bytes = 0
        self.relations: dict[int, tuple[str, tuple[str, ...], tuple[int, ...]]] = {}
        self.tables: list[str] = []
        self.keys: list[bytes | None] = []
        self.befores: list[bytes | None] = []
        self.afters: list[bytes | None] = []
        self.meta = _Meta()
        self.ready: list[pa.RecordBatch] = []
        self._encode = msgspec.json.Encoder().encode

    def relation(self, rel: SinkRelation, at: int = 0) -> None:
        if (rel.namespace, rel.name) not in self.wanted:
            self.relations.pop(rel.relation_id, None)
            return
        names = tuple(c.name for c in rel.columns)
        key = tuple(i for i, c in enumerate(rel.columns) if c.is_key)
        self.relations[rel.relation_id] = (f"{rel.namespace}.{rel.name}", names, key)

    def rows(self, relation_id: int, block: RowBlock) -> None:
        if relation_id in self.relations:
            for i in range(len(block)):
                op = OP_OF_KIND[int(block.kinds[i])]
                self.add(relation_id, op, pgoutput.parse_row(block.message(i)), int(block.lsns[i]),
                         int(block.seqs[i]), block.txn(i), op == "u", None)

    def add(self, relation_id: int, op: str, values: WireTuple | None, lsn: int, seq: int,
            txn: Txn, may_have_toast: bool, old: WireTuple | None) -> None:
        rel = self.relations.get(relation_id)
        if rel is None:
            return
        table, names, key = rel
        encode = self._encode
        if values is None:  # truncate
            key_json = before = after = None
        else:
            if may_have_toast and UNAVAILABLE in values:
                self.meta.unavailable.append(
                    (len(self.tables), [n for n, v in zip(names, values, strict=True)
                                        if v is UNAVAILABLE]))
                row = {n: v for n, v in zip(names, values, strict=True) if v is not UNAVAILABLE}
            else:
                row = dict(zip(names, values, strict=True))
            key_json = encode({names[i]: values[i] for i in key}) if key else None
            if op == "d":
                before, after = encode(row), None
            else:
                before = encode(dict(zip(names, old, strict=True))) if old is not None else None
                after = encode(row)
        self._append(table, key_json, before, after, op, lsn, seq, txn)

    def snapshot(self, table: str, texts: pa.Table, at: int, taken_us: int,
                 truncate_first: bool, keys: Sequence[str]) -> None:
        """A snapshot chunk's rows as reads (``after`` and ``key`` only)."""
        parsed = TableId.parse(table)
        if (parsed.schema, parsed.table) not in self.wanted:
            return
        txn = Txn(at, taken_us, 0)
        if truncate_first:
            self._append(table, None, None, None, "t", at, TRUNCATE_SEQ, txn)
        encode = self._encode
        for row in texts.to_pylist():
            self._append(table, encode({k: row[k] for k in keys}), None, encode(row), "r",
                         at, ROW_SEQ, txn)

    def _append(self, table: str, key: bytes | None, before: bytes | None,
                after: bytes | None, op: str, lsn: int, seq: int, txn: Txn) -> None:
        self.tables.append(table)
        self.keys.append(key)
        self.befores.append(before)
        self.afters.append(after)
        self.meta.append(op, lsn, seq, txn)
        self.pending_bytes += (len(key or b"") + len(before or b"") + len(after or b"")
                               + _META_BYTES)
        if len(self.tables) >= self.batch_rows or self.pending_bytes >= self.batch_bytes:
            self._flush()

    def take(self) -> Iterator[pa.RecordBatch]:
        ready, self.ready = self.ready, []
        yield from ready

    def finish(self) -> Iterator[pa.RecordBatch]:
        if self.tables:
            self._flush()
        yield from self.take()

    def _flush(self) -> None:
        meta = self.meta.arrays(self.pa_schema)
        arrays = [pa.array(self.tables, pa.string()), *meta[:6],
                  *(pa.array(col, pa.binary()).cast(pa.string())
                    for col in (self.keys, self.befores, self.afters)),
                  meta[6]]
        self.ready.append(pa.RecordBatch.from_arrays(arrays, schema=self.pa_schema))
        self.tables, self.keys, self.befores, self.afters = [], [], [], []
        self.meta = _Meta()
        self.pending_bytes = 0
