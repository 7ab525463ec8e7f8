"""The SELECT of an incremental snapshot's chunk, held to a byte budget by the server.

A chunk's row count comes from the rows of the chunks before it (:mod:`chunk_size`): a
table whose rows get wider further on would bring up to that many rows of the new width
in one fetch. So the server counts the bytes first: the chunk's rows' widths, summed
(:attr:`ChunkQueries.size`). Within the budget (nearly always) the chunk is read as
before; over it, a query that sums the widths row by row in key order ends the chunk
at the last row that keeps the sum within the budget (the first row always comes,
however wide, or the snapshot could not go on). A chunk ended that way is simply a
shorter chunk: its last key is the last row read. No per-row work in Python; widths
are read from each variable-width value's header (``octet_length`` of text and bytea
does not decompress or detoast).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Final

from psycopg import sql

from tidemark.event import Column
from tidemark.source.chunk_size import VALUE_OVERHEAD

#: Types whose text is their stored bytes: ``octet_length`` is their width.
_TEXT_TYPES: Final = ("text", "character", "char", "bpchar", "varchar", "name", "citext")
#: Fixed-width types, counted as :data:`_FIXED_TEXT` bytes each without looking (the
#: per-row sum is the query's cost: it reads only the variable-width values).
_FIXED_TYPES: Final = frozenset({
    "smallint", "integer", "bigint", "boolean", "real", "double precision", "oid",
    "date", "uuid", "money", "interval", "timestamp without time zone",
    "timestamp with time zone", "time without time zone", "time with time zone"})
#: The longest text of a fixed-width type's value, about (a timestamptz with
#: microseconds is 29 characters, a uuid 36).
_FIXED_TEXT: Final = 40
#: Column names inside the query (a table column of one of these names is refused at
#: the chunk's read: "column reference is ambiguous").
_BYTES_UPTO: Final = "tidemark_chunk_bytes_upto"
_ROW_NUMBER: Final = "tidemark_chunk_row_number"
_WIDTH: Final = "tidemark_chunk_row_bytes"


@dataclasses.dataclass(frozen=True)
class ChunkQueries:
    """The queries of one chunk (same parameters): :attr:`size` first, then
    :attr:`plain` if its answer is within the bound, else :attr:`within`."""

    size: sql.Composed
    """The bytes of the chunk's rows (one number; NULL for none)."""
    plain: sql.Composed
    """The chunk's rows."""
    within: sql.Composed
    """The chunk's rows up to the last that keeps them within the bound."""


def chunk_queries(columns: Sequence[Column], table_sql: sql.Composable,
                  where: sql.Composable, key: Sequence[str], limit: int,
                  most_bytes: int) -> ChunkQueries:
    """Queries for up to *limit* rows of *columns* in *key* order where *where* holds,
    their bytes (as :func:`~tidemark.source.chunk_size.row_memory` counts them) within
    *most_bytes*."""
    names = sql.SQL(", ").join(sql.Identifier(c.name) for c in columns)
    order = sql.SQL(", ").join(sql.Identifier(k) for k in key)
    varying = [c for c in columns if _base_type(c) not in _FIXED_TYPES]
    fixed = (len(columns) - len(varying)) * _FIXED_TEXT
    widths = sql.SQL(" + ").join([*(_width(c) for c in varying),
                                  sql.Literal(VALUE_OVERHEAD * (len(columns) + 1) + fixed)])
    fields = {"names": names, "widths": widths, "table": table_sql, "where": where,
              "order": order, "limit": sql.Literal(limit), "most": sql.Literal(most_bytes),
              "upto": sql.Identifier(_BYTES_UPTO), "number": sql.Identifier(_ROW_NUMBER),
              "width": sql.Identifier(_WIDTH)}
    # The size walks the index as the chunk does, reading only the variable-width
    # values' headers: a fraction of the chunk's cost, where the running sum of the
    # cut query (a window over every row) costs more than the chunk itself.
    size = sql.SQL("SELECT sum(w) FROM (SELECT {widths} AS w FROM {table} WHERE {where} "
                   "ORDER BY {order} LIMIT {limit}) chunk").format(**fields)
    plain = sql.SQL("SELECT {names} FROM {table} WHERE {where} ORDER BY {order} "
                    "LIMIT {limit}").format(**fields)
    # The LIMIT comes before the window: PostgreSQL does not pass a LIMIT down through
    # a window, so without a key-ordered index the window would sort the whole rest of
    # the table (wide rows, the only time this query runs) for every chunk; this way it
    # is a top-N sort, and with the index the rows stream through in one pass.
    within = sql.SQL(
        "SELECT {names} FROM (SELECT {names}, "
        "sum({width}) OVER w AS {upto}, row_number() OVER w AS {number} "
        "FROM (SELECT {names}, {widths} AS {width} FROM {table} WHERE {where} "
        "ORDER BY {order} LIMIT {limit}) limited "
        "WINDOW w AS (ORDER BY {order} ROWS UNBOUNDED PRECEDING)) chunk "
        "WHERE {upto} <= {most} OR {number} = 1 ORDER BY {order}").format(**fields)
    return ChunkQueries(size, plain, within)


def _width(column: Column) -> sql.Composable:
    """The bytes *column*'s value takes as the text a chunk row holds (0 for NULL)."""
    name = sql.Identifier(column.name)
    base = _base_type(column)
    if base == "bytea":  # hex text: two characters a byte, and "\x"
        return sql.SQL("coalesce(2 * octet_length({})::bigint + 2, 0)").format(name)
    if base in _TEXT_TYPES or base.startswith(("character varying", "character")):
        return sql.SQL("coalesce(octet_length({})::bigint, 0)").format(name)
    # Other types by their stored size: their text is about as long (a compressed
    # value, a large jsonb say, is counted by its compressed size).
    return sql.SQL("coalesce(pg_column_size({})::bigint, 0)").format(name)


def _base_type(column: Column) -> str:
    """*column*'s type without its modifiers: ``character varying(20)`` ->
    ``character varying``, ``timestamp(3) with time zone`` -> ``timestamp with time
    zone``."""
    name = column.type_name.lower()
    while "(" in name:
        start = name.index("(")
        end = name.find(")", start)
        name = name[:start] + (name[end + 1:] if end != -1 else "")
    return " ".join(name.split())
