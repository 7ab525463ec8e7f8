"""MariaDB's fused path (rows events -> JSON lines, ``tidemark capture``) writes what the
change events through the serializer write, byte for byte: the C writer, its Python twin
and the events path, for random rows events (every column kind, NULLs, non-ASCII, every
operation, key changes) and for a real server's binlog (every type of the MariaDB type
list, a transaction larger than memory, a truncate, a signal)."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
from hypothesis import given, settings
from test_mariadb_row_image import rows_events

from conftest import MariaDatabase
from tidemark.engine.prerender import offer_rendering
from tidemark.event import ChangeEvent, Op, Record, TableId, TableSchema
from tidemark.key_change import key_changed
from tidemark.offsets.store import Offset
from tidemark.serde.debezium_json import (
    COMPILED_RENDERER,
    DebeziumJsonOptions,
    DebeziumJsonSerializer,
)
from tidemark.serde.modes import TimePrecisionMode
from tidemark.source.mariadb import client
from tidemark.source.mariadb.binlog import RowsEvent
from tidemark.source.mariadb.config import MariaDbSourceConfig
from tidemark.source.mariadb.json_lines import LineWriter, PythonRowLines
from tidemark.source.mariadb.reader import MariaDbReader
from tidemark.source.mariadb.row_decoder import RowDecoder
from tidemark.source.mariadb.table_map import TableMap
from tidemark.source.mariadb.task import MariaDbTask
from tidemark.source.mariadb.transaction_records import TransactionRecords
from tidemark.source.mariadb.types import table_column
from type_lists import MARIADB_TYPES

OPTIONS = DebeziumJsonOptions(time_precision_mode=TimePrecisionMode.ADAPTIVE_TIME_MICROSECONDS)
_OPS = {"c": Op.CREATE, "u": Op.UPDATE, "d": Op.DELETE}
#: The envelope's ts_* fields: when tidemark processed the event, never the same twice.
_PROCESSED = re.compile(r'"op":"(.)","ts_ms":\d+,"ts_us":\d+,"ts_ns":\d+}')
#: A snapshot read's source ts_* fields: when it was read.
_READ_AT = re.compile(r'"ts_ms":\d+,("snapshot":"incremental",[^}]*"ts_us":)\d+,"ts_ns":\d+')


def _schema(table_map: TableMap, key: tuple[int, ...]) -> TableSchema:
    columns = tuple(table_column(c, i in key) for i, c in enumerate(table_map.columns))
    return TableSchema(TableId("db", "t"), columns, key, "default", 0)


def _made() -> TransactionRecords:
    return TransactionRecords("tidemark", "0-1-7", 1, 42, "0-1-7", 1_700_000_000_000_000,
                              123, False)


def _event_lines(schema: TableSchema, op: str, rows: Any, made: TransactionRecords,
                 serializer: DebeziumJsonSerializer, now_us: int) -> list[str]:
    """The events path: a change event per row (an update of the key: a delete and a
    create, Debezium's), written by the serializer."""
    events: list[Record] = []
    key = schema.key_indexes

    def event(op: Op, before: Any, after: Any, row: int) -> ChangeEvent:
        return ChangeEvent(op, schema, before, after, made.context(schema.table, "b.1", 4, row),
                           123, 1, 1, now_us)
    for index, (before, after) in enumerate(rows):
        if op == "u" and key and key_changed(key, before, after):
            events += [event(Op.DELETE, before, None, index), event(Op.CREATE, None, after, index)]
        else:
            events.append(event(_OPS[op], before, after, index))
    return serializer.text_lines(events)


@pytest.mark.parametrize("tombstones", [True, False])
@settings(max_examples=300, deadline=None)
@given(case=rows_events())
def test_the_c_writer_and_its_python_twin_write_the_events_lines(
        case: tuple[TableMap, RowsEvent], tombstones: bool) -> None:
    table_map, event = case
    rows = RowDecoder(table_map).rows(event)
    options = DebeziumJsonOptions(time_precision_mode=OPTIONS.time_precision_mode,
                                  tombstones_on_delete=tombstones)
    # Each writer against the events path of the same serializer: the C writer against
    # the C event renderer, the Python twin against the generated Python code (the two
    # per-value codes are held to each other by the serializer's tests).
    for compiled in (False, True) if COMPILED_RENDERER else (False,):
        for key in ((0,), ()):  # with a key (the first column), and without one
            schema = _schema(table_map, key)
            serializer = DebeziumJsonSerializer(options, compiled=compiled)
            writer = LineWriter(serializer).writer(schema)
            assert isinstance(getattr(writer, "__self__", None), PythonRowLines) \
                is not compiled
            made = _made()
            now_us = time.time_ns() // 1000
            head, tail = LineWriter(serializer).source_parts(made, schema.table, "b.1", 4)
            ts_text = serializer.ts_fields(now_us)
            try:
                expected = _event_lines(schema, event.op, rows, made, serializer, now_us)
            except ValueError:  # random bytes: a value with no JSON form (-1023:63:63)
                with pytest.raises(ValueError):
                    writer(rows, event.op, head, tail, ts_text, tombstones)
                continue
            assert writer(rows, event.op, head, tail, ts_text, tombstones) == expected


def test_the_compiled_writer_refuses_rows_it_cannot_write() -> None:
    if not COMPILED_RENDERER:
        pytest.skip("tidemark.serde._render is not built")
    schema = TableSchema(TableId("db", "t"), (table_column(_int_column(), True),), (0,),
                         "default", 0)
    writer = DebeziumJsonSerializer(OPTIONS).renderer(schema)
    lines = writer.lines  # type: ignore[attr-defined]
    assert lines([(None, ("1",))], "c", "{", "}", "}", True)
    with pytest.raises(ValueError, match="tuple of 1"):
        lines([(None, ("1", "2"))], "c", "{", "}", "}", True)
    with pytest.raises(ValueError, match="lacks the image"):
        lines([(None, None)], "d", "{", "}", "}", True)
    with pytest.raises(ValueError, match="op must be"):
        lines([(None, ("1",))], "x", "{", "}", "}", True)


def _int_column() -> Any:
    from tidemark.source.mariadb import binlog as b  # noqa: PLC0415
    from tidemark.source.mariadb.table_map import TableColumn  # noqa: PLC0415
    return TableColumn("id", b.T_LONG, 0, False)


# -- a real server's binlog ------------------------------------------------------------
def _capture(config: MariaDbSourceConfig, json_lines: DebeziumJsonSerializer | None,
             offset: Offset) -> list[str]:
    """Every line up to the binlog's end now, written by the fused path (*json_lines*)
    or by the serializer from the change events."""
    serializer = DebeziumJsonSerializer(OPTIONS)
    reader = MariaDbReader(config, json_lines=json_lines)
    lines: list[str] = []
    try:
        reader.start(offset, stop_at_end=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            batch = reader.poll()
            assert not (batch.records and batch.lines), "a batch holds lines or records"
            if batch.lines is not None:
                assert json_lines is not None
                lines += batch.lines
            lines += serializer.text_lines(batch.records)
            if batch.finished:
                return [_READ_AT.sub(r"\1READ", _PROCESSED.sub(r'"op":"\1",TS}', line))
                        for line in lines]
        raise AssertionError("capture did not reach the binlog's end in 60 s")
    finally:
        reader.stop()


def _workload(mdb: MariaDatabase) -> None:
    mdb.execute(f"CREATE TABLE t ({MARIADB_TYPES.columns})")
    mdb.execute("CREATE TABLE k (id INT PRIMARY KEY, v VARCHAR(20))")
    mdb.execute("CREATE TABLE nokey (a INT, b TEXT)")
    mdb.execute("CREATE TABLE signals (id VARCHAR(42) PRIMARY KEY, type VARCHAR(32), "
                "data VARCHAR(2048))")
    mdb.execute("INSERT INTO t VALUES " + MARIADB_TYPES.row % (1, 2))
    mdb.execute("INSERT INTO t (id) VALUES (3)")  # NULL everywhere else
    mdb.execute("UPDATE t SET tx = 'ünïcødé ✓ \"q\" \\\\ \n', f = -0.0, dd = 1e-300 "
                "WHERE id = 1")
    mdb.execute("UPDATE t SET id = 10 WHERE id = 2")  # a key change: delete + create
    mdb.execute("DELETE FROM t WHERE id = 3")
    mdb.execute("INSERT INTO k SELECT seq, CONCAT('v', seq) FROM seq_1_to_50")
    mdb.execute("UPDATE k SET v = 'x' WHERE id <= 20")
    mdb.execute("INSERT INTO nokey VALUES (1, 'a'), (NULL, NULL)")
    mdb.execute("DELETE FROM nokey")
    mdb.execute("INSERT INTO signals VALUES ('s1', 'execute-snapshot', "
                f"'{{\"data-collections\": [\"{mdb.name}.t\"]}}')")
    mdb.execute("TRUNCATE TABLE k")


@pytest.mark.parametrize("rows_in_memory", [None, 7])
def test_capture_lines_are_the_events_lines(mdb: MariaDatabase,
                                            rows_in_memory: int | None) -> None:
    """Every MariaDB type, NULLs, non-ASCII, a key change, a table without a key, a
    truncate and an incremental snapshot (its signal, its chunks' reads); with
    *rows_in_memory*, transactions larger than memory."""
    settings: dict[str, Any] = {"dsn": mdb.dsn, "signal_table": f"{mdb.name}.signals",
                                "incremental_snapshot_chunk_size": 1}
    if rows_in_memory is not None:
        settings["max_transaction_rows_in_memory"] = rows_in_memory
    config = MariaDbSourceConfig.from_mapping(settings)
    conn = client.connect(config.connection)
    try:
        start = client.current_position(conn)
    finally:
        conn.close()
    _workload(mdb)
    offset: Offset = {"binlog": start.to_offset()}
    events = _capture(config, None, offset)
    # t: 3 inserts, an update, a key change (2), a delete; k: 50 inserts, 20 updates, a
    # truncate; nokey: 2 inserts, 2 deletes; the signal is no event, the snapshot reads
    # the two rows of t left.
    assert len(events) == 7 + 71 + 4 + 2
    assert sum('"op":"r"' in line for line in events) == 2
    assert _capture(config, DebeziumJsonSerializer(OPTIONS), offset) == events
    # The Python twin, where the C writer is not built.
    assert _capture(config, DebeziumJsonSerializer(OPTIONS, compiled=False), offset) == events


def test_the_task_renders_lines_only() -> None:
    config = MariaDbSourceConfig.from_mapping({"dsn": "mariadb://u:p@127.0.0.1:1/db"})
    assert not offer_rendering(MariaDbTask(config), OPTIONS)  # rendered events: no
    assert not offer_rendering(MariaDbTask(config), OPTIONS, records=True)
    assert offer_rendering(MariaDbTask(config), OPTIONS, lines=True)
    with_metadata = DebeziumJsonOptions(time_precision_mode=OPTIONS.time_precision_mode,
                                        transaction_metadata=True)
    assert not offer_rendering(MariaDbTask(config), with_metadata, lines=True)
    metadata_config = MariaDbSourceConfig.from_mapping(
        {"dsn": "mariadb://u:p@127.0.0.1:1/db", "provide_transaction_metadata": True})
    assert not offer_rendering(MariaDbTask(metadata_config), OPTIONS, lines=True)
    with pytest.raises(ValueError, match="transaction metadata"):
        LineWriter(DebeziumJsonSerializer(with_metadata))
