"""The source block interface: a source describes its block once, and the JSON writers
(general, generated, C), the Avro encoder and ``ChangeEvent.source`` build from it — a
new source needs no edit in serde. And each source prints its position its own way."""

from __future__ import annotations

import io
from typing import ClassVar

import fastavro
import msgspec
import pytest

from tidemark.engine.avro_converter import AvroConverter
from tidemark.engine.records import ChangeRecord
from tidemark.event import ChangeEvent, Column, Op, SourceContext, TableId, TableSchema
from tidemark.logical_type import Kind, LogicalType
from tidemark.serde.avro import avro_schemas
from tidemark.serde.debezium_json import DebeziumJsonOptions, DebeziumJsonSerializer
from tidemark.source.logtable import source_block as logtable_block
from tidemark.source.mariadb import source_fields as mariadb_block
from tidemark.source.postgres import source_block as postgres_block
from tidemark.source_block import POSITION, BlockField, BlockValues, FieldType, SourceBlock


class _Fields(msgspec.Struct, frozen=True, gc=False):
    shard: int
    token: str | None


class _PerEventBlock(SourceBlock):
    """A made-up source whose fields are in its contexts."""

    avro_name: ClassVar[str] = "io.example.connector.made.Source"
    table_fields: ClassVar[tuple[BlockField, ...]] = (BlockField("table", FieldType.STRING),)
    fields: ClassVar[tuple[BlockField, ...]] = (
        BlockField("shard", FieldType.INT32, optional=False),
        BlockField("token", FieldType.STRING))

    def position_text(self, position: int) -> str:
        return f"made {position}"


class _PositionBlock(SourceBlock):
    """A made-up source that carries the position in its block, as PostgreSQL does."""

    avro_name: ClassVar[str] = "io.example.connector.pos.Source"
    table_fields: ClassVar[tuple[BlockField, ...]] = (
        BlockField("schema", FieldType.STRING), BlockField("table", FieldType.STRING))
    fields: ClassVar[tuple[BlockField, ...]] = (
        BlockField("at", FieldType.INT64), BlockField("again", FieldType.INT64),
        BlockField("flag", FieldType.BOOLEAN))
    carries_position: ClassVar[bool] = True

    def values(self, context: SourceContext) -> BlockValues:
        return (POSITION, POSITION, True)

    def position_text(self, position: int) -> str:
        return str(position)


_SCHEMA = TableSchema(
    TableId("s", "t"),
    (Column("id", LogicalType(Kind.INT32), "int", True, int, False),
     Column("v", LogicalType(Kind.STRING), "text", False, str)),
    (0,), "default")


def _events(context: SourceContext) -> list[ChangeEvent]:
    return [ChangeEvent(Op.CREATE, _SCHEMA, None, (str(n), f"v{n}"), context, 100 + n, n + 1,
                        n + 1, 1_700_000_000_000_000) for n in range(3)]


@pytest.mark.parametrize("compiled", [True, False])
def test_a_new_sources_block_is_written_by_every_writer(compiled: bool) -> None:
    per_event = SourceContext("made", "srv", "db", 1_700_000_000_000_000, None, None,
                              source_fields=_Fields(3, None), block=_PerEventBlock())
    with_position = SourceContext("pos", "srv", "db", 1_700_000_000_000_000, None, None,
                                  block=_PositionBlock())
    serializer = DebeziumJsonSerializer(compiled=compiled)
    for context, tail in ((per_event, ',"table":"t","shard":3,"token":null}'),
                          (with_position, ',"schema":"s","table":"t","at":{p},"again":{p},'
                                          '"flag":true}')):
        for event in _events(context):
            key, value = serializer.key_and_value(event)
            assert (key, value) == serializer.general_key_and_value(event)
            source = msgspec.json.decode(value)["source"]
            text = value[value.index('"source":') + 9:value.index(',"transaction"')]
            assert text.endswith(tail.replace("{p}", str(event.lsn)))
            assert source["sequence"] is None and source["db"] == "db"
            assert event.source.fields == {
                name: source[name] for name in list(source)[9 + len(
                    context.block.table_fields):]}  # type: ignore[union-attr]


def test_a_new_sources_block_is_its_avro_source_record() -> None:
    options = DebeziumJsonOptions()
    context = SourceContext("made", "srv", "db", 1_700_000_000_000_000, None, None,
                            source_fields=_Fields(3, "x"), block=_PerEventBlock())
    [record] = AvroConverter(options).convert([ChangeRecord.of(_events(context)[0])])
    _, value_schema = avro_schemas(_SCHEMA, options, context.block)
    source_type = value_schema["fields"][2]["type"]
    assert source_type["name"] == "io.example.connector.made.Source"
    assert [f["name"] for f in source_type["fields"]][-3:] == ["table", "shard", "token"]
    value = fastavro.schemaless_reader(io.BytesIO(record.value), value_schema)
    assert value["source"]["shard"] == 3 and value["source"]["token"] == "x"


def test_each_source_prints_its_position() -> None:
    assert postgres_block.position_text(0x16B3748) == "0/16B3748"
    assert postgres_block.POSTGRES_BLOCK.position_text((0x16 << 32) | 0xB374D848) == \
        "16/B374D848"
    assert mariadb_block.position_text((3 << 32) | 1234) == "binlog 3:1234"
    assert mariadb_block.MARIADB_BLOCK.position_text(5 << 32) == "binlog 5:0"
    assert logtable_block.position_text(42) == "log position 42"
    assert logtable_block.LOGTABLE_BLOCK.position_text(7) == "log position 7"


def test_the_avro_source_records_are_debeziums() -> None:
    names = {block.avro_name for block in (postgres_block.POSTGRES_BLOCK,
                                           mariadb_block.MARIADB_BLOCK)}
    assert names == {"io.debezium.connector.postgresql.Source",
                     "io.debezium.connector.mariadb.Source"}
    # MariaDB's own fields are its Struct's, in order.
    assert [f.name for f in mariadb_block.MARIADB_BLOCK.fields] == list(
        mariadb_block.MariaDbSourceFields.__struct_fields__)
    assert [f.name for f in logtable_block.LOGTABLE_BLOCK.fields] == list(
        logtable_block.LogTableSourceFields.__struct_fields__)
