"""PostgreSQL's built-in types: their OIDs, their logical types, their Python parsers.

Column values arrive from pgoutput (and from snapshot queries) as the server's text
output, which under tidemark's session settings is already the canonical text of each
logical type (:mod:`tidemark.wire_text`, whose parsers are re-exported here). What is
PostgreSQL's own lives here: the type OIDs, :func:`logical_type` (an OID and type
modifier to a :class:`~tidemark.logical_type.LogicalType`), :func:`python_parser` (to a
native Python value, including the types no other source has: ``inet``, ``cidr``,
``box`` arrays …) and :func:`pg_column`, which builds a column from the catalog's or the
Relation message's description.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from decimal import Decimal
from functools import partial
from typing import Final
from uuid import UUID

from tidemark.event import Column
from tidemark.logical_type import Kind, LogicalType, array_of
from tidemark.wire_text import (
    INTERVAL_NEG_INFINITY,
    INTERVAL_POS_INFINITY,
    InetValue,
    Interval,
    date_to_epoch_days,
    interval_to_micros,
    parse_array,
    parse_bool,
    parse_bytea,
    parse_cidr,
    parse_date,
    parse_float,
    parse_inet,
    parse_int,
    parse_interval,
    parse_money,
    parse_numeric,
    parse_time,
    parse_timestamp,
    parse_timestamptz,
    parse_timetz,
    parse_uuid,
    time_to_micros,
    timestamp_to_epoch_micros,
    timestamptz_to_epoch_micros,
)

__all__ = [
    "ARRAY_ELEMENT_OID",
    "BIT_ARRAY_OID",
    "BIT_OID",
    "BOOL_ARRAY_OID",
    "BOOL_OID",
    "BOX_ARRAY_OID",
    "BOX_OID",
    "BPCHAR_ARRAY_OID",
    "BPCHAR_OID",
    "BYTEA_ARRAY_OID",
    "BYTEA_OID",
    "CHAR_ARRAY_OID",
    "CHAR_OID",
    "CIDR_ARRAY_OID",
    "CIDR_OID",
    "DATE_ARRAY_OID",
    "DATE_OID",
    "FLOAT4_ARRAY_OID",
    "FLOAT4_OID",
    "FLOAT8_ARRAY_OID",
    "FLOAT8_OID",
    "INET_ARRAY_OID",
    "INET_OID",
    "INT2_ARRAY_OID",
    "INT2_OID",
    "INT4_ARRAY_OID",
    "INT4_OID",
    "INT8_ARRAY_OID",
    "INT8_OID",
    "INTERVAL_ARRAY_OID",
    "INTERVAL_NEG_INFINITY",
    "INTERVAL_OID",
    "INTERVAL_POS_INFINITY",
    "JSONB_ARRAY_OID",
    "JSONB_OID",
    "JSON_ARRAY_OID",
    "JSON_OID",
    "MACADDR_ARRAY_OID",
    "MACADDR_OID",
    "MONEY_ARRAY_OID",
    "MONEY_OID",
    "NAME_ARRAY_OID",
    "NAME_OID",
    "NUMERIC_ARRAY_OID",
    "NUMERIC_OID",
    "OID_ARRAY_OID",
    "OID_OID",
    "TEXT_ARRAY_OID",
    "TEXT_OID",
    "TIMESTAMPTZ_ARRAY_OID",
    "TIMESTAMPTZ_OID",
    "TIMESTAMP_ARRAY_OID",
    "TIMESTAMP_OID",
    "TIMETZ_ARRAY_OID",
    "TIMETZ_OID",
    "TIME_ARRAY_OID",
    "TIME_OID",
    "UUID_ARRAY_OID",
    "UUID_OID",
    "VARBIT_ARRAY_OID",
    "VARBIT_OID",
    "VARCHAR_ARRAY_OID",
    "VARCHAR_OID",
    "XML_ARRAY_OID",
    "XML_OID",
    "InetValue",
    "Interval",
    "date_to_epoch_days",
    "interval_to_micros",
    "logical_type",
    "numeric_precision_scale",
    "parse_array",
    "parse_bool",
    "parse_bytea",
    "parse_cidr",
    "parse_date",
    "parse_float",
    "parse_inet",
    "parse_int",
    "parse_interval",
    "parse_money",
    "parse_numeric",
    "parse_time",
    "parse_timestamp",
    "parse_timestamptz",
    "parse_timetz",
    "parse_uuid",
    "pg_column",
    "python_parser",
    "time_to_micros",
    "timestamp_to_epoch_micros",
    "timestamptz_to_epoch_micros",
]

# -- type OIDs (pg_type.oid of the built-in types; stable across server versions) ----
BOOL_OID: Final = 16
BYTEA_OID: Final = 17
CHAR_OID: Final = 18
NAME_OID: Final = 19
INT8_OID: Final = 20
INT2_OID: Final = 21
INT4_OID: Final = 23
TEXT_OID: Final = 25
OID_OID: Final = 26
JSON_OID: Final = 114
XML_OID: Final = 142
BOX_OID: Final = 603
CIDR_OID: Final = 650
FLOAT4_OID: Final = 700
FLOAT8_OID: Final = 701
MONEY_OID: Final = 790
MACADDR_OID: Final = 829
INET_OID: Final = 869
BPCHAR_OID: Final = 1042
VARCHAR_OID: Final = 1043
DATE_OID: Final = 1082
TIME_OID: Final = 1083
TIMESTAMP_OID: Final = 1114
TIMESTAMPTZ_OID: Final = 1184
INTERVAL_OID: Final = 1186
TIMETZ_OID: Final = 1266
BIT_OID: Final = 1560
VARBIT_OID: Final = 1562
NUMERIC_OID: Final = 1700
UUID_OID: Final = 2950
JSONB_OID: Final = 3802

BOOL_ARRAY_OID: Final = 1000
BYTEA_ARRAY_OID: Final = 1001
CHAR_ARRAY_OID: Final = 1002
NAME_ARRAY_OID: Final = 1003
INT8_ARRAY_OID: Final = 1016
INT2_ARRAY_OID: Final = 1005
INT4_ARRAY_OID: Final = 1007
TEXT_ARRAY_OID: Final = 1009
OID_ARRAY_OID: Final = 1028
JSON_ARRAY_OID: Final = 199
XML_ARRAY_OID: Final = 143
BOX_ARRAY_OID: Final = 1020
CIDR_ARRAY_OID: Final = 651
FLOAT4_ARRAY_OID: Final = 1021
FLOAT8_ARRAY_OID: Final = 1022
MONEY_ARRAY_OID: Final = 791
MACADDR_ARRAY_OID: Final = 1040
INET_ARRAY_OID: Final = 1041
BPCHAR_ARRAY_OID: Final = 1014
VARCHAR_ARRAY_OID: Final = 1015
DATE_ARRAY_OID: Final = 1182
TIME_ARRAY_OID: Final = 1183
TIMESTAMP_ARRAY_OID: Final = 1115
TIMESTAMPTZ_ARRAY_OID: Final = 1185
INTERVAL_ARRAY_OID: Final = 1187
TIMETZ_ARRAY_OID: Final = 1270
BIT_ARRAY_OID: Final = 1561
VARBIT_ARRAY_OID: Final = 1563
NUMERIC_ARRAY_OID: Final = 1231
UUID_ARRAY_OID: Final = 2951
JSONB_ARRAY_OID: Final = 3807

#: Array type OID -> element type OID (``pg_type.typelem``) for the built-in arrays.
ARRAY_ELEMENT_OID: Final[Mapping[int, int]] = {
    BOOL_ARRAY_OID: BOOL_OID,
    BYTEA_ARRAY_OID: BYTEA_OID,
    CHAR_ARRAY_OID: CHAR_OID,
    NAME_ARRAY_OID: NAME_OID,
    INT8_ARRAY_OID: INT8_OID,
    INT2_ARRAY_OID: INT2_OID,
    INT4_ARRAY_OID: INT4_OID,
    TEXT_ARRAY_OID: TEXT_OID,
    OID_ARRAY_OID: OID_OID,
    JSON_ARRAY_OID: JSON_OID,
    XML_ARRAY_OID: XML_OID,
    BOX_ARRAY_OID: BOX_OID,
    CIDR_ARRAY_OID: CIDR_OID,
    FLOAT4_ARRAY_OID: FLOAT4_OID,
    FLOAT8_ARRAY_OID: FLOAT8_OID,
    MONEY_ARRAY_OID: MONEY_OID,
    MACADDR_ARRAY_OID: MACADDR_OID,
    INET_ARRAY_OID: INET_OID,
    BPCHAR_ARRAY_OID: BPCHAR_OID,
    VARCHAR_ARRAY_OID: VARCHAR_OID,
    DATE_ARRAY_OID: DATE_OID,
    TIME_ARRAY_OID: TIME_OID,
    TIMESTAMP_ARRAY_OID: TIMESTAMP_OID,
    TIMESTAMPTZ_ARRAY_OID: TIMESTAMPTZ_OID,
    INTERVAL_ARRAY_OID: INTERVAL_OID,
    TIMETZ_ARRAY_OID: TIMETZ_OID,
    BIT_ARRAY_OID: BIT_OID,
    VARBIT_ARRAY_OID: VARBIT_OID,
    NUMERIC_ARRAY_OID: NUMERIC_OID,
    UUID_ARRAY_OID: UUID_OID,
    JSONB_ARRAY_OID: JSONB_OID,
}

# box is the only built-in type whose array delimiter (pg_type.typdelim) is not ','
# (box text itself contains commas: '(1,1),(0,0)').
_ARRAY_DELIMITER: Final[Mapping[int, str]] = {BOX_OID: ";"}

# -- dispatch -------------------------------------------------------------------------
# Built-ins rather than the parse_* wrappers where they are the same function: the
# parser runs once per column value, and a Python-level wrapper call costs more than
# the conversion itself.
_SCALAR_PARSERS: Final[Mapping[int, Callable[[str], object]]] = {
    BOOL_OID: parse_bool,
    BYTEA_OID: parse_bytea,
    CHAR_OID: str,
    NAME_OID: str,
    INT8_OID: int,
    INT2_OID: int,
    INT4_OID: int,
    TEXT_OID: str,
    OID_OID: int,
    # JSON stays text: decoding would change number precision and (for json) key
    # order and duplicates; Debezium also emits it as a string.
    JSON_OID: str,
    JSONB_OID: str,
    XML_OID: str,
    BOX_OID: str,
    CIDR_OID: parse_cidr,
    FLOAT4_OID: float,
    FLOAT8_OID: float,
    MONEY_OID: parse_money,
    MACADDR_OID: str,
    INET_OID: parse_inet,
    BPCHAR_OID: str,
    VARCHAR_OID: str,
    DATE_OID: parse_date,
    TIME_OID: parse_time,
    TIMESTAMP_OID: parse_timestamp,
    TIMESTAMPTZ_OID: parse_timestamptz,
    INTERVAL_OID: parse_interval,
    TIMETZ_OID: parse_timetz,
    BIT_OID: str,
    VARBIT_OID: str,
    NUMERIC_OID: Decimal,
    UUID_OID: UUID,
}


def python_parser(type_oid: int, type_modifier: int) -> Callable[[str], object]:
    """The function turning a column's text value into its native Python value.

    Arrays of built-in types parse to (nested) lists of their element type. Types
    without a parser here (enums, domains, ranges, extension types such as PostGIS)
    return the text unchanged. *type_modifier* (the column's ``atttypmod``) is accepted
    so callers can pass what the Relation message carries; no parser needs it yet.
    """
    scalar = _SCALAR_PARSERS.get(type_oid)
    if scalar is not None:
        return scalar
    element_oid = ARRAY_ELEMENT_OID.get(type_oid)
    if element_oid is not None:
        return partial(
            parse_array,
            element_parser=_SCALAR_PARSERS[element_oid],
            delimiter=_ARRAY_DELIMITER.get(element_oid, ","),
        )
    return str



_NUMERIC_TYPMOD_OFFSET: Final = 4  # VARHDRSZ: atttypmod = ((p << 16) | s) + 4

_SCALAR_KINDS: Final[Mapping[int, Kind]] = {
    INT2_OID: Kind.INT16, INT4_OID: Kind.INT32, INT8_OID: Kind.INT64, OID_OID: Kind.INT64,
    FLOAT4_OID: Kind.FLOAT32, FLOAT8_OID: Kind.FLOAT64, BOOL_OID: Kind.BOOL,
    MONEY_OID: Kind.MONEY, DATE_OID: Kind.DATE, INTERVAL_OID: Kind.INTERVAL,
    BYTEA_OID: Kind.BYTES, JSON_OID: Kind.JSON, JSONB_OID: Kind.JSON, UUID_OID: Kind.UUID,
}
_TIME_KINDS: Final[Mapping[int, Kind]] = {
    TIME_OID: Kind.TIME, TIMETZ_OID: Kind.TIMETZ, TIMESTAMP_OID: Kind.TIMESTAMP,
    TIMESTAMPTZ_OID: Kind.TIMESTAMPTZ,
}


def numeric_precision_scale(type_modifier: int) -> tuple[int, int] | None:
    """(precision, scale) of a ``numeric`` column's typmod; None when unconstrained.
    PostgreSQL 15 stores the scale as an 11-bit signed number: it may be negative."""
    if type_modifier < _NUMERIC_TYPMOD_OFFSET:
        return None
    raw = type_modifier - _NUMERIC_TYPMOD_OFFSET
    return (raw >> 16) & 0xFFFF, ((raw & 0x7FF) ^ 1024) - 1024


def logical_type(type_oid: int, type_modifier: int) -> LogicalType:
    """The logical type of a column whose decoding type is *type_oid* (the built-in type
    whose text form it shares: a domain's base type, ``text`` for enums) and whose
    ``atttypmod`` is *type_modifier*. Types without a closer logical type (text, varchar,
    xml, inet, enums, ranges, extension types, ``box[]`` whose array text splits on
    ``;``) are strings of their text."""
    kind = _SCALAR_KINDS.get(type_oid)
    if kind is not None:
        return LogicalType(kind)
    kind = _TIME_KINDS.get(type_oid)
    if kind is not None:
        return LogicalType(kind, precision=type_modifier if type_modifier >= 0 else -1)
    if type_oid == NUMERIC_OID:
        declared = numeric_precision_scale(type_modifier)
        if declared is None:
            return LogicalType(Kind.DECIMAL)
        return LogicalType(Kind.DECIMAL, precision=declared[0], scale=declared[1])
    element_oid = ARRAY_ELEMENT_OID.get(type_oid)
    if element_oid is not None and element_oid not in _ARRAY_DELIMITER:
        # An array column's typmod is its element's (numeric(10,2)[]).
        return array_of(logical_type(element_oid, type_modifier))
    return LogicalType(Kind.STRING)


def pg_column(name: str, type_oid: int, type_modifier: int, type_name: str = "",
              is_key: bool = False, nullable: bool = True) -> Column:
    """A :class:`Column` of decoding type *type_oid* (see :func:`logical_type`)."""
    return Column(name, logical_type(type_oid, type_modifier), type_name, is_key,
                  python_parser(type_oid, type_modifier), nullable)
