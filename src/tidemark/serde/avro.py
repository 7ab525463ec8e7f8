"""Change events as Avro (schemaless binary records, as Confluent's converter writes them
without the registry framing), with schemas derived from the table schema.

The ``source`` record is built from the event's
:class:`~tidemark.source_block.SourceBlock` (Debezium's common fields, then the source's
table and own fields, under the source's record name, e.g.
``io.debezium.connector.postgresql.Source``). The column types follow what Debezium's
AvroConverter writes: integers as int/long, ``numeric(p, s)`` as bytes with the ``decimal`` logical
type, dates as ``int`` days, timestamps as ``long`` micro/milliseconds, ``timestamptz``
as an ISO string (Debezium's ZonedTimestamp), and so on. The values are taken from the
Debezium JSON form of the same event, so both converters always agree on content.
Field names that Avro does not allow (a space, a dash) are adjusted the way Debezium's
``field.name.adjustment.mode=avro`` does: invalid characters become ``_``.
"""

from __future__ import annotations

import base64
import io
import re
from collections.abc import Callable
from typing import Any, NamedTuple

import fastavro
import fastavro.validation
import msgspec

from tidemark.event import UNAVAILABLE, ChangeEvent, Column, Op, TableSchema, WireTuple
from tidemark.logical_type import Kind, LogicalType
from tidemark.serde.json_columns import DebeziumJsonOptions, column_mapping
from tidemark.serde.modes import DecimalHandlingMode, TimePrecisionMode
from tidemark.source_block import BARE_BLOCK, COMMON_FIELDS, BlockField, FieldType, SourceBlock

AvroType = Any  # an Avro schema fragment (str, dict or list)

_INVALID = re.compile(r"[^A-Za-z0-9_]")
_FLATTEN_FIELD_TYPES: dict[str, str] = {
    "op": "string", "table": "string", "schema": "string", "db": "string",
    "lsn": "long", "txId": "long", "source_ts_ms": "long", "ts_ms": "long",
}


def avro_name(name: str) -> str:
    """*name* with characters Avro does not allow replaced by ``_``."""
    adjusted = _INVALID.sub("_", name)
    return adjusted if adjusted and not adjusted[0].isdigit() else f"_{adjusted}"


_SIMPLE: dict[Kind, str] = {
    Kind.INT16: "int", Kind.INT32: "int", Kind.INT64: "long", Kind.FLOAT32: "float",
    Kind.FLOAT64: "double", Kind.BOOL: "boolean", Kind.DATE: "int", Kind.BYTES: "bytes",
    Kind.TIMESTAMP: "long",
}


def column_type(column: Column, options: DebeziumJsonOptions) -> AvroType:
    """The Avro type Debezium gives *column* (not yet made nullable)."""
    return _logical_type(column.logical, options)


def _logical_type(logical: LogicalType, options: DebeziumJsonOptions) -> AvroType:
    kind = logical.kind
    if kind is Kind.ARRAY and logical.element is not None:
        return {"type": "array", "items": ["null", _logical_type(logical.element, options)]}
    simple = _SIMPLE.get(kind)
    if simple is not None:
        return simple
    if kind in (Kind.DECIMAL, Kind.MONEY):
        mode = options.decimal_handling_mode
        if mode == DecimalHandlingMode.STRING:
            return "string"
        if mode == DecimalHandlingMode.DOUBLE:
            return "double"
        if kind is Kind.MONEY:
            return {"type": "bytes", "logicalType": "decimal", "precision": 38, "scale": 2}
        if not logical.fixed_decimal:
            return {"type": "record", "name": "VariableScaleDecimal",
                    "namespace": "io.debezium.data",
                    "fields": [{"name": "scale", "type": "int"},
                               {"name": "value", "type": "bytes"}]}
        return {"type": "bytes", "logicalType": "decimal", "precision": logical.precision,
                "scale": max(logical.scale, 0)}
    if kind is Kind.TIME:
        return "int" if options.time_precision_mode == TimePrecisionMode.CONNECT else "long"
    if kind is Kind.INTERVAL:
        return "string" if options.interval_handling_mode == "string" else "long"
    return "string"


def _bytes_reader(avro_type: AvroType) -> Callable[[Any], Any] | None:
    """How to turn the JSON form of a value into what Avro writes (base64 text → bytes,
    Java's float names → floats), or None when it is already right."""
    if avro_type == "bytes" or (isinstance(avro_type, dict) and avro_type.get("type") == "bytes"):
        return lambda v: v if v is None else base64.b64decode(v)
    if isinstance(avro_type, dict) and avro_type.get("type") == "record":
        return lambda v: v if v is None else {"scale": v["scale"],
                                              "value": base64.b64decode(v["value"])}
    if avro_type in ("float", "double"):
        return lambda v: float(v) if isinstance(v, str) else v
    if avro_type == "int":
        return lambda v: v
    if isinstance(avro_type, dict) and avro_type.get("type") == "array":
        inner = _bytes_reader(avro_type["items"][1])
        if inner is None:
            return None
        return lambda v: v if v is None else [inner(x) for x in v]
    return None


def _named_once(avro_type: AvroType, defined: set[str]) -> AvroType:
    """*avro_type*, or its full name where the schema being built already defines that
    named type: Avro allows one definition per name (a second column of variable-scale
    decimals names Debezium's ``VariableScaleDecimal`` again)."""
    if not isinstance(avro_type, dict):
        return avro_type
    if avro_type.get("type") == "array":
        items = avro_type["items"]
        return {**avro_type, "items": [items[0], _named_once(items[1], defined)]}
    if avro_type.get("type") == "record":
        name = f"{avro_type['namespace']}.{avro_type['name']}"
        if name in defined:
            return name
        defined.add(name)
    return avro_type


def _cell(namespace: str, avro_type: AvroType, fix: Callable[[Any], Any] | None
          ) -> tuple[AvroType, Callable[[Any], Any] | None]:
    """A column as a cell (``{"value": …}``, the log tables' format with ``cells``): its
    record type and the fix-up of its JSON form. Named as ScyllaDB's connector names
    its cell struct (``<table>.<column>.Cell``, one optional field ``value``); the
    rows make the cell itself optional (null: the change left the column as it was)."""
    cell = {"type": "record", "name": "Cell", "namespace": namespace,
            "fields": [{"name": "value", "type": ["null", avro_type], "default": None}]}
    if fix is None:
        return cell, None
    inner = fix
    return cell, lambda v: {"value": None if v["value"] is None else inner(v["value"])}


def _placeholder(column: Column, avro_type: AvroType, options: DebeziumJsonOptions) -> Any:
    """What Avro writes for *column* when its value is unavailable (an unchanged TOASTed
    value, a column a log-table change did not set, written without cells): the JSON
    converter's placeholder where the column's Avro type holds it (the placeholder
    text, its bytes, a list of them), else null — as Debezium, which leaves out a value
    it has no placeholder of that type for (an unchanged numeric, a boolean array)."""
    placeholder = column_mapping(column, options).placeholder
    schema = fastavro.parse_schema({"type": "record", "name": "Placeholder", "fields": [
        {"name": "v", "type": ["null", avro_type]}]})
    valid = fastavro.validation.validate({"v": placeholder}, schema, raise_errors=False)
    return placeholder if valid else None


class _Field(NamedTuple):
    """A column's field in a row record: its JSON name, Avro name, the fix-up of its JSON
    value (None: none), its position in the event's row and its unavailable value."""

    column: str
    name: str
    fix: Callable[[Any], Any] | None
    position: int
    placeholder: Any


class _TableCodec:
    """Avro schemas and value fix-ups of one table schema."""

    def __init__(self, schema: TableSchema, options: DebeziumJsonOptions,
                 block: SourceBlock) -> None:
        self.block = block
        # Fields of the block whose JSON text may be a string where Avro wants a long.
        self.long_fields = tuple(f.name for f in block.fields if f.type is FieldType.INT64)
        name = avro_name(f"{options.topic_prefix}.{schema.table.schema}.{schema.table.table}")
        # plain_*: the columns' own values (keys, flattened rows); self.fields and
        # row: the envelope's rows, whose non-key columns are cells with options.cells.
        self.plain_fields: list[_Field] = []
        self.fields: list[_Field] = []
        plain_row_fields: list[dict[str, Any]] = []
        row_fields: list[dict[str, Any]] = []
        seen: set[str] = set()
        # Named types each schema defines (the envelope's rows, the flat rows, the key).
        in_row: set[str] = set()
        in_plain: set[str] = set()
        in_key: set[str] = set()
        for index, column in enumerate(schema.columns):
            field = avro_name(column.name)
            while field in seen:
                field += "_"
            seen.add(field)
            avro_type = column_type(column, options)
            fix = _bytes_reader(avro_type)
            placeholder = _placeholder(column, avro_type, options)
            self.plain_fields.append(_Field(column.name, field, fix, index, placeholder))
            plain_row_fields.append({"name": field, "default": None, "type": [
                "null", _named_once(avro_type, in_plain)]})
            avro_type = _named_once(avro_type, in_row)
            if options.cells and not column.is_key:
                # An unchanged column is a null cell, never a placeholder.
                avro_type, fix = _cell(f"{name}.{field}", avro_type, fix)
                placeholder = None
            self.fields.append(_Field(column.name, field, fix, index, placeholder))
            row_fields.append({"name": field, "type": ["null", avro_type], "default": None})
        self.row_fields = plain_row_fields
        self.row = {"type": "record", "name": "Value", "namespace": name, "fields": row_fields}
        self.key_names = [self.plain_fields[i] for i in schema.key_indexes]
        self.key = fastavro.parse_schema({
            "type": "record", "name": "Key", "namespace": name,
            "fields": [{"name": field, "default": None, "type": [
                "null", _named_once(column_type(schema.columns[i], options), in_key)]}
                       for i, (_, field, *_) in zip(schema.key_indexes, self.key_names,
                                                    strict=True)]})
        self.envelope = fastavro.parse_schema({
            "type": "record", "name": "Envelope", "namespace": name, "fields": [
                {"name": "before", "type": ["null", self.row], "default": None},
                {"name": "after", "type": ["null", "Value"], "default": None},
                {"name": "source", "type": source_schema(block)},
                {"name": "transaction", "type": ["null", _TRANSACTION], "default": None},
                {"name": "op", "type": "string"},
                {"name": "ts_ms", "type": ["null", "long"], "default": None},
                {"name": "ts_us", "type": ["null", "long"], "default": None},
                {"name": "ts_ns", "type": ["null", "long"], "default": None},
            ]})
        self._flat: dict[tuple[str, ...], Any] = {}
        self._name = name

    def flat_schema(self, add_fields: tuple[str, ...]) -> Any:
        schema = self._flat.get(add_fields)
        if schema is None:
            extra = [{"name": f"__{f}", "type": ["null", _FLATTEN_FIELD_TYPES[f]],
                      "default": None} for f in add_fields]
            extra.append({"name": "__deleted", "type": ["null", "string"], "default": None})
            schema = self._flat[add_fields] = fastavro.parse_schema({
                "type": "record", "name": "FlatValue", "namespace": self._name,
                "fields": self.row_fields + extra})
        return schema

    def row_value(self, row: dict[str, Any] | None, fields: list[_Field] | None = None,
                  raw: WireTuple | None = None) -> dict[str, Any] | None:
        """The Avro record of a Debezium JSON row (of *fields*, default all columns);
        *raw*, the event's row of wire values, tells the unavailable values, written as
        their field's placeholder."""
        if row is None:
            return None
        out: dict[str, Any] = {}
        for column, field, fix, position, placeholder in self.fields if fields is None \
                else fields:
            if raw is not None and raw[position] is UNAVAILABLE:
                out[field] = placeholder
                continue
            value = row.get(column)
            out[field] = fix(value) if fix is not None and value is not None else value
        return out


def _field(field: BlockField) -> dict[str, Any]:
    if field.optional:
        return {"name": field.name, "type": ["null", field.type.value], "default": None}
    return {"name": field.name, "type": field.type.value}


def source_schema(block: SourceBlock) -> dict[str, Any]:
    """The Avro record of *block*: Debezium's common fields, then the source's table
    fields and its own, named as the source's block says."""
    namespace, _, name = block.avro_name.rpartition(".")
    return {"type": "record", "name": name, "namespace": namespace,
            "fields": [_field(f) for f in (*COMMON_FIELDS, *block.table_fields,
                                           *block.fields)]}


_TRANSACTION: dict[str, Any] = {
    "type": "record", "name": "block", "namespace": "event",
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "total_order", "type": "long"},
        {"name": "data_collection_order", "type": "long"},
        {"name": "commit_lsn", "type": ["null", "long"], "default": None},
        {"name": "commit_ts_ms", "type": ["null", "long"], "default": None},
        {"name": "commit_ts_us", "type": ["null", "long"], "default": None},
    ]}


class AvroEncoder:
    """Encodes the Debezium JSON form of events to Avro key and value bytes.

    Not thread-safe (it caches per table schema); use one per worker.
    """

    def __init__(self, options: DebeziumJsonOptions) -> None:
        self.options = options
        self._codecs: dict[int, tuple[TableSchema, _TableCodec]] = {}

    def codec(self, schema: TableSchema, block: SourceBlock | None = None) -> _TableCodec:
        """The schemas of *schema*'s events from a source with *block*."""
        block = block or BARE_BLOCK
        entry = self._codecs.get(id(schema))
        if entry is None or entry[0] is not schema or entry[1].block is not block:
            entry = self._codecs[id(schema)] = (schema,
                                                _TableCodec(schema, self.options, block))
        return entry[1]

    def key(self, event: ChangeEvent, key_json: str) -> bytes | None:
        """The Avro key of *event* from its Debezium JSON key (None: keyless)."""
        if key_json == "null" or event.schema is None:
            return None
        codec = self.codec(event.schema, event.context.block)
        return _write(codec.key,
                      codec.row_value(msgspec.json.decode(key_json), codec.key_names) or {})

    def envelope(self, event: ChangeEvent, value: dict[str, Any]) -> bytes:
        """The Avro value of *event* from its decoded Debezium JSON value."""
        assert event.schema is not None
        codec = self.codec(event.schema, event.context.block)
        source = dict(value["source"])
        for field in codec.long_fields:
            if isinstance(source.get(field), str):
                source[field] = int(source[field])
        record = {
            "before": codec.row_value(value.get("before"), raw=event.raw_before),
            "after": codec.row_value(value.get("after"), raw=event.raw_after),
            "source": source,
            "transaction": value.get("transaction"),
            "op": value["op"],
            "ts_ms": value.get("ts_ms"),
            "ts_us": value.get("ts_us"),
            "ts_ns": value.get("ts_ns"),
        }
        return _write(codec.envelope, record)

    def flat(self, event: ChangeEvent, row: dict[str, Any],
             add_fields: tuple[str, ...]) -> bytes:
        """The Avro value of a flattened row (ExtractNewRecordState): *row* from
        :func:`~tidemark.engine.converters.flat_row` (cells already flattened). A flat
        row has no cells: an unavailable value, with cells or without, is the field's
        placeholder where its Avro type holds one, else null."""
        assert event.schema is not None
        codec = self.codec(event.schema, event.context.block)
        raw = event.raw_before if event.op is Op.DELETE else event.raw_after
        out = codec.row_value(row, codec.plain_fields, raw) or {}
        for field in (*(f"__{f}" for f in add_fields), "__deleted"):
            out[field] = row.get(field)
        return _write(codec.flat_schema(add_fields), out)


def _write(schema: Any, record: dict[str, Any]) -> bytes:
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, schema, record)
    return buffer.getvalue()


def avro_schemas(schema: TableSchema, options: DebeziumJsonOptions,
                 block: SourceBlock | None) -> tuple[Any, Any]:
    """The (key, value) Avro schemas of a table, for a reader of the encoded records.
    *block* (required: the source block differs per source): the source's, an event's
    ``context.block`` (None: the bare block of events
    whose context names none)."""
    codec = _TableCodec(schema, options, block or BARE_BLOCK)
    return codec.key, codec.envelope
