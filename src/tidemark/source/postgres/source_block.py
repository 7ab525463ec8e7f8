"""The PostgreSQL connector's ``source`` block and position, as Debezium's
``PostgresSourceInfoStructMaker`` has them: ``schema``, ``table``, then ``txId``,
``lsn``, ``xmin``, ``origin``, ``origin_lsn``; ``sequence`` is
``["<last commit LSN>","<LSN>"]``. The event's position is its LSN, which the block
carries twice (``sequence`` and ``lsn``), so one context serves a whole transaction.
"""

from __future__ import annotations

from typing import ClassVar, Final

from tidemark.event import SourceContext
from tidemark.source_block import (
    POSITION,
    BlockField,
    BlockValues,
    FieldType,
    Position,
    SourceBlock,
)


def position_text(position: int) -> str:
    """An LSN as PostgreSQL prints it (``0/16B3748``)."""
    return f"{position >> 32:X}/{position & 0xFFFFFFFF:X}"


class PostgresBlock(SourceBlock):
    """The PostgreSQL connector's block; its values come from the context's ``txid``,
    ``last_commit_lsn`` and ``origin``."""

    avro_name: ClassVar[str] = "io.debezium.connector.postgresql.Source"
    table_fields: ClassVar[tuple[BlockField, ...]] = (
        BlockField("schema", FieldType.STRING, optional=False),
        BlockField("table", FieldType.STRING, optional=False),
    )
    fields: ClassVar[tuple[BlockField, ...]] = (
        BlockField("txId", FieldType.INT64),
        BlockField("lsn", FieldType.INT64),
        BlockField("xmin", FieldType.INT64),
        BlockField("origin", FieldType.STRING),
        BlockField("origin_lsn", FieldType.INT64),
    )
    carries_position: ClassVar[bool] = True

    def values(self, context: SourceContext) -> BlockValues:
        return (context.txid, POSITION, None, context.origin, None)

    def sequence(self, context: SourceContext) -> tuple[str | Position | None, ...]:
        last = context.last_commit_lsn
        return (None if last is None else str(last), POSITION)

    def position_text(self, position: int) -> str:
        return position_text(position)


#: The block of every PostgreSQL event.
POSTGRES_BLOCK: Final = PostgresBlock()
