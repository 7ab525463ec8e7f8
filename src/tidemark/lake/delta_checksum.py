"""Row checksums of a Delta table computed with DuckDB (``tidemark verify``'s target side).

Implements :class:`tidemark.row_checksum.ChecksumSide` over one version of the table
(the live rows of ``DeltaTable(path, version=...)`` through
:mod:`tidemark.lake.delta_read`: the files without a deletion vector as a pyarrow dataset
scanned by DuckDB with the columns pushed down, those with one streamed with their
deleted rows dropped), so every call of one :class:`DeltaChecksumSide` sees the same
rows. An SCD2 target is compared by its current rows (``__END_AT`` null), a
soft-delete target by its live rows (the flag not true). The canonical texts are
:mod:`tidemark.row_checksum`'s, in DuckDB SQL: its ``md5`` prints PostgreSQL's hex, a
double's bits come from exact arithmetic, sums are HUGEINT.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Final

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from tidemark.lake import change_rows as cr
from tidemark.lake.delta_read import live_rows
from tidemark.row_checksum import (
    INTEGER_KEY_LIMIT,
    BucketSum,
    BucketSums,
    KeyedRow,
    RowTexts,
    TableShape,
    UnsupportedColumnError,
    integer_key,
    is_list,
    is_string,
    supported,
)

_TABLE: Final = "target_rows"
#: The live rows of the files with a deletion vector (the rest are :data:`_TABLE`).
_MASKED: Final = "masked_rows"
_EXCLUDED: Final = "excluded_keys"
_ONLY: Final = "only_buckets"
#: The prefix of the columns holding doubles' bits (a name no Delta column of a
#: pipeline's target starts with).
_BITS: Final = "__tidemark_float_bits_"


def quote(name: str) -> str:
    """A DuckDB identifier."""
    return '"' + name.replace('"', '""') + '"'


def hash_sql(text: str) -> str:
    """The 60-bit hash of a text expression, as a BIGINT."""
    return f"CAST('0x' || substr(md5({text}), 1, 15) AS BIGINT)"


def field_sql(text: str, target: pa.DataType) -> str:
    """A canonical text expression (NULL for NULL) of a column of Arrow type *target* as
    a field of a row text."""
    if is_string(target):
        return f"coalesce(CAST(length({text}) AS VARCHAR) || ':' || ({text}), '~')"
    if is_list(target):
        return f"coalesce({text}, '~')"
    return f"coalesce(({text}) || ',', '~')"


def exponent_sql(value: str) -> str:
    """The binary exponent of a DOUBLE expression *value* (``floor(log2(|v|))``, with
    ``log2``'s rounding near powers of two corrected; 0 for zero, infinities, NaN)."""
    e0 = f"CAST(floor(log2(abs({value}))) AS INTEGER)"
    return (f"CASE WHEN isinf({value}) OR isnan({value}) OR {value} = 0 THEN 0 "
            f"ELSE {e0} - CASE WHEN pow(2, {e0}) > abs({value}) THEN 1 ELSE 0 END "
            f"+ CASE WHEN pow(2, {e0} + 1) <= abs({value}) THEN 1 ELSE 0 END END")


def _float_sql(value: str) -> str:
    """The canonical float64 text of a DOUBLE expression *value* (a list's element; a
    column is read as its bits, :func:`with_bits`): the hex of its IEEE 754 bits, built
    by exact arithmetic (DuckDB cannot reinterpret a double's bits): a normal double
    |v| = (1 + m / 2^52) * 2^e, a subnormal one m * 2^-1074 (scaled in two steps:
    2^1074 is no double)."""
    e = f"({exponent_sql(value)})"
    magnitude = (
        f"CASE WHEN isinf({value}) THEN 9218868437227405312 WHEN {value} = 0 THEN 0 "
        f"WHEN {e} < -1022 THEN CAST(abs({value}) * pow(2, 537) * pow(2, 537) AS BIGINT) "
        f"ELSE (CAST({e} + 1023 AS BIGINT) << 52) "
        f"+ CAST((abs({value}) / pow(2, {e}) - 1) * 4503599627370496 AS BIGINT) END")
    return (f"CASE WHEN isnan({value}) THEN 'NaN' ELSE lower(lpad(hex("
            f"CASE WHEN signbit({value}) THEN -9223372036854775808 ELSE 0 END "
            f"| {magnitude}), 16, '0')) END")


def bits_column(name: str) -> str:
    """The name of the column :func:`with_bits` adds for the double column *name*."""
    return f"{_BITS}{name}"


def bits_text_sql(bits: str) -> str:
    """The canonical float64 text of a BIGINT expression holding a double's bits."""
    return (f"CASE WHEN ({bits} & 9218868437227405312) = 9218868437227405312 "
            f"AND ({bits} & 4503599627370495) <> 0 THEN 'NaN' "
            f"ELSE lower(lpad(hex({bits}), 16, '0')) END")


def with_bits(batches: Iterable[pa.RecordBatch], shape: TableShape, schema: pa.Schema,
              names: Sequence[str]) -> pa.RecordBatchReader:
    """*batches* (of the columns *names*) with, for each floating column of *shape*, a
    column of its values' IEEE 754 bits as int64 (:func:`bits_column`): the float64
    buffer read as int64, no copy (a float32 widened first, exactly). DuckDB cannot
    reinterpret a double, and building the bits by arithmetic costs it a fifth of a
    row's checksum."""
    floats = [c.name for c in shape.columns if pa.types.is_floating(c.target_type)]
    out_schema = pa.schema([schema.field(n) for n in names]
                           + [pa.field(bits_column(n), pa.int64()) for n in floats])

    def mapped() -> Iterator[pa.RecordBatch]:
        for batch in batches:
            arrays = list(batch.columns)
            for name in floats:
                values = batch.column(name).cast(pa.float64())
                arrays.append(pa.Array.from_buffers(
                    pa.int64(), len(values), values.buffers()[:2],
                    null_count=values.null_count, offset=values.offset))
            yield pa.RecordBatch.from_arrays(arrays, schema=out_schema)

    return pa.RecordBatchReader.from_batches(out_schema, mapped())


def text_sql(value: str, target: pa.DataType, depth: int = 0) -> str:
    """The canonical text of a DuckDB expression *value* of Arrow type *target*."""
    if pa.types.is_list(target) or pa.types.is_large_list(target):
        item = f"x{depth}"
        inner = field_sql(text_sql(item, target.value_type, depth + 1), target.value_type)
        return (f"CASE WHEN {value} IS NULL THEN NULL ELSE '[' || array_to_string("
                f"list_transform({value}, lambda {item}: {inner}), '') || ']' END")
    if pa.types.is_boolean(target):
        return f"CASE WHEN {value} THEN 't' WHEN NOT {value} THEN 'f' END"
    if pa.types.is_integer(target) or pa.types.is_decimal(target):
        return f"CAST({value} AS VARCHAR)"
    if pa.types.is_floating(target):
        return _float_sql(f"CAST({value} AS DOUBLE)")
    if pa.types.is_binary(target) or pa.types.is_large_binary(target):
        return f"lower(hex({value}))"
    if pa.types.is_date(target):
        return f"CAST(CAST({value} - DATE '1970-01-01' AS BIGINT) AS VARCHAR)"
    if pa.types.is_timestamp(target):
        return f"CAST(epoch_us({value}) AS VARCHAR)"
    if pa.types.is_time(target):
        return (f"CAST((hour({value}) * 60 + minute({value})) * 60000000 "
                f"+ microsecond({value}) AS VARCHAR)")
    if supported(target):  # strings
        return f"CAST({value} AS VARCHAR)"
    raise UnsupportedColumnError(f"no canonical text for target type {target}")


class DeltaChecksumSide:
    """The checksums of a Delta table at one version (the latest when *version* is
    None; :attr:`version` says which)."""

    def __init__(self, path: str, version: int | None = None,
                 storage_options: dict[str, str] | None = None, *, scd2: bool = False,
                 soft_delete_column: str | None = None) -> None:
        self.path = path
        self.table = DeltaTable(path, version=version, storage_options=storage_options)
        self.version: int = self.table.version()
        self.schema = pa.schema(self.table.schema().to_arrow())
        self.scd2 = scd2
        self.soft_delete_column = soft_delete_column
        self._rows = live_rows(self.table)
        self._db = duckdb.connect()
        self._lock = threading.Lock()

    def close(self) -> None:
        """Release DuckDB."""
        self._db.close()

    def __enter__(self) -> DeltaChecksumSide:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def commit_info(self) -> dict[str, Any]:
        """The commit of :attr:`version` (operation, timestamp, ...)."""
        history = self.table.history(1)
        return dict(history[0]) if history else {}

    def row_estimate(self) -> int:
        """The rows of the version's files (SCD2: every version of a row), from their
        statistics where the files have them."""
        return self._rows.count_rows()

    def live_filter(self) -> str:
        """The condition on the target's rows that the source holds."""
        conditions = ["TRUE"]
        if self.scd2:
            conditions.append(f"{quote(cr.END_AT)} IS NULL")
        if self.soft_delete_column is not None:
            conditions.append(f"NOT coalesce({quote(self.soft_delete_column)}, FALSE)")
        return " AND ".join(conditions)

    def _hashed(self, shape: TableShape, where: Sequence[str] = (),
                source: str = _TABLE) -> tuple[str, list[str]]:
        """``SELECT kh, rh, c0, ... FROM`` the live rows whose key hash ``kh`` meets the
        conditions *where*, in levels: the key hash, filtered there so the other
        columns' texts are made only for the rows kept; then each column's canonical
        text; then the fields and the row hash over those. DuckDB keeps a column of a
        lower level rather than computing its expression again at each use. A double
        column is read as its bits (:func:`with_bits`)."""
        texts = []
        for column in shape.columns:
            if column.name not in self.schema.names:
                raise UnsupportedColumnError(f"the Delta table {self.path} has no column "
                                             f"{column.name!r}")
            name = quote(column.name)
            if pa.types.is_floating(column.target_type):
                texts.append(bits_text_sql(quote(bits_column(column.name))))
            else:
                texts.append(text_sql(name, column.target_type))
        by_name = {c.name: c for c in shape.columns}
        key_text = " || ".join(field_sql(text_sql(quote(k), by_name[k].target_type),
                                         by_name[k].target_type) for k in shape.keys)
        key_hash = hash_sql(key_text)
        if integer_key(shape):
            key = f"CAST({quote(shape.keys[0])} AS BIGINT)"
            key_hash = (f"CASE WHEN {key} >= 0 AND {key} < {INTEGER_KEY_LIMIT} THEN {key} "
                        f"ELSE {key_hash} END")
        columns = ", ".join(quote(c.name) for c in shape.columns)
        bits = "".join(f", {quote(bits_column(c.name))}" for c in shape.columns
                       if pa.types.is_floating(c.target_type))
        rows = (f"SELECT {key_hash} AS kh, {columns}{bits} "
                f"FROM {source} WHERE {self.live_filter()}")
        if where:
            rows = f"SELECT * FROM ({rows}) AS k WHERE {' AND '.join(where)}"
        canonical = ", ".join(f"{t} AS c{i}" for i, t in enumerate(texts))
        row_text = " || ".join(field_sql(f"c{i}", c.target_type)
                               for i, c in enumerate(shape.columns))
        more = "".join(f", c{i}" for i in range(len(texts)))
        return (f"SELECT kh, {hash_sql(row_text)} AS rh{more} "
                f"FROM (SELECT kh, {canonical} FROM ({rows}) AS r) AS t"), texts

    def _run(self, shape: TableShape, buckets: int, only: Sequence[int] | None,
             excluded_keys: frozenset[int], select: str, tail: str,
             rows: pa.Table | None = None) -> list[tuple[Any, ...]]:
        """*select* over the hashed rows (of the version, or *rows* of it)."""
        where = []
        with self._lock:
            cursor = self._db.cursor()
            try:
                # Registered scans belong to one connection (a cursor is another).
                names = self._read_columns(shape)
                if rows is not None:
                    batches: Iterable[pa.RecordBatch] = rows.select(names).to_batches()
                else:
                    batches = self._rows.clean.to_batches(columns=names)
                cursor.register(_TABLE, with_bits(batches, shape, self.schema, names))
                source = _TABLE
                if rows is None and self._rows.has_deletions:
                    cursor.register(_MASKED, with_bits(self._rows.masked_batches(names),
                                                       shape, self.schema, names))
                    columns = ", ".join(quote(n) for n in (
                        *names, *(bits_column(c.name) for c in shape.columns
                                  if pa.types.is_floating(c.target_type))))
                    source = (f"(SELECT {columns} FROM {_TABLE} UNION ALL "
                              f"SELECT {columns} FROM {_MASKED}) AS live")
                if only is not None:
                    cursor.register(_ONLY, pa.table({"b": pa.array(only, pa.int64())}))
                    where.append(f"kh % {int(buckets)} IN (SELECT b FROM {_ONLY})")
                if excluded_keys:
                    cursor.register(_EXCLUDED, pa.table(
                        {"k": pa.array(sorted(excluded_keys), pa.int64())}))
                    where.append(f"kh NOT IN (SELECT k FROM {_EXCLUDED})")
                inner, _ = self._hashed(shape, where, source)
                return cursor.execute(
                    f"SELECT {select} FROM ({inner}) AS s{tail}").fetchall()
            finally:
                cursor.close()

    def _read_columns(self, shape: TableShape) -> list[str]:
        """The columns a checksum reads: the compared ones and those of the live
        filter."""
        wanted = [c.name for c in shape.columns]
        if self.scd2:
            wanted.append(cr.END_AT)
        if self.soft_delete_column is not None:
            wanted.append(self.soft_delete_column)
        return [n for n in dict.fromkeys(wanted) if n in self.schema.names]

    def bucket_sums(self, shape: TableShape, buckets: int, *,
                    only: Sequence[int] | None = None,
                    excluded_keys: frozenset[int] = frozenset()) -> BucketSums:
        if only is not None and not only:
            return {}
        n = int(buckets)
        rows = self._run(shape, buckets, only, excluded_keys,
                         f"s.kh % {n}, count(*), sum(s.rh)", f" GROUP BY s.kh % {n}")
        return {int(b): BucketSum(int(count), int(total)) for b, count, total in rows}

    def bucket_rows(self, shape: TableShape, buckets: int, only: Sequence[int], *,
                    excluded_keys: frozenset[int] = frozenset()) -> list[KeyedRow]:
        if not only:
            return []
        columns = ", ".join(f"s.c{i}" for i in range(len(shape.columns)))
        rows = self._run(shape, buckets, only, excluded_keys, f"s.kh, {columns}", "")
        return [(int(row[0]), tuple(row[1:])) for row in rows]

    def key_rows(self, shape: TableShape,
                 keys: Sequence[RowTexts]) -> list[KeyedRow] | None:
        """The rows of *keys* (canonical key texts), read through a filter on the key
        columns' values, which skips the files whose statistics exclude them and hashes
        only the rows read: each key column must be an integer or a string (its
        canonical text is its value's text); otherwise None."""
        if any(text is None for key in keys for text in key):
            return None
        by_name = {c.name: c.target_type for c in shape.columns}
        condition: pc.Expression | None = None
        for i, name in enumerate(shape.keys):
            stored = self.schema.field(name).type
            if pa.types.is_integer(by_name[name]) and pa.types.is_integer(stored):
                values = pa.array([int(str(key[i])) for key in keys], stored)
            elif _is_string(by_name[name]) and _is_string(stored):
                values = pa.array([key[i] for key in keys], stored)
            else:
                return None
            matches = pc.field(name).isin(values)
            condition = matches if condition is None else condition & matches
        if not keys or condition is None:
            return []
        found = self._rows.to_table(filter=condition)
        columns = ", ".join(f"s.c{i}" for i in range(len(shape.columns)))
        rows = self._run(shape, 1, None, frozenset(), f"s.kh, {columns}", "", found)
        return [(int(row[0]), tuple(row[1:])) for row in rows]


def _is_string(data_type: pa.DataType) -> bool:
    return bool(pa.types.is_string(data_type) or pa.types.is_large_string(data_type))
