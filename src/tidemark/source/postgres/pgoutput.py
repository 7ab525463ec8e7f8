"""I/O-free decoder for PostgreSQL's ``pgoutput`` logical replication protocol.

Bytes in, immutable message objects out; one ``parse_*`` function per message type
and :func:`decode_message` to dispatch on the type byte. Protocol version 1 messages
and the version 2 streaming messages (Stream Start/Stop/Commit/Abort) are supported;
inside a streamed block (between Stream Start and Stream Stop) data messages carry a
transaction id, so callers pass ``in_stream=True`` there, or use :class:`MessageDecoder`
which tracks that state.

Column values in tuples are left in the wire form the server sent: ``str`` for text
format, ``bytes`` for binary format, ``None`` for SQL NULL and :data:`UNCHANGED_TOAST`
for an unchanged TOASTed value that the server did not send. Type conversion is the
job of :mod:`tidemark.source.postgres.types`.

Malformed input raises :class:`tidemark.errors.DecodeError` naming the message type
and the byte offset, never ``IndexError`` or ``struct.error``.

Reference: https://www.postgresql.org/docs/15/protocol-logicalrep-message-formats.html
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from typing import Final, TypeAlias

import msgspec

from tidemark.errors import DecodeError
from tidemark.event import UNAVAILABLE, WireTuple
from tidemark.event import WireValue as WireValue_

#: Microseconds between the Unix epoch and PostgreSQL's epoch (2000-01-01 UTC).
PG_EPOCH_OFFSET_US: Final = 946_684_800_000_000


#: The marker for a TOASTed column whose value the server did not send (unchanged).
UNCHANGED_TOAST: Final = UNAVAILABLE

WireValue: TypeAlias = WireValue_
TupleData: TypeAlias = WireTuple

# Replica identity settings as sent in Relation messages.
REPLICA_IDENTITY_DEFAULT: Final = "d"
REPLICA_IDENTITY_NOTHING: Final = "n"
REPLICA_IDENTITY_FULL: Final = "f"
REPLICA_IDENTITY_INDEX: Final = "i"


# -- messages ---------------------------------------------------------------------------
class Begin(msgspec.Struct, frozen=True, gc=False):
    """Start of a committed transaction. ``commit_ts`` is µs since the Unix epoch."""

    final_lsn: int
    commit_ts: int
    xid: int


class Commit(msgspec.Struct, frozen=True, gc=False):
    """End of a transaction; ``end_lsn`` is where a resumed stream starts after it."""

    flags: int
    commit_lsn: int
    end_lsn: int
    commit_ts: int


class Origin(msgspec.Struct, frozen=True, gc=False):
    """Replication origin of the transaction (set by upstream logical replication)."""

    commit_lsn: int
    name: str


class RelationColumn(msgspec.Struct, frozen=True, gc=False):
    """One column of a Relation message."""

    name: str
    type_oid: int
    type_modifier: int
    is_key: bool


class Relation(msgspec.Struct, frozen=True, gc=False):
    """Describes a table; sent before the first change to it and after any DDL."""

    xid: int | None
    relation_id: int
    namespace: str
    name: str
    replica_identity: str
    columns: tuple[RelationColumn, ...]


class Type(msgspec.Struct, frozen=True, gc=False):
    """Describes a non-built-in data type (enum, domain, composite …) used by a column."""

    xid: int | None
    type_oid: int
    namespace: str
    name: str


class Insert(msgspec.Struct, frozen=True, gc=False):
    """A new row."""

    xid: int | None
    relation_id: int
    new: TupleData


class Update(msgspec.Struct, frozen=True, gc=False):
    """A changed row.

    ``old_kind`` is ``"K"`` when ``old`` holds only the replica identity columns (the key
    changed), ``"O"`` when it is the whole old row (REPLICA IDENTITY FULL), and ``None``
    when the server sent no old tuple.
    """

    xid: int | None
    relation_id: int
    old_kind: str | None
    old: TupleData | None
    new: TupleData


class Delete(msgspec.Struct, frozen=True, gc=False):
    """A removed row; ``old`` holds the key (``"K"``) or the whole row (``"O"``)."""

    xid: int | None
    relation_id: int
    old_kind: str
    old: TupleData


class Truncate(msgspec.Struct, frozen=True, gc=False):
    """TRUNCATE of one or more tables."""

    xid: int | None
    cascade: bool
    restart_identity: bool
    relation_ids: tuple[int, ...]


class LogicalMessage(msgspec.Struct, frozen=True, gc=False):
    """A message written with ``pg_logical_emit_message``."""

    xid: int | None
    transactional: bool
    lsn: int
    prefix: str
    content: bytes


class StreamStart(msgspec.Struct, frozen=True, gc=False):
    """Start of a block of changes of an in-progress (streamed) transaction."""

    xid: int
    first_segment: bool


class StreamStop(msgspec.Struct, frozen=True, gc=False):
    """End of a block of streamed changes."""


class StreamCommit(msgspec.Struct, frozen=True, gc=False):
    """Commit of a streamed transaction."""

    xid: int
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_ts: int


class StreamAbort(msgspec.Struct, frozen=True, gc=False):
    """Abort of a streamed (sub)transaction; drop what was streamed for ``subxid``."""

    xid: int
    subxid: int


Message: TypeAlias = (
    Begin | Commit | Origin | Relation | Type | Insert | Update | Delete | Truncate
    | LogicalMessage | StreamStart | StreamStop | StreamCommit | StreamAbort
)  # fmt: skip

_MESSAGE_NAMES: Final = {
    ord("B"): "Begin", ord("C"): "Commit", ord("O"): "Origin", ord("R"): "Relation",
    ord("Y"): "Type", ord("I"): "Insert", ord("U"): "Update", ord("D"): "Delete",
    ord("T"): "Truncate", ord("M"): "Message", ord("S"): "StreamStart",
    ord("E"): "StreamStop", ord("c"): "StreamCommit", ord("A"): "StreamAbort",
}  # fmt: skip

_u8 = struct.Struct(">B").unpack_from
_u16 = struct.Struct(">H").unpack_from
_u32 = struct.Struct(">I").unpack_from
_i32 = struct.Struct(">i").unpack_from
_u64 = struct.Struct(">Q").unpack_from
_i64 = struct.Struct(">q").unpack_from
_begin = struct.Struct(">QqI").unpack_from
_commit = struct.Struct(">BQQq").unpack_from


# -- a small bounds-checked reader, for everything but the hot tuple path ---------------
class _Reader:
    __slots__ = ("data", "name", "pos")

    def __init__(self, data: bytes, name: str, pos: int = 1) -> None:
        self.data = data
        self.name = name
        self.pos = pos

    def fail(self, reason: str, pos: int | None = None) -> DecodeError:
        return DecodeError(self.name, self.pos if pos is None else pos, reason)

    def need(self, n: int, what: str) -> None:
        if self.pos + n > len(self.data):
            raise self.fail(f"truncated: {what} needs {n} bytes, "
                            f"{len(self.data) - self.pos} left")

    def _int(self, unpack: Callable[[bytes, int], tuple[int]], size: int, what: str) -> int:
        self.need(size, what)
        (value,) = unpack(self.data, self.pos)
        self.pos += size
        return int(value)

    def u8(self, what: str) -> int:
        return self._int(_u8, 1, what)

    def u16(self, what: str) -> int:
        return self._int(_u16, 2, what)

    def u32(self, what: str) -> int:
        return self._int(_u32, 4, what)

    def i32(self, what: str) -> int:
        return self._int(_i32, 4, what)

    def u64(self, what: str) -> int:
        return self._int(_u64, 8, what)

    def i64(self, what: str) -> int:
        return self._int(_i64, 8, what)

    def cstring(self, what: str) -> str:
        end = self.data.find(b"\x00", self.pos)
        if end < 0:
            raise self.fail(f"truncated: {what} has no terminating NUL")
        raw = self.data[self.pos : end]
        try:
            text = raw.decode()
        except UnicodeDecodeError as err:
            raise self.fail(f"{what} is not valid UTF-8") from err
        self.pos = end + 1
        return text

    def raw(self, n: int, what: str) -> bytes:
        self.need(n, what)
        value = self.data[self.pos : self.pos + n]
        self.pos += n
        return value

    def xid_if(self, in_stream: bool) -> int | None:
        return self.u32("transaction id") if in_stream else None

    def end(self) -> None:
        if self.pos != len(self.data):
            raise self.fail(f"{len(self.data) - self.pos} unexpected trailing bytes")


def _check_type(data: bytes, expected: str) -> None:
    if not data:
        raise DecodeError(_MESSAGE_NAMES[ord(expected)], 0, "empty message")
    if data[0] != ord(expected):
        raise DecodeError(_MESSAGE_NAMES[ord(expected)], 0,
                          f"type byte is {data[:1]!r}, expected {expected!r}")


# -- tuple data -------------------------------------------------------------------------
def _parse_tuple_reference(r: _Reader) -> TupleData:
    """Bounds-checked tuple parser; exact error offsets. Used on the slow path."""
    ncols = r.u16("tuple column count")
    values: list[WireValue] = []
    for i in range(ncols):
        kind_pos = r.pos
        kind = r.u8(f"column {i} kind")
        if kind == 0x6E:  # 'n'
            values.append(None)
        elif kind == 0x75:  # 'u'
            values.append(UNCHANGED_TOAST)
        elif kind in (0x74, 0x62):  # 't', 'b'
            length = r.i32(f"column {i} length")
            if length < 0:
                raise r.fail(f"column {i} has negative length {length}", r.pos - 4)
            value = r.raw(length, f"column {i} value")
            if kind == 0x62:
                values.append(value)
            else:
                try:
                    values.append(value.decode())
                except UnicodeDecodeError as err:
                    raise r.fail(f"column {i} text is not valid UTF-8", r.pos - length) from err
        else:
            raise r.fail(f"column {i} has unknown kind byte {bytes([kind])!r}", kind_pos)
    return tuple(values)


_TupleParser: TypeAlias = Callable[[bytes, str, int], tuple[TupleData, int]]
_TUPLE_PARSERS: dict[int, _TupleParser] = {}
_MAX_COLUMNS: Final = 1600


def _make_tuple_parser(ncols: int) -> _TupleParser:
    """Generate straight-line code parsing a tuple of *ncols* columns.

    A generic per-column loop spends most of its time in interpreter overhead; code
    unrolled per column count is several times faster. The caller passes the message
    decoded once as latin-1 *text* (one character per byte, so byte offsets are
    character offsets) and text values are plain slices of it; for a message that is
    not pure ASCII the caller re-decodes those slices as UTF-8.
    """
    lines = ["def parse(data, text, pos, _u32=_u32):"]
    names = []
    for i in range(ncols):
        v = f"v{i}"
        names.append(v)
        lines += [
            "    k = data[pos]",
            "    if k == 116:",
            "        end = pos + 5 + _u32(data, pos + 1)[0]",
            f"        {v} = text[pos + 5:end]; pos = end",
            "    elif k == 110:",
            f"        {v} = None; pos += 1",
            "    elif k == 117:",
            f"        {v} = _UNCHANGED; pos += 1",
            "    elif k == 98:",
            "        n = _u32(data, pos + 1)[0]; pos += 5",
            f"        {v} = data[pos:pos + n]; pos += n",
            "    else:",
            "        raise _BadTupleError",
        ]
    lines.append("    if pos > len(data): raise _BadTupleError")
    lines.append(f"    return ({', '.join(names)}{',' if ncols == 1 else ''}), pos")
    namespace: dict[str, object] = {
        "_u32": _u32, "_UNCHANGED": UNCHANGED_TOAST, "_BadTupleError": _BadTupleError,
    }
    exec("\n".join(lines), namespace)
    parser: _TupleParser = namespace["parse"]  # type: ignore[assignment]
    return parser


class _BadTupleError(Exception):
    """Raised inside generated parsers; the reference parser then locates the fault."""


def _parse_tuple(data: bytes, text: str, pos: int, name: str) -> tuple[TupleData, int]:
    """Parse TupleData at *pos*; fast generated path, exact errors via the reference.

    *text* is ``data.decode("latin-1")``; see :func:`_latin1`.
    """
    try:
        ncols = (data[pos] << 8) | data[pos + 1]
        parser = _TUPLE_PARSERS.get(ncols)
        if parser is None:
            # Every column takes at least one byte; a count the message cannot hold is
            # corrupt, and must not make us compile (and cache) a parser for it.
            # PostgreSQL tables have at most 1600 columns.
            if ncols > len(data) - pos - 2 or ncols > _MAX_COLUMNS:
                raise _BadTupleError
            parser = _TUPLE_PARSERS[ncols] = _make_tuple_parser(ncols)
        values, end = parser(data, text, pos + 2)
        if not data.isascii():
            values = tuple(v.encode("latin-1").decode() if v.__class__ is str else v
                           for v in values)
        return values, end
    except (_BadTupleError, IndexError, struct.error, UnicodeDecodeError):
        # The reference parser raises the precise DecodeError; were it to accept the
        # data after all, its result is as good as the fast path's.
        r = _Reader(data, name, pos)
        values = _parse_tuple_reference(r)
        return values, r.pos


def _latin1(data: bytes) -> str:
    # One decode per message instead of one per value: latin-1 maps every byte to one
    # character, so the tuple parser can slice values out by byte offsets.
    return data.decode("latin-1")


# -- one function per message type ------------------------------------------------------
def parse_begin(data: bytes) -> Begin:
    """Parse a Begin ('B') message."""
    _check_type(data, "B")
    if len(data) != 21:
        raise DecodeError("Begin", min(len(data), 21), f"expected 21 bytes, got {len(data)}")
    final_lsn, ts, xid = _begin(data, 1)
    return Begin(final_lsn, ts + PG_EPOCH_OFFSET_US, xid)


def parse_commit(data: bytes) -> Commit:
    """Parse a Commit ('C') message."""
    _check_type(data, "C")
    if len(data) != 26:
        raise DecodeError("Commit", min(len(data), 26), f"expected 26 bytes, got {len(data)}")
    flags, commit_lsn, end_lsn, ts = _commit(data, 1)
    return Commit(flags, commit_lsn, end_lsn, ts + PG_EPOCH_OFFSET_US)


def parse_origin(data: bytes) -> Origin:
    """Parse an Origin ('O') message."""
    _check_type(data, "O")
    r = _Reader(data, "Origin")
    msg = Origin(r.u64("commit LSN"), r.cstring("origin name"))
    r.end()
    return msg


def parse_relation(data: bytes, in_stream: bool = False) -> Relation:
    """Parse a Relation ('R') message."""
    _check_type(data, "R")
    r = _Reader(data, "Relation")
    xid = r.xid_if(in_stream)
    relation_id = r.u32("relation id")
    namespace = r.cstring("namespace")
    name = r.cstring("relation name")
    identity = chr(r.u8("replica identity"))
    if identity not in "dnfi":
        raise r.fail(f"unknown replica identity {identity!r}", r.pos - 1)
    ncols = r.u16("column count")
    columns = []
    for i in range(ncols):
        flags = r.u8(f"column {i} flags")
        col_name = r.cstring(f"column {i} name")
        type_oid = r.u32(f"column {i} type oid")
        typmod = r.i32(f"column {i} type modifier")
        columns.append(RelationColumn(col_name, type_oid, typmod, bool(flags & 1)))
    r.end()
    return Relation(xid, relation_id, namespace, name, identity, tuple(columns))


def parse_type(data: bytes, in_stream: bool = False) -> Type:
    """Parse a Type ('Y') message."""
    _check_type(data, "Y")
    r = _Reader(data, "Type")
    msg = Type(r.xid_if(in_stream), r.u32("type oid"), r.cstring("namespace"),
               r.cstring("type name"))
    r.end()
    return msg


def _expect_end(data: bytes, pos: int, name: str) -> None:
    if pos != len(data):
        raise DecodeError(name, min(pos, len(data)),
                          f"{len(data) - pos} unexpected trailing bytes")


def parse_insert(data: bytes, in_stream: bool = False) -> Insert:
    """Parse an Insert ('I') message."""
    # Hot path: no _Reader; bounds are checked by the tuple parser and _expect_end.
    if len(data) < 8 + (4 if in_stream else 0) or data[0] != 0x49:
        _check_type(data, "I")
        raise DecodeError("Insert", len(data), "truncated header")
    if in_stream:
        xid: int | None = _u32(data, 1)[0]
        pos = 5
    else:
        xid, pos = None, 1
    relation_id = _u32(data, pos)[0]
    if data[pos + 4] != 0x4E:  # 'N'
        raise DecodeError("Insert", pos + 4, f"expected 'N', got {data[pos + 4:pos + 5]!r}")
    new, end = _parse_tuple(data, data.decode("latin-1"), pos + 5, "Insert")
    _expect_end(data, end, "Insert")
    return Insert(xid, relation_id, new)


def parse_update(data: bytes, in_stream: bool = False) -> Update:
    """Parse an Update ('U') message (with optional 'K' or 'O' old tuple)."""
    if len(data) < 8 + (4 if in_stream else 0) or data[0] != 0x55:
        _check_type(data, "U")
        raise DecodeError("Update", len(data), "truncated header")
    if in_stream:
        xid: int | None = _u32(data, 1)[0]
        pos = 5
    else:
        xid, pos = None, 1
    relation_id = _u32(data, pos)[0]
    pos += 4
    text = _latin1(data)
    kind = data[pos]
    old_kind: str | None = None
    old: TupleData | None = None
    if kind in (0x4B, 0x4F):  # 'K', 'O'
        old_kind = chr(kind)
        old, pos = _parse_tuple(data, text, pos + 1, "Update")
        if pos >= len(data):
            raise DecodeError("Update", pos, "truncated: missing new tuple")
        kind = data[pos]
    if kind != 0x4E:
        raise DecodeError("Update", pos, f"expected 'K', 'O' or 'N', got {bytes([kind])!r}")
    new, end = _parse_tuple(data, text, pos + 1, "Update")
    _expect_end(data, end, "Update")
    return Update(xid, relation_id, old_kind, old, new)


def parse_delete(data: bytes, in_stream: bool = False) -> Delete:
    """Parse a Delete ('D') message."""
    if len(data) < 8 + (4 if in_stream else 0) or data[0] != 0x44:
        _check_type(data, "D")
        raise DecodeError("Delete", len(data), "truncated header")
    if in_stream:
        xid: int | None = _u32(data, 1)[0]
        pos = 5
    else:
        xid, pos = None, 1
    relation_id = _u32(data, pos)[0]
    pos += 4
    kind = data[pos]
    if kind not in (0x4B, 0x4F):
        raise DecodeError("Delete", pos, f"expected 'K' or 'O', got {bytes([kind])!r}")
    old, end = _parse_tuple(data, _latin1(data), pos + 1, "Delete")
    _expect_end(data, end, "Delete")
    return Delete(xid, relation_id, chr(kind), old)


def parse_row(data: bytes) -> TupleData:
    """The row a row message carries: an Insert's or Update's new tuple, a Delete's old
    (key or whole-row) tuple. Raises :class:`DecodeError` for anything else."""
    if data[:1] == b"I":
        return parse_insert(data).new
    if data[:1] == b"U":
        return parse_update(data).new
    return parse_delete(data).old


def parse_truncate(data: bytes, in_stream: bool = False) -> Truncate:
    """Parse a Truncate ('T') message."""
    _check_type(data, "T")
    r = _Reader(data, "Truncate")
    xid = r.xid_if(in_stream)
    nrels = r.u32("relation count")
    options = r.u8("options")
    r.need(4 * nrels, "relation ids")
    relids = tuple(r.u32("relation id") for _ in range(nrels))
    r.end()
    return Truncate(xid, bool(options & 1), bool(options & 2), relids)


def parse_logical_message(data: bytes, in_stream: bool = False) -> LogicalMessage:
    """Parse a logical decoding Message ('M')."""
    _check_type(data, "M")
    r = _Reader(data, "Message")
    xid = r.xid_if(in_stream)
    flags = r.u8("flags")
    lsn = r.u64("LSN")
    prefix = r.cstring("prefix")
    length = r.u32("content length")
    content = r.raw(length, "content")
    r.end()
    return LogicalMessage(xid, bool(flags & 1), lsn, prefix, content)


def parse_stream_start(data: bytes) -> StreamStart:
    """Parse a Stream Start ('S') message (protocol v2)."""
    _check_type(data, "S")
    r = _Reader(data, "StreamStart")
    msg = StreamStart(r.u32("transaction id"), r.u8("first segment flag") == 1)
    r.end()
    return msg


def parse_stream_stop(data: bytes) -> StreamStop:
    """Parse a Stream Stop ('E') message (protocol v2)."""
    _check_type(data, "E")
    _Reader(data, "StreamStop").end()
    return StreamStop()


def parse_stream_commit(data: bytes) -> StreamCommit:
    """Parse a Stream Commit ('c') message (protocol v2)."""
    _check_type(data, "c")
    r = _Reader(data, "StreamCommit")
    msg = StreamCommit(r.u32("transaction id"), r.u8("flags"), r.u64("commit LSN"),
                       r.u64("end LSN"), r.i64("commit timestamp") + PG_EPOCH_OFFSET_US)
    r.end()
    return msg


def parse_stream_abort(data: bytes) -> StreamAbort:
    """Parse a Stream Abort ('A') message (protocol v2; v4's extra fields are ignored)."""
    _check_type(data, "A")
    r = _Reader(data, "StreamAbort")
    msg = StreamAbort(r.u32("transaction id"), r.u32("subtransaction id"))
    if r.pos not in (len(data), len(data) - 16):
        raise r.fail(f"{len(data) - r.pos} unexpected trailing bytes")
    return msg


_STREAM_AWARE: Final[dict[int, Callable[[bytes, bool], Message]]] = {
    0x49: parse_insert, 0x55: parse_update, 0x44: parse_delete, 0x52: parse_relation,
    0x59: parse_type, 0x54: parse_truncate, 0x4D: parse_logical_message,
}  # fmt: skip
_PLAIN: Final[dict[int, Callable[[bytes], Message]]] = {
    0x42: parse_begin, 0x43: parse_commit, 0x4F: parse_origin, 0x53: parse_stream_start,
    0x45: parse_stream_stop, 0x63: parse_stream_commit, 0x41: parse_stream_abort,
}  # fmt: skip


def decode_message(data: bytes, in_stream: bool = False) -> Message:
    """Decode one pgoutput message.

    *in_stream* must be true between Stream Start and Stream Stop, where data messages
    carry the id of their (in-progress) transaction.
    """
    if not data:
        raise DecodeError("unknown", 0, "empty message")
    kind = data[0]
    stream_aware = _STREAM_AWARE.get(kind)
    if stream_aware is not None:
        return stream_aware(data, in_stream)
    plain = _PLAIN.get(kind)
    if plain is not None:
        return plain(data)
    raise DecodeError(f"type {data[:1]!r}", 0, "unknown message type")


class MessageDecoder:
    """Stateful wrapper of :func:`decode_message` that tracks streamed blocks."""

    __slots__ = ("in_stream",)

    def __init__(self) -> None:
        self.in_stream = False

    def decode(self, data: bytes) -> Message:
        """Decode one message, updating the in-stream state on Stream Start/Stop."""
        msg = decode_message(data, self.in_stream)
        if isinstance(msg, StreamStart):
            self.in_stream = True
        elif isinstance(msg, StreamStop):
            self.in_stream = False
        return msg


def lsn_to_str(lsn: int) -> str:
    """Format an LSN the way PostgreSQL prints it (``16/B374D848``)."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def str_to_lsn(text: str) -> int:
    """Parse ``16/B374D848`` into an integer LSN."""
    match = _LSN_TEXT.fullmatch(text)
    if match is None:
        raise ValueError(f"not an LSN: {text!r} (expected the form 16/B374D848)")
    return (int(match.group(1), 16) << 32) | int(match.group(2), 16)


_LSN_TEXT: Final = re.compile(r"([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})")
