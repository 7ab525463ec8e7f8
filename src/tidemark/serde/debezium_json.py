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
import json.encoder as json_encoder
import logging
from base64 import b64encode
from binascii import b2a_base64
from collections.abc import Callable, Iterable
from decimal import Decimal
from typing import Any, Final

import msgspec

from tidemark import __version__
from tidemark import wire_text as wt
from tidemark.event import (
    UNAVAILABLE,
    ChangeEvent,
    Column,
    Op,
    SnapshotMarker,
    SourceContext,
    TableId,
    TableSchema,
    TransactionBoundary,
)
from tidemark.logical_type import FLOAT_KINDS, INTEGER_KINDS, Kind, LogicalType
from tidemark.serde.modes import DecimalHandlingMode, TimePrecisionMode

try:
    from tidemark.serde._render import EventRenderer as _CompiledRenderer
except ImportError:  # not built: the generated Python code writes the same JSON
    _CompiledRenderer = None  # type: ignore[assignment,misc]

log = logging.getLogger(__name__)

#: Whether the compiled event writer (``tidemark.serde._render``) is built.
COMPILED_RENDERER: Final = _CompiledRenderer is not None

UNAVAILABLE_PLACEHOLDER: Final = "__debezium_unavailable_value"
SOURCE_VERSION: Final = f"{__version__}-tidemark"

# Debezium's streaming values for infinite dates/timestamps (its own overflow artefacts,
# reproduced so that consumers written against Debezium see the same numbers).
_INF: Final = float("inf")
_INT_TEXT_DIGITS: Final = 4000  # below sys.get_int_max_str_digits()' default of 4300
_DATE_POS_INFINITY: Final = -2147472692
_DATE_NEG_INFINITY: Final = -2147472691
_TS_POS_INFINITY_US: Final = 9223372036825200000
_TS_NEG_INFINITY_US: Final = -9223372036832400000


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


# -- per-type value converters (text -> JSON value) -------------------------------------
def unscaled_bytes(unscaled: int) -> bytes:
    """Java's ``BigInteger.toByteArray()``: minimal two's-complement big-endian bytes."""
    magnitude = unscaled if unscaled >= 0 else ~unscaled
    return unscaled.to_bytes((magnitude.bit_length() >> 3) + 1, "big", signed=True)


def _numeric_parts(text: str) -> tuple[int, int]:
    """(unscaled, scale) of a finite numeric text such as ``-12.340``."""
    whole, _, frac = text.partition(".")
    digits = whole + frac
    if len(digits) > _INT_TEXT_DIGITS:
        # numeric holds up to 147,455 digits; int() of a text that long is refused
        # (Python's guard against quadratic conversions), a Decimal's is not.
        return int(Decimal(digits)), len(frac)
    return int(digits), len(frac)


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


def _decimal_fragment(scale: int, convert: Callable[[str], Any]) -> Callable[[str], str]:
    """numeric(p, s) text -> Debezium's base64 JSON string, in one step.

    The hottest converter of typical tables; PostgreSQL prints exactly ``s`` fraction
    digits for a numeric(p, s), so the unscaled value is the digits without the point.
    """
    def general(text: str) -> str:
        value = convert(text)  # special values, unusual scales
        if value is None:
            return "null"
        return '"' + b2a_base64(value, newline=False).decode() + '"'

    if scale <= 0:
        return general
    point = -scale - 1

    def fragment(text: str) -> str:
        # The common shape, checked cheaply: the point where the scale puts it, a digit
        # last (not NaN or Infinity). Anything else takes the general conversion.
        if len(text) > scale and text[point] == "." and "0" <= text[-1] <= "9":
            unscaled = int(text.replace(".", "", 1))
            # unscaled_bytes, inlined: this runs for every numeric of every row. With
            # one spare bit a non-negative value's unsigned bytes are its signed ones.
            if unscaled >= 0:
                raw = unscaled.to_bytes((unscaled.bit_length() >> 3) + 1)
            else:
                raw = unscaled.to_bytes(((~unscaled).bit_length() >> 3) + 1, "big",
                                        signed=True)
            return '"' + b2a_base64(raw, newline=False).decode() + '"'
        return general(text)

    if scale <= _COMPILED_DECIMAL_SCALE:
        setattr(fragment, "compiled_kind", (KIND_DECIMAL, scale))  # noqa: B010
    return fragment


def _variable_scale_decimal(column: str) -> Callable[[str], Any]:
    def convert(text: str) -> Any:
        if not text[-1].isdigit():
            return _special_numeric(text, column)
        if "." in text:
            text = text.rstrip("0").rstrip(".")
        unscaled, scale = _numeric_parts(text)
        return {"scale": scale, "value": unscaled_bytes(unscaled)}

    return convert


_SPECIAL_NUMERIC_NAMES: Final = {
    "NaN": "NAN", "Infinity": "POSITIVE_INFINITY", "-Infinity": "NEGATIVE_INFINITY",
}


def _numeric_string(text: str) -> str:
    """A numeric as Debezium's string mode emits it: ``BigDecimal.toPlainString()``,
    which is PostgreSQL's own text (``0.000000123`` stays so; confirmed by capture), or
    the enum name of a special value."""
    special = _SPECIAL_NUMERIC_NAMES.get(text)
    return text if special is None else special


def _numeric_string_fallback(scale: int) -> str:
    """The JSON text of string mode's zero for a NOT NULL column without a value:
    ``0`` at the column's scale (``"0.00"`` for numeric(8, 2); confirmed by capture)."""
    return '"0' + ("." + "0" * scale if scale > 0 else "") + '"'


def _money_decimal(text: str) -> bytes:
    value = wt.parse_money(text)
    return unscaled_bytes(int(value.scaleb(2)))


_DATE_CACHE_SIZE: Final = 4096
_date_cache: dict[str, int] = {}
_date_json_cache: dict[str, str] = {}


def _date_days(text: str) -> int:
    # Dates repeat heavily in real tables (order dates, birthdays); a bounded memo
    # makes the common case a dict lookup.
    days = _date_cache.get(text)
    if days is None:
        days = _date_days_uncached(text)
        if len(_date_cache) >= _DATE_CACHE_SIZE:
            _date_cache.clear()
        _date_cache[text] = days
    return days


def _date_fragment(text: str) -> str:
    """A date's epoch days as JSON text (memoized like :func:`_date_days`)."""
    fragment = _date_json_cache.get(text)
    if fragment is None:
        fragment = str(_date_days_uncached(text))
        if len(_date_json_cache) >= _DATE_CACHE_SIZE:
            _date_json_cache.clear()
        _date_json_cache[text] = fragment
    return fragment


def _date_days_uncached(text: str) -> int:
    if text == "infinity":
        return _DATE_POS_INFINITY
    if text == "-infinity":
        return _DATE_NEG_INFINITY
    return wt.date_to_epoch_days(text)


def _timestamp_micros(text: str) -> int:
    if text == "infinity":
        return _TS_POS_INFINITY_US
    if text == "-infinity":
        return _TS_NEG_INFINITY_US
    return wt.timestamp_to_epoch_micros(text)


def _timestamp_millis(text: str) -> int:
    return _timestamp_micros(text) // 1000


def _zoned_timestamp_fragment(width: int, zoned: Callable[[str], str]) -> Callable[[str], str]:
    """timestamptz text -> JSON string; slices for the two shapes a UTC session prints
    most (no fraction, or all six digits), :func:`_zoned_timestamp` for the rest."""
    whole = f".{'0' * width}Z\"" if width > 0 else 'Z"'

    def fragment(text: str) -> str:
        size = len(text)
        if size == 22 and text[19:] == "+00" and text[10] == " ":
            return f'"{text[:10]}T{text[11:19]}{whole}'
        if size == 29 and width == 6 and text[26:] == "+00" and text[10] == " ":
            return f'"{text[:10]}T{text[11:26]}Z"'
        return '"' + zoned(text) + '"'

    setattr(fragment, "compiled_kind", (KIND_ZONED, width))  # noqa: B010
    return fragment


def _java_year(year: int) -> str:
    """A year as Java's ISO_LOCAL_DATE prints it: four digits at least, a sign beyond
    9999 or before year 0 (``+294276``, ``-4712`` for 4713 BC)."""
    if year > 9999:
        return f"+{year}"
    return f"-{-year:04d}" if year < 0 else f"{year:04d}"


def _utc_date_and_clock(text: str) -> tuple[str, str]:
    """A timestamptz as (date, ``HH:MM:SS.ffffff``) in UTC, in integers: any year
    PostgreSQL holds (4713 BC to 294276 AD), which ``datetime`` does not."""
    days, micros = divmod(wt.timestamptz_to_epoch_micros(text), 86_400_000_000)
    year, month, day = wt.civil_from_epoch_days(days)
    seconds, fraction = divmod(micros, 1_000_000)
    minutes, second = divmod(seconds, 60)
    return (f"{_java_year(year)}-{month:02d}-{day:02d}",
            f"{minutes // 60:02d}:{minutes % 60:02d}:{second:02d}.{fraction:06d}")


def _zoned_timestamp(width: int) -> Callable[[str], str]:
    """Debezium's ZonedTimestamp: UTC, 'Z', fraction zero-padded to the column precision."""

    def convert(text: str) -> str:
        if text in ("infinity", "-infinity"):
            return text
        if text.endswith("+00") and len(text) >= 22 and text[10] == " " \
                and text[4] == "-":  # fast path: the session's TimeZone is UTC
            day, clock = text[:10], text[11:-3]
        else:
            day, clock = _utc_date_and_clock(text)
        seconds, _, frac = clock.partition(".")
        if width <= 0:
            frac = frac.rstrip("0")
            return f"{day}T{seconds}{'.' + frac if frac else ''}Z"
        return f"{day}T{seconds}.{frac.ljust(width, '0')[:width]}Z"

    return convert


def _zoned_time(text: str) -> str:
    value = wt.parse_timetz(text)
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
    return wt.parse_bytea(text)


_INT64_MAX: Final = 2**63 - 1


def _interval_micros(text: str) -> int:
    if text in ("infinity", "-infinity"):
        # PostgreSQL 17's infinite intervals have no duration: the ends of MicroDuration's
        # int64, which is what Java's saturating (long) cast makes of an infinite one.
        return _INT64_MAX if text == "infinity" else -_INT64_MAX - 1
    return wt.interval_to_micros(text)


def _interval_string(text: str) -> str:
    return wt.parse_interval(text).to_iso8601()


def java_float_text(text: str) -> str:
    """The JSON text Jackson writes for a ``float4``/``float8`` value, from PostgreSQL's
    text of it: Java's ``Float/Double.toString`` (confirmed by capture).

    Plain notation with at least one fraction digit for 1e-3 <= |x| < 1e7 (``100.0``,
    ``0.001``), else ``d.dddE<n>`` (``1.23456789125E8``, ``1.0E-5``); NaN and
    ±Infinity as JSON strings of Java's names, which are PostgreSQL's too. The digits
    are PostgreSQL's, its shortest exact form (the default since PostgreSQL 12), which
    is what Java 19+ writes (older Java writes more digits for a few values).
    """
    if text[-1] > "9":  # NaN, Infinity, -Infinity
        return '"' + text + '"'
    whole, point, fraction = text.partition(".")
    if point and "e" not in fraction:  # the common case: plain text that may be Java's
        digits = whole.lstrip("-")
        if 0 < len(digits) <= 7 and (digits != "0" or fraction[:3].strip("0")) \
                and (digits == "0" or digits[0] != "0"):
            return text
    return _java_notation(text)


def _java_notation(text: str) -> str:
    """Java's Double.toString of the decimal *text* (sign, digits, optional exponent),
    keeping its digits."""
    sign = "-" if text[0] == "-" else ""
    mantissa, _, exponent_text = text.lstrip("-+").lower().partition("e")
    whole, _, fraction = mantissa.partition(".")
    all_digits = whole + fraction
    significant = all_digits.lstrip("0")
    digits = significant.rstrip("0")
    if not digits:
        return sign + "0.0"
    # value = int(digits) * 10**scale; sci: the exponent of its first digit
    scale = int(exponent_text or 0) - len(fraction) + len(significant) - len(digits)
    sci = len(digits) - 1 + scale
    if -3 <= sci < 7:
        if sci < 0:
            return f"{sign}0.{'0' * (-sci - 1)}{digits}"
        head = digits[:sci + 1].ljust(sci + 1, "0")
        return f"{sign}{head}.{digits[sci + 1:] or '0'}"
    return f"{sign}{digits[0]}.{digits[1:] or '0'}E{sci}"


def _java_double_text(text: str) -> str:
    """The JSON text of a numeric (or money amount) in Debezium's double mode: Java's
    Double.toString of the nearest double (``1.234567891E7``; confirmed by capture)."""
    if text[-1] > "9":  # NaN, Infinity, -Infinity: Java's names are PostgreSQL's
        return '"' + text + '"'
    value = float(text)
    if value in (_INF, -_INF):
        # Beyond a double (numeric holds 1e400): BigDecimal.doubleValue() is infinite,
        # which Jackson quotes; repr's "inf" would make the line invalid JSON.
        return '"Infinity"' if value > 0 else '"-Infinity"'
    return _java_notation(repr(value))


def _float_value(text: str) -> Any:
    """A float's JSON value inside other values (array elements): its Java text, raw."""
    return msgspec.Raw(java_float_text(text).encode())


class _Mapping:
    """How one column type maps to JSON: an inline expression or a converter function.

    ``inline`` is a Python expression template over ``{v}``, the column's text value.
    """

    __slots__ = ("convert", "fallback", "fragment", "inline", "placeholder")

    def __init__(self, *, inline: str | None = None,
                 convert: Callable[[str], Any] | None = None,
                 fragment: Callable[[str], str] | None = None,
                 placeholder: Any = UNAVAILABLE_PLACEHOLDER, fallback: str = '""') -> None:
        self.inline = inline
        # JSON text Debezium substitutes when a NOT NULL column has no value.
        self.fallback = fallback
        self.convert = convert
        self.fragment = fragment  # text -> JSON text directly, for the hottest types
        self.placeholder = placeholder

    def as_function(self) -> Callable[[str], Any]:
        if self.convert is not None:
            return self.convert
        assert self.inline is not None
        fn = eval(f"lambda v: {self.inline.format(v='v')}",
                  {"_float_value": _float_value})
        return fn  # type: ignore[no-any-return]


_PLACEHOLDER_BYTES = UNAVAILABLE_PLACEHOLDER.encode()
_HEADS_KEPT: Final = 256  # source-block heads kept for sources with fields of their own
# Array elements of these kinds are JSON numbers or booleans: an unavailable array of
# them is written as the placeholder's bytes (Debezium's behaviour, by capture).
_UNQUOTED_KINDS = INTEGER_KINDS | FLOAT_KINDS | {Kind.BOOL}


class DebeziumJsonOptions(msgspec.Struct, frozen=True, kw_only=True):
    """The serializer's settings (Debezium's converter-affecting options)."""

    topic_prefix: str = "tidemark"
    decimal_handling_mode: DecimalHandlingMode = DecimalHandlingMode.PRECISE
    time_precision_mode: TimePrecisionMode = TimePrecisionMode.ADAPTIVE
    interval_handling_mode: str = "numeric"
    tombstones_on_delete: bool = True
    transaction_metadata: bool = False
    cells: bool = False
    """Non-key columns as ScyllaDB's cells: ``{"value": …}`` for a value set,
    ``{"value": null}`` for one set to NULL, ``null`` for one left unchanged
    (:data:`~tidemark.event.UNAVAILABLE`) — the log-table sources' format."""


def column_mapping(column: Column, options: DebeziumJsonOptions) -> _Mapping:
    """The JSON mapping of one column, following Debezium's type mapping."""
    return _logical_mapping(column.logical, column.name, options)


def _logical_mapping(logical: LogicalType, name: str, options: DebeziumJsonOptions) -> _Mapping:
    kind = logical.kind
    if kind is Kind.ARRAY and logical.element is not None:
        element = _logical_mapping(logical.element, name, options).as_function()
        is_textual = logical.element.kind not in _UNQUOTED_KINDS
        placeholder: Any = [UNAVAILABLE_PLACEHOLDER] if is_textual else list(_PLACEHOLDER_BYTES)
        return _Mapping(convert=lambda v: wt.parse_array(v, element), placeholder=placeholder,
                        fallback="[]")
    if kind in INTEGER_KINDS:
        return _Mapping(inline="int({v})", fallback="0")
    if kind in FLOAT_KINDS:
        return _Mapping(inline="_float_value({v})", fallback="0.0")
    if kind is Kind.BOOL:
        return _Mapping(inline='{v} == "t"', fallback="false")
    if kind in (Kind.DECIMAL, Kind.MONEY):
        return _decimal_mapping(logical, name, options)
    if kind is Kind.DATE:
        return _Mapping(convert=_date_days, fragment=_date_fragment, fallback="0")
    precision = logical.time_precision
    time_mode = options.time_precision_mode
    if kind is Kind.TIME:
        if time_mode == TimePrecisionMode.CONNECT or (
            time_mode == TimePrecisionMode.ADAPTIVE and precision <= 3
        ):
            return _Mapping(convert=lambda v: wt.time_to_micros(v) // 1000, fallback="0")
        return _Mapping(convert=wt.time_to_micros, fallback="0")
    if kind is Kind.TIMESTAMP:
        if time_mode == TimePrecisionMode.CONNECT or precision <= 3:
            return _Mapping(convert=_timestamp_millis, fallback="0")
        return _Mapping(convert=_timestamp_micros, fallback="0")
    if kind is Kind.TIMESTAMPTZ:
        zoned = _zoned_timestamp(precision)
        # The fallback is the epoch without a fraction, whatever the precision
        # (confirmed by capture).
        return _Mapping(convert=zoned, fragment=_zoned_timestamp_fragment(precision, zoned),
                        fallback='"1970-01-01T00:00:00Z"')
    if kind is Kind.TIMETZ:
        return _Mapping(convert=_zoned_time)
    if kind is Kind.INTERVAL:
        if options.interval_handling_mode == "string":
            return _Mapping(convert=_interval_string, fallback='"PT0S"')
        return _Mapping(convert=_interval_micros, fallback="0")
    if kind is Kind.BYTES:
        return _Mapping(convert=_bytea, placeholder=_PLACEHOLDER_BYTES)
    # strings, uuid, json, enums and every type without a closer mapping: the text.
    return _Mapping(inline="{v}")


def _decimal_mapping(logical: LogicalType, name: str, options: DebeziumJsonOptions) -> _Mapping:
    money = logical.kind is Kind.MONEY
    mode = options.decimal_handling_mode
    if mode == DecimalHandlingMode.STRING:
        if money:
            return _Mapping(convert=lambda v: str(wt.parse_money(v)), fallback='"0"')
        return _Mapping(convert=_numeric_string,
                        fallback=_numeric_string_fallback(logical.scale))
    if mode == DecimalHandlingMode.DOUBLE:
        if money:
            return _Mapping(fragment=lambda v: _java_double_text(str(wt.parse_money(v))),
                            convert=lambda v: msgspec.Raw(
                                _java_double_text(str(wt.parse_money(v))).encode()),
                            fallback="0.0")
        return _Mapping(fragment=_java_double_text,
                        convert=lambda v: msgspec.Raw(_java_double_text(v).encode()),
                        fallback="0.0")
    if money:
        return _Mapping(convert=_money_decimal, fallback='"AA=="')
    if not logical.fixed_decimal:  # no declared precision/scale
        return _Mapping(convert=_variable_scale_decimal(name),
                        fallback='{"scale":0,"value":"AA=="}')
    convert = _fixed_scale_decimal(logical.scale, name)
    return _Mapping(convert=convert, fragment=_decimal_fragment(logical.scale, convert),
                    fallback='"AA=="')


RowConverter = Callable[[tuple[Any, ...]], str]

_escape: Callable[[str], str] = json_encoder.encode_basestring


def json_fragment(value: Any) -> str:
    """A converted column value as JSON text."""
    cls = value.__class__
    if cls is bytes:
        return '"' + b64encode(value).decode() + '"'
    if cls is int:
        return str(value)
    if cls is str:
        return _escape(value)
    if value is None:
        return "null"
    return msgspec.json.encode(value).decode()


# Column kinds of the compiled writer (``_render.c``), with the same meaning as the
# inline templates of the generated Python code that they stand for.
KIND_RAW: Final = 0       # the text itself: PostgreSQL's integer text is valid JSON
KIND_STRING: Final = 1    # the text as a JSON string
KIND_BOOL: Final = 2      # true for "t", false otherwise
KIND_FLOAT: Final = 3     # the text, quoted unless it ends in a digit (NaN, Infinity)
KIND_FUNCTION: Final = 4  # a text -> JSON text function
# Written in C for their common shapes, else by the column's function (the function
# carries the kind and its parameter as ``compiled_kind``, see :func:`_compiled_kind`).
KIND_DECIMAL: Final = 5   # numeric(p, s > 0), precise: parameter s
KIND_ZONED: Final = 6     # timestamptz as ZonedTimestamp: parameter the fraction digits
KIND_DATE: Final = 7      # date as epoch days
_COMPILED_DECIMAL_SCALE: Final = 38  # the C code holds at most 38 digits
setattr(_date_fragment, "compiled_kind", (KIND_DATE, 0))  # noqa: B010


def _compiled_kind(kind: int, function: Callable[[str], str] | None) -> tuple[int, int]:
    """The compiled writer's kind of a column and its parameter byte."""
    if kind == KIND_FUNCTION:
        compiled = getattr(function, "compiled_kind", None)
        if compiled is not None:
            return compiled  # type: ignore[no-any-return]
    return kind, 0

_INLINE_FRAGMENTS: Final[dict[str, tuple[int, str]]] = {
    "int({v})": (KIND_RAW, "{v}"),
    '{v} == "t"': (KIND_BOOL, "('true' if {v} == 't' else 'false')"),
    "_float_value({v})": (KIND_FLOAT, "_java_float({v})"),
    "{v}": (KIND_STRING, "_escape({v})"),
}


def _fragment_converter(mapping: _Mapping) -> tuple[int, str | None, Any]:
    """(kind, inline JSON-text template over {v} or None, text -> JSON-text function
    or None)."""
    inline = _INLINE_FRAGMENTS.get(mapping.inline or "")
    if inline is not None:
        # A float's text is written as it is when it is already Java's, else by this.
        return inline[0], inline[1], java_float_text if inline[0] == KIND_FLOAT else None
    if mapping.fragment is not None:
        return KIND_FUNCTION, None, mapping.fragment
    convert = mapping.convert
    assert convert is not None
    return KIND_FUNCTION, None, lambda v: json_fragment(convert(v))


#: Names that :func:`column_fragment` templates refer to; generated code using them
#: needs these in its namespace.
TEMPLATE_NAMES: Final[dict[str, Any]] = {"_escape": _escape, "_java_float": java_float_text}


def column_fragment(column: Column, options: DebeziumJsonOptions
                    ) -> tuple[str | None, Callable[[str], str] | None, str, Any]:
    """How a column's text value becomes JSON text, for generated code.

    Returns ``(template, function, null_text, placeholder)``: an inline expression
    template over ``{v}`` (or None and a ``text -> JSON text`` function), the JSON text
    for SQL NULL, and the value standing for an unchanged TOASTed column.
    """
    return _column_writer(column, options)[1:]


def _column_writer(column: Column, options: DebeziumJsonOptions
                   ) -> tuple[int, str | None, Callable[[str], str] | None, str, Any]:
    """:func:`column_fragment` with the column's kind for the compiled writer first."""
    mapping = column_mapping(column, options)
    kind, template, function = _fragment_converter(mapping)
    if options.cells and not column.is_key:
        return (KIND_FUNCTION, None, _cell(template, function), '{"value":null}', None)
    # Debezium writes a type's fallback value, not null, for a NOT NULL column that
    # has no value: the non-key columns of a delete under REPLICA IDENTITY DEFAULT.
    null_text = "null" if column.nullable else mapping.fallback
    return kind, template, function, null_text, mapping.placeholder


def _cell(template: str | None, function: Callable[[str], str] | None
          ) -> Callable[[str], str]:
    """A text -> JSON-text function that wraps the column's value in a cell."""
    if function is None:
        assert template is not None
        function = eval(f"lambda v: {template.format(v='v')}", dict(TEMPLATE_NAMES))
    inner = function

    def cell(text: str) -> str:
        return '{"value":' + inner(text) + "}"

    return cell


def _row_code(columns: list[Column], options: DebeziumJsonOptions, namespace: dict[str, Any],
              row: str, prefix: str) -> tuple[list[str], list[str]]:
    """Generated statements that turn the wire tuple named *row* into one JSON text
    fragment per column, in variables ``<prefix>f<i>``: (statements, fragment names).

    Binding names (``n<i>``, ``p<i>``, ``c<i>``) go into *namespace*, shared by every
    row of the schema that uses the same *namespace*.
    """
    if not columns:
        return [], []
    values = [f"{prefix}v{i}" for i in range(len(columns))]
    lines = [f"{', '.join(values)}{',' if len(columns) == 1 else ''} = {row}"]
    fragments = []
    for i, column in enumerate(columns):
        template, function, null_text, placeholder = column_fragment(column, options)
        namespace[f"p{i}"] = json_fragment(placeholder)
        namespace[f"n{i}"] = null_text
        v = values[i]
        if template is not None:
            expr = template.format(v=v)
        else:
            namespace[f"c{i}"] = function
            expr = f"c{i}({v})"
        lines.append(
            f"{prefix}f{i} = {expr} if {v}.__class__ is str else "
            f"(n{i} if {v} is None else p{i} if {v} is _UNAVAILABLE else _bin({v}))"
        )
        fragments.append(f"{prefix}f{i}")
    return lines, fragments


def _object_template(columns: list[Column], indexes: Iterable[int], fragments: list[str],
                     namespace: dict[str, Any], label: str) -> str:
    """The f-string body of a JSON object of the given columns' fragments.

    Column names are data, never code: the literal JSON text around each value lives
    in a variable (``<label><i>``) of the generated function's namespace.
    """
    parts = []
    for n, i in enumerate(indexes):
        namespace[f"{label}{i}"] = _member_prefix(n, columns[i].name)
        parts.append(f"{{{label}{i}}}{{{fragments[i]}}}")
    return "".join(parts) + "}}" if parts else "{{}}"


def _namespace() -> dict[str, Any]:
    # Binary-format values (only from sources that request binary transfer) are raw
    # bytes, emitted as Debezium emits bytes: base64.
    return {"_UNAVAILABLE": UNAVAILABLE, "_bin": json_fragment, **TEMPLATE_NAMES}


def compile_row_converter(
    columns: Iterable[Column], options: DebeziumJsonOptions, only: Iterable[int] | None = None
) -> RowConverter:
    """Generate ``tuple of wire values -> JSON object text`` for a table schema.

    Straight-line code per schema that writes JSON text directly: a generic per-column
    loop, or building dicts for an encoder, costs more than everything else on the
    capture path, and this runs for every row of every event.
    """
    columns = list(columns)
    if not columns:
        return lambda row: "{}"
    indexes = list(range(len(columns))) if only is None else list(only)
    namespace = _namespace()
    body, fragments = _row_code(columns, options, namespace, "r", "")
    template = _object_template(columns, indexes, fragments, namespace, "k")
    lines = ["def convert(r):", *(f"    {line}" for line in body),
             f'    return f"{template}"']
    exec("\n".join(lines), namespace)
    convert: RowConverter = namespace["convert"]
    return convert


#: ``event -> (key JSON text or "null", value JSON text)``, as
#: :meth:`DebeziumJsonSerializer.key_and_value` returns them.
EventRenderer = Callable[[ChangeEvent], tuple[str, str]]


def compile_event_renderer(schema: TableSchema, options: DebeziumJsonOptions,
                           source_parts: Callable[[SourceContext, SnapshotMarker],
                                                  tuple[str, ...]],
                           ts_fields: Callable[[int], str],
                           transaction: Callable[[ChangeEvent], str],
                           general: EventRenderer, *, compiled: bool = True) -> EventRenderer:
    """Generate the key and value writer of one table schema's row events.

    One frame per event, with the before and after rows, the key (the key columns'
    fragments of the row already written) and the cached ``source`` block inline:
    the per-piece functions cost more in calls than in writing JSON. The pieces that
    change rarely come from the serializer's own code: *source_parts* (the ``source``
    block around the LSN), *ts_fields* (the value's ``ts_*`` fields and closing brace)
    and *transaction* (the ``transaction`` block, with transaction metadata). Events
    without an LSN go to *general* (the reference implementation, which the tests hold
    this code to).

    With *compiled* (and the C extension built), the same writer in C
    (:func:`compiled_event_renderer`), which the tests hold to this code's output.
    """
    columns = list(schema.columns)
    if compiled and COMPILED_RENDERER and columns:
        return compiled_event_renderer(schema, options, source_parts, ts_fields, transaction,
                                       general)
    namespace = _namespace()
    # The cache between events, a list because that is the cheapest mutable cell for
    # the generated code to read: [0] context and [1] snapshot marker of the last
    # event, [2:5] its source block around the LSN, [5] its timestamp, [6] its ts
    # fields, [7] whether the LSN goes into the source block (else [2] is all of it).
    state: list[Any] = [None, None, "", "", "", None, "", True]

    def refresh_source(context: SourceContext, snapshot: SnapshotMarker) -> None:
        parts = source_parts(context, snapshot)
        state[0:5] = [context, snapshot, *parts, "", ""][:5]
        state[7] = len(parts) == 3

    def refresh_ts(ts_us: int) -> None:
        state[5:7] = [ts_us, ts_fields(ts_us)]

    namespace.update(st=state, refresh_source=refresh_source, refresh_ts=refresh_ts,
                     general=general, tx=transaction)
    lines = [
        "def render(e):",
        "    lsn = e.lsn",
        "    if lsn is None:",
        "        return general(e)",
        "    context = e.context",
        "    snapshot = e.snapshot",
        "    if context is not st[0] or snapshot is not st[1]:",
        "        refresh_source(context, snapshot)",
        "    ts = e.ts_us",
        "    if ts != st[5]:",
        "        refresh_ts(ts)",
        "    op = e.op._value_",
    ]
    texts = {}
    for name, prefix in (("after", "a"), ("before", "b")):
        body, fragments = _row_code(columns, options, namespace, "row", prefix)
        template = _object_template(columns, range(len(columns)), fragments, namespace, "k")
        texts[name] = fragments
        lines += [f"    row = e.raw_{name}",
                  "    if row is None:",
                  f'        {name} = "null"',
                  "    else:",
                  *(f"        {line}" for line in body),
                  f'        {name} = f"{template}"']
    if schema.key_indexes:
        keys = schema.key_indexes
        before_key = _object_template(columns, keys, texts["before"], namespace, "kk")
        after_key = _object_template(columns, keys, texts["after"], namespace, "kk")
        lines += ['    if op == "d":',
                  f'        key = "null" if before == "null" else f"{before_key}"',
                  '    elif op == "t" or after == "null":',
                  '        key = "null"',
                  "    else:",
                  f'        key = f"{after_key}"']
    else:
        lines.append('    key = "null"')
    transaction_text = "{tx(e)}" if options.transaction_metadata else "null"
    lines += [
        '    source = f"{st[2]}{lsn}{st[3]}{lsn}{st[4]}" if st[7] else st[2]',
        '    return key, f\'{{"before":{before},"after":{after},"source":{source}'
        f',"transaction":{transaction_text},'
        '"op":"{op}",{st[6]}\'',
    ]
    exec("\n".join(lines), namespace)
    render: EventRenderer = namespace["render"]
    return render


def compiled_event_renderer(schema: TableSchema, options: DebeziumJsonOptions,
                            source_parts: Callable[[SourceContext, SnapshotMarker],
                                                   tuple[str, ...]],
                            ts_fields: Callable[[int], str],
                            transaction: Callable[[ChangeEvent], str],
                            general: EventRenderer) -> EventRenderer:
    """:func:`compile_event_renderer`'s writer in C (``tidemark.serde._render``), from
    the same per-column decisions; raises ImportError where the extension is not built.
    """
    if _CompiledRenderer is None:
        raise ImportError("tidemark.serde._render is not built (no C compiler at install?)")
    columns = schema.columns
    writers = [_column_writer(column, options) for column in columns]
    keys = schema.key_indexes
    return _CompiledRenderer(
        kinds=bytes(_compiled_kind(kind, function)[0] for kind, _, function, *_ in writers),
        params=bytes(_compiled_kind(kind, function)[1] for kind, _, function, *_ in writers),
        functions=tuple(function for _, _, function, _, _ in writers),
        names=tuple(_member_prefix(n, column.name) for n, column in enumerate(columns)),
        nulls=tuple(null_text for *_, null_text, _ in writers),
        placeholders=tuple(json_fragment(placeholder) for *_, placeholder in writers),
        key_indexes=tuple(keys),
        key_names=tuple(_member_prefix(n, columns[i].name) for n, i in enumerate(keys)),
        unavailable=UNAVAILABLE, binary=json_fragment, escape=_escape, general=general,
        source_parts=source_parts, ts_fields=ts_fields,
        transaction=transaction if options.transaction_metadata else None,
    )


def _member_prefix(position: int, name: str) -> str:
    """The JSON text before an object's member value: ``{"name":`` or ``,"name":``."""
    return ("{" if position == 0 else ",") + _escape(name) + ":"


class _Codec:
    __slots__ = ("_converters", "options", "render", "schema")

    def __init__(self, schema: TableSchema, serializer: DebeziumJsonSerializer) -> None:
        self.schema = schema
        self.options = options = serializer.options
        table = schema.table
        self.render = compile_event_renderer(
            schema, options,
            lambda context, snapshot: serializer._cached_source_parts(context, snapshot, table),
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
        self._parts_context: object = None
        self._parts: dict[tuple[TableId, SnapshotMarker], tuple[str, ...]] = {}
        self._heads: dict[tuple[Any, ...], str] = {}
        self._last_head: tuple[Any, ...] | None = None

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
        """The ``source`` block; only the LSN differs between events of a transaction,
        so the rest is built once per (transaction, table, snapshot marker)."""
        lsn = event.lsn
        parts = self._cached_source_parts(event.context, event.snapshot, table)
        if len(parts) == 1:
            return parts[0]
        head, middle, end = parts
        if lsn is None:
            return f'{head}null{middle}null{end}'.replace('"[null,\\"null\\"]"', "null")
        return f"{head}{lsn}{middle}{lsn}{end}"

    def _cached_source_parts(self, context: SourceContext, snapshot: SnapshotMarker,
                             table: TableId) -> tuple[str, ...]:
        if context.source_fields is not None:
            return (self._own_block(context, snapshot, table),)
        if context is not self._parts_context:
            self._parts_context = context
            self._parts.clear()
        parts = self._parts.get((table, snapshot))
        if parts is None:
            parts = self._parts[(table, snapshot)] = self._source_parts(context, snapshot,
                                                                        table)
        return parts

    def _ts_fields(self, ts_us: int) -> str:
        """The top-level ``ts_*`` fields and the value's closing brace."""
        if ts_us != self._ts:
            self._ts = ts_us
            self._ts_text = f'"ts_ms":{ts_us // 1000},"ts_us":{ts_us},"ts_ns":{ts_us * 1000}}}'
        return self._ts_text

    def _own_block(self, c: SourceContext, snapshot: SnapshotMarker, table: TableId) -> str:
        """The whole ``source`` block of a source with fields of its own: Debezium's
        common fields, ``table``, then ``source_fields`` in order. Such a source may make
        a context per event (MariaDB's ``row``), so the common part is kept per
        transaction and table, and the fields are written by msgspec in one call."""
        last = self._last_head
        if last is not None and last[0] is table and last[1] is snapshot \
                and last[2] == c.ts_us and last[3] is c.connector and last[4] is c.name \
                and last[5] is c.db:
            head: str = last[6]  # the previous event's: a transaction's events come together
        else:
            head = self._head(c, snapshot, table)
            self._last_head = (table, snapshot, c.ts_us, c.connector, c.name, c.db, head)
        fields = c.source_fields
        assert fields is not None
        # A Struct is written in its field order; pairs by way of a dict, in theirs.
        encoded = self._encoder.encode(
            fields if isinstance(fields, msgspec.Struct) else dict(fields))
        return head + encoded[1:].decode()

    def _head(self, c: SourceContext, snapshot: SnapshotMarker, table: TableId) -> str:
        """An own block's common fields and ``table``, up to its own fields."""
        key = (c.connector, c.name, c.ts_us, c.db, table, snapshot)
        head = self._heads.get(key)
        if head is None:
            ts = c.ts_us
            if len(self._heads) >= _HEADS_KEPT:
                self._heads.clear()
            head = self._heads[key] = (
                f'{{"version":"{SOURCE_VERSION}","connector":{_escape(c.connector)},'
                f'"name":{_escape(c.name)},"ts_ms":{ts // 1000},'
                f'"snapshot":"{snapshot.value}","db":{_escape(c.db)},"sequence":null,'
                f'"ts_us":{ts},"ts_ns":{ts * 1000},"table":{_escape(table.table)},')
        return head

    @staticmethod
    def _source_parts(c: SourceContext, snapshot: SnapshotMarker,
                      table: TableId) -> tuple[str, ...]:
        """The ``source`` block around the event's LSN (PostgreSQL's layout)."""
        ts = c.ts_us
        tail = f',"schema":{_escape(table.schema)},"table":{_escape(table.table)},'
        last = "null" if c.last_commit_lsn is None else f'\\"{c.last_commit_lsn}\\"'
        head = (
            f'{{"version":"{SOURCE_VERSION}","connector":{_escape(c.connector)},'
            f'"name":{_escape(c.name)},"ts_ms":{ts // 1000},'
            f'"snapshot":"{snapshot.value}","db":{_escape(c.db)},'
            f'"sequence":"[{last},\\"'
        )
        middle = (f'\\"]","ts_us":{ts},"ts_ns":{ts * 1000}{tail}'
                  f'"txId":{_null(c.txid)},"lsn":')
        origin = "null" if c.origin is None else _escape(c.origin)
        end = f',"xmin":null,"origin":{origin},"origin_lsn":null}}'
        return head, middle, end

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
            raise ValueError("stream_value_parts is for sources with the LSN in the block")
        head, middle, end = parts
        ts = self._ts_fields(ts_us)
        return head, middle, f'{end},"transaction":null,"op":"{op.value}",{ts}'

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


def _null(value: int | None) -> str:
    return "null" if value is None else str(value)
