"""Row images of binlog rows events -> column values in tidemark's wire form.

Tidemark's serializers take each value as the canonical text of its logical type
(:mod:`tidemark.wire_text`), or bytes for binary strings, so a value is printed once,
here, and everything after the source (Debezium JSON, Avro, Arrow, Spark, Delta) is the
same code as for PostgreSQL.

A :class:`RowDecoder` is built per :class:`~tidemark.source.mariadb.table_map.TableMap`:
one reader function per column (:mod:`tidemark.source.mariadb.column_readers`), chosen
once from the column's type and metadata. Full row images, the common case, are read by
the compiled decoder (``_row_image.c``) where it is built, else by a Python function
generated per table map.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Any, Final, TypeAlias

from tidemark.errors import DecodeError
from tidemark.event import UNAVAILABLE, WireTuple, WireValue
from tidemark.source.mariadb import binlog as b
from tidemark.source.mariadb.binlog import RowsEvent
from tidemark.source.mariadb.column_readers import (
    BINARY_CHARSET,
    INT_CODES,
    Reader,
    column_codec,
    column_reader,
    unpack_double,
)
from tidemark.source.mariadb.table_map import TableColumn, TableMap

try:
    from tidemark.source.mariadb import _row_image
except ImportError:  # not built: the Python readers decode the same values
    _row_image = None  # type: ignore[assignment]

#: Whether the compiled row-image decoder (``_row_image``) is built.
COMPILED_ROW_IMAGES: Final = _row_image is not None


def _inline(i: int, column: TableColumn, namespace: dict[str, Any]) -> list[str]:
    """Straight-line code reading column *i* into ``v{i}`` (the reader call otherwise)."""
    t = column.type
    size = _INLINE_INT_SIZES.get(t)
    if size is not None:
        code = INT_CODES[size]
        unsigned = column.unsigned and size < 8
        namespace[f"U{i}"] = struct.Struct("<" + (code.upper() if unsigned else code)).unpack_from
        return [f"v{i} = str(U{i}(data, pos)[0])", f"pos += {size}"]
    utf8 = column.charset != BINARY_CHARSET and column_codec(column) == "utf-8"
    if t in (b.T_VARCHAR, b.T_VAR_STRING) and column.metadata < 256 and utf8:
        return ["e = pos + 1 + data[pos]", f"v{i} = data[pos + 1:e].decode()", "pos = e"]
    two_byte_length = column.metadata == 2 if t == b.T_BLOB else column.metadata >= 256
    if t in (b.T_VARCHAR, b.T_VAR_STRING, b.T_BLOB) and utf8 and two_byte_length:
        return ["e = pos + 2 + (data[pos] | data[pos + 1] << 8)",
                f"v{i} = data[pos + 2:e].decode()", "pos = e"]
    if t == b.T_DOUBLE:
        namespace["_double"] = unpack_double
        return [f"v{i} = repr(_double(data, pos)[0])", "pos += 8"]
    namespace[f"R{i}"] = column_reader(column)
    return [f"v{i}, pos = R{i}(data, pos)"]


_INLINE_INT_SIZES: Final = {b.T_TINY: 1, b.T_SHORT: 2, b.T_LONG: 4, b.T_LONGLONG: 8}


def _compile_full_image(table_map: TableMap) -> Callable[[bytes, int], tuple[WireTuple, int]]:
    """A reader of a row image holding every column (``binlog_row_image=FULL``): one
    generated function per table map, with no loop and no per-column call for the
    common types. Names in the code are only ``v<i>``/``U<i>``/``R<i>``; column names
    never reach it."""
    columns = table_map.columns
    null_size = (len(columns) + 7) >> 3
    namespace: dict[str, Any] = {"_from_bytes": int.from_bytes}
    lines = ["def image(data, pos):",
             f"    nulls = _from_bytes(data[pos:pos + {null_size}], 'little')",
             f"    pos += {null_size}"]
    for i, column in enumerate(columns):
        body = _inline(i, column, namespace)
        if column.nullable:
            lines.append(f"    if nulls >> {i} & 1:")
            lines.append(f"        v{i} = None")
            lines.append("    else:")
            lines += [f"        {line}" for line in body]
        else:
            lines += [f"    {line}" for line in body]
    lines.append(f"    return ({''.join(f'v{i}, ' for i in range(len(columns)))}), pos")
    exec(compile("\n".join(lines), f"<row image of {table_map.table}>", "exec"), namespace)
    return namespace["image"]  # type: ignore[no-any-return]


#: A column's entry in the compiled decoder's plan: (kind, a, b, nullable, reader).
PlanEntry: TypeAlias = tuple[int, int, int, bool, Reader | None]


def _plan_entry(column: TableColumn, reader: Reader) -> PlanEntry:
    """How the compiled decoder reads *column* (see ``_row_image.c``): one of its kinds
    for the common types, else its Python *reader*."""
    assert _row_image is not None
    c, t, meta, nullable = _row_image, column.type, column.metadata, column.nullable
    size = _INLINE_INT_SIZES.get(t, 3 if t == b.T_INT24 else 0)
    if size:
        return c.INT, size, int(column.unsigned), nullable, None
    fixed = {b.T_DOUBLE: c.DOUBLE, b.T_DATETIME2: c.DATETIME2, b.T_TIMESTAMP2: c.TIMESTAMP2,
             b.T_TIME2: c.TIME2, b.T_DATE: c.DATE, b.T_NEWDATE: c.DATE, b.T_YEAR: c.YEAR}
    if t in fixed:
        return fixed[t], meta, 0, nullable, None
    if t == b.T_NEWDECIMAL:
        return c.DECIMAL, meta >> 8, meta & 0xFF, nullable, None
    length_bytes = 0
    if t in (b.T_VARCHAR, b.T_VAR_STRING) or (t == b.T_STRING
                                               and column.charset != BINARY_CHARSET):
        length_bytes = 1 if meta < 256 else 2
    elif t in (b.T_BLOB, b.T_TINY_BLOB, b.T_MEDIUM_BLOB, b.T_LONG_BLOB, b.T_GEOMETRY):
        length_bytes = meta
    if length_bytes:
        codec = column_codec(column)
        if codec is None:
            return c.BYTES, length_bytes, 0, nullable, None
        if codec == "utf-8":
            return c.UTF8, length_bytes, 0, nullable, None
    return c.FALLBACK, 0, 0, nullable, reader


def compiled_plan(table_map: TableMap, readers: Sequence[Reader]
                  ) -> tuple[PlanEntry, ...] | None:
    """The compiled decoder's plan of *table_map*'s full row images, given its columns'
    Python *readers* (None where the decoder is not built)."""
    if _row_image is None:
        return None
    return tuple(_plan_entry(c, r) for c, r in zip(table_map.columns, readers, strict=True))


_OP_CODES: Final = {"c": 0, "u": 1, "d": 2}


class RowDecoder:
    """Decodes the row images of one table map's rows events.

    *compiled*: full images are decoded by the C decoder where it is built (the
    default), else by a generated Python function; both give the same values.
    """

    def __init__(self, table_map: TableMap, *, compiled: bool = True) -> None:
        self.table_map = table_map
        self.readers: Sequence[Reader] = [column_reader(c) for c in table_map.columns]
        self.width = len(table_map.columns)
        self.full = (1 << self.width) - 1
        self._plan = compiled_plan(table_map, self.readers) if compiled else None
        # The generated Python reader of full images, where the C decoder does not run.
        self._full_image = _compile_full_image(table_map) if self._plan is None else None

    def _image(self, data: bytes, pos: int, present: int) -> tuple[WireTuple, int]:
        readers, width = self.readers, self.width
        present_count = bin(present).count("1")
        null_size = (present_count + 7) >> 3
        nulls = int.from_bytes(data[pos:pos + null_size], "little")
        pos += null_size
        values: list[WireValue] = []
        n = 0  # index among present columns (the null bitmap counts only those)
        for i in range(width):
            if not present >> i & 1:
                values.append(UNAVAILABLE)
                continue
            if nulls >> n & 1:
                values.append(None)
            else:
                value, pos = readers[i](data, pos)
                values.append(value)
            n += 1
        return tuple(values), pos

    @property
    def plan(self) -> tuple[PlanEntry, ...] | None:
        """The compiled decoder's plan of full images (None where it does not run)."""
        return self._plan

    def _full(self, event: RowsEvent) -> bool:
        return event.present == self.full and (event.op != "u"
                                               or event.present_after == self.full)

    def count_rows(self, event: RowsEvent) -> int:
        """The rows of *event*, counted by the compiled decoder from the images' sizes
        alone; -1 where it cannot (not built, images not full, a column it reads in
        Python)."""
        if self._plan is None or not self._full(event):
            return -1
        return int(_row_image.count_rows(event.data, event.start, _OP_CODES[event.op],
                                         self._plan))

    def json_lines(self, event: RowsEvent, json: tuple[Any, ...], head: str, tail: str,
                   ts_text: str, tombstones: bool) -> list[str] | None:
        """The Debezium JSON lines of *event* written by the compiled decoder straight
        from its images (``_row_image.rows_lines``; *json*:
        :func:`~tidemark.source.mariadb.json_lines.fused_plan`), or None where it leaves
        them to :meth:`rows` and the serializer's writer."""
        if self._plan is None or not self._full(event):
            return None
        try:
            lines: list[str] | None = _row_image.rows_lines(
                event.data, event.start, _OP_CODES[event.op], self._plan, json, head, tail,
                ts_text, tombstones)
        except (IndexError, struct.error, UnicodeDecodeError, ValueError) as err:
            table = f"{self.table_map.database}.{self.table_map.table}"
            raise DecodeError(f"ROWS ({table})", event.start, str(err), "binlog") from None
        return lines

    def rows(self, event: RowsEvent) -> list[tuple[WireTuple | None, WireTuple | None]]:
        """(before, after) per row: inserts have no before, deletes no after."""
        data, pos, end = event.data, event.start, len(event.data)
        out: list[tuple[WireTuple | None, WireTuple | None]] = []
        try:
            if self._plan is not None and event.present == self.full and (
                    event.op != "u" or event.present_after == self.full):
                return _row_image.decode_rows(data, pos, _OP_CODES[event.op], self._plan)
            full = self._full_image if event.present == self.full else None
            while pos < end:
                first, pos = full(data, pos) if full else self._image(data, pos, event.present)
                if event.op == "u":
                    after, pos = full(data, pos) if full and event.present_after == self.full \
                        else self._image(data, pos, event.present_after)
                    out.append((first, after))
                elif event.op == "c":
                    out.append((None, first))
                else:
                    out.append((first, None))
        except (IndexError, struct.error, UnicodeDecodeError, ValueError) as err:
            table = f"{self.table_map.database}.{self.table_map.table}"
            raise DecodeError(f"ROWS ({table})", pos, str(err), "binlog") from None
        return out
