"""The log tables' verify snapshot (tidemark.source.logtable.verify_snapshot): with a
writer running, the snapshot sees exactly the transactions committed before its
position, a pipeline offset at or past the position has read all of them, and
``changed_key_hashes`` are exactly the keys written after it."""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import pyarrow as pa

from logtable_helpers import LogDb
from tidemark.event import TableId
from tidemark.row_checksum import ComparedColumn, TableShape, key_hash_of, reference_bucket_sums
from tidemark.source.logtable.kind import KIND
from tidemark.source.logtable.reader import open_database
from tidemark.source.logtable.verify_snapshot import sees_all_of
from tidemark.source.verify_snapshot import ReachedByOffset
from waiting import wait_for

_COUNTER = 1000  # the row every transaction sets to its number
_SHAPE = TableShape((ComparedColumn("id", pa.int64()), ComparedColumn("v", pa.string())),
                    ("id",))


class _Writer(threading.Thread):
    """Transactions numbered 1, 2, …: each upserts or deletes one key and sets the
    counter row to its number; ``done`` lists each committed one's key and op (``n``: a
    delete that found no row)."""

    def __init__(self, db: LogDb) -> None:
        super().__init__(daemon=True)
        self.db = db
        self.stop = threading.Event()
        self.done: list[tuple[int, str]] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with self.db.connection() as conn:
                cur = conn.cursor()
                n = 0
                while not self.stop.is_set():
                    n += 1
                    key = n % 40
                    op = "d" if n % 3 == 0 else "u"
                    cur.execute("BEGIN")
                    if op == "d":
                        cur.execute(f"DELETE FROM t WHERE id = {key}")
                        if cur.rowcount == 0:
                            op = "n"  # nothing deleted: no change, nothing logged
                    else:
                        cur.execute(f"INSERT INTO t VALUES ({key}, 'w{n}') "
                                    "ON CONFLICT (id) DO UPDATE SET v = excluded.v")
                    cur.execute(f"UPDATE t SET v = '{n}' WHERE id = {_COUNTER}")
                    cur.execute("COMMIT")
                    self.done.append((key, op))
        except BaseException as err:  # reported by the test
            self.error = err


def _state(writes: list[tuple[int, str]], upto: int) -> dict[int, str]:
    """The table after the first *upto* transactions."""
    rows = {i: "start" for i in range(40)}
    for n, (key, op) in enumerate(writes[:upto], start=1):
        if op == "d":
            del rows[key]
        elif op == "u":
            rows[key] = f"w{n}"
    rows[_COUNTER] = str(upto) if upto else "0"
    return rows


def _hash(key: int) -> int:
    return key_hash_of((str(key), None), _SHAPE)


def _seen(logdb: LogDb, snapshot: Any) -> dict[int, str]:
    """The table as the snapshot sees it."""
    if logdb.kind == "sqlite":
        side = snapshot.side(TableId("main", "t"))
        texts = side.bucket_rows(_SHAPE, 1, [0])
        return {int(t[0]): t[1] for _, t in texts}
    # PostgreSQL's dialect is another module's: read the rows in the snapshot itself.
    with snapshot._conn.cursor() as cur:
        cur.execute("SELECT id, v FROM t")
        return {int(i): str(v) for i, v in cur.fetchall()}


def test_the_snapshot_and_the_changes_after_it(logdb: LogDb) -> None:
    logdb.execute("CREATE TABLE t (id integer PRIMARY KEY, v text)",
                  *(f"INSERT INTO t VALUES ({i}, 'start')" for i in range(40)),
                  f"INSERT INTO t VALUES ({_COUNTER}, '0')")
    logdb.install(["t"], streams=8, groups=2)
    table = TableId("main" if logdb.kind == "sqlite" else "public", "t")
    writer = _Writer(logdb)
    writer.start()
    with contextlib.closing(open_database(logdb.dsn)) as db:
        groups = db.generations()[0].groups
        start = db.start_position()
        entries = db.tables(["t"])

        def offset() -> dict[str, Any]:
            end = db.end_position()
            return {"groups": {str(g): end for g in range(groups)}, "clock": db.clock()}

        try:
            wait_for(lambda: len(writer.done) >= 20, 30, "the writer's first commits")
            before = offset()
            count = len(writer.done)
            wait_for(lambda: len(writer.done) > count + 3, 30, "commits after an offset")
            snapshot = KIND.verify_snapshot(logdb.dsn, [table], publication="")
            try:
                seen = _seen(logdb, snapshot)
                upto = int(seen[_COUNTER])
                # The writer notes a transaction after its COMMIT returns: the snapshot
                # may have seen it first.
                wait_for(lambda: len(writer.done) >= upto, 30,
                         "the writer to note the commits the snapshot saw")
                assert seen == _state(writer.done, upto)
                # An offset taken before commits the snapshot holds has not reached it.
                assert KIND.log_position(before) < snapshot.position
                count = len(writer.done)
                wait_for(lambda: len(writer.done) > count + 10, 30, "commits after it")
                # A later offset reaches the position and has read all it holds.
                after = wait_for(lambda: (o := offset()) and
                                 KIND.log_position(o) >= snapshot.position and o,
                                 30, "an offset at the snapshot's position")
                end = after["groups"]["0"]
                read = [row for page in db.read_range(list(range(groups)), start, end,
                                                      entries, 1000) for row in page]
                counters = [int(row.values[1]) for row in read
                            if row.values[0] == str(_COUNTER) and row.values[1]]
                assert max(counters) >= upto
                writer.stop.set()
                writer.join(30)
                assert writer.error is None
                changed = snapshot.changed_key_hashes(table, _SHAPE)
                expected = {_hash(key) for key, op in writer.done[upto:] if op != "n"}
                if len(writer.done) > upto:
                    expected.add(_hash(_COUNTER))
                assert changed == expected
            finally:
                snapshot.close()
        finally:
            writer.stop.set()
            writer.join(30)
    assert writer.error is None


def test_a_char_key_and_column_of_a_postgres_log_table(db: Any) -> None:
    """The log table's reader reads ``char(n)`` as its cast to text (no padding): the
    snapshot's checksums and changed keys take it so too."""
    logdb = LogDb("postgres", db.dsn)
    logdb.execute("CREATE TABLE t (k char(5) PRIMARY KEY, v char(4))",
                  "INSERT INTO t VALUES ('ab', 'x'), ('cd', NULL)")
    logdb.install(["t"])
    table = TableId("public", "t")
    shape = TableShape((ComparedColumn("k", pa.string()), ComparedColumn("v", pa.string())),
                       ("k",))
    rows = [{"k": "ab", "v": "x"}, {"k": "cd", "v": None}]
    snapshot = KIND.verify_snapshot(db.dsn, [table], publication="")
    try:
        side = snapshot.side(table)
        assert sorted(t for _, t in side.bucket_rows(shape, 1, [0])) == \
            [("ab", "x"), ("cd", None)]
        assert side.bucket_sums(shape, 4) == reference_bucket_sums(rows, shape, 4)
        logdb.execute("UPDATE t SET v = 'y' WHERE k = 'ab'")
        assert snapshot.changed_key_hashes(table, shape) == {
            key_hash_of(("ab", "x"), shape)}
    finally:
        snapshot.close()


def test_which_snapshot_sees_all_another_sees() -> None:
    # The same; a later one (11 ended, 12..14 began and ended); 10 still running in both.
    assert sees_all_of("10:12:10,11", "10:12:10,11")
    assert sees_all_of("10:15:10", "10:12:10,11")
    # 9 in progress in the first, finished (seen) in the second: the first is older.
    assert not sees_all_of("9:15:9,10", "10:12:10,11")
    # Below the second's xmax: 11 may have committed in between.
    assert not sees_all_of("10:11:10", "10:12:10")


def test_a_long_transaction_does_not_hold_the_position_back(db: Any) -> None:
    """An offset taken after the snapshot has reached it, although a transaction that
    began before both is still running (its xmin stays below the snapshot's xmax);
    one taken before it has not."""
    logdb = LogDb("postgres", db.dsn)
    logdb.execute("CREATE TABLE t (id int PRIMARY KEY, v text)",
                  "CREATE TABLE other (id int PRIMARY KEY)")
    logdb.install(["t"], streams=8, groups=2)
    table = TableId("public", "t")
    with contextlib.closing(open_database(db.dsn)) as reader, \
            logdb.connection() as long:
        groups = reader.generations()[0].groups

        def offset() -> dict[str, Any]:
            return {"groups": {str(g): reader.end_position() for g in range(groups)}}

        cur = long.cursor()
        cur.execute("BEGIN")
        cur.execute("INSERT INTO other VALUES (1)")  # holds a transaction id
        logdb.execute("INSERT INTO t VALUES (1, 'a')")
        before = offset()
        logdb.execute("INSERT INTO t VALUES (2, 'b')")
        snapshot = KIND.verify_snapshot(db.dsn, [table], publication="")
        try:
            assert isinstance(snapshot, ReachedByOffset)
            after = offset()
            assert not snapshot.reached_by(before)
            assert snapshot.reached_by(after)
            assert KIND.log_position(after) < snapshot.position  # what held it back
            assert not snapshot.reached_by({**after, "snapshot": ["public.t"]})
            cur.execute("INSERT INTO t VALUES (3, 'c')")
            cur.execute("COMMIT")
            # Committed after the snapshot: a changed key, not a snapshot row.
            assert snapshot.changed_key_hashes(table, _SHAPE) == {_hash(3)}
            assert snapshot.reached_by(offset())
        finally:
            snapshot.close()
