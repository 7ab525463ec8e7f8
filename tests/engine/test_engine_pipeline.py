"""Transforms and converters: filter, route, ExtractNewRecordState, mask, hash; Debezium
JSON and Avro output (Avro decoded back with its own schemas and compared to JSON)."""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import io
from decimal import Decimal
from typing import Any

import fastavro
import msgspec
import pyarrow as pa
import pytest

from capture_helpers import stream_changes
from conftest import Database
from tidemark.engine.arrow_converter import ArrowConverter
from tidemark.engine.avro_converter import AvroConverter
from tidemark.engine.converters import DebeziumJsonConverter
from tidemark.engine.records import ChangeRecord
from tidemark.engine.transforms import (
    ExtractNewRecordState,
    Filter,
    HashField,
    MaskField,
    Route,
    apply_transforms,
)
from tidemark.errors import ConfigError
from tidemark.event import ChangeEvent
from tidemark.serde.avro import avro_schemas
from tidemark.serde.debezium_json import DebeziumJsonOptions


@pytest.fixture
def changes(db: Database) -> list[ChangeEvent]:
    db.execute("CREATE TABLE public.people (id int PRIMARY KEY, email text, "
               "balance numeric(10,2), born date, seen timestamptz, tags text[], "
               "\"Odd Name\" int)",
               "CREATE TABLE public.audit (id int PRIMARY KEY, note text)")
    return stream_changes(
        db, ["public.people", "public.audit"],
        "INSERT INTO people VALUES (1, 'a@x.org', 12.50, '1990-05-01', "
        "'2024-01-02 03:04:05.123456+00', '{red,blue}', 7)",
        "INSERT INTO audit VALUES (1, 'n')",
        "UPDATE people SET email = 'b@x.org' WHERE id = 1",
        "DELETE FROM people WHERE id = 1")


def run(transforms: list[Any], changes: list[ChangeEvent]) -> list[ChangeRecord]:
    return apply_transforms(transforms, [ChangeRecord.of(e) for e in changes])


def test_filter_by_op_table_and_predicate(changes: list[ChangeEvent]) -> None:
    kept = run([Filter(ops=["c", "u"], tables=[r"public\.people"])], changes)
    assert [r.event.op.value for r in kept] == ["c", "u"]  # type: ignore[union-attr]
    kept = run([Filter(lambda e: e.table.table == "audit")], changes)
    assert len(kept) == 1
    with pytest.raises(ConfigError, match="'x' is not an operation code"):
        Filter(ops=["x"])


def test_route_renames_destinations(changes: list[ChangeEvent]) -> None:
    routed = run([Route(r"tidemark\.public\.(.*)", "cdc.$1")], changes)
    assert {r.destination for r in routed} == {"cdc.people", "cdc.audit"}


def test_extract_new_record_state_in_json(changes: list[ChangeEvent]) -> None:
    records = run([ExtractNewRecordState("rewrite", add_fields=["op", "table", "lsn"])],
                  changes)
    out = DebeziumJsonConverter().convert(records)
    values = [msgspec.json.decode(r.value) for r in out if r.value is not None]
    first = values[0]
    assert first["id"] == 1 and first["email"] == "a@x.org"
    assert first["__op"] == "c" and first["__table"] == "people" and first["__deleted"] == "false"
    assert isinstance(first["__lsn"], int)
    assert values[-1]["__deleted"] == "true" and values[-1]["id"] == 1
    dropped = run([ExtractNewRecordState()], changes)
    assert all(r.event.op.value != "d" for r in dropped)  # type: ignore[union-attr]
    with pytest.raises(ConfigError, match="add_fields"):
        ExtractNewRecordState(add_fields=["nope"])


def test_mask_and_hash_change_every_converter_output(changes: list[ChangeEvent]) -> None:
    masked = run([MaskField(["email"], tables=[r"public\.people"])], changes)
    values = [msgspec.json.decode(r.value) for r in DebeziumJsonConverter().convert(masked)
              if r.value is not None]
    assert values[0]["after"]["email"] == "****"
    assert values[2]["after"]["email"] == "****"
    assert values[3]["before"]["email"] is None  # nulls stay null
    hashed = run([HashField(["email", "balance"], salt="s")], changes)
    value = msgspec.json.decode(DebeziumJsonConverter().convert(hashed)[0].value)
    assert value["after"]["email"] == hashlib.sha256(b"sa@x.org").hexdigest()
    assert value["after"]["balance"] == hashlib.sha256(b"s12.50").hexdigest()
    with pytest.raises(ConfigError, match="algorithm"):
        HashField(["email"], algorithm="crc")


def test_json_converter_matches_the_serializer_and_adds_tombstones(
        changes: list[ChangeEvent]) -> None:
    out = DebeziumJsonConverter().convert(changes)
    assert [r.value is None for r in out] == [False, False, False, False, True]
    assert out[0].destination == "tidemark.public.people"
    assert msgspec.json.decode(out[0].key) == {"id": 1}
    no_tombstones = DebeziumJsonConverter(DebeziumJsonOptions(tombstones_on_delete=False))
    assert len(no_tombstones.convert(changes)) == 4


def test_avro_decodes_to_the_same_content_as_json(changes: list[ChangeEvent]) -> None:
    options = DebeziumJsonOptions()
    avro = AvroConverter(options).convert(changes)
    json_out = DebeziumJsonConverter(options).convert(changes)
    assert len(avro) == len(json_out)
    for a, j in zip(avro, json_out, strict=True):
        event = a.event
        assert isinstance(event, ChangeEvent) and event.schema is not None
        key_schema, value_schema = avro_schemas(event.schema, options, event.context.block)
        key = fastavro.schemaless_reader(io.BytesIO(a.key), key_schema)
        assert key == msgspec.json.decode(j.key)
        if a.value is None:
            assert j.value is None
            continue
        value = fastavro.schemaless_reader(io.BytesIO(a.value), value_schema)
        expected = msgspec.json.decode(j.value)
        assert value["op"] == expected["op"]
        assert value["source"]["lsn"] == expected["source"]["lsn"]
        for side in ("before", "after"):
            if expected[side] is None:
                assert value[side] is None
                continue
            row = value[side]
            want = expected[side]
            if event.table.table == "people":
                # decimal: base64 unscaled bytes in JSON, a Decimal in Avro
                if want["balance"] is None:
                    assert row["balance"] is None
                else:
                    assert row["balance"].scaleb(2) == int.from_bytes(
                        base64.b64decode(want["balance"]), "big", signed=True)
                assert row["Odd_Name"] == want["Odd Name"]  # adjusted like Debezium's
                for name in ("id", "email", "born", "seen", "tags"):
                    assert row[name] == want[name], name
            else:
                assert row == want


def test_arrow_change_rows_have_table_types_and_metadata(db: Database) -> None:
    db.execute("CREATE TABLE t (id bigint PRIMARY KEY, n numeric(8,3), f float8, b bool, "
               "d date, ts timestamptz, u uuid, j jsonb, arr int[], big text)",
               "ALTER TABLE t ALTER COLUMN big SET STORAGE EXTERNAL")
    events = stream_changes(
        db, ["public.t"],
        "INSERT INTO t VALUES (1, 1.5, 2.5, true, '2024-02-29', '2024-01-01 00:00:01+00', "
        "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{\"k\": 1}', '{1,2}', repeat('x', 9000))",
        "UPDATE t SET b = false WHERE id = 1",
        "DELETE FROM t WHERE id = 1")
    out = ArrowConverter().convert(events)
    assert len(out) == 1 and out[0].destination == "tidemark.public.t"
    batch = out[0].value
    assert batch.schema.field("n").type == pa.decimal128(8, 3)
    assert batch.schema.field("ts").type == pa.timestamp("us", tz="UTC")
    rows = batch.to_pylist()
    assert [r["_op"] for r in rows] == ["c", "u", "d"]
    first = rows[0]
    assert first["n"] == Decimal("1.500") and first["d"] == dt.date(2024, 2, 29)
    assert first["u"] == "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11" and first["arr"] == [1, 2]
    assert first["_seq"] == 1 and first["_commit_lsn"] >= first["_lsn"]
    # The update did not touch the TOASTed text: null, and named as unavailable.
    assert rows[1]["big"] is None and rows[1]["_unavailable"] == ["big"]
    assert rows[2]["id"] == 1 and rows[2]["_unavailable"] == []
