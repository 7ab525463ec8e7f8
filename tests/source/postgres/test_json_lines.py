"""The fused pgoutput -> JSON path must write exactly what the general path writes.

The general path (ChangeEventBuilder, then DebeziumJsonSerializer) is the reference:
every test feeds the same pgoutput messages to both and compares the bytes, on a real
PostgreSQL stream (every column type, every op, TOAST, FULL identity, DDL mid-stream)
in every serializer mode, and on synthetic and malformed messages. Both fused builders
are held to it: the JSON lines of ``tidemark capture`` and the rendered events of the
engine, whose every field must equal the general path's event and whose texts, through
the engine's converter, must give the same records.
"""

from __future__ import annotations

import contextlib
import pickle
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import msgspec
import pytest
from test_capture_types import COLUMNS, ROWS, _row_sql

from capture_helpers import make_connector
from conftest import Database
from pgoutput_builders import (
    encode_begin,
    encode_commit,
    encode_delete,
    encode_insert,
    encode_relation,
    encode_update,
)
from tidemark import postgres_connection
from tidemark.engine.converters import (
    ConvertedBatch,
    ConvertedRecord,
    DebeziumJsonConverter,
    RenderedRecord,
)
from tidemark.errors import DecodeError
from tidemark.event import UNAVAILABLE, ChangeEvent, Op, Record, TableId
from tidemark.serde.debezium_json import DebeziumJsonOptions, DebeziumJsonSerializer
from tidemark.serde.modes import DecimalHandlingMode, TimePrecisionMode
from tidemark.serde.rendered import PENDING, RenderedEvent
from tidemark.source.postgres import catalog
from tidemark.source.postgres.change_builder import ChangeEventBuilder
from tidemark.source.postgres.json_lines import JsonLineBuilder, RenderedEventBuilder
from tidemark.source.postgres.pgoutput import (
    Begin,
    Commit,
    Delete,
    Insert,
    Relation,
    RelationColumn,
    Update,
)
from tidemark.source.postgres.replication import ReplicationStream

NOW_US = 1_700_000_000_123_456
Messages = list[tuple[bytes, int]]
BuilderFactory = Callable[[], ChangeEventBuilder]


def _both(factory: BuilderFactory, messages: Messages, options: DebeziumJsonOptions,
          batch: int) -> tuple[bytes, bytes, JsonLineBuilder]:
    """(general path output, fused path output, the fused builder)."""
    general = DebeziumJsonSerializer(options)
    events = factory()
    expected = b"".join(
        general.encode_lines(events.process(messages[i:i + batch], NOW_US + i))
        for i in range(0, len(messages), batch)
    )
    lines = JsonLineBuilder(factory(), DebeziumJsonSerializer(options))
    got = b"".join(
        "".join(lines.process(messages[i:i + batch], NOW_US + i)).encode()
        for i in range(0, len(messages), batch)
    )
    return expected, got, lines


def _rendered(factory: BuilderFactory, messages: Messages, options: DebeziumJsonOptions,
              batch: int) -> tuple[list[Record], list[Record], RenderedEventBuilder]:
    """(general path records, rendered-event path records, the fused builder)."""
    events, fused = factory(), RenderedEventBuilder(factory(), DebeziumJsonSerializer(options))
    expected: list[Record] = []
    got: list[Record] = []
    for i in range(0, len(messages), batch):
        expected += events.process(messages[i:i + batch], NOW_US + i)
        got += fused.process(messages[i:i + batch], NOW_US + i)
    return expected, got, fused


_EVENT_FIELDS = [f.name for f in msgspec.structs.fields(ChangeEvent)]


def _fields(event: ChangeEvent) -> dict[str, Any]:
    """The event's fields; a schema without its columns' parse functions (each builder
    makes its own)."""
    out = {name: getattr(event, name) for name in _EVENT_FIELDS}
    if event.schema is not None:
        out["schema"] = msgspec.structs.replace(event.schema, columns=tuple(
            msgspec.structs.replace(c, parse=str) for c in event.schema.columns))
    return out


def _converted(records: list[ConvertedRecord]) -> list[tuple[str, Any, Any]]:
    return [(r.destination, r.key, r.value) for r in records]


def _assert_same_events(expected: list[Record], got: list[Record],
                        options: DebeziumJsonOptions) -> int:
    """Every rendered event equals the general path's event field by field (its row
    decoded on access) and carries that event's key and value texts; everything else is
    the same record. The engine's converter makes the same records of both. Returns
    the number of rendered events."""
    assert len(got) == len(expected)
    serializer = DebeziumJsonSerializer(options)
    rendered = 0
    for fused, general in zip(got, expected, strict=True):
        if type(fused) is RenderedEvent:
            rendered += 1
            assert isinstance(general, ChangeEvent)
            assert _fields(fused) == _fields(general)
            key, value = serializer.key_and_value(general)
            assert (fused.key_text or "null", fused.value_text) == (key, value)
        else:
            assert type(fused) is type(general)
            assert (_fields(fused) if isinstance(fused, ChangeEvent) else fused) == \
                (_fields(general) if isinstance(general, ChangeEvent) else general)
    # Fresh converters for both: the rendered texts are used, not re-serialized.
    assert _converted(DebeziumJsonConverter(options).convert(got)) == \
        _converted(DebeziumJsonConverter(options).convert(expected))
    return rendered


# -- a real stream ------------------------------------------------------------------------
STATEMENTS = [
    *(_row_sql(i) for i in range(ROWS)),
    "UPDATE types SET c_int4 = c_int4 - 1 WHERE id = 1",
    "UPDATE types SET id = 100 WHERE id = 2",  # a key change: delete + create
    "DELETE FROM types WHERE id = 3",
    "DELETE FROM types WHERE id = 4",  # the all-NULL row
    "INSERT INTO plain VALUES (1, 'ascii', 1.5), (2, E'caf\\u00e9 \"q\" \\\\ \\n', NULL)",
    "INSERT INTO plain VALUES (3, repeat('long ', 5000), 2.25)",
    "UPDATE plain SET price = 3.5 WHERE id = 3",  # the TOASTed text is not sent
    "DELETE FROM plain WHERE id = 1",
    "INSERT INTO full_row VALUES (1, 'a'), (2, 'b')",
    "UPDATE full_row SET v = 'c' WHERE id = 1",  # REPLICA IDENTITY FULL: an old row
    "DELETE FROM full_row WHERE id = 2",
    "INSERT INTO keyless VALUES (1, 'x')",
    "UPDATE keyless SET v = 'y'",
    "DELETE FROM keyless",
    # One transaction over two tables: total and per-table orders differ.
    "WITH a AS (INSERT INTO plain VALUES (6, 'two tables', 2) RETURNING id), "
    "b AS (INSERT INTO full_row SELECT id, 'with plain' FROM a RETURNING id) "
    "INSERT INTO plain SELECT id + 1, 'and again', 3 FROM b",
    "ALTER TABLE plain ADD COLUMN extra text DEFAULT 'new'",
    "INSERT INTO plain VALUES (4, 'after DDL', 0.5)",
    "UPDATE plain SET extra = 'ümlaut' WHERE id = 4",
    "DELETE FROM plain WHERE id = 4",
    "TRUNCATE plain",
    "SELECT pg_logical_emit_message(true, 'prefix', 'content')",
    "INSERT INTO plain VALUES (5, 'after truncate', 1)",
]


@pytest.fixture(scope="module")
def stream(pg_cluster: Any) -> Iterator[tuple[Messages, BuilderFactory]]:
    """The pgoutput messages of STATEMENTS and a factory of change builders for them."""
    name = "json_lines"
    pg_cluster.create_database(name)
    try:
        db = Database(pg_cluster, name)
        db.execute(
            "CREATE TYPE mood AS ENUM ('happy', 'sad', 'ok')",
            "CREATE TABLE types (id int PRIMARY KEY, "
            + ", ".join(f"{c.name} {c.sql_type}" for c in COLUMNS) + ")",
            "CREATE TABLE plain (id int PRIMARY KEY, label text NOT NULL, price numeric(8,2))",
            "ALTER TABLE plain ALTER COLUMN label SET STORAGE EXTERNAL",
            "CREATE TABLE full_row (id int PRIMARY KEY, v text)",
            "ALTER TABLE full_row REPLICA IDENTITY FULL",
            "CREATE TABLE keyless (n int, v text)",
            "ALTER TABLE keyless REPLICA IDENTITY FULL",
        )
        tables = ["public.types", "public.plain", "public.full_row", "public.keyless"]
        # The connector creates publication and slot (on its first poll); its stream is
        # not used.
        connector = make_connector(db.dsn, *tables, snapshot_mode="no_data",
                                   slot_name="json_lines", publication_name="json_lines")
        connector.start()
        try:
            connector.poll()
        finally:
            connector.stop()
        db.autocommit(*STATEMENTS)
        end = db.insert_lsn()
        messages: Messages = []
        reader = ReplicationStream(db.dsn, "json_lines", "json_lines")
        reader.start(0)
        try:
            while not messages or reader.wal_end < end:
                messages += reader.read_batch(10_000, 0.5)
                reader.request_keepalive()
            messages += reader.read_batch(10_000, 0.2)
        finally:
            reader.close()
        conn = postgres_connection.connect(db.dsn)
        ids = [TableId.parse(t) for t in tables]
        keys = catalog.primary_keys(conn, ids)
        not_null = {t: catalog.not_null_columns(conn, t) for t in ids}
        types: dict[int, tuple[str, int]] = {}

        def type_info(oid: int) -> tuple[str, int]:
            if oid not in types:
                types[oid] = catalog.type_info(conn, oid)
            return types[oid]

        def factory() -> ChangeEventBuilder:
            return ChangeEventBuilder(topic_prefix="bench", database=name,
                                      key_columns=keys.get, type_info=type_info,
                                      captured=frozenset(ids), not_null_columns=not_null.get)

        try:
            yield messages, factory
        finally:
            conn.close()
    finally:
        with contextlib.suppress(Exception):
            Database(pg_cluster, name).execute("SELECT pg_drop_replication_slot('json_lines')")
        pg_cluster.drop_database(name)


MODES = [
    pytest.param({}, id="defaults"),
    pytest.param({"tombstones_on_delete": False}, id="no-tombstones"),
    pytest.param({"decimal_handling_mode": DecimalHandlingMode.STRING}, id="decimal-string"),
    pytest.param({"decimal_handling_mode": DecimalHandlingMode.DOUBLE}, id="decimal-double"),
    pytest.param({"time_precision_mode": TimePrecisionMode.CONNECT}, id="time-connect"),
    pytest.param({"topic_prefix": 'odd "prefix"', "interval_handling_mode": "string"},
                 id="prefix-interval"),
]


@pytest.mark.integration
@pytest.mark.parametrize("batch", [1, 7, 100_000])
@pytest.mark.parametrize("mode", MODES)
def test_same_bytes_as_the_general_path(stream: tuple[Messages, BuilderFactory],
                                        mode: dict[str, Any], batch: int) -> None:
    messages, factory = stream
    expected, got, lines = _both(factory, messages, DebeziumJsonOptions(**mode), batch)
    assert b"after truncate" in expected  # the whole stream was read
    assert got.decode() == expected.decode()
    assert lines.fallbacks == 0  # every row the fast path took, it finished


@pytest.mark.integration
@pytest.mark.parametrize("batch", [1, 7, 100_000])
@pytest.mark.parametrize("mode", MODES)
def test_rendered_events_equal_the_general_path(stream: tuple[Messages, BuilderFactory],
                                                mode: dict[str, Any], batch: int) -> None:
    messages, factory = stream
    options = DebeziumJsonOptions(**mode)
    expected, got, fused = _rendered(factory, messages, options, batch)
    assert _assert_same_events(expected, got, options) > len(got) / 2
    assert fused.fallbacks == 0


@pytest.mark.integration
@pytest.mark.parametrize("batch", [1, 7, 100_000])
@pytest.mark.parametrize("mode", MODES)
def test_converted_records_equal_the_general_path(stream: tuple[Messages, BuilderFactory],
                                                  mode: dict[str, Any], batch: int) -> None:
    """The engine's converter gives the same records of a builder that makes them itself
    (RenderedRecord) as of the general path's events, whose events they make on access;
    a batch the builder made of such records only, it hands on as it is."""
    messages, factory = stream
    options = DebeziumJsonOptions(**mode)
    events = factory()
    fused = RenderedEventBuilder(factory(), DebeziumJsonSerializer(options),
                                 converted_records=True)
    converter = DebeziumJsonConverter(options)
    expected: list[Record] = []
    got: list[Any] = []
    by_batch: list[ConvertedRecord] = []
    whole = 0  # batches handed on without a pass
    for i in range(0, len(messages), batch):
        expected += events.process(messages[i:i + batch], NOW_US + i)
        made_now = fused.process(messages[i:i + batch], NOW_US + i)
        got += made_now
        if made_now and type(made_now) is ConvertedBatch:
            whole += 1
            assert converter.convert(made_now) is made_now
        by_batch += converter.convert(made_now)
    made = [r for r in got if type(r) is RenderedRecord]
    assert len(made) > len(got) / 2 and fused.fallbacks == 0
    lazy = [r for r in made if r.make_event is not None]
    assert all(_EVENT_SLOT.__get__(r) is None for r in lazy)  # not made until read
    deletes = [r for r in made if r.make_event is None]  # and their tombstones
    assert deletes and all(r.event.op is Op.DELETE for r in deletes)
    assert whole or batch >= len(messages)  # one batch, with what only the general path takes
    records = converter.convert(got)
    reference = DebeziumJsonConverter(options).convert(expected)
    assert _converted(records) == _converted(reference)
    assert _converted(by_batch) == _converted(reference)
    for record, general in zip(records, reference, strict=True):
        event, general_event = record.event, general.event
        if isinstance(general_event, ChangeEvent):
            assert isinstance(event, ChangeEvent)
            assert _fields(event) == _fields(general_event)
        else:
            assert event == general_event


_EVENT_SLOT: Any = ConvertedRecord.__dict__["event"]


def test_converted_record_pickles_as_the_record_it_stands_for() -> None:
    fused = RenderedEventBuilder(_factory(), DebeziumJsonSerializer(), converted_records=True)
    made = [r for r in fused.process(_transaction(encode_insert(Insert(
        None, 16400, ("7", "naïve", "2.50")))), NOW_US) if type(r) is RenderedRecord]
    assert len(made) == 1
    copy = pickle.loads(pickle.dumps(made[0]))
    assert type(copy) is ConvertedRecord
    assert (copy.destination, copy.key, copy.value) == \
        (made[0].destination, made[0].key, made[0].value)
    assert isinstance(copy.event, RenderedEvent) and copy.event.raw_after == ("7", "naïve", "2.50")


# -- synthetic messages ---------------------------------------------------------------------
ODD_NAME = "x}'\"; import os; os._exit(1) #{y"
RELATION = Relation(None, 16400, "public", "t'\"", "d", (
    RelationColumn("id", 23, -1, True),
    RelationColumn(ODD_NAME, 25, -1, False),
    RelationColumn("price", 1700, 655366, False),  # numeric(10,2)
))
TYPES = {23: ("integer", 23), 25: ("text", 25), 1700: ("numeric(10,2)", 1700)}


def _factory() -> ChangeEventBuilder:
    return ChangeEventBuilder(topic_prefix="p", database="d",
                              key_columns=lambda table: ("id",), type_info=TYPES.__getitem__,
                              not_null_columns=lambda table: frozenset({"id", ODD_NAME}))


def _transaction(*rows: bytes) -> Messages:
    head = [encode_begin(Begin(0x10000, NOW_US, 7)), encode_relation(RELATION)]
    tail = [encode_commit(Commit(0, 0x10000, 0x10100, NOW_US))]
    return [(data, 0x100 + i) for i, data in enumerate([*head, *rows, *tail])]


def _outcome(run: Callable[[], bytes]) -> bytes | tuple[type, str]:
    try:
        return run()
    except (DecodeError, ValueError, UnicodeDecodeError) as err:
        return type(err), str(err)


def _compare(messages: Messages) -> JsonLineBuilder:
    """Both fused builders against the general path; returns the line builder (whose
    fallbacks the rendered-event builder must match)."""
    options = DebeziumJsonOptions()
    fused = JsonLineBuilder(_factory(), DebeziumJsonSerializer(options))
    expected = _outcome(lambda: DebeziumJsonSerializer(options).encode_lines(
        _factory().process(messages, NOW_US)))
    got = _outcome(lambda: "".join(fused.process(messages, NOW_US)).encode())
    assert got == expected
    rendered = RenderedEventBuilder(_factory(), DebeziumJsonSerializer(options))
    events: list[Record] = []
    failure = None
    try:
        events = rendered.process(messages, NOW_US)
    except (DecodeError, ValueError, UnicodeDecodeError) as err:
        failure = type(err), str(err)
    if isinstance(expected, tuple):
        assert failure == expected
    else:
        assert failure is None
        _assert_same_events(_factory().process(messages, NOW_US), events, options)
    assert rendered.fallbacks == fused.fallbacks
    return fused


def test_names_are_data_not_code() -> None:
    insert = encode_insert(Insert(None, 16400, ("1", "a", "1.50")))
    fused = _compare(_transaction(insert))
    assert fused.fallbacks == 0


def test_nulls_unchanged_toast_and_non_ascii() -> None:
    rows = [
        encode_insert(Insert(None, 16400, ("1", None, None))),
        encode_insert(Insert(None, 16400, ("2", "naïve ☃ \"\\\n", "-0.05"))),
        encode_update(Update(None, 16400, None, None, ("2", UNAVAILABLE, "NaN"))),
        encode_delete(Delete(None, 16400, "K", ("2", None, None))),
    ]
    assert _compare(_transaction(*rows)).fallbacks == 0


def _mutations(data: bytes) -> Iterator[bytes]:
    yield data[:-1]  # truncated
    yield data + b"\x00"  # trailing byte
    yield data[:6] + b"\x00\x02" + data[8:]  # another column count
    yield data[:8] + b"b" + data[9:]  # a binary value
    yield data[:8] + b"?" + data[9:]  # an unknown kind
    yield data[:8] + b"t\xff\xff\xff\xff" + data[13:]  # a length past the end
    yield data.replace(b"abc", b"a\xffc")  # invalid UTF-8
    yield data.replace(b"1.25", b"1.2x")  # not a numeric


@pytest.mark.parametrize("kind", ["insert", "update", "delete"])
def test_malformed_rows_fail_or_succeed_as_the_general_path(kind: str) -> None:
    values = ("1", "abc", "1.25")
    data = {"insert": encode_insert(Insert(None, 16400, values)),
            "update": encode_update(Update(None, 16400, None, None, values)),
            "delete": encode_delete(Delete(None, 16400, "O", values))}[kind]
    for bad in _mutations(data):
        _compare(_transaction(bad))


def test_relation_message_replaces_the_generated_code() -> None:
    wider = Relation(None, 16400, "public", "t'\"", "d",
                     (*RELATION.columns, RelationColumn("note", 25, -1, False)))
    messages = _transaction(encode_insert(Insert(None, 16400, ("1", "a", "1.00"))))
    more: Sequence[bytes] = [
        encode_begin(Begin(0x20000, NOW_US, 8)), encode_relation(wider),
        encode_insert(Insert(None, 16400, ("2", "b", "2.00", "n"))),
        encode_commit(Commit(0, 0x20000, 0x20100, NOW_US)),
    ]
    messages += [(data, 0x1000 + i) for i, data in enumerate(more)]
    assert _compare(messages).fallbacks == 0


def test_memoized_conversions_across_ops_and_memo_resets() -> None:
    # More distinct values than a column memo holds, each converted by an insert and
    # then found again by an update and a delete of the same row.
    rows: list[bytes] = []
    for n in range(2500):
        values = (str(n), f"row {n}", f"{n % 1500}.{n % 100:02d}")
        rows += [encode_insert(Insert(None, 16400, values)),
                 encode_update(Update(None, 16400, None, None, values)),
                 encode_delete(Delete(None, 16400, "O", values))]
    assert _compare(_transaction(*rows)).fallbacks == 0


def test_rendered_row_is_decoded_on_access_and_survives_pickling() -> None:
    values = ("7", "naïve", "2.50")
    rows = [encode_insert(Insert(None, 16400, values)),
            encode_delete(Delete(None, 16400, "K", ("7", None, None)))]
    fused = RenderedEventBuilder(_factory(), DebeziumJsonSerializer())
    insert, delete = [r for r in fused.process(_transaction(*rows), NOW_US)
                      if isinstance(r, RenderedEvent)]
    assert insert.raw_after == values and insert.raw_before is None
    assert delete.raw_before == ("7", None, None) and delete.raw_after is None
    assert insert.after is not None and insert.after["id"] == 7
    assert insert.key == {"id": 7} and delete.key == {"id": 7}
    fresh = fused.process(_transaction(*rows), NOW_US)[0]
    assert isinstance(fresh, RenderedEvent)
    copy = pickle.loads(pickle.dumps(fresh))
    assert copy.raw_after == values and copy.key_text == fresh.key_text
    assert pickle.loads(pickle.dumps(PENDING)) is PENDING
