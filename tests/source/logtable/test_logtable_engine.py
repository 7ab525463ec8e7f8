"""The embedded engine with the log-table connector: the groups split over two tasks,
offsets saved per group by the engine, and a restart that resumes from them."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from logtable_helpers import LogDb
from tidemark import (
    DebeziumJsonConverter,
    Engine,
    ExtractNewRecordState,
    LogTableConnector,
    SqliteOffsetStore,
)
from tidemark.engine.converters import EventConverter
from tidemark.event import ChangeEvent
from tidemark.serde.debezium_json import DebeziumJsonOptions
from tidemark.testing.sink import MemorySink
from waiting import wait_for


def _times(sink: MemorySink) -> list[Any]:
    return [r.value.lsn for r in sink.records if isinstance(r.value, ChangeEvent)]


def _run(logdb: LogDb, store: SqliteOffsetStore, sink: MemorySink
         ) -> tuple[Engine, threading.Thread]:
    connector = LogTableConnector({"dsn": logdb.dsn, "poll_interval_ms": 50})
    engine = Engine(connector, sink, config={"offset_flush_interval_ms": 0, "tasks_max": 2},
                    converter=EventConverter(), offset_store=store)
    thread = threading.Thread(target=engine.run, daemon=True)
    thread.start()
    return engine, thread


def test_two_tasks_read_every_change_once_and_resume_after_a_restart(
        logdb: LogDb, tmp_path: Path) -> None:
    logdb.execute("CREATE TABLE t (id integer PRIMARY KEY, v text)")
    logdb.install(["t"], streams=16, groups=4)
    logdb.execute(*(f"INSERT INTO t VALUES ({i}, 'a')" for i in range(300)))
    store, sink = SqliteOffsetStore(tmp_path / "offsets.db"), MemorySink()
    engine, thread = _run(logdb, store, sink)
    wait_for(lambda: len(_times(sink)) >= 300, 30, "the inserts")
    logdb.execute("UPDATE t SET v = 'b' WHERE id < 100")
    wait_for(lambda: len(_times(sink)) >= 400, 30, "the updates")
    engine.close()
    thread.join(timeout=30)
    assert sorted(_times(sink)) == sorted(set(_times(sink))) and len(_times(sink)) == 400
    # One offset per group, saved by the engine.
    for group in range(4):
        assert store.load(f"tidemark/logtable/group-{group}") is not None

    logdb.execute("DELETE FROM t WHERE id >= 250")
    again = MemorySink()
    engine, thread = _run(logdb, store, again)
    wait_for(lambda: len(_times(again)) >= 50, 30, "the deletes made while stopped")
    engine.close()
    thread.join(timeout=30)
    assert len(_times(again)) == 50
    assert {r.value.op.value for r in again.records} == {"d"}  # type: ignore[union-attr]


def test_extract_new_state_flattens_cells_leaving_unchanged_out(logdb: LogDb) -> None:
    """Cells in the envelope; ExtractNewRecordState delivers plain rows, an unchanged
    column left out (absent: unchanged; null: set to NULL), where Scylla's
    ScyllaExtractNewState writes null for both."""
    logdb.execute("CREATE TABLE t (id integer PRIMARY KEY, v text, n integer)")
    logdb.install(["t"], streams=4, groups=1)
    logdb.execute("INSERT INTO t VALUES (1, 'a', 5)")
    logdb.execute("UPDATE t SET v = NULL WHERE id = 1")
    connector = LogTableConnector({"dsn": logdb.dsn, "poll_interval_ms": 50})
    cells = DebeziumJsonOptions(cells=True, tombstones_on_delete=False)
    for transforms, expected in (
            ((), [{"id": 1, "v": {"value": "a"}, "n": {"value": 5}},
                  {"id": 1, "v": {"value": None}, "n": None}]),
            ((ExtractNewRecordState(),), [{"id": 1, "v": "a", "n": 5},
                                          {"id": 1, "v": None}])):
        sink = MemorySink()
        engine = Engine(connector, sink, config={"offset_flush_interval_ms": 0},
                        transforms=transforms, converter=DebeziumJsonConverter(cells))
        thread = threading.Thread(target=engine.run, daemon=True)
        thread.start()
        wait_for(lambda s=sink: len(s.records) >= 2, 30, "both changes")  # type: ignore[misc]
        engine.close()
        thread.join(timeout=30)
        values = [json.loads(r.value) for r in sink.records]  # type: ignore[arg-type]
        rows = [v["after"] for v in values] if not transforms else values
        assert rows == expected
