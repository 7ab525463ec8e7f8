"""MariaDB's fused path (rows events -> JSON lines, ``tidemark capture``) writes what the
change events through the serializer write, byte for byte: the C writer, its Python twin
and the events path, for random rows events (every column kind, NULLs, non-ASCII, every
operation, key changes) and for a real server's binlog (every type of the MariaDB type
list, a transaction larger than memory, a truncate, a signal)."""

from __future__ import annotations

import contextlib
import re
import struct
import time
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import event as event_note
from hypothesis import strategies as st
from test_mariadb_row_image import (
    UTF8MB4,
    _decimal,
    _fraction,
    _length_prefixed,
    rows_events,
)

from conftest import MariaDatabase
from tidemark.engine.prerender import offer_rendering
from tidemark.errors import DecodeError
from tidemark.event import ChangeEvent, Op, Record, TableId, TableSchema
from tidemark.key_change import key_changed
from tidemark.offsets.store import Offset
from tidemark.serde.debezium_json import (
    COMPILED_RENDERER,
    DebeziumJsonOptions,
    DebeziumJsonSerializer,
)
from tidemark.serde.modes import TimePrecisionMode
from tidemark.source.mariadb import binlog as b
from tidemark.source.mariadb import client
from tidemark.source.mariadb.binlog import RowsEvent
from tidemark.source.mariadb.config import MariaDbSourceConfig
from tidemark.source.mariadb.json_lines import LineWriter, PythonRowLines, fused_plan
from tidemark.source.mariadb.reader import MariaDbReader
from tidemark.source.mariadb.row_decoder import COMPILED_ROW_IMAGES, RowDecoder
from tidemark.source.mariadb.table_map import TableColumn, TableMap
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
    # Every column of a kind the compiled decoder writes itself (and values it leaves to
    # decoding: a double outside Java's plain range), keyed by a text.
    mdb.execute("CREATE TABLE f (name VARCHAR(40) PRIMARY KEY, i INT, bi BIGINT UNSIGNED, "
                "b BOOLEAN, tx TEXT, n DECIMAL(12,2), n2 DECIMAL(38,10), ts TIMESTAMP(6) NULL, "
                "ts0 TIMESTAMP NULL, dd DOUBLE, d DATE)")
    mdb.execute("INSERT INTO f VALUES ('a', -2147483648, 18446744073709551615, 1, "
                "'é \"x\" \\\\ \t ✓', -1234567890.12, 1234567890123456789012345678.0123456789, "
                "'2038-01-19 03:14:07.999999', '1970-01-01 00:00:01', 0.1, '2024-02-29'), "
                "('b', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL), "
                "('ü', 0, 0, 0, '', 0, -0.0000000001, '2000-01-01 00:00:00', "
                "'2000-01-01 00:00:00', 1e300, '1000-01-01')")
    mdb.execute("UPDATE f SET dd = 12345.5, i = i + 1 WHERE name = 'a'")
    mdb.execute("UPDATE f SET name = 'c' WHERE name = 'b'")  # a key change
    mdb.execute("DELETE FROM f WHERE name = 'ü'")


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
    # the two rows of t left; f: 3 inserts, an update, a key change, a delete.
    assert len(events) == 7 + 71 + 4 + 2 + 3 + 1 + 2 + 1
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


# -- the compiled decoder's lines, straight from the images ---------------------------
@st.composite
def fused_rows_events(draw: st.DrawFn) -> tuple[TableMap, RowsEvent]:
    """A rows event over the column kinds the compiled decoder writes as JSON itself
    (integers, doubles, decimals, timestamps, dates, UTF-8 texts), random NULLs and
    bytes (zero dates, values outside the fast shapes, invalid UTF-8 among them)."""
    def column(i: int) -> tuple[TableColumn, st.SearchStrategy[bytes]]:
        kind = draw(st.sampled_from(["int", "bigint", "double", "decimal", "timestamp2",
                                     "date", "varchar", "text"] if i else ["int", "varchar"]))
        nullable = bool(i) and draw(st.booleans())
        if kind == "int":
            size = draw(st.sampled_from([1, 2, 3, 4]))
            t = {1: b.T_TINY, 2: b.T_SHORT, 3: b.T_INT24, 4: b.T_LONG}[size]
            return (TableColumn(f"c{i}", t, 0, nullable, draw(st.booleans())),
                    st.binary(min_size=size, max_size=size))
        if kind == "bigint":
            return (TableColumn(f"c{i}", b.T_LONGLONG, 0, nullable, draw(st.booleans())),
                    st.binary(min_size=8, max_size=8))
        if kind == "double":
            return (TableColumn(f"c{i}", b.T_DOUBLE, 8, nullable),
                    st.floats(allow_nan=True).map(lambda x: struct.pack("<d", x)))
        if kind == "decimal":
            precision = draw(st.integers(1, 65))
            scale = draw(st.integers(0, min(precision, 30)))
            return (TableColumn(f"c{i}", b.T_NEWDECIMAL, precision << 8 | scale, nullable),
                    st.builds(_decimal, st.sampled_from([1, -1]),
                              st.text("0123456789", max_size=precision - scale),
                              st.text("0123456789", max_size=scale),
                              st.just(precision), st.just(scale)))
        if kind == "timestamp2":
            fsp = draw(st.sampled_from([0, 3, 6]))
            return (TableColumn(f"c{i}", b.T_TIMESTAMP2, fsp, nullable),
                    st.builds(lambda s, us: s.to_bytes(4, "big") + _fraction(us, fsp),
                              st.integers(0, 2**32 - 1) | st.just(0),
                              st.integers(0, 999_999)))
        if kind == "date":
            return (TableColumn(f"c{i}", b.T_DATE, 0, nullable),
                    st.binary(min_size=3, max_size=3) | st.just(b"\0\0\0"))
        text = st.text(max_size=30).map(str.encode) | st.binary(max_size=8)  # not UTF-8
        if kind == "varchar":
            return (TableColumn(f"c{i}", b.T_VARCHAR, 120, nullable, charset=UTF8MB4),
                    text.map(lambda v: _length_prefixed(v, 1)))
        return (TableColumn(f"c{i}", b.T_BLOB, 2, nullable, charset=UTF8MB4),
                text.map(lambda v: _length_prefixed(v, 2)))

    specs = [column(i) for i in range(draw(st.integers(1, 8)))]
    columns = tuple(c for c, _ in specs)
    op = draw(st.sampled_from(["c", "u", "d"]))
    data = bytearray(b"header")
    for _ in range(draw(st.integers(1, 4))):
        for _ in range(2 if op == "u" else 1):
            nulls, values = 0, b""
            for i, (c, values_of) in enumerate(specs):
                if c.nullable and draw(st.booleans()):
                    nulls |= 1 << i
                else:
                    values += draw(values_of)
            data += nulls.to_bytes((len(specs) + 7) // 8, "little") + values
    full = (1 << len(columns)) - 1
    return (TableMap(1, "db", "t", columns, (0,), True),
            RowsEvent(1, op, 0, len(columns), full, full, bytes(data), 6))


@pytest.mark.skipif(not COMPILED_ROW_IMAGES or not COMPILED_RENDERER,
                    reason="the compiled decoder and writer are not built")
@settings(max_examples=1500, deadline=None)
@given(case=fused_rows_events(), tombstones=st.booleans())
def test_the_compiled_decoder_writes_the_lines_of_its_values(
        case: tuple[TableMap, RowsEvent], tombstones: bool) -> None:
    """rows_lines writes what decoding the values and writing them writes, or leaves
    the event to that (None); never anything else."""
    table_map, event = case
    decoder = RowDecoder(table_map)
    schema = _schema(table_map, (0,))
    serializer = DebeziumJsonSerializer(OPTIONS)
    plan = fused_plan(decoder, schema, OPTIONS)
    assume(plan is not None)  # DECIMAL(p, 0): written by Python, so never fused
    assert plan is not None
    made = _made()
    head, tail = LineWriter(serializer).source_parts(made, schema.table, "b.1", 4)
    ts_text = serializer.ts_fields(time.time_ns() // 1000)
    images = _images(decoder, event)
    if images is not None:
        assert decoder.count_rows(event) == len(images)
    try:
        expected = LineWriter(serializer).writer(schema)(
            decoder.rows(event), event.op, head, tail, ts_text, tombstones)
    except (DecodeError, ValueError):
        with contextlib.suppress(DecodeError, ValueError):
            assert decoder.json_lines(event, plan, head, tail, ts_text, tombstones) is None
        return
    lines = decoder.json_lines(event, plan, head, tail, ts_text, tombstones)
    event_note("left to decoding" if lines is None else "written from the images")
    assert lines is None or lines == expected


def _images(decoder: RowDecoder, event: RowsEvent) -> list[Any] | None:
    try:
        return decoder.rows(event)
    except DecodeError:
        return None  # not UTF-8: counted all the same, decoded never
