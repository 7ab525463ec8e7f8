"""MariaDB column types -> tidemark's logical types, type names and Python values.

The mapping is Debezium's MySQL connector's (its defaults: ``bigint.unsigned.handling.mode
=long``, ``time.precision.mode=adaptive_time_microseconds``):

=====================================  ==================================================
MariaDB                                logical type (Debezium)
=====================================  ==================================================
tinyint, smallint (signed/unsigned)    int16; smallint unsigned int32
mediumint, int                         int32; int unsigned int64
bigint (signed/unsigned)               int64 (unsigned above 2^63-1 wraps to negative,
                                       as in Debezium's default long mode)
float / double                         float32 / float64
decimal(p, s)                          decimal(p, s)
bit(1) / bit(n)                        bool / bytes (io.debezium.data.Bits)
year                                   int32 (io.debezium.time.Year; 0000 is 0)
date                                   date
time(p)                                time(p) (MicroTime; may be negative or > 24 h)
datetime(p)                            timestamp(p) (Timestamp, MicroTimestamp)
timestamp(p)                           timestamptz(p) (ZonedTimestamp)
char, varchar, text (a charset)        string
binary, varbinary, blob                bytes
enum / set                             enum (io.debezium.data.Enum / EnumSet text)
json (MariaDB: longtext)               string
geometry                               bytes (WKB with SRID)
=====================================  ==================================================
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable
from decimal import Decimal
from typing import Any, Final

from tidemark import wire_text
from tidemark.event import Column
from tidemark.logical_type import Kind, LogicalType
from tidemark.source.mariadb import binlog as b
from tidemark.source.mariadb.column_readers import BINARY_CHARSET
from tidemark.source.mariadb.table_map import TableColumn

_INT_KINDS: Final = {
    (b.T_TINY, False): Kind.INT16, (b.T_TINY, True): Kind.INT16,
    (b.T_SHORT, False): Kind.INT16, (b.T_SHORT, True): Kind.INT32,
    (b.T_INT24, False): Kind.INT32, (b.T_INT24, True): Kind.INT32,
    (b.T_LONG, False): Kind.INT32, (b.T_LONG, True): Kind.INT64,
    (b.T_LONGLONG, False): Kind.INT64, (b.T_LONGLONG, True): Kind.INT64,
}
_INT_NAMES: Final = {b.T_TINY: "tinyint", b.T_SHORT: "smallint", b.T_INT24: "mediumint",
                     b.T_LONG: "int", b.T_LONGLONG: "bigint"}
_BLOB_NAMES: Final = {1: "tiny", 2: "", 3: "medium", 4: "long"}
_TIME: Final = re.compile(r"^(-?)(\d+):(\d\d):(\d\d)(?:\.(\d{1,6}))?$")


def _is_binary(column: TableColumn) -> bool:
    return column.charset == BINARY_CHARSET


def logical_type(column: TableColumn) -> LogicalType:
    """The logical type of a binlog column."""
    t = column.type
    kind = _INT_KINDS.get((t, column.unsigned))
    if kind is not None:
        return LogicalType(kind)
    if t == b.T_FLOAT:
        return LogicalType(Kind.FLOAT32)
    if t == b.T_DOUBLE:
        return LogicalType(Kind.FLOAT64)
    if t == b.T_NEWDECIMAL:
        return LogicalType(Kind.DECIMAL, precision=column.metadata >> 8,
                           scale=column.metadata & 0xFF)
    if t == b.T_BIT:
        return LogicalType(Kind.BOOL if column.metadata == 1 else Kind.BYTES)
    if t == b.T_YEAR:
        return LogicalType(Kind.INT32)
    if t in (b.T_DATE, b.T_NEWDATE):
        return LogicalType(Kind.DATE)
    if t in (b.T_TIME2, b.T_TIME):
        return LogicalType(Kind.TIME, precision=column.metadata if t == b.T_TIME2 else 0)
    if t in (b.T_DATETIME2, b.T_DATETIME):
        return LogicalType(Kind.TIMESTAMP, precision=column.metadata if t == b.T_DATETIME2
                           else 0)
    if t in (b.T_TIMESTAMP2, b.T_TIMESTAMP):
        return LogicalType(Kind.TIMESTAMPTZ, precision=column.metadata
                           if t == b.T_TIMESTAMP2 else 0)
    if t in (b.T_ENUM, b.T_SET):
        return LogicalType(Kind.ENUM)
    if t == b.T_GEOMETRY:
        return LogicalType(Kind.BYTES)
    return LogicalType(Kind.BYTES if _is_binary(column) else Kind.STRING)


def type_name(column: TableColumn) -> str:
    """A readable name of the column's type (``int unsigned``, ``decimal(10,2)``,
    ``datetime(3)``); the binlog does not carry lengths of character columns."""
    t, meta = column.type, column.metadata
    unsigned = " unsigned" if column.unsigned else ""
    if t in _INT_NAMES:
        return _INT_NAMES[t] + unsigned
    if t == b.T_NEWDECIMAL:
        return f"decimal({meta >> 8},{meta & 0xFF}){unsigned}"
    if t in (b.T_FLOAT, b.T_DOUBLE):
        return ("float" if t == b.T_FLOAT else "double") + unsigned
    if t == b.T_BIT:
        return f"bit({meta})"
    if t in (b.T_TIME2, b.T_DATETIME2, b.T_TIMESTAMP2):
        name = {b.T_TIME2: "time", b.T_DATETIME2: "datetime", b.T_TIMESTAMP2: "timestamp"}[t]
        return f"{name}({meta})" if meta else name
    simple = {b.T_YEAR: "year", b.T_DATE: "date", b.T_NEWDATE: "date", b.T_TIME: "time",
              b.T_DATETIME: "datetime", b.T_TIMESTAMP: "timestamp", b.T_ENUM: "enum",
              b.T_SET: "set", b.T_GEOMETRY: "geometry"}.get(t)
    if simple is not None:
        return simple
    if t in (b.T_VARCHAR, b.T_VAR_STRING):
        return "varbinary" if _is_binary(column) else "varchar"
    if t == b.T_STRING:
        return "binary" if _is_binary(column) else "char"
    size = _BLOB_NAMES.get(meta, "")
    return f"{size}blob" if _is_binary(column) else f"{size}text"


def parse_time(text: str) -> dt.timedelta:
    """A MariaDB ``time`` text (``-838:59:59.000000`` … ``838:59:59``) as a timedelta:
    it is a duration, which ``datetime.time`` cannot hold."""
    match = _TIME.match(text)
    if match is None:
        raise ValueError(f"invalid time value {text!r}")
    sign, hours, minutes, seconds, fraction = match.groups()
    value = dt.timedelta(hours=int(hours), minutes=int(minutes), seconds=int(seconds),
                         microseconds=int((fraction or "0").ljust(6, "0")))
    return -value if sign else value


def _parse_bool(text: str) -> bool:
    return text == "t"


def python_parser(column: TableColumn) -> Callable[[str], Any]:
    """From the column's text value to its native Python value."""
    logical = logical_type(column)
    kind = logical.kind
    if kind in (Kind.INT16, Kind.INT32, Kind.INT64):
        return int
    if kind in (Kind.FLOAT32, Kind.FLOAT64):
        return float
    if kind is Kind.DECIMAL:
        return Decimal
    if kind is Kind.BOOL:
        return _parse_bool
    if kind is Kind.DATE:
        return wire_text.parse_date
    if kind is Kind.TIME:
        return parse_time
    if kind is Kind.TIMESTAMP:
        return wire_text.parse_timestamp
    if kind is Kind.TIMESTAMPTZ:
        return wire_text.parse_timestamptz
    return str


def table_column(column: TableColumn, is_key: bool) -> Column:
    """tidemark's :class:`Column` for a binlog column."""
    return Column(column.name, logical_type(column), type_name(column), is_key,
                  python_parser(column), column.nullable)
