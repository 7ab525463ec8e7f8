"""I/O-free decoder for the MariaDB/MySQL binary log's events, as a replication client
receives them (``COM_BINLOG_DUMP``).

Bytes in, immutable event objects out: :func:`parse_header` reads the 19-byte common
header, one ``parse_*`` function per event type reads the body (the table map's, the
longest, in :mod:`tidemark.source.mariadb.table_map`). Rows events keep their row images
as bytes (:class:`RowsEvent`); :mod:`tidemark.source.mariadb.row_decoder` turns them into
column values with the table map that precedes them, because that is the hot path and is
generated per table.

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
from typing import Final

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


def read_bitmap(data: bytes, pos: int, count: int) -> tuple[int, int]:
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
        present, pos = read_bitmap(body, pos, count)
        present_after = present
        if op == "u":
            present_after, pos = read_bitmap(body, pos, count)
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
