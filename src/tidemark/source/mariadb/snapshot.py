"""The initial snapshot of a MariaDB database: every captured table's rows, consistent
with one binlog position, without a global read lock.

``START TRANSACTION WITH CONSISTENT SNAPSHOT`` gives an InnoDB read view, and MariaDB
reports the binlog position that view corresponds to in the status variables
``binlog_snapshot_file``/``binlog_snapshot_position`` (read in the same transaction; no
``FLUSH TABLES WITH READ LOCK`` needed). The stream then starts exactly there: every
transaction committed before it is in the snapshot, every later one in the stream.

Tables are described from ``information_schema`` in the binlog's own terms
(:class:`~tidemark.source.mariadb.table_map.TableColumn`), so the snapshot's columns have
the same logical types as the stream's, and their values are brought to the same
canonical text.
"""

from __future__ import annotations

import re
import struct
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final

import pymysql
import pymysql.cursors

from tidemark.errors import SourceError
from tidemark.event import (
    ChangeEvent,
    Op,
    SnapshotMarker,
    SourceContext,
    TableId,
    TableSchema,
    WireValue,
)
from tidemark.logical_type import INTEGER_KINDS, Kind
from tidemark.source.mariadb import binlog as b
from tidemark.source.mariadb.column_readers import float32_text
from tidemark.source.mariadb.config import TableFilter
from tidemark.source.mariadb.position import BinlogPosition, ordering_key
from tidemark.source.mariadb.source_fields import MARIADB_BLOCK, MariaDbSourceFields
from tidemark.source.mariadb.table_map import TableColumn
from tidemark.source.mariadb.transaction_records import CONNECTOR
from tidemark.source.mariadb.types import logical_type, table_column

_TYPE_CODES: Final = {
    "tinyint": b.T_TINY, "smallint": b.T_SHORT, "mediumint": b.T_INT24, "int": b.T_LONG,
    "bigint": b.T_LONGLONG, "float": b.T_FLOAT, "double": b.T_DOUBLE,
    "decimal": b.T_NEWDECIMAL, "bit": b.T_BIT, "year": b.T_YEAR, "date": b.T_DATE,
    "time": b.T_TIME2, "datetime": b.T_DATETIME2, "timestamp": b.T_TIMESTAMP2,
    "char": b.T_STRING, "binary": b.T_STRING, "varchar": b.T_VARCHAR,
    "varbinary": b.T_VARCHAR, "tinytext": b.T_BLOB, "text": b.T_BLOB, "mediumtext": b.T_BLOB,
    "longtext": b.T_BLOB, "tinyblob": b.T_BLOB, "blob": b.T_BLOB, "mediumblob": b.T_BLOB,
    "longblob": b.T_BLOB, "json": b.T_BLOB, "enum": b.T_ENUM, "set": b.T_SET,
}
_BLOB_LENGTH_BYTES: Final = {"tiny": 1, "": 2, "medium": 3, "long": 4}
_MEMBER: Final = re.compile(r"'((?:[^']|'')*)'")
_INT64_MAX: Final = 2**63 - 1


def quote(name: str) -> str:
    """*name* as a MariaDB identifier."""
    return "`" + name.replace("`", "``") + "`"


def captured_tables(conn: pymysql.Connection[Any], captured: TableFilter) -> list[TableId]:
    """The base tables the filter captures, in Debezium's snapshot order (the include
    list's, see :meth:`TableFilter.snapshot_order`)."""
    with conn.cursor() as cur:
        cur.execute("SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES "
                    "WHERE TABLE_TYPE = 'BASE TABLE'")
        return captured.snapshot_order(
            t for t in (TableId(str(s), str(n)) for s, n in cur.fetchall()) if captured(t))


def describe(conn: pymysql.Connection[Any], table: TableId) -> tuple[TableColumn, ...]:
    """*table*'s columns as the binlog's table map would describe them."""
    with conn.cursor() as cur:
        cur.execute(
            "SELECT c.COLUMN_NAME, c.DATA_TYPE, c.COLUMN_TYPE, c.IS_NULLABLE, "
            "c.NUMERIC_PRECISION, c.NUMERIC_SCALE, c.DATETIME_PRECISION, "
            "c.CHARACTER_OCTET_LENGTH, COALESCE(l.ID, 0) "
            "FROM information_schema.COLUMNS c "
            "LEFT JOIN information_schema.COLLATIONS l ON l.COLLATION_NAME = c.COLLATION_NAME "
            "WHERE c.TABLE_SCHEMA = %s AND c.TABLE_NAME = %s ORDER BY c.ORDINAL_POSITION",
            (table.schema, table.table))
        rows = cur.fetchall()
    if not rows:
        raise SourceError(f"table {table} not found (was it dropped?)")
    return tuple(_column(*row) for row in rows)


def _column(name: str, data_type: str, column_type: str, nullable: str,
            precision: int | None, scale: int | None, fsp: int | None,
            octets: int | None, charset: int) -> TableColumn:
    data_type = data_type.lower()
    code = _TYPE_CODES.get(data_type, b.T_GEOMETRY)
    binary = data_type in ("binary", "varbinary") or data_type.endswith("blob")
    meta = 0
    if code == b.T_NEWDECIMAL:
        meta = int(precision or 10) << 8 | int(scale or 0)
    elif code == b.T_BIT:
        meta = int(precision or 1)
    elif code in (b.T_TIME2, b.T_DATETIME2, b.T_TIMESTAMP2):
        meta = int(fsp or 0)
    elif code in (b.T_STRING, b.T_VARCHAR):
        meta = int(octets or 0)
    elif code == b.T_BLOB:
        meta = _BLOB_LENGTH_BYTES.get(data_type.removesuffix("text").removesuffix("blob"), 4)
    values: tuple[str, ...] = ()
    if code in (b.T_ENUM, b.T_SET):
        values = tuple(m.replace("''", "'") for m in _MEMBER.findall(column_type))
        meta = 2 if len(values) > 255 else 1
    return TableColumn(name, code, meta, nullable == "YES", "unsigned" in column_type.lower(),
                       63 if binary else int(charset), values)


def primary_key(conn: pymysql.Connection[Any], table: TableId) -> tuple[str, ...]:
    """The primary key's columns in key order (empty without one)."""
    with conn.cursor() as cur:
        cur.execute("SELECT COLUMN_NAME FROM information_schema.KEY_COLUMN_USAGE "
                    "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s AND CONSTRAINT_NAME = "
                    "'PRIMARY' ORDER BY ORDINAL_POSITION", (table.schema, table.table))
        return tuple(str(r[0]) for r in cur.fetchall())


def table_schema(conn: pymysql.Connection[Any], table: TableId) -> TableSchema:
    """The :class:`TableSchema` of *table*, as the stream's events carry it."""
    return schema_of(table, describe(conn, table), primary_key(conn, table))


def schema_of(table: TableId, columns: Sequence[TableColumn],
              key_names: Sequence[str]) -> TableSchema:
    """The :class:`TableSchema` of *table* with *columns* and primary key *key_names*."""
    names = [c.name for c in columns]
    key = tuple(names.index(k) for k in key_names)
    return TableSchema(table, tuple(table_column(c, i in key) for i, c in enumerate(columns)),
                       key, "default")


def select_expression(column: TableColumn) -> str:
    """What a snapshot selects for *column*: the column, or an expression whose text
    :func:`normalizer` reads.

    The text protocol prints a ``FLOAT`` with six significant digits (16777216 comes
    back as ``16777200``); as a double it comes back exact, and the normalizer prints
    the float32's own shortest text, as the binlog decoder does."""
    name = quote(column.name)
    return f"CAST({name} AS DOUBLE)" if column.type == b.T_FLOAT else name


def _integer_text(text: str) -> str:
    # The server pads ZEROFILL columns ("00042") and YEAR 0 ("0000"); JSON allows no
    # leading zeros, and the binlog decoder prints the plain number.
    return str(int(text))


def _decimal_text(text: str) -> str:
    """A DECIMAL's text without ZEROFILL's padding: ``00000012.30`` -> ``12.30``."""
    sign = "-" if text.startswith("-") else ""
    digits = text.removeprefix("-")
    if digits[:1] != "0" or digits[1:2] in ("", "."):
        return text
    whole, point, fraction = digits.partition(".")
    return f"{sign}{whole.lstrip('0') or '0'}{point}{fraction}"


def normalizer(column: TableColumn) -> Callable[[Any], WireValue]:
    """From a value of the text protocol (bytes for binary-charset fields, str for
    others), selected by :func:`select_expression`, to the canonical text the binlog
    decoder gives for the same value: the same logical value and the same text, so a
    row reads the same whether snapshotted or streamed, and every number is valid JSON
    as it is."""
    kind = logical_type(column).kind

    def text(value: Any) -> str:
        return value.decode() if isinstance(value, bytes) else str(value)

    if column.type == b.T_BIT:
        size = (column.metadata + 7) >> 3
        if kind is Kind.BOOL:
            return lambda v: "t" if bytes(v)[-1] & 1 else "f"
        # Little-endian, as Debezium's Bits (the server sends big-endian).
        return lambda v: bytes(v).rjust(size, b"\0")[::-1]
    if column.type == b.T_LONGLONG and column.unsigned:
        def wrapped(v: Any) -> str:
            value = int(text(v))
            return str(value - 2**64 if value > _INT64_MAX else value)
        return wrapped
    if kind in INTEGER_KINDS:  # YEAR and ZEROFILL columns need it; others are cheap
        return lambda v: _integer_text(text(v))
    if column.type == b.T_FLOAT:
        # Exact as a double (select_expression): the float32's shortest text.
        return lambda v: float32_text(struct.pack("<f", float(text(v))))
    if column.type == b.T_DOUBLE:
        return lambda v: repr(float(text(v)))  # also drops ZEROFILL's padding
    if kind is Kind.DECIMAL:
        return lambda v: _decimal_text(text(v))
    if kind in (Kind.DATE, Kind.TIMESTAMP, Kind.TIMESTAMPTZ):
        epoch = {Kind.DATE: "1970-01-01", Kind.TIMESTAMP: "1970-01-01 00:00:00",
                 Kind.TIMESTAMPTZ: "1970-01-01 00:00:00+00"}[kind]
        zero = None if column.nullable else epoch
        suffix = "+00" if kind is Kind.TIMESTAMPTZ else ""

        def temporal(v: Any) -> WireValue:
            value = text(v)
            if value.startswith("0000-00-00") or "-00" in value[:10]:
                return zero
            return value + suffix
        return temporal
    if kind is Kind.BYTES:
        return lambda v: bytes(v) if not isinstance(v, str) else v.encode()
    return text


def begin_snapshot(conn: pymysql.Connection[Any]) -> BinlogPosition:
    """Open the consistent read view on *conn* and return the binlog position it
    corresponds to."""
    with conn.cursor() as cur:
        cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        cur.execute("SET SESSION time_zone = '+00:00'")
        cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
        cur.execute("SHOW STATUS LIKE 'binlog_snapshot_%'")
        status = {str(k).lower(): str(v) for k, v in cur.fetchall()}
        file = status.get("binlog_snapshot_file", "")
        position = int(status.get("binlog_snapshot_position", "0") or 0)
        if not file:
            raise SourceError("the server reported no binlog_snapshot_file: the binary log "
                              "is off (start the server with --log-bin)")
        cur.execute("SELECT BINLOG_GTID_POS(%s, %s)", (file, position))
        row = cur.fetchone()
    return BinlogPosition(file, position, str(row[0]) if row and row[0] else "")


def snapshot_events(conn: pymysql.Connection[Any], tables: Sequence[TableId], *,
                    position: BinlogPosition, name: str, fetch_size: int,
                    marker: SnapshotMarker | None = None) -> Iterator[list[ChangeEvent]]:
    """The rows of *tables* as read events, in chunks of up to *fetch_size*, on *conn*
    (inside the transaction :func:`begin_snapshot` opened).

    ``source.snapshot`` marks the rows as Debezium does: ``first`` (the snapshot's first
    row), ``first_in_data_collection``/``last_in_data_collection`` (a table's first and
    last), ``last`` (the snapshot's last row), ``true`` for the rest; ``server_id`` is 0
    (the rows come from a query, not from a server's binlog event). With *marker*,
    every row has that marker instead (``incremental`` for a signalled snapshot)."""
    ts_us = time.time_ns() // 1000
    key = ordering_key(position.file, position.pos)
    held: list[ChangeEvent] = []  # the last chunk, held until it is known to be last
    first_row = True
    for table in tables:
        schema = table_schema(conn, table)
        columns = describe(conn, table)
        normalize = [normalizer(c) for c in columns]
        context = SourceContext(
            CONNECTOR, name, table.schema, ts_us, None, None, None, None, None,
            MariaDbSourceFields(0, None, position.file, position.pos, 0, None), MARIADB_BLOCK)
        select = "SELECT " + ", ".join(select_expression(c) for c in columns) + \
            f" FROM {quote(table.schema)}.{quote(table.table)}"
        cursor = conn.cursor(pymysql.cursors.SSCursor)
        table_first = True
        try:
            cursor.execute(select)
            while rows := cursor.fetchmany(fetch_size):
                events = [
                    ChangeEvent(Op.READ, schema, None,
                                tuple(None if v is None else f(v)
                                      for f, v in zip(normalize, row, strict=True)),
                                context, key, 0, 0, ts_us, marker or SnapshotMarker.TRUE)
                    for row in rows]
                if table_first and marker is None:
                    events[0] = _with_marker(events[0], SnapshotMarker.FIRST if first_row
                                             else SnapshotMarker.FIRST_IN_DATA_COLLECTION)
                    table_first = first_row = False
                if held:
                    yield held
                held = events
        finally:
            cursor.close()
        if held and held[-1].schema is schema and held[-1].snapshot is SnapshotMarker.TRUE:
            held[-1] = _with_marker(held[-1], SnapshotMarker.LAST_IN_DATA_COLLECTION)
    if held:
        if marker is None:
            held[-1] = _with_marker(held[-1], SnapshotMarker.LAST)
        yield held


def _with_marker(event: ChangeEvent, marker: SnapshotMarker) -> ChangeEvent:
    return ChangeEvent(event.op, event.schema, event.raw_before, event.raw_after,
                       event.context, event.lsn, event.total_order, event.collection_order,
                       event.ts_us, marker)
