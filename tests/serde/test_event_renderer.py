"""The per-schema event writers must write what the general serializer writes.

``DebeziumJsonSerializer.key_and_value`` hands row events to a writer made per table
schema (``compile_event_renderer``): the C one (``tidemark.serde._render``) where it is
built, else generated Python code. The piece-by-piece code stays as
``general_key_and_value``. Here all three write the same random event sequences — every
op, NULL, unchanged-TOAST and binary values, arbitrary text, keyless tables, snapshot
markers, contexts and timestamps changing mid-stream, every serializer mode — and must
agree to the byte. The sequences go through one serializer each, so the writers' caches
between events are exercised too.
"""

from __future__ import annotations

import datetime as dt
import gc
import sys
import threading
import tracemalloc
import weakref
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemark.engine.converters import DebeziumJsonConverter
from tidemark.engine.records import ChangeRecord
from tidemark.event import (
    UNAVAILABLE,
    ChangeEvent,
    Op,
    SnapshotMarker,
    SourceContext,
    TableId,
    TableSchema,
)
from tidemark.serde import debezium_json
from tidemark.serde.debezium_json import DebeziumJsonOptions, DebeziumJsonSerializer
from tidemark.serde.modes import DecimalHandlingMode, TimePrecisionMode
from tidemark.serde.source_json import position_parts
from tidemark.source.postgres import types as pgt
from tidemark.source.postgres.source_block import POSTGRES_BLOCK

# (type oid, type modifier, wire texts of that type)
_TYPES: list[tuple[int, int, list[str]]] = [
    (pgt.INT8_OID, -1, ["0", "-9223372036854775808", "42"]),
    (pgt.INT4_OID, -1, ["7", "-1"]),
    (pgt.TEXT_OID, -1, ["", "plain", 'quo"te\\ and\nnewline', "héllo ☃", "\x01"]),
    (pgt.BOOL_OID, -1, ["t", "f"]),
    (pgt.FLOAT8_OID, -1, ["1.5", "NaN", "-Infinity", "1e+300"]),
    (pgt.NUMERIC_OID, (10 << 16 | 2) + 4, ["12.34", "-0.01", "NaN", "99999999.99", "0.00",
                                           "-0.00", "-1.28", "-1.29", "1.27", "1.28",
                                           "-327.68", "-327.69", "327.67", "327.68"]),
    # 38 digits and more: the largest the compiled writer holds, then its fallback.
    (pgt.NUMERIC_OID, (60 << 16 | 3) + 4, [
        "99999999999999999999999999999999999.999", "-99999999999999999999999999999999999.999",
        "170141183460469231731687303715884105.727",
        "-170141183460469231731687303715884105.728",
        "999999999999999999999999999999999999.999", "-1.500", "12.000", "NaN", "Infinity"]),
    (pgt.NUMERIC_OID, -1, ["1.2300", "-5", "NaN"]),
    (pgt.DATE_OID, -1, ["2024-02-29", "infinity", "1970-01-01", "1969-12-31", "0001-01-01",
                        "0044-03-15 BC", "9999-12-31", "10000-01-01", "2000-03-01"]),
    (pgt.TIMESTAMPTZ_OID, -1, ["2024-01-02 03:04:05.123456+00", "2024-01-02 03:04:05+00",
                               "2024-01-02 03:04:05.5+00", "infinity"]),
    (pgt.TIMESTAMPTZ_OID, 0, ["2024-01-02 03:04:05+00", "1999-12-31 23:59:59+00"]),
    (pgt.TIMESTAMPTZ_OID, 3, ["2024-01-02 03:04:05+00", "2024-01-02 03:04:05.12+00"]),
    (pgt.TIMESTAMP_OID, 3, ["2024-01-02 03:04:05.123"]),
    (pgt.BYTEA_OID, -1, ["\\x00ff10"]),
    (pgt.JSONB_OID, -1, ['{"a": [1, 2]}']),
    (pgt.INT4_ARRAY_OID, -1, ["{1,2,NULL}", "{}"]),
    (pgt.UUID_OID, -1, ["a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"]),
]
_NAMES = ["id", "name", 'we"ird', "ünï", "x y"]
# Types whose text goes into the JSON as a string as it is: any text at all, too.
_ANY_TEXT = {pgt.TEXT_OID, pgt.JSONB_OID, pgt.UUID_OID}
# Text made of what JSON escapes and of characters of every width.
_TRICKY_TEXT = st.text(st.sampled_from('a"\\\x00\n\x1f\x7f\xe9\u0100\U0001f600'), max_size=8)


@st.composite
def _schemas(draw: st.DrawFn) -> tuple[TableSchema, list[st.SearchStrategy[str]]]:
    """A schema of 0-6 columns and the wire texts each column may hold."""
    picks = draw(st.lists(st.sampled_from(range(len(_TYPES))), max_size=6))
    columns = []
    texts = []
    for n, pick in enumerate(picks):
        oid, typmod, values = _TYPES[pick]
        name = f"{draw(st.sampled_from(_NAMES))}{n}"
        columns.append(pgt.pg_column(name, oid, typmod,
                                     nullable=draw(st.booleans())))
        texts.append(st.one_of(st.sampled_from(values), _TRICKY_TEXT, st.text(max_size=8))
                     if oid in _ANY_TEXT else st.sampled_from(values))
    keys = draw(st.lists(st.sampled_from(range(len(columns))), unique=True, max_size=2)
                ) if columns else []
    table = TableId(draw(st.sampled_from(["public", 'odd"schema'])),
                    draw(st.sampled_from(["t", "tä ble"])))
    return TableSchema(table, tuple(columns), tuple(sorted(keys)), "default"), texts


def _row(draw: st.DrawFn, texts: list[st.SearchStrategy[str]]) -> tuple[Any, ...]:
    return tuple(draw(st.one_of(values, st.none(), st.just(UNAVAILABLE), st.just(b"\x00raw")))
                 for values in texts)


@st.composite
def _streams(draw: st.DrawFn) -> tuple[DebeziumJsonOptions, list[ChangeEvent]]:
    options = DebeziumJsonOptions(
        topic_prefix=draw(st.sampled_from(["tidemark", "p"])),
        decimal_handling_mode=draw(st.sampled_from(list(DecimalHandlingMode))),
        time_precision_mode=draw(st.sampled_from(list(TimePrecisionMode))),
        transaction_metadata=draw(st.booleans()),
    )
    schemas = [draw(_schemas()) for _ in range(draw(st.integers(1, 2)))]
    contexts = [
        SourceContext("postgresql", "srv", "db", 1_700_000_000_000_000 + i, txid, last,
                      tx_id, commit, origin, block=POSTGRES_BLOCK)
        for i, (txid, last, tx_id, commit, origin) in enumerate([
            (None, None, None, None, None),
            (501, 4096, "501:8192", 8192, None),
            (502, 8192, "502:9000", 9000, "origin-a"),
        ])
    ]
    events = []
    for n in range(draw(st.integers(1, 12))):
        schema, texts = draw(st.sampled_from(schemas))
        op = draw(st.sampled_from([Op.CREATE, Op.UPDATE, Op.DELETE, Op.READ, Op.TRUNCATE]))
        before = None if op in (Op.CREATE, Op.READ, Op.TRUNCATE) or draw(st.booleans()) \
            else _row(draw, texts)
        after = None if op in (Op.DELETE, Op.TRUNCATE) else _row(draw, texts)
        events.append(ChangeEvent(
            op, schema, before, after, draw(st.sampled_from(contexts)),
            draw(st.one_of(st.none(), st.integers(0, 2**40))), n + 1, n + 1,
            draw(st.sampled_from([1_700_000_000_000_001, 1_700_000_000_000_002])),
            draw(st.sampled_from(list(SnapshotMarker)))))
    return options, events


def test_the_compiled_writer_is_built() -> None:
    """The C writer is part of the install (``setup.py``); where it failed to build,
    tidemark still works, in Python, but the tests must say so."""
    assert debezium_json.COMPILED_RENDERER, (
        "tidemark.serde._render is not built: a C compiler and Python's headers are "
        "needed at install (uv sync); without them row events are written in Python")
    assert type(DebeziumJsonSerializer().renderer(_schema())).__name__ == "EventRenderer"


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "python"])
@given(stream=_streams())
def test_generated_writers_equal_the_general_serializer(
        compiled: bool, stream: tuple[DebeziumJsonOptions, list[ChangeEvent]]) -> None:
    options, events = stream
    generated = DebeziumJsonSerializer(options, compiled=compiled)
    general = DebeziumJsonSerializer(options)
    for event in events:
        try:
            expected: Any = general.general_key_and_value(event)
        except Exception as err:  # a value of a binary type the general code rejects
            expected = type(err)
        try:
            got: Any = generated.key_and_value(event)
        except Exception as err:
            got = type(err)
        assert got == expected, event


@given(_streams())
def test_converter_gives_the_general_texts(
        stream: tuple[DebeziumJsonOptions, list[ChangeEvent]]) -> None:
    """Through the engine's converter, plain and wrapped events alike."""
    options, events = stream
    general = DebeziumJsonSerializer(options)
    try:
        texts = [general.general_key_and_value(event) for event in events]
    except Exception:
        return  # covered by the test above
    converter = DebeziumJsonConverter(options)
    for records in (events, [ChangeRecord(e, "dest") for e in events]):
        converted = [r for r in converter.convert(records) if r.value is not None]
        assert [(r.key or "null", r.value) for r in converted] == texts


def _schema() -> TableSchema:
    columns = (pgt.pg_column("id", pgt.INT8_OID, -1, is_key=True, nullable=False),
               pgt.pg_column("name", pgt.TEXT_OID, -1, is_key=False),
               pgt.pg_column("price", pgt.NUMERIC_OID, (10 << 16 | 2) + 4, is_key=False))
    return TableSchema(TableId("public", "t"), columns, (0,), "default")


def _event(before: Any, after: Any, lsn: Any = 16, op: Op = Op.UPDATE) -> ChangeEvent:
    context = SourceContext("postgresql", "srv", "db", 1_700_000_000_000_000, 7, None,
                            None, None, None, block=POSTGRES_BLOCK)
    return ChangeEvent(op, _schema(), before, after, context, lsn, 1, 1,
                       1_700_000_000_000_001)


def _both(event: ChangeEvent) -> tuple[Any, Any]:
    """(compiled, Python) results: the texts, or the type of the error raised."""
    results = []
    for compiled in (True, False):
        try:
            results.append(DebeziumJsonSerializer(compiled=compiled).key_and_value(event))
        except Exception as err:
            results.append(type(err))
    return results[0], results[1]


@pytest.mark.parametrize("event", [
    # rows that are not tuples of the schema's width: unpacked like the Python code does
    _event(None, ["1", "a", "1.00"]),
    _event(None, ("1", "a")),
    _event(("1", "a", "2.00", "extra"), ("1", "a", "1.00")),
    # LSNs beyond 64 bits or negative, formatted by Python
    _event(None, ("1", "a", "1.00"), lsn=2**64 + 5),
    _event(None, ("1", "a", "1.00"), lsn=2**64 - 1),
    _event(None, ("1", "a", "1.00"), lsn=-3),
    _event(None, ("1", "a", "1.00"), lsn=True),
    # a value the column's converter rejects: the same error
    _event(None, ("1", "a", "12.3.4")),
    # non-ASCII of every width, escapes and surrogates in text
    _event(("1", "é\u0100\U0001f600", None), ("2", '\ud800"\x00\\', "0.50")),
    # the key of a delete comes from the before row; none for a truncate
    _event(("9", "b", "1.00"), None, op=Op.DELETE),
    _event(None, None, op=Op.TRUNCATE),
], ids=["list", "short", "long", "lsn-2**64+5", "lsn-2**64-1", "lsn-negative", "lsn-bool",
        "bad-numeric", "wide-text", "delete", "truncate"])
def test_compiled_writer_edge_cases(event: ChangeEvent) -> None:
    compiled, python = _both(event)
    assert compiled == python


def test_compiled_writer_keeps_no_references() -> None:
    """Every object the C writer makes or touches is released: no memory grows over many
    events with new values, and a row value's reference count is unchanged."""
    render = DebeziumJsonSerializer().renderer(_schema())
    value = "".join(["held", "text"])  # a new object, not an interned constant
    row = ("1", value, "2.50")
    before_count = sys.getrefcount(value)
    for _ in range(100):
        render(_event(None, row))
    assert sys.getrefcount(value) == before_count

    def batch(start: int) -> None:
        for n in range(start, start + 5_000):
            text = f"name {n}"
            render(_event((str(n), text, "1.00"), (str(n), text + '"', f"{n}.25"),
                          lsn=2**40 + n))

    batch(0)  # warm the caches (dates, small ints, the allocator's arenas)
    gc.collect()
    tracemalloc.start()
    try:
        batch(10_000)
        gc.collect()
        first, _ = tracemalloc.get_traced_memory()
        batch(20_000)
        gc.collect()
        second, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert second - first < 50_000, f"{second - first} bytes more after 5,000 more events"


def test_a_serializer_with_compiled_writers_is_collected() -> None:
    """The C writer refers back to its serializer (through the callables it is given),
    a cycle that only the garbage collector can free: it must see the writer's
    references."""
    serializer = DebeziumJsonSerializer()
    serializer.key_and_value(_event(None, ("1", "a", "1.00")))
    alive = weakref.ref(serializer)
    del serializer
    gc.collect()
    assert alive() is None


def test_compiled_writer_reads_any_object_with_the_event_fields() -> None:
    """Events are read from their slots when their type allows it (msgspec fields);
    other objects with the same attributes, alternating with events through one
    writer, give the same texts as the Python writer."""
    event = _event(("1", "a", "1.00"), ("1", "b", "2.00"))
    lookalike = SimpleNamespace(**{field: getattr(event, field)
                                   for field in ChangeEvent.__struct_fields__})
    lookalike.raw_after = ("2", "c", "3.00")
    compiled = DebeziumJsonSerializer().renderer(_schema())
    python = DebeziumJsonSerializer(compiled=False).renderer(_schema())
    for item in (event, lookalike, event, lookalike):
        assert compiled(item) == python(item)  # type: ignore[arg-type]


def test_one_compiled_writer_shared_by_threads_writes_every_event_right() -> None:
    """The C writer's own caches (source block, timestamp, op, where an event type's
    fields are) stay right when one writer is shared between threads: events of
    different contexts, timestamps and types, written at once by four threads that
    switch as often as the interpreter allows, each get their own texts.

    (A ``DebeziumJsonSerializer`` is one per stream, and the engine keeps one per
    thread; its Python caches that the writer calls are not for sharing, so this
    writer is given pure functions in their place.)
    """
    schema = _schema()
    contexts = [SourceContext("postgresql", "srv", f"db{i}", 1_700_000_000_000_000 + i,
                              i, None, None, None, None, block=POSTGRES_BLOCK)
                for i in range(3)]
    events: list[Any] = []
    for n in range(600):
        event = ChangeEvent(Op.UPDATE if n % 2 else Op.CREATE, schema, None,
                            (str(n), f"v{n}", b"\x01" if n % 5 == 0 else "1.00"),
                            contexts[n % 3], 1_000 + n, 1, 1, 1_700_000_000_000_000 + n % 7)
        events.append(event if n % 4 else SimpleNamespace(
            **{field: getattr(event, field) for field in ChangeEvent.__struct_fields__}))
    python = DebeziumJsonSerializer(compiled=False).renderer(schema)
    expected = [python(event) for event in events]
    shared = debezium_json.compiled_event_renderer(
        schema, DebeziumJsonOptions(),
        lambda context, snapshot: tuple(position_parts(
            POSTGRES_BLOCK, context, snapshot, schema.table)),
        lambda ts: f'"ts_ms":{ts // 1000},"ts_us":{ts},"ts_ns":{ts * 1000}}}',
        lambda event: "null", DebeziumJsonSerializer().general_key_and_value)
    wrong: list[int] = []
    raised: list[BaseException] = []

    def write(offset: int) -> None:
        try:
            for _ in range(5):
                for n in range(len(events)):
                    i = (n + offset) % len(events)
                    if shared(events[i]) != expected[i]:
                        wrong.append(i)
        except BaseException as error:  # a thread's error must fail the test, not warn
            raised.append(error)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=write, args=(k * 150,)) for k in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert raised == []
    assert wrong == []


@settings(max_examples=300)
@given(unscaled=st.one_of(st.integers(-(10**38) + 1, 10**38 - 1),
                          st.integers(-(2**127), 2**127 - 1), st.integers(-300, 300)),
       scale=st.integers(1, 12), days=st.integers(-719_162, 2_932_896),
       micros=st.integers(0, 86_400 * 10**6 - 1), width=st.integers(0, 6))
def test_compiled_numeric_date_and_timestamptz_equal_python(
        unscaled: int, scale: int, days: int, micros: int, width: int) -> None:
    """The values the C writer converts itself (numeric in precise mode, date,
    timestamptz), against the Python writer, over their whole range and at the edges
    of its 38 digits and of each byte length."""
    sign = "-" if unscaled < 0 else ""
    digits = str(abs(unscaled)).rjust(scale + 1, "0")
    numeric = f"{sign}{digits[:-scale]}.{digits[-scale:]}"
    day = dt.date(1970, 1, 1) + dt.timedelta(days=days)
    clock = (dt.datetime(2000, 1, 1) + dt.timedelta(microseconds=micros)).time()
    fraction = f".{clock.microsecond:06d}" if clock.microsecond else ""
    stamp = f"{day.isoformat()} {clock.strftime('%H:%M:%S')}{fraction}+00"
    columns = (pgt.pg_column("id", pgt.INT8_OID, -1, is_key=True, nullable=False),
               pgt.pg_column("n", pgt.NUMERIC_OID, (60 << 16 | scale) + 4, is_key=False),
               pgt.pg_column("d", pgt.DATE_OID, -1, is_key=False),
               pgt.pg_column("t", pgt.TIMESTAMPTZ_OID, width, is_key=False))
    schema = TableSchema(TableId("public", "t"), columns, (0,), "default")
    context = SourceContext("postgresql", "srv", "db", 1_700_000_000_000_000, 7, None,
                            None, None, None, block=POSTGRES_BLOCK)
    event = ChangeEvent(Op.CREATE, schema, None, ("1", numeric, day.isoformat(), stamp),
                        context, 16, 1, 1, 1_700_000_000_000_001)
    compiled = DebeziumJsonSerializer(compiled=True)
    assert type(compiled.renderer(schema)).__name__ == "EventRenderer"
    assert compiled.key_and_value(event) == \
        DebeziumJsonSerializer(compiled=False).key_and_value(event)
