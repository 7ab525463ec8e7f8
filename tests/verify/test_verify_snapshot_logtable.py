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
from tidemark.row_checksum import ComparedColumn, TableShape, key_hash_of
from tidemark.source.logtable.kind import KIND
from tidemark.source.logtable.reader import open_database
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
        return {int(t[0]): t[1] for t in texts.values()}
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
