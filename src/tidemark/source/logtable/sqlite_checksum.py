"""``tidemark verify``'s checksums of a SQLite table with a log table, computed in the
database (:class:`tidemark.row_checksum.ChecksumSide`).

SQLite has no MD5 and stores values of any type in any column, so the canonical texts
and hashes are deterministic Python functions registered on the connection: a value
becomes the wire text the log-table pipeline makes of it
(:func:`tidemark.source.logtable.sqlite_types.wire_value`, by the column's declared
type), then the canonical text of :mod:`tidemark.row_checksum` for the target's type.
The sums stay in SQL (``GROUP BY`` the bucket, an exact Python aggregate, as SQLite's
``sum`` overflows at 2^63); excluded keys are a set the rows are anti-joined with
(a Python membership test per row, never an ``IN`` list).
"""

from __future__ import annotations

import decimal
import itertools
import sqlite3
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa

from tidemark.event import TableId
from tidemark.logical_type import Kind
from tidemark.row_checksum import (
    BucketSum,
    BucketSums,
    ComparedColumn,
    KeyedRow,
    TableShape,
    UnsupportedColumnError,
    key_hash,
    row_hash,
    value_text,
)
from tidemark.source.logtable import sqlite_install as install
from tidemark.source.logtable.sqlite_types import logical_type, wire_value

#: A stored value -> its canonical text (None for NULL).
Canonical = Callable[[Any], str | None]
_serial = itertools.count()


def _from_wire(wire: str, target: pa.DataType) -> Any:
    """A wire text (:mod:`tidemark.wire_text`) as the Python value the target holds."""
    if pa.types.is_integer(target):
        return int(wire)
    if pa.types.is_boolean(target):
        return wire == "t"
    if pa.types.is_floating(target):
        return float(wire)  # NaN, Infinity and -Infinity included
    if pa.types.is_decimal(target):
        return decimal.Decimal(wire)
    if pa.types.is_binary(target) or pa.types.is_large_binary(target):
        return bytes.fromhex(wire.removeprefix("\\x"))
    if pa.types.is_string(target) or pa.types.is_large_string(target):
        return wire
    raise UnsupportedColumnError(f"no canonical text of a SQLite value for a target "
                                 f"column of type {target}")


def _check_target(column: ComparedColumn) -> None:
    target = column.target_type
    if not any(check(target) for check in (
            pa.types.is_integer, pa.types.is_boolean, pa.types.is_floating,
            pa.types.is_decimal, pa.types.is_binary, pa.types.is_large_binary,
            pa.types.is_string, pa.types.is_large_string)):
        raise UnsupportedColumnError(f"column {column.name}: no canonical text of a SQLite "
                                     f"value for a target column of type {target}")


def canonical(kind: Kind, target: pa.DataType, table: str, column: str) -> Canonical:
    """The canonical text of a stored value of a column of logical *kind* whose target
    column is of *target* type."""
    def text(value: Any) -> str | None:
        if value is None:
            return None
        wire = wire_value(kind, value, table, column, 0)
        if isinstance(wire, bytes):
            wire = "\\x" + wire.hex()
        return value_text(_from_wire(str(wire), target), target)

    return text


def declared_kinds(conn: sqlite3.Connection, table: str) -> dict[str, Kind]:
    """*table*'s columns' logical kinds, by name, from their declared types."""
    return {name: logical_type(declared).kind
            for name, declared, _ in install.table_columns(conn, table)}


def canonicals(conn: sqlite3.Connection, table: str,
               columns: Sequence[ComparedColumn]) -> list[Canonical]:
    """The canonical text functions of *columns* of *table* (checked against the table)."""
    kinds = declared_kinds(conn, table)
    out = []
    for column in columns:
        kind = kinds.get(column.name)
        if kind is None:
            raise UnsupportedColumnError(f"column {column.name} of the target is not a "
                                         f"column of {table} in the SQLite source")
        _check_target(column)
        out.append(canonical(kind, column.target_type, table, column.name))
    return out


class _ExactSum:
    """SQLite aggregate: the exact sum of 60-bit hashes, as text (SQLite integers stop
    at 2^63)."""

    def __init__(self) -> None:
        self.total = 0

    def step(self, value: int) -> None:
        self.total += value

    def finalize(self) -> str:
        return str(self.total)


class SqliteChecksumSide:
    """Checksums of *table* on *conn*, inside whatever read transaction the caller
    holds (the verify snapshot)."""

    def __init__(self, conn: sqlite3.Connection, table: TableId) -> None:
        self._conn = conn
        self._table = table.table
        self._prefix = f"tidemark_verify_{next(_serial)}"
        conn.create_aggregate(f"{self._prefix}_sum", 1, _ExactSum)  # type: ignore[arg-type]

    def _register(self, shape: TableShape, buckets: int, only: Sequence[int] | None,
                  excluded: frozenset[int]) -> tuple[str, str]:
        """Register the functions of one query; its column list and WHERE clause."""
        texts = canonicals(self._conn, self._table, shape.columns)
        position = {c.name: i for i, c in enumerate(shape.columns)}
        keys = [position[k] for k in shape.keys]
        wanted = None if only is None else frozenset(only)

        def key_hash_of_values(*values: Any) -> int:
            return key_hash([texts[i](values[i]) for i in keys], shape)

        def row_hash_of_values(*values: Any) -> int:
            return row_hash(tuple(f(v) for f, v in zip(texts, values, strict=True)), shape)

        def kept(key: int) -> bool:
            return key not in excluded and (wanted is None or key % buckets in wanted)

        def column_text(index: int, value: Any) -> str | None:
            return texts[index](value)

        p, conn = self._prefix, self._conn
        conn.create_function(f"{p}_key", len(texts), key_hash_of_values, deterministic=True)
        conn.create_function(f"{p}_row", len(texts), row_hash_of_values,
                             deterministic=True)
        conn.create_function(f"{p}_kept", 1, kept, deterministic=True)
        conn.create_function(f"{p}_text", 2, column_text, deterministic=True)
        names = ", ".join(install.quote(c.name) for c in shape.columns)
        return names, f"{p}_kept(k)"

    def bucket_sums(self, shape: TableShape, buckets: int, *,
                    only: Sequence[int] | None = None,
                    excluded_keys: frozenset[int] = frozenset()) -> BucketSums:
        """See :meth:`tidemark.row_checksum.ChecksumSide.bucket_sums`."""
        if only is not None and not only:
            return {}
        names, kept = self._register(shape, buckets, only, excluded_keys)
        p = self._prefix
        rows = self._conn.execute(
            f"SELECT k % {int(buckets)} AS bucket, count(*), {p}_sum(h) FROM "
            f"(SELECT {p}_key({names}) AS k, {p}_row({names}) AS h "
            f"FROM {install.quote(self._table)}) WHERE {kept} GROUP BY bucket").fetchall()
        return {int(b): BucketSum(int(n), int(total)) for b, n, total in rows}

    def bucket_rows(self, shape: TableShape, buckets: int, only: Sequence[int], *,
                    excluded_keys: frozenset[int] = frozenset()) -> list[KeyedRow]:
        """See :meth:`tidemark.row_checksum.ChecksumSide.bucket_rows`."""
        if not only:
            return []
        names, kept = self._register(shape, buckets, only, excluded_keys)
        p = self._prefix
        columns = ", ".join(f"{p}_text({i}, {install.quote(c.name)})"
                            for i, c in enumerate(shape.columns))
        rows = self._conn.execute(
            f"SELECT * FROM (SELECT {p}_key({names}) AS k, {columns} "
            f"FROM {install.quote(self._table)}) WHERE {kept}").fetchall()
        return [(int(row[0]), tuple(row[1:])) for row in rows]
