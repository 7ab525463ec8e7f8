"""A log-table reader on PostgreSQL survives a server restart: its polls come back
empty while the server is gone, it reconnects per ``reconnect_max_attempts`` and
``reconnect_backoff_ms``, and reads on from the positions it handed on (every change
once, none lost); with ``reconnect_max_attempts = 0`` it fails at once, as before."""

from __future__ import annotations

from typing import Any

import pytest

from logtable_helpers import LogDb, reader
from tidemark.errors import SourceUnavailableError
from tidemark.event import ChangeEvent
from tidemark.source.logtable.reader import LogTableReader
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
