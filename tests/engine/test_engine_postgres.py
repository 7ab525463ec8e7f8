"""The engine with the PostgreSQL connector: every delivery mode on a real database,
one task per database, and a stop while tasks start that leaves no slot active and no
connection open."""

from __future__ import annotations

import gc
import sys
import threading
import time

import pytest

from conftest import Database
from tidemark.engine.converters import ConvertedRecord, EventConverter
from tidemark.engine.engine import Engine
from tidemark.engine.state import State
from tidemark.event import ChangeEvent
from tidemark.offsets.memory import MemoryOffsetStore
from tidemark.source.postgres.task import PostgresConnector
from tidemark.testing.postgres import PostgresCluster, sql_connection
from tidemark.testing.sink import MemorySink
from waiting import wait_for


def waiting_in(thread: threading.Thread, module: str, function: str) -> bool:
    """Whether *thread* is inside *function* of *module* (a file name) right now."""
    # No garbage collection inside sys._current_frames(): CPython 3.11 may collect while
    # it holds the runtime's thread-list lock, and a finalizer that then waits for a
    # lock deadlocks the test process (seen in CI: MainThread stuck in gc_collect_main
    # under _PyThread_CurrentFrames).
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        frames = sys._current_frames()
    finally:
        if was_enabled:
            gc.enable()
    frame = frames.get(thread.ident or -1)
    while frame is not None:
        code = frame.f_code
        if code.co_name == function and code.co_filename.endswith(module):
            return True
        frame = frame.f_back
    return False


def ids(sink: MemorySink) -> list[int]:
    out = []
    for record in sink.records:
        event = record.value
        if isinstance(event, ChangeEvent) and event.after is not None:
            out.append(int(event.after["id"]))
    return out


@pytest.mark.parametrize("mode", ["batch", "ordered", "async", "per_key"])
def test_each_mode_delivers_snapshot_and_stream(mode: str, db: Database) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text)",
               "INSERT INTO t SELECT g, 'v' FROM generate_series(1, 500) g")
    sink = MemorySink()
    store = MemoryOffsetStore()
    connector = PostgresConnector({"dsn": db.dsn, "table_include_list": ["public.t"]})
    engine = Engine(connector, sink, config={"delivery_mode": mode, "worker_count": 4,
                                             "offset_flush_interval_ms": 0},
                    converter=EventConverter(), offset_store=store)
    thread = threading.Thread(target=engine.run, daemon=True)
    thread.start()
    wait_for(lambda: len(sink) >= 500, 30, "the snapshot")
    db.execute("INSERT INTO t SELECT g, 'v' FROM generate_series(501, 1500) g")
    wait_for(lambda: len(set(ids(sink))) >= 1500, 30, "the streamed inserts")
    engine.close()
    thread.join(10)
    assert engine.state is State.STOPPED and engine.error is None
    assert sorted(ids(sink)) == list(range(1, 1501))
    saved = store.load(f"postgres/{db.name}/tidemark")
    assert saved is not None and saved["snapshot_completed"]
    # The final status update is sent as the connection closes; the server applies it
    # on its own schedule.
    confirmed = db.settled_scalar("SELECT (confirmed_flush_lsn - '0/0')::bigint "
                                  "FROM pg_replication_slots WHERE slot_name = 'tidemark'",
                                  saved["lsn"])
    assert confirmed == saved["lsn"], "the slot was not confirmed up to the saved offset"


@pytest.mark.parametrize("key_by", ["table", "key"])
def test_per_key_delivery_by_table_runs_one_table_at_a_time_in_source_order(
        key_by: str, db: Database) -> None:
    """key_by = "table": a table's records reach the consumer one at a time and in source
    order, different tables at once; by key, one table's rows run at once too."""
    tables = ("a", "b", "c")
    db.execute(*[f"CREATE TABLE {t} (id int PRIMARY KEY)" for t in tables])
    lock = threading.Lock()
    running: dict[str, int] = dict.fromkeys(tables, 0)
    most_at_once = {"table": 0, "tables": 0}
    seen: dict[str, list[tuple[int, int]]] = {t: [] for t in tables}

    def consumer(record: ConvertedRecord) -> None:
        event = record.event
        assert isinstance(event, ChangeEvent) and event.after is not None
        table = event.schema.table.table
        with lock:
            running[table] += 1
            most_at_once["table"] = max(most_at_once["table"], running[table])
            most_at_once["tables"] = max(most_at_once["tables"],
                                         sum(1 for n in running.values() if n))
        time.sleep(0.0005)  # long enough for the other workers to overlap it
        with lock:
            running[table] -= 1
            seen[table].append((event.lsn or 0, int(event.after["id"])))

    connector = PostgresConnector({"dsn": db.dsn, "snapshot_mode": "no_data",
                                         "table_include_list": [f"public.{t}" for t in tables]})
    engine = Engine(connector, consumer, converter=EventConverter(),
                    config={"delivery_mode": "per_key", "key_by": key_by, "worker_count": 4})
    thread = threading.Thread(target=engine.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: db.scalar("SELECT count(*) FROM pg_replication_slots "
                                   "WHERE slot_name = 'tidemark' AND active"), 30,
                 "the stream to start")
        # One transaction whose changes alternate between the tables, so that every
        # batch holds all three.
        db.execute("DO $$ BEGIN FOR i IN 1..400 LOOP INSERT INTO a VALUES (i); "
                   "INSERT INTO b VALUES (i); INSERT INTO c VALUES (i); END LOOP; END $$")
        wait_for(lambda: sum(len(v) for v in seen.values()) >= 1200, 60, "the inserts")
    finally:
        engine.close()
        thread.join(10)
    assert engine.error is None
    assert most_at_once["tables"] > 1, "different tables never ran at once"
    for table in tables:
        if key_by == "table":
            assert [i for _, i in seen[table]] == list(range(1, 401)), table
            assert [lsn for lsn, _ in seen[table]] == sorted(lsn for lsn, _ in seen[table])
        else:  # only each key's order is kept
            assert sorted(i for _, i in seen[table]) == list(range(1, 401)), table
    if key_by == "table":
        assert most_at_once["table"] == 1
    else:
        assert most_at_once["table"] > 1, "one table's keys never ran at once"


def test_one_task_per_database(pg_cluster: PostgresCluster) -> None:
    names = ["multi_a", "multi_b"]
    for name in names:
        pg_cluster.create_database(name)
    try:
        for name in names:
            Database(pg_cluster, name).execute(
                "CREATE TABLE t (id int PRIMARY KEY)",
                "INSERT INTO t SELECT generate_series(1, 100)")
        sink = MemorySink()
        connector = PostgresConnector(
            {"dsn": pg_cluster.dsn("postgres"), "table_include_list": ["public.t"],
             "snapshot_mode": "initial_only", "slot_name": "multi"}, databases=names)
        engine = Engine(connector, sink, config={"tasks_max": 2, "delivery_mode": "ordered"},
                        converter=EventConverter())
        engine.run()
        by_db: dict[str, int] = {}
        for record in sink.records:
            event = record.value
            if isinstance(event, ChangeEvent):
                by_db[event.context.db] = by_db.get(event.context.db, 0) + 1
        assert by_db == {"multi_a": 100, "multi_b": 100}
    finally:
        for name in names:
            pg_cluster.drop_database(name)


def test_close_while_starting_leaves_no_active_slot_and_no_connection(db: Database) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY)",
               "INSERT INTO t SELECT generate_series(1, 1000)")
    # start() adds the table to the publication, which waits for a lock on the table:
    # holding that lock keeps the task in start() for as long as the test wants.
    blocker = sql_connection(db.dsn)
    try:
        with blocker.cursor() as cur:
            cur.execute("LOCK TABLE t IN ACCESS EXCLUSIVE MODE")
        connector = PostgresConnector({"dsn": db.dsn, "table_include_list": ["public.t"],
                                             "slot_name": "starting_test"})
        engine = Engine(connector, MemorySink(), config={"delivery_mode": "batch"},
                        converter=EventConverter())
        thread = threading.Thread(target=engine.run, daemon=True)
        thread.start()
        wait_for(lambda: engine.state is State.STARTING_TASKS or engine.error, 30,
                 "STARTING_TASKS")
        assert engine.error is None, engine.error
        wait_for(lambda: db.scalar("SELECT count(*) FROM pg_locks WHERE NOT granted"), 30,
                 "start() to wait for the table lock")
        closer = threading.Thread(target=engine.close, daemon=True)
        closer.start()
        # close() has recorded the stop and waits for the engine to stop: whatever it
        # would do without waiting for the start, it has done by now.
        wait_for(lambda: not closer.is_alive() or waiting_in(closer, "engine/state.py", "wait_for"),
                 30, "close() to wait for the engine to stop")
        assert closer.is_alive(), "close() returned while the task was still starting"
        assert engine.state is State.STARTING_TASKS, "close() did not wait for the start"
    finally:
        blocker.rollback()
        blocker.close()
    closer.join(30)
    thread.join(30)
    assert engine.state is State.STOPPED and engine.error is None

    def clean() -> bool:
        active = db.scalar("SELECT count(*) FROM pg_replication_slots WHERE active")
        connections = db.scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'tidemark%%' "
            "AND pid <> pg_backend_pid()")
        return active == 0 and connections == 0

    wait_for(clean, 10, "no active slot and no tidemark connection")
