"""Altering a captured SQLite table: ``tidemark logtable install --ddl "ALTER TABLE …"``
drops a column, adds one and renames one in the install's transaction; changes logged
before the statement and not read yet are delivered, those after it carry the new
columns, through the engine. A plain ``DROP COLUMN`` is refused by SQLite itself, and a
statement that fails names itself in one line."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from logtable_helpers import LogDb
from tidemark import Engine, LogTableConnector, MemoryOffsetStore
from tidemark.event import UNAVAILABLE, ChangeEvent
from tidemark.testing.sink import MemorySink
from waiting import wait_for


@pytest.fixture
def sqlite_db(tmp_path: Path) -> LogDb:
    path = tmp_path / "app.db"
    path.touch()
    return LogDb("sqlite", f"sqlite:///{path}", path)


def _install(db: LogDb, *ddl: str) -> subprocess.CompletedProcess[str]:
    args = [a for statement in ddl for a in ("--ddl", statement)]
    return subprocess.run([sys.executable, "-m", "tidemark", "logtable", "install", db.dsn,
                           *args], capture_output=True, text=True, timeout=120, check=False)


def _rows(sink: MemorySink) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for record in sink.records:
        event = record.event
        if isinstance(event, ChangeEvent) and record.value is not None:
            row = event.after if event.after is not None else event.before
            assert row is not None
            # A column the change did not set (added after it was logged, or left
            # unchanged by an update) is UNAVAILABLE; left out, as nulls are.
            out.append((event.op.value, {k: v for k, v in row.items()
                                         if v is not None and v is not UNAVAILABLE}))
    # Each key's changes in order (groups are read independently of each other).
    return sorted(out, key=lambda change: change[1]["id"])


def test_drop_add_and_rename_through_install_ddl_keep_every_change(sqlite_db: LogDb) -> None:
    db = sqlite_db
    db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT, gone TEXT, n INTEGER)")
    db.install(["t"])
    db.execute("INSERT INTO t VALUES (1, 'a', 'x', 10)")
    # SQLite checks the triggers on DROP COLUMN: they name the column.
    with pytest.raises(Exception, match=r"tidemark_cdc_t_.*no such column"):
        db.execute("ALTER TABLE t DROP COLUMN gone")

    done = _install(db, "ALTER TABLE t DROP COLUMN gone")
    assert done.returncode == 0, done.stderr
    db.execute("INSERT INTO t VALUES (2, 'b', 20)", "UPDATE t SET v = 'A' WHERE id = 1")
    done = _install(db, "ALTER TABLE t ADD COLUMN note TEXT",
                    "ALTER TABLE t RENAME COLUMN n TO amount")
    assert done.returncode == 0, done.stderr
    db.execute("INSERT INTO t VALUES (3, 'c', 30, 'hello')", "DELETE FROM t WHERE id = 2")

    bad = _install(db, "ALTER TABLE t DROP COLUMN nosuch")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr, bad.stderr
    assert "ALTER TABLE t DROP COLUMN nosuch" in bad.stderr and "nosuch" in bad.stderr

    sink = MemorySink()
    engine = Engine(LogTableConnector({"dsn": db.dsn, "poll_interval_ms": 50}), sink,
                    offset_store=MemoryOffsetStore())
    thread = threading.Thread(target=engine.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: len(_rows(sink)) >= 5, 60, "five changes")
        db.execute("UPDATE t SET amount = 31, note = 'again' WHERE id = 3")
        wait_for(lambda: len(_rows(sink)) >= 6, 60, "the change after the engine started")
    finally:
        engine.close()
        thread.join(timeout=30)
    rows = _rows(sink)
    # The changes logged before the rename carry the amount under its new name, and the
    # dropped column is gone from every change (the engine reads the table's columns).
    assert rows == [
        ("c", {"id": 1, "v": "a", "amount": 10}),
        ("u", {"id": 1, "v": "A"}),
        ("c", {"id": 2, "v": "b", "amount": 20}),
        ("d", {"id": 2}),
        ("c", {"id": 3, "v": "c", "amount": 30, "note": "hello"}),
        ("u", {"id": 3, "amount": 31, "note": "again"}),
    ]
