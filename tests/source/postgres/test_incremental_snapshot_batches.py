"""How an incremental snapshot's rows reach the engine: chunk sizes and batches.

The engine waits 50 ms after a batch with nothing in it, as for an idle source. While a
snapshot's marks stream in the source is not idle, so it hands on no such batches (one
now and then all the same, for the engine's stop checks and offset saves). Chunks grow
from the size set while they read fast, within a memory bound (wide rows), unless the
size is pinned.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from capture_helpers import drain, events, make_connector
from conftest import Database
from tidemark.event import Op, TableId
from tidemark.postgres_connection import connect
from tidemark.source.chunk_size import CHUNK_MOST_BYTES, MOST_BYTES, MOST_ROWS, row_memory
from tidemark.source.postgres.incremental_snapshot import IncrementalSnapshot
from tidemark.source.postgres.replication import ReplicationStream
from tidemark.source.signals import ExecuteSnapshot

pytestmark = [pytest.mark.integration]

SIGNALS = "public.dbz_signal"


def test_windows_streaming_in_come_without_empty_batches_between_them(db: Database) -> None:
    rows, chunk = 6000, 100
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text)",
               f"INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, {rows}) g",
               "CREATE TABLE dbz_signal (id varchar(42) PRIMARY KEY, type varchar(32) NOT NULL,"
               " data varchar(2048) NULL)")
    connector = make_connector(db.dsn, "public.t", snapshot_mode="no_data",
                               signal_table=SIGNALS, incremental_snapshot_chunk_size=chunk,
                               heartbeat_interval_ms=0)
    connector.start()
    try:
        drain(connector, db.insert_lsn())
        db.execute("INSERT INTO dbz_signal VALUES ('s1', 'execute-snapshot', %s)",
                   params=(json.dumps({"data-collections": ["public.t"]}),))
        reads = 0
        empty = 0
        deadline = time.monotonic() + 60
        while reads < rows:
            assert time.monotonic() < deadline, f"timed out after {reads} reads"
            batch = connector.poll()
            got = [e for e in events(batch.records) if e.op is Op.READ]
            if reads and not got:
                empty += 1  # polled between the first chunk and the last
            reads += len(got)
            if batch.offset is not None:
                connector.commit(batch.offset)
    finally:
        connector.stop()
    windows = rows // chunk
    # Before: at least one empty batch a window (the watermarks' transactions, left out).
    assert empty < windows // 4, f"{empty} empty batches for {windows} windows"


def _window_sizes(db: Database, table: str, start: int, *,
                  adaptive: bool = True) -> list[list[tuple[str | None, ...]]]:
    """The rows of each window of a snapshot of *table*, read one after another."""
    table_id = TableId("public", table)
    snap = IncrementalSnapshot(dsn_connect=lambda: connect(db.dsn), captured=[table_id],
                               keys={table_id: ("id",)}, signal_table=None,
                               chunk_size=start, topic_prefix="p", database="d",
                               adaptive_chunks=adaptive)
    snap.on_signal(ExecuteSnapshot(id="s", data_collections=(table_id,)))
    windows: list[list[tuple[str | None, ...]]] = []
    try:
        while snap.active:
            snap.windows = []  # as if each window had closed
            snap.maybe_open_window()
            windows += [w.rows for w in snap.windows]
            if snap.windows and snap.windows[-1].done_after:
                break
    finally:
        snap.close()
    return windows


def test_chunks_grow_from_the_size_set_unless_it_is_pinned(db: Database) -> None:
    db.execute("CREATE TABLE n (id int PRIMARY KEY, v text)",
               "INSERT INTO n SELECT g, 'v' || g FROM generate_series(1, 20000) g")
    grown = _window_sizes(db, "n", 100)
    assert len(grown[0]) == 100
    assert max(len(w) for w in grown) > 100
    assert all(len(w) <= MOST_ROWS for w in grown)
    assert sum(len(w) for w in grown) == 20000
    pinned = _window_sizes(db, "n", 100, adaptive=False)
    assert [len(w) for w in pinned] == [100] * 200


def test_chunks_of_wide_rows_grow_only_within_the_memory_bound(db: Database) -> None:
    width = 64 << 10
    db.execute("CREATE TABLE w (id int PRIMARY KEY, v text)",
               f"INSERT INTO w SELECT g, repeat(md5(g::text), {width // 32}) "
               f"FROM generate_series(1, 600) g")
    windows = _window_sizes(db, "w", 10)
    assert sum(len(w) for w in windows) == 600
    assert max(len(w) for w in windows) > 10  # it grew, then the bound held it
    for rows in windows:
        assert sum(row_memory(r) for r in rows) <= MOST_BYTES, len(rows)


def test_reads_with_windows_waiting_do_not_gather(db: Database,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A stream read gathers changes for up to 50 ms while they keep coming; with
    windows waiting for their closing marks it ends with what is at hand, or a writer's
    steady changes would hold back a closing mark already read."""
    gathers: list[tuple[bool, float | None]] = []
    real = ReplicationStream.read_batch
    connector: Any = None

    def read_batch(self: ReplicationStream, *args: Any) -> Any:
        snap = connector.incremental_snapshot if connector is not None else None
        gathers.append((bool(snap and snap.windows), args[2] if len(args) > 2 else None))
        return real(self, *args)

    monkeypatch.setattr(ReplicationStream, "read_batch", read_batch)
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text)",
               "INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 3000) g",
               "CREATE TABLE dbz_signal (id varchar(42) PRIMARY KEY, type varchar(32) NOT NULL,"
               " data varchar(2048) NULL)")
    connector = make_connector(db.dsn, "public.t", snapshot_mode="no_data",
                               signal_table=SIGNALS, incremental_snapshot_chunk_size=100)
    connector.start()
    try:
        drain(connector, db.insert_lsn())
        db.execute("INSERT INTO dbz_signal VALUES ('s1', 'execute-snapshot', %s)",
                   params=(json.dumps({"data-collections": ["public.t"]}),))
        reads = 0
        deadline = time.monotonic() + 60
        while reads < 3000:
            assert time.monotonic() < deadline, f"timed out after {reads} reads"
            batch = connector.poll()
            reads += sum(1 for e in events(batch.records) if e.op is Op.READ)
            if batch.offset is not None:
                connector.commit(batch.offset)
    finally:
        connector.stop()
    waiting = [gather for windows, gather in gathers if windows]
    assert waiting and set(waiting) == {0.0}, gathers
    assert {gather for windows, gather in gathers if not windows} == {None}


def test_a_chunk_reaching_wider_rows_ends_within_the_memory_bound(db: Database) -> None:
    """A chunk's size is learnt from the rows before it: where the rows get wider (here
    from a few bytes to 1 MB) a chunk of the narrow rows' size would hold 40 MB. It ends
    at the chunk memory bound instead (8 MB), and the next one starts after its last
    row."""
    db.execute("CREATE TABLE g (id int PRIMARY KEY, v text)",
               "INSERT INTO g SELECT x, 'v' || x FROM generate_series(1, 2000) x",
               "INSERT INTO g SELECT x, repeat('x', 1 << 20) FROM generate_series(2001, 2040) x")
    windows = _window_sizes(db, "g", 16)
    assert [int(str(r[0])) for rows in windows for r in rows] == list(range(1, 2041))
    assert max(len(w) for w in windows) >= 512  # it grew on the narrow rows
    for rows in windows:
        assert sum(row_memory(r) for r in rows) <= CHUNK_MOST_BYTES, len(rows)
