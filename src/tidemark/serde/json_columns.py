"""How each column of a table becomes Debezium JSON: the mapping of a logical type to
its converter, the serializer's options, and the per-column decisions (inline template,
function, null text, placeholder, compiled-writer kind) that both the generated Python
writer and the C writer (``_render.c``) are built from.
"""

from __future__ import annotations

import json.encoder as json_encoder
from base64 import b64encode
from collections.abc import Callable
from typing import Any, Final

import msgspec

from tidemark import wire_text as wt
from tidemark.event import Column
from tidemark.logical_type import FLOAT_KINDS, INTEGER_KINDS, Kind, LogicalType
from tidemark.serde.json_values import (
    UNAVAILABLE_PLACEHOLDER,
    _bytea,
    _date_days,
    _date_fragment,
    _decimal_fragment,
    _fixed_scale_decimal,
    _float_value,
    _interval_micros,
    _interval_string,
    _java_double_text,
    _money_decimal,
    _numeric_string,
    _numeric_string_fallback,
    _timestamp_micros,
    _timestamp_millis,
    _variable_scale_decimal,
    _zoned_time,
    _zoned_timestamp,
    _zoned_timestamp_fragment,
    java_float_text,
)
from tidemark.serde.modes import DecimalHandlingMode, TimePrecisionMode


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
    cells: bool | None = None
    """Non-key columns as ScyllaDB's cells: ``{"value": …}`` for a value set,
    ``{"value": null}`` for one set to NULL, ``null`` for one left unchanged
    (:data:`~tidemark.event.UNAVAILABLE`) — the log-table sources' format. None: the
    source's default, which the engine resolves at start (:meth:`for_source`: cells on
    log tables, whose updates leave columns unset, plain values elsewhere); read
    unresolved, None writes plain values."""

    def for_source(self, cells_by_default: bool,
                   time_precision_mode: TimePrecisionMode | None = None) -> DebeziumJsonOptions:
        """These options with the source's default where they left it to the source
        (``self`` when nothing was left): cells, and the source's *time_precision_mode*
        where these options keep the default (the mode is a connector setting in
        Debezium: a MariaDB connector's ``adaptive_time_microseconds`` holds for every
        converter of its events)."""
        changes: dict[str, Any] = {}
        if self.cells is None:
            changes["cells"] = cells_by_default
        if (time_precision_mode is not None
                and self.time_precision_mode is TimePrecisionMode.ADAPTIVE
                and time_precision_mode is not TimePrecisionMode.ADAPTIVE):
            changes["time_precision_mode"] = time_precision_mode
        return msgspec.structs.replace(self, **changes) if changes else self


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


