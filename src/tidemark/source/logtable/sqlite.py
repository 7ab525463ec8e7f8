"""Reading SQLite log tables: one writer at a time makes ``cdc$time`` the commit order.

A group's position is the last ``cdc$time`` read (``{"after": time}``): a transaction in
progress holds times above every committed one, and a reader in WAL mode sees only
committed rows, so nothing can appear later below a position. All tables of a read are
queried in one read transaction (one snapshot), so the merge across tables never skips
a row that another table's page passed over.

SQLite declares types loosely; a column maps to a logical type by its declared type's
affinity (``INTEGER`` → int64, ``REAL`` → float64, ``TEXT`` → string, ``BLOB`` → bytes,
``BOOLEAN`` → bool, ``NUMERIC``/``DECIMAL`` → a decimal of variable scale). A stored
value of another type than its column's (SQLite allows ``'abc'`` in an INTEGER column
unless the table is STRICT) stops the reader with an error naming it
(:mod:`tidemark.source.logtable.sqlite_types`).
"""

from __future__ import annotations

import contextlib
import functools
import heapq
import json
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from tidemark.errors import ConfigError, SourceError, SourceUnavailableError
from tidemark.event import UNAVAILABLE, TableId, WireValue
from tidemark.fetch_budget import FetchBudget
from tidemark.source.logtable import layout
from tidemark.source.logtable import sqlite_install as install
from tidemark.source.logtable.database import (
    ROW_OVERHEAD_BYTES,
    LogRow,
    LogTable,
    Position,
    ReaderPosition,
    ReadResult,
    Snapshotted,
    fetched,
    merged_pages,
)
from tidemark.source.logtable.sqlite_types import table_schema, wire_value

SCHEMES = ("sqlite://", "sqlite:")


def sqlite_path(dsn: str) -> Path:
    """The file a ``sqlite:///abs/path.db`` or ``sqlite:relative.db`` DSN names."""
    text = dsn.strip()
    for scheme in SCHEMES:
        if text.lower().startswith(scheme):
            text = text[len(scheme):]
            break
    if not text:
        raise ConfigError("dsn", f"{dsn!r} names no file: write sqlite:///path/to/file.db")
    # sqlite:////abs/path (SQLAlchemy's spelling of an absolute path) leaves "//abs".
    return Path("/" + text.lstrip("/")) if text.startswith("//") else Path(text)


def _dsn_of(path: Path) -> str:
    return f"sqlite://{path}" if path.is_absolute() else f"sqlite:{path}"


def connect(dsn: str) -> sqlite3.Connection:
    """A connection to an existing SQLite file, in autocommit mode (explicit BEGINs)."""
    path = sqlite_path(dsn)
    if not path.is_file():
        raise SourceError(f"SQLite database {path} does not exist")
    try:
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False,
                               timeout=30.0)
    except sqlite3.Error as err:
        raise SourceError(f"cannot open SQLite database {path}: {err}") from None
    return conn


class SqliteLogDatabase:
    """Log tables in one SQLite file."""

    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        self._path = sqlite_path(dsn)
        self._conn = connect(dsn)
        self._queries: dict[tuple[str, int | None], str] = {}
        self._epoch = _epoch(self._conn)

    @property
    def connector(self) -> str:
        return "sqlite"

    @property
    def database(self) -> str:
        return self._path.stem

    def generations(self) -> list[layout.Generation]:
        generations = install.generations(self._conn)
        layout.check_generations(generations, f"{self._path} ({install.STREAMS_TABLE})")
        return generations

    def tables(self, include: list[str]) -> list[LogTable]:
        installed = install.installed_tables(self._conn)
        wanted = [install.table_name(n) for n in include] if include else installed
        for table in wanted:
            if table not in installed:
                raise ConfigError("tables", f"table {table!r} has no log table: run "
                                  f"`tidemark logtable install {_dsn_of(self._path)} "
                                  f"--table {table}`")
        if not wanted:
            raise ConfigError("tables", f"{self._path} has no captured tables: run "
                              "`tidemark logtable install` first")
        out = [LogTable(TableId("main", t), layout.log_table_name(t), table_schema(self._conn, t))
               for t in wanted]
        self.check_unchanged(out)
        return out

    def behind(self, group: int, position: Position, tables: list[LogTable]) -> int:
        q = install.quote
        return sum(int(self._conn.execute(
            f"SELECT count(*) FROM {q(entry.log)} WHERE {q(layout.GROUP)} = ? AND "
            f"{q(layout.TIME)} > ?", (group, _after(position))).fetchone()[0])
            for entry in tables)

    def check_unchanged(self, tables: list[LogTable]) -> None:
        for entry in tables:
            present = {name for name, _, _ in install.table_columns(self._conn, entry.log)}
            if not present:
                raise SourceError(f"the log table {entry.log} of {entry.table.table} is "
                                  "missing (dropped?): run `tidemark logtable install` for it; "
                                  "changes made since it was dropped were not logged")
            missing = [name for name, _, _ in install.table_columns(self._conn,
                                                                    entry.table.table)
                       if name not in present]
            if missing:
                raise SourceError(f"table {entry.table.table} has column(s) "
                                  f"{', '.join(missing)} that its log table lacks: run "
                                  "`tidemark logtable install` for it")
            # A table rebuilt by a migration (create, copy, drop, rename) lost them.
            triggers = {name for (name,) in self._conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name = ?",
                (entry.table.table,))}
            lost = [t for t in install.trigger_names(entry.table.table) if t not in triggers]
            if lost:
                raise SourceError(f"table {entry.table.table} lacks its trigger(s) "
                                  f"{', '.join(lost)} (rebuilt by a migration?): changes are "
                                  "not logged. Run `tidemark logtable install` for it, then "
                                  "re-load it")

    def start_position(self) -> Position:
        return self._position(0)

    def _position(self, after: int) -> Position:
        return {"after": after} if self._epoch is None else {"after": after,
                                                              "log": self._epoch}

    def check_positions(self, positions: Iterable[Position]) -> None:
        fix = ("Remove this reader's saved positions (its offsets, or a Spark query's "
               "checkpoint) to read the log from its start")
        clock: int | None = None
        for position in positions:
            after, log_id = _after(position), position.get("log")
            if log_id is not None and self._epoch is not None and log_id != self._epoch:
                raise ConfigError(
                    "offsets", f"saved position {after} in the log tables of {self._path} "
                    "was taken in an earlier install of them (they were uninstalled and "
                    "installed again, e.g. to change the number of groups, and the new "
                    "clock started at 0): from it, the new log's first changes would be "
                    f"skipped. {fix}")
            clock = self.clock() if clock is None else clock
            if after > clock:
                raise ConfigError(
                    "offsets", f"saved position {after} is ahead of the clock of the log "
                    f"tables of {self._path} ({clock}): they were installed again or the "
                    "database restored from an older copy, and from there the changes "
                    f"logged until the clock passes it would be skipped. {fix}")

    def _query(self, entry: LogTable, groups: int | None = None) -> str:
        """One table's query: a page of one group, or (*groups* given) every row of
        that many groups, unpaged (for a streamed read)."""
        key = (entry.log, groups)
        query = self._queries.get(key)
        if query is None:
            q = install.quote
            values = []
            for column in entry.schema.columns:
                values.append(q(column.name))
                if not column.is_key:
                    values.append(q(layout.deleted_column(column.name)))
            which = "= ?" if groups is None else f"IN ({', '.join('?' * groups)})"
            query = (f"SELECT {q(layout.TIME)}, {q(layout.STREAM)}, "
                     f"{q(layout.GENERATION)}, {q(layout.OPERATION)}, {q(layout.BATCH_SEQ)}, "
                     f"{q(layout.TS)}, {', '.join(values)} "
                     f"FROM {q(entry.log)} WHERE {q(layout.GROUP)} {which} "
                     f"AND {q(layout.TIME)} > ? AND {q(layout.TIME)} <= ? "
                     f"ORDER BY {q(layout.TIME)}" + (" LIMIT ?" if groups is None else ""))
            self._queries[key] = query
        return query

    def end_position(self) -> Position:
        return self._position(self.clock())

    def clock(self) -> int:
        clock = self._conn.execute(f"SELECT time FROM {install.CLOCK_TABLE}").fetchone()
        return int(clock[0]) if clock else 0

    def position_key(self, position: Position) -> int:
        return _after(position)

    def read_range(self, groups: Sequence[int], start: Position, end: Position,
                   tables: list[LogTable], fetch_rows: int) -> Iterator[list[LogRow]]:
        after, until = _after(start), _after(end)
        if after >= until:
            return
        conn = connect(self._dsn)
        try:
            conn.execute("BEGIN")  # one snapshot for every table's scan
            streams = []
            budgets = []
            for index, entry in enumerate(tables):
                cursor = conn.execute(self._query(entry, len(groups)),
                                      (*groups, after, until))
                budgets.append(FetchBudget(fetch_rows))
                streams.append(_streamed(index, entry, cursor, budgets[-1]))
            yield from merged_pages(streams, budgets)
            conn.execute("COMMIT")
        finally:
            conn.close()

    def range_bytes(self, groups: Sequence[int], start: Position, end: Position,
                    tables: list[LogTable]) -> int:
        after, until = _after(start), _after(end)
        if after >= until:
            return 0
        q = install.quote
        total = 0
        try:
            for entry in tables:
                # A value's bytes as the read hands them on (UTF-8 text, blobs as they are).
                sizes = " + ".join(f"coalesce(length(CAST({q(c.name)} AS BLOB)), 0)"
                                   for c in entry.schema.columns)
                rows, size = self._conn.execute(
                    f"SELECT count(*), coalesce(sum({sizes}), 0) FROM {q(entry.log)} "
                    f"WHERE {q(layout.GROUP)} IN ({', '.join('?' * len(groups))}) "
                    f"AND {q(layout.TIME)} > ? AND {q(layout.TIME)} <= ?",
                    (*groups, after, until)).fetchone()
                total += int(size) + int(rows) * ROW_OVERHEAD_BYTES
        except sqlite3.OperationalError as err:
            if "locked" in str(err) or "busy" in str(err):
                raise SourceUnavailableError(f"sizing the log of {self._path}: {err}") from None
            raise SourceError(f"sizing the log of {self._path}: {err}") from None
        return total

    def tick(self) -> None:
        self._write("move the log's clock on", lambda: self._conn.execute(
            f"UPDATE {install.CLOCK_TABLE} SET time = time + 1"))

    @contextlib.contextmanager
    def read_view(self) -> Iterator[tuple[Position, sqlite3.Connection]]:
        conn = connect(self._dsn)
        try:
            # One read transaction: the clock and the rows are one state of the database.
            conn.execute("BEGIN")
            clock = conn.execute(f"SELECT time FROM {install.CLOCK_TABLE}").fetchone()
            yield self._position(int(clock[0]) if clock else 0), conn
        finally:
            conn.close()

    @contextlib.contextmanager
    def snapshot(self, tables: list[LogTable], fetch_rows: int
                 ) -> Iterator[tuple[Position, Iterator[Snapshotted]]]:
        with self.read_view() as (position, conn):

            def rows() -> Iterator[Snapshotted]:
                for index, entry in enumerate(tables):
                    names = ", ".join(install.quote(c.name) for c in entry.schema.columns)
                    cursor = conn.execute(
                        f"SELECT {names} FROM {install.quote(entry.table.table)}")
                    for page in fetched(cursor, FetchBudget(fetch_rows)):
                        yield index, [snapshot_row(entry, row) for row in page]

            yield position, rows()

    def read(self, group: int, position: Position, tables: list[LogTable],
             limit: int) -> ReadResult:
        return self._read(group, _after(position), None, tables, limit)

    def _read(self, group: int, after: int, until: int | None, tables: list[LogTable],
              limit: int) -> ReadResult:
        position: Position = self._position(after)
        pages: list[list[LogRow]] = []
        full = False
        try:
            self._conn.execute("BEGIN")
            try:
                for index, entry in enumerate(tables):
                    fetched = self._conn.execute(
                        self._query(entry), (group, after, until if until is not None
                                             else _NO_LIMIT, limit)).fetchall()
                    full = full or len(fetched) >= limit
                    pages.append(_rows(index, entry, fetched))
            finally:
                self._conn.execute("COMMIT")
        except sqlite3.OperationalError as err:
            if "locked" in str(err) or "busy" in str(err):
                raise SourceUnavailableError(f"reading {self._path}: {err}") from None
            raise SourceError(f"reading the log tables of {self._path}: {err}") from None
        rows = list(heapq.merge(*pages, key=lambda row: row.time))[:limit]
        if rows:
            position = self._position(rows[-1].time)
        return ReadResult(rows, position, not full)

    def register(self, reader: str, positions: Mapping[int, Position]) -> None:
        rows = [(reader, g, json.dumps(p)) for g, p in positions.items()]
        self._write("register the reader's positions", lambda: self._conn.executemany(
            f"INSERT INTO {install.READERS_TABLE} (reader, grp, position, updated_at) "
            "VALUES (?, ?, ?, strftime('%Y-%m-%d %H:%M:%f', 'now')) ON CONFLICT "
            "(reader, grp) DO UPDATE SET position = excluded.position, "
            "updated_at = excluded.updated_at", rows))

    def readers(self) -> list[ReaderPosition]:
        if not self._conn.execute("SELECT 1 FROM sqlite_master WHERE name = ?",
                                  (install.READERS_TABLE,)).fetchone():
            return []
        return [ReaderPosition(r, int(g), json.loads(p), u) for r, g, p, u in self._conn.execute(
            f"SELECT reader, grp, position, updated_at FROM {install.READERS_TABLE} "
            "ORDER BY 1, 2")]

    def forget(self, reader: str) -> int:
        cursor = self._conn.execute(f"DELETE FROM {install.READERS_TABLE} WHERE reader = ?",
                                    (reader,))
        return int(cursor.rowcount)

    def prune(self, groups: Sequence[int], tables: list[LogTable], retention_s: float) -> int:
        bounds: dict[int, int] = {}
        for registered in self.readers():
            after = _after(registered.position)
            bounds[registered.group] = min(bounds.get(registered.group, after), after)
        q = install.quote
        cutoff = f"{install.NOW_MICROS} - {int(retention_s * 1_000_000)}"
        deleted = 0
        for group in groups:
            if group not in bounds:
                continue  # no reader has saved a position in it yet
            for entry in tables:
                statement = (f"DELETE FROM {q(entry.log)} WHERE {q(layout.GROUP)} = ? AND "
                             f"{q(layout.TIME)} <= ? AND {q(layout.TS)} < {cutoff}")
                deleted += self._write("delete read log rows", functools.partial(
                    self._conn.execute, statement, (group, bounds[group])))
        return deleted

    def _write(self, what: str, statement: Callable[[], sqlite3.Cursor]) -> int:
        """Run a write; the application holding the write lock makes it transient."""
        try:
            return int(statement().rowcount)
        except sqlite3.OperationalError as err:
            if "locked" in str(err) or "busy" in str(err):
                raise SourceUnavailableError(f"cannot {what} in {self._path}: {err}") from None
            raise SourceError(f"cannot {what} in {self._path}: {err}") from None

    def close(self) -> None:
        self._conn.close()


_NO_LIMIT = (1 << 63) - 1


def _epoch(conn: sqlite3.Connection) -> str | None:
    """This install's name (None for one made before installs had one)."""
    try:
        row = conn.execute(f"SELECT epoch FROM {install.CLOCK_TABLE}").fetchone()
    except sqlite3.OperationalError:
        return None
    return str(row[0]) if row and row[0] is not None else None


def _after(position: Position) -> int:
    try:
        return int(position["after"])
    except (KeyError, TypeError, ValueError):
        raise ConfigError("offset", f"stored position {position!r} is not a SQLite log "
                          "position ({\"after\": time}): was it written by another "
                          "source?") from None


def _streamed(index: int, entry: LogTable, cursor: sqlite3.Cursor,
              budget: FetchBudget) -> Iterator[LogRow]:
    for page in fetched(cursor, budget):
        yield from _rows(index, entry, page)


def _text(value: WireValue) -> str | None:
    """Snapshot values go to Spark as text (bytes as their hex text)."""
    return value if isinstance(value, str) else None


def snapshot_row(entry: LogTable, row: Sequence[Any]) -> tuple[str | None, ...]:
    """A row of *entry*'s table as stored (its columns in order) as a snapshot hands it
    on: each value its column's wire text."""
    return tuple(None if v is None else _text(wire_value(
        c.logical.kind, v, entry.table.table, c.name, 0))
        for c, v in zip(entry.schema.columns, row, strict=True))


def _rows(index: int, entry: LogTable, fetched: list[tuple[Any, ...]]) -> list[LogRow]:
    columns = entry.schema.columns
    out = []
    for record in fetched:
        values: list[WireValue] = []
        i = 6
        for column in columns:
            value = record[i]
            i += 1
            if value is not None:
                values.append(wire_value(column.logical.kind, value, entry.table.table,
                                       column.name, record[0]))
            elif column.is_key:
                values.append(None)
            else:
                values.append(None if record[i] else UNAVAILABLE)
            if not column.is_key:
                i += 1
        out.append(LogRow(record[0], index, record[1], record[2], record[3], record[4],
                          record[5], None, tuple(values)))
    return out
