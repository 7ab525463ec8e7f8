"""The sinks of the Spark stream: a read plan's changes into record batches of the
stream's schema (typed table, or an envelope of many tables in the ``json``, ``struct``
or ``arrow`` row format: :mod:`tidemark.spark.change_schemas`).

Each implements :class:`tidemark.source.read_plan.ChangeSink`; rows of one table keep
commit order (commit position, then ``_seq``) within an Arrow batch.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from typing import Final

import msgspec
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
from tidemark.spark.change_schemas import (
    ENVELOPE_SCHEMA,
    META_NAMES,
    arrow_schema,
    envelope_table_schemas,
)
from tidemark.spark.options import DEFAULT_ARROW_BATCH_BYTES, OnSchemaChange
from tidemark.spark.table_rows import MetaColumns, TableRows


class TypedSink:
    """Builds record batches of one table's typed shape (see the module docstring)."""

    def __init__(self, table: TableId, schema: StructType, batch_rows: int,
                 on_schema_change: OnSchemaChange,
                 batch_bytes: int = DEFAULT_ARROW_BATCH_BYTES) -> None:
        self.table_rows = TableRows(table, schema, on_schema_change, batch_rows, batch_bytes)
        self.pa_schema = self.table_rows.pa_schema
        self.batch_rows = batch_rows

    def relation(self, rel: ChangeTable, at: int = 0) -> None:
        table = self.table_rows.table
        if (rel.namespace, rel.name) == (table.schema, table.table):
            self.table_rows.relation(rel, at)

    def rows(self, relation_id: int, block: EncodedRows) -> None:
        table_rows = self.table_rows
        if relation_id == table_rows.relation_id:
            table_rows.rows(block)

    def add(self, relation_id: int, op: str, values: WireTuple | None, lsn: int, seq: int,
            txn: Commit, may_have_toast: bool, old: WireTuple | None) -> None:
        table_rows = self.table_rows
        if relation_id == table_rows.relation_id:
            table_rows.add(op, values, lsn, seq, txn, may_have_toast)

    def snapshot(self, table: str, texts: pa.Table, at: int, taken_us: int,
                 truncate_first: bool, keys: Sequence[str]) -> None:
        """A snapshot chunk's rows (see :meth:`TableRows.snapshot`)."""
        if table == str(self.table_rows.table):
            self.table_rows.snapshot(texts, at, taken_us, truncate_first)

    def columns(self, table: str) -> list[str]:
        """The stream's columns of *table* (none but its own table's)."""
        return list(self.table_rows.columns) if table == str(self.table_rows.table) else []

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

    def relation(self, rel: ChangeTable, at: int = 0) -> None:
        table_rows = self.by_name.get(f"{rel.namespace}.{rel.name}")
        if table_rows is None:
            self.by_id.pop(rel.relation_id, None)
            return
        table_rows.relation(rel, at)
        self.by_id[rel.relation_id] = table_rows

    def rows(self, relation_id: int, block: EncodedRows) -> None:
        table_rows = self.by_id.get(relation_id)
        if table_rows is not None:
            table_rows.rows(block)

    def add(self, relation_id: int, op: str, values: WireTuple | None, lsn: int, seq: int,
            txn: Commit, may_have_toast: bool, old: WireTuple | None) -> None:
        table_rows = self.by_id.get(relation_id)
        if table_rows is not None:
            table_rows.add(op, values, lsn, seq, txn, may_have_toast)

    def snapshot(self, table: str, texts: pa.Table, at: int, taken_us: int,
                 truncate_first: bool, keys: Sequence[str]) -> None:
        """A snapshot chunk's rows (see :meth:`TableRows.snapshot`)."""
        table_rows = self.by_name.get(table)
        if table_rows is not None:
            table_rows.snapshot(texts, at, taken_us, truncate_first)

    def columns(self, table: str) -> list[str]:
        """The stream's columns of *table*."""
        table_rows = self.by_name.get(table)
        return [] if table_rows is None else list(table_rows.columns)

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
                 batch_bytes: int = DEFAULT_ARROW_BATCH_BYTES,
                 schema: StructType | None = None) -> None:
        self.schema = schema  # the stream's, which carries each table's columns
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
        self.meta = MetaColumns()
        self.ready: list[pa.RecordBatch] = []
        self._encode = msgspec.json.Encoder().encode

    def relation(self, rel: ChangeTable, at: int = 0) -> None:
        if (rel.namespace, rel.name) not in self.wanted:
            self.relations.pop(rel.relation_id, None)
            return
        names = tuple(c.name for c in rel.columns)
        key = tuple(i for i, c in enumerate(rel.columns) if c.is_key)
        self.relations[rel.relation_id] = (f"{rel.namespace}.{rel.name}", names, key)

    def rows(self, relation_id: int, block: EncodedRows) -> None:
        if relation_id in self.relations:
            for i in range(len(block)):
                op, values, lsn, seq, txn = block.row(i)
                self.add(relation_id, op, values, lsn, seq, txn, op == "u", None)

    def add(self, relation_id: int, op: str, values: WireTuple | None, lsn: int, seq: int,
            txn: Commit, may_have_toast: bool, old: WireTuple | None) -> None:
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
        txn = Commit(at, taken_us, 0)
        if truncate_first:
            self._append(table, None, None, None, "t", at, TRUNCATE_SEQ, txn)
        encode = self._encode
        for row in texts.to_pylist():
            self._append(table, encode({k: row[k] for k in keys}), None, encode(row), "r",
                         at, ROW_SEQ, txn)

    def columns(self, table: str) -> list[str]:
        """The stream's columns of *table* (from the typed schemas the envelope
        carries)."""
        if self.schema is None:
            raise ValueError("an EnvelopeSink made without the stream's schema knows no "
                             "table's columns: pass schema=")
        typed = envelope_table_schemas(self.schema).get(table)
        return [] if typed is None else [f.name for f in typed.fields
                                         if f.name not in META_NAMES]

    def _append(self, table: str, key: bytes | None, before: bytes | None,
                after: bytes | None, op: str, lsn: int, seq: int, txn: Commit) -> None:
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
        self.meta = MetaColumns()
        self.pending_bytes = 0
