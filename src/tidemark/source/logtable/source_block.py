"""The log-table sources' own ``source`` fields and block: ``table``, then ScyllaDB's
CDC coordinates ``stream_id``, ``generation``, ``time``, ``batch_seq_no``, and ``txId``
where the database has one (PostgreSQL; left out of JSON on SQLite). Every row is its
own event with its own context. The position is the row's ``cdc$time``."""

from __future__ import annotations

from typing import ClassVar, Final

import msgspec

from tidemark.source_block import BlockField, FieldType, SourceBlock


class LogTableSourceFields(msgspec.Struct, frozen=True, gc=False, omit_defaults=True):
    """A log row's coordinates (``txId`` None: not written)."""

    stream_id: int
    generation: int
    time: int
    batch_seq_no: int
    txId: int | None = None  # noqa: N815 (Debezium's name)


def position_text(position: int) -> str:
    """A log-table position (``cdc$time``) as ``log position N``."""
    return f"log position {position}"


class LogTableBlock(SourceBlock):
    """The log tables' block (its values: the context's :class:`LogTableSourceFields`)."""

    avro_name: ClassVar[str] = "io.tidemark.connector.logtable.Source"
    table_fields: ClassVar[tuple[BlockField, ...]] = (BlockField("table", FieldType.STRING),)
    fields: ClassVar[tuple[BlockField, ...]] = (
        BlockField("stream_id", FieldType.INT64, optional=False),
        BlockField("generation", FieldType.INT64, optional=False),
        BlockField("time", FieldType.INT64, optional=False),
        BlockField("batch_seq_no", FieldType.INT64, optional=False),
        BlockField("txId", FieldType.INT64),
    )

    def position_text(self, position: int) -> str:
        return position_text(position)


#: The block of every log-table event.
LOGTABLE_BLOCK: Final = LogTableBlock()
