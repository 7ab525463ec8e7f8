"""The engine on the fused path: a PostgreSQL task renders Debezium JSON straight from
pgoutput (RenderedEvent) and the converter passes the texts through.

Every test runs the same stream twice — once as the engine chooses (fused when it can),
once with the fused path forced off by a transform that does not declare
``keeps_event`` — and requires the same records (destinations, keys, values, tombstones)
and a saved offset past the stream's end, while ``record.event`` stays a correct ChangeEvent
(also where the task made the record itself and the event is made on access).
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from conftest import Database
from tidemark.engine.converters import ConvertedRecord, DebeziumJsonConverter, RenderedRecord
from tidemark.engine.engine import Engine
from tidemark.engine.records import ChangeRecord
from tidemark.engine.transforms import Filter, MaskField, Route, Transform
from tidemark.event import ChangeEvent, Op
from tidemark.offsets.memory import MemoryOffsetStore
from tidemark.offsets.store import Offset
from tidemark.serde.debezium_json import DebeziumJsonOptions
from tidemark.serde.rendered import RenderedEvent
from tidemark.source.postgres.task import PostgresConnector
from tidemark.testing.sink import MemorySink

CHANGES = [
    "INSERT INTO t SELECT g, 'v' || g, g / 4.0 FROM generate_series(1, 300) g",
    "UPDATE t SET v = 'changed' WHERE id <= 50",
    "DELETE FROM t WHERE id > 280",
    "UPDATE t SET id = 1000 WHERE id = 100",  # a key change: delete + create
    "INSERT INTO t VALUES (2000, E'caf\\u00e9', NULL)",
    "INSERT INTO keyless VALUES (1, 'a'), (2, 'b')",
    "UPDATE keyless SET v = 'c' WHERE n = 1",  # REPLICA IDENTITY FULL: the general path
    "DELETE FROM keyless WHERE n = 2",
]


class Opaque:
    """An identity transform that does not declare keeps_event: turns the fused path off."""

    def __call__(self, record: ChangeRecord) -> ChangeRecord:
        return record


def _prepare(db: Database, *slots: str) -> int:
    """Tables, publication and one slot per run, then CHANGES; returns the end LSN."""
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text, n numeric(8,2))",
               "CREATE TABLE keyless (n int, v text)",
               "ALTER TABLE keyless REPLICA IDENTITY FULL",
               "CREATE PUBLICATION fused_pub FOR TABLE t, keyless")
    for slot in slots:
        db.execute(f"SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')")
    db.autocommit(*CHANGES)
    return db.insert_lsn()


def _run(db: Database, slot: str, end: int, transforms: list[Transform], *,
         mode: str = "batch", config: dict[str, Any] | None = None,
         converter: DebeziumJsonConverter | None = None,
         ) -> tuple[list[ConvertedRecord], Offset | None]:
    sink = MemorySink()
    store = MemoryOffsetStore()
    connector = PostgresConnector(
        {"dsn": db.dsn, "table_include_list": ["public.t", "public.keyless"],
         "slot_name": slot, "publication_name": "fused_pub", "snapshot_mode": "no_data",
         **(config or {})}, stop_at_lsn=end)
    Engine(connector, sink, transforms=transforms, converter=converter,
           config={"delivery_mode": mode, "worker_count": 2},
           offset_store=store).run()
    return sink.records, store.load(f"postgres/{db.name}/{slot}")


_PROCESSING_TIME = re.compile(r',"ts_ms":\d+,"ts_us":\d+,"ts_ns":\d+}$')


def _texts(records: list[ConvertedRecord]) -> list[tuple[str, Any, Any]]:
    """(destination, key, value) of each record; the value without its processing time
    (the top-level ``ts_*`` fields), which differs between two runs."""
    return [(r.destination, r.key,
             r.value if r.value is None else _PROCESSING_TIME.sub("}", r.value))
            for r in records]


def _by_key(records: list[ConvertedRecord]) -> dict[Any, list[Any]]:
    """Each (destination, key)'s values, in delivery order."""
    out: dict[Any, list[Any]] = {}
    for destination, key, value in _texts(records):
        out.setdefault((destination, key), []).append(value)
    return out


def _check_events(records: list[ConvertedRecord], reference: list[ConvertedRecord]) -> None:
    """record.event of the fused run equals the reference run's event, field by field."""
    for fused, general in zip(records, reference, strict=True):
        a, b = fused.event, general.event
        assert isinstance(a, ChangeEvent) and isinstance(b, ChangeEvent)
        assert (a.op, a.lsn, a.total_order, a.collection_order, a.commit_lsn, a.context) == \
            (b.op, b.lsn, b.total_order, b.collection_order, b.commit_lsn, b.context)
        assert (a.raw_before, a.raw_after, a.before, a.after, a.key) == \
            (b.raw_before, b.raw_after, b.before, b.after, b.key)
        assert a.source == b.source and a.transaction == b.transaction


def _check_saved(db: Database, end: int, *offsets: Offset | None) -> None:
    """Each run saved a completed offset at or past the stream's end.

    Not necessarily the same LSN in both runs: a run that finishes idle saves the server's
    position from its last keepalive, which moves with WAL anyone writes (a checkpoint's
    running-xacts record, say)."""
    for saved in offsets:
        assert saved is not None and saved["snapshot_completed"] is True
        assert end <= saved["lsn"] <= db.insert_lsn()


@pytest.mark.parametrize("mode", ["batch", "ordered", "async", "per_key"])
def test_fused_records_equal_the_general_path(mode: str, db: Database) -> None:
    end = _prepare(db, "fused", "general")
    got, offset = _run(db, "fused", end, [], mode=mode)
    expected, expected_offset = _run(db, "general", end, [Opaque()], mode=mode)
    assert any(type(r.event) is RenderedEvent for r in got), "the fused path was not taken"
    assert not any(type(r.event) is RenderedEvent for r in expected)
    # With no transforms the task makes the converter's records itself (a delete's and
    # its tombstone's too), except for per-key delivery (its routing reads every
    # event's key).
    made = [r for r in got if type(r) is RenderedRecord]
    assert bool(made) is (mode != "per_key")
    if made:
        assert any(r.value is None for r in made)  # tombstones
        assert any(r.value is not None and '"op":"d"' in r.value for r in made)
    if mode == "async":  # no order at all
        assert sorted(_texts(got), key=repr) == sorted(_texts(expected), key=repr)
    elif mode == "per_key":  # order per key only: compare each key's sequence
        assert _by_key(got) == _by_key(expected)
    else:
        assert _texts(got) == _texts(expected)
        _check_events(got, expected)
    _check_saved(db, end, offset, expected_offset)
    # Tombstones after deletes, per-table destinations.
    # (In per_key mode, workers deliver different keys concurrently: only each key's own
    # sequence is ordered. In async mode nothing is.)
    if mode == "per_key":
        sequences = [values for (_, key), values in _by_key(got).items() if key is not None]
    else:
        sequences = [[value for _, key, value in _texts(got) if key is not None]]
    deletes = [(values, i) for values in sequences for i, value in enumerate(values)
               if value is not None and '"op":"d"' in value]
    assert deletes  # (a keyless table's deletes have no tombstone: left out above)
    if mode != "async":
        assert all(values[i + 1] is None for values, i in deletes)
    assert {r.destination for r in got} == {f"tidemark.public.{t}" for t in ("t", "keyless")}


def test_event_keeping_transforms_keep_the_fused_path(db: Database) -> None:
    end = _prepare(db, "fused", "general")
    chain: list[Transform] = [Filter(ops=["c", "d"]), Route(r"tidemark\.public\.(.*)", "db.$1")]
    got, _ = _run(db, "fused", end, chain)
    expected, _ = _run(db, "general", end, [*chain, Opaque()])
    assert any(type(r.event) is RenderedEvent for r in got)
    assert not any(type(r) is RenderedRecord for r in got)  # transforms take events
    assert _texts(got) == _texts(expected)
    assert all(r.destination.startswith("db.") for r in got)
    assert all(isinstance(r.event, ChangeEvent) and r.event.op in (Op.CREATE, Op.DELETE)
               for r in got)


def test_event_replacing_transforms_turn_the_fused_path_off(db: Database) -> None:
    end = _prepare(db, "masked")
    got, _ = _run(db, "masked", end, [MaskField(["v"])])
    assert not any(type(r.event) is RenderedEvent for r in got)
    values = [r.value for r in got if r.value is not None and '"after":{' in r.value]
    assert values and all('"v":"****"' in v or '"v":null' in v for v in values)


def test_transaction_metadata_turns_the_fused_path_off(db: Database) -> None:
    end = _prepare(db, "meta", "general")
    converter = DebeziumJsonConverter(DebeziumJsonOptions(transaction_metadata=True))
    got, offset = _run(db, "meta", end, [], config={"provide_transaction_metadata": True},
                       converter=converter)
    expected, expected_offset = _run(
        db, "general", end, [Opaque()], config={"provide_transaction_metadata": True},
        converter=DebeziumJsonConverter(DebeziumJsonOptions(transaction_metadata=True)))
    assert not any(type(r.event) is RenderedEvent for r in got)
    assert _texts(got) == _texts(expected)
    _check_saved(db, end, offset, expected_offset)
    assert any(r.destination == "tidemark.transaction" for r in got)
    # The connector's metadata alone (converter without it) also keeps the task unfused.
    plain, _ = _run(db, "meta", end, [], config={"provide_transaction_metadata": True})
    assert not any(type(r.event) is RenderedEvent for r in plain)
