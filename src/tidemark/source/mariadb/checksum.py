"""``tidemark verify``'s checksums of a MariaDB table, computed by the server
(:class:`tidemark.row_checksum.ChecksumSide` in MariaDB SQL).

Each compared column becomes the canonical text of :mod:`tidemark.row_checksum` for
its *target* type, from its *source* type as ``information_schema`` gives it, the way
the pipeline stored it (:mod:`~tidemark.source.mariadb.column_readers` renders the
binlog's values, :mod:`~tidemark.source.mariadb.types` maps them to logical types,
:mod:`tidemark.spark.type_mapping` to Arrow):

==========================  =========================================================
source → target             SQL
==========================  =========================================================
integers, year → integer    ``CAST(c AS SIGNED)`` (bigint unsigned wraps, as stored)
bit(1) → boolean            ``t`` / ``f``
decimal → decimal(p, s)     ``CAST(c AS DECIMAL(65, s))``: exactly *s* fraction digits
double → float64            the hex of its bits, by exact arithmetic (:func:`float_bits`)
float → float32             the float widened (``CAST(c AS DOUBLE)``), then as a double
date → date                 days since 1970-01-01
datetime → timestamp        microseconds since 1970-01-01 (wall clock)
timestamp → timestamp(UTC)  the same, with the session's ``time_zone`` at ``+00:00``
bit(n) → binary             hex of the bytes reversed (``io.debezium.data.Bits`` is
                            little-endian), binary strings → hex of the bytes
anything → string           the text a SELECT returns (time, enum, set, json, decimals
                            wider than 38 digits: what the row decoder renders)
==========================  =========================================================

Zero dates (``0000-00-00``) are NULL in a nullable column and the epoch in a NOT NULL
one, as the decoder makes them. Texts are hashed as UTF-8 (``utf8mb4``).

Excluded key hashes go into a temporary table that the rows are anti-joined with (the
caller's connection needs ``CREATE TEMPORARY TABLES``).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any, Final, NamedTuple

import pyarrow as pa
import pymysql

from tidemark.event import TableId
from tidemark.row_checksum import (
    HASH_HEX_DIGITS,
    INTEGER_KEY_LIMIT,
    BucketSum,
    BucketSums,
    KeyedRow,
    TableShape,
    UnsupportedColumnError,
    integer_key,
    is_string,
    key_types,
)

_INTEGER_TYPES: Final = frozenset({"tinyint", "smallint", "mediumint", "int", "bigint",
                                   "year"})
_EXCLUDED_BATCH: Final = 1000
_serial = itertools.count()


class SourceColumn(NamedTuple):
    """A MariaDB column as ``information_schema.COLUMNS`` describes it."""

    data_type: str  # DATA_TYPE, lower case: int, decimal, bit, …
    column_type: str  # COLUMN_TYPE: int(11) unsigned, bit(10), …
    nullable: bool
    precision: int | None  # NUMERIC_PRECISION (bits of a bit(n))


def quote(name: str) -> str:
    """A MariaDB identifier, quoted."""
    return "`" + name.replace("`", "``") + "`"


def _text(expression: str) -> str:
    return f"CAST({expression} AS CHAR CHARACTER SET utf8mb4)"


def float_bits(value: str) -> str:
    """SQL of the canonical text of a DOUBLE expression *value*: the hex of its IEEE 754
    bits, by exact arithmetic (MariaDB cannot reinterpret a double; its columns hold no
    NaN or infinity): a normal double |v| = (1 + m / 2^52) * 2^e, a subnormal one
    m * 2^-1074 (scaled in two steps: 2^1074 is no double). MariaDB stores -0 as 0, so
    the sign is that of a comparison."""
    # LOG2 rounds near powers of two (and to 1024 at the largest doubles); MariaDB
    # refuses a POW beyond the largest double, so the estimate is clamped and
    # corrected by the quotient, which is exact.
    e0 = f"LEAST(1023, GREATEST(-1074, FLOOR(LOG2(ABS({value})))))"
    ratio = f"(ABS({value}) / POW(2, {e0}))"
    e = f"({e0} - IF({ratio} < 1, 1, 0) + IF({ratio} >= 2, 1, 0))"
    magnitude = (f"IF({value} = 0, 0, IF({e} < -1022, "
                 f"CAST(ABS({value}) * POW(2, 537) * POW(2, 537) AS UNSIGNED), "
                 f"(CAST({e} + 1023 AS UNSIGNED) << 52) "
                 f"+ CAST((ABS({value}) / POW(2, {e}) - 1) * 4503599627370496 AS UNSIGNED)))")
    sign = f"IF({value} < 0, 9223372036854775808, 0)"
    return (f"IF({value} IS NULL, NULL, "
            f"LOWER(LPAD(HEX({sign} | {magnitude}), 16, '0')))")


def _zero_date(q: str, column: SourceColumn, value: str) -> str:
    """*value* unless *q* is a zero date (NULL in a nullable column, else the epoch's
    *zero* text)."""
    zero = "NULL" if column.nullable else "'0'"
    return f"IF(MONTH({q}) = 0 OR DAYOFMONTH({q}) = 0, {zero}, {value})"


def _bits_hex(q: str, column: SourceColumn) -> str:
    size = ((column.precision or 1) + 7) // 8
    padded = f"LPAD(HEX({q}), {2 * size}, '0')"
    pairs = ", ".join(f"SUBSTRING({padded}, {2 * i + 1}, 2)" for i in reversed(range(size)))
    return f"LOWER(CONCAT({pairs}))"


def value_expression(name: str, column: SourceColumn, target: pa.DataType) -> str:
    """SQL giving the canonical text of source *column* for a target of *target* type
    (NULL for NULL); raises UnsupportedColumnError where there is none."""
    q, source = quote(name), column.data_type
    if pa.types.is_boolean(target):
        return f"IF({q} IS NULL, NULL, IF({q} <> 0, 't', 'f'))"
    if pa.types.is_integer(target) and (source in _INTEGER_TYPES or source == "bit"):
        return _text(f"CAST({q} AS SIGNED)")
    if pa.types.is_decimal(target):
        return _text(f"CAST({q} AS DECIMAL(65, {target.scale}))")
    if pa.types.is_floating(target):
        return float_bits(f"CAST({q} AS DOUBLE)")
    if pa.types.is_date(target) and source == "date":
        return _zero_date(q, column, _text(f"DATEDIFF({q}, '1970-01-01')"))
    if pa.types.is_timestamp(target) and source in ("datetime", "timestamp"):
        return _zero_date(q, column, _text(
            f"TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', {q})"))
    if pa.types.is_binary(target) or pa.types.is_large_binary(target):
        return _bits_hex(q, column) if source == "bit" else f"LOWER(HEX({q}))"
    if pa.types.is_string(target) or pa.types.is_large_string(target):
        return _text(q)
    raise UnsupportedColumnError(f"column {name} ({column.column_type}) has no canonical "
                                 f"text for a target column of type {target}")


def field_expression(expression: str, target: pa.DataType) -> str:
    """SQL of a canonical text of a column of Arrow type *target* as a row text's field
    (``~``, ``<len>:<text>`` for a string, else ``<text>,``)."""
    if is_string(target):
        return f"COALESCE(CONCAT(CHAR_LENGTH({expression}), ':', {expression}), '~')"
    return f"COALESCE(CONCAT({expression}, ','), '~')"


def hash_expression(text: str) -> str:
    """SQL of the 60-bit hash of a text (MD5 of its UTF-8 bytes)."""
    return (f"CAST(CONV(SUBSTRING(MD5(CONVERT({text} USING utf8mb4)), 1, "
            f"{HASH_HEX_DIGITS}), 16, 10) AS UNSIGNED)")


class MariaDbChecksumSide:
    """Checksums of *table* computed on *conn*, inside whatever transaction the caller
    holds (the verify snapshot); the session's ``time_zone`` is set to UTC."""

    def __init__(self, conn: pymysql.connections.Connection[Any], table: TableId) -> None:
        self._conn = conn
        self._table = table
        self._columns: dict[str, SourceColumn] | None = None
        self._excluded_table = (f"{quote(table.schema)}."
                                f"{quote(f'tidemark_verify_excluded_{next(_serial)}')}")
        self._excluded: frozenset[int] | None = None
        with conn.cursor() as cur:
            cur.execute("SET time_zone = '+00:00'")

    @property
    def _qualified(self) -> str:
        return f"{quote(self._table.schema)}.{quote(self._table.table)}"

    def source_columns(self) -> dict[str, SourceColumn]:
        """The table's columns as the catalog gives them (asked once)."""
        if self._columns is None:
            with self._conn.cursor() as cur:
                cur.execute("SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, IS_NULLABLE, "
                            "NUMERIC_PRECISION FROM information_schema.COLUMNS WHERE "
                            "TABLE_SCHEMA = %s AND TABLE_NAME = %s",
                            (self._table.schema, self._table.table))
                self._columns = {str(name): SourceColumn(str(data_type).lower(),
                                                         str(column_type).lower(),
                                                         nullable == "YES",
                                                         None if p is None else int(p))
                                 for name, data_type, column_type, nullable, p
                                 in cur.fetchall()}
            if not self._columns:
                raise UnsupportedColumnError(f"table {self._table} does not exist in the "
                                             "MariaDB source")
        return self._columns

    def _expressions(self, shape: TableShape) -> list[str]:
        columns = self.source_columns()
        out = []
        for compared in shape.columns:
            source = columns.get(compared.name)
            if source is None:
                raise UnsupportedColumnError(f"column {compared.name} of the target is "
                                             f"not a column of {self._table} in the source")
            out.append(value_expression(compared.name, source, compared.target_type))
        return out

    def _rows_query(self, shape: TableShape, values: Sequence[str], buckets: int,
                    only: Sequence[int] | None, excluded: bool) -> str:
        """SELECT of each row's key hash (``k``) and *values*, filtered."""
        by_name = dict(zip((c.name for c in shape.columns),
                           self._expressions(shape), strict=True))
        key_text = "CONCAT(" + ", ".join(
            field_expression(by_name[k], kind)
            for k, kind in zip(shape.keys, key_types(shape), strict=True)) + ")"
        key_hash = hash_expression(key_text)
        if integer_key(shape):
            value = f"CAST({quote(shape.keys[0])} AS SIGNED)"
            key_hash = (f"IF({value} >= 0 AND {value} < {INTEGER_KEY_LIMIT}, "
                        f"CAST({value} AS UNSIGNED), {key_hash})")
        inner = (f"SELECT {key_hash} AS k"
                 + "".join(f", {v}" for v in values) + f" FROM {self._qualified}")
        where = []
        join = ""
        if excluded:
            join = f" LEFT JOIN {self._excluded_table} AS x ON x.k = r.k"
            where.append("x.k IS NULL")
        if only is not None:
            where.append(f"r.k MOD {int(buckets)} IN ({', '.join(str(int(b)) for b in only)})")
        condition = f" WHERE {' AND '.join(where)}" if where else ""
        return f"FROM ({inner}) AS r{join}{condition}"

    def _row_hash(self, shape: TableShape) -> str:
        row = "CONCAT(" + ", ".join(
            field_expression(e, c.target_type)
            for e, c in zip(self._expressions(shape), shape.columns, strict=True)) + ")"
        return f"CAST({hash_expression(row)} AS DECIMAL(65, 0)) AS h"

    def _exclude(self, keys: frozenset[int]) -> bool:
        """Fill the temporary table of excluded key hashes; False when there are none."""
        if not keys:
            return False
        if keys == self._excluded:
            return True
        with self._conn.cursor() as cur:
            cur.execute(f"CREATE TEMPORARY TABLE IF NOT EXISTS "
                        f"{self._excluded_table} "
                        "(k BIGINT UNSIGNED PRIMARY KEY) ENGINE = MEMORY")
            cur.execute(f"DELETE FROM {self._excluded_table}")
            ordered = sorted(keys)
            for start in range(0, len(ordered), _EXCLUDED_BATCH):
                chunk = ordered[start:start + _EXCLUDED_BATCH]
                cur.execute(f"INSERT INTO {self._excluded_table} (k) VALUES "
                            + ", ".join(f"({int(k)})" for k in chunk))
        self._excluded = keys
        return True

    def bucket_sums(self, shape: TableShape, buckets: int, *,
                    only: Sequence[int] | None = None,
                    excluded_keys: frozenset[int] = frozenset()) -> BucketSums:
        """See :meth:`tidemark.row_checksum.ChecksumSide.bucket_sums`."""
        if only is not None and not only:
            return {}
        excluded = self._exclude(excluded_keys)
        body = self._rows_query(shape, [self._row_hash(shape)], buckets, only, excluded)
        statement = (f"SELECT r.k MOD {int(buckets)} AS bucket, COUNT(*), "
                     f"CAST(SUM(r.h) AS CHAR) {body} GROUP BY bucket")
        with self._conn.cursor() as cur:
            cur.execute(statement)
            return {int(b): BucketSum(int(n), int(total)) for b, n, total in cur.fetchall()}

    def bucket_rows(self, shape: TableShape, buckets: int, only: Sequence[int], *,
                    excluded_keys: frozenset[int] = frozenset()) -> list[KeyedRow]:
        """See :meth:`tidemark.row_checksum.ChecksumSide.bucket_rows`."""
        if not only:
            return []
        excluded = self._exclude(excluded_keys)
        values = [f"{e} AS c{i}" for i, e in enumerate(self._expressions(shape))]
        body = self._rows_query(shape, values, buckets, only, excluded)
        names = ", ".join(f"r.c{i}" for i in range(len(values)))
        with self._conn.cursor() as cur:
            cur.execute(f"SELECT r.k, {names} {body}")
            return [(int(row[0]), tuple(None if v is None else _str(v) for v in row[1:]))
                    for row in cur.fetchall()]


def _str(value: Any) -> str:
    return value.decode() if isinstance(value, bytes | bytearray) else str(value)

