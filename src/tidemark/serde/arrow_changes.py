"""Change events as Arrow record batches of *change rows*, one batch per table schema.

A change row is the table's own columns with Arrow types, plus the change's metadata:
``_op`` (c/u/d/r/t), ``_lsn``, ``_commit_lsn``, ``_seq`` (order in the transaction, from
1), ``_commit_ts`` (UTC), ``_txid`` and ``_unavailable`` (names of columns whose value is
an unchanged TOASTed value: null in the row, but meaning "unchanged", not null). A delete
carries its before image (at least the key). This is the same contract the Spark source
emits and :mod:`tidemark.lake` applies to Delta tables, so engine output can be applied
directly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any, Final

import pyarrow as pa

from tidemark.change_rows import CHANGE_FIELDS
from tidemark.event import UNAVAILABLE, ChangeEvent, Column, Op, TableSchema
from tidemark.logical_type import Kind, LogicalType
from tidemark.wire_text import parse_array, time_to_micros

#: The change columns after the table's own (the contract: :mod:`tidemark.change_rows`).
METADATA_FIELDS: Final = CHANGE_FIELDS

_SIMPLE: dict[Kind, pa.DataType] = {
    Kind.INT16: pa.int16(), Kind.INT32: pa.int32(), Kind.INT64: pa.int64(),
    Kind.FLOAT32: pa.float32(), Kind.FLOAT64: pa.float64(), Kind.BOOL: pa.bool_(),
    Kind.DATE: pa.date32(), Kind.TIME: pa.time64("us"), Kind.TIMESTAMP: pa.timestamp("us"),
    Kind.TIMESTAMPTZ: pa.timestamp("us", tz="UTC"), Kind.BYTES: pa.binary(),
}
_MAX_DECIMAL128_PRECISION = 38


def arrow_type(column: Column) -> tuple[pa.DataType, Callable[[str], Any]]:
    """The Arrow type of *column* and the function from its text value to what
    ``pyarrow.array`` takes. Types without an exact Arrow counterpart (uuid, json,
    interval, enums, decimals without declared precision) are strings of their text."""
    dtype = _arrow_type(column.logical)
    logical = column.logical
    if logical.kind is Kind.ARRAY and pa.types.is_string(dtype.value_type) \
            and logical.element is not None and logical.element.kind is not Kind.STRING:
        return dtype, _text_array  # uuid[], json[] …: their elements' text
    if pa.types.is_decimal(dtype):
        return dtype, _finite_decimal
    if pa.types.is_string(dtype):
        return dtype, str
    if logical.kind is Kind.TIME:
        # Microseconds, which time64("us") takes from any source: a source's own parse
        # may give a duration (MariaDB's time, which can be negative or past 24 h).
        return dtype, time_to_micros
    return dtype, column.parse


def _arrow_type(logical: LogicalType) -> pa.DataType:
    if logical.kind is Kind.ARRAY and logical.element is not None:
        return pa.list_(_arrow_type(logical.element))
    simple = _SIMPLE.get(logical.kind)
    if simple is not None:
        return simple
    if logical.fixed_decimal and \
            0 <= logical.scale <= logical.precision <= _MAX_DECIMAL128_PRECISION:
        return pa.decimal128(logical.precision, logical.scale)
    return pa.string()


def _text_array(text: str) -> list[Any]:
    return parse_array(text, str)


def _finite_decimal(text: str) -> Decimal | None:
    # NaN and infinities have no decimal128 form; they become null (as Debezium's
    # precise mode does) rather than failing the batch.
    value = Decimal(text)
    return value if value.is_finite() else None


class _TableLayout:
    """Arrow schema and per-column conversions of one table schema."""

    def __init__(self, schema: TableSchema) -> None:
        fields = []
        self.parsers = []
        for column in schema.columns:
            dtype, parse = arrow_type(column)
            fields.append(pa.field(column.name, dtype, nullable=True))
            self.parsers.append(parse)
        self.names = [c.name for c in schema.columns]
        self.schema = pa.schema([*fields, *METADATA_FIELDS])


class ArrowChangeEncoder:
    """Builds change-row record batches. Not thread-safe (caches per table schema)."""

    def __init__(self) -> None:
        self._layouts: dict[int, tuple[TableSchema, _TableLayout]] = {}

    def layout(self, schema: TableSchema) -> _TableLayout:
        entry = self._layouts.get(id(schema))
        if entry is None or entry[0] is not schema:
            entry = self._layouts[id(schema)] = (schema, _TableLayout(schema))
        return entry[1]

    def encode(self, events: Sequence[ChangeEvent]) -> pa.RecordBatch:
        """One batch of the events, which must share one table schema."""
        schema = events[0].schema
        assert schema is not None
        layout = self.layout(schema)
        width = len(layout.names)
        columns: list[list[Any]] = [[] for _ in range(width)]
        ops, lsns, commits, seqs, stamps, txids, unavailable = [], [], [], [], [], [], []
        for event in events:
            row = event.raw_before if event.op is Op.DELETE else event.raw_after
            missing: list[str] = []
            if row is None:
                for values in columns:
                    values.append(None)
            else:
                for i, raw in enumerate(row):
                    if raw is None:
                        columns[i].append(None)
                    elif raw is UNAVAILABLE:
                        columns[i].append(None)
                        missing.append(layout.names[i])
                    else:
                        columns[i].append(layout.parsers[i](raw) if isinstance(raw, str) else raw)
            context = event.context
            ops.append(event.op.value)
            lsns.append(event.lsn)
            commits.append(context.commit_lsn)
            seqs.append(event.total_order or None)
            stamps.append(context.ts_us)
            txids.append(context.txid)
            unavailable.append(missing)
        arrays = [pa.array(values, type=layout.schema.field(i).type)
                  for i, values in enumerate(columns)]
        arrays += [pa.array(ops, pa.string()), pa.array(lsns, pa.int64()),
                   pa.array(commits, pa.int64()), pa.array(seqs, pa.int64()),
                   pa.array(stamps, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
                   pa.array(txids, pa.int64()), pa.array(unavailable, pa.list_(pa.string()))]
        return pa.RecordBatch.from_arrays(arrays, schema=layout.schema)
