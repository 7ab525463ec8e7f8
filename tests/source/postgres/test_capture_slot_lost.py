"""A slot the offsets need is gone (dropped, or a promoted standby without it) or was
invalidated (its WAL exceeded ``max_slot_wal_keep_size``): never a silent gap. Capture
stops with an error naming the slot and the position, and ``on_slot_lost =
"resnapshot"`` repairs a replica with a new slot and an incremental snapshot."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

from capture_helpers import drain, make_connector
from tidemark.errors import ConfigError
from tidemark.event import ChangeEvent, Op, SnapshotMarker
from tidemark.offsets.store import Offset
from tidemark.source.postgres.pgoutput import str_to_lsn
from tidemark.source.postgres.slot import SlotLostError
from tidemark.testing.postgres import PostgresCluster, sql_connection

pytestmark = [pytest.mark.integration, pytest.mark.every_pg_version]


@pytest.fixture(scope="module")
def small_wal_cluster() -> Iterator[PostgresCluster]:
    """A server that invalidates a slot holding more than 1 MB of WAL.

    Its WAL writer waits 1 s (not 200 ms): an asynchronous commit then stays unwritten
    long enough that a drain aimed at the write position instead of the insert position
    (see _wal_end) fails every time rather than once in a few hundred runs."""
    settings = {"max_slot_wal_keep_size": "'1MB'", "max_wal_size": "'32MB'",
                "min_wal_size": "'32MB'", "wal_writer_delay": "'1s'"}
    with PostgresCluster(settings=settings) as cluster:
        yield cluster


@pytest.fixture
def dsn(small_wal_cluster: PostgresCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    name = "lost_" + request.node.name.split("[")[-1].rstrip("]").replace("-", "_")
    with small_wal_cluster.database(name) as dsn:
        yield dsn


def _execute(dsn: str, *statements: str) -> None:
    with contextlib.closing(sql_connection(dsn)) as conn, conn.cursor() as cur:
        for statement in statements:
            cur.execute(statement)
        conn.commit()


def _query(dsn: str, sql: str) -> list[tuple[Any, ...]]:
    with contextlib.closing(sql_connection(dsn)) as conn, conn.cursor() as cur:
        cur.execute(sql)
        return list(cur.fetchall())


def _wal_end(dsn: str) -> int:
    """The server's WAL insert position: every transaction committed so far ends at or
    before it. Not pg_current_wal_lsn(), the write position: under synchronous_commit =
    off (the test servers) a commit just made may not be written yet, and a drain to that
    position could end before it."""
    return int(_query(dsn, "SELECT (pg_current_wal_insert_lsn() - '0/0')::bigint")[0][0])


def _replay(records: list[Any], rows: dict[int, dict[str, Any]]) -> None:
    for event in records:
        if not isinstance(event, ChangeEvent):
            continue
        if event.op is Op.DELETE and event.before is not None:
            rows.pop(event.before["id"], None)
        elif event.after is not None:
            rows[event.after["id"]] = dict(event.after)


def _until_now(connector: Any, dsn: str) -> tuple[list[Any], Offset | None]:
    """Poll *connector* (started) until its offset passes the server's WAL position now:
    the records and that offset."""
    target = _wal_end(dsn)
    records: list[Any] = []
    offset: Offset | None = None
    deadline = time.monotonic() + 60
    while offset is None or offset["lsn"] < target:
        assert time.monotonic() < deadline, "capture did not catch up"
        batch = connector.poll()
        records += batch.records
        if batch.offset is not None and "lsn" in batch.offset:
            connector.commit(batch.offset)
            offset = batch.offset
    return records, offset


def _until_reread(connector: Any, replica: dict[int, dict[str, Any]],
                  deadline: float) -> int:
    """Poll (and commit) *connector*, replaying into *replica*, until an incremental
    snapshot has re-read rows and finished; the number of rows it read."""
    reads = 0
    while True:
        assert time.monotonic() < deadline, "the incremental snapshot did not finish"
        batch = connector.poll()
        _replay(batch.records, replica)
        reads += sum(1 for r in batch.records if isinstance(r, ChangeEvent)
                     and r.snapshot is SnapshotMarker.INCREMENTAL)
        if batch.offset is not None:
            connector.commit(batch.offset)
            if reads and "incremental_snapshot" not in batch.offset:
                return reads


def _invalidate_by_wal(dsn: str) -> None:
    """Write WAL past the slot's 1 MB allowance until a checkpoint invalidates it."""
    deadline = time.monotonic() + 60
    while _query(dsn, "SELECT wal_status FROM pg_replication_slots "
                      "WHERE slot_name = 'tidemark'") != [("lost",)]:
        assert time.monotonic() < deadline, "the slot was never invalidated"
        _execute(dsn, "CREATE TABLE IF NOT EXISTS filler (x text)",
                 "INSERT INTO filler SELECT repeat('x', 1000) FROM generate_series(1, 3000)",
                 "SELECT pg_switch_wal()")
        _execute(dsn, "CHECKPOINT")


@pytest.mark.parametrize("how", ["dropped", "wal-removed"])
def test_a_lost_slot_is_refused_by_name_and_repaired_by_an_incremental_snapshot(
        dsn: str, how: str) -> None:
    _execute(dsn, "CREATE TABLE t (id int PRIMARY KEY, v text)",
             "INSERT INTO t SELECT i, 'v0' FROM generate_series(1, 500) i")
    replica: dict[int, dict[str, Any]] = {}
    first = make_connector(dsn, "public.t")
    first.start()
    try:
        records, offset = _until_now(first, dsn)
        _replay(records, replica)
    finally:
        first.stop()
    assert offset is not None and len(replica) == 500

    # While capture is down, changes it will never see as changes.
    _execute(dsn, "UPDATE t SET v = 'gap' WHERE id <= 50", "DELETE FROM t WHERE id = 499",
             "INSERT INTO t VALUES (501, 'gap')")
    if how == "dropped":
        _execute(dsn, "SELECT pg_drop_replication_slot('tidemark')")
    else:
        _invalidate_by_wal(dsn)

    refused = make_connector(dsn, "public.t")
    with pytest.raises(SlotLostError) as caught:
        refused.start(offset)
        refused.poll()
    refused.stop()
    message = str(caught.value)
    assert "'tidemark'" in message and "resnapshot" in message and "when_needed" in message

    repairing = make_connector(dsn, "public.t", on_slot_lost="resnapshot",
                               incremental_snapshot_chunk_size=100)
    repairing.start(offset)
    try:
        _execute(dsn, "UPDATE t SET v = 'after' WHERE id = 2")  # streamed, not lost
        reads = _until_reread(repairing, replica, time.monotonic() + 60)
        drain(repairing, timeout_s=30, until_lsn=_wal_end(dsn))
    finally:
        repairing.stop()
    table = {row[0]: {"id": row[0], "v": row[1]} for row in _query(dsn, "SELECT id, v FROM t")}
    assert reads == 500  # every row of the table, re-read
    # The snapshot repairs every row that exists; a row deleted while the slot was gone
    # is the one thing it cannot see (the docs say so).
    assert {k: v for k, v in replica.items() if k != 499} == table
    assert 499 in replica and replica[2]["v"] == "after"


def test_slot_failover_is_on_where_the_server_has_it_and_refused_where_not(
        dsn: str) -> None:
    _execute(dsn, "CREATE TABLE t (id int PRIMARY KEY)")
    version = int(_query(dsn, "SHOW server_version_num")[0][0]) // 10000
    for setting in (None, True, False):
        name = f"f_{str(setting).lower()}"
        connector = make_connector(dsn, "public.t", slot_name=name, snapshot_mode="no_data",
                                   **({} if setting is None else {"slot_failover": setting}))
        if setting is True and version < 17:
            with pytest.raises(ConfigError, match="slot_failover") as caught:
                connector.start()
            connector.stop()
            assert f"this server is {version}" in str(caught.value)
            continue
        connector.start()
        try:
            drain(connector, timeout_s=30, until_lsn=_wal_end(dsn))
        finally:
            connector.stop()
        if version >= 17:
            assert _query(dsn, "SELECT failover FROM pg_replication_slots WHERE slot_name = "
                               f"'{name}'") == [(setting is not False,)]
        _execute(dsn, f"SELECT pg_drop_replication_slot('{name}')")


def test_when_needed_takes_a_full_snapshot_after_the_slot_was_invalidated(dsn: str) -> None:
    _execute(dsn, "CREATE TABLE t (id int PRIMARY KEY)",
             "INSERT INTO t SELECT generate_series(1, 20)")
    first = make_connector(dsn, "public.t", snapshot_mode="when_needed")
    first.start()
    try:
        _, offset = _until_now(first, dsn)
    finally:
        first.stop()
    assert offset is not None
    _execute(dsn, "DELETE FROM t WHERE id > 10")
    _invalidate_by_wal(dsn)
    again = make_connector(dsn, "public.t", snapshot_mode="when_needed")
    again.start(offset)
    try:
        records = drain(again, timeout_s=60, until_lsn=_wal_end(dsn))
    finally:
        again.stop()
    reads = [e for e in records if isinstance(e, ChangeEvent) and e.op is Op.READ]
    assert sorted(e.after["id"] for e in reads if e.after) == list(range(1, 11))


@pytest.mark.parametrize("action", ["fail", "resnapshot"])
def test_a_slot_invalidated_while_streaming_stops_capture_or_is_repaired_in_the_same_run(
        dsn: str, action: str, caplog: pytest.LogCaptureFixture) -> None:
    """The server invalidates the slot under a running stream (its consumer fell more
    than max_slot_wal_keep_size behind): the default stops with the slot's name; with
    on_slot_lost = "resnapshot" the same run goes on from a new slot and re-reads the
    table, so the replica is repaired without a restart."""
    _execute(dsn, "CREATE TABLE t (id int PRIMARY KEY, v text)",
             "INSERT INTO t SELECT i, 'v0' FROM generate_series(1, 300) i")
    replica: dict[int, dict[str, Any]] = {}
    connector = make_connector(dsn, "public.t", on_slot_lost=action,
                               incremental_snapshot_chunk_size=100)
    connector.start()
    try:
        records, reached = _until_now(connector, dsn)
        _replay(records, replica)
        assert len(replica) == 300 and reached is not None
        # Not polled meanwhile, so nothing is confirmed: the slot falls behind.
        _execute(dsn, "UPDATE t SET v = 'gap' WHERE id <= 30", "DELETE FROM t WHERE id = 299",
                 "INSERT INTO t VALUES (301, 'gap')")
        _invalidate_by_wal(dsn)
        deadline = time.monotonic() + 90
        if action == "fail":
            with pytest.raises(SlotLostError) as caught:
                while time.monotonic() < deadline:
                    connector.poll()
            assert "'tidemark'" in str(caught.value) and "resnapshot" in str(caught.value)
            return
        reads = _until_reread(connector, replica, deadline)
        _execute(dsn, "UPDATE t SET v = 'after' WHERE id = 2")
        _replay(drain(connector, timeout_s=30, until_lsn=_wal_end(dsn)), replica)
    finally:
        connector.stop()
    table = {row[0]: {"id": row[0], "v": row[1]} for row in _query(dsn, "SELECT id, v FROM t")}
    assert reads == 300
    # The deleted row is the one thing a snapshot cannot see, unless its delete was
    # streamed before the slot was lost.
    assert {k: v for k, v in replica.items() if k != 299} == table
    assert replica[2]["v"] == "after"
    assert _query(dsn, "SELECT wal_status FROM pg_replication_slots "
                       "WHERE slot_name = 'tidemark'") != [("lost",)]
    # The warning says how far capture had got, at least as far as was committed.
    lost_after = re.search(r"was lost after ([0-9A-F]+/[0-9A-F]+)", caplog.text)
    assert lost_after is not None and str_to_lsn(lost_after[1]) >= reached["lsn"]
