"""The MariaDB connector's own ``source`` fields and block, as Debezium's binlog
connectors (``BinlogSourceInfoStructMaker``) have them: ``table``, then ``server_id``,
``gtid``, ``file``, ``pos``, ``row``, ``thread``, ``query``. They differ per event
(``row``), so every event has its own context holding them."""

from __future__ import annotations

from typing import ClassVar, Final

import msgspec

from tidemark.source_block import BlockField, FieldType, SourceBlock


class MariaDbSourceFields(msgspec.Struct, frozen=True, gc=False):
    """``server_id``, ``gtid``, ``file``, ``pos`` (the rows event's), ``row`` (the row's
    index in it), ``thread``, ``query`` (always null: ``binlog_annotate_row_events`` is
    not read)."""

    server_id: int
    gtid: str | None
    file: str
    pos: int
    row: int
    thread: int | None
    query: str | None = None


def position_text(position: int) -> str:
    """A position (binlog file number << 32 | offset) as ``binlog <file#>:<offset>``."""
    return f"binlog {position >> 32}:{position & 0xFFFFFFFF}"


class MariaDbBlock(SourceBlock):
    """The MariaDB connector's block (its values: the context's
    :class:`MariaDbSourceFields`)."""

    avro_name: ClassVar[str] = "io.debezium.connector.mariadb.Source"
    table_fields: ClassVar[tuple[BlockField, ...]] = (BlockField("table", FieldType.STRING),)
    fields: ClassVar[tuple[BlockField, ...]] = (
        BlockField("server_id", FieldType.INT64, optional=False),
        BlockField("gtid", FieldType.STRING),
        BlockField("file", FieldType.STRING, optional=False),
        BlockField("pos", FieldType.INT64, optional=False),
        BlockField("row", FieldType.INT32, optional=False),
        BlockField("thread", FieldType.INT64),
        BlockField("query", FieldType.STRING),
    )

    def position_text(self, position: int) -> str:
        return position_text(position)


#: The block of every MariaDB event.
MARIADB_BLOCK: Final = MariaDbBlock()
