"""Readers of binlog column values: one function per column, chosen once from its type.

The binlog carries values in the storage engine's packed binary forms (big-endian
temporal bit fields, MySQL's packed decimal, length-prefixed strings). A reader turns
one into the canonical text of its logical type (:mod:`tidemark.wire_text`), or bytes
for binary strings: :func:`column_reader` picks it from the column's type and metadata.
These readers are the reference of the compiled decoder (``_row_image.c``) and read the
column types it leaves to Python.

Zero dates (``0000-00-00``, which MariaDB allows unless ``NO_ZERO_DATE``) have no
calendar value: as Debezium does, they become NULL in a nullable column and the epoch
in a NOT NULL one.
"""

from __future__ import annotations

import codecs
import datetime as dt
import logging
import struct
from collections.abc import Callable
from typing import Final, TypeAlias

from pymysql.charset import charset_by_id

from tidemark.errors import DecodeError
from tidemark.event import WireValue
from tidemark.source.mariadb import binlog as b
from tidemark.source.mariadb import latin1
from tidemark.source.mariadb.table_map import TableColumn

log = logging.getLogger(__name__)

BINARY_CHARSET: Final = 63

#: Reads one value at a position: (value, position after it).
Reader: TypeAlias = Callable[[bytes, int], tuple[WireValue, int]]

_EPOCH: Final = dt.datetime(1970, 1, 1)
_DIGITS_PER_INT: Final = 9
_DECIMAL_BYTES: Final = (0, 1, 1, 2, 2, 3, 3, 4, 4, 4)  # bytes for 0-9 leftover digits


class UnsupportedColumnError(DecodeError):
    """A column type tidemark cannot decode from the binlog (names the column)."""


def float32_text(raw: bytes) -> str:
    """The shortest decimal text that reads back as the same float32."""
    value = struct.unpack("<f", raw)[0]
    for digits in range(6, 10):
        text = f"{value:.{digits}g}"
        if struct.pack("<f", float(text)) == raw:
            return text
    return repr(value)


INT_CODES: Final = {1: "b", 2: "h", 4: "i", 8: "q"}


def _int_reader(size: int, unsigned: bool) -> Reader:
    code = INT_CODES[size]
    # bigint unsigned is read signed: values above 2^63-1 wrap to negative, as in
    # Debezium's default bigint.unsigned.handling.mode=long (every consumer's int64).
    unpack = struct.Struct("<" + (code.upper() if unsigned and size < 8 else code)).unpack_from

    def read(data: bytes, pos: int) -> tuple[WireValue, int]:
        return str(unpack(data, pos)[0]), pos + size

    return read


def _int24_reader(unsigned: bool) -> Reader:
    def read(data: bytes, pos: int) -> tuple[WireValue, int]:
        value = data[pos] | data[pos + 1] << 8 | data[pos + 2] << 16
        if not unsigned and value & 0x800000:
            value -= 0x1000000
        return str(value), pos + 3

    return read


def _read_float(data: bytes, pos: int) -> tuple[WireValue, int]:
    return float32_text(data[pos:pos + 4]), pos + 4


unpack_double = struct.Struct("<d").unpack_from


def _read_double(data: bytes, pos: int) -> tuple[WireValue, int]:
    return repr(unpack_double(data, pos)[0]), pos + 8


def decimal_size(precision: int, scale: int) -> int:
    """Bytes of a packed decimal(precision, scale)."""
    full_int, left_int = divmod(precision - scale, _DIGITS_PER_INT)
    full_frac, left_frac = divmod(scale, _DIGITS_PER_INT)
    return full_int * 4 + _DECIMAL_BYTES[left_int] + full_frac * 4 + _DECIMAL_BYTES[left_frac]


def _decimal_reader(precision: int, scale: int) -> Reader:
    """MySQL's packed decimal: groups of 9 digits in 4 big-endian bytes, a shorter group
    for leftover digits at either end; the sign inverts every bit, and the first bit is
    flipped so that the bytes sort as the numbers do."""
    full_int, left_int = divmod(precision - scale, _DIGITS_PER_INT)
    full_frac, left_frac = divmod(scale, _DIGITS_PER_INT)
    size = decimal_size(precision, scale)
    int_head = _DECIMAL_BYTES[left_int]
    frac_tail = _DECIMAL_BYTES[left_frac]

    def read(data: bytes, pos: int) -> tuple[WireValue, int]:
        raw = bytearray(data[pos:pos + size])
        negative = not raw[0] & 0x80
        raw[0] ^= 0x80
        if negative:
            raw = bytearray(x ^ 0xFF for x in raw)
        at = 0
        whole = 0
        if int_head:
            whole = int.from_bytes(raw[:int_head], "big")
            at = int_head
        for _ in range(full_int):
            whole = whole * 1_000_000_000 + int.from_bytes(raw[at:at + 4], "big")
            at += 4
        fraction = ""
        for _ in range(full_frac):
            fraction += f"{int.from_bytes(raw[at:at + 4], 'big'):09d}"
            at += 4
        if frac_tail:
            fraction += f"{int.from_bytes(raw[at:at + frac_tail], 'big'):0{left_frac}d}"
        text = f"{whole}.{fraction}" if scale else str(whole)
        if negative and (whole or fraction.strip("0")):
            text = "-" + text
        return text, pos + size

    return read


_MEMO_SIZE: Final = 4096


def _memoized(read: Reader, size: int) -> Reader:
    """*read* for a fixed-width encoding of *size* bytes, with a memo of the last few
    thousand encodings: amounts, dates and times repeat (an update's before and after
    images share most values), and a dict lookup costs less than the bit arithmetic."""
    memo: dict[bytes, WireValue] = {}

    def read_memoized(data: bytes, pos: int) -> tuple[WireValue, int]:
        end = pos + size
        raw = data[pos:end]
        value = memo.get(raw)
        if value is None:
            value = read(raw, 0)[0]
            if len(memo) >= _MEMO_SIZE:
                memo.clear()
            memo[raw] = value
        return value, end

    return read_memoized


def _fraction_bytes(fsp: int) -> int:
    return (fsp + 1) // 2


def _fraction(data: bytes, pos: int, fsp: int) -> tuple[int, int]:
    """Microseconds of a temporal value's fraction part (big-endian, fsp-dependent size)."""
    if fsp <= 0:
        return 0, pos
    if fsp <= 2:
        return data[pos] * 10_000, pos + 1
    if fsp <= 4:
        return int.from_bytes(data[pos:pos + 2], "big") * 100, pos + 2
    return int.from_bytes(data[pos:pos + 3], "big"), pos + 3


def _fraction_text(micros: int, fsp: int) -> str:
    return f".{micros:06d}"[:fsp + 1] if fsp > 0 else ""


def _zero_value(column: TableColumn, epoch_text: str) -> WireValue:
    return None if column.nullable else epoch_text


def _datetime2_reader(column: TableColumn) -> Reader:
    fsp = column.metadata

    def read(data: bytes, pos: int) -> tuple[WireValue, int]:
        packed = int.from_bytes(data[pos:pos + 5], "big") - 0x8000000000
        micros, end = _fraction(data, pos + 5, fsp)
        ymd, hms = packed >> 17, packed & 0x1FFFF
        year_month, day = ymd >> 5, ymd & 0x1F
        year, month = divmod(year_month, 13)
        if not month or not day:
            return _zero_value(column, "1970-01-01 00:00:00"), end
        return (f"{year:04d}-{month:02d}-{day:02d} {hms >> 12:02d}:{hms >> 6 & 0x3F:02d}:"
                f"{hms & 0x3F:02d}{_fraction_text(micros, fsp)}"), end

    return read


def _timestamp2_reader(column: TableColumn) -> Reader:
    fsp = column.metadata

    def read(data: bytes, pos: int) -> tuple[WireValue, int]:
        seconds = int.from_bytes(data[pos:pos + 4], "big")
        micros, end = _fraction(data, pos + 4, fsp)
        if not seconds and not micros:
            return _zero_value(column, "1970-01-01 00:00:00+00"), end
        moment = _EPOCH + dt.timedelta(seconds=seconds)
        return f"{moment:%Y-%m-%d %H:%M:%S}{_fraction_text(micros, fsp)}+00", end

    return read


def _time2_reader(column: TableColumn) -> Reader:
    fsp = column.metadata

    def read(data: bytes, pos: int) -> tuple[WireValue, int]:
        # The value is ((hours << 12 | minutes << 6 | seconds) << 24) + microseconds,
        # offset so that it is stored unsigned; negative fractions borrow a second.
        intpart = int.from_bytes(data[pos:pos + 3], "big") - 0x800000
        if fsp <= 0:
            packed, end = intpart << 24, pos + 3
        elif fsp <= 2:
            frac = data[pos + 3]
            if intpart < 0 and frac:
                intpart += 1
                frac -= 0x100
            packed, end = (intpart << 24) + frac * 10_000, pos + 4
        elif fsp <= 4:
            frac = int.from_bytes(data[pos + 3:pos + 5], "big")
            if intpart < 0 and frac:
                intpart += 1
                frac -= 0x10000
            packed, end = (intpart << 24) + frac * 100, pos + 5
        else:
            packed, end = int.from_bytes(data[pos:pos + 6], "big") - 0x800000000000, pos + 6
        sign = "-" if packed < 0 else ""
        packed = abs(packed)
        hms, micros = packed >> 24, packed & 0xFFFFFF
        return (f"{sign}{hms >> 12 & 0x3FF:02d}:{hms >> 6 & 0x3F:02d}:{hms & 0x3F:02d}"
                f"{_fraction_text(micros, fsp)}"), end

    return read


def _date_reader(column: TableColumn) -> Reader:
    def read(data: bytes, pos: int) -> tuple[WireValue, int]:
        value = data[pos] | data[pos + 1] << 8 | data[pos + 2] << 16
        day, month, year = value & 0x1F, value >> 5 & 0xF, value >> 9
        if not month or not day:
            return _zero_value(column, "1970-01-01"), pos + 3
        return f"{year:04d}-{month:02d}-{day:02d}", pos + 3

    return read


def _read_year(data: bytes, pos: int) -> tuple[WireValue, int]:
    value = data[pos]
    return str(value + 1900) if value else "0", pos + 1


def _bit_reader(bits: int) -> Reader:
    size = (bits + 7) >> 3
    if bits == 1:
        return lambda data, pos: ("t" if data[pos] & 1 else "f", pos + 1)
    # The binlog stores bit(n) big-endian; Debezium's io.debezium.data.Bits is
    # little-endian (java.util.BitSet.toByteArray), so the bytes are reversed.
    return lambda data, pos: (data[pos:pos + size][::-1], pos + size)


def column_codec(column: TableColumn) -> str | None:
    """The Python codec of a character column, or None for binary strings."""
    if column.charset == BINARY_CHARSET:
        return None
    if not column.charset:
        return "utf-8"
    try:
        encoding = charset_by_id(column.charset).encoding
    except KeyError:
        # Collations PyMySQL does not list (MariaDB 10.10+'s uca1400 ones, ids from
        # 2048, the default of recent servers) are nearly always utf8mb4: read UTF-8,
        # which fails loudly (a decode error naming the table) if a value is not.
        log.warning("column %s: collation id %d is unknown to PyMySQL; reading it as "
                    "UTF-8", column.name, column.charset)
        return "utf-8"
    if encoding in ("utf8", "utf8mb4", "utf8mb3"):
        return "utf-8"
    if encoding == "cp1252":
        return latin1.NAME  # cp1252 where it defines a byte, the byte's code point else
    try:
        codecs.lookup(encoding)
    except LookupError:
        raise UnsupportedColumnError(
            f"column {column.name}", 0, f"character set {encoding} has no Python codec",
            "binlog") from None
    return encoding


def _string_reader(column: TableColumn, length_bytes: int) -> Reader:
    codec = column_codec(column)
    if length_bytes == 1:
        if codec is None:
            def read_bytes1(data: bytes, pos: int) -> tuple[WireValue, int]:
                end = pos + 1 + data[pos]
                return data[pos + 1:end], end
            return read_bytes1

        def read_text1(data: bytes, pos: int) -> tuple[WireValue, int]:
            end = pos + 1 + data[pos]
            return data[pos + 1:end].decode(codec), end
        return read_text1

    def read(data: bytes, pos: int) -> tuple[WireValue, int]:
        size = int.from_bytes(data[pos:pos + length_bytes], "little")
        start = pos + length_bytes
        value = data[start:start + size]
        return (value if codec is None else value.decode(codec)), start + size

    return read


def _binary_reader(size: int) -> Reader:
    """binary(n): the binlog drops the trailing zero bytes the column pads with; put
    them back, so that the value is what a SELECT (and the snapshot) returns."""
    read = _string_reader(TableColumn("", b.T_STRING, size, True, charset=BINARY_CHARSET),
                          1 if size < 256 else 2)

    def read_padded(data: bytes, pos: int) -> tuple[WireValue, int]:
        value, end = read(data, pos)
        assert isinstance(value, bytes)
        return value.ljust(size, b"\0"), end

    return read_padded


def _enum_reader(column: TableColumn) -> Reader:
    size, members = column.metadata, column.values

    def read(data: bytes, pos: int) -> tuple[WireValue, int]:
        index = int.from_bytes(data[pos:pos + size], "little")
        return (members[index - 1] if 0 < index <= len(members) else ""), pos + size

    return read


def _set_reader(column: TableColumn) -> Reader:
    size, members = column.metadata, column.values

    def read(data: bytes, pos: int) -> tuple[WireValue, int]:
        bits = int.from_bytes(data[pos:pos + size], "little")
        return ",".join(m for i, m in enumerate(members) if bits >> i & 1), pos + size

    return read


def _old_datetime_reader(column: TableColumn) -> Reader:
    def read(data: bytes, pos: int) -> tuple[WireValue, int]:
        value = int.from_bytes(data[pos:pos + 8], "little")
        date, clock = divmod(value, 1_000_000)
        year, rest = divmod(date, 10_000)
        month, day = divmod(rest, 100)
        if not month or not day:
            return _zero_value(column, "1970-01-01 00:00:00"), pos + 8
        hour, rest = divmod(clock, 10_000)
        return (f"{year:04d}-{month:02d}-{day:02d} {hour:02d}:{rest // 100:02d}:"
                f"{rest % 100:02d}"), pos + 8

    return read


def _read_old_time(data: bytes, pos: int) -> tuple[WireValue, int]:
    value = int.from_bytes(data[pos:pos + 3], "little", signed=True)
    sign = "-" if value < 0 else ""
    hour, rest = divmod(abs(value), 10_000)
    return f"{sign}{hour:02d}:{rest // 100:02d}:{rest % 100:02d}", pos + 3


def _old_timestamp_reader(column: TableColumn) -> Reader:
    def read(data: bytes, pos: int) -> tuple[WireValue, int]:
        seconds = int.from_bytes(data[pos:pos + 4], "little")
        if not seconds:
            return _zero_value(column, "1970-01-01 00:00:00+00"), pos + 4
        return f"{_EPOCH + dt.timedelta(seconds=seconds):%Y-%m-%d %H:%M:%S}+00", pos + 4

    return read


def column_reader(column: TableColumn) -> Reader:
    """The reader of one column's values."""
    t, meta = column.type, column.metadata
    if t == b.T_TINY:
        return _int_reader(1, column.unsigned)
    if t == b.T_SHORT:
        return _int_reader(2, column.unsigned)
    if t == b.T_INT24:
        return _int24_reader(column.unsigned)
    if t == b.T_LONG:
        return _int_reader(4, column.unsigned)
    if t == b.T_LONGLONG:
        return _int_reader(8, column.unsigned)
    if t == b.T_FLOAT:
        return _read_float
    if t == b.T_DOUBLE:
        return _read_double
    if t == b.T_NEWDECIMAL:
        return _memoized(_decimal_reader(meta >> 8, meta & 0xFF),
                         decimal_size(meta >> 8, meta & 0xFF))
    if t == b.T_DATETIME2:
        return _memoized(_datetime2_reader(column), 5 + _fraction_bytes(meta))
    if t == b.T_TIMESTAMP2:
        return _memoized(_timestamp2_reader(column), 4 + _fraction_bytes(meta))
    if t == b.T_TIME2:
        return _memoized(_time2_reader(column), 3 + _fraction_bytes(meta))
    if t in (b.T_DATE, b.T_NEWDATE):
        return _memoized(_date_reader(column), 3)
    if t == b.T_YEAR:
        return _read_year
    if t == b.T_BIT:
        return _bit_reader(meta)
    if t == b.T_STRING and column.charset == BINARY_CHARSET:
        return _binary_reader(meta)
    if t in (b.T_VARCHAR, b.T_VAR_STRING, b.T_STRING):
        return _string_reader(column, 1 if meta < 256 else 2)
    if t in (b.T_BLOB, b.T_TINY_BLOB, b.T_MEDIUM_BLOB, b.T_LONG_BLOB, b.T_GEOMETRY):
        return _string_reader(column, meta)
    if t == b.T_ENUM:
        return _enum_reader(column)
    if t == b.T_SET:
        return _set_reader(column)
    if t == b.T_DATETIME:
        return _old_datetime_reader(column)
    if t == b.T_TIME:
        return _read_old_time
    if t == b.T_TIMESTAMP:
        return _old_timestamp_reader(column)
    raise UnsupportedColumnError(f"column {column.name}", 0,
                                 f"binlog column type {t} is not supported", "binlog")
