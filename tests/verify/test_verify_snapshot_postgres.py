"""PostgreSQL's verify snapshot: exact at its position while a writer runs, the keys
changed after it, and its temporary slot gone with it (tidemark.source.postgres.
verify_snapshot)."""

from __future__ import annotations

import contextlib
import datetime as dt
import decimal
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest

from conftest import Database
from tidemark.errors import SourceError
from tidemark.event import TableId
from tidemark.row_checksum import ComparedColumn, TableShape, key_hash_of, row_texts
from tidemark.source.postgres import pgoutput
from tidemark.source.postgres.kind import KIND
from tidemark.source.postgres.stream_offsets import to_offset
from tidemark.source.postgres.verify_snapshot import open_verify_snapshot
from tidemark.source.verify_snapshot import TruncatedAfterSnapshotError
from tidemark.testing.postgres import sql_connection
from verify_writer import Writer, replay
from waiting import wait_for

TABLE = TableId("public", "t")
SHAPE = TableShape((ComparedColumn("id", pa.int32()), ComparedColumn("v", pa.string())),
                   ("id",))


def _hash(shape: TableShape, **key: Any) -> int:
    row = {c.name: key.get(c.name) for c in shape.columns}
    return key_hash_of(row_texts(row, shape), shape)


def _commit_xid(cur: Any) -> int:
    cur.execute("SELECT txid_current() % 4294967296")
    xid = int(cur.fetchone()[0])
    cur.connection.commit()
    return xid


def _commit_lsns(db: Database, slot: str) -> dict[int, int]:
    """Each transaction's commit LSN, from a slot made before the writer started."""
    found: dict[int, int] = {}
    for (data,) in db.query(
            "SELECT data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, "
            "'proto_version', '1', 'publication_names', 'p')", (slot,)):
        message = pgoutput.decode_message(bytes(data))
        if isinstance(message, pgoutput.Begin):
            found[message.xid] = message.final_lsn
    return found


@pytest.fixture
def table(db: Database) -> Iterator[Database]:
    db.autocommit("CREATE TABLE t (id int PRIMARY KEY, v text)",
                  "CREATE PUBLICATION p FOR TABLE t",
                  "SELECT pg_create_logical_replication_slot('reference', 'pgoutput')")
    try:
        yield db
    finally:
        db.autocommit("SELECT pg_drop_replication_slot('reference')")


def _slots(db: Database, name: str) -> int:
    return int(db.scalar("SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s",
                         (name,)))


def test_snapshot_is_exact_at_its_position_and_lists_keys_changed_after(
        table: Database) -> None:
    db = table
    writer = Writer(lambda: sql_connection(db.dsn), _commit_xid)
    writer.start()
    try:
        wait_for(lambda: len(writer.log) >= 40, 60, "the writer's first transactions")
        snapshot = open_verify_snapshot(db.dsn, [TABLE], publication="p")
        try:
            opened = len(writer.log)
            wait_for(lambda: len(writer.log) >= opened + 40, 60,
                     "transactions after the snapshot")
            running = snapshot.changed_key_hashes(TABLE, SHAPE)  # while the writer writes
            writer.finish()
            after = snapshot.changed_key_hashes(TABLE, SHAPE)
            seen = dict(snapshot.connection.execute("SELECT id, v FROM t").fetchall())
            position = snapshot.position
            # The units a pipeline's committed offset is read in (its LSN).
            assert KIND.log_position(to_offset(position)) == position
        finally:
            snapshot.close()
    finally:
        writer.stop.set()
        writer.join(30)
    lsns = _commit_lsns(db, "reference")
    expected: dict[int, str] = {}
    keys_after: set[int] = set()
    before = 0
    for xid, ops, touched in writer.log:
        if lsns[xid] < position:
            before += 1
            replay(ops, expected)
        else:
            keys_after |= touched
    assert 0 < before < len(writer.log)
    assert seen == expected
    hashes = {_hash(SHAPE, id=k) for k in keys_after}
    assert after == hashes
    assert running <= hashes
    assert any(op == "move" for _, ops, _ in writer.log[before:] for op, _ in ops)


def test_changed_keys_of_a_composite_key_as_the_target_holds_them(db: Database) -> None:
    db.autocommit("CREATE TABLE k (name text, at timestamptz, n numeric(10,2), "
                  "d date, x int, PRIMARY KEY (name, at, n, d))",
                  "CREATE PUBLICATION p FOR TABLE k")
    shape = TableShape((ComparedColumn("name", pa.string()),
                        ComparedColumn("at", pa.timestamp("us", tz="UTC")),
                        ComparedColumn("n", pa.decimal128(10, 2)),
                        ComparedColumn("d", pa.date32()), ComparedColumn("x", pa.int32())),
                       ("name", "at", "n", "d"))
    at = dt.datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=dt.UTC)
    day = dt.date(1999, 12, 31)
    db.execute("INSERT INTO k VALUES ('é a', %s, 1.5, %s, 1), ('b', %s, -2, %s, 2)",
               params=(at, day, at, day))
    table = TableId("public", "k")
    with contextlib.closing(open_verify_snapshot(db.dsn, [table], publication="p")) as snap:
        assert snap.changed_key_hashes(table, shape) == frozenset()
        db.execute("UPDATE k SET name = 'c' WHERE name = 'é a'",
                   "UPDATE k SET x = 3 WHERE name = 'b'")
        db.execute("DELETE FROM k WHERE name = 'c'")
        changed = snap.changed_key_hashes(table, shape)
    num = decimal.Decimal
    assert changed == {_hash(shape, name="é a", at=at, n=num("1.5"), d=day),
                       _hash(shape, name="c", at=at, n=num("1.5"), d=day),
                       _hash(shape, name="b", at=at, n=num("-2"), d=day)}


def test_temporary_slot_goes_with_close_and_with_the_process(table: Database) -> None:
    db = table
    snapshot = open_verify_snapshot(db.dsn, [TABLE], publication="p")
    assert _slots(db, snapshot.slot) == 1
    snapshot.close()
    assert db.settled_scalar("SELECT count(*) FROM pg_replication_slots WHERE slot_name "
                             "LIKE 'tidemark_verify%'", 0) == 0
    script = ("import sys, time\n"
              "from tidemark.event import TableId\n"
              "from tidemark.source.postgres.verify_snapshot import open_verify_snapshot\n"
              "s = open_verify_snapshot(sys.argv[1], [TableId('public', 't')], "
              "publication='p')\n"
              "print(s.slot, flush=True)\n"
              "time.sleep(600)\n")
    child = subprocess.Popen([sys.executable, "-c", script, db.dsn], stdout=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout is not None
        slot = child.stdout.readline().strip()
        assert slot.startswith("tidemark_verify_") and _slots(db, slot) == 1
    finally:
        child.kill()
        child.wait(30)
    assert db.settled_scalar("SELECT count(*) FROM pg_replication_slots WHERE slot_name "
                             f"= '{slot}'", 0) == 0


def test_missing_publication_and_table_not_published_are_named(table: Database) -> None:
    db = table
    with pytest.raises(SourceError, match="publication 'nope' does not exist"):
        open_verify_snapshot(db.dsn, [TABLE], publication="nope")
    db.autocommit("CREATE TABLE other (id int PRIMARY KEY)")
    with pytest.raises(SourceError, match=r"ALTER PUBLICATION p ADD TABLE public\.other"):
        open_verify_snapshot(db.dsn, [TABLE, TableId("public", "other")], publication="p")


def test_a_role_without_replication_is_told_what_to_grant(table: Database) -> None:
    db = table
    db.autocommit("CREATE ROLE verifier LOGIN PASSWORD 'pw'",
                  "GRANT SELECT ON t TO verifier")
    dsn = db.cluster.dsn(db.name, user="verifier", password="pw")
    try:
        with pytest.raises(SourceError, match="ALTER ROLE verifier REPLICATION"):
            open_verify_snapshot(dsn, [TABLE], publication="p")
    finally:
        db.autocommit("DROP OWNED BY verifier", "DROP ROLE verifier")


def test_a_truncate_after_the_position_is_reported_as_such(table: Database) -> None:
    db = table
    db.execute("INSERT INTO t VALUES (1, 'a')")
    with contextlib.closing(open_verify_snapshot(db.dsn, [TABLE], publication="p")) as snap:
        db.execute("TRUNCATE t")
        with pytest.raises(TruncatedAfterSnapshotError, match=r"public\.t was truncated"):
            snap.changed_key_hashes(TABLE, SHAPE)


def test_a_long_transaction_is_named_when_the_slot_gives_up(table: Database) -> None:
    """Verify's slot waits for the transactions running when it is made: one still open
    after ``wait_s`` is named in the error (its pid), and no slot is left; one that ends
    while the slot waits lets the snapshot open, holding its change."""
    db = table
    with contextlib.closing(sql_connection(db.dsn)) as long:
        long.execute("INSERT INTO t VALUES (1, 'a')")  # open, holding a transaction id
        pid = long.info.backend_pid
        with pytest.raises(SourceError, match=rf"in 3 s: .* pid {pid} .* still runs"):
            open_verify_snapshot(db.dsn, [TABLE], publication="p", wait_s=3)
        assert db.settled_scalar("SELECT count(*) FROM pg_replication_slots WHERE slot_name "
                                 "LIKE 'tidemark_verify%'", 0) == 0
        timer = threading.Timer(1.0, long.commit)
        timer.start()
        snapshot = open_verify_snapshot(db.dsn, [TABLE], publication="p", wait_s=60)
        timer.join()
    try:
        assert snapshot.changed_key_hashes(TABLE, SHAPE) == frozenset()  # in it, not after
        with snapshot._conn.cursor() as cur:
            cur.execute("SELECT id, v FROM t")
            assert cur.fetchall() == [(1, "a")]
    finally:
        snapshot.close()
