"""Identifiers and literals for the SQL strings delta-rs merge predicates are made of.

delta-rs parses merge predicates and update expressions with DataFusion's SQL parser, so
every column name that reaches one is validated here and quoted with backticks (a
backtick inside a name is doubled). Nothing else builds SQL text from names.
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
from typing import Any

from tidemark.errors import ConfigError


def check_identifier(name: object, setting: str) -> str:
    """*name* if it can be a column name in a predicate, else a :class:`ConfigError`."""
    if not isinstance(name, str) or not name:
        raise ConfigError(setting, f"column names must be non-empty strings, got {name!r}")
    if any(ord(ch) < 32 or ch == "\x7f" for ch in name):
        raise ConfigError(setting, f"column name {name!r} contains a control character; "
                                   "allowed are printable characters")
    return name


def quote(name: str) -> str:
    """*name* as a DataFusion SQL identifier (backticks; case and spaces preserved)."""
    return "`" + name.replace("`", "``") + "`"


def column(alias: str, name: str) -> str:
    """``alias.`name```: a qualified, quoted column reference."""
    return f"{alias}.{quote(name)}"


def literal(value: Any) -> str:
    """A Python scalar (from a sequence column) as a SQL literal."""
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float) and math.isfinite(value):
        return repr(value)
    if isinstance(value, decimal.Decimal) and value.is_finite():
        return f"CAST('{value}' AS DECIMAL(38, {max(0, -int(value.as_tuple().exponent))}))"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(dt.UTC).replace(tzinfo=None)
            return f"CAST('{value.isoformat()}Z' AS TIMESTAMP)"
        return f"CAST('{value.isoformat()}' AS TIMESTAMP)"
    if isinstance(value, dt.date):
        return f"CAST('{value.isoformat()}' AS DATE)"
    raise ConfigError("sequence_by", f"cannot compare sequence value {value!r} "
                                     f"({type(value).__name__}) in a merge predicate; "
                                     "allowed sequence types: integers, floats, decimals, "
                                     "strings, dates, timestamps")


def sequence_after(left: str, right: str, columns: tuple[str, ...]) -> str:
    """SQL: the sequence of *left* comes strictly after that of *right* (lexicographic
    over *columns*); a null on the right counts as "before everything"."""
    terms: list[str] = []
    for i, name in enumerate(columns):
        equal_prefix = [f"{column(left, c)} = {column(right, c)}" for c in columns[:i]]
        greater = f"({column(right, name)} IS NULL OR {column(left, name)} > {column(right, name)})"
        terms.append("(" + " AND ".join([*equal_prefix, greater]) + ")")
    return "(" + " OR ".join(terms) + ")"


def sequence_before_literal(alias: str, columns: tuple[str, ...], values: tuple[Any, ...]) -> str:
    """SQL: the sequence of *alias* is strictly before the literal *values* (or null)."""
    terms: list[str] = []
    for i, name in enumerate(columns):
        equal_prefix = [f"{column(alias, c)} = {literal(v)}"
                        for c, v in zip(columns[:i], values[:i], strict=True)]
        less = (f"({column(alias, name)} IS NULL OR "
                f"{column(alias, name)} < {literal(values[i])})")
        terms.append("(" + " AND ".join([*equal_prefix, less]) + ")")
    return "(" + " OR ".join(terms) + ")"


def keys_equal(keys: tuple[str, ...], left: str = "t", right: str = "s") -> str:
    """SQL: the key columns of *left* and *right* are equal."""
    return " AND ".join(f"{column(left, k)} = {column(right, k)}" for k in keys)
