"""Incremental snapshots of a MariaDB source, on a real server: chunks handed on at their
read view's binlog position, in key order for every kind of key, under concurrent
writes, across restarts, and driven by every snapshot signal."""

from __future__ import annotations

import json
import logging
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import MariaDatabase
from mariadb_helpers import _capture_process, _ids, _lines, _wait_for_offsets
from tidemark import send_signal
from tidemark.event import ChangeEvent, Op, Record, SnapshotMarker
from tidemark.offsets.store import Offset
from tidemark.source.batch import SourceBatch
from tidemark.source.mariadb.config import MariaDbSourceConfig
from tidemark.source.mariadb.reader import MariaDbReader
from tidemark.status.mariadb import capture_status
from waiting import wait_for

SIGNAL_DDL = ("CREATE TABLE sig (id VARCHAR(42) PRIMARY KEY, type VARCHAR(32) NOT NULL, "
              "data VARCHAR(2048))")


def _config(mdb: MariaDatabase, **settings: Any) -> MariaDbSourceConfig:
    return MariaDbSourceConfig.from_mapping({
        "dsn": mdb.dsn, "snapshot_mode": "no_data", "signal_table": f"{mdb.name}.sig",
        **settings})


def _capture(config: MariaDbSourceConfig, offset: Offset | None) -> list[SourceBatch]:
    """Every batch up to the binlog's end now (a bounded capture)."""
    connector = MariaDbReader(config)
    batches: list[SourceBatch] = []
    try:
        connector.start(offset, stop_at_end=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            batch = connector.poll()
            batches.append(batch)
            if batch.finished:
                return batches
        raise AssertionError("the capture did not reach the binlog's end in 60 s")
    finally:
        connector.stop()


def _events(batches: list[SourceBatch]) -> list[ChangeEvent]:
    return [r for b in batches for r in b.records if isinstance(r, ChangeEvent)]


def _last_offset(batches: list[SourceBatch], start: Offset | None) -> Offset | None:
    offsets = [b.offset for b in batches if b.offset is not None]
    return offsets[-1] if offsets else start


def _replay(events: list[Record], key: tuple[str, ...],
            into: dict[tuple[Any, ...], dict[str, Any]] | None = None
            ) -> dict[tuple[Any, ...], dict[str, Any]]:
    """The table a consumer applying *events* in order by key ends up with."""
    rows = {} if into is None else into
    for event in events:
        if not isinstance(event, ChangeEvent):
            continue
        if event.op is Op.DELETE:
            assert event.before is not None
            rows.pop(tuple(event.before[k] for k in key), None)
        elif event.after is not None:
            rows[tuple(event.after[k] for k in key)] = dict(event.after)
    return rows


def _table(mdb: MariaDatabase, name: str, key: tuple[str, ...]
           ) -> dict[tuple[Any, ...], dict[str, Any]]:
    """The source table as the capture's rows have it (read by a fresh snapshot)."""
    config = MariaDbSourceConfig.from_mapping({
        "dsn": mdb.dsn, "snapshot_mode": "initial_only",
        "table_include_list": [f"{mdb.name}\\.{name}"]})
    return _replay(_events(_capture(config, None)), key)


def test_chunks_come_at_their_read_view_between_the_streams_transactions(
        mdb: MariaDatabase) -> None:
    mdb.execute("CREATE TABLE t (id INT PRIMARY KEY, v INT)", "CREATE TABLE other (id INT "
                "PRIMARY KEY)", SIGNAL_DDL,
                "INSERT INTO t VALUES " + ",".join(f"({i}, 0)" for i in range(1, 26)))
    config = _config(mdb, incremental_snapshot_chunk_size=10,
                     table_exclude_list=[f"{mdb.name}\\.other"])
    offset = _last_offset(_capture(config, None), None)
    send_signal(mdb.dsn, f"{mdb.name}.sig", "execute-snapshot",
                {"data-collections": [f"{mdb.name}.t", f"{mdb.name}.other"]})
    mdb.execute("UPDATE t SET v = 1 WHERE id = 3")
    mdb.execute("DELETE FROM t WHERE id = 4")
    batches = _capture(config, offset)
    seen = [(e.op.value, (e.after or e.before or {}).get("id"), e.snapshot)
            for e in _events(batches)]
    # The read view of the first chunk is past the update and the delete: they come
    # first, and the chunk holds their result (no row 4, row 3 with v = 1).
    assert seen[:2] == [("u", 3, SnapshotMarker.FALSE), ("d", 4, SnapshotMarker.FALSE)], seen
    reads = [e for e in _events(batches) if e.op is Op.READ]
    assert [e.after["id"] for e in reads if e.after] == [i for i in range(1, 26) if i != 4]
    assert {e.snapshot for e in reads} == {SnapshotMarker.INCREMENTAL}
    assert reads[2].after == {"id": 3, "v": 1}
    # No event for the signal row or the excluded table; the state is gone once done.
    assert {e.table.table for e in _events(batches)} == {"t"}
    final = _last_offset(batches, offset)
    assert final is not None and "incremental_snapshot" not in final
    # Chunks move the offset: each batch of reads carries the state after it.
    states = [b.offset.get("incremental_snapshot") for b in batches
              if b.offset is not None and any(isinstance(r, ChangeEvent)
                                               and r.op is Op.READ for r in b.records)]
    assert states[0] is not None and states[0]["tables"][0]["last_key"] == [11]


def test_skipped_updates_leave_every_row_in_the_chunks(mdb: MariaDatabase) -> None:
    """skipped_operations = "u" while updates change rows the chunks read: every row
    still comes as a read (MariaDB's chunks take nothing out for the stream's changes:
    a chunk is handed on at its read view, so a skipped update cannot lose a row, as it
    could in PostgreSQL's watermark window)."""
    mdb.execute("CREATE TABLE t (id INT PRIMARY KEY, v INT)", SIGNAL_DDL,
                "INSERT INTO t VALUES " + ",".join(f"({i}, 0)" for i in range(1, 61)))
    config = _config(mdb, incremental_snapshot_chunk_size=10, skipped_operations="u")
    offset = _last_offset(_capture(config, None), None)
    send_signal(mdb.dsn, f"{mdb.name}.sig", "execute-snapshot",
                {"data-collections": [f"{mdb.name}.t"]})
    for i in range(1, 61, 3):
        mdb.execute(f"UPDATE t SET v = v + 1 WHERE id = {i}")
    events = _events(_capture(config, offset))
    assert sorted(e.after["id"] for e in events if e.op is Op.READ and e.after) == \
        list(range(1, 61))
    assert not [e for e in events if e.op is Op.UPDATE]


@pytest.mark.parametrize(("ddl", "key", "values"), [
    ("k1 VARCHAR(10), k2 INT, PRIMARY KEY (k1, k2)", ("k1", "k2"),
     [f"('{c}', {n})" for c in "bZa_" for n in (1, 2, 10)]),
    ("k DECIMAL(30,10) PRIMARY KEY", ("k",),
     ["(1.5)", "(-2)", "(99999999999999999999.0000000001)", "(99999999999999999999.0000000002)",
      "(0)", "(0.0000000001)"]),
    ("k ENUM('zeta','alpha','mid') PRIMARY KEY", ("k",), ["('zeta')", "('alpha')", "('mid')"]),
    ("k VARBINARY(8) PRIMARY KEY", ("k",), ["(x'00')", "(x'ff00')", "(x'25')", "(x'0001')"]),
    ("k DATETIME(6) PRIMARY KEY", ("k",),
     ["('2024-01-01 00:00:00.000001')", "('2024-01-01 00:00:00')", "('1999-12-31 23:59:59')"]),
    ("k BIGINT UNSIGNED PRIMARY KEY", ("k",),
     ["(18446744073709551615)", "(18446744073709551614)", "(9007199254740993)",
      "(9007199254740992)", "(1)"]),
], ids=["composite-ci-collation", "decimal", "enum", "binary", "datetime", "bigint-unsigned"])
def test_every_row_is_read_once_whatever_the_key(mdb: MariaDatabase, ddl: str,
                                                  key: tuple[str, ...],
                                                  values: list[str]) -> None:
    """Chunks of two rows page through the key in the server's own order (collations,
    ENUM by member number, bytes, wide decimals and unsigned 64-bit keys), with an
    additional condition."""
    mdb.execute(f"CREATE TABLE `kt` ({ddl}, note VARCHAR(5) DEFAULT 'n')", SIGNAL_DDL,
                f"INSERT INTO `kt` ({', '.join(key)}) VALUES {', '.join(values)}")
    config = _config(mdb, incremental_snapshot_chunk_size=2)
    offset = _last_offset(_capture(config, None), None)
    mdb.execute(f"UPDATE kt SET note = 'skip' ORDER BY {', '.join(key)} DESC LIMIT 1")
    # A condition with a % in it: raw SQL, passed through to the server as written.
    send_signal(mdb.dsn, f"{mdb.name}.sig", "execute-snapshot",
                {"data-collections": [f"{mdb.name}.kt"], "additional-conditions": [
                    {"data-collection": f"{mdb.name}.kt", "filter": "note LIKE 'n%'"}]})
    reads = [e for e in _events(_capture(config, offset)) if e.op is Op.READ]
    got = [tuple(e.after[k] for k in key) for e in reads if e.after]
    assert len(got) == len(values) - 1 == len(set(got))
    assert _replay(reads, key) == {k: row for k, row in _table(mdb, "kt", key).items()
                                   if row["note"] != "skip"}


class _Writer(threading.Thread):
    """Random small transactions (inserts, updates, deletes, key changes) on t."""

    def __init__(self, mdb: MariaDatabase, seed: int) -> None:
        super().__init__(daemon=True)
        self.mdb, self.rng = mdb, random.Random(seed)
        self.stop = threading.Event()
        self.transactions = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        conn = self.mdb.server.connect(self.mdb.name)
        try:
            with conn.cursor() as cur:
                while not self.stop.is_set():
                    cur.execute("BEGIN")
                    for _ in range(self.rng.randint(1, 4)):
                        i = self.rng.randint(1, 3000)
                        roll = self.rng.random()
                        if roll < 0.4:
                            cur.execute("UPDATE t SET v = v + 1 WHERE id = %s", (i,))
                        elif roll < 0.6:
                            cur.execute("DELETE FROM t WHERE id = %s", (i,))
                        elif roll < 0.7:
                            cur.execute("UPDATE IGNORE t SET id = id + 5000 WHERE id = %s", (i,))
                        else:
                            cur.execute("INSERT INTO t VALUES (%s, 0) ON DUPLICATE KEY "
                                        "UPDATE v = v - 1", (i,))
                    cur.execute("COMMIT")
                    self.transactions += 1
        except BaseException as err:  # reported by the test
            self.error = err
        finally:
            conn.close()


def test_concurrent_writes_during_the_snapshot_leave_the_replica_equal_to_the_table(
        mdb: MariaDatabase) -> None:
    """The DBLog property: a consumer applying the stream and the chunks in the order
    they come ends up with the table, while writers change rows the chunks read."""
    mdb.execute("CREATE TABLE t (id INT PRIMARY KEY, v INT NOT NULL)", SIGNAL_DDL,
                "INSERT INTO t VALUES " + ",".join(f"({i}, 0)" for i in range(1, 3001)))
    initial = MariaDbSourceConfig.from_mapping({
        "dsn": mdb.dsn, "signal_table": f"{mdb.name}.sig", "snapshot_mode": "initial"})
    batches = _capture(initial, None)
    replica = _replay(_events(batches), ("id",))
    offset = _last_offset(batches, None)
    # The replica drifts (as a target someone edited): only the snapshot repairs it.
    for key in list(replica)[::7]:
        replica[key]["v"] = -99
    config = MariaDbSourceConfig.from_mapping({
        "dsn": mdb.dsn, "signal_table": f"{mdb.name}.sig", "snapshot_mode": "no_data",
        "incremental_snapshot_chunk_size": 97})
    connector = MariaDbReader(config)
    writers = [_Writer(mdb, seed) for seed in (1, 2)]
    reads = 0
    try:
        connector.start(offset)
        for writer in writers:
            writer.start()
        wait_for(lambda: all(w.transactions > 20 for w in writers), timeout_s=30,
                 what="the writers to get going")
        send_signal(mdb.dsn, f"{mdb.name}.sig", "execute-snapshot",
                    {"data-collections": [f"{mdb.name}.t"]})
        deadline = time.monotonic() + 120
        snapshot_done = False
        while not snapshot_done:
            assert time.monotonic() < deadline, "the snapshot did not finish in 120 s"
            batch = connector.poll()
            _replay(batch.records, ("id",), replica)
            reads += sum(1 for r in batch.records
                         if isinstance(r, ChangeEvent) and r.op is Op.READ)
            snapshot_done = reads > 0 and batch.offset is not None \
                and "incremental_snapshot" not in batch.offset
        for writer in writers:
            writer.stop.set()
            writer.join(10)
            assert writer.error is None, writer.error
        # Drain until the stream has passed the writers' last transactions.
        target = _table(mdb, "t", ("id",))

        def caught_up() -> bool:
            _replay(connector.poll().records, ("id",), replica)
            return replica == target
        wait_for(caught_up, timeout_s=60, what="the replica to equal the table")
    finally:
        for writer in writers:
            writer.stop.set()
        connector.stop()
    assert sum(w.transactions for w in writers) > 100
    # The drifted rows that still exist are right only because chunks re-read them;
    # the rest of the table went through too (less what the writers deleted).
    assert reads >= 2000


def test_a_restart_continues_after_the_last_chunk_saved(mdb: MariaDatabase,
                                                        tmp_path: Path) -> None:
    mdb.execute("CREATE TABLE t (id INT PRIMARY KEY, v INT)", SIGNAL_DDL,
                "INSERT INTO t VALUES " + ",".join(f"({i}, 0)" for i in range(1, 101)))
    config = _config(mdb, incremental_snapshot_chunk_size=10, max_batch_events=10)
    offset = _last_offset(_capture(config, None), None)
    send_signal(mdb.dsn, f"{mdb.name}.sig", "execute-snapshot",
                {"data-collections": [f"{mdb.name}.t"]})
    connector = MariaDbReader(config)
    first: list[ChangeEvent] = []
    saved: Offset | None = None
    try:
        connector.start(offset)
        while len(first) < 30:  # a crash after three chunks were saved
            batch = connector.poll()
            first += [r for r in batch.records if isinstance(r, ChangeEvent)]
            if batch.offset is not None:
                saved = batch.offset
    finally:
        connector.stop()
    assert saved is not None and saved["incremental_snapshot"]["tables"][0]["last_key"] \
        == [first[-1].after["id"] if first[-1].after else None]
    offsets_file = tmp_path / "offsets.json"
    offsets_file.write_text(json.dumps({connector.partition: saved}))
    status = capture_status(mdb.dsn, str(offsets_file))["offsets"]["incremental_snapshot"]
    assert status["current"] == f"{mdb.name}.t" and status["last_key"] == [len(first)]
    mdb.execute("UPDATE t SET v = 7 WHERE id IN (5, 95)")
    rest = _events(_capture(config, saved))
    ids = [e.after["id"] for e in rest if e.op is Op.READ and e.after]
    assert ids == list(range(len(first) + 1, 101))  # on from the next key, nothing twice
    assert _replay([*first, *rest], ("id",)) == _table(mdb, "t", ("id",))


def test_pause_resume_and_stop_signals(mdb: MariaDatabase,
                                       caplog: pytest.LogCaptureFixture) -> None:
    mdb.execute("CREATE TABLE a (id INT PRIMARY KEY)", "CREATE TABLE nokey (v INT)",
                "CREATE TABLE b (id INT PRIMARY KEY)", SIGNAL_DDL,
                "INSERT INTO a VALUES " + ",".join(f"({i})" for i in range(1, 51)),
                "INSERT INTO b VALUES " + ",".join(f"({i})" for i in range(1, 51)),
                "INSERT INTO nokey VALUES (1), (1)")
    config = _config(mdb, incremental_snapshot_chunk_size=5)
    offset = _last_offset(_capture(config, None), None)
    sig = f"{mdb.name}.sig"
    mdb.execute(  # one transaction: the snapshot is paused before any chunk is read
        "INSERT INTO sig VALUES ('1', 'execute-snapshot', '{\"data-collections\": "
        f"[\"{mdb.name}.a\", \"{mdb.name}.nokey\", \"{mdb.name}.b\"]}}')",
        "INSERT INTO sig VALUES ('2', 'pause-snapshot', NULL)")
    with caplog.at_level(logging.INFO, logger="tidemark"):
        batches = _capture(config, offset)
    assert not [e for e in _events(batches) if e.op is Op.READ]
    paused = _last_offset(batches, offset)
    assert paused is not None and paused["incremental_snapshot"]["paused"] is True
    send_signal(mdb.dsn, sig, "stop-snapshot", {"data-collections": [f"{mdb.name}.a"]})
    send_signal(mdb.dsn, sig, "resume-snapshot", None)
    with caplog.at_level(logging.INFO, logger="tidemark"):
        batches = _capture(config, paused)
    reads = [e for e in _events(batches) if e.op is Op.READ]
    assert {e.table.table for e in reads} == {"b"} and len(reads) == 50
    assert "nokey skipped: the table has no primary key" in caplog.text
    final = _last_offset(batches, paused)
    assert final is not None and "incremental_snapshot" not in final


def test_a_sigkilled_capture_goes_on_with_the_snapshot_where_its_offset_was(
        mdb: MariaDatabase, tmp_path: Path,
        kill_on_exit: list[subprocess.Popen[bytes]]) -> None:
    mdb.execute("CREATE TABLE t (id INT PRIMARY KEY, pad VARCHAR(200))", SIGNAL_DDL,
                "INSERT INTO t SELECT seq, REPEAT('x', 200) FROM seq_1_to_20000")
    offsets, out = tmp_path / "offsets.json", tmp_path / "first.jsonl"
    options = ("--snapshot-mode", "no_data", "--signal-table", f"{mdb.name}.sig",
               "--incremental-snapshot-chunk-size", "100")
    first = _capture_process(mdb.dsn, offsets, out, *options)
    kill_on_exit.append(first)
    _wait_for_offsets(offsets, first)
    send_signal(mdb.dsn, f"{mdb.name}.sig", "execute-snapshot",
                {"data-collections": [f"{mdb.name}.t"]})

    def saved_mid_snapshot() -> bool:
        state = json.loads(offsets.read_text() or "{}")
        snapshot = next(iter(state.values()), {}).get("incremental_snapshot")
        return bool(snapshot and snapshot["tables"][0]["last_key"])
    wait_for(saved_mid_snapshot, timeout_s=60, what="an offset saved inside the snapshot")
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)
    seen = _ids(_lines(out))
    assert 0 < len(seen) < 20000, "the kill did not land inside the snapshot"
    second = _capture_process(mdb.dsn, offsets, tmp_path / "second.jsonl", *options,
                              "--stop-at-end")
    kill_on_exit.append(second)
    _, err = second.communicate(timeout=120)
    assert second.returncode == 0, err.decode()[-2000:]
    after = _ids(_lines(tmp_path / "second.jsonl"))
    # At-least-once: the restart reads on from the last chunk saved (chunks after it
    # come again, whole), never from the start, and misses nothing.
    assert set(seen) | set(after) == set(range(1, 20001))
    assert after == sorted(after) and after[0] % 100 == 1 and 1 < after[0] <= max(seen) + 1
    assert len(after) == len(set(after))


def test_a_chunk_whose_read_view_fails_to_end_is_read_again(
        mdb: MariaDatabase, monkeypatch: pytest.MonkeyPatch) -> None:
    """The connection drops as a chunk's read view commits: the chunk is lost with it
    and read again from the last key handed on, not from after it."""
    import pymysql.connections  # noqa: PLC0415

    mdb.execute("CREATE TABLE t (id INT PRIMARY KEY, v INT)", SIGNAL_DDL,
                "INSERT INTO t VALUES " + ",".join(f"({i}, 0)" for i in range(1, 26)))
    config = _config(mdb, incremental_snapshot_chunk_size=10)
    offset = _last_offset(_capture(config, None), None)
    real = pymysql.connections.Connection.commit
    commits = [0]

    def commit(self: Any) -> None:
        if sys._getframe(1).f_code.co_name == "_read_chunk":
            commits[0] += 1
            if commits[0] == 2:  # the second chunk's
                raise pymysql.err.OperationalError(2013, "Lost connection (injected)")
        real(self)

    monkeypatch.setattr(pymysql.connections.Connection, "commit", commit)
    send_signal(mdb.dsn, f"{mdb.name}.sig", "execute-snapshot",
                {"data-collections": [f"{mdb.name}.t"]})
    reads: list[int] = []
    connector = MariaDbReader(config)  # one run: it retries the chunk itself
    connector.start(offset)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            batch = connector.poll()
            reads += [r.after["id"] for r in batch.records if isinstance(r, ChangeEvent)
                      and r.op is Op.READ and r.after]
            if batch.offset is not None and reads and \
                    "incremental_snapshot" not in batch.offset:
                break
    finally:
        connector.stop()
    assert commits[0] >= 3
    assert sorted(reads) == list(range(1, 26))


def test_a_chunk_reaching_wider_rows_ends_within_the_memory_bound(
        mdb: MariaDatabase, monkeypatch: pytest.MonkeyPatch) -> None:
    """A chunk's size is learnt from the rows before it: where the rows get wider (here
    from a few bytes to 1 MB) a chunk of the narrow rows' size would hold 32 MB. It ends
    at the chunk memory bound instead (8 MB), and the next one starts after its last
    row."""
    from tidemark.source.chunk_size import CHUNK_MOST_BYTES, row_memory  # noqa: PLC0415
    from tidemark.source.mariadb.incremental_snapshot import (  # noqa: PLC0415
        ChunkedSnapshots,
    )

    mdb.execute("CREATE TABLE g (id INT PRIMARY KEY, v LONGTEXT)", SIGNAL_DDL,
                "INSERT INTO g VALUES " + ",".join(f"({i}, 'v{i}')" for i in range(1, 2001)))
    for first in range(2001, 2041, 5):  # 5 MB a statement: within max_allowed_packet
        mdb.execute("INSERT INTO g VALUES " + ",".join(
            f"({i}, REPEAT('x', {1 << 20}))" for i in range(first, first + 5)))
    config = _config(mdb, incremental_snapshot_chunk_size=16)
    offset = _last_offset(_capture(config, None), None)
    chunks: list[list[tuple[Any, ...]]] = []
    real = ChunkedSnapshots._select

    def select(self: ChunkedSnapshots, *args: Any) -> Any:
        chunk = real(self, *args)
        if chunk is not None:
            chunks.append(list(chunk.rows))
        return chunk

    monkeypatch.setattr(ChunkedSnapshots, "_select", select)
    send_signal(mdb.dsn, f"{mdb.name}.sig", "execute-snapshot",
                {"data-collections": [f"{mdb.name}.g"]})
    reads = [e.after["id"] for e in _events(_capture(config, offset))
             if e.op is Op.READ and e.after]
    assert reads == list(range(1, 2041))
    assert max(len(rows) for rows in chunks) >= 512  # it grew on the narrow rows
    for rows in chunks:
        assert sum(row_memory(r) for r in rows) <= CHUNK_MOST_BYTES, len(rows)
