"""Encoder for pgoutput messages (the inverse of the decoder) and hypothesis strategies.

:func:`encode_message` turns each message struct of
:mod:`tidemark.source.postgres.pgoutput` back into the bytes a walsender would send, so
that tests can check ``decode_message(encode_message(m, s), s) == m`` and build
well-formed (and, by mutating them, malformed) input without a database.

Wire format: https://www.postgresql.org/docs/15/protocol-logicalrep-message-formats.html
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Final

from hypothesis import strategies as st

from tidemark.source.postgres.pgoutput import (
    PG_EPOCH_OFFSET_US,
    UNCHANGED_TOAST,
    Begin,
    Commit,
    Delete,
    Insert,
    LogicalMessage,
    Message,
    Origin,
    Relation,
    RelationColumn,
    StreamAbort,
    StreamCommit,
    StreamStart,
    StreamStop,
    Truncate,
    TupleData,
    Type,
    Update,
    WireValue,
)

U8_MAX: Final = 2**8 - 1
U32_MAX: Final = 2**32 - 1
U64_MAX: Final = 2**64 - 1
I32_MIN: Final = -(2**31)
I32_MAX: Final = 2**31 - 1
I64_MIN: Final = -(2**63)
I64_MAX: Final = 2**63 - 1

#: The range of Unix-epoch µs timestamps whose PostgreSQL-epoch form fits in an Int64.
TS_MIN: Final = I64_MIN + PG_EPOCH_OFFSET_US
TS_MAX: Final = I64_MAX + PG_EPOCH_OFFSET_US

#: The largest number of tuple columns the strategies generate.
MAX_COLUMNS: Final = 40

_U8: Final = struct.Struct(">B")
_U16: Final = struct.Struct(">H")
_U32: Final = struct.Struct(">I")
_I32: Final = struct.Struct(">i")
_U64: Final = struct.Struct(">Q")
_I64: Final = struct.Struct(">q")


# -- primitive encoders -----------------------------------------------------------------
def u8(value: int) -> bytes:
    """Int8 (unsigned, as pgoutput uses it for flags and kind bytes)."""
    return _U8.pack(value)


def u16(value: int) -> bytes:
    """Int16, unsigned (column counts)."""
    return _U16.pack(value)


def u32(value: int) -> bytes:
    """Int32, unsigned (OIDs, transaction ids, counts)."""
    return _U32.pack(value)


def i32(value: int) -> bytes:
    """Int32, signed (type modifiers, value lengths)."""
    return _I32.pack(value)


def u64(value: int) -> bytes:
    """Int64, unsigned (LSNs)."""
    return _U64.pack(value)


def pg_timestamp(unix_us: int) -> bytes:
    """Int64 TimestampTz: µs since 2000-01-01, from µs since the Unix epoch."""
    return _I64.pack(unix_us - PG_EPOCH_OFFSET_US)


def cstring(text: str) -> bytes:
    """A NUL-terminated UTF-8 String."""
    raw = text.encode()
    if b"\x00" in raw:
        raise ValueError(f"a protocol String cannot contain NUL: {text!r}")
    return raw + b"\x00"


def xid_field(xid: int | None, in_stream: bool) -> bytes:
    """The transaction id that data messages carry only inside a streamed block."""
    if in_stream:
        if xid is None:
            raise ValueError("a message inside a streamed block needs an xid")
        return u32(xid)
    if xid is not None:
        raise ValueError(f"xid {xid} is only sent inside a streamed block")
    return b""


def encode_value(value: WireValue) -> bytes:
    """One TupleData column: 'n', 'u', 't' + Int32 length + text or 'b' + length + bytes."""
    if value is None:
        return b"n"
    if value is UNCHANGED_TOAST:
        return b"u"
    if isinstance(value, str):
        raw = value.encode()
        return b"t" + i32(len(raw)) + raw
    if isinstance(value, bytes):
        return b"b" + i32(len(value)) + value
    raise TypeError(f"not a wire value: {value!r}")


def encode_tuple(values: TupleData) -> bytes:
    """TupleData: Int16 column count, then each column."""
    return u16(len(values)) + b"".join(encode_value(v) for v in values)


# -- one encoder per message type -------------------------------------------------------
def encode_begin(msg: Begin) -> bytes:
    """Begin ('B')."""
    return b"B" + u64(msg.final_lsn) + pg_timestamp(msg.commit_ts) + u32(msg.xid)


def encode_commit(msg: Commit) -> bytes:
    """Commit ('C')."""
    return (b"C" + u8(msg.flags) + u64(msg.commit_lsn) + u64(msg.end_lsn)
            + pg_timestamp(msg.commit_ts))


def encode_origin(msg: Origin) -> bytes:
    """Origin ('O')."""
    return b"O" + u64(msg.commit_lsn) + cstring(msg.name)


def encode_relation_column(column: RelationColumn) -> bytes:
    """One column of a Relation message: flags, name, type OID, type modifier."""
    return (u8(1 if column.is_key else 0) + cstring(column.name) + u32(column.type_oid)
            + i32(column.type_modifier))


def encode_relation(msg: Relation, in_stream: bool = False) -> bytes:
    """Relation ('R')."""
    return (b"R" + xid_field(msg.xid, in_stream) + u32(msg.relation_id)
            + cstring(msg.namespace) + cstring(msg.name) + msg.replica_identity.encode()
            + u16(len(msg.columns)) + b"".join(map(encode_relation_column, msg.columns)))


def encode_type(msg: Type, in_stream: bool = False) -> bytes:
    """Type ('Y')."""
    return (b"Y" + xid_field(msg.xid, in_stream) + u32(msg.type_oid)
            + cstring(msg.namespace) + cstring(msg.name))


def encode_insert(msg: Insert, in_stream: bool = False) -> bytes:
    """Insert ('I'): always an 'N' new tuple."""
    return (b"I" + xid_field(msg.xid, in_stream) + u32(msg.relation_id) + b"N"
            + encode_tuple(msg.new))


def encode_update(msg: Update, in_stream: bool = False) -> bytes:
    """Update ('U'): optional 'K' or 'O' old tuple, then the 'N' new tuple."""
    if (msg.old_kind is None) != (msg.old is None):
        raise ValueError("old_kind and old must both be set or both be None")
    old = b""
    if msg.old_kind is not None and msg.old is not None:
        if msg.old_kind not in ("K", "O"):
            raise ValueError(f"old_kind must be 'K' or 'O', not {msg.old_kind!r}")
        old = msg.old_kind.encode() + encode_tuple(msg.old)
    return (b"U" + xid_field(msg.xid, in_stream) + u32(msg.relation_id) + old + b"N"
            + encode_tuple(msg.new))


def encode_delete(msg: Delete, in_stream: bool = False) -> bytes:
    """Delete ('D'): a 'K' or 'O' old tuple."""
    if msg.old_kind not in ("K", "O"):
        raise ValueError(f"old_kind must be 'K' or 'O', not {msg.old_kind!r}")
    return (b"D" + xid_field(msg.xid, in_stream) + u32(msg.relation_id)
            + msg.old_kind.encode() + encode_tuple(msg.old))


def encode_truncate(msg: Truncate, in_stream: bool = False) -> bytes:
    """Truncate ('T'): option bit 1 is CASCADE, bit 2 RESTART IDENTITY."""
    options = (1 if msg.cascade else 0) | (2 if msg.restart_identity else 0)
    return (b"T" + xid_field(msg.xid, in_stream) + u32(len(msg.relation_ids)) + u8(options)
            + b"".join(map(u32, msg.relation_ids)))


def encode_logical_message(msg: LogicalMessage, in_stream: bool = False) -> bytes:
    """Message ('M') written by ``pg_logical_emit_message``."""
    return (b"M" + xid_field(msg.xid, in_stream) + u8(1 if msg.transactional else 0)
            + u64(msg.lsn) + cstring(msg.prefix) + u32(len(msg.content)) + msg.content)


def encode_stream_start(msg: StreamStart) -> bytes:
    """Stream Start ('S')."""
    return b"S" + u32(msg.xid) + u8(1 if msg.first_segment else 0)


def encode_stream_stop(msg: StreamStop) -> bytes:
    """Stream Stop ('E')."""
    del msg
    return b"E"


def encode_stream_commit(msg: StreamCommit) -> bytes:
    """Stream Commit ('c')."""
    return (b"c" + u32(msg.xid) + u8(msg.flags) + u64(msg.commit_lsn) + u64(msg.end_lsn)
            + pg_timestamp(msg.commit_ts))


def encode_stream_abort(msg: StreamAbort, abort_lsn: int | None = None,
                        abort_ts: int | None = None) -> bytes:
    """Stream Abort ('A'); with *abort_lsn* and *abort_ts* the protocol v4 (parallel) form."""
    tail = b""
    if abort_lsn is not None or abort_ts is not None:
        tail = u64(abort_lsn or 0) + pg_timestamp(abort_ts or PG_EPOCH_OFFSET_US)
    return b"A" + u32(msg.xid) + u32(msg.subxid) + tail


def encode_message(msg: Message, in_stream: bool = False) -> bytes:
    """Encode *msg* as pgoutput sends it; *in_stream* as for ``decode_message``.

    Data messages (Relation, Type, Insert, Update, Delete, Truncate, Message) carry
    their ``xid`` on the wire only inside a streamed block, so it must be an ``int``
    when *in_stream* is true and ``None`` otherwise. Other messages ignore *in_stream*.
    """
    match msg:
        case Begin():
            return encode_begin(msg)
        case Commit():
            return encode_commit(msg)
        case Origin():
            return encode_origin(msg)
        case Relation():
            return encode_relation(msg, in_stream)
        case Type():
            return encode_type(msg, in_stream)
        case Insert():
            return encode_insert(msg, in_stream)
        case Update():
            return encode_update(msg, in_stream)
        case Delete():
            return encode_delete(msg, in_stream)
        case Truncate():
            return encode_truncate(msg, in_stream)
        case LogicalMessage():
            return encode_logical_message(msg, in_stream)
        case StreamStart():
            return encode_stream_start(msg)
        case StreamStop():
            return encode_stream_stop(msg)
        case StreamCommit():
            return encode_stream_commit(msg)
        case StreamAbort():
            return encode_stream_abort(msg)
    raise TypeError(f"not a pgoutput message: {msg!r}")


# -- hypothesis strategies --------------------------------------------------------------
u8s: Final = st.integers(0, U8_MAX)
u32s: Final = st.integers(0, U32_MAX)
i32s: Final = st.integers(I32_MIN, I32_MAX)
u64s: Final = st.integers(0, U64_MAX)
#: Commit timestamps (µs since the Unix epoch): the full Int64 range, often near now.
timestamps: Final = st.one_of(
    st.integers(TS_MIN, TS_MAX),
    st.integers(1_600_000_000_000_000, 1_900_000_000_000_000),
    st.sampled_from([TS_MIN, TS_MAX, 0, PG_EPOCH_OFFSET_US]),
)

#: Unsigned 32-bit integers all of whose four bytes are ASCII (< 0x80).
ascii_u32s: Final = st.tuples(*[st.integers(0, 0x7F)] * 4).map(
    lambda b: int.from_bytes(bytes(b), "big")
)

_utf8_chars: Final = st.characters(codec="utf-8")
#: Protocol Strings: any UTF-8 text without NUL.
names: Final = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=24)

ascii_texts: Final = st.text(st.characters(codec="ascii"), max_size=30)
unicode_texts: Final = st.text(_utf8_chars, max_size=30)
#: Text that is certainly not ASCII (so the decoder's per-value UTF-8 path runs).
non_ascii_texts: Final = st.builds(
    lambda a, c, b: a + c + b,
    st.text(_utf8_chars, max_size=10),
    st.characters(codec="utf-8", min_codepoint=0x80),
    st.text(_utf8_chars, max_size=10),
)
binaries: Final = st.binary(max_size=40)
large_texts: Final = st.builds(
    lambda unit, n: unit * n,
    st.sampled_from(["x", "é", "日本語", "a\U0001d11e", "\x00"]),
    st.integers(20_000, 80_000),
)
large_binaries: Final = st.builds(
    lambda unit, n: unit * n,
    st.sampled_from([b"\x00", b"\xff\xfe", b"abc", b"\x80"]),
    st.integers(30_000, 150_000),
)

wire_values: Final[st.SearchStrategy[WireValue]] = st.one_of(
    st.none(),
    st.just(UNCHANGED_TOAST),
    ascii_texts,
    unicode_texts,
    non_ascii_texts,
    binaries,
)
large_wire_values: Final[st.SearchStrategy[WireValue]] = st.one_of(large_texts, large_binaries)

#: Tuple values whose encoding is pure ASCII: short (< 128 bytes) ASCII text and bytes.
ascii_wire_values: Final[st.SearchStrategy[WireValue]] = st.one_of(
    st.none(),
    st.just(UNCHANGED_TOAST),
    st.text(st.characters(codec="ascii"), max_size=127),
    st.binary(max_size=127).map(lambda b: bytes(x & 0x7F for x in b)),
)


def tuples(values: st.SearchStrategy[WireValue] = wire_values, *, min_size: int = 0,
           max_size: int = MAX_COLUMNS, large: bool = False) -> st.SearchStrategy[TupleData]:
    """TupleData of *min_size*..*max_size* columns; with *large*, one value is large."""
    rows = st.lists(values, min_size=min_size, max_size=max_size).map(tuple)
    if not large:
        return rows

    def insert_large(row: TupleData, value: WireValue, where: int) -> TupleData:
        i = where % (len(row) + 1)
        return (*row[:i], value, *row[i:])

    small = st.lists(values, max_size=max(0, max_size - 1)).map(tuple)
    return st.builds(insert_large, small, large_wire_values, st.integers(0, MAX_COLUMNS))


def _xids(in_stream: bool, xids: st.SearchStrategy[int] = u32s) -> st.SearchStrategy[int | None]:
    return xids if in_stream else st.none()


def begins() -> st.SearchStrategy[Begin]:
    """Begin messages."""
    return st.builds(Begin, final_lsn=u64s, commit_ts=timestamps, xid=u32s)


def commits() -> st.SearchStrategy[Commit]:
    """Commit messages."""
    return st.builds(Commit, flags=u8s, commit_lsn=u64s, end_lsn=u64s, commit_ts=timestamps)


def origins() -> st.SearchStrategy[Origin]:
    """Origin messages."""
    return st.builds(Origin, commit_lsn=u64s, name=names)


def relation_columns() -> st.SearchStrategy[RelationColumn]:
    """Columns of Relation messages."""
    return st.builds(RelationColumn, name=names, type_oid=u32s, type_modifier=i32s,
                     is_key=st.booleans())


def relations(in_stream: bool) -> st.SearchStrategy[Relation]:
    """Relation messages."""
    return st.builds(
        Relation, xid=_xids(in_stream), relation_id=u32s, namespace=names, name=names,
        replica_identity=st.sampled_from("dnfi"),
        columns=st.lists(relation_columns(), max_size=12).map(tuple),
    )


def types(in_stream: bool) -> st.SearchStrategy[Type]:
    """Type messages."""
    return st.builds(Type, xid=_xids(in_stream), type_oid=u32s, namespace=names, name=names)


def inserts(in_stream: bool, *, values: st.SearchStrategy[WireValue] = wire_values,
            ids: st.SearchStrategy[int] = u32s, large: bool = False,
            ) -> st.SearchStrategy[Insert]:
    """Insert messages; *values* and *ids* pick column values and relation ids / xids."""
    return st.builds(Insert, xid=_xids(in_stream, ids), relation_id=ids,
                     new=tuples(values, large=large))


def _update(xid: int | None, relation_id: int, old_kind: str | None, old: TupleData,
            new: TupleData) -> Update:
    return Update(xid, relation_id, old_kind, None if old_kind is None else old, new)


def updates(in_stream: bool, *, values: st.SearchStrategy[WireValue] = wire_values,
            ids: st.SearchStrategy[int] = u32s, large: bool = False,
            ) -> st.SearchStrategy[Update]:
    """Update messages, with no old tuple, a 'K' key tuple or an 'O' old row."""
    return st.builds(_update, _xids(in_stream, ids), ids, st.sampled_from([None, "K", "O"]),
                     tuples(values, large=large), tuples(values, large=large))


def deletes(in_stream: bool, *, values: st.SearchStrategy[WireValue] = wire_values,
            ids: st.SearchStrategy[int] = u32s, large: bool = False,
            ) -> st.SearchStrategy[Delete]:
    """Delete messages with a 'K' key tuple or an 'O' old row."""
    return st.builds(Delete, xid=_xids(in_stream, ids), relation_id=ids,
                     old_kind=st.sampled_from("KO"), old=tuples(values, large=large))


def truncates(in_stream: bool) -> st.SearchStrategy[Truncate]:
    """Truncate messages."""
    return st.builds(Truncate, xid=_xids(in_stream), cascade=st.booleans(),
                     restart_identity=st.booleans(),
                     relation_ids=st.lists(u32s, max_size=20).map(tuple))


def logical_messages(in_stream: bool, *, large: bool = False,
                     ) -> st.SearchStrategy[LogicalMessage]:
    """Logical decoding Message ('M') messages."""
    content = large_binaries if large else st.binary(max_size=64)
    return st.builds(LogicalMessage, xid=_xids(in_stream), transactional=st.booleans(),
                     lsn=u64s, prefix=names, content=content)


def stream_starts() -> st.SearchStrategy[StreamStart]:
    """Stream Start messages."""
    return st.builds(StreamStart, xid=u32s, first_segment=st.booleans())


def stream_stops() -> st.SearchStrategy[StreamStop]:
    """Stream Stop messages."""
    return st.just(StreamStop())


def stream_commits() -> st.SearchStrategy[StreamCommit]:
    """Stream Commit messages."""
    return st.builds(StreamCommit, xid=u32s, flags=u8s, commit_lsn=u64s, end_lsn=u64s,
                     commit_ts=timestamps)


def stream_aborts() -> st.SearchStrategy[StreamAbort]:
    """Stream Abort messages (protocol v2 form)."""
    return st.builds(StreamAbort, xid=u32s, subxid=u32s)


#: Every message type with a strategy factory taking (in_stream, large).
MESSAGE_STRATEGIES: Final[dict[type[Message], Callable[[bool, bool],
                                                        st.SearchStrategy[Message]]]] = {
    Begin: lambda s, large: begins(),
    Commit: lambda s, large: commits(),
    Origin: lambda s, large: origins(),
    Relation: lambda s, large: relations(s),
    Type: lambda s, large: types(s),
    Insert: lambda s, large: inserts(s, large=large),
    Update: lambda s, large: updates(s, large=large),
    Delete: lambda s, large: deletes(s, large=large),
    Truncate: lambda s, large: truncates(s),
    LogicalMessage: lambda s, large: logical_messages(s, large=large),
    StreamStart: lambda s, large: stream_starts(),
    StreamStop: lambda s, large: stream_stops(),
    StreamCommit: lambda s, large: stream_commits(),
    StreamAbort: lambda s, large: stream_aborts(),
}


@st.composite
def messages(draw: st.DrawFn, kinds: tuple[type[Message], ...] | None = None,
             large: bool = False) -> tuple[Message, bool]:
    """``(message, in_stream)`` pairs of any (or the given) message types.

    With *large*, tuple values and logical message contents include one large value
    (tens to hundreds of kilobytes).
    """
    kind = draw(st.sampled_from(kinds or tuple(MESSAGE_STRATEGIES)))
    in_stream = draw(st.booleans())
    msg = draw(MESSAGE_STRATEGIES[kind](in_stream, large))
    return msg, in_stream


@st.composite
def ascii_row_messages(draw: st.DrawFn) -> tuple[Insert | Update | Delete, bool]:
    """Insert/Update/Delete whose whole encoding is ASCII (the decoder's fast path)."""
    in_stream = draw(st.booleans())
    msg = draw(st.one_of(
        inserts(in_stream, values=ascii_wire_values, ids=ascii_u32s),
        updates(in_stream, values=ascii_wire_values, ids=ascii_u32s),
        deletes(in_stream, values=ascii_wire_values, ids=ascii_u32s),
    ))
    return msg, in_stream


@st.composite
def non_ascii_row_messages(draw: st.DrawFn) -> tuple[Insert | Update | Delete, bool]:
    """Insert/Update/Delete with at least one non-ASCII text value (per-value path)."""
    in_stream = draw(st.booleans())
    ids = st.one_of(ascii_u32s, u32s)
    text = draw(non_ascii_texts)
    row = draw(tuples(min_size=0, max_size=MAX_COLUMNS - 1))
    where = draw(st.integers(0, len(row)))
    new = (*row[:where], text, *row[where:])
    xid = draw(ids) if in_stream else None
    relation_id = draw(ids)
    kind = draw(st.sampled_from(["I", "U", "D"]))
    if kind == "I":
        return Insert(xid, relation_id, new), in_stream
    if kind == "U":
        old_kind = draw(st.sampled_from([None, "K", "O"]))
        old = None if old_kind is None else draw(tuples(ascii_wire_values))
        return Update(xid, relation_id, old_kind, old, new), in_stream
    return Delete(xid, relation_id, draw(st.sampled_from("KO")), new), in_stream
