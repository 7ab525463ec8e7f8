"""Incremental snapshots (DBLog watermarks, seed 001) in the PostgreSQL connector: the
seed's own example, writers racing the snapshot, signals good and bad, a kill and a
restart mid-snapshot, and --stop-at-end waiting for a signalled snapshot."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from capture_helpers import drain, events, make_connector
from conftest import Database
from tidemark.event import ChangeEvent, Op, SnapshotMarker
from tidemark.source.postgres import incremental_snapshot
from tidemark.source.postgres.reader import PostgresReader
from tidemark.testing.postgres import sql_connection
from waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.every_pg_version]

SIGNALS = "public.dbz_signal"


def _setup(db: Database, rows: int, *, table: str = "t") -> None:
    db.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, v text)",
               f"INSERT INTO {table} SELECT g, 'v' || g FROM generate_series(1, {rows}) g",
               "CREATE TABLE dbz_signal (id varchar(42) PRIMARY KEY, type varchar(32) NOT NULL,"
               " data varchar(2048) NULL)")


def _signal(db: Database, signal_type: str, data: Any, signal_id: str | None = None) -> None:
    text = data if isinstance(data, str) or data is None else json.dumps(data)
    db.execute("INSERT INTO dbz_signal VALUES (%s, %s, %s)",
               params=(signal_id or f"s{time.monotonic_ns()}", signal_type, text))


def _snapshot_rows(db: Database, tables: list[str]) -> dict[str, Any]:
    return {"data-collections": tables, "type": "incremental"}


def _collect(connector: PostgresReader, until: Any, timeout_s: float = 60) -> list[Any]:
    """Poll (committing offsets) until *until(records)* holds."""
    records: list[Any] = []
    deadline = time.monotonic() + timeout_s
    while not until(records):
        assert time.monotonic() < deadline, f"timed out; {len(records)} records"
        batch = connector.poll()
        records.extend(batch.records)
        if batch.offset is not None:
            connector.commit(batch.offset)
    return records


def _done(connector: PostgresReader) -> bool:
    """The stream runs and no incremental snapshot is left."""
    snapshots = connector.incremental_snapshot
    return snapshots is not None and not snapshots.active


def _reads(records: list[Any]) -> list[ChangeEvent]:
    return [e for e in events(records) if e.op is Op.READ]


def _rebuild(records: list[Any]) -> dict[int, str]:
    """The table as the events say it is: upserts for c/u/r, removal for d."""
    table: dict[int, str] = {}
    for e in events(records):
        if e.op is Op.DELETE:
            table.pop(int(e.before["id"]), None)
        elif e.op in (Op.CREATE, Op.UPDATE, Op.READ):
            table[int(e.after["id"])] = e.after["v"]
    return table


def _source(db: Database, table: str = "t") -> dict[int, str]:
    return {int(i): v for i, v in db.query(f"SELECT id, v FROM {table}")}


def test_a_signalled_snapshot_emits_every_row_as_incremental_reads(db: Database) -> None:
    _setup(db, 2500)
    connector = make_connector(db.dsn, "public.t", snapshot_mode="no_data",
                               signal_table=SIGNALS, incremental_snapshot_chunk_size=300)
    connector.start()
    drain(connector, db.insert_lsn())  # the slot exists: what comes next is streamed
    try:
        _signal(db, "execute-snapshot", _snapshot_rows(db, ["public.t"]))
        got = _collect(connector, lambda r: len(_reads(r)) >= 2500 and _done(connector))
    finally:
        connector.stop()
    reads = _reads(got)
    assert sorted(int(e.after["id"]) for e in reads) == list(range(1, 2501))
    assert {e.snapshot for e in reads} == {SnapshotMarker.INCREMENTAL}
    # Neither the signal row nor the watermarks reach the consumer.
    assert not [e for e in events(got) if e.op is not Op.READ]
    assert connector.stats.rows_scanned["public.t"] == 2500


def test_incremental_reads_have_the_columns_the_stream_has(db: Database) -> None:
    """A stored generated column is in the chunk's rows exactly when the stream carries
    it (PostgreSQL 18, tidemark's publication), so reads and changes look alike."""
    db.execute("CREATE TABLE g (id int PRIMARY KEY, a int, "
               "twice int GENERATED ALWAYS AS (a * 2) STORED)",
               "INSERT INTO g SELECT i, i FROM generate_series(1, 5) i",
               "CREATE TABLE dbz_signal (id varchar(42) PRIMARY KEY, type varchar(32) NOT NULL,"
               " data varchar(2048) NULL)")
    connector = make_connector(db.dsn, "public.g", snapshot_mode="no_data",
                               signal_table=SIGNALS, incremental_snapshot_chunk_size=2)
    connector.start()
    drain(connector, db.insert_lsn())
    try:
        _signal(db, "execute-snapshot", _snapshot_rows(db, ["public.g"]))
        db.execute("UPDATE g SET a = 10 WHERE id = 1")
        got = _collect(connector, lambda r: len(_reads(r)) >= 5 and _done(connector))
    finally:
        connector.stop()
    columns = {tuple(e.after) for e in events(got) if e.after}
    published = int(db.scalar("SHOW server_version_num")) >= 180000
    assert columns == {("id", "a", "twice") if published else ("id", "a")}
    if published:
        assert {e.after["id"]: e.after["twice"] for e in _reads(got) if e.after} == {
            1: 20, 2: 4, 3: 6, 4: 8, 5: 10}


def test_seed_001_buffer_example_k1_to_k6(db: Database,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """K2, K3, K4 exist. Before the window: K1 inserted, K2 updated, K3 deleted. The
    window's query reads K1, K2, K4 (and K5, inserted just after the window opened).
    Inside the window K4 is deleted and K5, K6 are inserted: K4's and K5's reads are
    dropped, the delete and inserts go downstream; at close K1 and K2 are emitted."""
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text)",
               "INSERT INTO t VALUES (2, 'k2'), (3, 'k3'), (4, 'k4')",
               "CREATE TABLE dbz_signal (id varchar(42) PRIMARY KEY, type varchar(32) NOT NULL,"
               " data varchar(2048) NULL)")
    real_send = incremental_snapshot.IncrementalSnapshot._send

    def send(cur: Any, statements: str) -> None:
        if "'close:" in statements:
            db.execute("DELETE FROM t WHERE id = 4")
            db.execute("INSERT INTO t VALUES (6, 'k6')")
        real_send(cur, statements)
        if "'open:" in statements:
            db.execute("INSERT INTO t VALUES (5, 'k5')")  # committed before the SELECT

    monkeypatch.setattr(incremental_snapshot.IncrementalSnapshot, "_send", staticmethod(send))
    connector = make_connector(db.dsn, "public.t", snapshot_mode="no_data",
                               signal_table=SIGNALS)
    connector.start()
    drain(connector, db.insert_lsn())  # the slot exists: what comes next is streamed
    try:
        db.execute("INSERT INTO t VALUES (1, 'k1')")
        db.execute("UPDATE t SET v = 'k2*' WHERE id = 2")
        db.execute("DELETE FROM t WHERE id = 3")
        _signal(db, "execute-snapshot", _snapshot_rows(db, ["public.t"]))
        got = _collect(connector, lambda r: len(_reads(r)) >= 2)
    finally:
        connector.stop()
    seen = [(e.op.value, int((e.after or e.before)["id"])) for e in events(got)]
    assert seen == [("c", 1), ("u", 2), ("d", 3), ("c", 5), ("d", 4), ("c", 6),
                    ("r", 1), ("r", 2)]
    assert _rebuild(got) | {} == {1: "k1", 2: "k2*", 5: "k5", 6: "k6"} == _source(db)


def _writer(dsn: str, stop: threading.Event, seed: int) -> None:
    """Random inserts, updates, deletes and key changes until *stop*."""
    rng = random.Random(seed)
    with contextlib.closing(sql_connection(dsn)) as conn:
        conn.autocommit = True
        with conn.cursor() as cur:
            while not stop.is_set():
                key = rng.randint(1, 3000)
                op = rng.random()
                if op < 0.4:
                    cur.execute("UPDATE t SET v = %s WHERE id = %s", (f"u{rng.random()}", key))
                elif op < 0.6:
                    cur.execute("DELETE FROM t WHERE id = %s", (key,))
                elif op < 0.8:
                    cur.execute("INSERT INTO t VALUES (%s, %s) ON CONFLICT (id) DO UPDATE "
                                "SET v = excluded.v", (key, f"i{rng.random()}"))
                else:
                    cur.execute("UPDATE t SET id = %s WHERE id = %s AND NOT EXISTS "
                                "(SELECT 1 FROM t WHERE id = %s)",
                                (key + 3000, key, key + 3000))


@pytest.mark.parametrize("seed", [1, 2])
def test_writers_racing_the_snapshot_leave_the_events_equal_to_the_table(
        db: Database, seed: int) -> None:
    _setup(db, 2000)
    connector = make_connector(db.dsn, "public.t", snapshot_mode="no_data",
                               signal_table=SIGNALS, incremental_snapshot_chunk_size=50)
    connector.start()
    drain(connector, db.insert_lsn())
    stop = threading.Event()
    writer = threading.Thread(target=_writer, args=(db.dsn, stop, seed))
    try:
        writer.start()
        _signal(db, "execute-snapshot", _snapshot_rows(db, ["public.t"]))
        got = _collect(connector, lambda r: len(_reads(r)) > 0 and _done(connector),
                       timeout_s=120)
        stop.set()
        writer.join(30)
        end = db.insert_lsn()
        got += _collect(connector, lambda r: connector.stats.position_lsn >= end)
    finally:
        stop.set()
        connector.stop()
    assert len(_reads(got)) > 100
    assert _rebuild(got) == _source(db)


def test_bad_signals_are_logged_and_the_stream_goes_on(
        db: Database, caplog: pytest.LogCaptureFixture) -> None:
    _setup(db, 10)
    db.execute("CREATE TABLE keyless (id int, v text)",
               "ALTER TABLE keyless REPLICA IDENTITY FULL")
    connector = make_connector(db.dsn, "public.t", "public.keyless", snapshot_mode="no_data",
                               signal_table=SIGNALS)
    connector.start()
    drain(connector, db.insert_lsn())  # the slot exists: what comes next is streamed
    try:
        _signal(db, "execute-snapshot-now", {"data-collections": ["public.t"]}, "bad-type")
        _signal(db, "execute-snapshot", "{not json", "bad-json")
        _signal(db, "execute-snapshot", _snapshot_rows(db, ["public.nope"]), "unknown-table")
        _signal(db, "execute-snapshot", _snapshot_rows(db, ["public.keyless"]), "keyless")
        _signal(db, "execute-snapshot",
                _snapshot_rows(db, ["public.t; DROP TABLE t --"]), "injection-1")
        _signal(db, "execute-snapshot", _snapshot_rows(db, ['public."t"']), "injection-2")
        db.execute("INSERT INTO t VALUES (100, 'after the bad signals')")
        got = _collect(connector, lambda r: any(
            e.after and e.after["id"] == 100 for e in events(r)))
    finally:
        connector.stop()
    assert not _reads(got)
    for signal_id in ("bad-type", "bad-json", "injection-1", "injection-2"):
        assert signal_id in caplog.text, signal_id
    assert "public.nope is not captured" in caplog.text
    assert "public.keyless has no primary key" in caplog.text
    assert db.scalar("SELECT count(*) FROM t") == 11  # nothing was dropped


def _capture(db: Database, offsets: Path, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tidemark", "capture", "--table", "public.t",
         "--slot", f"s_{db.name}", "--snapshot-mode", "no_data", "--offsets", str(offsets),
         # Pinned: the restart test counts on chunks of 100 rows.
         "--signal-table", SIGNALS, "--incremental-snapshot-chunk-size", "100",
         "--incremental-snapshot-chunk-fixed", "--offset-flush-interval-ms", "0", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**os.environ, "TIDEMARK_DSN": db.dsn})


def _lines(data: bytes) -> list[dict[str, Any]]:
    return [json.loads(line)["value"] for line in data.splitlines() if line.strip()]


@pytest.mark.slow
def test_sigkill_mid_snapshot_then_restart_continues_from_the_last_chunk(
        db: Database, tmp_path: Path) -> None:
    _setup(db, 20_000)
    offsets = tmp_path / "offsets.json"
    first = _capture(db, offsets, "--stop-at-end")  # creates the slot
    assert first.wait(60) == 0, first.stderr.read() if first.stderr else ""
    _signal(db, "execute-snapshot", _snapshot_rows(db, ["public.t"]))
    proc = _capture(db, offsets)
    assert proc.stdout is not None
    before = [proc.stdout.readline() for _ in range(5_000)]  # a quarter of the table
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    saved = json.loads(offsets.read_text())
    (offset,) = saved.values()
    state = offset["incremental_snapshot"]
    assert state["tables"][0]["last_key"] is not None  # it had got somewhere
    status = subprocess.run(
        [sys.executable, "-m", "tidemark", "status", "--slot", f"s_{db.name}",
         "--offsets", str(offsets), "--json"], capture_output=True, text=True, timeout=60,
        env={**os.environ, "TIDEMARK_DSN": db.dsn}, check=False)
    incremental = json.loads(status.stdout)["snapshot"]["incremental"]
    assert incremental["current"] == "public.t"
    assert incremental["last_key"] == state["tables"][0]["last_key"]
    db.execute("UPDATE t SET v = 'changed after the kill' WHERE id IN (1, 19999)")
    again = _capture(db, offsets, "--stop-at-end")
    out, err = again.communicate(timeout=120)
    assert again.returncode == 0, err.decode()
    after = [v for v in _lines(out) if v]
    first_run = [v for v in _lines(b"".join(line for line in before if line.endswith(b"\n")))
                 if v]
    reads_after = [v for v in after if v["op"] == "r"]
    # Continued from the last chunk, not from the start of the table.
    assert 0 < len(reads_after) < 20_000 - 4_000
    table: dict[int, str] = {}
    for value in first_run + after:
        row = value["after"] or value["before"]
        if value["op"] == "d":
            table.pop(row["id"], None)
        else:
            table[row["id"]] = row["v"]
    assert table == _source(db)


@pytest.mark.slow
def test_stop_at_end_waits_for_a_snapshot_signalled_before_the_start(
        db: Database, tmp_path: Path) -> None:
    _setup(db, 3000)
    offsets = tmp_path / "offsets.json"
    first = _capture(db, offsets, "--stop-at-end")
    assert first.wait(60) == 0
    _signal(db, "execute-snapshot", _snapshot_rows(db, ["public.t"]))
    run = _capture(db, offsets, "--stop-at-end")
    out, err = run.communicate(timeout=120)
    assert run.returncode == 0, err.decode()
    reads = [v for v in _lines(out) if v and v["op"] == "r"]
    assert sorted(v["after"]["id"] for v in reads) == list(range(1, 3001))
    assert {v["source"]["snapshot"] for v in reads} == {"incremental"}


def _in_window(monkeypatch: pytest.MonkeyPatch, db: Database, *statements: str) -> None:
    """Run *statements* inside the first window (after its SELECT, before its close)."""
    real_send = incremental_snapshot.IncrementalSnapshot._send
    done: list[bool] = []

    def send(cur: Any, sent: str) -> None:
        if "'close:" in sent and not done:
            done.append(True)
            db.execute(*statements)
        real_send(cur, sent)

    monkeypatch.setattr(incremental_snapshot.IncrementalSnapshot, "_send", staticmethod(send))


def _snapshot_with(db: Database, monkeypatch: pytest.MonkeyPatch, statements: tuple[str, ...],
                   signal_data: dict[str, Any], *tables: str, **settings: Any) -> list[Any]:
    _in_window(monkeypatch, db, *statements)
    connector = make_connector(db.dsn, *(tables or ("public.t",)), snapshot_mode="no_data",
                               signal_table=SIGNALS, incremental_snapshot_chunk_size=100,
                               **settings)
    connector.start()
    drain(connector, db.insert_lsn())
    try:
        _signal(db, "execute-snapshot", signal_data)
        got = _collect(connector, lambda r: _done(connector) and bool(r))
        end = db.insert_lsn()
        return got + _collect(connector, lambda r: connector.stats.position_lsn >= end)
    finally:
        connector.stop()


def test_a_stop_signal_in_the_same_batch_as_the_close_mark(
        db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    _setup(db, 300)
    stop = json.dumps({"data-collections": ["public.t"], "type": "incremental"})
    got = _snapshot_with(db, monkeypatch, (
        f"INSERT INTO dbz_signal VALUES ('stop-1', 'stop-snapshot', '{stop}')",
        "UPDATE t SET v = 'after the stop' WHERE id = 1"),
        _snapshot_rows(db, ["public.t"]))
    assert not _reads(got)  # the stopped window emitted nothing, and nothing crashed
    assert [e.after["v"] for e in events(got) if e.op is Op.UPDATE] == ["after the stop"]


def test_a_surrogate_key_chunks_while_deletes_match_by_primary_key(
        db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    _setup(db, 250)
    db.execute("ALTER TABLE t ADD COLUMN sk int UNIQUE", "UPDATE t SET sk = 1000 - id")
    got = _snapshot_with(db, monkeypatch, (
        "DELETE FROM t WHERE id = 249", "UPDATE t SET v = 'changed' WHERE id = 248"),
        {**_snapshot_rows(db, ["public.t"]), "surrogate-key": "sk"})
    reads = _reads(got)
    # 249 deleted and 248 changed inside the first window: neither is read (sk runs
    # opposite to id, so they are in the first chunk); the streamed changes stand.
    assert len(reads) == 248 and {249, 248}.isdisjoint(e.after["id"] for e in reads)
    assert reads[0].schema is not None and reads[0].schema.key_names == ("id",)  # record key
    assert _rebuild(got) == _source(db)


def test_a_skipped_update_inside_a_window_leaves_the_row_in_the_chunk(
        db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    """skipped_operations = "u": an update of a row of the open chunk is not streamed,
    so it must not take the row out of the chunk either (Debezium's dispatcher hands a
    skipped operation to the incremental snapshot neither): every row comes as a read."""
    _setup(db, 150)
    got = _snapshot_with(db, monkeypatch, (
        "UPDATE t SET v = 'changed' WHERE id IN (2, 3, 99)",),
        _snapshot_rows(db, ["public.t"]), skipped_operations="u")
    assert sorted(e.after["id"] for e in _reads(got)) == list(range(1, 151))
    assert not [e for e in events(got) if e.op is Op.UPDATE]


def test_a_column_added_inside_a_window_reads_the_chunk_again(
        db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    _setup(db, 150)
    got = _snapshot_with(db, monkeypatch, (
        "ALTER TABLE t ADD COLUMN note text DEFAULT 'n'",
        "UPDATE t SET v = 'changed', note = 'x' WHERE id = 2"),
        _snapshot_rows(db, ["public.t"]))
    assert _rebuild(got) == _source(db)
    assert any(e.after.get("note") == "n" for e in _reads(got))  # read again, new layout


def test_rows_whose_surrogate_key_is_null_do_not_stop_the_snapshot(
        db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    db.execute("CREATE TABLE k (id int, v text)", "ALTER TABLE k REPLICA IDENTITY FULL",
               "INSERT INTO k SELECT g, 'v' FROM generate_series(1, 120) g",
               "INSERT INTO k VALUES (NULL, 'no key')",
               "CREATE TABLE dbz_signal (id varchar(42) PRIMARY KEY, type varchar(32) NOT NULL,"
               " data varchar(2048) NULL)")
    got = _snapshot_with(db, monkeypatch, (), {**_snapshot_rows(db, ["public.k"]),
                                               "surrogate-key": "id"}, "public.k")
    assert sorted(e.after["id"] for e in _reads(got)) == list(range(1, 121))


@contextlib.contextmanager
def _commit_held(db: Database, statement: str) -> Any:
    """*statement* committed by a transaction held between its commit record and its
    end: it waits for a synchronous standby that never answers. Its change is in the
    WAL (and streamed), but new snapshots do not see it yet. Released on exit."""
    db.autocommit("ALTER SYSTEM SET synchronous_standby_names = 'tidemark_never_there'",
                  "SELECT pg_reload_conf()")
    held: list[tuple[Any, threading.Thread]] = []

    def hold(sql: str) -> bool:
        """Commit *sql* in a thread; True once it waits, False if it committed (the
        server has not taken the new setting yet)."""
        conn = sql_connection(db.dsn)
        thread = threading.Thread(target=_run_synchronous, args=(conn, sql))
        held.append((conn, thread))
        pid = conn.info.backend_pid
        thread.start()
        wait_for(lambda: not thread.is_alive() or db.scalar(
            "SELECT wait_event FROM pg_stat_activity WHERE pid = %s", (pid,)) == "SyncRep",
            30, "a synchronous commit to wait or end")
        if thread.is_alive():
            return True
        held.pop()
        conn.close()
        return False

    try:
        # The checkpointer takes the setting a moment after the reload: probe with a
        # write to an uncaptured table until one is held, then hold the real one.
        db.execute("CREATE TABLE held_probe (i int)")
        wait_for(lambda: hold("INSERT INTO held_probe VALUES (1)"), 30,
                 "synchronous commits to wait")
        assert hold(statement), "the statement's commit was not held"
        yield
    finally:
        db.autocommit("ALTER SYSTEM RESET synchronous_standby_names",
                      "SELECT pg_reload_conf()")
        for conn, thread in held:
            thread.join(30)
            conn.close()


def _run_synchronous(conn: Any, statement: str) -> None:
    with conn.cursor() as cur:
        cur.execute("SET synchronous_commit = on")
        cur.execute(statement)
    conn.commit()


def test_a_change_committed_before_the_window_but_not_yet_visible_is_not_overwritten(
        db: Database, caplog: pytest.LogCaptureFixture) -> None:
    """A transaction whose commit was streamed before the snapshot began, but that is
    still finishing its commit when the chunk is read: the chunk waits for it instead
    of handing on the row as it was before that change."""
    caplog.set_level(logging.INFO, logger=incremental_snapshot.__name__)
    _setup(db, 300)
    connector = make_connector(db.dsn, "public.t", snapshot_mode="no_data",
                               signal_table=SIGNALS, incremental_snapshot_chunk_size=100)
    connector.start()
    drain(connector, db.insert_lsn())
    got: list[Any] = []
    try:
        with _commit_held(db, "UPDATE t SET v = 'new' WHERE id = 5"):
            got += _collect(connector, lambda r: any(
                e.op is Op.UPDATE and e.after["id"] == 5 for e in events(r)))
            _signal(db, "execute-snapshot", _snapshot_rows(db, ["public.t"]))
            # Either the stale row comes (the defect), or the chunk is held back.
            got += _collect(connector, lambda r: any(e.after["id"] == 5 for e in _reads(r))
                            or "not visible to the chunk's SELECT" in caplog.text)
        got += _collect(connector, lambda r: _done(connector) and len(_reads(got + r)) >= 300)
    finally:
        connector.stop()
    assert _rebuild(got) == _source(db)
    assert [e.after["v"] for e in _reads(got) if e.after["id"] == 5] == ["new"]


def test_a_change_streamed_before_the_opening_mark_but_invisible_leaves_the_chunk(
        db: Database, caplog: pytest.LogCaptureFixture) -> None:
    """The same, when the chunk is read before the stream brings that transaction (a
    restart mid-snapshot reads the next chunks at once): its change comes before the
    window opens and takes its key out of the chunk, as a change inside the window does."""
    caplog.set_level(logging.INFO, logger=incremental_snapshot.__name__)
    _setup(db, 300)
    first = make_connector(db.dsn, "public.t", snapshot_mode="no_data",
                           signal_table=SIGNALS, incremental_snapshot_chunk_size=100)
    first.start()
    drain(first, db.insert_lsn())
    offset: Any = None
    try:
        _signal(db, "execute-snapshot", _snapshot_rows(db, ["public.t"]))
        deadline = time.monotonic() + 60
        while offset is None or offset["incremental_snapshot"]["tables"][0]["last_key"] is None:
            assert time.monotonic() < deadline, "the first chunk was not handed on"
            batch = first.poll()
            if batch.offset is not None and "incremental_snapshot" in batch.offset:
                offset = batch.offset  # not committed: the slot stays before the signal
    finally:
        first.stop()
    assert offset["incremental_snapshot"]["tables"][0]["last_key"] == ["100"]
    second = make_connector(db.dsn, "public.t", snapshot_mode="no_data",
                            signal_table=SIGNALS, incremental_snapshot_chunk_size=100)
    got: list[Any] = []
    try:
        with _commit_held(db, "UPDATE t SET v = 'new' WHERE id = 150"):
            second.start(offset)  # reads the next chunks before streaming anything
            # The window holding 150 closes (150 left out of it: its update came
            # first), or is read again.
            got += _collect(second, lambda r: any(150 <= e.after["id"] <= 200
                                                  for e in _reads(r))
                            or "was not visible to the chunk's SELECT" in caplog.text)
        got += _collect(second, lambda r: _done(second) and any(
            e.after["id"] == 300 for e in _reads(got + r)))
        end = db.insert_lsn()
        got += _collect(second, lambda r: second.stats.position_lsn >= end)
    finally:
        second.stop()
    updates = [e for e in events(got) if e.op is Op.UPDATE and e.after["id"] == 150]
    assert [e.after["v"] for e in updates] == ["new"]
    after_update = events(got)[events(got).index(updates[0]):]
    assert [e.after["v"] for e in _reads(after_update) if e.after["id"] == 150] in ([], ["new"])
    assert {int(e.after["id"]) for e in _reads(got)} >= set(range(101, 301)) - {150}
