"""One face for the two log-table databases in tests: a PostgreSQL database of the
session cluster, or a SQLite file; both run the same SQL for the tests' tables."""

from __future__ import annotations

import contextlib
import sqlite3
import time
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


def drain(r: LogTableReader, timeout_s: float = 30.0) -> list[ChangeEvent]:
    """Everything *r* has to read now: polls until every group is idle."""
    events: list[ChangeEvent] = []
    # An idle reader's polls return at once without looking until its poll interval
    # has passed: idle means nothing came for longer than that.
    interval_s = r.config.poll_interval_ms / 1000
    quiet_since: float | None = None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        batch = r.poll()
        events.extend(batch.records)  # type: ignore[arg-type]
        now = time.monotonic()
        if batch.records:
            quiet_since = None
        elif quiet_since is None:
            quiet_since = now
        elif now - quiet_since > interval_s:
            return events
        else:
            time.sleep(0.002)  # paces the polls of an idle reader
    raise AssertionError(f"the reader never went idle within {timeout_s}s")


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
