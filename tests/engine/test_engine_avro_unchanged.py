"""Unavailable values in Avro: the columns a log-table update did not set (written as
ScyllaDB's cells, or with Debezium's placeholder without cells) and PostgreSQL's
unchanged TOASTed values of every TOASTable type, through the engine's AvroConverter,
decoded back with fastavro; the Arrow converter on the same events; and every
converter with its defaults on a log table: unchanged told from NULL."""

from __future__ import annotations

import io
import json
import logging
import threading
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any

import fastavro
import pyarrow as pa
import pytest

from conftest import Database
from logtable_helpers import LogDb
from tidemark import Engine, LogTableConnector, MemoryOffsetStore
from tidemark.engine.arrow_converter import ArrowConverter
from tidemark.engine.avro_converter import AvroConverter
from tidemark.engine.converters import ConvertedRecord, DebeziumJsonConverter
from tidemark.engine.records import ChangeRecord
from tidemark.engine.transforms import ExtractNewRecordState
from tidemark.event import UNAVAILABLE, ChangeEvent
from tidemark.logical_type import Kind
from tidemark.serde.avro import AvroEncoder, avro_schemas
from tidemark.serde.debezium_json import DebeziumJsonOptions
from tidemark.serde.modes import DecimalHandlingMode
from tidemark.source.postgres.task import PostgresConnector
from tidemark.testing.sink import MemorySink
from waiting import wait_for

PLACEHOLDER = "__debezium_unavailable_value"


def _run(connector: Any, converter: Any, count: int,
         transforms: Sequence[Any] = (), change: Callable[[], None] | None = None
         ) -> list[ConvertedRecord]:
    """The engine's first *count* records with a value; *change* runs once the first
    has come."""
    return _run_engine(connector, converter, count, transforms, change)[1]


def _run_engine(connector: Any, converter: Any, count: int,
                transforms: Sequence[Any] = (), change: Callable[[], None] | None = None,
                size: Callable[[ConvertedRecord], int] = lambda _: 1
                ) -> tuple[Engine, list[ConvertedRecord]]:
    """The engine and its first records with a value, until they hold *count* changes
    (*size*: the changes a record holds)."""
    sink = MemorySink()
    engine = Engine(connector, sink, config={"offset_flush_interval_ms": 0},
                    converter=converter, transforms=transforms,
                    offset_store=MemoryOffsetStore())
    thread = threading.Thread(target=engine.run, daemon=True)
    thread.start()

    def valued() -> list[ConvertedRecord]:
        return [r for r in sink.records if r.value is not None]

    try:
        if change is not None:
            wait_for(lambda: bool(valued()), 60, "the first converted record")
            change()
        wait_for(lambda: sum(map(size, valued())) >= count, 60, f"{count} changes")
    finally:
        engine.close()
        thread.join(timeout=30)
    assert not thread.is_alive()
    records, held = [], 0
    for record in valued():
        if held < count:
            records.append(record)
            held += size(record)
    return engine, records


def _rows(records: list[ConvertedRecord], options: DebeziumJsonOptions, *, flat: bool
          ) -> list[tuple[ChangeEvent, dict[str, Any]]]:
    """Each record's event and its decoded row (the envelope's after, or the flat row)."""
    out = []
    for record in records:
        event = record.event
        assert isinstance(event, ChangeEvent) and event.schema is not None
        assert isinstance(record.value, bytes)
        if flat:
            codec = AvroEncoder(options).codec(event.schema, event.context.block)
            row = fastavro.schemaless_reader(io.BytesIO(record.value), codec.flat_schema(()))
        else:
            _, schema = avro_schemas(event.schema, options, event.context.block)
            row = fastavro.schemaless_reader(io.BytesIO(record.value), schema)["after"]
        assert isinstance(row, dict)
        out.append((event, row))
    return out


_LOG_COLUMNS = ("i", "n", "b", "d", "ts", "by", "tx")


def _log_table(logdb: LogDb) -> None:
    """A row inserted, then three updates that leave ``u`` or the others unchanged:
    u only; every other column to NULL; every other column back to its first value."""
    if logdb.kind == "sqlite":
        logdb.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, u INTEGER, i INTEGER, "
                      "n DECIMAL(10,2), b BOOLEAN, d DATE, ts TIMESTAMP, by BLOB, tx TEXT)")
        values = ("7", "12.5", "1", "'2024-02-29'", "'2024-01-02 03:04:05'", "x'00ff'",
                  "'é'")
    else:
        logdb.execute("CREATE TABLE t (id int PRIMARY KEY, u int, i int, n numeric(10,2), "
                      "b bool, d date, ts timestamp, by bytea, tx text)")
        values = ("7", "12.5", "true", "'2024-02-29'", "'2024-01-02 03:04:05.5'",
                  "'\\x00ff'", "'é'")
    logdb.install(["t"])
    logdb.execute(f"INSERT INTO t VALUES (1, 0, {', '.join(values)})")
    logdb.execute("UPDATE t SET u = 1 WHERE id = 1")
    logdb.execute("UPDATE t SET " + ", ".join(f"{c} = NULL" for c in _LOG_COLUMNS)
                  + " WHERE id = 1")
    logdb.execute("UPDATE t SET " + ", ".join(f"{c} = {v}" for c, v in
                                               zip(_LOG_COLUMNS, values, strict=True))
                  + " WHERE id = 1")


def _plain_placeholder(event: ChangeEvent, name: str) -> Any:
    """Debezium's placeholder where the column's Avro type holds it, else null."""
    assert event.schema is not None
    [kind] = [c.logical.kind for c in event.schema.columns if c.name == name]
    return PLACEHOLDER if kind is Kind.STRING else \
        PLACEHOLDER.encode() if kind is Kind.BYTES else None


@pytest.mark.parametrize("flat", [False, True], ids=["envelope", "flat"])
@pytest.mark.parametrize("cells", [True, False], ids=["cells", "plain"])
def test_log_table_update_unchanged_columns_in_avro(logdb: LogDb, cells: bool,
                                                     flat: bool) -> None:
    """Unchanged: a null cell (flattened, a row without cells: the placeholder where the
    type holds it, else null); set to NULL: a cell holding null; set: a cell holding
    the value. Without cells: Debezium's placeholder where the type
    holds it (text, bytes), else null; no update stops the engine."""
    _log_table(logdb)
    options = DebeziumJsonOptions(cells=cells)
    connector = LogTableConnector({"dsn": logdb.dsn, "poll_interval_ms": 50})
    transforms = [ExtractNewRecordState()] if flat else []
    rows = _rows(_run(connector, AvroConverter(options), 4, transforms), options, flat=flat)
    (insert, first), (_, only_u), (_, nulls), (_, again) = rows
    wrap = cells and not flat

    def cell(value: Any) -> Any:
        return {"value": value} if wrap else value

    assert first["id"] == only_u["id"] == nulls["id"] == again["id"] == 1  # keys plain
    assert only_u["u"] == cell(1) and first["u"] == cell(0)
    for name in _LOG_COLUMNS:
        set_value = first[name]
        assert set_value == again[name] and set_value is not None, name
        if wrap:
            assert set_value["value"] is not None, name
        # A flat row has no cells: the placeholder where the type holds it, as without.
        unchanged = None if wrap else _plain_placeholder(insert, name)
        assert only_u[name] == unchanged, name
        assert nulls[name] == cell(None), name
    assert nulls["u"] == again["u"] == (None if wrap else _plain_placeholder(insert, "u"))

    if wrap:  # ScyllaDB's cell struct: <table>.<column>.Cell, one optional field value
        assert insert.schema is not None
        _, schema = avro_schemas(insert.schema, options, insert.context.block)
        value = next(f for f in schema["fields"] if f["name"] == "before")["type"][1]
        types = {f["name"]: f["type"] for f in value["fields"]}
        assert types["id"][0] == "null" and not isinstance(types["id"][1], dict)
        for name in ("u", *_LOG_COLUMNS):
            null, record = types[name]
            assert null == "null" and record["type"] == "record", name
            assert record["name"].endswith(f".{name}.Cell"), record["name"]
            [field] = record["fields"]
            assert field["name"] == "value" and field["type"][0] == "null"
            assert field["default"] is None


def test_log_table_unchanged_columns_in_arrow(logdb: LogDb) -> None:
    """The Arrow converter on the same events: an unchanged column is null and named in
    ``_unavailable``; one set to NULL is null and not named there."""
    _log_table(logdb)
    options = DebeziumJsonOptions(cells=True)
    connector = LogTableConnector({"dsn": logdb.dsn, "poll_interval_ms": 50})
    events = [r.event for r in _run(connector, AvroConverter(options), 4)]
    assert all(isinstance(e, ChangeEvent) for e in events)
    batches = ArrowConverter().convert([ChangeRecord.of(e) for e in events])  # type: ignore[arg-type]
    assert all(isinstance(b.value, pa.RecordBatch) for b in batches)
    rows = [row for b in batches for row in b.value.to_pylist()]
    first, only_u, nulls, again = rows
    assert only_u["_unavailable"] == list(_LOG_COLUMNS)
    assert nulls["_unavailable"] == again["_unavailable"] == ["u"]
    for name in _LOG_COLUMNS:
        assert first[name] is not None and first[name] == again[name], name
        assert only_u[name] is None and nulls[name] is None, name
    assert [e.raw_after[2] for e in events] == [  # type: ignore[union-attr]
        events[0].raw_after[2], UNAVAILABLE, None, events[0].raw_after[2]]  # type: ignore[union-attr]


UNCHANGED = object()  # a column the update left as it was, as a consumer reads it


def _decoded(converter: str, engine: Engine, records: list[ConvertedRecord]
             ) -> list[dict[str, Any]]:
    """Each change's row after it, as a consumer decodes the converter's output with
    what the engine says of it: a column's value, or UNCHANGED."""
    if converter == "arrow":
        rows = [row for r in records for row in r.value.to_pylist()]  # type: ignore[union-attr]
        return [{n: UNCHANGED if n in row["_unavailable"] else row[n] for n in _LOG_COLUMNS}
                for row in rows]
    options = engine.converter.options  # type: ignore[attr-defined]
    assert options.cells is True, "a log table's default is cells"
    out = []
    for record in records:
        if converter == "json":
            assert isinstance(record.value, str)
            after = json.loads(record.value)["after"]
        else:
            event = record.event
            assert isinstance(event, ChangeEvent) and event.schema is not None
            _, schema = avro_schemas(event.schema, options, event.context.block)
            after = fastavro.schemaless_reader(io.BytesIO(record.value), schema)["after"]
        out.append({n: UNCHANGED if after[n] is None else after[n]["value"]
                    for n in _LOG_COLUMNS})
    return out


@pytest.mark.parametrize("converter", ["json", "avro", "arrow"])
def test_log_table_defaults_tell_unchanged_from_null(logdb: LogDb, converter: str) -> None:
    """Every converter made with its defaults, on a log table: an update leaving int,
    numeric, bool, date, timestamp, bytes and text columns unchanged reads as unchanged,
    one setting them to NULL as NULL, and the values come back as they were (failed
    before: JSON wrote the placeholder text into non-text columns, Avro null)."""
    _log_table(logdb)
    made = {"json": DebeziumJsonConverter, "avro": AvroConverter,
            "arrow": ArrowConverter}[converter]()
    connector = LogTableConnector({"dsn": logdb.dsn, "poll_interval_ms": 50})
    engine, records = _run_engine(
        connector, made, 4,
        size=lambda r: r.value.num_rows if converter == "arrow" else 1)  # type: ignore[union-attr]
    first, only_u, nulls, again = _decoded(converter, engine, records)
    for name in _LOG_COLUMNS:
        assert first[name] not in (None, UNCHANGED) and first[name] == again[name], name
        assert only_u[name] is UNCHANGED, name
        assert nulls[name] is None, name


def test_log_table_flat_json_leaves_unchanged_out(logdb: LogDb) -> None:
    """ExtractNewRecordState and the default JSON converter on a log table: a column
    the update left unchanged is absent from the flat row, one set to NULL is null
    (failed before: both null)."""
    _log_table(logdb)
    connector = LogTableConnector({"dsn": logdb.dsn, "poll_interval_ms": 50})
    records = _run(connector, DebeziumJsonConverter(), 4, [ExtractNewRecordState()])
    first, only_u, nulls, again = [json.loads(r.value) for r in records]  # type: ignore[arg-type]
    assert set(first) == {"id", "u", *_LOG_COLUMNS} and set(again) == {"id", *_LOG_COLUMNS}
    assert all(first[n] is not None and first[n] == again[n] for n in _LOG_COLUMNS)
    assert only_u == {"id": 1, "u": 1}
    assert nulls == {"id": 1, **dict.fromkeys(_LOG_COLUMNS)}


@pytest.mark.parametrize("case", ["plain", "flat", "default"])
def test_avro_warns_once_where_unchanged_reads_as_null(
        logdb: LogDb, case: str, caplog: pytest.LogCaptureFixture) -> None:
    """AvroConverter on a log table warns once at start where an unchanged column of a
    non-text type becomes null: cells=False set explicitly, or flattened rows; naming
    the types and the fix. Its defaults, unflattened, warn of nothing."""
    connector = LogTableConnector({"dsn": logdb.dsn, "poll_interval_ms": 50})
    options = DebeziumJsonOptions(cells=False) if case == "plain" else None
    transforms = [ExtractNewRecordState()] if case == "flat" else []
    with caplog.at_level(logging.WARNING, "tidemark.engine.avro_converter"):
        Engine(connector, MemorySink(), converter=AvroConverter(options),
               transforms=transforms)
        Engine(PostgresConnector({"dsn": "postgresql://localhost/x"}), MemorySink(),
               converter=AvroConverter(options), transforms=transforms)
    warnings = [r.getMessage() for r in caplog.records]
    if case == "default":
        assert warnings == []
        return
    [warning] = warnings  # once, and not for PostgreSQL's replication source
    assert "integer, float, boolean, date, time, timestamp" in warning
    assert ("cells=True" if case == "plain" else "leave out ExtractNewRecordState") in warning


# Every TOASTable type (xml too where the server has libxml: a string, as text), stored
# out of line uncompressed (STORAGE EXTERNAL), so that an update of u leaves each of them
# unsent under REPLICA IDENTITY DEFAULT.
_TOASTED = {
    "tx": ("text", "repeat('a', 5000)"),
    "j": ("jsonb", "jsonb_build_object('k', repeat('b', 5000))"),
    "js": ("json", "json_build_object('k', repeat('c', 5000))"),
    "vc": ("varchar(6000)", "repeat('d', 5000)"),
    "at": ("text[]", "array_fill(repeat('e', 50), ARRAY[200])"),
    "ai": ("int[]", "ARRAY(SELECT generate_series(1, 2000))"),
    "by": ("bytea", "decode(repeat('ff', 5000), 'hex')"),
    "nn": ("numeric", "repeat('9', 10000)::numeric"),
}
# numeric(1000, 0) holds ~500 bytes: six of them make a row too wide, some go out of line.
_FIXED = [f"nf{i}" for i in range(6)]


@pytest.mark.parametrize("mode", [DecimalHandlingMode.PRECISE, DecimalHandlingMode.STRING])
def test_postgres_unchanged_toast_of_every_type_in_avro(db: Database,
                                                        mode: DecimalHandlingMode) -> None:
    """Debezium's placeholder where the column's Avro type holds it (the text for
    text-like types, its bytes for bytea, a list of them for arrays), null where none
    fits (a numeric in precise mode); the engine never stops."""
    columns = {**{c: t for c, (t, _) in _TOASTED.items()},
               **dict.fromkeys(_FIXED, "numeric(1000, 0)")}
    db.execute("CREATE TABLE t (id int PRIMARY KEY, u int, "
               + ", ".join(f"{c} {t}" for c, t in columns.items()) + ")",
               "ALTER TABLE t " + ", ".join(f"ALTER COLUMN {c} SET STORAGE EXTERNAL"
                                             for c in columns),
               "INSERT INTO t VALUES (1, 0, "
               + ", ".join([*(v for _, v in _TOASTED.values()),
                            *(f"repeat('{i + 1}', 1000)::numeric" for i in range(6))])
               + ")")
    options = DebeziumJsonOptions(decimal_handling_mode=mode)
    records = _run(PostgresConnector({"dsn": db.dsn}), AvroConverter(options), 2,
                   change=lambda: db.execute("UPDATE t SET u = 1 WHERE id = 1"))
    (_, snapshot), (update, after) = _rows(records, options, flat=False)
    assert update.schema is not None and update.raw_after is not None
    unavailable = {c.name for c, raw in zip(update.schema.columns, update.raw_after,
                                             strict=True) if raw is UNAVAILABLE}
    assert set(_TOASTED) <= unavailable
    assert unavailable & set(_FIXED), "no numeric(1000, 0) went out of line"
    assert after["u"] == 1 and snapshot["u"] == 0
    string = mode is DecimalHandlingMode.STRING
    expected = {"tx": PLACEHOLDER, "j": PLACEHOLDER, "js": PLACEHOLDER, "vc": PLACEHOLDER,
                "at": [PLACEHOLDER], "ai": list(PLACEHOLDER.encode()),
                "by": PLACEHOLDER.encode(), "nn": PLACEHOLDER if string else None}
    for name, value in expected.items():
        assert after[name] == value, name
        assert snapshot[name] not in (None, value), name
    for name in _FIXED:
        value = snapshot[name]
        assert value == (str if string else Decimal)(value), name
        if name in unavailable:
            assert after[name] == (PLACEHOLDER if string else None), name
        else:
            assert after[name] == value, name
