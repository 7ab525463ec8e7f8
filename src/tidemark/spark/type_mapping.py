"""PostgreSQL column types -> Spark types, and whole-column conversion of pgoutput text.

pgoutput sends every value as the text PostgreSQL's output function prints (with the
session settings of :mod:`tidemark.source.postgres.session`: ISO dates, UTC). A
column's values are converted together: one Arrow ``cast`` from strings where Arrow
parses PostgreSQL's text exactly (integers, floats, ``numeric(p,s)``, dates,
timestamps), which costs far less than a Python call per value; values Arrow rejects
(``infinity``, BC dates, ``NaN`` in a decimal column) fall back to the per-value parsers
of :mod:`tidemark.source.postgres.types`.

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
:mod:`~tidemark.source.postgres.types` documents), ``NaN``/``Infinity`` in a decimal
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

from tidemark.source.postgres import types as pg

log = logging.getLogger(__name__)

#: One column's text values: a list (None = NULL) or an Arrow string array.
Texts: TypeAlias = Sequence[str | None] | pa.StringArray
Converter: TypeAlias = Callable[[Texts], pa.Array]

_MAX_DECIMAL_PRECISION: Final = 38
_NUMERIC_TYPMOD_OFFSET: Final = 4  # VARHDRSZ: atttypmod = ((p << 16) | s) + 4

_SCALAR: Final[dict[int, DataType]] = {
    pg.INT2_OID: ShortType(),
    pg.INT4_OID: IntegerType(),
    pg.INT8_OID: LongType(),
    pg.OID_OID: LongType(),
    pg.FLOAT4_OID: FloatType(),
    pg.FLOAT8_OID: DoubleType(),
    pg.BOOL_OID: BooleanType(),
    pg.DATE_OID: DateType(),
    pg.TIMESTAMPTZ_OID: TimestampType(),
    pg.TIMESTAMP_OID: TimestampNTZType(),
    pg.BYTEA_OID: BinaryType(),
}

# Per-value parsers for the fallback path, keyed by Spark type name.
_FALLBACK: Final[dict[str, Callable[[str], object]]] = {
    "short": int, "integer": int, "long": int, "float": float, "double": float,
    "date": pg.parse_date, "timestamp": pg.parse_timestamptz,
    "timestamp_ntz": pg.parse_timestamp, "boolean": pg.parse_bool,
}  # fmt: skip


def numeric_precision_scale(type_modifier: int) -> tuple[int, int] | None:
    """(precision, scale) of a ``numeric`` column's typmod; None when unconstrained."""
    if type_modifier < _NUMERIC_TYPMOD_OFFSET:
        return None
    raw = type_modifier - _NUMERIC_TYPMOD_OFFSET
    precision = (raw >> 16) & 0xFFFF
    scale = raw & 0x7FF
    if scale & 0x400:  # PostgreSQL 15 allows negative scales (11-bit two's complement)
        scale -= 0x800
    return precision, scale


def spark_type(type_oid: int, type_modifier: int) -> DataType:
    """The Spark type of a column whose decoding type OID is *type_oid*.

    *type_oid* is the built-in type whose text form the column shares (a domain's base
    type, ``text`` for enums), as :func:`tidemark.source.postgres.catalog.type_info`
    returns; *type_modifier* is ``atttypmod``.
    """
    scalar = _SCALAR.get(type_oid)
    if scalar is not None:
        return scalar
    if type_oid == pg.NUMERIC_OID:
        return _decimal_type(type_modifier) or StringType()
    element = pg.ARRAY_ELEMENT_OID.get(type_oid)
    if element is not None and element != pg.BOX_OID:
        return ArrayType(spark_type(element, type_modifier), containsNull=True)
    return StringType()


def _decimal_type(type_modifier: int) -> DecimalType | None:
    ps = numeric_precision_scale(type_modifier)
    if ps is None:
        return None
    precision, scale = ps
    if precision > _MAX_DECIMAL_PRECISION or scale < 0 or scale > precision:
        return None
    return DecimalType(precision, scale)


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
        return lambda texts: pa.array([None if t is None else pg.parse_bytea(t)
                                       for t in _values(texts)], pa.binary())
    if isinstance(dtype, ArrayType):
        parse_element = _element_parser(dtype.elementType)
        return lambda texts: _array_column(texts, parse_element, arrow_type)
    if isinstance(dtype, DecimalType):
        return lambda texts: _cast_column(texts, arrow_type, _decimal_or_none, "decimal")
    name = dtype.typeName()
    fallback = _FALLBACK.get(name)
    if fallback is None:
        raise TypeError(f"no conversion from PostgreSQL text to Spark {name}")
    return lambda texts: _cast_column(texts, arrow_type, fallback, name)


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
        return pg.parse_bytea
    return _FALLBACK[element_type.typeName()]


def _array_column(texts: Texts, parse_element: Callable[[str], object],
                  arrow_type: pa.DataType) -> pa.Array:
    values: list[Any] = []
    for text in _values(texts):
        if text is None:
            values.append(None)
            continue
        items = pg.parse_array(text, parse_element)
        if any(isinstance(item, list) for item in items):
            raise ValueError(f"multi-dimensional array {text[:60]!r} is not supported in "
                             "typed tables; read it through the envelope stream")
        values.append(items)
    return pa.array(values, arrow_type)
