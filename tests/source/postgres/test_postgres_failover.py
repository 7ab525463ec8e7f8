"""Failover on one machine: a primary, a streaming standby that keeps tidemark's failover
slot in step, the primary stopped and the standby promoted while capture runs."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from conftest import Database
from pipeline_helpers import (
    _assert_equal_to_source,
    _lake_equals,
    _LivePipeline,
    _pipeline_file,
    _prepare,
)
from tidemark.pipeline import load_config
from tidemark.testing.postgres import PostgresCluster, sql_connection
from waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture
def primary_and_standby() -> Iterator[tuple[PostgresCluster, PostgresCluster]]:
    with PostgresCluster() as primary:
        if primary.server_version() < 17:
            pytest.skip("failover slots need PostgreSQL 17 or later (this run: "
                        f"{primary.server_version()}); the PostgreSQL 18 pass runs this")
        with contextlib.closing(primary.connect()) as conn, conn.cursor() as cur:
            cur.execute("SELECT pg_create_physical_replication_slot('sb1', true)")
            cur.execute("CREATE DATABASE app")
        with contextlib.closing(sql_connection(primary.dsn("app"))) as conn, \
                conn.cursor() as cur:
            cur.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
            conn.commit()
        standby = PostgresCluster()
        try:
            standby.start_standby(primary, "sb1")
            with contextlib.closing(primary.connect()) as conn, conn.cursor() as cur:
                # Logical changes go out only once the standby has them: capture can
                # never be ahead of the slot the standby will continue with. (Set after
                # the base backup: a promoted copy would wait for a slot it lacks.)
                cur.execute("ALTER SYSTEM SET synchronized_standby_slots = 'sb1'")
                cur.execute("SELECT pg_reload_conf()")
            yield primary, standby
        finally:
            standby.stop()


def _execute(dsn: str, *statements: str) -> None:
    with contextlib.closing(sql_connection(dsn)) as conn, conn.cursor() as cur:
        for statement in statements:
            cur.execute(statement)
        conn.commit()


def _standby_slot(standby: PostgresCluster) -> tuple[bool, bool] | None:
    """(synced, temporary) of tidemark's slot on the standby, None while it has none."""
    with contextlib.closing(sql_connection(standby.dsn("app"))) as conn, \
            conn.cursor() as cur:
        cur.execute("SELECT synced, temporary FROM pg_replication_slots "
                    "WHERE slot_name = 'tidemark'")
        row = cur.fetchone()
    return (bool(row[0]), bool(row[1])) if row else None


def _wait_for_replay(primary: PostgresCluster, standby: PostgresCluster) -> None:
    """Until the standby has replayed all the primary wrote: replication is
    asynchronous, and what a dying primary had not sent is lost with it, whatever
    capture does (not what this test is about)."""
    with contextlib.closing(primary.connect()) as conn, conn.cursor() as cur:
        cur.execute("SELECT pg_current_wal_insert_lsn()")  # asynchronous commits too
        (written,) = cur.fetchone() or (None,)

    def replayed() -> bool:
        with contextlib.closing(standby.connect()) as conn, conn.cursor() as cur:
            cur.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (written,))
            return bool((cur.fetchone() or (False,))[0])
    wait_for(replayed, timeout_s=60, what="the standby to replay the primary's WAL")


def _ids(path: Path) -> list[int]:
    text = path.read_text() if path.exists() else ""
    values = [json.loads(line)["value"] for line in text.split("\n")[:-1] if line]
    return [v["after"]["id"] for v in values if v is not None and v.get("after")]


def test_capture_follows_its_failover_slot_to_the_promoted_standby(
        primary_and_standby: tuple[PostgresCluster, PostgresCluster], tmp_path: Path,
        kill_on_exit: list[subprocess.Popen[bytes]]) -> None:
    primary, standby = primary_and_standby
    both = (f"host={primary.host},{standby.host} port={primary.port},{standby.port} "
            f"dbname=app user=postgres password={primary.password} "
            "target_session_attrs=read-write connect_timeout=5")
    offsets, out = tmp_path / "offsets.json", tmp_path / "out.jsonl"
    with out.open("wb") as sink:
        capture = subprocess.Popen(
            [sys.executable, "-m", "tidemark", "capture", "--dsn", both, "--offsets",
             str(offsets), "--offset-flush-interval-ms", "0", "--snapshot-mode", "no_data",
             "--table", "public.t"], stdout=sink, stderr=subprocess.PIPE)
    kill_on_exit.append(capture)
    wait_for(offsets.exists, timeout_s=60, what="capture's first offset")
    with contextlib.closing(primary.connect("app")) as conn, conn.cursor() as cur:
        cur.execute("SELECT failover FROM pg_replication_slots WHERE slot_name = 'tidemark'")
        assert cur.fetchone() == (True,), "tidemark's slot is not a failover slot"

    for tx in range(10):
        _execute(primary.dsn("app"), *(f"INSERT INTO t VALUES ({tx * 10 + i + 1}, 'a')"
                                       for i in range(10)))
    wait_for(lambda: len(_ids(out)) >= 100, timeout_s=60, what="the first 100 rows")

    # A synced slot stays temporary until the primary's slot moves past a point the
    # standby can decode from: a running-transactions record, decoded and confirmed.
    marker = [1000]

    def persisted() -> bool:
        marker[0] += 1
        _execute(primary.dsn("app"), "SELECT pg_log_standby_snapshot()",
                 f"INSERT INTO t VALUES ({marker[0]}, 'sync')")
        return _standby_slot(standby) == (True, False)
    wait_for(persisted, timeout_s=120, what="the standby's copy of the slot to persist")

    for tx in range(10, 20):
        _execute(primary.dsn("app"), *(f"INSERT INTO t VALUES ({tx * 10 + i + 1}, 'b')"
                                       for i in range(10)))
    _wait_for_replay(primary, standby)
    primary.halt("immediate")  # the primary dies mid-stream
    standby.promote()
    for tx in range(20, 30):
        _execute(standby.dsn("app"), *(f"INSERT INTO t VALUES ({tx * 10 + i + 1}, 'c')"
                                       for i in range(10)))
    with contextlib.closing(sql_connection(standby.dsn("app"))) as conn, \
            conn.cursor() as cur:
        cur.execute("SELECT id FROM t")
        expected = {row[0] for row in cur.fetchall()}
    assert set(range(1, 301)) <= expected

    def delivered() -> bool:
        if capture.poll() is not None:
            err = capture.stderr.read().decode() if capture.stderr else ""
            raise AssertionError(f"capture exited with {capture.returncode}: {err[-3000:]}")
        return set(_ids(out)) == expected
    try:
        wait_for(delivered, timeout_s=240, what="every row of the new primary")
    except AssertionError:
        capture.kill()
        err = capture.stderr.read().decode() if capture.stderr else ""
        missing = sorted(expected - set(_ids(out)))
        raise AssertionError(f"missing {missing[:20]}...; capture's log:\n{err[-4000:]}") \
            from None
    capture.terminate()
    _, err = capture.communicate(timeout=60)
    assert capture.returncode == 0, err.decode()[-3000:]
    ids = _ids(out)
    # Nothing lost; a transaction whose confirmation the old primary did not pass on to
    # the standby before it died comes again, whole (at-least-once).
    assert set(ids) == expected
    repeated = len(ids) - len(set(ids))
    print(f"rows delivered twice across the failover: {repeated}")
    with contextlib.closing(sql_connection(standby.dsn("app"))) as conn, \
            conn.cursor() as cur:
        cur.execute("SELECT failover, temporary, active FROM pg_replication_slots "
                    "WHERE slot_name = 'tidemark'")
        # The copy capture went on from (inactive now that capture stopped).
        assert cur.fetchone() == (True, False, False)


def test_tidemark_run_follows_its_failover_slot_to_the_promoted_standby(
        primary_and_standby: tuple[PostgresCluster, PostgresCluster], spark: SparkSession,
        tmp_path: Path) -> None:
    """The pipeline's query fails when the primary dies, is restarted from its checkpoint
    with backoff, reaches the promoted standby through the multi-host DSN and goes on
    from the synchronised slot: the Delta tables equal the new primary, with no SCD2
    version applied twice."""
    primary, standby = primary_and_standby
    old = Database(primary, "app")
    old.execute("CREATE TABLE a (id int PRIMARY KEY, v text, n numeric(10, 2))",
                "CREATE TABLE b (id int PRIMARY KEY, v text)")
    both = (f"host={primary.host},{standby.host} port={primary.port},{standby.port} "
            f"dbname=app user=postgres password={primary.password} "
            "target_session_attrs=read-write connect_timeout=5")
    source = _prepare(old, "a", "b") + (f'dsn = "{both}"\nreconnect_backoff_ms = 200\n'
                                        "reconnect_max_attempts = 30\n")
    config = load_config(_pipeline_file(tmp_path, source, "trigger_interval_ms = 200",
                                        changelog=False))
    with _LivePipeline(config, spark) as live:
        old.execute("INSERT INTO a SELECT g, 'x', g FROM generate_series(1, 20) g",
                    "INSERT INTO b SELECT g, 'first' FROM generate_series(1, 10) g")
        live.applied(30)
        applied = [30]

        def persisted() -> bool:
            applied[0] += 1
            old.execute("SELECT pg_log_standby_snapshot()",
                        f"INSERT INTO a VALUES ({1000 + applied[0]}, 'sync', 0)")
            live.applied(applied[0])
            with contextlib.closing(sql_connection(standby.dsn("app"))) as conn, \
                    conn.cursor() as cur:
                cur.execute("SELECT synced, temporary FROM pg_replication_slots "
                            "WHERE slot_name = %s", (f"s_{old.name}",))
                return cur.fetchone() == (True, False)
        live.wait_until(persisted, "the standby's copy of the slot to persist", 120)
        old.execute("UPDATE a SET v = 'before failover' WHERE id <= 10",
                    "UPDATE b SET v = 'second'")
        _wait_for_replay(primary, standby)
        primary.halt("immediate")
        standby.promote()
        new = Database(standby, "app")
        new.execute("UPDATE a SET v = 'after failover' WHERE id <= 5",
                    "DELETE FROM a WHERE id = 20", "INSERT INTO b VALUES (11, 'new')")
        live.wait_until(lambda: _lake_equals(new, tmp_path), "Delta to equal the new primary",
                        240)
        assert live.running
    assert not live.failures, live.failures
    _assert_equal_to_source(new, tmp_path)


def test_capture_reads_from_a_standby_and_resumes_there_after_a_kill(
        primary_and_standby: tuple[PostgresCluster, PostgresCluster], tmp_path: Path,
        kill_on_exit: list[subprocess.Popen[bytes]]) -> None:
    """Logical decoding on a standby (PostgreSQL 16+): the slot lives on the standby, the
    publication comes from the primary; snapshot, stream, SIGKILL and resume lose
    nothing, and the primary holds no slot of tidemark's."""
    primary, standby = primary_and_standby
    _execute(primary.dsn("app"), "INSERT INTO t SELECT g, 'before' FROM generate_series(1, 50) g",
             "CREATE PUBLICATION on_primary FOR TABLE t")
    _wait_for_replay(primary, standby)
    offsets, out = tmp_path / "offsets.json", tmp_path / "out.jsonl"

    def start() -> subprocess.Popen[bytes]:
        with out.open("ab") as sink:
            capture = subprocess.Popen(
                [sys.executable, "-m", "tidemark", "capture", "--dsn", standby.dsn("app"),
                 "--slot", "on_standby", "--publication", "on_primary", "--offsets",
                 str(offsets), "--offset-flush-interval-ms", "0", "--table", "public.t"],
                stdout=sink, stderr=subprocess.PIPE)
        kill_on_exit.append(capture)
        return capture

    def running(capture: subprocess.Popen[bytes]) -> None:
        if capture.poll() is not None:
            err = capture.stderr.read().decode() if capture.stderr else ""
            raise AssertionError(f"capture exited with {capture.returncode}: {err[-3000:]}")

    def captured(capture: subprocess.Popen[bytes]) -> set[int]:
        running(capture)
        return set(_ids(out))

    capture = start()

    def snapshotted() -> bool:
        running(capture)
        # A slot on a standby is ready once the primary's next running-transactions
        # record has been replayed there; the primary writes one every 15 s while busy.
        _execute(primary.dsn("app"), "SELECT pg_log_standby_snapshot()")
        return len(_ids(out)) >= 50
    wait_for(snapshotted, timeout_s=120, what="the snapshot read from the standby")
    for tx in range(5, 15):
        _execute(primary.dsn("app"), *(f"INSERT INTO t VALUES ({tx * 10 + i + 1}, 'a')"
                                       for i in range(10)))
    wait_for(lambda: len(captured(capture)) >= 150, timeout_s=60,
             what="the changes streamed from the standby")
    capture.kill()
    capture.wait(30)
    _execute(primary.dsn("app"), "UPDATE t SET v = 'while down' WHERE id <= 10",
             *(f"INSERT INTO t VALUES ({200 + i}, 'b')" for i in range(1, 51)))
    capture = start()
    expected = set(range(1, 151)) | set(range(201, 251))
    wait_for(lambda: captured(capture) >= expected, timeout_s=120,
             what="the changes made while capture was down")
    events = [json.loads(line)["value"] for line in out.read_text().splitlines() if line]
    updated = {e["after"]["id"] for e in events if e and e["op"] == "u"}
    assert updated == set(range(1, 11))
    assert sorted(e["after"]["id"] for e in events if e and e["op"] == "r") == \
        list(range(1, 51)), "the snapshot was read again after the restart"
    capture.terminate()
    capture.wait(60)
    # --stop-at-end on a standby: "the end" is what the standby has replayed (it has no
    # insert position of its own).
    _execute(primary.dsn("app"), *(f"INSERT INTO t VALUES ({300 + i}, 'c')" for i in range(5)))
    _wait_for_replay(primary, standby)
    before = len(out.read_bytes().splitlines())
    with out.open("ab") as sink:
        to_end = subprocess.run(
            [sys.executable, "-m", "tidemark", "capture", "--dsn", standby.dsn("app"),
             "--slot", "on_standby", "--publication", "on_primary", "--offsets",
             str(offsets), "--table", "public.t", "--stop-at-end"],
            stdout=sink, stderr=subprocess.PIPE, timeout=120, check=False)
    assert to_end.returncode == 0, to_end.stderr.decode()[-3000:]
    assert [json.loads(line)["value"]["after"]["id"]
            for line in out.read_bytes().splitlines()[before:]] == list(range(300, 305))
    for cluster, has_slot in ((standby, True), (primary, False)):
        with contextlib.closing(cluster.connect()) as conn, conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM pg_replication_slots "
                        "WHERE slot_name = 'on_standby'")
            assert cur.fetchone() == (int(has_slot),)


def test_capture_from_a_standby_names_what_only_the_primary_can_create(
        primary_and_standby: tuple[PostgresCluster, PostgresCluster]) -> None:
    _, standby = primary_and_standby
    result = subprocess.run(
        [sys.executable, "-m", "tidemark", "capture", "--dsn", standby.dsn("app"),
         "--publication", "missing_pub", "--table", "public.t", "--max-events", "1"],
        check=False, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "standby" in result.stderr and "CREATE PUBLICATION" in result.stderr and \
        "primary" in result.stderr, result.stderr[-2000:]


def test_a_failover_slot_s_spark_batches_end_where_the_standby_has_confirmed(
        primary_and_standby: tuple[PostgresCluster, PostgresCluster]) -> None:
    """PostgreSQL holds a failover slot's changes back until the standbys of
    synchronized_standby_slots have them; the Spark source reads through copies of the
    slot, which do not wait, so its batches end there itself. A plain slot's do not."""

    from tidemark.source.postgres import wal_reads as wal  # noqa: PLC0415

    primary, standby = primary_and_standby
    with sql_connection(primary.dsn("app"), autocommit=True) as conn:
        conn.execute("SELECT pg_create_logical_replication_slot('failover_s', 'pgoutput', "
                     "false, false, true)")
        conn.execute("SELECT pg_create_logical_replication_slot('plain_s', 'pgoutput')")
        standby.stop()  # what the primary writes now, the standby does not have
        _execute(primary.dsn("app"), "INSERT INTO t SELECT g, 'x' FROM generate_series(1, 1000) g")
        row = conn.execute("SELECT (restart_lsn - '0/0')::bigint FROM pg_replication_slots "
                           "WHERE slot_name = 'sb1'").fetchone()
        assert row is not None
        confirmed = row[0]
        # The servers commit asynchronously: the insert is flushed within a moment.
        before = wait_for(lambda: (flushed := wal.flush_lsn(conn)) > confirmed and flushed,
                          timeout_s=30, what="the insert to be flushed on the primary")
        assert wal.readable_end(conn, "failover_s") == confirmed
        assert before <= wal.readable_end(conn, "plain_s") <= wal.flush_lsn(conn)
