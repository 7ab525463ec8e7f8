"""Logical column types -> Spark types, and whole-column conversion of their text.

Sources hand over every value as the canonical text of its logical type
(:mod:`tidemark.wire_text`: ISO dates, UTC). A column's values are converted together:
one Arrow ``cast`` from strings where Arrow parses that text exactly (integers, floats,
fixed decimals, dates, timestamps), which costs far less than a Python call per value;
values Arrow rejects (``infinity``, BC dates, ``NaN`` in a decimal column) fall back to
the per-value parsers of :mod:`tidemark.wire_text`. For PostgreSQL's types:

=====================================  ==================================================
PostgreSQL                             Spark
=====================================  ==================================================
smallint / integer / bigint / oid      short / int / long / long
real / double precision                float / double
numeric(p, s), p <= 38, s >= 0         decimal(p, s)
numeric (no typmod, or p > 38)         string (exact text; Spark decimals stop at 38)
boolean                                boolean
date                                   date
timestamp with time zone               timestamp (UTC instant)
timestamp without time zone            timestamp_ntz
bytea                                  binary
text, varchar, char, name, enums       string
uuid, json, jsonb, interval, time,     string (PostgreSQL's text; interval in ISO 8601,
timetz, money, inet, cidr, macaddr,    e.g. ``P1DT2H``)
bit, xml, ranges, extension types
one-dimensional arrays of the above    array<element type> (box[] stays a string)
=====================================  ==================================================

Values Spark cannot hold become null with a warning: ``infinity``/``-infinity``
timestamps and dates map to the largest/smallest value Python holds (as
:mod:`~tidemark.wire_text` documents), ``NaN``/``Infinity`` in a decimal
column and BC dates are null. Multi-dimensional arrays are not supported in typed
tables (use the envelope stream).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any, Final, TypeAlias

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    TimestampNTZType,
    TimestampType,
)

from tidemark import wire_text as wt
from tidemark.logical_type import Kind, LogicalType

log = logging.getLogger(__name__)

#: One column's text values: a list (None = NULL) or an Arrow string array.
Texts: TypeAlias = Sequence[str | None] | pa.StringArray
Converter: TypeAlias = Callable[[Texts], pa.Array]

_MAX_DECIMAL_PRECISION: Final = 38

_SCALAR: Final[dict[Kind, DataType]] = {
    Kind.INT16: ShortType(),
    Kind.INT32: IntegerType(),
    Kind.INT64: LongType(),
    Kind.FLOAT32: FloatType(),
    Kind.FLOAT64: DoubleType(),
    Kind.BOOL: BooleanType(),
    Kind.DATE: DateType(),
    Kind.TIMESTAMPTZ: TimestampType(),
    Kind.TIMESTAMP: TimestampNTZType(),
    Kind.BYTES: BinaryType(),
}

# Per-value parsers for the fallback path, keyed by Spark type name.
_FALLBACK: Final[dict[str, Callable[[str], object]]] = {
    "short": int, "integer": int, "long": int, "float": float, "double": float,
    "date": wt.parse_date, "timestamp": wt.parse_timestamptz,
    "timestamp_ntz": wt.parse_timestamp, "boolean": wt.parse_bool,
}  # fmt: skip


def spark_type(logical: LogicalType) -> DataType:
    """The Spark type of a column of logical type *logical*. Types Spark has no exact
    counterpart for (time, interval, uuid, json, decimals wider than 38 digits or without
    a declared precision) are strings of their text."""
    scalar = _SCALAR.get(logical.kind)
    if scalar is not None:
        return scalar
    if logical.kind is Kind.ARRAY and logical.element is not None:
        return ArrayType(spark_type(logical.element), containsNull=True)
    if logical.fixed_decimal and \
            0 <= logical.scale <= logical.precision <= _MAX_DECIMAL_PRECISION:
        return DecimalType(logical.precision, logical.scale)
    return StringType()


def converter(dtype: DataType, arrow_type: pa.DataType) -> Converter:
    """A function turning one column's text values (None = NULL) into an Arrow array.

    *dtype* is the column's Spark type (:func:`spark_type`) and *arrow_type* its Arrow
    form as pyspark builds it (``to_arrow_schema``), so that the arrays match the schema
    Spark checks exactly. The Spark type alone decides the conversion, so executors
    need nothing but the stream's schema.
    """
    if isinstance(dtype, StringType):
        return _strings
    if isinstance(dtype, BooleanType):
        return _bool_column
    if isinstance(dtype, BinaryType):
        return lambda texts: pa.array([_binary(t) for t in _values(texts)], pa.binary())
    if isinstance(dtype, ArrayType):
        parse_element = _element_parser(dtype.elementType)
        return lambda texts: _array_column(texts, parse_element, arrow_type)
    if isinstance(dtype, DecimalType):
        return lambda texts: _cast_column(texts, arrow_type, _decimal_or_none, "decimal")
    name = dtype.typeName()
    fallback = _FALLBACK.get(name)
    if fallback is None:
        raise TypeError(f"no conversion from text to Spark {name}")
    return lambda texts: _cast_column(texts, arrow_type, fallback, name)


def _binary(value: str | bytes | None) -> bytes | None:
    # PostgreSQL's bytea arrives as its hex text, a MariaDB binary string as bytes.
    if value is None or isinstance(value, bytes):
        return value
    return wt.parse_bytea(value)


def _strings(texts: Texts) -> pa.Array:
    return texts if isinstance(texts, pa.Array) else pa.array(texts, pa.string())


def _values(texts: Texts) -> Sequence[str | None]:
    return texts.to_pylist() if isinstance(texts, pa.Array) else texts


def _bool_column(texts: Texts) -> pa.Array:
    return pc.equal(_strings(texts), "t")


def _cast_column(texts: Texts, arrow_type: pa.DataType, parse: Callable[[str], object],
                 type_name: str) -> pa.Array:
    try:
        return _strings(texts).cast(arrow_type)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        # Rare values Arrow's parsers reject ('infinity', BC dates, NaN decimals): parse
        # this column value by value instead.
        return pa.array([_parse_or_none(t, parse, type_name) for t in _values(texts)],
                        arrow_type)


_warned: set[str] = set()


def _parse_or_none(text: str | None, parse: Callable[[str], object], type_name: str) -> object:
    if text is None:
        return None
    try:
        value = parse(text)
    except (ValueError, ArithmeticError):
        value = None
    if value is None and type_name not in _warned:
        # Warn once per type and process: one bad value often comes with many.
        _warned.add(type_name)
        log.warning("a %s value Spark cannot represent (%r) becomes null", type_name, text)
    return value


def _decimal_or_none(text: str) -> Decimal | None:
    value = Decimal(text)
    return value if value.is_finite() else None


def _element_parser(element_type: DataType) -> Callable[[str], object]:
    if isinstance(element_type, StringType):
        return str
    if isinstance(element_type, DecimalType):
        return _decimal_or_none
    if isinstance(element_type, BinaryType):
        return wt.parse_bytea
    return _FALLBACK[element_type.typeName()]


def _array_column(texts: Texts, parse_element: Callable[[str], object],
                  arrow_type: pa.DataType) -> pa.Array:
    values: list[Any] = []
    for text in _values(texts):
        if text is None:
            values.append(None)
            continue
        items = wt.parse_array(text, parse_element)
        if any(isinstance(item, list) for item in items):
            raise ValueError(f"multi-dimensional array {text[:60]!r} is not supported in "
                             "typed tables; read it through the envelope stream")
        values.append(items)
    return pa.array(values, arrow_type)
