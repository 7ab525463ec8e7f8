"""Capture under stress: concurrent writers, crashes, signals, heartbeats, reconnects.

Everything runs against the private PostgreSQL of the test session; the CLI tests start
real ``python -m tidemark capture`` processes and kill them.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from capture_helpers import drain, events, make_connector
from conftest import Database
from pipeline_helpers import _signal_server
from tidemark.errors import ConfigError, SourceError, SourceUnavailableError
from tidemark.event import ChangeEvent, Op, SnapshotMarker
from tidemark.postgres_connection import ServerTimeoutError
from tidemark.source.postgres.reader import PostgresReader
from tidemark.testing.postgres import PostgresCluster, sql_connection
from waiting import wait_for

# Run on every PostgreSQL version CI tests (scripts/test.sh).
pytestmark = pytest.mark.every_pg_version

SLOT = "tidemark"


def slot_state(db: Database, name: str = SLOT) -> tuple[int | None, int] | None:
    """(active_pid, confirmed_flush_lsn) of the slot, or None if it does not exist."""
    rows = db.query("SELECT active_pid, (confirmed_flush_lsn - '0/0')::bigint "
                    "FROM pg_replication_slots WHERE slot_name = %s", (name,))
    # A slot still being created has no confirmed position yet: not there for our purposes.
    return (rows[0][0], int(rows[0][1])) if rows and rows[0][1] is not None else None


class Walsender:
    """The walsender streaming a slot, as pg_stat_replication shows it."""

    def __init__(self, pid: int, sent_lsn: int, reply_time: float | None) -> None:
        self.pid = pid
        self.sent_lsn = sent_lsn
        self.reply_time = reply_time  # the client's clock when it sent its last status


def walsender(db: Database, name: str = SLOT) -> Walsender | None:
    """The walsender of slot *name*, or None if the slot is not being streamed."""
    rows = db.query("SELECT r.pid, coalesce((r.sent_lsn - '0/0')::bigint, 0), "
                    "extract(epoch FROM r.reply_time)::float8 FROM pg_stat_replication r "
                    "JOIN pg_replication_slots s ON s.active_pid = r.pid "
                    "WHERE s.slot_name = %s", (name,))
    return Walsender(*rows[0]) if rows else None


def slot_names(db: Database) -> list[str]:
    return [r[0] for r in db.query("SELECT slot_name FROM pg_replication_slots "
                                   "WHERE database = current_database()")]


def poll_for(connector: PostgresReader, seconds: float, *, commit: bool = True,
             offsets: list[dict[str, Any]] | None = None) -> list[Any]:
    """Poll (and commit) for *seconds*, returning the records; the committed offsets
    are appended to *offsets*."""
    records: list[Any] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        batch = connector.poll()
        records.extend(batch.records)
        if commit and batch.offset is not None:
            connector.commit(batch.offset)
            if offsets is not None:
                offsets.append(dict(batch.offset))
    return records


def ids_of(evts: list[ChangeEvent]) -> list[int]:
    return [e.key["id"] for e in evts if e.key is not None]


class Writer(threading.Thread):
    """Runs ``step(cursor, n)`` on its own autocommit connection until stopped (or
    until *limit* steps), counting the steps."""

    def __init__(self, dsn: str, step: Callable[[Any, int], None],
                 limit: int | None = None, pause_every: int = 0,
                 pause_s: float = 0.0) -> None:
        super().__init__(daemon=True)
        self.dsn = dsn
        self.step = step
        self.limit = limit
        self.pause_every = pause_every
        self.pause_s = pause_s
        self.count = 0
        self.error: BaseException | None = None
        self._halt = threading.Event()

    def run(self) -> None:
        try:
            with contextlib.closing(sql_connection(self.dsn)) as conn:
                conn.autocommit = True
                with conn.cursor() as cur:
                    while not self._halt.is_set():
                        if self.limit is not None and self.count >= self.limit:
                            return
                        self.step(cur, self.count)
                        self.count += 1
                        if self.pause_every and self.count % self.pause_every == 0:
                            time.sleep(self.pause_s)
        except BaseException as err:  # reported by finish()
            self.error = err

    def finish(self, timeout_s: float = 30.0) -> int:
        """Stop (if still running), join, re-raise any error; returns the step count."""
        self._halt.set()
        self.join(timeout_s)
        assert not self.is_alive(), "writer did not stop"
        if self.error is not None:
            raise self.error
        return self.count

    def wait(self, timeout_s: float = 30.0) -> int:
        """Wait for a limited writer to complete all its steps."""
        self.join(timeout_s)
        return self.finish()


# -- the CLI as a process ----------------------------------------------------------------
class Capture:
    """One ``python -m tidemark capture`` process writing to a file."""

    def __init__(self, db: Database, tmp: Path, name: str, *args: str) -> None:
        self.out = tmp / f"{name}.jsonl"
        self.err = tmp / f"{name}.stderr"
        env = {**os.environ, "TIDEMARK_DSN": db.dsn}
        with self.out.open("wb") as out, self.err.open("wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tidemark", "--log-level", "INFO", "capture",
                 "--table", "public.t", *args],
                stdout=out, stderr=err, env=env,
            )

    def lines(self, tolerate_partial: bool = False) -> list[dict[str, Any]]:
        data = self.out.read_bytes()
        chunks = data.split(b"\n")
        tail = chunks.pop()  # after the last newline: empty unless cut mid-write
        assert tolerate_partial or tail == b"", f"output does not end with a newline: {tail!r}"
        return [json.loads(c) for c in chunks]

    def changes(self, tolerate_partial: bool = False) -> list[dict[str, Any]]:
        """The change events (tombstones left out)."""
        return [ln for ln in self.lines(tolerate_partial) if ln["value"] is not None]

    def count_lines(self) -> int:
        return self.out.read_bytes().count(b"\n")

    def wait(self, timeout_s: float = 30.0) -> int:
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"capture did not exit within {timeout_s}s; stderr:\n"
                                 f"{self.stderr()}") from None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stderr(self) -> str:
        return self.err.read_text(errors="replace")[-3000:]


@pytest.fixture
def captures(db: Database, tmp_path: Path) -> Iterator[Callable[..., Capture]]:
    started: list[Capture] = []

    def start(name: str, *args: str) -> Capture:
        cap = Capture(db, tmp_path, name, *args)
        started.append(cap)
        return cap

    yield start
    for cap in started:
        cap.kill()


def saved_lsn(path: Path) -> int:
    data = json.loads(path.read_text())
    (offset,) = data.values()
    return int(offset["lsn"])


def wait_until_streaming(db: Database, cap: Capture, timeout_s: float = 20.0) -> None:
    def active() -> bool:
        assert cap.proc.poll() is None, f"capture exited early:\n{cap.stderr()}"
        state = slot_state(db)
        return state is not None and state[0] is not None

    wait_for(active, timeout_s, "the capture to hold the slot")


# -- 1. snapshot while writers are busy -----------------------------------------------------
@pytest.mark.slow
def test_initial_snapshot_with_concurrent_writers(db: Database) -> None:
    rows = 20_000
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text NOT NULL, n int NOT NULL)",
               f"INSERT INTO t SELECT g, 'v' || g, 0 FROM generate_series(1, {rows}) g")
    rng = random.Random(7)
    next_id = [rows + 1]

    def step(cur: Any, n: int) -> None:
        choice = rng.random()
        if choice < 0.4:
            cur.execute("INSERT INTO t VALUES (%s, %s, 0)", (next_id[0], f"new{n}"))
            next_id[0] += 1
        elif choice < 0.75:
            cur.execute("UPDATE t SET n = n + 1, v = %s WHERE id = %s",
                        (f"upd{n}", rng.randint(1, next_id[0])))
        elif choice < 0.95:
            cur.execute("DELETE FROM t WHERE id = %s", (rng.randint(1, next_id[0]),))
        else:  # a small multi-statement transaction
            cur.execute("BEGIN")
            cur.execute("UPDATE t SET n = n + 10 WHERE id = %s", (rng.randint(1, rows),))
            cur.execute("INSERT INTO t VALUES (%s, 'tx', 0)", (next_id[0],))
            next_id[0] += 1
            cur.execute("DELETE FROM t WHERE id = %s", (rng.randint(1, rows),))
            cur.execute("COMMIT")

    writer = Writer(db.dsn, step, pause_every=20, pause_s=0.001)
    writer.start()
    wait_for(lambda: writer.count > 50, 10, "the writer to get going")
    conn = make_connector(db.dsn, "public.t", snapshot_fetch_size=1000)
    records: list[Any] = []
    try:
        conn.start()
        count_at_start = writer.count
        count_at_snapshot_end = None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            batch = conn.poll()
            records.extend(batch.records)
            if batch.offset is not None:
                conn.commit(batch.offset)
            if count_at_snapshot_end is None and any(
                    getattr(r, "source", None) is not None
                    and r.source.snapshot == SnapshotMarker.LAST for r in batch.records):
                count_at_snapshot_end = writer.count
                stream_until = time.monotonic() + 1.0
            if count_at_snapshot_end is not None and time.monotonic() > stream_until:
                break
        assert count_at_snapshot_end is not None, "the snapshot never finished"
        writer.finish()
        records.extend(drain(conn, db.insert_lsn()))
    finally:
        writer.finish()
        conn.stop()
    assert count_at_snapshot_end > count_at_start, "the writer was idle during the snapshot"

    got = events(records)
    reads = [e for e in got if e.op == Op.READ]
    read_keys = ids_of(reads)
    assert len(read_keys) == len(set(read_keys)), "a snapshot row was emitted twice"
    assert all(e.source.snapshot != SnapshotMarker.FALSE for e in reads)
    first_stream = next(i for i, e in enumerate(got) if e.op != Op.READ)
    assert all(e.op != Op.READ for e in got[first_stream:]), "r events after streaming began"

    table: dict[int, dict[str, Any]] = {}
    for e in got:
        key = e.key["id"] if e.key else None
        assert key is not None, e
        if e.op == Op.DELETE:
            table.pop(key, None)
        else:
            assert e.op in (Op.READ, Op.CREATE, Op.UPDATE), e.op
            assert e.after is not None
            table[key] = e.after
    final = {r[0]: {"id": r[0], "v": r[1], "n": r[2]}
             for r in db.query("SELECT id, v, n FROM t")}
    missing = sorted(set(final) - set(table))
    extra = sorted(set(table) - set(final))
    assert not missing, f"{len(missing)} rows never delivered, e.g. {missing[:10]}"
    assert not extra, f"{len(extra)} deleted rows still present, e.g. {extra[:10]}"
    wrong = [k for k in final if table[k] != final[k]]
    assert not wrong, f"{len(wrong)} rows differ, e.g. {[(table[k], final[k]) for k in wrong[:3]]}"

    # The snapshot uses the slot's exported snapshot, so snapshot and stream meet exactly:
    # no stream insert of a row the snapshot already had, no update/delete of a row it
    # did not have.
    present = set()
    anomalies = []
    for e in got:
        key = e.key["id"] if e.key else None
        if e.op in (Op.READ, Op.CREATE):
            if key in present:
                anomalies.append((e.op, key))
            present.add(key)
        elif e.op == Op.UPDATE:
            if key not in present:
                anomalies.append((e.op, key))
        elif e.op == Op.DELETE:
            if key not in present:
                anomalies.append((e.op, key))
            present.discard(key)
    assert not anomalies, f"snapshot and stream overlap or leave a gap: {anomalies[:10]}"


# -- 2. SIGKILL mid-stream, restart -------------------------------------------------------
@pytest.mark.slow
def test_sigkill_mid_stream_then_restart_loses_nothing(
        db: Database, tmp_path: Path, captures: Callable[..., Capture]) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    offsets = tmp_path / "offsets.json"
    first = captures("first", "--offsets", str(offsets), "--no-tombstones")
    wait_until_streaming(db, first)

    def insert(cur: Any, n: int) -> None:
        cur.execute("INSERT INTO t VALUES (%s)", (n + 1,))

    # No limit: the writer is surely still writing at the kill, however slowly the
    # capture runs; it is stopped a little after it.
    writer = Writer(db.dsn, insert, pause_every=20, pause_s=0.01)
    writer.start()
    wait_for(lambda: first.count_lines() >= 300, 20, "some output of the first capture")
    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait(10)
    committed_at_kill = writer.count
    assert writer.is_alive(), "the writer had stopped: the kill was not mid-stream"
    saved = saved_lsn(offsets)  # what the killed process had made durable
    wait_for(lambda: writer.count >= committed_at_kill + 200, 20, "writes after the kill")
    total = writer.finish()

    second = captures("second", "--offsets", str(offsets), "--no-tombstones", "--stop-at-end")
    assert second.wait() == 0, second.stderr()

    run1 = first.changes(tolerate_partial=True)
    run2 = second.changes()
    assert all(ln["value"]["op"] == "c" for ln in run1 + run2)
    ids1 = [ln["key"]["id"] for ln in run1]
    ids2 = [ln["key"]["id"] for ln in run2]
    assert len(ids1) == len(set(ids1)) and len(ids2) == len(set(ids2))
    union = set(ids1) | set(ids2)
    assert set(range(1, committed_at_kill + 1)) <= union, \
        "a change committed before the kill was lost"
    assert union == set(range(1, total + 1))
    # Only what came after the saved offset is delivered again, and the restart does not
    # go back before that offset.
    lsn1 = {ln["key"]["id"]: ln["value"]["source"]["lsn"] for ln in run1}
    duplicates = set(ids1) & set(ids2)
    assert all(lsn1[i] >= saved for i in duplicates), "restart re-sent changes before its offset"
    assert all(ln["value"]["source"]["lsn"] >= saved for ln in run2)
    assert len(duplicates) < 10_000 // 3, "more than one batch was delivered twice"
    assert saved_lsn(offsets) >= max(ln["value"]["source"]["lsn"] for ln in run2)


# -- 3. SIGTERM / SIGINT stop cleanly ------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_stops_cleanly_and_resume_repeats_nothing(
        db: Database, tmp_path: Path, captures: Callable[..., Capture],
        signum: signal.Signals) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text)",
               "INSERT INTO t SELECT g, 'snap' FROM generate_series(1, 100) g")
    offsets = tmp_path / "offsets.json"
    # No periodic saves after the first: the offset the resume starts from is the one
    # the signal handler saves.
    first = captures("first", "--offsets", str(offsets), "--offset-flush-interval-ms",
                     str(3_600_000))
    wait_until_streaming(db, first)
    db.autocommit(*(f"INSERT INTO t VALUES ({i}, 'live')" for i in range(101, 301)),
                  "UPDATE t SET v = 'upd' WHERE id <= 10", "DELETE FROM t WHERE id > 290",
                  "INSERT INTO t VALUES (0, 'marker')")
    expected_first = 100 + 200 + 10 + 10
    # The marker, a transaction of its own after the others, is delivered only after
    # their commits were read: the capture holds the offset of all of them. (Its own
    # commit may come in a later read: the resume may deliver it again.)
    # The process is still writing: a read may land between the bytes of one write.
    wait_for(lambda: any(ln["key"]["id"] == 0 for ln in first.changes(tolerate_partial=True)),
             20, "the first run's changes")
    first.proc.send_signal(signum)
    assert first.wait(10) == 0, first.stderr()
    assert offsets.exists()
    stored = json.loads(offsets.read_text())
    assert len(stored) == 1 and next(iter(stored)).endswith(f"/{SLOT}")
    assert isinstance(next(iter(stored.values()))["lsn"], int)
    run1 = first.changes()
    assert len(run1) == expected_first + 1 and run1[-1]["key"]["id"] == 0
    assert [ln["value"]["op"] for ln in run1].count("r") == 100
    assert saved_lsn(offsets) > run1[-2]["value"]["source"]["lsn"], \
        "the signal did not save the offset of what was delivered"
    # The slot is free again once the process is gone.
    wait_for(lambda: (slot_state(db) or (1, 0))[0] is None, 10, "the slot to be released")

    db.autocommit(*(f"INSERT INTO t VALUES ({i}, 'after')" for i in range(1001, 1051)),
                  "UPDATE t SET v = 'again' WHERE id = 1")
    second = captures("second", "--offsets", str(offsets), "--stop-at-end")
    assert second.wait() == 0, second.stderr()
    run2 = second.changes()
    if run2 and run2[0]["key"]["id"] == 0:
        run2 = run2[1:]  # the marker, its commit read after the signal
    assert [(ln["value"]["op"], ln["key"]["id"]) for ln in run2] == \
        [("c", i) for i in range(1001, 1051)] + [("u", 1)]


# -- 4. heartbeats --------------------------------------------------------------------------
class Idle:
    """What happened while only an uncaptured table was written."""

    def __init__(self, slot_before: int, slot_after: int, offset_before: int,
                 offset_after: int, wal_after_writes: int) -> None:
        self.slot_before = slot_before
        self.slot_after = slot_after
        self.offset_before = offset_before
        self.offset_after = offset_after
        self.wal_after_writes = wal_after_writes


def _server_wal_end(connector: PostgresReader) -> int:
    """The server's WAL position as of the last keepalive the connector received."""
    stream = connector._stream
    return stream.wal_end if stream is not None else 0


def _busy_uncaptured_table(db: Database, heartbeat_ms: int) -> Idle:
    """Capture ``a`` while only ``b`` is written, polling and committing all along."""
    db.execute("CREATE TABLE a (id int PRIMARY KEY)", "CREATE TABLE b (id int PRIMARY KEY, v text)")
    # status updates every second (psycopg2's minimum) instead of every 10 s, to keep
    # the test short; heartbeats are what is being tested, not the status throttle
    conn = make_connector(db.dsn, "public.a", snapshot_mode="no_data",
                          heartbeat_interval_ms=heartbeat_ms, status_interval_ms=1000)
    conn.start()
    committed: list[dict[str, Any]] = []
    try:
        drain(conn, db.insert_lsn())
        poll_for(conn, 1.0, offsets=committed)
        state = slot_state(db)
        assert state is not None
        slot_before = state[1]
        offset_before = committed[-1]["lsn"] if committed else slot_before

        def write_b(cur: Any, n: int) -> None:
            cur.execute("INSERT INTO b SELECT g, repeat('x', 200) FROM "
                        "generate_series(%s, %s) g", (n * 100, n * 100 + 99))

        writer = Writer(db.dsn, write_b, pause_every=1, pause_s=0.005)
        writer.start()
        try:
            records = poll_for(conn, 3.0, offsets=committed)
        finally:
            writer.finish()
        after_writes = db.insert_lsn()
        assert after_writes - slot_before > 1_000_000, "the writes made too little WAL"

        def caught_up() -> bool:
            records.extend(poll_for(conn, 0.2, offsets=committed))
            state = slot_state(db)
            return (state is not None and state[1] >= after_writes
                    and bool(committed) and committed[-1]["lsn"] >= after_writes)

        def told_past_the_writes() -> bool:
            records.extend(poll_for(conn, 0.2, offsets=committed))
            return _server_wal_end(conn) >= after_writes

        if heartbeat_ms:
            with contextlib.suppress(AssertionError):  # the test says what did not move
                wait_for(caught_up, 20, "the slot and the offset to advance", interval_s=0)
        else:
            # Nothing may move; first the connector must have had the chance to move it:
            # a keepalive told it the server's WAL is past the writes, and it polled idle
            # after that (what a heartbeat would have turned into an offset).
            wait_for(told_past_the_writes, 20, "a keepalive past the writes", interval_s=0)
            records.extend(poll_for(conn, 0.2, offsets=committed))
        end_state = slot_state(db)
        assert end_state is not None
        assert records == []  # nothing of table b is delivered
        return Idle(slot_before, end_state[1], offset_before,
                    committed[-1]["lsn"] if committed else offset_before, after_writes)
    finally:
        conn.stop()


@pytest.mark.slow
def test_heartbeat_lets_the_slot_advance_past_uncaptured_writes(db: Database) -> None:
    idle = _busy_uncaptured_table(db, heartbeat_ms=200)  # ends once caught up
    current = db.insert_lsn()
    assert idle.slot_after >= idle.wal_after_writes, (
        f"slot confirmed {idle.slot_after} but the WAL after the writes was at "
        f"{idle.wal_after_writes} ({idle.wal_after_writes - idle.slot_after} bytes held)")
    assert current - idle.slot_after < 1_000_000
    # the heartbeat moves the committed offset too, so a restart resumes from there
    assert idle.offset_after >= idle.wal_after_writes


@pytest.mark.slow
def test_without_heartbeats_the_offset_does_not_advance(db: Database) -> None:
    idle = _busy_uncaptured_table(db, heartbeat_ms=0)
    assert idle.offset_after == idle.offset_before, \
        "an offset was emitted without heartbeats or captured changes"
    # Without heartbeats the slot stays where the committed offset is, holding all the
    # WAL written for the uncaptured table since: the reason heartbeats exist.
    assert idle.slot_after <= idle.offset_after < idle.wal_after_writes


def test_when_needed_does_not_resnapshot_after_a_clean_stop(db: Database) -> None:
    _table_with_rows(db)
    db.execute("CREATE TABLE other (id int PRIMARY KEY)")
    _, offset = _run(db, mode="when_needed")
    assert offset is not None
    db.autocommit("INSERT INTO other SELECT generate_series(1, 1000)")
    # a run that stops at the end, nothing of t changed: heartbeats at their default
    conn = make_connector(db.dsn, "public.t", snapshot_mode="when_needed",
                          heartbeat_interval_ms=10_000)
    conn.start(offset, stop_at_lsn=db.insert_lsn())
    records: list[Any] = []
    try:
        deadline = time.monotonic() + 20
        while True:
            assert time.monotonic() < deadline, "the stop_at run did not finish"
            batch = conn.poll()
            records.extend(batch.records)
            if batch.offset is not None:
                conn.commit(batch.offset)
                offset = dict(batch.offset)  # saved durably, as the CLI does
            if batch.finished:
                break
    finally:
        conn.stop()
    assert events(records) == []
    db.autocommit("INSERT INTO t VALUES (6, 'x')")
    got, _ = _run(db, offset, mode="when_needed")
    assert [(e.op, e.key["id"]) for e in got if e.key] == [(Op.CREATE, 6)], \
        "re-snapshotted although nothing was lost"


# -- 5. the replication connection is killed -----------------------------------------------
def _terminate_walsender(db: Database) -> int:
    state = wait_for(lambda: (s := slot_state(db)) and s[0] is not None and s, 10,
                     "an active walsender")
    pid = state[0]
    assert db.scalar("SELECT pg_terminate_backend(%s)", (pid,)) is True
    return int(pid)


def test_reconnects_after_walsender_is_terminated(db: Database) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    conn = make_connector(db.dsn, "public.t", snapshot_mode="no_data",
                          reconnect_backoff_ms=100)
    conn.start()
    seen: list[int] = []
    try:
        drain(conn, db.insert_lsn())
        db.autocommit(*(f"INSERT INTO t VALUES ({i})" for i in range(1, 51)))
        seen += ids_of(events(drain(conn, db.insert_lsn())))
        old_pid = _terminate_walsender(db)
        db.autocommit(*(f"INSERT INTO t VALUES ({i})" for i in range(51, 151)))
        seen += ids_of(events(drain(conn, db.insert_lsn())))
        # Again, this time with changes in flight that were never read: the server has
        # sent them, the connector has not polled since.
        db.autocommit(*(f"INSERT INTO t VALUES ({i})" for i in range(151, 251)))
        in_flight = db.insert_lsn()
        wait_for(lambda: (w := walsender(db)) is not None and w.sent_lsn >= in_flight, 20,
                 "the server to send ids 151..250")
        second_pid = _terminate_walsender(db)
        db.autocommit(*(f"INSERT INTO t VALUES ({i})" for i in range(251, 301)))
        seen += ids_of(events(drain(conn, db.insert_lsn())))
        state = slot_state(db)
    finally:
        conn.stop()
    assert state is not None and state[0] not in (None, old_pid, second_pid)
    assert set(seen) == set(range(1, 301)), sorted(set(range(1, 301)) - set(seen))[:20]


def test_reconnect_does_not_confirm_uncommitted_offsets(db: Database) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    conn = make_connector(db.dsn, "public.t", snapshot_mode="no_data",
                          reconnect_backoff_ms=100, status_interval_ms=1000)
    conn.start()
    committed: list[dict[str, Any]] = []
    try:
        drain(conn, db.insert_lsn())
        db.autocommit(*(f"INSERT INTO t VALUES ({i})" for i in range(1, 11)))
        target = db.insert_lsn()
        wait_for(lambda: poll_for(conn, 0.1, offsets=committed) is not None
                 and committed and committed[-1]["lsn"] >= target, 10, "ids 1..10")
        durable = committed[-1]  # ids 1..10 are durable downstream
        db.autocommit(*(f"INSERT INTO t VALUES ({i})" for i in range(11, 21)))
        polled: list[int] = []
        wait_for(lambda: polled.extend(ids_of(events(poll_for(conn, 0.1, commit=False))))
                 or len(polled) >= 10, 10, "ids 11..20")
        old_pid = _terminate_walsender(db)
        # keep polling, never committing: the batch with ids 11..20 is not durable yet
        new_pid = wait_for(lambda: poll_for(conn, 0.1, commit=False) is not None
                           and (s := slot_state(db)) is not None
                           and s[0] not in (None, old_pid) and s[0], 10, "the reconnect")
        # ... until the new walsender has applied a status update of the reconnected
        # stream: one confirming anything after the committed offset moves the slot.
        wait_for(lambda: poll_for(conn, 0.1, commit=False) is not None
                 and (w := walsender(db)) is not None and w.pid == new_pid
                 and w.reply_time is not None, 10, "a status update after the reconnect")
    finally:
        conn.stop()  # the process goes away before ids 11..20 were made durable
    state = slot_state(db)
    assert state is not None
    # restart from the last committed offset: ids 11..20 must come again
    again = make_connector(db.dsn, "public.t", snapshot_mode="no_data")
    again.start(durable)
    try:
        redelivered = ids_of(events(drain(again, db.insert_lsn())))
    finally:
        again.stop()
    assert sorted(polled) == list(range(11, 21))
    assert sorted(redelivered) == list(range(11, 21)), (
        f"lost: the slot was confirmed to {state[1]}, beyond the committed offset "
        f"{durable['lsn']}")


def test_reconnect_max_attempts_zero_means_never(db: Database) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    conn = make_connector(db.dsn, "public.t", snapshot_mode="no_data",
                          reconnect_max_attempts=0)
    conn.start()
    try:
        drain(conn, db.insert_lsn())
        poll_for(conn, 0.3)  # the stream is opened on the poll after the slot's creation
        _terminate_walsender(db)
        with pytest.raises(SourceUnavailableError):
            poll_for(conn, 2.0)
    finally:
        conn.stop()


def test_status_interval_below_a_second_is_rejected_or_works(db: Database) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    try:
        conn = make_connector(db.dsn, "public.t", snapshot_mode="no_data",
                              status_interval_ms=500)
    except ConfigError as err:
        assert err.key == "status_interval_ms"
        return
    conn.start()
    try:
        drain(conn, db.insert_lsn())
        db.autocommit("INSERT INTO t VALUES (1)")
        assert ids_of(events(drain(conn, db.insert_lsn()))) == [1]
    finally:
        conn.stop()


# -- 6. snapshot modes ------------------------------------------------------------------------
def _table_with_rows(db: Database, n: int = 5) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text)",
               f"INSERT INTO t SELECT g, 'v' FROM generate_series(1, {n}) g")


def _run(db: Database, offset: dict[str, Any] | None = None, *, mode: str,
         changes: tuple[str, ...] = ()) -> tuple[list[ChangeEvent], dict[str, Any] | None]:
    """Start a connector, drain it (applying *changes* once the snapshot is over), stop.
    Returns the events and the last offset."""
    conn = make_connector(db.dsn, "public.t", snapshot_mode=mode)
    conn.start(offset)
    last: dict[str, Any] | None = None
    records: list[Any] = []
    try:
        deadline = time.monotonic() + 20
        target = db.insert_lsn()
        changed = not changes
        while time.monotonic() < deadline:
            batch = conn.poll()
            records.extend(batch.records)
            if batch.offset is not None:
                conn.commit(batch.offset)
                last = dict(batch.offset)
                if batch.offset["lsn"] >= target:
                    if changed:
                        break
                    db.autocommit(*changes)
                    changed = True
                    target = db.insert_lsn()
            if batch.finished:
                break
        else:
            raise AssertionError("the connector did not catch up")
    finally:
        conn.stop()
    return events(records), last


def test_snapshot_mode_initial_snapshots_then_streams(db: Database) -> None:
    _table_with_rows(db)
    got, offset = _run(db, mode="initial", changes=("INSERT INTO t VALUES (6, 'new')",))
    assert [(e.op, e.key["id"]) for e in got if e.key] == \
        [(Op.READ, i) for i in range(1, 6)] + [(Op.CREATE, 6)]
    assert offset is not None and offset["snapshot_completed"] is True
    assert slot_names(db) == [SLOT]


def test_snapshot_mode_no_data_streams_only(db: Database) -> None:
    _table_with_rows(db)
    got, _ = _run(db, mode="no_data", changes=("INSERT INTO t VALUES (6, 'new')",))
    assert [(e.op, e.key["id"]) for e in got if e.key] == [(Op.CREATE, 6)]


def test_snapshot_mode_initial_only_creates_no_slot(db: Database) -> None:
    _table_with_rows(db)
    conn = make_connector(db.dsn, "public.t", snapshot_mode="initial_only")
    conn.start()
    try:
        records = drain(conn)
        again = conn.poll()
    finally:
        conn.stop()
    assert [(e.op, e.key["id"]) for e in events(records) if e.key] == \
        [(Op.READ, i) for i in range(1, 6)]
    assert again.finished and again.records == []
    assert slot_names(db) == []


def test_snapshot_mode_when_needed_resnapshots_after_slot_loss(db: Database) -> None:
    _table_with_rows(db)
    _, offset = _run(db, mode="when_needed")
    assert offset is not None
    db.autocommit(f"SELECT pg_drop_replication_slot('{SLOT}')", "INSERT INTO t VALUES (6, 'x')")
    got, offset2 = _run(db, offset, mode="when_needed")
    assert [(e.op, e.key["id"]) for e in got if e.key] == [(Op.READ, i) for i in range(1, 7)]
    assert offset2 is not None and offset2["lsn"] > offset["lsn"]
    assert slot_names(db) == [SLOT]


def test_snapshot_mode_initial_resumes_without_new_snapshot(db: Database) -> None:
    _table_with_rows(db)
    _, offset = _run(db, mode="initial")
    assert offset is not None and offset["snapshot_completed"]
    db.autocommit("INSERT INTO t VALUES (6, 'x')", "DELETE FROM t WHERE id = 1")
    got, _ = _run(db, offset, mode="initial")
    assert [(e.op, e.key["id"]) for e in got if e.key] == [(Op.CREATE, 6), (Op.DELETE, 1)]


def test_offset_without_its_slot_fails_naming_the_slot(db: Database) -> None:
    _table_with_rows(db)
    _, offset = _run(db, mode="initial")
    assert offset is not None
    db.autocommit(f"SELECT pg_drop_replication_slot('{SLOT}')")
    conn = make_connector(db.dsn, "public.t", snapshot_mode="initial")
    try:
        with pytest.raises(SourceError, match=f"replication slot '{SLOT}' is gone"):
            conn.start(offset)
            conn.poll()
    finally:
        conn.stop()
    assert slot_names(db) == [], "a failed start must not create a slot"


@pytest.mark.slow
def test_cli_offset_without_its_slot_exits_with_error(
        db: Database, tmp_path: Path, captures: Callable[..., Capture]) -> None:
    _table_with_rows(db)
    offsets = tmp_path / "offsets.json"
    first = captures("first", "--offsets", str(offsets), "--stop-at-end")
    assert first.wait() == 0, first.stderr()
    db.autocommit(f"SELECT pg_drop_replication_slot('{SLOT}')")
    second = captures("second", "--offsets", str(offsets), "--stop-at-end")
    assert second.wait() == 2
    assert f"error: replication slot '{SLOT}' is gone" in second.stderr()
    assert "Traceback" not in second.stderr()
    assert second.lines() == []


# -- 7. --stop-at-end and --max-events ----------------------------------------------------------
@pytest.mark.slow
def test_stop_at_end_and_max_events(
        db: Database, tmp_path: Path, captures: Callable[..., Capture]) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text)",
               "INSERT INTO t SELECT g, 'snap' FROM generate_series(1, 300) g",
               "CREATE TABLE other (id int PRIMARY KEY)")
    offsets = tmp_path / "offsets.json"
    # 1: snapshot only, then end
    snap = captures("snap", "--offsets", str(offsets), "--stop-at-end")
    assert snap.wait() == 0, snap.stderr()
    assert [ln["value"]["op"] for ln in snap.lines()] == ["r"] * 300
    # 2: nothing new at all: ends at once with no output
    idle = captures("idle", "--offsets", str(offsets), "--stop-at-end")
    assert idle.wait() == 0, idle.stderr()
    assert idle.lines() == []
    # 3: only uncaptured tables changed since: still ends, with no output
    db.autocommit(*(f"INSERT INTO other VALUES ({i})" for i in range(200)))
    other = captures("other", "--offsets", str(offsets), "--stop-at-end")
    assert other.wait() == 0, other.stderr()
    assert other.lines() == []
    # 4: changes committed before the start are all delivered, then it exits
    db.autocommit(*(f"INSERT INTO t VALUES ({i}, 'c')" for i in range(301, 501)),
                  "DELETE FROM t WHERE id <= 5")
    before = saved_lsn(offsets)
    backlog = captures("backlog", "--offsets", str(offsets), "--stop-at-end")
    assert backlog.wait() == 0, backlog.stderr()
    lines = backlog.lines()
    assert len(lines) == 200 + 5 + 5  # creates, deletes, tombstones
    assert [ln["key"]["id"] for ln in lines if ln["value"] and ln["value"]["op"] == "c"] == \
        list(range(301, 501))
    assert saved_lsn(offsets) > before
    # 5: --max-events N: exactly N change events (tombstones are not events)
    db.autocommit(*(f"UPDATE t SET v = 'm' WHERE id = {i}" for i in range(6, 46)),
                  "DELETE FROM t WHERE id BETWEEN 46 AND 50")
    limited = captures("limited", "--offsets", str(offsets), "--max-events", "42")
    assert limited.wait() == 0, limited.stderr()
    changes = limited.changes()
    assert len(changes) == 42
    assert [ln["value"]["op"] for ln in changes] == ["u"] * 40 + ["d"] * 2
    # the rest arrives on the next run (at-least-once: the cut batch may come again)
    rest = captures("rest", "--offsets", str(offsets), "--stop-at-end")
    assert rest.wait() == 0, rest.stderr()
    rest_keys = {(ln["value"]["op"], ln["key"]["id"]) for ln in rest.changes()}
    assert {("d", i) for i in range(46, 51)} <= rest_keys
    # 6: --max-events on a snapshot
    fresh = tmp_path / "fresh.json"
    db.autocommit(f"SELECT pg_drop_replication_slot('{SLOT}')")
    few = captures("few", "--offsets", str(fresh), "--max-events", "7")
    assert few.wait() == 0, few.stderr()
    assert [ln["value"]["op"] for ln in few.lines()] == ["r"] * 7


@pytest.mark.slow
def test_keepalives_never_confirm_received_but_uncommitted_transactions(db: Database) -> None:
    """A transaction (D) that began before a committed one (E) and commits after another
    (C) must not let the slot be confirmed past C while C is delivered but uncommitted.

    (psycopg2's replication cursor did exactly that on server keepalives sent in the
    middle of D; a crash then lost C for good.)
    """
    db.execute("CREATE TABLE t (id serial PRIMARY KEY, tag text, pad text)")
    # The server asks a client it has not heard from for half of wal_sender_timeout
    # for a reply (a keepalive), and drops it after the whole.
    sender_timeout_s = 6
    dsn = db.dsn + f" options='-c wal_sender_timeout={sender_timeout_s}s'"
    conn = make_connector(dsn, "public.t", slot_name="sk", snapshot_mode="no_data",
                          heartbeat_interval_ms=0, status_interval_ms=1000,
                          max_batch_messages=10_000_000)
    conn.start(None)
    long_tx = sql_connection(db.dsn)
    try:
        drain(conn, db.insert_lsn())
        with long_tx.cursor() as cur:
            cur.execute("INSERT INTO t (tag, pad) SELECT 'D', repeat('p', 200) "
                        "FROM generate_series(1, 100000)")
        before_e = db.insert_lsn()
        db.autocommit("INSERT INTO t (tag) VALUES ('E')")
        # E is the only transaction committing after before_e that the stream can report
        # (D is still open, heartbeats are off): an offset past before_e is E's.
        e_offset = None
        deadline = time.monotonic() + 60
        while e_offset is None or e_offset["lsn"] <= before_e:
            assert time.monotonic() < deadline, "E was not delivered within 60 s"
            batch = conn.poll()
            e_offset = batch.offset or e_offset
        conn.commit(e_offset)
        e_lsn = e_offset["lsn"]
        # Polling sends the confirmation: the server knows E is committed.
        wait_for(lambda: poll_for(conn, 0.1, commit=False) is not None
                 and (slot_state(db, "sk") or (None, 0))[1] >= e_lsn, 20,
                 "E's confirmation to reach the server")
        db.autocommit("INSERT INTO t (tag) VALUES ('C')")
        c_commit = db.insert_lsn()
        long_tx.commit()

        # A slow consumer: it reads nothing until the server, streaming C and then D
        # (far more than the socket holds), has gone half of wal_sender_timeout without
        # a reply, and so has asked for one in the middle of D.
        def silent_long_enough() -> bool:
            w = walsender(db, "sk")
            assert w is not None and w.reply_time is not None, "no walsender for the slot"
            return time.time() - w.reply_time > sender_timeout_s / 2 + 0.5

        wait_for(silent_long_enough, 20, "the server to go without a reply")
        received: list[str] = []

        def read(then: Callable[[], bool]) -> bool:
            received.extend(e.after["tag"] for e in events(poll_for(conn, 0.1, commit=False))
                            if e.after is not None)
            return then()

        # C is received (and then D, the keepalive in it, ...); nothing more is committed.
        wait_for(lambda: read(lambda: "C" in received), 20, "C to be received")
        received_c = time.time()
        # Keep reading until the server has applied a status update sent after that:
        # any that confirmed what was received instead of what was committed (in reply
        # to the keepalive, or later) has moved the slot past C.
        wait_for(lambda: read(lambda: (w := walsender(db, "sk")) is not None
                              and (w.reply_time or 0) >= received_c), 20,
                 "a status update sent after C was received")
    finally:
        conn.stop()  # a crash as far as offsets go: nothing after E was committed
        long_tx.close()
    # Once the walsender has exited it has applied every status update it got.
    wait_for(lambda: (slot_state(db, "sk") or (1, 0))[0] is None, 20, "the slot's release")
    slot = (slot_state(db, "sk") or (None, 0))[1]
    assert slot == e_lsn < c_commit, \
        f"the slot was confirmed to {slot}, past E's {e_lsn}: C ({c_commit}) could be lost"
    restarted = make_connector(db.dsn, "public.t", slot_name="sk", snapshot_mode="no_data")
    restarted.start(e_offset)
    try:
        tags = [e.after["tag"] for e in events(drain(restarted, db.insert_lsn()))
                if e.after is not None]
    finally:
        restarted.stop()
    assert "C" in tags and tags.count("D") == 100_000


@pytest.mark.slow
def test_survives_a_server_restart() -> None:


    with PostgresCluster() as cluster:
        dsn = cluster.create_database("restart")
        with contextlib.closing(sql_connection(dsn)) as setup:
            setup.autocommit = True
            with setup.cursor() as cur:
                cur.execute("CREATE TABLE t (id int PRIMARY KEY)")
        # A fast shutdown waits for the walsender's client to confirm all it was sent,
        # or for wal_sender_timeout; this capture is not polling during the restart.
        conn = make_connector(dsn + " options='-c wal_sender_timeout=2s'", "public.t",
                              snapshot_mode="no_data", reconnect_backoff_ms=200)
        conn.start()

        def write(*ids: int) -> int:
            with contextlib.closing(sql_connection(dsn)) as c:
                c.autocommit = True
                with c.cursor() as cur:
                    for i in ids:
                        cur.execute("INSERT INTO t VALUES (%s)", (i,))
                    cur.execute("SELECT (pg_current_wal_insert_lsn() - '0/0')::bigint")
                    return int(cur.fetchone()[0])

        try:
            drain(conn, write())  # creates the slot
            got = events(drain(conn, write(1, 2)))
            cluster.restart()
            # A new column after the restart makes the connector read the catalog again.
            with contextlib.closing(sql_connection(dsn)) as c:
                c.autocommit = True
                with c.cursor() as cur:
                    cur.execute("ALTER TABLE t ADD COLUMN note text")
            got += events(drain(conn, write(3, 4)))
        finally:
            conn.stop()
    assert sorted({e.after["id"] for e in got if e.after}) == [1, 2, 3, 4]


@pytest.mark.slow
def test_a_stopped_server_does_not_hang_capture() -> None:
    """SIGSTOP: the kernel still answers TCP, so no RST and no keepalive failure; only
    silence says the server is gone. Capture must notice, try to reconnect and fail
    with a clear error instead of waiting forever, and a restart resumes."""
    with PostgresCluster() as cluster:
        dsn = cluster.create_database("stopped") + " connect_timeout=2"
        with contextlib.closing(sql_connection(dsn)) as setup:
            setup.autocommit = True
            with setup.cursor() as cur:
                cur.execute("CREATE TABLE t (id int PRIMARY KEY)")
                cur.execute("INSERT INTO t VALUES (1)")
        conn = make_connector(dsn, "public.t", snapshot_mode="no_data",
                              wal_receive_timeout_ms=2000, reconnect_max_attempts=1,
                              reconnect_backoff_ms=100)
        conn.start()
        stopped_at = 0.0
        try:
            drain(conn, cluster_insert_lsn(dsn))
            _signal_server(cluster, signal.SIGSTOP)
            stopped_at = time.monotonic()
            with pytest.raises(SourceUnavailableError):
                while time.monotonic() - stopped_at < 60:
                    conn.poll()
            # 2 s of silence, then one reconnect attempt of at most 2 s, and its retry.
            assert time.monotonic() - stopped_at < 30
        finally:
            _signal_server(cluster, signal.SIGCONT)
            conn.stop()
        with contextlib.closing(sql_connection(dsn)) as c:
            c.autocommit = True
            with c.cursor() as cur:
                cur.execute("INSERT INTO t VALUES (2)")
        # The walsender of the dead connection exits once it runs again; then a new
        # capture takes the slot and gets the row.
        again = make_connector(dsn, "public.t", snapshot_mode="no_data")
        again.start()
        try:
            got = events(drain(again, cluster_insert_lsn(dsn)))
        finally:
            again.stop()
        assert [e.after["id"] for e in got if e.after] == [2]


def cluster_insert_lsn(dsn: str) -> int:
    with contextlib.closing(sql_connection(dsn)) as c, c.cursor() as cur:
        cur.execute("SELECT (pg_current_wal_insert_lsn() - '0/0')::bigint")
        return int(cur.fetchone()[0])


@pytest.mark.slow
def test_a_stopped_server_does_not_hang_the_spark_source_s_queries() -> None:
    """The Spark source's connections (psycopg 3) bound every wait for the server."""
    from tidemark.source.postgres import wal_reads as wal  # noqa: PLC0415

    with PostgresCluster() as cluster:
        dsn = cluster.create_database("stopped_sql")
        conn = wal.connect(dsn, purpose="test", server_timeout_s=1.0)
        try:
            assert wal.flush_lsn(conn) > 0
            _signal_server(cluster, signal.SIGSTOP)
            started = time.monotonic()
            with pytest.raises(ServerTimeoutError, match="no answer from PostgreSQL"):
                wal.flush_lsn(conn)
            assert time.monotonic() - started < 10
        finally:
            _signal_server(cluster, signal.SIGCONT)
            conn.close()
        with contextlib.closing(wal.connect(dsn, purpose="test", server_timeout_s=1.0)) as c:
            assert wal.flush_lsn(c) > 0  # a slow answer is not cut short
            assert c.execute("SELECT pg_sleep(0.2), 1").fetchone() == ("", 1)


def test_a_keepalive_read_before_a_broken_connection_is_not_a_position_after_it(
        db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    """The connection breaks right after a read that held a transaction's messages and a
    keepalive past them: the messages are lost with the read and come again after the
    reconnect. The dead walsender's position must not pass for the new one's: an idle
    read then would end a bounded run (or hand on an offset) past the transaction."""
    from tidemark.source.postgres.replication import ReplicationStream  # noqa: PLC0415

    db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    first = make_connector(db.dsn, "public.t", snapshot_mode="no_data")  # the slot
    first.start()
    try:
        drain(first, db.insert_lsn())
    finally:
        first.stop()
    db.execute("INSERT INTO t VALUES (1)")
    end = db.insert_lsn()
    real = ReplicationStream.read_batch
    injected: list[str] = []

    def read_batch(self: ReplicationStream, limit: int, timeout_s: float) -> Any:
        if injected == ["broke"]:  # the new walsender is slow to send anything
            injected.append("slow start")
            return []
        batch = real(self, limit, timeout_s)
        if batch and not injected:
            deadline = time.monotonic() + 30
            while self.wal_end < end:  # a keepalive past the transaction arrives...
                assert time.monotonic() < deadline, "no keepalive past the insert"
                self.request_keepalive()
                real(self, limit, 0.2)
            injected.append("broke")  # ... and then the connection dies, read unused
            raise SourceUnavailableError("replication stream broke: injected")
        return batch

    monkeypatch.setattr(ReplicationStream, "read_batch", read_batch)
    second = make_connector(db.dsn, "public.t", snapshot_mode="no_data")
    second.start(stop_at_lsn=end)  # from the slot's confirmed position
    try:
        records = drain(second, timeout_s=30)
    finally:
        second.stop()
    assert injected == ["broke", "slow start"]
    assert [e.after for e in events(records)] == [{"id": 1}]
