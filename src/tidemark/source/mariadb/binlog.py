"""I/O-free decoder for the MariaDB/MySQL binary log's events, as a replication client
receives them (``COM_BINLOG_DUMP``).

Bytes in, immutable event objects out: :func:`parse_header` reads the 19-byte common
header, one ``parse_*`` function per event type reads the body. Rows events keep their
row images as bytes (:class:`RowsEvent`); :mod:`tidemark.source.mariadb.row_decoder`
turns them into column values with the :class:`TableMap` that precedes them, because
that is the hot path and is generated per table.

The checksum (CRC32, 4 bytes after each event when the server's ``binlog_checksum`` is
CRC32) is checked and removed by :class:`EventDecoder`, which also tracks the format
description and table maps. Malformed input raises :class:`tidemark.errors.DecodeError`
naming the event type and byte offset.

Reference: https://mariadb.com/kb/en/replication-protocol/ and MySQL's
``libbinlogevents`` (the table map's optional metadata).
"""

from __future__ import annotations

import struct
import zlib
from typing import Any, Final

import msgspec

from tidemark.errors import DecodeError

# -- event types -------------------------------------------------------------------
QUERY_EVENT: Final = 2
STOP_EVENT: Final = 3
ROTATE_EVENT: Final = 4
FORMAT_DESCRIPTION_EVENT: Final = 15
XID_EVENT: Final = 16
TABLE_MAP_EVENT: Final = 19
WRITE_ROWS_EVENT_V1: Final = 23
UPDATE_ROWS_EVENT_V1: Final = 24
DELETE_ROWS_EVENT_V1: Final = 25
HEARTBEAT_LOG_EVENT: Final = 27
WRITE_ROWS_EVENT_V2: Final = 30
UPDATE_ROWS_EVENT_V2: Final = 31
DELETE_ROWS_EVENT_V2: Final = 32
#: Ends the first phase of an XA transaction (``XA PREPARE``), in place of an XID event.
XA_PREPARE_LOG_EVENT: Final = 38
ANNOTATE_ROWS_EVENT: Final = 160
BINLOG_CHECKPOINT_EVENT: Final = 161
GTID_EVENT: Final = 162
GTID_LIST_EVENT: Final = 163
START_ENCRYPTION_EVENT: Final = 164
QUERY_COMPRESSED_EVENT: Final = 165
WRITE_ROWS_COMPRESSED_EVENT_V1: Final = 169
UPDATE_ROWS_COMPRESSED_EVENT_V1: Final = 170
DELETE_ROWS_COMPRESSED_EVENT_V1: Final = 171
WRITE_ROWS_COMPRESSED_EVENT: Final = 166
UPDATE_ROWS_COMPRESSED_EVENT: Final = 167
DELETE_ROWS_COMPRESSED_EVENT: Final = 168

#: Rows event type -> (operation, version): "c" insert, "u" update, "d" delete.
ROWS_EVENTS: Final[dict[int, tuple[str, int]]] = {
    WRITE_ROWS_EVENT_V1: ("c", 1), UPDATE_ROWS_EVENT_V1: ("u", 1),
    DELETE_ROWS_EVENT_V1: ("d", 1), WRITE_ROWS_EVENT_V2: ("c", 2),
    UPDATE_ROWS_EVENT_V2: ("u", 2), DELETE_ROWS_EVENT_V2: ("d", 2),
}
_COMPRESSED: Final = frozenset({
    QUERY_COMPRESSED_EVENT, WRITE_ROWS_COMPRESSED_EVENT_V1, UPDATE_ROWS_COMPRESSED_EVENT_V1,
    DELETE_ROWS_COMPRESSED_EVENT_V1, WRITE_ROWS_COMPRESSED_EVENT,
    UPDATE_ROWS_COMPRESSED_EVENT, DELETE_ROWS_COMPRESSED_EVENT,
})

HEADER_SIZE: Final = 19
CHECKSUM_SIZE: Final = 4
CHECKSUM_OFF: Final = 0
CHECKSUM_CRC32: Final = 1

# MariaDB GTID event flags.
GTID_FL_STANDALONE: Final = 1
GTID_FL_GROUP_COMMIT_ID: Final = 2

# Table map optional metadata (MySQL 8 / MariaDB 10.5+ with binlog_row_metadata=FULL).
_META_SIGNEDNESS: Final = 1
_META_DEFAULT_CHARSET: Final = 2
_META_COLUMN_CHARSET: Final = 3
_META_COLUMN_NAME: Final = 4
_META_SET_STR_VALUE: Final = 5
_META_ENUM_STR_VALUE: Final = 6
_META_GEOMETRY_TYPE: Final = 7
_META_SIMPLE_PRIMARY_KEY: Final = 8
_META_PRIMARY_KEY_WITH_PREFIX: Final = 9
_META_ENUM_AND_SET_DEFAULT_CHARSET: Final = 10
_META_ENUM_AND_SET_COLUMN_CHARSET: Final = 11

# -- column types (MYSQL_TYPE_*) -----------------------------------------------------------
T_DECIMAL: Final = 0
T_TINY: Final = 1
T_SHORT: Final = 2
T_LONG: Final = 3
T_FLOAT: Final = 4
T_DOUBLE: Final = 5
T_NULL: Final = 6
T_TIMESTAMP: Final = 7
T_LONGLONG: Final = 8
T_INT24: Final = 9
T_DATE: Final = 10
T_TIME: Final = 11
T_DATETIME: Final = 12
T_YEAR: Final = 13
T_NEWDATE: Final = 14
T_VARCHAR: Final = 15
T_BIT: Final = 16
T_TIMESTAMP2: Final = 17
T_DATETIME2: Final = 18
T_TIME2: Final = 19
T_JSON: Final = 245
T_NEWDECIMAL: Final = 246
T_ENUM: Final = 247
T_SET: Final = 248
T_TINY_BLOB: Final = 249
T_MEDIUM_BLOB: Final = 250
T_LONG_BLOB: Final = 251
T_BLOB: Final = 252
T_VAR_STRING: Final = 253
T_STRING: Final = 254
T_GEOMETRY: Final = 255

# The columns the table map's SIGNEDNESS bitmap has a bit for, in column order. YEAR is
# one: servers write a bit for it (MariaDB sets it), and leaving it out shifts the bits
# of every later numeric column.
NUMERIC_TYPES: Final = frozenset({T_TINY, T_SHORT, T_INT24, T_LONG, T_LONGLONG, T_NEWDECIMAL,
                                  T_FLOAT, T_DOUBLE, T_DECIMAL, T_YEAR})
_BLOB_TYPES: Final = frozenset({T_BLOB, T_TINY_BLOB, T_MEDIUM_BLOB, T_LONG_BLOB})


# -- events ----------------------------------------------------------------------------
class EventHeader(msgspec.Struct, frozen=True, gc=False):
    """The common header. ``next_position`` is the position after the event in its
    binlog file (0 for the artificial events a dump starts with)."""

    timestamp: int
    type: int
    server_id: int
    size: int
    next_position: int
    flags: int


class FormatDescription(msgspec.Struct, frozen=True, gc=False):
    """The first event of every binlog file: the server version and checksum algorithm."""

    binlog_version: int
    server_version: str
    checksum: int


class Rotate(msgspec.Struct, frozen=True, gc=False):
    """The stream continues in binlog *file* at *position*."""

    position: int
    file: str


class Gtid(msgspec.Struct, frozen=True, gc=False):
    """MariaDB's GTID event: the start of an event group (a transaction, or one
    standalone statement such as DDL). The GTID is ``domain-server_id-sequence``."""

    domain: int
    server_id: int
    sequence: int
    standalone: bool

    def __str__(self) -> str:
        return f"{self.domain}-{self.server_id}-{self.sequence}"


class GtidList(msgspec.Struct, frozen=True, gc=False):
    """The GTID state at the start of a binlog file (the last GTID of each domain)."""

    gtids: tuple[tuple[int, int, int], ...]


class Query(msgspec.Struct, frozen=True, gc=False):
    """A statement: ``BEGIN``/``COMMIT`` around non-transactional changes, or DDL."""

    thread_id: int
    database: str
    sql: str
    error_code: int


class Xid(msgspec.Struct, frozen=True, gc=False):
    """The commit of a transaction (InnoDB)."""

    xid: int


class TableColumn(msgspec.Struct, frozen=True, gc=False):
    """One column of a table map. ``type`` is the binlog type (``T_*``); for ENUM and SET
    columns (sent as ``T_STRING``) it is ``T_ENUM``/``T_SET``. ``metadata`` is the
    type's parameter: max length (varchar, char), pack length (blob, float), (precision,
    scale) as ``precision << 8 | scale`` (decimal), fraction digits (time kinds), or
    ``bits`` (bit). ``charset`` is the collation id of character columns (63: binary),
    ``values`` the members of an ENUM or SET."""

    name: str
    type: int
    metadata: int
    nullable: bool
    unsigned: bool = False
    charset: int = 0
    values: tuple[str, ...] = ()


class TableMap(msgspec.Struct, frozen=True, gc=False):
    """A table's description, sent before the rows events that use its ``table_id``.

    With ``binlog_row_metadata=FULL`` it carries column names, signedness, charsets,
    ENUM/SET members and the primary key; ``primary_key`` is empty without one (or
    without full metadata, then ``full_metadata`` is False)."""

    table_id: int
    database: str
    table: str
    columns: tuple[TableColumn, ...]
    primary_key: tuple[int, ...]
    full_metadata: bool


class RowsEvent(msgspec.Struct, frozen=True, gc=False):
    """Row images of one table. ``op`` is ``c``, ``u`` or ``d``; ``data`` holds the
    images from ``start`` on (each: a null bitmap, then the present columns' values; an
    update has a before and an after image per row). ``present`` and ``present_after``
    are the column bitmaps as integers (bit i = column i)."""

    table_id: int
    op: str
    flags: int
    column_count: int
    present: int
    present_after: int
    data: bytes
    start: int


# -- primitives ------------------------------------------------------------------------
def read_lenenc(data: bytes, pos: int) -> tuple[int, int]:
    """A length-encoded integer at *pos*: (value, position after it)."""
    first = data[pos]
    if first < 0xFB:
        return first, pos + 1
    if first == 0xFC:
        return data[pos + 1] | data[pos + 2] << 8, pos + 3
    if first == 0xFD:
        return int.from_bytes(data[pos + 1:pos + 4], "little"), pos + 4
    if first == 0xFE:
        return int.from_bytes(data[pos + 1:pos + 9], "little"), pos + 9
    raise ValueError(f"invalid length-encoded integer prefix 0x{first:02x}")


def _bitmap(data: bytes, pos: int, count: int) -> tuple[int, int]:
    size = (count + 7) >> 3
    return int.from_bytes(data[pos:pos + size], "little"), pos + size


_HEADER: Final = struct.Struct("<IBIIIH")


def parse_header(data: bytes) -> EventHeader:
    """The common header of the event in *data* (at least 19 bytes)."""
    if len(data) < HEADER_SIZE:
        raise DecodeError("event header", len(data), "fewer than 19 bytes", "binlog")
    return EventHeader(*_HEADER.unpack_from(data))


def parse_format_description(body: bytes) -> FormatDescription:
    """A FORMAT_DESCRIPTION_EVENT body (after the header, checksum still attached)."""
    try:
        version = struct.unpack_from("<H", body)[0]
        server = body[2:52].split(b"\0", 1)[0].decode("ascii", "replace")
        # The checksum algorithm byte follows the post-header lengths; it sits 5 bytes
        # before the end (4 checksum bytes follow it, whatever the algorithm).
        checksum = body[-5] if _has_checksum_byte(server) else CHECKSUM_OFF
    except (struct.error, IndexError) as err:
        raise DecodeError("FORMAT_DESCRIPTION", 0, str(err), "binlog") from None
    return FormatDescription(version, server, checksum)


def _has_checksum_byte(server_version: str) -> bool:
    # Servers before MySQL 5.6.1 / MariaDB 5.3 wrote no checksum byte.
    digits = server_version.split("-", 1)[0].split(".")
    try:
        major, minor, patch = (int(d) for d in digits[:3])
    except ValueError:
        return True
    if "MariaDB" in server_version:
        return (major, minor) >= (5, 3)
    return (major, minor, patch) >= (5, 6, 1)


def parse_rotate(body: bytes) -> Rotate:
    """A ROTATE_EVENT body (checksum removed)."""
    if len(body) < 8:
        raise DecodeError("ROTATE", len(body), "body shorter than 8 bytes", "binlog")
    return Rotate(struct.unpack_from("<Q", body)[0], body[8:].decode("utf-8", "replace"))


def parse_xa_prepare(body: bytes) -> str:
    """The XID of an XA_PREPARE_LOG_EVENT body (checksum removed), as ``XA RECOVER``
    shows it: ``formatID:gtrid:bqual`` (hex bytes when not UTF-8)."""
    if len(body) < 13:
        raise DecodeError("XA_PREPARE", len(body), "body shorter than 13 bytes", "binlog")
    format_id, gtrid_length, bqual_length = struct.unpack_from("<III", body, 1)
    data = body[13:13 + gtrid_length + bqual_length]

    def text(part: bytes) -> str:
        try:
            return part.decode()
        except UnicodeDecodeError:
            return part.hex()

    return f"{format_id}:{text(data[:gtrid_length])}:{text(data[gtrid_length:])}"


def parse_gtid(body: bytes, server_id: int) -> Gtid:
    """A MariaDB GTID_EVENT body (checksum removed); *server_id* is the header's."""
    if len(body) < 13:
        raise DecodeError("GTID", len(body), "body shorter than 13 bytes", "binlog")
    sequence, domain, flags = struct.unpack_from("<QIB", body)
    return Gtid(domain, server_id, sequence, bool(flags & GTID_FL_STANDALONE))


def parse_gtid_list(body: bytes) -> GtidList:
    """A MariaDB GTID_LIST_EVENT body (checksum removed)."""
    try:
        count = struct.unpack_from("<I", body)[0] & 0x0FFFFFFF
        gtids = tuple(struct.unpack_from("<IIQ", body, 4 + 16 * i) for i in range(count))
    except struct.error as err:
        raise DecodeError("GTID_LIST", 4, str(err), "binlog") from None
    return GtidList(tuple((d, s, q) for d, s, q in gtids))


def parse_query(body: bytes) -> Query:
    """A QUERY_EVENT body (checksum removed)."""
    try:
        thread_id, _exec_time, db_len, error_code, status_len = struct.unpack_from(
            "<IIBHH", body)
        db_at = 13 + status_len
        database = body[db_at:db_at + db_len].decode("utf-8", "replace")
        sql = body[db_at + db_len + 1:].decode("utf-8", "replace")
    except struct.error as err:
        raise DecodeError("QUERY", 0, str(err), "binlog") from None
    return Query(thread_id, database, sql, error_code)


def parse_xid(body: bytes) -> Xid:
    """An XID_EVENT body (checksum removed)."""
    if len(body) < 8:
        raise DecodeError("XID", len(body), "body shorter than 8 bytes", "binlog")
    return Xid(struct.unpack_from("<Q", body)[0])


def parse_table_map(body: bytes) -> TableMap:
    """A TABLE_MAP_EVENT body (checksum removed)."""
    pos = 0
    try:
        table_id = int.from_bytes(body[0:6], "little")
        pos = 8
        db_len = body[pos]
        database = body[pos + 1:pos + 1 + db_len].decode("utf-8")
        pos += 2 + db_len
        table_len = body[pos]
        table = body[pos + 1:pos + 1 + table_len].decode("utf-8")
        pos += 2 + table_len
        count, pos = read_lenenc(body, pos)
        types = list(body[pos:pos + count])
        pos += count
        meta_len, pos = read_lenenc(body, pos)
        metadata = _type_metadata(body[pos:pos + meta_len], types)
        pos += meta_len
        nullable, pos = _bitmap(body, pos, count)
        optional = _optional_metadata(body, pos, types, [t for t, _ in metadata])
    except (IndexError, ValueError, UnicodeDecodeError) as err:
        raise DecodeError("TABLE_MAP", pos, str(err), "binlog") from None
    names = optional.get(_META_COLUMN_NAME) or [f"_col{i}" for i in range(count)]
    unsigned = optional.get(_META_SIGNEDNESS) or [False] * count
    charsets = optional.get(_META_COLUMN_CHARSET) or [0] * count
    values = optional.get(_META_ENUM_STR_VALUE) or [()] * count
    columns = []
    for i, (real_type, meta) in enumerate(metadata):
        columns.append(TableColumn(names[i], real_type, meta, bool(nullable >> i & 1),
                                   unsigned[i], charsets[i], values[i]))
    return TableMap(table_id, database, table, tuple(columns),
                    tuple(optional.get(_META_SIMPLE_PRIMARY_KEY) or ()),
                    _META_COLUMN_NAME in optional)


def _type_metadata(meta: bytes, types: list[int]) -> list[tuple[int, int]]:
    """Each column's (real type, parameter) from the table map's metadata block."""
    out: list[tuple[int, int]] = []
    pos = 0
    for column_type in types:
        if column_type in (T_FLOAT, T_DOUBLE, T_TIMESTAMP2, T_DATETIME2, T_TIME2, T_JSON,
                           T_GEOMETRY) or column_type in _BLOB_TYPES:
            out.append((column_type, meta[pos]))
            pos += 1
        elif column_type in (T_VARCHAR, T_VAR_STRING):
            out.append((column_type, meta[pos] | meta[pos + 1] << 8))
            pos += 2
        elif column_type == T_NEWDECIMAL:
            out.append((column_type, meta[pos] << 8 | meta[pos + 1]))
            pos += 2
        elif column_type == T_BIT:
            bits, size = meta[pos], meta[pos + 1]
            out.append((column_type, size * 8 + bits))
            pos += 2
        elif column_type in (T_STRING, T_ENUM, T_SET):
            byte0, byte1 = meta[pos], meta[pos + 1]
            pos += 2
            if byte0 & 0x30 != 0x30:  # a CHAR longer than 255 bytes: 2 length bits in byte0
                out.append((T_STRING, byte1 | (((byte0 & 0x30) ^ 0x30) << 4)))
            elif byte0 in (T_ENUM, T_SET):
                out.append((byte0, byte1))  # the pack length (1/2 bytes; 1-8 for SET)
            else:
                out.append((byte0, byte1))
        else:
            out.append((column_type, 0))
    return out


def _is_character(column_type: int, real_type: int) -> bool:
    # MariaDB lists GEOMETRY among the character columns of the charset metadata (its
    # own mysqlbinlog reads it so); leaving it out shifts every later column's charset.
    return real_type in (T_STRING, T_VARCHAR, T_VAR_STRING, T_GEOMETRY) \
        or column_type in _BLOB_TYPES


def _optional_metadata(body: bytes, pos: int, types: list[int],
                       real_types: list[int]) -> dict[int, list[Any]]:
    """The TLV fields after the null bitmap, each as one value per column (names,
    unsigned flags, charsets, ENUM/SET members) or a list of key column indexes."""
    count = len(types)
    found: dict[int, list[Any]] = {}
    numeric = [i for i, t in enumerate(real_types) if t in NUMERIC_TYPES]
    character = [i for i, t in enumerate(real_types) if _is_character(types[i], t)]
    enum_columns = [i for i, t in enumerate(real_types) if t == T_ENUM]
    set_columns = [i for i, t in enumerate(real_types) if t == T_SET]
    charsets: list[Any] = [0] * count
    values: list[Any] = [()] * count
    while pos < len(body):
        field = body[pos]
        length, pos = read_lenenc(body, pos + 1)
        value = body[pos:pos + length]
        pos += length
        if field == _META_SIGNEDNESS:
            unsigned: list[Any] = [False] * count
            for n, i in enumerate(numeric):
                unsigned[i] = bool(value[n >> 3] & (0x80 >> (n & 7)))
            found[field] = unsigned
        elif field == _META_COLUMN_NAME:
            names: list[Any] = []
            at = 0
            while at < len(value):
                name, at = _lenenc_text(value, at)
                names.append(name)
            found[field] = names
        elif field in (_META_DEFAULT_CHARSET, _META_ENUM_AND_SET_DEFAULT_CHARSET):
            which = character if field == _META_DEFAULT_CHARSET else enum_columns + set_columns
            default, at = read_lenenc(value, 0)
            for i in which:
                charsets[i] = default
            for index, collation in _lenenc_groups(value, at, 2):
                charsets[which[index]] = collation
            found[_META_COLUMN_CHARSET] = charsets
        elif field in (_META_COLUMN_CHARSET, _META_ENUM_AND_SET_COLUMN_CHARSET):
            which = character if field == _META_COLUMN_CHARSET else enum_columns + set_columns
            at = 0
            for i in which:
                charsets[i], at = read_lenenc(value, at)
            found[_META_COLUMN_CHARSET] = charsets
        elif field in (_META_ENUM_STR_VALUE, _META_SET_STR_VALUE):
            which = enum_columns if field == _META_ENUM_STR_VALUE else set_columns
            at = 0
            for i in which:
                members, at = read_lenenc(value, at)
                strings = []
                for _ in range(members):
                    member, at = _lenenc_text(value, at)
                    strings.append(member)
                values[i] = tuple(strings)
            found[_META_ENUM_STR_VALUE] = values
        elif field == _META_SIMPLE_PRIMARY_KEY:
            found[field] = [index for index, in _lenenc_groups(value, 0, 1)]
        elif field == _META_PRIMARY_KEY_WITH_PREFIX:
            # A key on a column prefix (a BLOB's first bytes) is not a record key
            # that identifies rows by value; the columns still key the record.
            found[_META_SIMPLE_PRIMARY_KEY] = [index for index, _prefix
                                               in _lenenc_groups(value, 0, 2)]
    return found


def _lenenc_text(data: bytes, pos: int) -> tuple[str, int]:
    """A length-encoded UTF-8 string at *pos*: (text, position after it)."""
    size, pos = read_lenenc(data, pos)
    return data[pos:pos + size].decode("utf-8"), pos + size


def _lenenc_groups(data: bytes, pos: int, width: int) -> list[tuple[int, ...]]:
    """Groups of *width* length-encoded integers from *pos* to the end of *data*."""
    groups = []
    while pos < len(data):
        group = []
        for _ in range(width):
            number, pos = read_lenenc(data, pos)
            group.append(number)
        groups.append(tuple(group))
    return groups


def parse_rows(body: bytes, event_type: int, post_header_len: int = 8) -> RowsEvent:
    """A rows event body (checksum removed), v1 (MariaDB) or v2 (MySQL)."""
    op, version = ROWS_EVENTS[event_type]
    try:
        table_id = int.from_bytes(body[0:6], "little")
        flags = body[6] | body[7] << 8
        pos = post_header_len
        if version == 2:
            extra = body[pos] | body[pos + 1] << 8
            pos += extra  # the length includes its own two bytes
        count, pos = read_lenenc(body, pos)
        present, pos = _bitmap(body, pos, count)
        present_after = present
        if op == "u":
            present_after, pos = _bitmap(body, pos, count)
    except (IndexError, ValueError) as err:
        raise DecodeError("ROWS", 0, str(err), "binlog") from None
    return RowsEvent(table_id, op, flags, count, present, present_after, body, pos)


class BinlogChecksumError(DecodeError):
    """An event whose CRC32 does not match its bytes (corruption on disk or wire)."""


class EventDecoder:
    """Splits events into header and body, checking and removing checksums: feed it
    every event of a dump in order. *checksum* is the server's ``binlog_checksum``
    (``CHECKSUM_CRC32`` or ``CHECKSUM_OFF``): the artificial ROTATE a dump starts with
    comes before any format description, and already carries one."""

    def __init__(self, checksum: int = CHECKSUM_OFF) -> None:
        self.checksum = checksum

    def split(self, event: bytes | memoryview) -> tuple[EventHeader, bytes]:
        """The header and the body (without checksum) of one event."""
        data = bytes(event)
        header = parse_header(data)
        if header.type == FORMAT_DESCRIPTION_EVENT:
            description = parse_format_description(data[HEADER_SIZE:])
            self.checksum = description.checksum
        if header.type in _COMPRESSED:
            raise DecodeError(
                f"event type {header.type}", 0,
                "compressed binlog events are not supported: set log_bin_compress=OFF "
                "on the server", "binlog")
        if self.checksum == CHECKSUM_CRC32 and len(data) >= HEADER_SIZE + CHECKSUM_SIZE:
            expected = int.from_bytes(data[-4:], "little")
            if zlib.crc32(data[:-4]) != expected:
                raise BinlogChecksumError(f"event type {header.type}", len(data) - 4,
                                          "CRC32 checksum mismatch", "binlog")
            return header, data[HEADER_SIZE:-4]
        return header, data[HEADER_SIZE:]
