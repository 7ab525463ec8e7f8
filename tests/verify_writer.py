"""A writer that keeps committing while a verify snapshot is taken, and logs what each
of its transactions did (to replay those before the snapshot's position and to list
the keys changed after it)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

#: What one transaction did: its id as the log knows it, its statements (to replay),
#: the keys it touched.
Logged = tuple[Any, list[tuple[str, Any]], set[int]]


class Writer(threading.Thread):
    """Commits one transaction after another on a DB-API connection until stopped:
    each inserts the next id and now and then updates, deletes, or moves (changes the
    key of) an earlier row. *commit* commits on the cursor and returns the
    transaction's id (an xid, a GTID)."""

    def __init__(self, connect: Callable[[], Any], commit: Callable[[Any], Any]) -> None:
        super().__init__(daemon=True)
        self._connect = connect
        self._commit = commit
        self.log: list[Logged] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            conn = self._connect()
            try:
                i = 0
                while not self.stop.is_set():
                    i += 1
                    with conn.cursor() as cur:
                        ops, touched = write_one(cur, i)
                        self.log.append((self._commit(cur), ops, touched))
            finally:
                conn.close()
        except BaseException as err:  # reported by the test
            self.error = err

    def finish(self) -> None:
        """Stop, and raise what failed in the thread."""
        self.stop.set()
        self.join(30)
        if self.error is not None:
            raise self.error


def write_one(cur: Any, i: int) -> tuple[list[tuple[str, Any]], set[int]]:
    """The statements of transaction *i* (in an open transaction on *cur*)."""
    ops: list[tuple[str, Any]] = [("insert", (i, f"v{i}"))]
    touched = {i}
    cur.execute("INSERT INTO t VALUES (%s, %s)", (i, f"v{i}"))
    if i % 3 == 0:
        cur.execute("UPDATE t SET v = CONCAT(v, 'u') WHERE id = %s", (i - 1,))
        if cur.rowcount:
            ops.append(("update", i - 1))
            touched.add(i - 1)
    if i % 5 == 0:
        cur.execute("DELETE FROM t WHERE id = %s", (i - 2,))
        if cur.rowcount:
            ops.append(("delete", i - 2))
            touched.add(i - 2)
    if i % 7 == 0:
        cur.execute("UPDATE t SET id = id + 1000000 WHERE id = %s", (i - 3,))
        if cur.rowcount:
            ops.append(("move", i - 3))
            touched.update((i - 3, i - 3 + 1_000_000))
    return ops, touched


def replay(ops: list[tuple[str, Any]], rows: dict[int, str]) -> None:
    """Apply a transaction's statements to *rows* (id -> v)."""
    for op, arg in ops:
        if op == "insert":
            rows[arg[0]] = arg[1]
        elif op == "update":
            rows[arg] += "u"
        elif op == "delete":
            del rows[arg]
        else:
            rows[arg + 1_000_000] = rows.pop(arg)
