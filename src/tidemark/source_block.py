"""Debezium's ``source`` block, as a source describes it once for every serializer.

Debezium builds a connector's block from common fields (``commonSchemaBuilder()``:
``version``, ``connector``, ``name``, ``ts_ms``, ``snapshot``, ``db``, ``sequence``,
``ts_us``, ``ts_ns``) followed by the connector's own (its ``SourceInfoStructMaker``).
Here the same split: :mod:`tidemark.serde` writes the common fields, and a source
describes the rest with a :class:`SourceBlock` — where it puts ``schema``/``table``, its
own fields (names, order, types, nullability), their values for an event, the Avro name
of the record, and how it prints its position. The JSON writers (general, generated, C),
the Avro encoder and :attr:`tidemark.event.ChangeEvent.source` all build from that one
description; a new source defines its block in its own package and serde needs no edit.

A source attaches its block to its events through :attr:`SourceContext.block
<tidemark.event.SourceContext.block>`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from enum import StrEnum
from typing import TYPE_CHECKING, Any, ClassVar, Final

import msgspec

if TYPE_CHECKING:
    from tidemark.event import SourceContext


class FieldType(StrEnum):
    """The type of a block field; the values are Avro's (and Kafka Connect's) names."""

    STRING = "string"
    INT32 = "int"
    INT64 = "long"
    BOOLEAN = "boolean"


class BlockField(msgspec.Struct, frozen=True, gc=False):
    """One field of a ``source`` block: its name, type and whether it may be null."""

    name: str
    type: FieldType
    optional: bool = True


class Position:
    """Type of :data:`POSITION`; a singleton."""

    __slots__ = ()
    _instance: Position | None = None

    def __new__(cls) -> Position:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "POSITION"


#: Stands, in a block's values or sequence, for the event's own position
#: (:attr:`tidemark.event.ChangeEvent.lsn`): the values of one context then serve every
#: event of its transaction, and the writers fill the position in per event.
POSITION: Final = Position()

#: Debezium's common fields, before the source's table fields and its own.
COMMON_FIELDS: Final = (
    BlockField("version", FieldType.STRING, optional=False),
    BlockField("connector", FieldType.STRING, optional=False),
    BlockField("name", FieldType.STRING, optional=False),
    BlockField("ts_ms", FieldType.INT64, optional=False),
    BlockField("snapshot", FieldType.STRING),
    BlockField("db", FieldType.STRING, optional=False),
    BlockField("sequence", FieldType.STRING),
    BlockField("ts_us", FieldType.INT64),
    BlockField("ts_ns", FieldType.INT64),
)

#: Values a block field may hold (or :data:`POSITION`).
BlockValues = tuple[Any, ...]


class SourceBlock(ABC):
    """A source's ``source`` block after Debezium's common fields.

    Two ways to give the own fields' values, which every writer reads the same:

    * ``carries_position = False`` (the default): everything is in the event's context,
      :attr:`SourceContext.source_fields <tidemark.event.SourceContext.source_fields>`
      — a ``msgspec.Struct`` whose fields are :attr:`fields` in order (written in one
      call; ``omit_defaults`` leaves a field out of JSON at its default), or a tuple in
      :attr:`fields` order. A source whose fields differ per event (MariaDB's ``row``)
      makes a context per event. ``sequence`` is null.
    * ``carries_position = True``: :meth:`values` and :meth:`sequence` give the values
      of a whole context, with :data:`POSITION` where the event's position goes, so one
      context serves a transaction and the block's text is made once per transaction
      and table (PostgreSQL's ``lsn`` and ``sequence``). The position appears in exactly
      two places: the fast writers fill in two.
    """

    #: The Avro full name of the block's record (Debezium's, where it has the connector).
    avro_name: ClassVar[str]
    #: ``schema`` and/or ``table``, as the source's Debezium connector places them
    #: (written by serde from the event's table, after the common fields).
    table_fields: ClassVar[tuple[BlockField, ...]]
    #: The source's own fields, after the table fields.
    fields: ClassVar[tuple[BlockField, ...]]
    carries_position: ClassVar[bool] = False

    def values(self, context: SourceContext) -> msgspec.Struct | BlockValues:
        """The own fields' values of *context*'s events, in :attr:`fields` order."""
        fields = context.source_fields
        if fields is None:
            return (None,) * len(self.fields)
        return fields

    def sequence(self, context: SourceContext) -> tuple[str | Position | None, ...] | None:
        """Debezium's ``sequence``: the items of the JSON array it holds as a string
        (None: ``sequence`` is null)."""
        return None

    @abstractmethod
    def position_text(self, position: int) -> str:
        """The source's int64 position as people read it (PostgreSQL ``0/16B3748``)."""


def block_dict(block: SourceBlock, context: SourceContext,
               position: int | None) -> dict[str, Any]:
    """The own fields of *block* for an event of *context* at *position*, by name,
    as its JSON holds them (a Struct's fields left out at their default are absent)."""
    values = block.values(context)
    if isinstance(values, msgspec.Struct):
        out: dict[str, Any] = msgspec.to_builtins(values)
        return out
    return {f.name: position if v is POSITION else v
            for f, v in zip(block.fields, values, strict=True)}


class BareBlock(SourceBlock):
    """The block of a source that defines none: the common fields, ``schema`` and
    ``table``."""

    avro_name: ClassVar[str] = "io.tidemark.connector.Source"
    table_fields: ClassVar[tuple[BlockField, ...]] = (
        BlockField("schema", FieldType.STRING), BlockField("table", FieldType.STRING))
    fields: ClassVar[tuple[BlockField, ...]] = ()

    def values(self, context: SourceContext) -> BlockValues:
        return ()

    def position_text(self, position: int) -> str:
        return f"position {position}"


#: The block of events whose context names none.
BARE_BLOCK: Final = BareBlock()
