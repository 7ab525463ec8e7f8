"""A log-table reader on PostgreSQL survives a server restart: its polls come back
empty while the server is gone, it reconnects per ``reconnect_max_attempts`` and
``reconnect_backoff_ms``, and reads on from the positions it handed on (every change
once, none lost); with ``reconnect_max_attempts = 0`` it fails at once, as before."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from typing import Any

import pytest

from logtable_helpers import LogDb, drain, reader
from pipeline_helpers import _signal_server
from tidemark.errors import SourceUnavailableError
from tidemark.event import ChangeEvent
from tidemark.source.logtable import reader as logtable_reader
from tidemark.source.logtable.database import LogDatabase, ReadResult
from tidemark.source.logtable.reader import LogTableReader
from tidemark.testing.postgres import PostgresCluster
from waiting import wait_for

pytestmark = pytest.mark.integration


def _ids(r: LogTableReader, got: list[ChangeEvent], want: int) -> bool:
    got.extend(r.poll().records)  # type: ignore[arg-type]
    return len(got) >= want


def test_a_server_restart_is_read_through(db: Any) -> None:
    log = LogDb("postgres", db.dsn)
    log.execute("CREATE TABLE t (id integer PRIMARY KEY)")
    log.install(["t"])
    r = reader(log)  # the default reconnect settings
    got: list[ChangeEvent] = []
    try:
        log.execute("INSERT INTO t VALUES (1)", "INSERT INTO t VALUES (2)")
        wait_for(lambda: _ids(r, got, 2), 30, "the changes before the restart")
        db.cluster.restart()
        log.execute("INSERT INTO t VALUES (3)", "INSERT INTO t VALUES (4)")
        wait_for(lambda: _ids(r, got, 4), 60, "the changes after the restart")
        assert r.stats.connected
    finally:
        r.stop()
    assert sorted(e.after["id"] for e in got if e.after) == [1, 2, 3, 4]


def test_without_reconnect_attempts_a_restart_fails_the_reader(db: Any) -> None:
    log = LogDb("postgres", db.dsn)
    log.execute("CREATE TABLE t (id integer PRIMARY KEY)")
    log.install(["t"])
    r = reader(log, reconnect_max_attempts=0)
    try:
        db.cluster.restart()
        with pytest.raises(SourceUnavailableError):
            wait_for(lambda: r.poll() and False, 30, "the reader's failure", interval_s=0.05)
    finally:
        r.stop()


def _flaky_prune(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Make the reader's databases (real ones) fail their next prune once, right after
    a read that returned rows, as a server restart would; returns what happened."""
    real_open = logtable_reader.open_database
    happened: list[str] = []

    def open_database(dsn: str, **kwargs: Any) -> LogDatabase:
        db = real_open(dsn, **kwargs)
        real_read, real_prune = db.read, db.prune
        last: list[bool] = [False]

        def read(*args: Any, **kw: Any) -> ReadResult:
            result = real_read(*args, **kw)
            last[0] = bool(result.rows)
            return result

        def prune(*args: Any, **kw: Any) -> int:
            if last[0] and not happened:
                happened.append("prune failed after a read with rows")
                raise SourceUnavailableError("the server is restarting (injected)")
            return real_prune(*args, **kw)

        db.read, db.prune = read, prune  # type: ignore[method-assign]
        return db

    monkeypatch.setattr(logtable_reader, "open_database", open_database)
    return happened


def test_a_prune_failing_after_a_read_loses_no_rows(
        logdb: LogDb, monkeypatch: pytest.MonkeyPatch) -> None:
    """The read moved the group on; the prune after it found the server gone: the rows
    read come again after the reconnect, each once."""
    logdb.execute("CREATE TABLE t (id integer PRIMARY KEY)")
    logdb.install(["t"])
    logdb.execute(*(f"INSERT INTO t VALUES ({i})" for i in range(1, 7)))
    happened = _flaky_prune(monkeypatch)
    r = reader(logdb, prune_interval_s=0, max_batch_events=2, reconnect_backoff_ms=10)
    got: list[ChangeEvent] = []
    try:
        with contextlib.suppress(AssertionError):
            wait_for(lambda: _ids(r, got, 6), 10, "every change")
        got.extend(drain(r))
    finally:
        r.stop()
    assert happened
    assert sorted(e.after["id"] for e in got if e.after) == [1, 2, 3, 4, 5, 6]


@pytest.mark.slow
def test_a_stopped_server_is_noticed_and_read_through() -> None:
    """SIGSTOP: the kernel still answers TCP, so only silence says the server is gone.
    The reader's queries end after ``server_timeout_ms`` and it reconnects per its
    settings instead of waiting for ever; after SIGCONT it reads on, losing nothing."""
    with PostgresCluster() as cluster:
        log = LogDb("postgres", cluster.create_database("stopped_log") + " connect_timeout=2")
        log.execute("CREATE TABLE t (id integer PRIMARY KEY)")
        log.install(["t"])
        r = reader(log, server_timeout_ms=1000, reconnect_backoff_ms=100,
                   reconnect_max_attempts=100)
        got: list[ChangeEvent] = []
        running = threading.Event()
        running.set()

        def poll() -> None:  # in a thread: a hung poll fails the test instead of it
            while running.is_set():
                got.extend(r.poll().records)  # type: ignore[arg-type]
                time.sleep(0.005)

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        try:
            log.execute("INSERT INTO t VALUES (1)", "INSERT INTO t VALUES (2)")
            wait_for(lambda: len(got) >= 2, 30, "the changes before the stop")
            _signal_server(cluster, signal.SIGSTOP)
            try:
                wait_for(lambda: not r.stats.connected, 20,
                         "the reader noticing the stopped server")
            finally:
                _signal_server(cluster, signal.SIGCONT)
            log.execute("INSERT INTO t VALUES (3)", "INSERT INTO t VALUES (4)")
            wait_for(lambda: len(got) >= 4 and r.stats.connected, 60,
                     "the changes after the server went on")
        finally:
            running.clear()
            poller.join(60)
            r.stop()
        assert poller.is_alive() is False  # no poll hung, and none failed
        assert sorted(e.after["id"] for e in got if e.after) == [1, 2, 3, 4]
