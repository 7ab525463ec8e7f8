"""SQLite's loosely declared types as tidemark's logical types and wire text.

A column maps to a logical type by its declared type's affinity (``INTEGER`` → int64,
``REAL`` → float64, ``TEXT`` → string, ``BLOB`` → bytes, ``BOOLEAN`` → bool,
``NUMERIC``/``DECIMAL`` → a decimal of variable scale). A stored value of another type
than its column's (SQLite allows ``'abc'`` in an INTEGER column unless the table is
STRICT) is an error naming it (:func:`wire_value`).
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from tidemark import wire_text
from tidemark.errors import ConfigError, SourceError
from tidemark.event import Column, TableId, TableSchema, WireValue
from tidemark.logical_type import Kind, LogicalType
from tidemark.source.logtable import sqlite_install as install


def logical_type(declared: str) -> LogicalType:
    upper = declared.upper()
    if "INT" in upper:
        return LogicalType(Kind.INT64)
    if "BOOL" in upper:
        return LogicalType(Kind.BOOL)
    if any(word in upper for word in ("CHAR", "CLOB", "TEXT")):
        return LogicalType(Kind.STRING)
    if "BLOB" in upper or not upper:
        return LogicalType(Kind.BYTES)
    if any(word in upper for word in ("REAL", "FLOA", "DOUB")):
        return LogicalType(Kind.FLOAT64)
    if "DEC" in upper or "NUMERIC" in upper:
        return LogicalType(Kind.DECIMAL)
    return LogicalType(Kind.STRING)  # DATE, DATETIME, JSON …: stored as text


_PARSERS: dict[Kind, Callable[[str], Any]] = {
    Kind.INT64: wire_text.parse_int, Kind.BOOL: wire_text.parse_bool,
    Kind.FLOAT64: wire_text.parse_float, Kind.DECIMAL: wire_text.parse_numeric,
    Kind.BYTES: wire_text.parse_bytea, Kind.STRING: str,
}


def table_schema(conn: sqlite3.Connection, table: str) -> TableSchema:
    """*table*'s columns as tidemark sees them; raises ConfigError if it is missing or
    has no primary key."""
    columns = install.table_columns(conn, table)
    if not columns:
        raise ConfigError("tables", f"table {table!r} does not exist")
    keys = install.key_columns(conn, table)
    if not keys:
        raise ConfigError("tables", f"table {table!r} has no primary key; declare one")
    out = []
    for name, declared, _ in columns:
        logical = logical_type(declared)
        out.append(Column(name, logical, declared.lower() or "blob", name in keys,
                          _PARSERS[logical.kind]))
    names = [c.name for c in out]
    return TableSchema(TableId("main", table), tuple(out), tuple(names.index(k) for k in keys),
                       "default")


_INT64_LIMIT = 2**63


def _numeric_text(value: Decimal) -> str:
    """A decimal in PostgreSQL's numeric text, the form every serializer reads: plain
    digits, never an exponent (``1e+20`` and ``1E-5`` are stored text and REAL values'
    shortest forms), no negative zero, and ``NaN``/``Infinity``/``-Infinity`` for the
    special values."""
    if value.is_nan():
        return "NaN"
    if value.is_infinite():
        return "-Infinity" if value < 0 else "Infinity"
    return format(value.copy_abs() if value.is_zero() else value, "f")


def wire_value(kind: Kind, value: Any, table: str, column: str, time: int) -> WireValue:
    """A stored value as the canonical wire text of its column's logical type."""
    cls = value.__class__
    if kind is Kind.INT64:
        if cls is int:
            return str(value)
        if cls is float and value.is_integer() and -_INT64_LIMIT <= value < _INT64_LIMIT:
            return str(int(value))
    elif kind is Kind.STRING:
        if cls is str:
            return value  # type: ignore[no-any-return]
        if cls in (int, float):
            return str(value)
        if cls is bytes:
            return value.decode("utf-8", "replace")  # type: ignore[no-any-return]
    elif kind is Kind.FLOAT64:
        if cls in (int, float):
            number = float(value)
            if math.isnan(number):
                return "NaN"
            if math.isinf(number):
                return "Infinity" if number > 0 else "-Infinity"
            return repr(number)
    elif kind is Kind.BYTES:
        if cls is bytes:
            return "\\x" + str(value.hex())
        if cls is str:
            return "\\x" + str(value.encode().hex())
    elif kind is Kind.BOOL:
        if cls is int and value in (0, 1):
            return "t" if value else "f"
    elif kind is Kind.DECIMAL:
        if cls is int:
            return str(value)
        if cls is float and not math.isnan(value):
            # 1e400 in a NUMERIC column is stored as an infinite REAL: numeric Infinity.
            return _numeric_text(Decimal(repr(value)))
        if cls is str:
            try:
                return _numeric_text(wire_text.parse_numeric(value))
            except (ValueError, ArithmeticError):
                pass
    raise SourceError(f"column {column} of {table} (log time {time}) holds {value!r}, which "
                      f"is not a {kind} value: declare the column with the type of what it "
                      "stores (or make the table STRICT)")
