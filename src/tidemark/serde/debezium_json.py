"""Debezium-compatible JSON: what Debezium 3.x + Kafka Connect's ``JsonConverter`` with
``schemas.enable=false`` emits for the PostgreSQL connector, field by field and in order.

See ``docs/debezium-format.md`` for the format and its sources. Column values go
straight from PostgreSQL's text form to their Debezium JSON form (no intermediate
Python objects), by a converter generated per table schema, because this is the hot
path of ``tidemark capture``.

Deliberate differences from Debezium, all in volatile values:
``source.version`` names tidemark; ``transaction.id`` is ``"<txid>:<commit LSN>"`` —
the same on BEGIN, END and every event of a transaction, where Debezium appends the LSN
of whatever it last saw — and the ``transaction`` block ends with ``commit_lsn``,
``commit_ts_ms`` and ``commit_ts_us``.
"""

from __future__ import annotations

from base64 import b64encode
from collections.abc import Iterable

import msgspec

from tidemark.event import (
    ChangeEvent,
    Op,
    SnapshotMarker,
    SourceContext,
    TableId,
    TableSchema,
    TransactionBoundary,
)
from tidemark.serde.json_codegen import (
    COMPILED_RENDERER,
    EventRenderer,
    compile_event_renderer,
    compile_row_converter,
    compiled_event_renderer,
)
from tidemark.serde.json_columns import (
    TEMPLATE_NAMES,
    DebeziumJsonOptions,
    RowConverter,
    _escape,
    column_fragment,
    column_mapping,
    json_fragment,
)
from tidemark.serde.json_values import UNAVAILABLE_PLACEHOLDER, java_float_text, unscaled_bytes
from tidemark.serde.source_json import SOURCE_VERSION, SourceJson

# The names callers import from here (the serializer's module is the public one).
__all__ = [
    "COMPILED_RENDERER", "SOURCE_VERSION", "TEMPLATE_NAMES", "UNAVAILABLE_PLACEHOLDER",
    "DebeziumJsonOptions", "DebeziumJsonSerializer", "EventRenderer", "RowConverter",
    "column_fragment", "column_mapping", "compile_event_renderer", "compile_row_converter",
    "compiled_event_renderer", "java_float_text", "json_fragment", "unscaled_bytes",
]



# -- the JSON shapes ---------------------------------------------------------------------
class _DataCollection(msgspec.Struct, gc=False):
    data_collection: str
    event_count: int


class _TransactionValue(msgspec.Struct, gc=False):
    status: str
    id: str
    event_count: int | None
    data_collections: list[_DataCollection] | None
    ts_ms: int


class _Codec:
    __slots__ = ("_converters", "options", "render", "schema")

    def __init__(self, schema: TableSchema, serializer: DebeziumJsonSerializer) -> None:
        self.schema = schema
        self.options = options = serializer.options
        table = schema.table
        parts = serializer._blocks.parts
        self.render = compile_event_renderer(
            schema, options,
            lambda context, snapshot: parts(context, snapshot, table),
            serializer._ts_fields, serializer._transaction, serializer.general_key_and_value,
            compiled=serializer.compiled)
        self._converters: tuple[RowConverter, RowConverter | None] | None = None

    def converters(self) -> tuple[RowConverter, RowConverter | None]:
        """The row and key converters of the general code, compiled on first use (the
        generated renderer takes almost every event)."""
        if self._converters is None:
            schema, options = self.schema, self.options
            self._converters = (
                compile_row_converter(schema.columns, options),
                compile_row_converter(schema.columns, options, schema.key_indexes)
                if schema.key_indexes else None)
        return self._converters


class DebeziumJsonSerializer:
    """Serializes change events to Debezium JSON lines ``{"key": …, "value": …}``.

    One serializer per stream: it caches a generated converter per table schema. The
    JSON text is written directly (no intermediate objects) because this is the hot
    path of ``tidemark capture``. *compiled*: row events are written by the C writer
    where it is built (the default), else by generated Python code; both write the
    same text.
    """

    def __init__(self, options: DebeziumJsonOptions | None = None, *,
                 compiled: bool = True) -> None:
        self.options = options or DebeziumJsonOptions()
        self.compiled = compiled
        self._codecs: dict[int, tuple[TableSchema, _Codec]] = {}
        self._encoder = msgspec.json.Encoder()
        self._message_table = TableId("", "")
        self._metadata = self.options.transaction_metadata
        self._ts = -1
        self._ts_text = ""
        self._last_schema: TableSchema | None = None
        self._last_codec: _Codec = None  # type: ignore[assignment]
        self._blocks = SourceJson()

    def _codec(self, schema: TableSchema) -> _Codec:
        if schema is self._last_schema:
            return self._last_codec
        entry = self._codecs.get(id(schema))
        if entry is None or entry[0] is not schema:
            entry = (schema, _Codec(schema, self))
            self._codecs[id(schema)] = entry
        self._last_schema, self._last_codec = entry
        return entry[1]

    def _source(self, event: ChangeEvent, table: TableId) -> str:
        """The ``source`` block (:mod:`tidemark.serde.source_json`)."""
        return self._blocks.text(event.context, event.snapshot, table, event.lsn)

    def _cached_source_parts(self, context: SourceContext, snapshot: SnapshotMarker,
                             table: TableId) -> tuple[str, ...]:
        return self._blocks.parts(context, snapshot, table)

    def _ts_fields(self, ts_us: int) -> str:
        """The top-level ``ts_*`` fields and the value's closing brace."""
        if ts_us != self._ts:
            self._ts = ts_us
            self._ts_text = f'"ts_ms":{ts_us // 1000},"ts_us":{ts_us},"ts_ns":{ts_us * 1000}}}'
        return self._ts_text

    def ts_fields(self, ts_us: int) -> str:
        """The top-level ``ts_*`` fields of a value processed at *ts_us* and its closing
        brace: the end of every row event's value."""
        return self._ts_fields(ts_us)

    def stream_value_parts(self, schema: TableSchema, context: SourceContext, op: Op,
                           ts_us: int) -> tuple[str, str, str]:
        """The text of a streamed row event's value around its ``source.lsn``, which
        appears twice: ``head + lsn + middle + lsn + tail`` continues a value after
        ``"source":`` up to its end.

        For :mod:`tidemark.source.postgres.pgoutput_json`, which writes the rest of the value; only
        without transaction metadata, where nothing else in the value varies per event.
        """
        if self._metadata:
            raise ValueError("stream_value_parts is for output without transaction metadata")
        parts = self._cached_source_parts(context, SnapshotMarker.FALSE, schema.table)
        if len(parts) != 3:
            raise ValueError("stream_value_parts is for sources with the position in the block")
        head, middle, end = parts
        ts = self._ts_fields(ts_us)
        return head, middle, f'{end},"transaction":null,"op":"{op._value_}",{ts}'

    def stream_line_parts(self, schema: TableSchema, context: SourceContext, op: Op,
                          ts_us: int) -> tuple[str, str, str]:
        """Like :meth:`stream_value_parts`, for the whole line: the tail also closes the
        line and includes its newline."""
        head, middle, tail = self.stream_value_parts(schema, context, op, ts_us)
        return head, middle, tail + "}\n"

    def _transaction(self, event: ChangeEvent) -> str:
        t = event.transaction
        if t is None or not self.options.transaction_metadata:
            return "null"
        return (f'{{"id":{_escape(t.id)},"total_order":{t.total_order},'
                f'"data_collection_order":{t.data_collection_order},'
                f'"commit_lsn":{t.commit_lsn},"commit_ts_ms":{t.commit_ts_us // 1000},'
                f'"commit_ts_us":{t.commit_ts_us}}}')

    def key_and_value(self, event: ChangeEvent) -> tuple[str, str]:
        """The key and value of one event as JSON texts (``"null"`` for none)."""
        schema = event.schema
        if schema is None:
            return self.general_key_and_value(event)
        return self._codec(schema).render(event)

    def renderer(self, schema: TableSchema | None) -> EventRenderer:
        """:meth:`key_and_value` for events of *schema* (None: logical messages),
        without looking the schema up again: for loops over one table's events."""
        if schema is None:
            return self.general_key_and_value
        return self._codec(schema).render

    def general_key_and_value(self, event: ChangeEvent) -> tuple[str, str]:
        """:meth:`key_and_value` by the general code: piece by piece, for every kind
        of event. The generated per-schema renderers take the common case; this
        handles the rest and is what tests compare them with."""
        ts = event.ts_us
        op = event.op._value_
        if op == "m":
            content = b64encode(event.message_content or b"").decode()
            prefix = _escape(event.message_prefix or "")
            return f'{{"prefix":{prefix}}}', (
                f'{{"op":"m","ts_ms":{ts // 1000},'
                f'"source":{self._source(event, self._message_table)},'
                f'"transaction":{self._transaction(event)},'
                f'"message":{{"prefix":{prefix},"content":"{content}"}}}}'
            )
        schema = event.schema
        assert schema is not None
        codec = self._codec(schema)
        row, key_of = codec.converters()
        before = "null" if event.raw_before is None else row(event.raw_before)
        after = "null" if event.raw_after is None else row(event.raw_after)
        key = "null"
        if key_of is not None and op != "t":
            key_row = event.raw_before if op == "d" else event.raw_after
            if key_row is not None:
                key = key_of(key_row)
        value = (f'{{"before":{before},"after":{after},'
                 f'"source":{self._source(event, schema.table)},'
                 f'"transaction":{self._transaction(event) if self._metadata else "null"},'
                 f'"op":"{op}",{self._ts_fields(ts)}')
        return key, value

    def encode_lines(self, records: Iterable[ChangeEvent | TransactionBoundary]) -> bytes:
        """Encode records as newline-terminated JSON lines (tombstones included)."""
        return "".join(self.text_lines(records)).encode()

    def text_lines(self, records: Iterable[ChangeEvent | TransactionBoundary]) -> list[str]:
        """One text per record that produces output: its newline-terminated JSON line,
        followed by its tombstone line for a delete."""
        out: list[str] = []
        append = out.append
        key_and_value = self.key_and_value
        tombstones = self.options.tombstones_on_delete
        metadata = self.options.transaction_metadata
        for record in records:
            if isinstance(record, ChangeEvent):
                key, value = key_and_value(record)
                if tombstones and key != "null" and record.op is Op.DELETE:
                    append(f'{{"key":{key},"value":{value}}}\n{{"key":{key},"value":null}}\n')
                else:
                    append(f'{{"key":{key},"value":{value}}}\n')
            elif metadata:
                value = self._encoder.encode(_transaction_value(record)).decode()
                append(f'{{"key":{{"id":{_escape(record.id)}}},"value":{value}}}\n')
        return out

    def encode(self, event: ChangeEvent) -> bytes:
        """One event as a single JSON object ``{"key": …, "value": …}``."""
        key, value = self.key_and_value(event)
        return f'{{"key":{key},"value":{value}}}'.encode()

    def boundary_key_and_value(self, record: TransactionBoundary) -> tuple[str, str]:
        """The key and value of a transaction BEGIN/END record as JSON texts."""
        return (f'{{"id":{_escape(record.id)}}}',
                self._encoder.encode(_transaction_value(record)).decode())


def _transaction_value(record: TransactionBoundary) -> _TransactionValue:
    collections = None
    if record.data_collections is not None:
        collections = [_DataCollection(name, count) for name, count in record.data_collections]
    return _TransactionValue(record.status, record.id, record.event_count, collections,
                             record.ts_us // 1000)

