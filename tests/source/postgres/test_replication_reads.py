"""What ends ``ReplicationStream.read_batch``'s wait for the first message: the data, the
timeout, or the answer to a keepalive the caller asked for; not a keepalive the
walsender sends of its own accord (it often sends one just before the data, and an
empty batch cost ``tidemark capture`` an idle pause of 50 ms before its first event)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable

from conftest import Database
from tidemark.source.postgres import wal_reads as wal
from tidemark.source.postgres.replication import ReplicationStream


def _stream(db: Database, *, wal_sender_timeout_ms: int = 60_000) -> ReplicationStream:
    db.execute("CREATE TABLE t (id int PRIMARY KEY)", "CREATE PUBLICATION reads FOR TABLE t")
    with contextlib.closing(wal.connect(db.dsn, purpose="test")) as conn:
        conn.autocommit = True
        lsn = wal.ensure_slot(conn, "reads")
    # The walsender sends a keepalive of its own once it has heard nothing from the
    # client for half of wal_sender_timeout.
    dsn = f"{db.dsn} options='-c wal_sender_timeout={wal_sender_timeout_ms}'"
    stream = ReplicationStream(dsn, "reads", "reads")
    stream.start(lsn)
    return stream


def _when(check: Callable[[], bool], action: Callable[[], None]) -> threading.Thread:
    """A thread that runs *action* once *check*() is true (deadline 30 s)."""
    def run() -> None:
        deadline = time.monotonic() + 30
        while not check() and time.monotonic() < deadline:
            time.sleep(0.01)  # polling the condition, with a deadline
        action()
    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_a_keepalive_of_the_walsenders_own_accord_does_not_end_the_wait(db: Database) -> None:
    stream = _stream(db, wal_sender_timeout_ms=200)
    # The row is inserted once a keepalive has come: read_batch is then past it.
    thread = _when(lambda: stream.wal_end > 0,
                   lambda: db.autocommit("INSERT INTO t VALUES (1)"))
    try:
        messages = stream.read_batch(100, 60.0)
    finally:
        thread.join()
        stream.close()
    assert stream.wal_end > 0  # a keepalive came before the data
    # The insert's transaction, from its start (the batch may end before its end: it
    # is gathered while messages keep coming).
    assert [data[:1] for data, _ in messages][:1] == [b"B"]


def test_the_answer_to_a_keepalive_request_ends_the_wait(db: Database) -> None:
    stream = _stream(db)
    try:
        stream.request_keepalive()
        started = time.monotonic()
        assert stream.read_batch(100, 60.0) == []  # nothing to send: the answer says so
        assert time.monotonic() - started < 60
        assert stream.wal_end > 0
    finally:
        stream.close()
