"""The ``source`` block as Debezium JSON text, from the source's
:class:`~tidemark.source_block.SourceBlock`: the common fields written here, the table
fields and the source's own fields as its block describes them.

Two shapes, as the block chooses (see :class:`~tidemark.source_block.SourceBlock`):
a block that carries the event's position is made once per (context, table, snapshot
marker) as the texts around the position's two places — ``head + pos + middle + pos +
end``, what the generated and C writers fill in per event; any other block is one text
per event, its common part kept per transaction and table and its own fields written by
msgspec in one call (a source making a context per event, MariaDB's, pays no more).
"""

from __future__ import annotations

import json.encoder as json_encoder
from collections.abc import Callable
from typing import Any, Final

import msgspec

from tidemark import __version__
from tidemark.event import SnapshotMarker, SourceContext, TableId
from tidemark.source_block import BARE_BLOCK, POSITION, BlockField, SourceBlock

SOURCE_VERSION: Final = f"{__version__}-tidemark"
_HEADS_KEPT: Final = 256  # common parts kept for blocks without the position

_escape: Callable[[str], str] = json_encoder.encode_basestring
_SLOT: Final = object()  # where the event's position goes, while the text is built


def _json(value: Any) -> str:
    if value is None:
        return "null"
    cls = value.__class__
    if cls is int:
        return str(value)
    if cls is str:
        return _escape(value)
    return msgspec.json.encode(value).decode()


def _table_text(fields: tuple[BlockField, ...], table: TableId) -> str:
    out = []
    for field in fields:
        value = table.schema if field.name == "schema" else table.table
        out.append(f',"{field.name}":{_escape(value)}')
    return "".join(out)


def _common_head(c: SourceContext, snapshot: SnapshotMarker) -> str:
    """The common fields up to ``"sequence":``."""
    return (f'{{"version":"{SOURCE_VERSION}","connector":{_escape(c.connector)},'
            f'"name":{_escape(c.name)},"ts_ms":{c.ts_us // 1000},'
            f'"snapshot":"{snapshot.value}","db":{_escape(c.db)},"sequence":')


def position_parts(block: SourceBlock, c: SourceContext, snapshot: SnapshotMarker,
                   table: TableId, *, null_position: bool = False) -> list[str]:
    """The text of a position-carrying block, split where the event's position goes.

    *null_position*: for an event without a position, whose ``sequence`` is then null
    when it would hold no value (Debezium's: ``[null,null]`` is not written).
    """
    pieces: list[Any] = [_common_head(c, snapshot)]
    sequence = block.sequence(c)
    if sequence is None or (null_position and all(
            item is None or item is POSITION for item in sequence)):
        pieces.append("null")
    else:
        pieces.append('"[')
        for n, item in enumerate(sequence):
            if n:
                pieces.append(",")
            if item is POSITION:
                pieces += ['\\"', _SLOT, '\\"']
            elif item is None:
                pieces.append("null")
            else:  # a JSON string inside a JSON string
                pieces.append(_escape(_escape(str(item)))[1:-1])
        pieces.append(']"')
    ts = c.ts_us
    pieces.append(f',"ts_us":{ts},"ts_ns":{ts * 1000}{_table_text(block.table_fields, table)}')
    values = block.values(c)
    if isinstance(values, msgspec.Struct):
        values = msgspec.structs.astuple(values)
    for field, value in zip(block.fields, values, strict=True):
        pieces.append(f',"{field.name}":')
        pieces.append(_SLOT if value is POSITION else _json(value))
    pieces.append("}")
    parts = [""]
    for piece in pieces:
        if piece is _SLOT:
            parts.append("")
        else:
            parts[-1] += piece
    return parts


class SourceJson:
    """Writes events' ``source`` blocks, caching what their events share. One per
    serializer (not thread-safe)."""

    def __init__(self) -> None:
        self._encoder = msgspec.json.Encoder()
        self._parts_context: object = None
        self._parts: dict[tuple[TableId, SnapshotMarker], tuple[str, ...]] = {}
        self._heads: dict[tuple[Any, ...], str] = {}
        self._last_head: tuple[Any, ...] | None = None

    def text(self, context: SourceContext, snapshot: SnapshotMarker, table: TableId,
             position: int | None) -> str:
        """The whole block of an event of *context* at *position*."""
        parts = self.parts(context, snapshot, table)
        if len(parts) == 1:
            return parts[0]
        if position is None:
            block = context.block
            assert block is not None
            return "null".join(position_parts(block, context, snapshot, table,
                                              null_position=True))
        head, middle, end = parts
        return f"{head}{position}{middle}{position}{end}"

    def parts(self, context: SourceContext, snapshot: SnapshotMarker,
              table: TableId) -> tuple[str, ...]:
        """The block's text as ``(head, middle, end)`` around the event's position
        (written twice), or ``(block,)`` for a block without it."""
        block = context.block
        if block is not None and block.carries_position:
            return self._position_parts(context, snapshot, table, block)
        if block is None:
            block = BARE_BLOCK
        # A block whose values are all in the context (one context per event, for
        # MariaDB): the common part is kept per transaction and table (a transaction's
        # events come together), the context's ``source_fields`` written in one call.
        last = self._last_head
        if last is not None and last[0] is table and last[1] is snapshot \
                and last[2] == context.ts_us and last[3] is block \
                and last[4] is context.connector and last[5] is context.name \
                and last[6] is context.db:
            head: str = last[7]
        else:
            head = self._head(context, snapshot, table, block)
            self._last_head = (table, snapshot, context.ts_us, block, context.connector,
                               context.name, context.db, head)
        fields: Any = context.source_fields
        if fields is None or fields.__class__ is tuple:
            fields = dict(zip((f.name for f in block.fields),
                              fields or (None,) * len(block.fields), strict=True))
        # A Struct is written in its field order (without the fields at their default
        # with omit_defaults), a dict in the block's.
        encoded = self._encoder.encode(fields)
        if len(encoded) == 2:  # no own fields
            return (head[:-1] + "}",)
        return (head + encoded[1:].decode(),)

    def _position_parts(self, context: SourceContext, snapshot: SnapshotMarker,
                        table: TableId, block: SourceBlock) -> tuple[str, ...]:
        if context is not self._parts_context:
            self._parts_context = context
            self._parts.clear()
        parts = self._parts.get((table, snapshot))
        if parts is None:
            made = position_parts(block, context, snapshot, table)
            if len(made) != 3:
                raise ValueError(
                    f"the source block {type(block).__name__} places the event's position "
                    f"{len(made) - 1} times; a block carrying it places it twice")
            parts = self._parts[(table, snapshot)] = tuple(made)
        return parts

    def _head(self, c: SourceContext, snapshot: SnapshotMarker, table: TableId,
              block: SourceBlock) -> str:
        """The common fields and the table fields, up to the own fields."""
        key = (c.connector, c.name, c.ts_us, c.db, table, snapshot, block)
        head = self._heads.get(key)
        if head is None:
            ts = c.ts_us
            if len(self._heads) >= _HEADS_KEPT:
                self._heads.clear()
            head = self._heads[key] = (
                f'{_common_head(c, snapshot)}null,"ts_us":{ts},"ts_ns":{ts * 1000}'
                f'{_table_text(block.table_fields, table)},')
        return head
