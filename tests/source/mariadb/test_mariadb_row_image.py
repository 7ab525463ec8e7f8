"""The compiled row-image decoder gives the values of the Python readers, for every column
kind, NULLs, every operation and several rows per event (no server: images are packed
here the way MariaDB packs them; the capture tests decode a real server's binlog)."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemark.errors import DecodeError
from tidemark.source.mariadb import binlog as b
from tidemark.source.mariadb.binlog import RowsEvent
from tidemark.source.mariadb.column_readers import decimal_size
from tidemark.source.mariadb.row_decoder import COMPILED_ROW_IMAGES, RowDecoder
from tidemark.source.mariadb.table_map import TableColumn, TableMap

try:
    from tidemark.source.mariadb import _row_image
except ImportError:  # not built: the tests of the Python decoder still run
    _row_image = None  # type: ignore[assignment]

UTF8MB4 = 45
BINARY = 63
LATIN1 = 8


def _decimal(sign: int, whole: str, fraction: str, precision: int, scale: int) -> bytes:
    """MySQL's packed decimal of ``-whole.fraction`` (sign < 0) or ``whole.fraction``."""
    sizes = (0, 1, 1, 2, 2, 3, 3, 4, 4, 4)
    whole = whole.rjust(precision - scale, "0")
    fraction = fraction.ljust(scale, "0")
    out = bytearray()
    head = len(whole) % 9
    if head:
        out += int(whole[:head]).to_bytes(sizes[head], "big")
    for at in range(head, len(whole), 9):
        out += int(whole[at:at + 9]).to_bytes(4, "big")
    for at in range(0, scale - scale % 9, 9):
        out += int(fraction[at:at + 9]).to_bytes(4, "big")
    if scale % 9:
        out += int(fraction[scale - scale % 9:]).to_bytes(sizes[scale % 9], "big")
    assert len(out) == decimal_size(precision, scale)
    out[0] ^= 0x80
    if sign < 0:
        out = bytearray(x ^ 0xFF for x in out)
    return bytes(out)


def _fraction(micros: int, fsp: int) -> bytes:
    if fsp <= 0:
        return b""
    if fsp <= 2:
        return (micros // 10_000).to_bytes(1, "big")
    if fsp <= 4:
        return (micros // 100).to_bytes(2, "big")
    return micros.to_bytes(3, "big")


def _length_prefixed(value: bytes, length_bytes: int) -> bytes:
    return len(value).to_bytes(length_bytes, "little") + value


@st.composite
def columns_and_values(draw: st.DrawFn) -> tuple[TableColumn, st.SearchStrategy[bytes]]:
    """A column of some kind, and a strategy of its packed values."""
    kind = draw(st.sampled_from([
        "int", "int24", "bigint", "double", "float", "decimal", "datetime2", "timestamp2",
        "time2", "date", "year", "varchar", "text", "varbinary", "binary", "latin1",
        "enum", "set", "bit"]))
    nullable = draw(st.booleans())
    fsp = draw(st.integers(0, 6))
    if kind == "int":
        size = draw(st.sampled_from([1, 2, 4]))
        t = {1: b.T_TINY, 2: b.T_SHORT, 4: b.T_LONG}[size]
        return (TableColumn("c", t, 0, nullable, draw(st.booleans())),
                st.binary(min_size=size, max_size=size))
    if kind == "int24":
        return (TableColumn("c", b.T_INT24, 0, nullable, draw(st.booleans())),
                st.binary(min_size=3, max_size=3))
    if kind == "bigint":
        return (TableColumn("c", b.T_LONGLONG, 0, nullable, draw(st.booleans())),
                st.binary(min_size=8, max_size=8))
    if kind == "double":
        return (TableColumn("c", b.T_DOUBLE, 8, nullable),
                st.floats(allow_nan=True).map(lambda x: struct.pack("<d", x)))
    if kind == "float":
        return (TableColumn("c", b.T_FLOAT, 4, nullable),
                st.floats(width=32, allow_nan=False).map(lambda x: struct.pack("<f", x)))
    if kind == "decimal":
        precision = draw(st.integers(1, 65))
        scale = draw(st.integers(0, min(precision, 30)))
        whole_digits = precision - scale
        return (TableColumn("c", b.T_NEWDECIMAL, precision << 8 | scale, nullable),
                st.builds(_decimal, st.sampled_from([1, -1]),
                          st.text("0123456789", max_size=whole_digits),
                          st.text("0123456789", max_size=scale),
                          st.just(precision), st.just(scale)))
    if kind == "datetime2":
        def datetime2(year: int, month: int, day: int, hms: int, micros: int) -> bytes:
            ymd = (year * 13 + month) << 5 | day
            packed = (ymd << 17 | hms) + 0x8000000000
            return packed.to_bytes(5, "big") + _fraction(micros, fsp)
        hms = st.builds(lambda h, m, s: h << 12 | m << 6 | s, st.integers(0, 23),
                        st.integers(0, 59), st.integers(0, 59))
        return (TableColumn("c", b.T_DATETIME2, fsp, nullable),
                st.builds(datetime2, st.integers(0, 9999), st.integers(0, 12),
                          st.integers(0, 31), hms, st.integers(0, 999_999)))
    if kind == "timestamp2":
        return (TableColumn("c", b.T_TIMESTAMP2, fsp, nullable),
                st.builds(lambda s, us: s.to_bytes(4, "big") + _fraction(us, fsp),
                          st.integers(0, 2**32 - 1) | st.just(0), st.integers(0, 999_999)))
    if kind == "time2":
        width = 3 + (fsp + 1) // 2
        return (TableColumn("c", b.T_TIME2, fsp, nullable),
                st.binary(min_size=width, max_size=width))
    if kind == "date":
        return (TableColumn("c", b.T_DATE, 0, nullable),
                st.binary(min_size=3, max_size=3) | st.just(b"\0\0\0"))
    if kind == "year":
        return TableColumn("c", b.T_YEAR, 1, nullable), st.binary(min_size=1, max_size=1)
    if kind in ("varchar", "latin1"):
        max_length = draw(st.sampled_from([40, 1020]))
        charset = UTF8MB4 if kind == "varchar" else LATIN1
        encoding = "utf-8" if kind == "varchar" else "latin-1"
        return (TableColumn("c", b.T_VARCHAR, max_length, nullable, charset=charset),
                st.text(st.characters(codec=encoding), max_size=40).map(
                    lambda s: _length_prefixed(s.encode(encoding),
                                               1 if max_length < 256 else 2)))
    if kind == "text":
        length_bytes = draw(st.integers(1, 4))
        return (TableColumn("c", b.T_BLOB, length_bytes, nullable, charset=UTF8MB4),
                st.text(max_size=60).map(lambda s: _length_prefixed(s.encode(),
                                                                     length_bytes)))
    if kind == "varbinary":
        length_bytes = draw(st.integers(1, 4))
        t = b.T_BLOB if length_bytes > 2 else b.T_VARCHAR
        metadata = length_bytes if t == b.T_BLOB else (40 if length_bytes == 1 else 300)
        return (TableColumn("c", t, metadata, nullable, charset=BINARY),
                st.binary(max_size=50).map(lambda v: _length_prefixed(v, length_bytes)))
    if kind == "binary":
        return (TableColumn("c", b.T_STRING, 8, nullable, charset=BINARY),
                st.binary(max_size=8).map(lambda v: _length_prefixed(v.rstrip(b"\0"), 1)))
    if kind == "enum":
        return (TableColumn("c", b.T_ENUM, 1, nullable, values=("a", "b", "c")),
                st.integers(0, 3).map(lambda i: bytes([i])))
    if kind == "set":
        return (TableColumn("c", b.T_SET, 1, nullable, values=("x", "y", "z")),
                st.integers(0, 7).map(lambda i: bytes([i])))
    bits = draw(st.integers(1, 64))
    size = (bits + 7) // 8
    return TableColumn("c", b.T_BIT, bits, nullable), st.binary(min_size=size, max_size=size)


@st.composite
def rows_events(draw: st.DrawFn) -> tuple[TableMap, RowsEvent]:
    """A table map and a rows event of 1-4 rows over it (random NULLs)."""
    specs = draw(st.lists(columns_and_values(), min_size=1, max_size=12))
    columns = tuple(TableColumn(f"c{i}", c.type, c.metadata, c.nullable, c.unsigned,
                                c.charset, c.values) for i, (c, _) in enumerate(specs))
    op = draw(st.sampled_from(["c", "u", "d"]))
    data = bytearray(b"header")

    def image() -> None:
        nulls = 0
        values = b""
        for i, (column, values_of) in enumerate(specs):
            if column.nullable and draw(st.booleans()):
                nulls |= 1 << i
            else:
                values += draw(values_of)
        data.extend(nulls.to_bytes((len(specs) + 7) // 8, "little") + values)

    for _ in range(draw(st.integers(1, 4))):
        image()
        if op == "u":
            image()
    full = (1 << len(columns)) - 1
    table_map = TableMap(1, "db", "t", columns, (0,), True)
    return table_map, RowsEvent(1, op, 0, len(columns), full, full, bytes(data), 6)


def test_the_compiled_decoder_is_built() -> None:
    """The C decoder is part of the install (``setup.py``); where it failed to build,
    tidemark still works, in Python, but the tests must say so."""
    assert COMPILED_ROW_IMAGES, (
        "tidemark.source.mariadb._row_image is not built: a C compiler and Python's "
        "headers are needed at install (uv sync); without them row images are decoded "
        "in Python")


@settings(max_examples=400, deadline=None)
@given(rows_events())
def test_the_compiled_decoder_gives_the_python_readers_values(
        case: tuple[TableMap, RowsEvent]) -> None:
    table_map, event = case
    expected = RowDecoder(table_map, compiled=False).rows(event)
    assert RowDecoder(table_map).rows(event) == expected


def _one_column(column: TableColumn, value: bytes, op: str = "c") -> Any:
    table_map = TableMap(1, "db", "t", (column,), (0,), True)
    event = RowsEvent(1, op, 0, 1, 1, 1, b"\0" + value, 0)
    compiled = RowDecoder(table_map).rows(event)
    assert compiled == RowDecoder(table_map, compiled=False).rows(event)
    return compiled[0][1][0]


def test_known_values() -> None:
    assert _one_column(TableColumn("d", b.T_NEWDECIMAL, 12 << 8 | 2, False),
                       _decimal(-1, "1", "5", 12, 2)) == "-1.50"
    assert _one_column(TableColumn("d", b.T_NEWDECIMAL, 12 << 8 | 2, False),
                       _decimal(-1, "0", "0", 12, 2)) == "0.00"
    assert _one_column(TableColumn("d", b.T_NEWDECIMAL, 40 << 8, False),
                       _decimal(1, "1" * 40, "", 40, 0)) == "1" * 40
    ts = (1_700_000_000).to_bytes(4, "big") + (123456).to_bytes(3, "big")
    assert _one_column(TableColumn("t", b.T_TIMESTAMP2, 6, True), ts) \
        == "2023-11-14 22:13:20.123456+00"
    zero = (0x8000000000).to_bytes(5, "big")
    assert _one_column(TableColumn("z", b.T_DATETIME2, 0, True), zero) is None
    assert _one_column(TableColumn("z", b.T_DATETIME2, 0, False), zero) \
        == "1970-01-01 00:00:00"
    assert _one_column(TableColumn("i", b.T_LONGLONG, 0, False, unsigned=True),
                       b"\xff" * 8) == "-1"
    assert _one_column(TableColumn("i", b.T_INT24, 0, False), b"\xff\xff\xff") == "-1"
    assert _one_column(TableColumn("f", b.T_DOUBLE, 8, False), struct.pack("<d", 0.1)) \
        == "0.1"


@pytest.mark.parametrize("compiled", [True, False])
def test_a_short_image_is_a_decode_error_naming_the_table(compiled: bool) -> None:
    table_map = TableMap(1, "shop", "orders", (TableColumn("id", b.T_LONGLONG, 0, False),),
                         (0,), True)
    event = RowsEvent(1, "c", 0, 1, 1, 1, b"\0\1\2\3", 0)
    with pytest.raises(DecodeError, match=r"shop\.orders"):
        RowDecoder(table_map, compiled=compiled).rows(event)


@pytest.mark.parametrize("compiled", [True, False])
def test_rows_of_a_table_with_no_columns_are_a_decode_error(compiled: bool) -> None:
    """Images of no columns take no bytes: bytes after them are an error, never a loop
    that does not end (MariaDB has no table without columns; a corrupt event might)."""
    table_map = TableMap(1, "shop", "empty", (), (), True)
    event = RowsEvent(1, "c", 0, 0, 0, 0, b"xx", 0)
    decoder = RowDecoder(table_map, compiled=compiled)
    assert decoder.count_rows(event) == -1
    with pytest.raises(DecodeError, match=r"shop\.empty.*no columns"):
        decoder.rows(event)
    assert decoder.rows(RowsEvent(1, "c", 0, 0, 0, 0, b"xx", 2)) == []


@pytest.mark.skipif(not COMPILED_ROW_IMAGES, reason="the compiled decoder is not built")
def test_the_compiled_decoder_refuses_rows_of_no_columns() -> None:
    assert _row_image is not None
    assert _row_image.count_rows(b"xx", 0, 0, ()) == -1
    assert _row_image.count_rows(b"xx", 2, 0, ()) == 0
    with pytest.raises(ValueError, match="no columns"):
        _row_image.decode_rows(b"xx", 0, 1, ())
    with pytest.raises(ValueError, match="no columns"):
        _row_image.rows_lines(b"xx", 0, 0, (), (b"", b"", (), (), (), ()), "{", "}", "",
                              False)
    assert _row_image.rows_lines(b"xx", 2, 0, (), (b"", b"", (), (), (), ()), "{", "}",
                                 "", False) == []
    decoder = RowDecoder(TableMap(1, "shop", "empty", (), (), True))
    with pytest.raises(DecodeError, match=r"shop\.empty.*no columns"):
        decoder.json_lines(RowsEvent(1, "c", 0, 0, 0, 0, b"xx", 0),
                           (b"", b"", (), (), (), ()), "{", "}", "", False)
