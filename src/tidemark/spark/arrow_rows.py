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
                                   server did not send: null there means "unchanged",
                                   not NULL. Empty (never null) when there are none.
=================  ==============  ====================================================

For ``d`` the columns hold the old row as the server sent it (at least the key); for
``t`` all table columns are null.

**Envelope** (many tables in one stream): ``table`` (``schema.table``), the same ``_op``
… ``_txid``, then ``key``, ``before``, ``after`` as JSON objects of column name ->
PostgreSQL's text of the value (or null), and ``_unavailable``. An unavailable column is
absent from ``after``. :func:`tidemark.spark.table_changes` turns the envelope rows of
one table into its typed shape with the same conversions.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Final

import msgspec
import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from tidemark.errors import TerminalError
from tidemark.event import UNAVAILABLE, TableId
from tidemark.source.postgres.pgoutput import Relation, TupleData
from tidemark.spark.options import OnSchemaChange
from tidemark.spark.type_mapping import Converter, converter

#: The change columns every typed table gets after its own columns.
META_FIELDS: Final = (
    StructField("_op", StringType(), False),
    StructField("_lsn", LongType(), False),
    StructField("_commit_lsn", LongType(), False),
    StructField("_seq", LongType(), False),
    StructField("_commit_ts", TimestampType(), False),
    StructField("_txid", LongType(), False),
    StructField("_unavailable", ArrayType(StringType(), False), False),
)
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
    """The Arrow schema pyspark requires batches of *schema* to have, exactly."""
    return to_arrow_schema(schema, timezone="UTC")


class _Meta:
    """Column lists of the change columns, shared by both sinks.

    The transaction columns (commit LSN, commit time, txid) are kept as runs, one per
    transaction, and expanded when a batch is built: most rows share them.
    """

    __slots__ = ("lsns", "ops", "runs", "seqs", "txn", "unavailable")

    def __init__(self) -> None:
        self.txn: tuple[int, int, int] = (0, 0, 0)  # commit LSN, commit time µs, txid
        self.reset()

    def reset(self) -> None:
        self.ops: list[str] = []
        self.lsns: list[int] = []
        self.seqs: list[int] = []
        # (first row, commit LSN, commit time, txid) per transaction in the batch.
        self.runs: list[tuple[int, int, int, int]] = [(0, *self.txn)]
        # (row index, names) for the few rows with unavailable columns.
        self.unavailable: list[tuple[int, list[str]]] = []

    def begin(self, commit_lsn: int, commit_ts_us: int, xid: int) -> None:
        self.txn = (commit_lsn, commit_ts_us, xid)
        row = len(self.ops)
        if self.runs[-1][0] == row:
            self.runs[-1] = (row, *self.txn)
        else:
            self.runs.append((row, *self.txn))

    def append(self, op: str, lsn: int, seq: int) -> None:
        self.ops.append(op)
        self.lsns.append(lsn)
        self.seqs.append(seq)

    def arrays(self, schema: pa.Schema) -> list[pa.Array]:
        n = len(self.ops)
        ends = [r[0] for r in self.runs[1:]] + [n]

        def expand(field: int) -> pa.Array:
            values: list[int] = []
            for run, end in zip(self.runs, ends, strict=True):
                values += [run[field]] * (end - run[0])
            return pa.array(values, pa.int64())

        offsets = [0] * (n + 1)
        names: list[str] = []
        if self.unavailable:
            marks = dict(self.unavailable)
            total = 0
            for i in range(n):
                row_names = marks.get(i)
                if row_names:
                    names.extend(row_names)
                    total += len(row_names)
                offsets[i + 1] = total
        unavailable = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()),
                                               pa.array(names, pa.string()),
                                               type=schema.field("_unavailable").type)
        return [
            pa.array(self.ops, pa.string()),
            pa.array(self.lsns, pa.int64()),
            expand(1),
            pa.array(self.seqs, pa.int64()),
            expand(2).cast(schema.field("_commit_ts").type),
            expand(3),
            unavailable,
        ]


def _split_toast(values: TupleData, names: Sequence[str]) -> tuple[TupleData, list[str]]:
    missing = [names[i] for i, v in enumerate(values) if v is UNAVAILABLE]
    return tuple(None if v is UNAVAILABLE else v for v in values), missing


class TypedSink:
    """Builds record batches of one table's typed shape (see the module docstring)."""

    def __init__(self, table: TableId, schema: StructType, batch_rows: int,
                 on_schema_change: OnSchemaChange) -> None:
        self.table = table
        self.schema = schema
        self.pa_schema = arrow_schema(schema)
        self.columns = [f.name for f in schema.fields if f.name not in META_NAMES]
        self.converters: list[Converter] = [
            converter(f.dataType, self.pa_schema.field(f.name).type)
            for f in schema.fields if f.name not in META_NAMES
        ]
        self.batch_rows = batch_rows
        self.on_schema_change = on_schema_change
        self.relation_id: int | None = None
        self.positions: list[int] = []  # per schema column: index in the relation, or -1
        self.relation_names: tuple[str, ...] = ()
        self.rows: list[TupleData | None] = []
        self.meta = _Meta()
        self.ready: list[pa.RecordBatch] = []

    def relation(self, rel: Relation) -> None:
        if (rel.namespace, rel.name) != (self.table.schema, self.table.table):
            return
        names = tuple(c.name for c in rel.columns)
        known = set(self.columns)
        new = [n for n in names if n not in known]
        if new and self.on_schema_change is OnSchemaChange.FAIL:
            raise SchemaChangedError(
                f"table {self.table} gained column(s) {', '.join(new)} after this streaming "
                "query fixed its schema: restart the query (from the same checkpoint) to "
                "pick them up; the batch is read again with the new schema, nothing is lost "
                "(or set onSchemaChange=drop_new_columns to ignore new columns)"
            )
        positions = [names.index(c) if c in names else -1 for c in self.columns]
        if self.rows and (positions != self.positions or rel.relation_id != self.relation_id):
            self._flush()  # rows so far used the old layout
        self.relation_id = rel.relation_id
        self.positions = positions
        self.relation_names = names

    def begin(self, commit_lsn: int, commit_ts_us: int, xid: int) -> None:
        self.meta.begin(commit_lsn, commit_ts_us, xid)

    def add(self, relation_id: int, op: str, values: TupleData | None, lsn: int, seq: int,
            may_have_toast: bool, old: TupleData | None) -> None:
        if relation_id != self.relation_id:
            return
        if may_have_toast and values is not None and UNAVAILABLE in values:
            values, missing = _split_toast(values, self.relation_names)
            self.meta.unavailable.append(
                (len(self.rows), [n for n in missing if n in self.columns]))
        self.rows.append(values)
        self.meta.append(op, lsn, seq)
        if len(self.rows) >= self.batch_rows:
            self._flush()

    def take(self) -> Iterator[pa.RecordBatch]:
        """The finished batches so far (and, with *final*, the rest)."""
        ready, self.ready = self.ready, []
        yield from ready

    def finish(self) -> Iterator[pa.RecordBatch]:
        """Every remaining batch."""
        if self.rows:
            self._flush()
        yield from self.take()

    def _flush(self) -> None:
        n = len(self.rows)
        width = len(self.relation_names)
        blank: TupleData = (None,) * width
        rows = [blank if r is None else r for r in self.rows]
        by_position = list(zip(*rows, strict=True)) if rows else []
        nulls: list[str | None] = [None] * n
        arrays: list[pa.Array] = []
        for position, convert in zip(self.positions, self.converters, strict=True):
            texts: Any = by_position[position] if position >= 0 and width else nulls
            arrays.append(convert(texts))
        arrays.extend(self.meta.arrays(self.pa_schema))
        self.ready.append(pa.RecordBatch.from_arrays(arrays, schema=self.pa_schema))
        self.rows = []
        self.meta.reset()


class EnvelopeSink:
    """Builds record batches of the envelope shape for every captured table."""

    def __init__(self, tables: Sequence[TableId], batch_rows: int) -> None:
        self.wanted = {(t.schema, t.table) for t in tables}
        self.pa_schema = arrow_schema(ENVELOPE_SCHEMA)
        self.batch_rows = batch_rows
        self.relations: dict[int, tuple[str, tuple[str, ...], tuple[int, ...]]] = {}
        self.tables: list[str] = []
        self.keys: list[bytes | None] = []
        self.befores: list[bytes | None] = []
        self.afters: list[bytes | None] = []
        self.meta = _Meta()
        self.ready: list[pa.RecordBatch] = []
        self._encode = msgspec.json.Encoder().encode

    def relation(self, rel: Relation) -> None:
        if (rel.namespace, rel.name) not in self.wanted:
            self.relations.pop(rel.relation_id, None)
            return
        names = tuple(c.name for c in rel.columns)
        key = tuple(i for i, c in enumerate(rel.columns) if c.is_key)
        self.relations[rel.relation_id] = (f"{rel.namespace}.{rel.name}", names, key)

    def begin(self, commit_lsn: int, commit_ts_us: int, xid: int) -> None:
        self.meta.begin(commit_lsn, commit_ts_us, xid)

    def add(self, relation_id: int, op: str, values: TupleData | None, lsn: int, seq: int,
            may_have_toast: bool, old: TupleData | None) -> None:
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
        self.tables.append(table)
        self.keys.append(key_json)
        self.befores.append(before)
        self.afters.append(after)
        self.meta.append(op, lsn, seq)
        if len(self.tables) >= self.batch_rows:
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
        self.meta.reset()
