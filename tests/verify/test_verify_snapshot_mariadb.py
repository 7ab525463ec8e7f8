"""MariaDB's verify snapshot: exact at its binlog position while a writer runs, and the
keys changed after it (tidemark.source.mariadb.verify_snapshot)."""

from __future__ import annotations

import contextlib
import datetime as dt
import decimal
from typing import Any

import pyarrow as pa
import pytest

from conftest import MariaDatabase
from tidemark.errors import SourceError
from tidemark.event import TableId
from tidemark.row_checksum import ComparedColumn, TableShape, key_hash_of, row_texts
from tidemark.source.mariadb.kind import KIND
from tidemark.source.mariadb.position import ordering_key
from tidemark.source.mariadb.verify_snapshot import open_verify_snapshot
from verify_writer import Writer, replay
from waiting import wait_for

SHAPE = TableShape((ComparedColumn("id", pa.int32()), ComparedColumn("v", pa.string())),
                   ("id",))


def _hash(shape: TableShape, **key: Any) -> int:
    row = {c.name: key.get(c.name) for c in shape.columns}
    return key_hash_of(row_texts(row, shape), shape)


def _commit_gtid(cur: Any) -> str:
    cur.connection.commit()
    cur.execute("SELECT @@last_gtid")
    return str(cur.fetchone()[0])


def _transactional(mdb: MariaDatabase) -> Any:
    conn = mdb.server.connect(mdb.name)
    conn.autocommit(False)
    return conn


def _commit_positions(mdb: MariaDatabase) -> dict[str, int]:
    """Each transaction's end in the binlog (after its XID event), by GTID."""
    ends: dict[str, int] = {}
    for (file, *_) in mdb.query("SHOW BINARY LOGS"):
        gtid = None
        for _, _, kind, _, end, info in mdb.query(f"SHOW BINLOG EVENTS IN '{file}'"):
            if kind == "Gtid":
                gtid = str(info).split()[-1]
            elif kind == "Xid" and gtid is not None:
                ends[gtid] = ordering_key(file, int(end))
    return ends


def test_snapshot_is_exact_at_its_position_and_lists_keys_changed_after(
        mdb: MariaDatabase) -> None:
    mdb.execute("CREATE TABLE t (id int PRIMARY KEY, v varchar(200))")
    table = TableId(mdb.name, "t")
    writer = Writer(lambda: _transactional(mdb), _commit_gtid)
    writer.start()
    try:
        wait_for(lambda: len(writer.log) >= 40, 60, "the writer's first transactions")
        snapshot = KIND.verify_snapshot(mdb.dsn, [table], publication="")
        try:
            opened = len(writer.log)
            wait_for(lambda: len(writer.log) >= opened + 40, 60,
                     "transactions after the snapshot")
            running = snapshot.changed_key_hashes(table, SHAPE)  # while the writer writes
            writer.finish()
            after = snapshot.changed_key_hashes(table, SHAPE)
            with snapshot.connection.cursor() as cur:  # type: ignore[attr-defined]
                cur.execute("SELECT id, v FROM t")
                seen = dict(cur.fetchall())
            position = snapshot.position
            # The units a pipeline's committed offset is read in.
            at = snapshot.binlog_position  # type: ignore[attr-defined]
            assert KIND.log_position(at.to_offset()) == position
        finally:
            snapshot.close()
    finally:
        writer.stop.set()
        writer.join(30)
    ends = _commit_positions(mdb)
    expected: dict[int, str] = {}
    keys_after: set[int] = set()
    before = 0
    for gtid, ops, touched in writer.log:
        if ends[gtid] <= position:
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


def test_changed_keys_of_a_composite_key_as_the_target_holds_them(
        mdb: MariaDatabase) -> None:
    mdb.execute("CREATE TABLE k (name varchar(20), at datetime(6), n decimal(10,2), "
                "d date, x int, PRIMARY KEY (name, at, n, d))")
    shape = TableShape((ComparedColumn("name", pa.string()),
                        ComparedColumn("at", pa.timestamp("us")),
                        ComparedColumn("n", pa.decimal128(10, 2)),
                        ComparedColumn("d", pa.date32()), ComparedColumn("x", pa.int32())),
                       ("name", "at", "n", "d"))
    at = dt.datetime(2024, 5, 6, 7, 8, 9, 123456)
    day = dt.date(1999, 12, 31)
    mdb.execute("INSERT INTO k VALUES ('é a', %s, 1.5, %s, 1), ('b', %s, -2, %s, 2)",
                params=(at, day, at, day))
    table = TableId(mdb.name, "k")
    with contextlib.closing(open_verify_snapshot(mdb.dsn, [table])) as snap:
        assert snap.changed_key_hashes(table, shape) == frozenset()
        mdb.execute("UPDATE k SET name = 'c' WHERE name = 'é a'",
                    "UPDATE k SET x = 3 WHERE name = 'b'")
        mdb.execute("DELETE FROM k WHERE name = 'c'")
        changed = snap.changed_key_hashes(table, shape)
    num = decimal.Decimal
    assert changed == {_hash(shape, name="é a", at=at, n=num("1.5"), d=day),
                       _hash(shape, name="c", at=at, n=num("1.5"), d=day),
                       _hash(shape, name="b", at=at, n=num("-2"), d=day)}


def test_a_user_without_replication_slave_is_told_what_to_grant(
        mdb: MariaDatabase) -> None:
    mdb.execute("CREATE USER 'verifier'@'%' IDENTIFIED BY 'pw'",
                f"GRANT SELECT ON `{mdb.name}`.* TO 'verifier'@'%'")
    dsn = mdb.dsn.replace(mdb.dsn.split("//", 1)[1].split("@", 1)[0], "verifier:pw", 1)
    try:
        with pytest.raises(SourceError, match=r"GRANT .*REPLICATION SLAVE"):
            open_verify_snapshot(dsn, [TableId(mdb.name, "t")])
    finally:
        mdb.execute("DROP USER 'verifier'@'%'")
