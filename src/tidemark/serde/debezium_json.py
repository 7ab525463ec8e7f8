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

import datetime as dt
import logging
from collections.abc import Callable, Iterable
from typing import Any, Final

import msgspec

from tidemark import __version__
from tidemark.event import (
    UNAVAILABLE,
    ChangeEvent,
    Column,
    Op,
    TableSchema,
    TransactionBoundary,
)
from tidemark.source.postgres import types as pgt
from tidemark.source.postgres.config import DecimalHandlingMode, TimePrecisionMode

log = logging.getLogger(__name__)

UNAVAILABLE_PLACEHOLDER: Final = "__debezium_unavailable_value"
SOURCE_VERSION: Final = f"{__version__}-tidemark"

# Debezium's streaming values for infinite dates/timestamps (its own overflow artefacts,
# reproduced so that consumers written against Debezium see the same numbers).
_DATE_POS_INFINITY: Final = -2147472692
_DATE_NEG_INFINITY: Final = -2147472691
_TS_POS_INFINITY_US: Final = 9223372036825200000
_TS_NEG_INFINITY_US: Final = -9223372036832400000


# -- the JSON shapes ---------------------------------------------------------------------
class _Source(msgspec.Struct, gc=False):
    version: str
    connector: str
    name: str
    ts_ms: int
    snapshot: str
    db: str
    sequence: str | None
    ts_us: int
    ts_ns: int
    schema: str
    table: str
    txId: int | None  # noqa: N815 - Debezium's field name
    lsn: int | None
    xmin: int | None
    origin: str | None
    origin_lsn: int | None


class _Transaction(msgspec.Struct, gc=False):
    id: str
    total_order: int
    data_collection_order: int
    commit_lsn: int
    commit_ts_ms: int
    commit_ts_us: int


class _Envelope(msgspec.Struct, gc=False):
    before: Any
    after: Any
    source: _Source
    transaction: _Transaction | None
    op: str
    ts_ms: int
    ts_us: int
    ts_ns: int


class _Message(msgspec.Struct, gc=False):
    prefix: str
    content: bytes


class _MessageEnvelope(msgspec.Struct, gc=False):
    op: str
    ts_ms: int
    source: _Source
    transaction: _Transaction | None
    message: _Message


class _DataCollection(msgspec.Struct, gc=False):
    data_collection: str
    event_count: int


class _TransactionValue(msgspec.Struct, gc=False):
    status: str
    id: str
    event_count: int | None
    data_collections: list[_DataCollection] | None
    ts_ms: int


class _Line(msgspec.Struct, gc=False):
    key: Any
    value: Any


# -- per-type value converters (text -> JSON value) -------------------------------------
def unscaled_bytes(unscaled: int) -> bytes:
    """Java's ``BigInteger.toByteArray()``: minimal two's-complement big-endian bytes."""
    magnitude = unscaled if unscaled >= 0 else ~unscaled
    return unscaled.to_bytes((magnitude.bit_length() >> 3) + 1, "big", signed=True)


def _numeric_parts(text: str) -> tuple[int, int]:
    """(unscaled, scale) of a finite numeric text such as ``-12.340``."""
    whole, _, frac = text.partition(".")
    return int(whole + frac), len(frac)


def _special_numeric(text: str, column: str) -> None:
    log.warning(
        "column %s holds numeric %s, which decimal_handling_mode=precise cannot represent; "
        "emitting null (use decimal_handling_mode=string or double to keep it)",
        column, text,
    )


def _fixed_scale_decimal(scale: int, column: str) -> Callable[[str], Any]:
    def convert(text: str) -> Any:
        if not text[-1].isdigit():
            return _special_numeric(text, column)
        unscaled, have = _numeric_parts(text)
        if have != scale:  # negative or unusual scales: rescale exactly
            unscaled = unscaled * 10 ** (scale - have) if scale > have else \
                unscaled // 10 ** (have - scale)
        return unscaled_bytes(unscaled)

    return convert


def _variable_scale_decimal(column: str) -> Callable[[str], Any]:
    def convert(text: str) -> Any:
        if not text[-1].isdigit():
            return _special_numeric(text, column)
        if "." in text:
            text = text.rstrip("0").rstrip(".")
        unscaled, scale = _numeric_parts(text)
        return {"scale": scale, "value": unscaled_bytes(unscaled)}

    return convert


def _numeric_string(text: str) -> str:
    special = {"NaN": "NAN", "Infinity": "POSITIVE_INFINITY", "-Infinity": "NEGATIVE_INFINITY"}
    return special.get(text, text)


def _money_decimal(text: str) -> bytes:
    value = pgt.parse_money(text)
    return unscaled_bytes(int(value.scaleb(2)))


def _date_days(text: str) -> int:
    if text == "infinity":
        return _DATE_POS_INFINITY
    if text == "-infinity":
        return _DATE_NEG_INFINITY
    return pgt.date_to_epoch_days(text)


def _timestamp_micros(text: str) -> int:
    if text == "infinity":
        return _TS_POS_INFINITY_US
    if text == "-infinity":
        return _TS_NEG_INFINITY_US
    return pgt.timestamp_to_epoch_micros(text)


def _timestamp_millis(text: str) -> int:
    return _timestamp_micros(text) // 1000


def _zoned_timestamp(width: int) -> Callable[[str], str]:
    """Debezium's ZonedTimestamp: UTC, 'Z', fraction zero-padded to the column precision."""

    def convert(text: str) -> str:
        if text in ("infinity", "-infinity"):
            return text
        if text.endswith("+00") and len(text) >= 22 and text[10] == " " \
                and text[4] == "-":  # fast path: the session's TimeZone is UTC
            clock = text[11:-3]
        else:
            instant = pgt.parse_timestamptz(text)
            clock = instant.strftime("%H:%M:%S.%f")
            text = instant.strftime("%Y-%m-%d") + " " + clock + "+00"
        seconds, _, frac = clock.partition(".")
        if width <= 0:
            frac = frac.rstrip("0")
            return f"{text[:10]}T{seconds}{'.' + frac if frac else ''}Z"
        return f"{text[:10]}T{seconds}.{frac.ljust(width, '0')[:width]}Z"

    return convert


def _zoned_time(text: str) -> str:
    value = pgt.parse_timetz(text)
    utc = value.replace(tzinfo=None)
    offset = value.utcoffset()
    if offset:
        moment = dt.datetime.combine(dt.date(2000, 1, 1), utc) - offset
        utc = moment.time()
    text = utc.isoformat()
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text + "Z"


def _bytea(text: str) -> bytes:
    return pgt.parse_bytea(text)


def _interval_micros(text: str) -> int:
    return pgt.interval_to_micros(text)


def _interval_string(text: str) -> str:
    return pgt.parse_interval(text).to_iso8601()


def _float_value(text: str) -> float | str:
    # NaN and ±Infinity: Jackson writes them as JSON strings of Java's names, which
    # are PostgreSQL's names too.
    return float(text) if text[-1] < ":" else text


class _Mapping:
    """How one column type maps to JSON: an inline expression or a converter function.

    ``inline`` is a Python expression template over ``{v}``, the column's text value.
    """

    __slots__ = ("convert", "inline", "placeholder")

    def __init__(self, *, inline: str | None = None,
                 convert: Callable[[str], Any] | None = None,
                 placeholder: Any = UNAVAILABLE_PLACEHOLDER) -> None:
        self.inline = inline
        self.convert = convert
        self.placeholder = placeholder

    def as_function(self) -> Callable[[str], Any]:
        if self.convert is not None:
            return self.convert
        assert self.inline is not None
        fn = eval(f"lambda v: {self.inline.format(v='v')}",  # noqa: S307
                  {"_float_value": _float_value})  # noqa: S307
        return fn  # type: ignore[no-any-return]


_PLACEHOLDER_BYTES = UNAVAILABLE_PLACEHOLDER.encode()
_INT_TYPES = {pgt.INT2_OID, pgt.INT4_OID, pgt.INT8_OID, pgt.OID_OID}
_FLOAT_TYPES = {pgt.FLOAT4_OID, pgt.FLOAT8_OID}


class DebeziumJsonOptions(msgspec.Struct, frozen=True, kw_only=True):
    """The serializer's settings (Debezium's converter-affecting options)."""

    topic_prefix: str = "tidemark"
    decimal_handling_mode: DecimalHandlingMode = DecimalHandlingMode.PRECISE
    time_precision_mode: TimePrecisionMode = TimePrecisionMode.ADAPTIVE
    interval_handling_mode: str = "numeric"
    tombstones_on_delete: bool = True
    transaction_metadata: bool = False


def column_mapping(column: Column, options: DebeziumJsonOptions) -> _Mapping:
    """The JSON mapping of one column, following Debezium's PostgreSQL type mapping."""
    oid, typmod = column.type_oid, column.type_modifier
    element_oid = pgt.ARRAY_ELEMENT_OID.get(oid)
    if element_oid is not None:
        element = column_mapping(
            Column(column.name, element_oid, typmod, "", False, str), options
        ).as_function()
        is_textual = element_oid not in _INT_TYPES | _FLOAT_TYPES | {pgt.BOOL_OID}
        placeholder: Any = [UNAVAILABLE_PLACEHOLDER] if is_textual else list(_PLACEHOLDER_BYTES)
        return _Mapping(convert=lambda v: pgt.parse_array(v, element), placeholder=placeholder)
    if oid in _INT_TYPES:
        return _Mapping(inline="int({v})")
    if oid in _FLOAT_TYPES:
        return _Mapping(inline="_float_value({v})")
    if oid == pgt.BOOL_OID:
        return _Mapping(inline='{v} == "t"')
    if oid in (pgt.NUMERIC_OID, pgt.MONEY_OID):
        mode = options.decimal_handling_mode
        if mode == DecimalHandlingMode.STRING:
            return _Mapping(convert=_numeric_string if oid == pgt.NUMERIC_OID
                            else lambda v: str(pgt.parse_money(v)))
        if mode == DecimalHandlingMode.DOUBLE:
            return _Mapping(convert=(lambda v: _float_value(v)) if oid == pgt.NUMERIC_OID
                            else lambda v: float(pgt.parse_money(v)))
        if oid == pgt.MONEY_OID:
            return _Mapping(convert=_money_decimal)
        if typmod < 4:  # no declared precision/scale
            return _Mapping(convert=_variable_scale_decimal(column.name))
        scale = (typmod - 4) & 0xFFFF
        if scale > 0x7FFF:  # PostgreSQL 15 allows negative scales
            scale -= 0x10000
        return _Mapping(convert=_fixed_scale_decimal(scale, column.name))
    if oid == pgt.DATE_OID:
        return _Mapping(convert=_date_days)
    precision = typmod if typmod >= 0 else 6
    if oid == pgt.TIME_OID:
        mode = options.time_precision_mode
        if mode == TimePrecisionMode.CONNECT or (
            mode == TimePrecisionMode.ADAPTIVE and precision <= 3
        ):
            return _Mapping(convert=lambda v: pgt.time_to_micros(v) // 1000)
        return _Mapping(convert=pgt.time_to_micros)
    if oid == pgt.TIMESTAMP_OID:
        mode = options.time_precision_mode
        if mode == TimePrecisionMode.CONNECT or precision <= 3:
            return _Mapping(convert=_timestamp_millis)
        return _Mapping(convert=_timestamp_micros)
    if oid == pgt.TIMESTAMPTZ_OID:
        return _Mapping(convert=_zoned_timestamp(precision))
    if oid == pgt.TIMETZ_OID:
        return _Mapping(convert=_zoned_time)
    if oid == pgt.INTERVAL_OID:
        if options.interval_handling_mode == "string":
            return _Mapping(convert=_interval_string)
        return _Mapping(convert=_interval_micros)
    if oid == pgt.BYTEA_OID:
        return _Mapping(convert=_bytea, placeholder=_PLACEHOLDER_BYTES)
    # text, varchar, char, uuid, json, jsonb, xml, inet, enums and other types: the text.
    return _Mapping(inline="{v}")


RowConverter = Callable[[tuple[Any, ...]], dict[str, Any]]


def compile_row_converter(
    columns: Iterable[Column], options: DebeziumJsonOptions, only: Iterable[int] | None = None
) -> RowConverter:
    """Generate ``tuple of wire values -> {column: JSON value}`` for a table schema.

    Straight-line code per schema: a generic per-column loop spends most of its time
    in interpreter overhead, and this runs for every row of every event.
    """
    columns = list(columns)
    indexes = list(range(len(columns))) if only is None else list(only)
    namespace: dict[str, Any] = {"_UNAVAILABLE": UNAVAILABLE, "_float_value": _float_value}
    unpack = ", ".join(f"v{i}" for i in range(len(columns)))
    lines = ["def convert(r):", f"    {unpack}{',' if len(columns) == 1 else ''} = r"]
    entries = []
    for i in indexes:
        mapping = column_mapping(columns[i], options)
        namespace[f"p{i}"] = mapping.placeholder
        if mapping.inline is not None:
            expr = mapping.inline.format(v=f"v{i}")
        else:
            namespace[f"c{i}"] = mapping.convert
            expr = f"c{i}(v{i})"
        entries.append(
            f"        {columns[i].name!r}: ({expr} if v{i}.__class__ is str else "
            f"(None if v{i} is None else p{i} if v{i} is _UNAVAILABLE else v{i})),"
        )
    lines.append("    return {")
    lines.extend(entries)
    lines.append("    }")
    if not columns:
        lines = ["def convert(r):", "    return {}"]
    exec("\n".join(lines), namespace)  # noqa: S102 - generated from our own template
    convert: RowConverter = namespace["convert"]
    return convert


class _Codec:
    __slots__ = ("key", "row")

    def __init__(self, schema: TableSchema, options: DebeziumJsonOptions) -> None:
        self.row = compile_row_converter(schema.columns, options)
        self.key = (compile_row_converter(schema.columns, options, schema.key_indexes)
                    if schema.key_indexes else None)


class DebeziumJsonSerializer:
    """Serializes change events to Debezium JSON lines ``{"key": …, "value": …}``.

    One serializer per stream: it caches a generated converter per table schema.
    """

    def __init__(self, options: DebeziumJsonOptions | None = None) -> None:
        self.options = options or DebeziumJsonOptions()
        self._codecs: dict[int, tuple[TableSchema, _Codec]] = {}
        self._encoder = msgspec.json.Encoder()

    def _codec(self, schema: TableSchema) -> _Codec:
        entry = self._codecs.get(id(schema))
        if entry is None or entry[0] is not schema:
            entry = (schema, _Codec(schema, self.options))
            self._codecs[id(schema)] = entry
        return entry[1]

    def _source(self, event: ChangeEvent) -> _Source:
        s = event.source
        sequence = (None if s.lsn is None and s.last_commit_lsn is None else
                    f'[{_quoted(s.last_commit_lsn)},{_quoted(s.lsn)}]')
        return _Source(
            SOURCE_VERSION, s.connector, s.name, s.ts_us // 1000, s.snapshot.value, s.db,
            sequence, s.ts_us, s.ts_us * 1000, s.schema, s.table, s.txid, s.lsn, s.xmin,
            s.origin, None,
        )

    def _transaction(self, event: ChangeEvent) -> _Transaction | None:
        t = event.transaction
        if t is None or not self.options.transaction_metadata:
            return None
        return _Transaction(t.id, t.total_order, t.data_collection_order, t.commit_lsn,
                            t.commit_ts_us // 1000, t.commit_ts_us)

    def key_and_value(self, event: ChangeEvent) -> tuple[Any, Any]:
        """The JSON-ready key and value objects of one event."""
        ts = event.ts_us
        if event.op == Op.MESSAGE:
            return {"prefix": event.message_prefix}, _MessageEnvelope(
                "m", ts // 1000, self._source(event), self._transaction(event),
                _Message(event.message_prefix or "", event.message_content or b""),
            )
        schema = event.schema
        assert schema is not None
        codec = self._codec(schema)
        before = None if event.raw_before is None else codec.row(event.raw_before)
        after = None if event.raw_after is None else codec.row(event.raw_after)
        key = None
        if codec.key is not None and event.op != Op.TRUNCATE:
            key_row = event.raw_before if event.op == Op.DELETE else event.raw_after
            if key_row is not None:
                key = codec.key(key_row)
        value = _Envelope(before, after, self._source(event), self._transaction(event),
                          event.op.value, ts // 1000, ts, ts * 1000)
        return key, value

    def encode_lines(self, records: Iterable[ChangeEvent | TransactionBoundary]) -> bytes:
        """Encode records as newline-terminated JSON lines (tombstones included)."""
        encode = self._encoder.encode
        out: list[bytes] = []
        append = out.append
        tombstones = self.options.tombstones_on_delete
        metadata = self.options.transaction_metadata
        for record in records:
            if isinstance(record, TransactionBoundary):
                if metadata:
                    append(encode(_Line({"id": record.id}, _transaction_value(record))))
                continue
            key, value = self.key_and_value(record)
            append(encode(_Line(key, value)))
            if tombstones and record.op == Op.DELETE and key is not None:
                append(encode(_Line(key, None)))
        if not out:
            return b""
        out.append(b"")
        return b"\n".join(out)

    def encode(self, event: ChangeEvent) -> bytes:
        """One event as a single JSON object ``{"key": …, "value": …}``."""
        key, value = self.key_and_value(event)
        return self._encoder.encode(_Line(key, value))


def _transaction_value(record: TransactionBoundary) -> _TransactionValue:
    collections = None
    if record.data_collections is not None:
        collections = [_DataCollection(name, count) for name, count in record.data_collections]
    return _TransactionValue(record.status, record.id, record.event_count, collections,
                             record.ts_us // 1000)


def _quoted(lsn: int | None) -> str:
    return "null" if lsn is None else f'"{lsn}"'
