"""The engine's Avro and Arrow converters on every source, not only PostgreSQL's
logical replication: MariaDB and the log tables (PostgreSQL and SQLite). Avro records
are decoded with fastavro against the schemas written for them, and their ``source``
block holds the source's own fields, as its JSON does."""

from __future__ import annotations

import io
import threading
from collections.abc import Callable
from typing import Any

import fastavro
import msgspec
import pyarrow as pa

from conftest import MariaDatabase
from logtable_helpers import LogDb
from tidemark import Engine, LogTableConnector, MariaDbConnector, MemoryOffsetStore
from tidemark.engine.arrow_converter import ArrowConverter
from tidemark.engine.avro_converter import AvroConverter
from tidemark.engine.converters import ConvertedRecord, DebeziumJsonConverter
from tidemark.engine.records import ChangeRecord
from tidemark.event import ChangeEvent
from tidemark.serde.avro import avro_schemas
from tidemark.serde.debezium_json import DebeziumJsonOptions
from tidemark.testing.sink import MemorySink
from waiting import wait_for


def _run(connector: Any, converter: Any, *steps: tuple[int, Callable[[], None]]
         ) -> list[ConvertedRecord]:
    """Run the engine with *converter*; each step waits for its count of records with
    a value, then runs its changes (the last step's count ends the run)."""
    sink = MemorySink()
    engine = Engine(connector, sink, config={"offset_flush_interval_ms": 0},
                    converter=converter, offset_store=MemoryOffsetStore())
    thread = threading.Thread(target=engine.run, daemon=True)
    thread.start()
    try:
        for count, change in steps:
            wait_for(lambda c=count: sum(r.value is not None for r in sink.records) >= c,
                     60, f"{count} converted records")
            change()
    finally:
        engine.close()
        thread.join(timeout=30)
    return [r for r in sink.records if r.value is not None]


def _decoded(records: list[ConvertedRecord], options: DebeziumJsonOptions
             ) -> list[tuple[ChangeEvent, dict[str, Any], dict[str, Any]]]:
    """Each record's event, its Avro value decoded with the written schema, and the
    same event's Debezium JSON value."""
    json_values = DebeziumJsonConverter(options)
    out = []
    for record in records:
        event = record.event
        assert isinstance(event, ChangeEvent) and event.schema is not None
        _, value_schema = avro_schemas(event.schema, options, event.context.block)
        value = fastavro.schemaless_reader(io.BytesIO(record.value), value_schema)
        [json_record] = [r for r in json_values.convert([ChangeRecord.of(event)])
                         if r.value is not None]
        out.append((event, value, msgspec.json.decode(json_record.value)))
    return out


def _same_source(avro: dict[str, Any], json: dict[str, Any]) -> None:
    # Every field of the JSON block, in Avro with the same value; a field JSON leaves
    # out (a log table's txId on SQLite) is null.
    for name, value in json.items():
        assert avro[name] == value, name
    assert all(avro[name] is None for name in avro.keys() - json.keys())


def _arrow_rows(events: list[ChangeEvent]) -> list[dict[str, Any]]:
    batches = ArrowConverter().convert([ChangeRecord.of(e) for e in events])
    assert all(isinstance(b.value, pa.RecordBatch) for b in batches)
    return [row for b in batches for row in b.value.to_pylist()]


def test_avro_and_arrow_on_mariadb(mdb: MariaDatabase) -> None:
    mdb.execute("CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(10), d DECIMAL(8,2), "
                "at TIME(6), u BIGINT UNSIGNED)",
                "INSERT INTO t VALUES (1, 'a', 1.50, '-01:02:03.5', 18446744073709551615)")

    def change() -> None:
        mdb.execute("UPDATE t SET v = 'b', at = '30:00:00' WHERE id = 1",
                    "INSERT INTO t VALUES (2, 'c', NULL, '12:00:00', 0)")
        mdb.execute("DELETE FROM t WHERE id = 2")

    options = DebeziumJsonOptions()
    records = _run(MariaDbConnector({"dsn": mdb.dsn}), AvroConverter(options),
                   (1, change), (4, lambda: None))
    decoded = _decoded(records, options)
    assert [value["op"] for _, value, _ in decoded] == ["r", "u", "c", "d"]
    for _, value, json in decoded:
        _same_source(value["source"], json["source"])
        assert value["source"]["connector"] == "mariadb"
        assert value["after"] is None or value["after"]["v"] == json["after"]["v"]
    update = decoded[1][1]["source"]
    assert update["file"].startswith("binlog.") and update["pos"] > 0
    assert update["row"] == 0 and update["server_id"] > 0 and update["gtid"]
    _, value_schema = avro_schemas(decoded[0][0].schema, options,  # type: ignore[arg-type]
                                   decoded[0][0].context.block)
    assert value_schema["fields"][2]["type"]["name"] == "io.debezium.connector.mariadb.Source"

    rows = _arrow_rows([event for event, _, _ in decoded])
    assert [r["_op"] for r in rows] == ["r", "u", "c", "d"]
    assert all(event.context.block is not None for event, _, _ in decoded)
    # MariaDB's time is a duration (negative, past 24 h): microseconds, as in JSON.
    times = [json["after"]["at"] if json["after"] else json["before"]["at"]
             for _, _, json in decoded]
    micros = pa.concat_arrays([b.value.column("at").cast(pa.int64()) for b in
                               ArrowConverter().convert(
                                   [ChangeRecord.of(e) for e, _, _ in decoded])])
    assert micros.to_pylist() == times == [-3_723_500_000, 108_000_000_000,
                                           43_200_000_000, 43_200_000_000]
    assert [r["_lsn"] for r in rows] == [e.lsn for e, _, _ in decoded]


def test_avro_and_arrow_on_log_tables(logdb: LogDb) -> None:
    logdb.execute("CREATE TABLE t (id integer PRIMARY KEY, v text, n integer)")
    logdb.install(["t"])
    logdb.execute("INSERT INTO t VALUES (1, 'a', 10)", "INSERT INTO t VALUES (2, 'b', 20)")
    logdb.execute("UPDATE t SET v = 'c' WHERE id = 1")
    logdb.execute("DELETE FROM t WHERE id = 2")
    options = DebeziumJsonOptions(cells=True)
    connector = LogTableConnector({"dsn": logdb.dsn, "poll_interval_ms": 50})
    records = _run(connector, AvroConverter(options), (4, lambda: None))
    decoded = _decoded(records, options)
    assert sorted(value["op"] for _, value, _ in decoded) == ["c", "c", "d", "u"]
    for event, value, json in decoded:
        source = value["source"]
        _same_source(source, json["source"])
        assert source["connector"] == ("sqlite" if logdb.kind == "sqlite" else "postgresql")
        assert source["time"] == event.lsn and source["batch_seq_no"] >= 0
        assert (source["txId"] is None) == (logdb.kind == "sqlite")
    _, value_schema = avro_schemas(decoded[0][0].schema, options,  # type: ignore[arg-type]
                                   decoded[0][0].context.block)
    assert value_schema["fields"][2]["type"]["name"] == \
        "io.tidemark.connector.logtable.Source"

    rows = _arrow_rows([event for event, _, _ in decoded])
    assert sorted(r["_op"] for r in rows) == ["c", "c", "d", "u"]
    assert {r["id"] for r in rows} == {1, 2}
