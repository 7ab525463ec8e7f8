"""The engine and an offset store whose server goes away: a remote offsets table on a
private PostgreSQL that is really stopped for 3 s and started again. The engine retries
the save (``errors_max_retries = -1``), confirms nothing to the source meanwhile, and
goes on delivering once the server is back; a layered store can be built and read while
its remote is down."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest

from conftest import Database
from tidemark.engine.converters import EventConverter
from tidemark.engine.engine import Engine
from tidemark.engine.state import State
from tidemark.errors import SourceUnavailableError
from tidemark.event import ChangeEvent
from tidemark.offsets.layered import LayeredOffsetStore
from tidemark.offsets.postgres import PostgresOffsetStore
from tidemark.offsets.sqlite import SqliteOffsetStore
from tidemark.offsets.store import Offset
from tidemark.source.postgres.task import PostgresConnector
from tidemark.testing.postgres import PostgresCluster
from tidemark.testing.sink import MemorySink
from waiting import wait_for

OUTAGE_S = 3.0


def ids(sink: MemorySink) -> set[int]:
    return {int(r.value.after["id"]) for r in sink.records
            if isinstance(r.value, ChangeEvent) and r.value.after is not None}


def remote_offset(dsn: str, key: str) -> Offset | None:
    """The offset of *key* in the remote table, read on a connection of its own."""
    with PostgresOffsetStore(dsn) as store:
        return store.load(key)


def confirmed_lsn(db: Database, slot: str) -> int:
    """The slot's confirmed_flush_lsn, as a number."""
    return int(db.query("SELECT (confirmed_flush_lsn - '0/0')::bigint FROM "
                        "pg_replication_slots WHERE slot_name = %s", (slot,))[0][0])


@pytest.fixture
def offsets_cluster() -> PostgresCluster:
    with PostgresCluster() as cluster:
        yield cluster  # type: ignore[misc]


@pytest.mark.slow
def test_the_engine_survives_a_remote_offset_store_outage(
        db: Database, offsets_cluster: PostgresCluster, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY)",
               "INSERT INTO t SELECT g FROM generate_series(1, 100) g")
    remote_dsn = offsets_cluster.dsn("postgres")
    store = LayeredOffsetStore(SqliteOffsetStore(tmp_path / "offsets.db"),
                               PostgresOffsetStore(remote_dsn))
    sink = MemorySink()
    connector = PostgresConnector({"dsn": db.dsn, "table_include_list": ["public.t"]})
    engine = Engine(connector, sink, config={
        "delivery_mode": "ordered", "offset_flush_interval_ms": 0,
        "errors_max_retries": -1, "errors_retry_delay_initial_ms": 100,
        "errors_retry_delay_max_ms": 500}, converter=EventConverter(), offset_store=store)
    thread = threading.Thread(target=engine.run, daemon=True)
    caplog.set_level(logging.WARNING, logger="tidemark.engine.task_runner")
    thread.start()
    try:
        wait_for(lambda: ids(sink) >= set(range(1, 101)), 30, "the snapshot")
        key = f"postgres/{db.name}/tidemark"
        wait_for(lambda: remote_offset(remote_dsn, key), 10, "the first remote save")

        offsets_cluster.halt("immediate")
        down_at = time.monotonic()
        before_outage = db.insert_lsn()  # nothing after it is saved until the store is back
        db.execute("INSERT INTO t SELECT g FROM generate_series(101, 200) g")
        wait_for(lambda: "offset save failed" in caplog.text, 10,
                 "a failed offset save being retried")
        # The outage under test lasts OUTAGE_S (the scenario, not a wait for a
        # condition); meanwhile the slot is confirmed no further than before it: the
        # rows delivered since are not saved, so their WAL must stay.
        confirmed: list[int] = []
        while time.monotonic() - down_at < OUTAGE_S:
            confirmed.append(confirmed_lsn(db, "tidemark"))
            time.sleep(0.1)
        assert confirmed and max(confirmed) <= before_outage, (confirmed, before_outage)
        assert engine.state is State.POLLING_TASKS and engine.error is None, engine.error
        offsets_cluster.resume()

        db.execute("INSERT INTO t SELECT g FROM generate_series(201, 300) g")
        wait_for(lambda: ids(sink) >= set(range(1, 301)), 30, "the rows after the outage")
        assert engine.error is None
    finally:
        engine.close()
        thread.join(30)
        store.close()
    assert engine.state is State.STOPPED and engine.error is None, engine.error
    assert ids(sink) == set(range(1, 301))
    # The remote caught up: it holds the last offset, as the local store does.
    with SqliteOffsetStore(tmp_path / "offsets.db") as local:
        assert remote_offset(remote_dsn, key) == local.load(key) is not None


@pytest.mark.slow
def test_a_layered_store_is_built_and_read_while_its_remote_is_down(
        offsets_cluster: PostgresCluster, tmp_path: Path) -> None:
    remote_dsn = offsets_cluster.dsn("postgres")
    with LayeredOffsetStore(SqliteOffsetStore(tmp_path / "offsets.db"),
                            PostgresOffsetStore(remote_dsn)) as first:
        first.save("k", {"lsn": 7})
    offsets_cluster.halt("immediate")
    store = LayeredOffsetStore(SqliteOffsetStore(tmp_path / "offsets.db"),
                               PostgresOffsetStore(remote_dsn))
    try:
        assert store.load("k") == {"lsn": 7}  # the local store answers
        assert store.load_many(["k"]) == {"k": {"lsn": 7}}
        with pytest.raises(SourceUnavailableError, match="cannot save offsets"):
            store.save("k", {"lsn": 8})  # retriable: the engine retries it
        offsets_cluster.resume()
        store.save("k", {"lsn": 9})
    finally:
        store.close()
    with PostgresOffsetStore(remote_dsn) as remote:
        assert remote.load("k") == {"lsn": 9}


def test_a_misconfigured_remote_store_stops_the_engine_before_anything_is_delivered(
        db: Database, tmp_path: Path) -> None:
    """The local store has the key, so loads never touch the remote: the engine connects
    the remote at start anyway, and a missing schema stops it there (ConfigError)
    instead of at the first save, after records were delivered."""
    from tidemark.errors import ConfigError  # noqa: PLC0415
    from tidemark.source.synthetic import SyntheticConnector  # noqa: PLC0415

    with SqliteOffsetStore(tmp_path / "offsets.db") as local:
        local.save("synthetic/synthetic/0", {"position": 5})
    store = LayeredOffsetStore(SqliteOffsetStore(tmp_path / "offsets.db"),
                               PostgresOffsetStore(db.dsn, schema="no_such_schema"))
    sink = MemorySink()
    engine = Engine(SyntheticConnector(total=1000, batch_size=10), sink,
                    config={"offset_flush_interval_ms": 60_000}, offset_store=store)
    try:
        with pytest.raises(ConfigError, match="no_such_schema"):
            engine.run()
    finally:
        store.close()
    assert sink.records == []
