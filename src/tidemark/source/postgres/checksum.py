"""Row checksums of a PostgreSQL table computed in the database (``tidemark verify``).

Implements :class:`tidemark.row_checksum.ChecksumSide` in SQL on a connection whose
transaction the caller opened on the snapshot to compare (so every query here sees the
same rows). Each compared column becomes its canonical text by the *target* column's
Arrow type (:mod:`tidemark.row_checksum`), computed from the source column: values the
pipeline stores as strings are the text PostgreSQL printed to it, with the session
settings every tidemark connection uses (:data:`SESSION_SETTINGS`); the other types
become the digits, days or microseconds the target holds, including the values the
pipeline maps on the way (``infinity`` dates and timestamps to the largest and
smallest, ``NaN`` decimals and BC dates to NULL).

Only aggregates leave the database for :meth:`PostgresChecksumSide.bucket_sums`; the
excluded keys are an anti-join against an array parameter. The scans are plain
queries, so PostgreSQL runs them in parallel where it would.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import pyarrow as pa
from psycopg import sql

from tidemark.errors import ConfigError
from tidemark.event import TableId
from tidemark.postgres_connection import Connection
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
    key_types,
    supported,
)

#: The settings that decide the text output functions print: those of every tidemark
#: session (:data:`tidemark.postgres_connection.SESSION_SETTINGS`), which printed the
#: values a target stores as strings.
SESSION_SETTINGS: Final = (("DateStyle", "ISO, MDY"), ("TimeZone", "UTC"),
                           ("IntervalStyle", "iso_8601"), ("extra_float_digits", "3"),
                           ("bytea_output", "hex"), ("lc_monetary", "C"))

#: Planner settings of the snapshot transaction (local to it): the bucket sums group by
#: an expression whose distinct values PostgreSQL cannot estimate (it guesses one per
#: row), so it sorts every row (spilling to disk) for a GroupAggregate; the buckets are
#: at most 65,536, which a HashAggregate keeps in memory without sorting anything. With
#: one group a row guessed, a parallel plan looks no cheaper either: free parallel
#: start-up and tuples make the planner split the scan among its workers (measured at
#: 2M rows: 1.35 s instead of 2.7 s on 2 cores).
PLANNER_SETTINGS: Final = (("enable_sort", "off"), ("work_mem", "64MB"),
                           ("parallel_setup_cost", "0"), ("parallel_tuple_cost", "0"))

# datetime.max / datetime.min and date.max / date.min, where the pipeline maps infinity.
_TS_MAX_US: Final = 253402300799999999
_TS_MIN_US: Final = -62135596800000000
_DATE_MAX_DAYS: Final = 2932896
_DATE_MIN_DAYS: Final = -719162


def set_session(conn: Connection) -> None:
    """Set :data:`SESSION_SETTINGS` on *conn* (inside its transaction: they hold for
    the session unless the transaction rolls back), and :data:`PLANNER_SETTINGS` for
    its transaction."""
    with conn.cursor() as cur:
        for settings, local in ((SESSION_SETTINGS, False), (PLANNER_SETTINGS, True)):
            for name, value in settings:
                cur.execute(sql.SQL("SELECT set_config({}, {}, {})").format(
                    sql.Literal(name), sql.Literal(value), sql.Literal(local)))


def hash_sql(text: sql.Composable, *, utf8: bool = True,
             hex_integers: bool = False) -> sql.Composable:
    """The 60-bit hash of a text expression, as a bigint. ``md5(text)`` hashes the
    server encoding's bytes: in a database that is not UTF8 (*utf8* false) the text is
    converted to UTF-8 first (only there: the conversion costs on every row).
    *hex_integers*: the server reads ``0x`` integers (PostgreSQL 16 and later), a
    third of the cost of the ``bit(60)`` cast (0.04 against 0.11 µs a row)."""
    if not utf8:
        text = sql.SQL("convert_to({}, 'UTF8')").format(text)
    if hex_integers:
        return sql.SQL("('0x' || substr(md5({}), 1, 15))::int8").format(text)
    return sql.SQL("('x' || substr(md5({}), 1, 15))::bit(60)::bigint").format(text)


def field_sql(text: sql.Composable, target: pa.DataType) -> sql.Composable:
    """A canonical text expression (NULL for NULL) of a column of Arrow type *target* as
    a field of a row text. Only a string's field repeats its text (for its length):
    PostgreSQL computes a repeated subexpression again each time, and for a string
    that is the column itself."""
    if is_string(target):
        return sql.SQL("coalesce(length({t})::text || ':' || ({t}), '~')").format(t=text)
    if is_list(target):
        return sql.SQL("coalesce({}, '~')").format(text)
    return sql.SQL("coalesce(({}) || ',', '~')").format(text)


def _float_sql(value: sql.Composable) -> sql.Composable:
    """The canonical float64 text of a double expression: the hex of its bits."""
    return sql.SQL("CASE WHEN {v} = 'NaN'::float8 THEN 'NaN' "
                   "ELSE encode(float8send({v}), 'hex') END").format(v=value)


def key_hash_sql(key_texts: Sequence[sql.Composable], shape: TableShape,
                 key_value: sql.Composable | None, *, utf8: bool,
                 hex_integers: bool = False) -> sql.Composable:
    """The key hash of a row as a bigint, from its key columns' canonical texts;
    *key_value*: the key's value as an int8 expression when the key is one integer
    column (:func:`tidemark.row_checksum.integer_key`), which is its own hash below
    2^60."""
    hashed = hash_sql(sql.SQL(" || ").join(
        field_sql(t, kind) for t, kind in zip(key_texts, key_types(shape), strict=True)),
        utf8=utf8, hex_integers=hex_integers)
    if key_value is None:
        return hashed
    return sql.SQL("CASE WHEN {v} >= 0 AND {v} < {limit} THEN {v} ELSE {h} END").format(
        v=key_value, limit=sql.Literal(INTEGER_KEY_LIMIT), h=hashed)


def text_sql(value: sql.Composable, source_type: str, target: pa.DataType, *,
             trim_bpchar: bool = False) -> sql.Composable:
    """The canonical text of a source column (or array element) *value* of PostgreSQL
    type *source_type* (``typname``) whose target column has Arrow type *target*.
    *trim_bpchar*: a ``char(n)`` value as its cast to text (padding dropped), as a log
    table's reader reads it, instead of its output (padded, as pgoutput sends it)."""
    if pa.types.is_list(target) or pa.types.is_large_list(target):
        element = source_type.removeprefix("_")
        item = sql.Identifier("e")
        return sql.SQL(
            "CASE WHEN {v} IS NULL THEN NULL ELSE '[' || coalesce((SELECT string_agg({f}, '' "
            "ORDER BY {o}) FROM unnest({v}) WITH ORDINALITY AS u({e}, {o})), '') || ']' END"
        ).format(v=value, f=field_sql(text_sql(item, element, target.value_type,
                                               trim_bpchar=trim_bpchar), target.value_type), e=item,
                 o=sql.Identifier("o"))
    if pa.types.is_boolean(target):
        return sql.SQL("CASE WHEN {v} THEN 't' WHEN NOT {v} THEN 'f' END").format(v=value)
    if pa.types.is_integer(target):
        return sql.SQL("{}::text").format(value)
    if pa.types.is_decimal(target):
        return sql.SQL("CASE WHEN {v} IN ('NaN', 'Infinity', '-Infinity') THEN NULL "
                       "ELSE round({v}, {s})::text END").format(
            v=value, s=sql.Literal(target.scale))
    if pa.types.is_floating(target):
        return _float_sql(sql.SQL("{}::float8").format(value))
    if pa.types.is_binary(target) or pa.types.is_large_binary(target):
        return sql.SQL("encode({}, 'hex')").format(value)
    if pa.types.is_date(target):
        return sql.SQL(
            "CASE WHEN {v} = 'infinity' THEN {hi} WHEN {v} = '-infinity' THEN {lo} "
            "WHEN {v} < '0001-01-01' THEN NULL ELSE ({v} - DATE '1970-01-01')::text END"
        ).format(v=value, hi=sql.Literal(str(_DATE_MAX_DAYS)),
                 lo=sql.Literal(str(_DATE_MIN_DAYS)))
    if pa.types.is_timestamp(target):
        return sql.SQL(
            "CASE WHEN {v} = 'infinity' THEN {hi} WHEN {v} = '-infinity' THEN {lo} "
            "WHEN {v} < '0001-01-01' THEN NULL "
            "ELSE (extract(epoch FROM {v}) * 1000000)::bigint::text END"
        ).format(v=value, hi=sql.Literal(str(_TS_MAX_US)), lo=sql.Literal(str(_TS_MIN_US)))
    if pa.types.is_time(target):
        return sql.SQL("(extract(epoch FROM {}::time) * 1000000)::bigint::text").format(value)
    if supported(target):  # strings: the text the pipeline received
        if source_type == "bpchar" and not trim_bpchar:
            # bpchar's cast to text drops the padding its output function prints.
            return sql.SQL("CASE WHEN {v} IS NULL THEN NULL ELSE concat({v}) END"
                           ).format(v=value)
        return sql.SQL("{}::text").format(value)
    raise UnsupportedColumnError(f"no canonical text for target type {target}")


def column_types(conn: Connection, table: TableId) -> dict[str, str]:
    """*table*'s columns and their types' names (``pg_type.typname``; arrays ``_int4``;
    domains their base type's)."""
    with conn.cursor() as cur:
        cur.execute(
            "SELECT a.attname, coalesce(b.typname, t.typname) FROM pg_attribute a "
            "JOIN pg_class c ON c.oid = a.attrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "JOIN pg_type t ON t.oid = a.atttypid "
            "LEFT JOIN pg_type b ON b.oid = t.typbasetype AND t.typtype = 'd' "
            "WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0 "
            "AND NOT a.attisdropped", (table.schema, table.table))
        return {str(name): str(type_name) for name, type_name in cur.fetchall()}


class PostgresChecksumSide:
    """The checksums of one table on the snapshot *conn*'s transaction holds.

    *log_table*: the table is captured through a log table, whose reader reads each
    value as its cast to text (``char(n)`` without its padding), not as pgoutput sends
    it (padded)."""

    def __init__(self, conn: Connection, table: TableId, *, log_table: bool = False) -> None:
        self.conn = conn
        self.table = table
        self.log_table = log_table
        set_session(conn)
        with conn.cursor() as cur:
            cur.execute("SELECT current_setting('server_encoding')")
            row = cur.fetchone()
        self.utf8 = row is not None and str(row[0]).upper() in ("UTF8", "SQL_ASCII")
        self.hex_integers = conn.info.server_version >= 160000
        self.types = column_types(conn, table)
        if not self.types:
            raise ConfigError("verify", f"table {table} does not exist in the source")

    def _texts(self, shape: TableShape) -> list[sql.Composable]:
        texts = []
        for column in shape.columns:
            source_type = self.types.get(column.name)
            if source_type is None:
                raise ConfigError("verify", f"the target's column {column.name!r} is not a "
                                  f"column of the source table {self.table}")
            texts.append(text_sql(sql.Identifier(column.name), source_type,
                                  column.target_type, trim_bpchar=self.log_table))
        return texts

    def _hashed(self, shape: TableShape, texts: list[sql.Composable],
                where: sql.Composable | None = None) -> sql.Composable:
        """``SELECT kh, rh[, texts] FROM table`` over the shape (its rows meeting
        *where*, `` WHERE ...``, if given)."""
        by_name = dict(zip((c.name for c in shape.columns), texts, strict=True))
        key_value = sql.SQL("{}::int8").format(sql.Identifier(shape.keys[0])) \
            if integer_key(shape) else None
        row_text = sql.SQL(" || ").join(field_sql(t, c.target_type)
                                        for t, c in zip(texts, shape.columns, strict=True))
        return sql.SQL("SELECT {kh} AS kh, {rh} AS rh{more} FROM {table}{where}").format(
            kh=key_hash_sql([by_name[k] for k in shape.keys], shape, key_value,
                            utf8=self.utf8, hex_integers=self.hex_integers),
            rh=hash_sql(row_text, utf8=self.utf8, hex_integers=self.hex_integers),
            more=sql.SQL("").join(sql.SQL(", {} AS {}").format(t, sql.Identifier(f"c{i}"))
                                  for i, t in enumerate(texts)),
            table=sql.Identifier(self.table.schema, self.table.table),
            where=sql.SQL("") if where is None else where)

    def _query(self, shape: TableShape, buckets: int, only: Sequence[int] | None,
               excluded_keys: frozenset[int], select: sql.Composable,
               texts: list[sql.Composable], tail: sql.Composable) -> tuple[sql.Composed,
                                                                        list[Any]]:
        params: list[Any] = []
        where: list[sql.Composable] = []
        if only is not None:
            where.append(sql.SQL("mod(s.kh, {n}) IN (SELECT unnest(%s::bigint[]))").format(
                n=sql.Literal(buckets)))
            params.append(list(only))
        if excluded_keys:
            where.append(sql.SQL("NOT EXISTS (SELECT FROM unnest(%s::bigint[]) AS x(k) "
                                 "WHERE x.k = s.kh)"))
            params.append(sorted(excluded_keys))
        query = sql.SQL("SELECT {select} FROM ({inner}) AS s{where}{tail}").format(
            select=select, inner=self._hashed(shape, texts),
            where=sql.SQL(" WHERE ") + sql.SQL(" AND ").join(where) if where else sql.SQL(""),
            tail=tail)
        return query, params

    def bucket_sums(self, shape: TableShape, buckets: int, *,
                    only: Sequence[int] | None = None,
                    excluded_keys: frozenset[int] = frozenset()) -> BucketSums:
        if only is not None and not only:
            return {}
        n = sql.Literal(buckets)
        query, params = self._query(
            shape, buckets, only, excluded_keys,
            sql.SQL("mod(s.kh, {n}), count(*), sum(s.rh)").format(n=n), self._texts(shape),
            sql.SQL(" GROUP BY 1").format(n=n))
        with self.conn.cursor() as cur:
            cur.execute(query, params)
            return {int(b): BucketSum(int(rows), int(total))
                    for b, rows, total in cur.fetchall()}

    def bucket_rows(self, shape: TableShape, buckets: int, only: Sequence[int], *,
                    excluded_keys: frozenset[int] = frozenset()) -> list[KeyedRow]:
        if not only:
            return []
        texts = self._texts(shape)
        select = sql.SQL(", ").join([sql.SQL("s.kh"), *(
            sql.SQL("s.{}").format(sql.Identifier(f"c{i}")) for i in range(len(texts)))])
        query, params = self._query(shape, buckets, only, excluded_keys, select, texts,
                                    sql.SQL(""))
        with self.conn.cursor() as cur:
            cur.execute(query, params)
            return [(int(row[0]), tuple(row[1:])) for row in cur.fetchall()]


    def key_rows(self, shape: TableShape,
                 keys: Sequence[RowTexts]) -> list[KeyedRow] | None:
        """The rows of *keys* (canonical key texts) found through the key's index: each
        key column must be an integer or a text column the target holds as such (its
        canonical text is then its value's text); otherwise None."""
        casts = []
        by_name = {c.name: c for c in shape.columns}
        for name in shape.keys:
            cast = _KEY_CASTS.get((self.types.get(name, ""),
                                   _key_kind(by_name[name].target_type)))
            if cast is None:
                return None
            casts.append(cast)
        if any(text is None for key in keys for text in key):
            return None
        if not keys:
            return []
        params = [[key[i] for key in keys] for i in range(len(casts))]
        arrays = sql.SQL(", ").join(sql.SQL("%s::text[]") for _ in casts)
        values = sql.SQL(", ").join(sql.SQL("v.{}::{}").format(sql.Identifier(f"v{i}"),
                                                              sql.SQL(cast))
                                    for i, cast in enumerate(casts))
        columns = sql.SQL(", ").join(sql.Identifier(k) for k in shape.keys)
        where = sql.SQL(" WHERE ({columns}) IN (SELECT {values} FROM unnest({arrays}) "
                        "AS v({names}))").format(
            columns=columns, values=values, arrays=arrays,
            names=sql.SQL(", ").join(sql.Identifier(f"v{i}") for i in range(len(casts))))
        texts = self._texts(shape)
        select = sql.SQL(", ").join([sql.SQL("s.kh"), *(
            sql.SQL("s.{}").format(sql.Identifier(f"c{i}")) for i in range(len(texts)))])
        query = sql.SQL("SELECT {select} FROM ({inner}) AS s").format(
            select=select, inner=self._hashed(shape, texts, where))
        with self.conn.cursor() as cur:
            cur.execute(query, params)
            return [(int(row[0]), tuple(row[1:])) for row in cur.fetchall()]


#: Key columns looked up by value in :meth:`PostgresChecksumSide.key_rows`: (source
#: type, target kind) -> the type its canonical text is cast to (the text is then the
#: value's own text: an integer's digits, a string itself).
_KEY_CASTS: Final = {
    ("int2", "integer"): "int8", ("int4", "integer"): "int8", ("int8", "integer"): "int8",
    ("text", "string"): "text", ("varchar", "string"): "text",
}


def _key_kind(target: pa.DataType) -> str:
    if pa.types.is_integer(target):
        return "integer"
    if pa.types.is_string(target) or pa.types.is_large_string(target):
        return "string"
    return "other"
