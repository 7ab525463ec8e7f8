"""The generated per-schema event writers must write what the general serializer writes.

``DebeziumJsonSerializer.key_and_value`` hands row events to code generated per table
schema (``compile_event_renderer``) and keeps the piece-by-piece code as
``general_key_and_value``. Here both write the same random event sequences — every op,
NULL, unchanged-TOAST and binary values, keyless tables, snapshot markers, contexts and
timestamps changing mid-stream, every serializer mode — and must agree to the byte. The
sequences go through one serializer each, so the writers' caches between events are
exercised too.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from tidemark.engine.converters import DebeziumJsonConverter
from tidemark.engine.records import ChangeRecord
from tidemark.event import (
    UNAVAILABLE,
    ChangeEvent,
    Column,
    Op,
    SnapshotMarker,
    SourceContext,
    TableId,
    TableSchema,
)
from tidemark.serde.debezium_json import DebeziumJsonOptions, DebeziumJsonSerializer
from tidemark.source.postgres import types as pgt
from tidemark.source.postgres.config import DecimalHandlingMode, TimePrecisionMode

# (type oid, type modifier, wire texts of that type)
_TYPES: list[tuple[int, int, list[str]]] = [
    (pgt.INT8_OID, -1, ["0", "-9223372036854775808", "42"]),
    (pgt.INT4_OID, -1, ["7", "-1"]),
    (pgt.TEXT_OID, -1, ["", "plain", 'quo"te\\ and\nnewline', "héllo ☃", "\x01"]),
    (pgt.BOOL_OID, -1, ["t", "f"]),
    (pgt.FLOAT8_OID, -1, ["1.5", "NaN", "-Infinity", "1e+300"]),
    (pgt.NUMERIC_OID, (10 << 16 | 2) + 4, ["12.34", "-0.01", "NaN", "99999999.99"]),
    (pgt.NUMERIC_OID, -1, ["1.2300", "-5", "NaN"]),
    (pgt.DATE_OID, -1, ["2024-02-29", "infinity", "1970-01-01"]),
    (pgt.TIMESTAMPTZ_OID, -1, ["2024-01-02 03:04:05.123456+00", "2024-01-02 03:04:05+00"]),
    (pgt.TIMESTAMP_OID, 3, ["2024-01-02 03:04:05.123"]),
    (pgt.BYTEA_OID, -1, ["\\x00ff10"]),
    (pgt.JSONB_OID, -1, ['{"a": [1, 2]}']),
    (pgt.INT4_ARRAY_OID, -1, ["{1,2,NULL}", "{}"]),
    (pgt.UUID_OID, -1, ["a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"]),
]
_NAMES = ["id", "name", 'we"ird', "ünï", "x y"]


@st.composite
def _schemas(draw: st.DrawFn) -> tuple[TableSchema, list[list[str]]]:
    """A schema of 0-6 columns and the wire texts each column may hold."""
    picks = draw(st.lists(st.sampled_from(range(len(_TYPES))), max_size=6))
    columns = []
    texts = []
    for n, pick in enumerate(picks):
        oid, typmod, values = _TYPES[pick]
        name = f"{draw(st.sampled_from(_NAMES))}{n}"
        columns.append(Column(name, oid, typmod, "", False, str,
                              nullable=draw(st.booleans())))
        texts.append(values)
    keys = draw(st.lists(st.sampled_from(range(len(columns))), unique=True, max_size=2)
                ) if columns else []
    table = TableId(draw(st.sampled_from(["public", 'odd"schema'])),
                    draw(st.sampled_from(["t", "tä ble"])))
    return TableSchema(table, tuple(columns), tuple(sorted(keys)), "default"), texts


def _row(draw: st.DrawFn, texts: list[list[str]]) -> tuple[Any, ...]:
    return tuple(draw(st.one_of(st.sampled_from(values), st.none(), st.just(UNAVAILABLE),
                                st.just(b"\x00raw")))
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
                      tx_id, commit, origin)
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


@given(_streams())
def test_generated_writers_equal_the_general_serializer(
        stream: tuple[DebeziumJsonOptions, list[ChangeEvent]]) -> None:
    options, events = stream
    generated, general = DebeziumJsonSerializer(options), DebeziumJsonSerializer(options)
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
