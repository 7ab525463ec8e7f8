"""One face for the two log-table databases in tests: a PostgreSQL database of the
session cluster, or a SQLite file; both run the same SQL for the tests' tables."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from tidemark.event import UNAVAILABLE, ChangeEvent, Op
from tidemark.offsets.store import OffsetReader
from tidemark.source.logtable import postgres_install, sqlite_install
from tidemark.source.logtable.config import LogTableSourceConfig
from tidemark.source.logtable.reader import LogTableReader
from tidemark.testing.postgres import sql_connection


class LogDb:
    """A database with log tables; ``kind`` is ``postgres`` or ``sqlite``."""

    def __init__(self, kind: str, dsn: str, path: Path | None = None) -> None:
        self.kind = kind
        self.dsn = dsn
        self.path = path

    @contextlib.contextmanager
    def connection(self) -> Iterator[Any]:
        if self.kind == "sqlite":
            assert self.path is not None
            conn = sqlite3.connect(self.path, isolation_level=None, timeout=30)
        else:
            conn = sql_connection(self.dsn)
            conn.autocommit = True
        try:
            yield conn
        finally:
            conn.close()

    def execute(self, *statements: str) -> None:
        """Run *statements* in one transaction."""
        with self.connection() as conn:
            cur = conn.cursor()
            cur.execute("BEGIN")
            for statement in statements:
                cur.execute(statement)
            cur.execute("COMMIT")

    def query(self, statement: str) -> list[tuple[Any, ...]]:
        with self.connection() as conn:
            cur = conn.cursor()
            cur.execute(statement)
            return list(cur.fetchall())

    def install(self, tables: Sequence[str], **kwargs: Any) -> None:
        with self.connection() as conn:
            if self.kind == "sqlite":
                sqlite_install.install(conn, tables, **kwargs)
            else:
                postgres_install.install(conn, tables, **kwargs)

    def uninstall(self, tables: Sequence[str] = ()) -> None:
        with self.connection() as conn:
            if self.kind == "sqlite":
                sqlite_install.uninstall(conn, tables)
            else:
                postgres_install.uninstall(conn, tables)

    def table(self, name: str) -> str:
        """*name* as the reader's events name it (``public.t`` / ``main.t``)."""
        return f"{'main' if self.kind == 'sqlite' else 'public'}.{name}"


def reader(db: LogDb, *, store: OffsetReader | None = None, **settings: Any) -> LogTableReader:
    """A started reader of *db* (settings are LogTableSourceConfig's)."""
    # A short idle wait: tests drain readers often.
    settings = {"poll_interval_ms": 20, **settings}
    r = LogTableReader(LogTableSourceConfig.from_mapping({"dsn": db.dsn, **settings}))
    r.start(store=store)
    return r


def drain(r: LogTableReader, max_polls: int = 10_000) -> list[ChangeEvent]:
    """Everything *r* has to read now: polls until every group is idle."""
    events: list[ChangeEvent] = []
    idle = 0
    for _ in range(max_polls):
        batch = r.poll()
        events.extend(batch.records)  # type: ignore[arg-type]
        idle = 0 if batch.records else idle + 1
        if idle >= 2:
            return events
    raise AssertionError("the reader never went idle")


def replay(events: Sequence[ChangeEvent], state: dict[Any, dict[str, Any]] | None = None
           ) -> dict[Any, dict[str, Any]]:
    """Apply *events* to *state* (key -> row) as ``apply_changes`` would: unchanged
    columns keep their value."""
    state = {} if state is None else state
    for event in events:
        key = tuple((event.key or {}).values())
        if event.op is Op.DELETE:
            state.pop(key, None)
            continue
        after = event.after or {}
        row = dict(state.get(key, {}))
        for name, value in after.items():
            if value is not UNAVAILABLE:
                row[name] = value
        state[key] = row
    return state
