"""The binlog's table map event: a table's columns as the rows events after it use them.

:func:`parse_table_map` reads a TABLE_MAP_EVENT body into a :class:`TableMap` of
:class:`TableColumn`: each column's binlog type (``T_*`` of
:mod:`tidemark.source.mariadb.binlog`) and its parameter from the metadata block, then
the optional metadata (column names, signedness, charsets, ENUM/SET members, primary
key) that servers send with ``binlog_row_metadata=FULL``. Malformed input raises
:class:`tidemark.errors.DecodeError`.

Reference: https://mariadb.com/kb/en/table_map_event/ and MySQL's ``libbinlogevents``.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from tidemark.errors import DecodeError
from tidemark.source.mariadb.binlog import (
    T_BIT,
    T_BLOB,
    T_DATETIME2,
    T_DECIMAL,
    T_DOUBLE,
    T_ENUM,
    T_FLOAT,
    T_GEOMETRY,
    T_INT24,
    T_JSON,
    T_LONG,
    T_LONG_BLOB,
    T_LONGLONG,
    T_MEDIUM_BLOB,
    T_NEWDECIMAL,
    T_SET,
    T_SHORT,
    T_STRING,
    T_TIME2,
    T_TIMESTAMP2,
    T_TINY,
    T_TINY_BLOB,
    T_VAR_STRING,
    T_VARCHAR,
    T_YEAR,
    read_bitmap,
    read_lenenc,
)

# The columns the table map's SIGNEDNESS bitmap has a bit for, in column order. YEAR is
# one: servers write a bit for it (MariaDB sets it), and leaving it out shifts the bits
# of every later numeric column.
NUMERIC_TYPES: Final = frozenset({T_TINY, T_SHORT, T_INT24, T_LONG, T_LONGLONG, T_NEWDECIMAL,
                                  T_FLOAT, T_DOUBLE, T_DECIMAL, T_YEAR})
_BLOB_TYPES: Final = frozenset({T_BLOB, T_TINY_BLOB, T_MEDIUM_BLOB, T_LONG_BLOB})

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
        nullable, pos = read_bitmap(body, pos, count)
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
