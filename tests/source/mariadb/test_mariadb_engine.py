"""The embedded engine with the MariaDB connector: snapshot then stream, and a restart
that resumes from the engine's saved offset (nothing lost, nothing from before it)."""

from __future__ import annotations

import threading

from conftest import MariaDatabase
from tidemark import Engine, MariaDbConnector, MemoryOffsetStore
from tidemark.engine.converters import EventConverter
from tidemark.event import ChangeEvent
from tidemark.testing.sink import MemorySink
from waiting import wait_for


def ids(sink: MemorySink) -> list[int]:
    return [int(r.value.after["id"]) for r in sink.records
            if isinstance(r.value, ChangeEvent) and r.value.after is not None]


def run_engine(mdb: MariaDatabase, store: MemoryOffsetStore, sink: MemorySink
               ) -> tuple[Engine, threading.Thread]:
    connector = MariaDbConnector({"dsn": mdb.dsn})
    engine = Engine(connector, sink, config={"offset_flush_interval_ms": 0},
                    converter=EventConverter(), offset_store=store)
    thread = threading.Thread(target=engine.run, daemon=True)
    thread.start()
    return engine, thread


def test_snapshot_stream_and_restart_from_the_saved_offset(mdb: MariaDatabase) -> None:
    mdb.execute("CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(10))",
                "INSERT INTO t VALUES " + ",".join(f"({i}, 'v')" for i in range(1, 301)))
    store, sink = MemoryOffsetStore(), MemorySink()
    engine, thread = run_engine(mdb, store, sink)
    wait_for(lambda: len(ids(sink)) >= 300, 30, "the snapshot")
    mdb.execute("INSERT INTO t VALUES " + ",".join(f"({i}, 'v')" for i in range(301, 401)))
    wait_for(lambda: len(ids(sink)) >= 400, 30, "the streamed inserts")
    engine.close()
    thread.join(timeout=30)
    assert sorted(ids(sink)) == list(range(1, 401))
    ops = [r.value.op.value for r in sink.records if isinstance(r.value, ChangeEvent)]
    assert ops == ["r"] * 300 + ["c"] * 100

    mdb.execute("INSERT INTO t VALUES " + ",".join(f"({i}, 'v')" for i in range(401, 451)))
    again = MemorySink()
    engine, thread = run_engine(mdb, store, again)
    wait_for(lambda: len(ids(again)) >= 50, 30, "the inserts made while stopped")
    mdb.execute("UPDATE t SET v = 'w' WHERE id = 1")
    wait_for(lambda: 1 in ids(again), 30, "the update after the restart")
    engine.close()
    thread.join(timeout=30)
    assert ids(again) == [*range(401, 451), 1]
