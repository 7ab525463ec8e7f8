"""Debezium JSON in (K4): decoding envelopes to change rows, and a round trip from a real
PostgreSQL through tidemark's Debezium JSON into a Delta table."""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
import pytest
from deltalake import DeltaTable

from capture_helpers import as_json, stream_changes
from conftest import Database
from delta_rows import live_table
from lake_helpers import read
from tidemark.errors import ConfigError
from tidemark.lake import ApplySpec, apply_changes, changes_from_debezium_json
from tidemark.lake.debezium_input import DebeziumInputError
from tidemark.serde.arrow_changes import ArrowChangeEncoder
from tidemark.testing.postgres import sql_connection

SCHEMA = pa.schema([
    pa.field("id", pa.int32()), pa.field("price", pa.decimal128(12, 2)),
    pa.field("born", pa.date32()), pa.field("seen", pa.timestamp("us", tz="UTC")),
    pa.field("at", pa.timestamp("us")), pa.field("note", pa.string()),
    pa.field("blob", pa.binary()), pa.field("tags", pa.list_(pa.string())),
    pa.field("ok", pa.bool_()), pa.field("ratio", pa.float64()),
])


def _envelope(op: str, before: Any, after: Any, lsn: int, **extra: Any) -> dict[str, Any]:
    return {"before": before, "after": after,
            "source": {"ts_ms": 1_700_000_000_123, "ts_us": 1_700_000_000_123_456,
                       "sequence": f'["400","{lsn}"]',
                       "txId": 77, "lsn": lsn, "schema": "public", "table": "t"},
            "transaction": extra.get("transaction"), "op": op, "ts_ms": 1}


def test_envelope_values_decode_to_the_schema_types() -> None:
    row = {"id": 1, "price": base64.b64encode((-12345).to_bytes(2, "big", signed=True)).decode(),
           "born": 19000, "seen": "2024-01-15T10:30:00.250000Z", "at": 1_700_000_000_000_001,
           "note": "__debezium_unavailable_value", "blob": "AAE=", "tags": ["a", None],
           "ok": True, "ratio": "NaN"}
    values = [json.dumps(_envelope("u", None, row, 500)), None, "null",
              json.dumps({"status": "BEGIN", "id": "1:2", "event_count": None}),
              json.dumps(_envelope("d", {"id": 1}, None, 501))]
    table = changes_from_debezium_json(values, SCHEMA)
    assert table.column_names[-7:] == ["_op", "_lsn", "_commit_lsn", "_seq", "_commit_ts",
                                       "_txid", "_unavailable"]
    first, second = table.to_pylist()
    assert first["price"] == decimal.Decimal("-123.45")
    assert first["born"] == dt.date(1970, 1, 1) + dt.timedelta(days=19000)
    assert first["seen"] == dt.datetime(2024, 1, 15, 10, 30, 0, 250000, tzinfo=dt.UTC)
    assert first["at"] == dt.datetime(2023, 11, 14, 22, 13, 20, 1)
    assert first["note"] is None and first["_unavailable"] == ["note"]
    assert first["blob"] == b"\x00\x01" and first["tags"] == ["a", None] and first["ok"] is True
    assert first["ratio"] != first["ratio"]  # NaN
    # Debezium's source.sequence: the previous commit's LSN (plus one: a read at it comes
    # first), then twice the change's LSN (plus one for anything but a delete) orders
    # within and across transactions.
    assert (first["_op"], first["_lsn"], first["_commit_lsn"], first["_seq"], first["_txid"]) \
        == ("u", 500, 401, 1001, 77)
    assert first["_commit_ts"] == dt.datetime(2023, 11, 14, 22, 13, 20, 123456, tzinfo=dt.UTC)
    assert (second["_op"], second["id"], second["price"], second["_seq"]) \
        == ("d", 1, None, 1002)


def test_schema_and_payload_form_uses_the_semantic_time_units() -> None:
    envelope_schema = {"type": "struct", "fields": [
        {"field": "before", "type": "struct", "fields": []},
        {"field": "after", "type": "struct", "fields": [
            {"field": "id", "type": "int32"},
            {"field": "at", "type": "int64", "name": "io.debezium.time.Timestamp"},
            {"field": "blob", "type": "bytes"}]}]}
    after = {"id": 3, "at": 1_700_000_000_123, "blob": "X19kZWJleml1bV91bmF2YWlsYWJsZV92YWx1ZQ=="}
    value = {"schema": envelope_schema, "payload": _envelope(
        "c", None, after, 900, transaction={"id": "5:950", "total_order": 4,
                                            "data_collection_order": 1, "commit_lsn": 950,
                                            "commit_ts_us": 42})}
    row = changes_from_debezium_json([msgspec.json.encode(value)], SCHEMA).to_pylist()[0]
    assert row["at"] == dt.datetime(2023, 11, 14, 22, 13, 20, 123000)
    assert row["_unavailable"] == ["blob"] and row["blob"] is None
    assert (row["_lsn"], row["_commit_lsn"], row["_seq"]) == (900, 950, 4)
    assert row["_commit_ts"] == dt.datetime(1970, 1, 1, 0, 0, 0, 42, tzinfo=dt.UTC)


def test_bad_events_are_named() -> None:
    with pytest.raises(DebeziumInputError, match="event 1 is not JSON"):
        changes_from_debezium_json(["null", "{nope"], SCHEMA)
    with pytest.raises(DebeziumInputError, match="event 0: column 'born'"):
        changes_from_debezium_json([json.dumps(_envelope("c", None, {"born": "x"}, 1))],
                                   SCHEMA)


def _normalise(value: Any) -> Any:
    if isinstance(value, memoryview):
        return bytes(value)
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.astimezone(dt.UTC)
    return value


@pytest.mark.integration
def test_round_trip_from_postgres_through_debezium_json(db: Database, tmp_path: Path) -> None:
    db.execute(
        "CREATE TABLE t (id int PRIMARY KEY, price numeric(12,2), born date, seen timestamptz,"
        " at timestamp, note text, blob bytea, tags text[], ok boolean, ratio float8)",
        "ALTER TABLE t ALTER COLUMN note SET STORAGE EXTERNAL")
    big = "(SELECT string_agg(md5(g::text), '') FROM generate_series(1, 400) g)"
    got = stream_changes(
        db, ["public.t"],
        f"INSERT INTO t VALUES (1, 12.5, '2024-02-29', '2024-01-15 10:30:00.123456+02',"
        f" '2020-01-01 00:00:01.5', {big}, '\\x0102', '{{a,NULL,\"b c\"}}', true, 1.5),"
        " (2, -0.01, '1969-12-31', now(), now(), 'small', NULL, NULL, false, 'NaN'),"
        " (3, 99, NULL, NULL, NULL, 'gone', NULL, NULL, NULL, NULL)",
        "UPDATE t SET price = 13.75, ok = false WHERE id = 1",  # note: unchanged TOAST
        "DELETE FROM t WHERE id = 3",
        "BEGIN; UPDATE t SET id = 20 WHERE id = 2; INSERT INTO t (id) VALUES (4); COMMIT",
        "UPDATE t SET tags = '{}' WHERE id = 20",
    )
    lines = as_json(got, transaction_metadata=True)
    assert any(line["value"] and line["value"]["after"] and
               line["value"]["after"].get("note") == "__debezium_unavailable_value"
               for line in lines)
    values = [None if line["value"] is None else msgspec.json.encode(line["value"])
              for line in lines]
    changes = changes_from_debezium_json(values, SCHEMA)
    path = tmp_path / "t"
    half = len(changes) // 2
    spec = ApplySpec(keys=("id",))
    apply_changes(path, changes.slice(0, half), spec, app_id="q", version=0)
    apply_changes(path, changes.slice(half), spec, app_id="q", version=1)
    names = SCHEMA.names
    expected = [{n: _normalise(v) for n, v in zip(names, row, strict=True)}
                for row in db.query(f"SELECT {', '.join(names)} FROM t ORDER BY id")]
    actual = read(path, *names)
    assert [r["id"] for r in actual] == [1, 4, 20]
    for want, have in zip(expected, actual, strict=True):
        for name in names:
            if name == "ratio" and want[name] != want[name]:
                assert have[name] != have[name]
            else:
                assert have[name] == want[name], (want["id"], name)


@pytest.mark.integration
def test_engine_arrow_change_rows_apply_to_the_source_table(db: Database, tmp_path: Path) -> None:
    """The engine's Arrow converter and apply_changes share the change-row contract."""
    db.execute("CREATE TABLE t (id int PRIMARY KEY, price numeric(12,2), note text)",
               "ALTER TABLE t ALTER COLUMN note SET STORAGE EXTERNAL")
    big = "(SELECT string_agg(md5(g::text), '') FROM generate_series(1, 400) g)"
    got = stream_changes(
        db, ["public.t"],
        f"INSERT INTO t VALUES (1, 1.5, {big}), (2, 2.5, 'b'), (3, 3.5, 'c')",
        "UPDATE t SET price = 9.99 WHERE id = 1",
        "BEGIN; DELETE FROM t WHERE id = 2; UPDATE t SET id = 30 WHERE id = 3; COMMIT")
    changes = pa.Table.from_batches([ArrowChangeEncoder().encode(got)])
    assert changes.column("_unavailable").to_pylist()[3] == ["note"]
    for scd in (1, 2):
        spec = ApplySpec(keys=("id",), stored_as_scd_type=scd)
        apply_changes(tmp_path / str(scd), changes, spec, app_id="q", version=0)
    expected = [dict(zip(("id", "price", "note"), r, strict=True))
                for r in db.query("SELECT id, price, note FROM t ORDER BY id")]
    assert read(tmp_path / "1", "id", "price", "note") == expected
    current = [r for r in read(tmp_path / "2", "id", "price", "note", "__END_AT")
               if r.pop("__END_AT") is None]
    assert current == expected


@pytest.mark.parametrize(("mode", "value", "expected"), [
    ("precise", "BNI=", "12.34"),      # base64 of the unscaled 1234
    ("precise", "1234", "-26588.24"),  # digits are valid base64: the mode decides
    ("string", "1234", "1234.00"),
    ("string", "-0.5", "-0.50"),
    ("double", 12.346, "12.35"),
])
def test_decimal_handling_modes(mode: str, value: object, expected: str) -> None:
    schema = pa.schema([pa.field("id", pa.int32()), pa.field("price", pa.decimal128(12, 2))])
    event = json.dumps(_envelope("c", None, {"id": 1, "price": value}, 1))
    row = changes_from_debezium_json([event], schema, decimal_handling_mode=mode).to_pylist()[0]
    assert row["price"] == decimal.Decimal(expected)


_WIDE_VALUE = 123456789012345678901234567890123  # 33 digits: more than Python's default 28


@pytest.mark.parametrize(("mode", "value"), [
    ("precise", base64.b64encode(_WIDE_VALUE.to_bytes(16, "big", signed=True)).decode()),
    ("string", "1234567890123456789012345678901.23"),
    ("precise", decimal.Decimal("1234567890123456789012345678901.23")),  # decoded Avro
])
def test_decimals_wider_than_python_s_default_precision_keep_every_digit(
        mode: str, value: object) -> None:
    schema = pa.schema([pa.field("id", pa.int32()), pa.field("d", pa.decimal128(38, 2))])
    event = _envelope("c", None, {"id": 1, "d": value}, 1)
    # A decoded Avro record carries a Decimal: handed on as a dict, not as JSON text.
    changes = [event if isinstance(value, decimal.Decimal) else json.dumps(event)]
    row = changes_from_debezium_json(changes, schema, decimal_handling_mode=mode).to_pylist()[0]
    assert row["d"] == decimal.Decimal("1234567890123456789012345678901.23")


def test_the_envelope_schema_says_which_decimals_are_text() -> None:
    schema = pa.schema([pa.field("id", pa.int32()), pa.field("price", pa.decimal128(12, 2)),
                        pa.field("cost", pa.decimal128(12, 2))])
    envelope_schema = {"type": "struct", "fields": [{"field": "after", "type": "struct",
                                                     "fields": [
        {"field": "id", "type": "int32"}, {"field": "price", "type": "string"},
        {"field": "cost", "type": "bytes", "name": "org.apache.kafka.connect.data.Decimal"}]}]}
    value = {"schema": envelope_schema,
             "payload": _envelope("c", None, {"id": 1, "price": "1234", "cost": "BNI="}, 1)}
    row = changes_from_debezium_json([json.dumps(value)], schema).to_pylist()[0]
    assert (row["price"], row["cost"]) == (decimal.Decimal("1234.00"), decimal.Decimal("12.34"))
    with pytest.raises(ConfigError, match="decimal_handling_mode"):
        changes_from_debezium_json([], schema, decimal_handling_mode="exact")


def _stream_interleaved(db: Database) -> list[dict[str, Any]]:
    """Debezium JSON values (no transaction metadata, as Debezium's own) of: T1 updates
    row 1; T2 inserts row 2 and commits first; T1 commits; then a COPY (one WAL record
    for many rows, so they share an LSN), a primary-key change and a delete."""
    import contextlib  # noqa: PLC0415

    from capture_helpers import drain, make_connector  # noqa: PLC0415

    db.execute("CREATE TABLE t (id int PRIMARY KEY, name text)",
               "INSERT INTO t VALUES (1, 'old')")
    connector = make_connector(db.dsn, "public.t", snapshot_mode="initial")
    connector.start()
    try:
        records = drain(connector, db.insert_lsn())
        with contextlib.closing(sql_connection(db.dsn)) as one, \
                contextlib.closing(sql_connection(db.dsn)) as two:
            with one.cursor() as cur:
                cur.execute("UPDATE t SET name = 'new' WHERE id = 1")
            with two.cursor() as cur:
                cur.execute("INSERT INTO t VALUES (2, 'two')")
            two.commit()
            one.commit()
        db.execute("COPY t FROM PROGRAM 'seq 3 12 | sed s/$/\\\\tcopied/'")
        db.execute("UPDATE t SET id = 30 WHERE id = 3", "DELETE FROM t WHERE id = 4")
        records += drain(connector, db.insert_lsn())
    finally:
        connector.stop()
    return [line["value"] for line in as_json(records) if line["value"] is not None]


@pytest.mark.integration
def test_transactions_committed_out_of_start_order_survive_any_batch_split(
        db: Database, tmp_path: Path) -> None:
    """Debezium's events carry no commit LSN: ordering by the change's own LSN put T1's
    update (begun first, committed last) below T2's insert, so when T1 landed in a later
    batch the high-water mark skipped it. Rows sharing an LSN (a COPY, a snapshot) must
    not be skipped when a batch boundary falls between them either."""
    values = _stream_interleaved(db)
    schema = pa.schema([pa.field("id", pa.int32()), pa.field("name", pa.string())])
    ops = [v["op"] for v in values]
    assert ops[:1] == ["r"] and ops[1:3] == ["c", "u"]  # T2 arrives first: commit order
    changes = changes_from_debezium_json([msgspec.json.encode(v) for v in values], schema)
    expected = [{"id": i, "name": n} for i, n in db.query("SELECT id, name FROM t ORDER BY id")]
    for scd in (1, 2):
        for cut in range(1, len(changes)):
            path = tmp_path / f"{scd}-{cut}"
            spec = ApplySpec(keys=("id",), stored_as_scd_type=scd)
            apply_changes(path, changes.slice(0, cut), spec, app_id="q", version=0)
            apply_changes(path, changes.slice(cut), spec, app_id="q", version=1)
            got = read(path, "id", "name", *(("__END_AT",) if scd == 2 else ()))
            current = [r for r in got if r.pop("__END_AT", None) is None]
            assert current == expected, (scd, cut, ops[cut - 1:cut + 1])


def test_events_without_a_commit_order_are_refused() -> None:
    event = _envelope("c", None, {"id": 1}, 500)
    del event["source"]["sequence"]
    with pytest.raises(DebeziumInputError, match=r"event 0 has no transaction.commit_lsn "
                                                 r"and no source.sequence"):
        changes_from_debezium_json([json.dumps(event)], SCHEMA)
    event["source"]["sequence"] = '["12", oops]'
    with pytest.raises(DebeziumInputError, match=r"event 0: source\.sequence"):
        changes_from_debezium_json([json.dumps(event)], SCHEMA)


@pytest.mark.integration
def test_a_restarted_capture_keeps_the_commit_order_growing(db: Database,
                                                            tmp_path: Path) -> None:
    """After a restart the first transaction's source.sequence must not start again at
    null (Debezium restores it from its offset): null sorts below everything applied."""
    from capture_helpers import drain, make_connector  # noqa: PLC0415

    db.execute("CREATE TABLE t (id int PRIMARY KEY, name text)")
    values: list[dict[str, Any]] = []
    offset = None
    for statement in ("INSERT INTO t VALUES (1, 'a')", "UPDATE t SET name = 'b' WHERE id = 1"):
        connector = make_connector(db.dsn, "public.t", snapshot_mode="no_data", slot_name="s")
        connector.start(offset)
        try:
            drain(connector, db.insert_lsn())
            db.execute(statement)
            until = db.insert_lsn()
            records = []
            while not records or offset is None or offset["lsn"] < until:
                batch = connector.poll()
                records += batch.records
                offset = batch.offset or offset
        finally:
            connector.stop()
        values += [line["value"] for line in as_json(records) if line["value"] is not None]
    first, second = (json.loads(v["source"]["sequence"])[0] for v in values)
    assert first is None or int(second) > int(first)
    assert second is not None
    schema = pa.schema([pa.field("id", pa.int32()), pa.field("name", pa.string())])
    changes = changes_from_debezium_json(values, schema)
    spec = ApplySpec(keys=("id",))
    apply_changes(tmp_path, changes.slice(0, 1), spec, app_id="q", version=0)
    apply_changes(tmp_path, changes.slice(1), spec, app_id="q", version=1)
    assert read(tmp_path, "id", "name") == [{"id": 1, "name": "b"}]


def test_an_initial_snapshot_s_reads_come_before_the_first_streamed_transaction(
        tmp_path: Path) -> None:
    """Debezium gives both a null last commit; the first streamed transaction may hold
    changes at LSNs below the snapshot's (it began before the slot's consistent point)."""
    schema = pa.schema([pa.field("id", pa.int32()), pa.field("name", pa.string())])
    read = _envelope("r", None, {"id": 1, "name": "snapshot"}, 2000)
    read["source"].update(sequence='[null,"2000"]', snapshot="last")
    update = _envelope("u", None, {"id": 1, "name": "streamed"}, 1800)
    update["source"]["sequence"] = '[null,"1800"]'
    changes = changes_from_debezium_json([json.dumps(read), json.dumps(update)], schema)
    apply_changes(tmp_path / "one", changes, ApplySpec(keys=("id",)), app_id="q", version=0)
    assert read_rows(tmp_path / "one") == [{"id": 1, "name": "streamed"}]
    apply_changes(tmp_path / "two", changes.slice(0, 1), ApplySpec(keys=("id",)),
                  app_id="q", version=0)
    apply_changes(tmp_path / "two", changes.slice(1), ApplySpec(keys=("id",)),
                  app_id="q", version=1)
    assert read_rows(tmp_path / "two") == [{"id": 1, "name": "streamed"}]


@pytest.mark.parametrize("streamed", ["u", "d"])
def test_scd2_applies_the_first_streamed_transaction_after_the_snapshot(
        tmp_path: Path, streamed: str) -> None:
    """The snapshot's reads and the first streamed transaction share Debezium's last
    commit; an SCD2 version starts at its change's _commit_lsn alone, so the transaction
    must sort after the reads there too, or it is taken for applied already."""
    schema = pa.schema([pa.field("id", pa.int32()), pa.field("name", pa.string())])
    read_event = _envelope("r", None, {"id": 1, "name": "snapshot"}, 2000)
    read_event["source"].update(sequence='["1500","2000"]', snapshot="last")
    after = {"id": 1, "name": "streamed"} if streamed == "u" else None
    change = _envelope(streamed, {"id": 1, "name": "snapshot"}, after, 2100)
    change["source"]["sequence"] = '["1500","2100"]'
    spec = ApplySpec(keys=("id",), stored_as_scd_type=2)
    for version, event in enumerate([read_event, change]):
        apply_changes(tmp_path / "scd2", changes_from_debezium_json([json.dumps(event)], schema),
                      spec, app_id="q", version=version)
    rows = sorted(live_table(DeltaTable(str(tmp_path / "scd2"))).to_pylist(),
                  key=lambda r: r["__START_AT"])
    current = [(r["name"]) for r in rows if r["__END_AT"] is None]
    assert current == (["streamed"] if streamed == "u" else [])
    assert rows[0]["name"] == "snapshot" and rows[0]["__END_AT"] is not None


def read_rows(path: Path) -> list[dict[str, Any]]:
    return read(path, "id", "name")
