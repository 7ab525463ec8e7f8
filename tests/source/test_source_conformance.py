"""One conformance suite over every source: PostgreSQL (pgoutput), MariaDB (binlog), and
CDC log tables on PostgreSQL and on SQLite, all through the embedded engine.

Each source gets the same workload and must give the same change events: every
operation, a primary-key change as a delete then a create, NULLs, a multi-statement
transaction, changes made while the engine was stopped delivered after its restart from
the saved offsets, and a replay of the events equal to the table. A new source adds a
fixture parameter here, not a copy of these tests.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from logtable_helpers import LogDb, replay
from tidemark import (
    Engine,
    LogTableConnector,
    MariaDbConnector,
    PostgresConnector,
    SqliteOffsetStore,
)
from tidemark.engine.converters import EventConverter
from tidemark.event import ChangeEvent, Op
from tidemark.source.spi import SourceConnector
from tidemark.testing.postgres import sql_connection
from tidemark.testing.sink import MemorySink
from waiting import wait_for

pytestmark = pytest.mark.integration

SOURCES = ("postgres", "mariadb", "postgres-logtable", "sqlite-logtable")


@dataclass
class Source:
    """A database with table ``conf_t (id int key, v text, n int)`` and its connector."""

    name: str
    execute: Callable[..., None]  # statements, one transaction
    rows: Callable[[], dict[Any, dict[str, Any]]]
    connector: Callable[[], SourceConnector]


def _pg_rows(dsn: str) -> dict[Any, dict[str, Any]]:
    with contextlib.closing(sql_connection(dsn)) as conn, conn.cursor() as cur:
        cur.execute("SELECT id, v, n FROM conf_t")
        return {(i,): {"id": i, "v": v, "n": n} for i, v, n in cur.fetchall()}


@pytest.fixture(params=SOURCES)
def source(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Source]:
    kind: str = request.param
    table = "CREATE TABLE conf_t (id integer PRIMARY KEY, v text, n integer)"
    if kind == "mariadb":
        mdb = request.getfixturevalue("mdb")
        mdb.execute("CREATE TABLE conf_t (id INT PRIMARY KEY, v VARCHAR(40), n INT)")
        yield Source(kind, mdb.execute,
                     lambda: {(i,): {"id": i, "v": v, "n": n}
                              for i, v, n in mdb.query("SELECT id, v, n FROM conf_t")},
                     lambda: MariaDbConnector({"dsn": mdb.dsn,
                                                    "snapshot_mode": "no_data"}))
        return
    if kind == "sqlite-logtable":
        path = tmp_path / "app.db"
        path.touch()
        lite = LogDb("sqlite", f"sqlite:///{path}", path)
        lite.execute(table)
        lite.install(["conf_t"], streams=8, groups=2)
        yield Source(kind, lite.execute,
                     lambda: {(i,): {"id": i, "v": v, "n": n}
                              for i, v, n in lite.query("SELECT id, v, n FROM conf_t")},
                     lambda: LogTableConnector({"dsn": lite.dsn,
                                                      "poll_interval_ms": 20}))
        return
    db = request.getfixturevalue("db")
    db.execute(table)
    if kind == "postgres-logtable":
        LogDb("postgres", db.dsn).install(["conf_t"], streams=8, groups=2)
        yield Source(kind, db.execute, lambda: _pg_rows(db.dsn),
                     lambda: LogTableConnector({"dsn": db.dsn, "poll_interval_ms": 20}))
        return
    yield Source(kind, db.execute, lambda: _pg_rows(db.dsn),
                 lambda: PostgresConnector({"dsn": db.dsn, "snapshot_mode": "no_data",
                                                  "table_include_list": ["public.conf_t"]}))


def _events(sink: MemorySink) -> list[ChangeEvent]:
    return [r.value for r in sink.records if isinstance(r.value, ChangeEvent)]


@contextlib.contextmanager
def _engine(source: Source, store: SqliteOffsetStore) -> Iterator[MemorySink]:
    sink = MemorySink()
    engine = Engine(source.connector(), sink, config={"offset_flush_interval_ms": 0},
                    converter=EventConverter(), offset_store=store)
    thread = threading.Thread(target=engine.run, daemon=True)
    thread.start()
    try:
        yield sink
    finally:
        engine.close()
        thread.join(timeout=60)
        assert not thread.is_alive(), "the engine did not stop"


def _in_order(events: list[ChangeEvent], source: Source) -> list[ChangeEvent]:
    # Log tables deliver groups in turn: a key's changes in order, keys interleaved.
    return sorted(events, key=lambda e: e.lsn or 0) if "logtable" in source.name else events


def test_every_source_gives_the_same_change_events(source: Source, tmp_path: Path) -> None:
    store = SqliteOffsetStore(tmp_path / "offsets.db")
    source.execute("INSERT INTO conf_t VALUES (0, 'ready', NULL)")
    with _engine(source, store) as sink:
        # A change seen proves the stream is open (a slot or a binlog position taken
        # when the engine started): touch row 0 until one arrives.
        touches = iter(range(1, 10_000))

        def stream_open() -> bool:
            source.execute(f"UPDATE conf_t SET n = {next(touches)} WHERE id = 0")
            return bool(_events(sink))

        wait_for(stream_open, 60, f"{source.name}: the stream to open")
        source.execute("INSERT INTO conf_t VALUES (1, 'one', 1)",
                       "INSERT INTO conf_t VALUES (2, 'two', NULL)",
                       "INSERT INTO conf_t VALUES (3, NULL, 3)")
        source.execute("UPDATE conf_t SET v = 'uno', n = NULL WHERE id = 1")
        source.execute("UPDATE conf_t SET id = 20 WHERE id = 2")
        source.execute("DELETE FROM conf_t WHERE id = 3")
        wait_for(lambda: len([e for e in _events(sink) if (e.key or {})["id"]]) >= 7, 60,
                 f"{source.name}: the workload")
    events = _in_order(_events(sink), source)
    workload = [e for e in events if (e.key or {})["id"]]
    assert [(e.op, (e.key or {})["id"]) for e in workload] == [
        (Op.CREATE, 1), (Op.CREATE, 2), (Op.CREATE, 3), (Op.UPDATE, 1),
        (Op.DELETE, 2), (Op.CREATE, 20), (Op.DELETE, 3)], source.name
    created = workload[2].after
    assert created is not None and created["v"] is None and created["n"] == 3
    updated = workload[3].after
    assert updated is not None and updated["v"] == "uno" and updated["n"] is None
    assert workload[5].after is not None and workload[5].after["v"] == "two"
    assert replay(events) == source.rows()

    # Stopped: the changes made meanwhile come after a restart from the saved offsets,
    # and nothing from before the stop comes again.
    source.execute("UPDATE conf_t SET n = 100 WHERE id = 0",
                   "INSERT INTO conf_t VALUES (4, 'four', 4)")
    with _engine(source, store) as again:
        wait_for(lambda: len(_events(again)) >= 2, 60, f"{source.name}: after the restart")
        source.execute("DELETE FROM conf_t WHERE id = 20")
        wait_for(lambda: len(_events(again)) >= 3, 60, f"{source.name}: a change after it")
    later = _in_order(_events(again), source)
    assert [(e.op, (e.key or {})["id"]) for e in later] == [
        (Op.UPDATE, 0), (Op.CREATE, 4), (Op.DELETE, 20)], source.name
    assert replay(later, replay(events)) == source.rows()
