"""Reading PostgreSQL log tables without a fixed delay and without missing late commits.

Transactions commit out of ``cdc$time`` order: a row written early by a long transaction
becomes visible after later-timed rows were read. Scylla's reader waits a fixed
"confidence window" and can still miss such a row. Here each read step is the
difference of two snapshots (``pg_current_snapshot()``): a step returns the rows whose
writing transaction is visible in the new snapshot and was not in the previous one —
exactly the transactions that committed in between, each read once, whenever it
committed.

A step is paged by ``cdc$time`` through the ``(cdc$group, cdc$time)`` index, from just
below its earliest row, which the ``(cdc$group, cdc$txid)`` index finds: every
transaction not visible in the previous snapshot has an xid at or above that
snapshot's ``xmin``. (A bound from the time sequence would not do: a transaction may
hold an xid, and have written early rows, while not yet appearing in a snapshot's
in-progress list.) A position is::

    {"snapshot": "xmin:xmax:xip",
     "step": {"snapshot": …, "after": time}}   # while a step is paged

``step.after`` is the last time returned in that step.
"""

from __future__ import annotations

import contextlib
import heapq
import json
import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Final

import psycopg
from psycopg import sql

from tidemark.errors import ConfigError, SourceUnavailableError
from tidemark.event import UNAVAILABLE, TableId, WireValue
from tidemark.fetch_budget import FetchBudget
from tidemark.logical_type import Kind
from tidemark.postgres_connection import connect, cursor, redact_dsn
from tidemark.source.logtable import layout
from tidemark.source.logtable import postgres_install as install
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
from tidemark.source.logtable.postgres_guard import check_table
from tidemark.source.logtable.postgres_text import output_text
from tidemark.source.postgres.catalog import current_database

log = logging.getLogger(__name__)

_XIP_BITS: Final = 24
#: The snapshot in which no transaction is visible: a log's beginning.
EMPTY_SNAPSHOT: Final = "1:1:"


def _xip(snapshot: str) -> list[str]:
    parts = snapshot.split(":")
    if len(parts) != 3:
        raise ConfigError("offset", f"stored position {snapshot!r} is not a PostgreSQL "
                          "snapshot (xmin:xmax:xip): was it written by another source?")
    return [x for x in parts[2].split(",") if x]


class PostgresLogDatabase:
    """Log tables on one PostgreSQL database (psycopg, autocommit: every statement sees
    what is committed when it starts, which is all a step needs)."""

    def __init__(self, dsn: str, *, server_timeout_s: float | None = None) -> None:
        """With *server_timeout_s*, no wait for the server lasts longer: a stopped
        server fails the query (SourceUnavailableError) instead of holding it."""
        self._dsn = dsn
        try:
            self._conn = connect(dsn, application_name="tidemark-logtable",
                                 server_timeout_s=server_timeout_s)
        except psycopg.OperationalError as err:  # pragma: no cover - connect classifies
            raise SourceUnavailableError(str(err)) from None
        try:
            with _unavailable(redact_dsn(dsn)):
                self._db = current_database(self._conn)
        except BaseException:
            self._conn.close()
            raise
        self._queries: dict[tuple[str, int, bool], sql.Composed] = {}
        #: Each group's step in progress begun here (its snapshot): not an older run's.
        self._began: dict[int, str] = {}

    @property
    def connector(self) -> str:
        return "postgresql"

    @property
    def database(self) -> str:
        return self._db

    def generations(self) -> list[layout.Generation]:
        with cursor(self._conn) as cur:
            cur.execute("SELECT to_regclass(%s) IS NOT NULL",
                        (f"{install.SCHEMA}.{install.STREAMS_TABLE}",))
            if not cur.fetchone()[0]:
                raise ConfigError("logtable", f"database {self._db} has no log tables "
                                  "(schema tidemark_cdc is missing): run `tidemark logtable "
                                  "install DSN --table …` first")
            cur.execute(sql.SQL("SELECT generation, streams, groups, started_at::text "
                                "FROM {}.{} ORDER BY generation").format(
                sql.Identifier(install.SCHEMA), sql.Identifier(install.STREAMS_TABLE)))
            generations = [layout.Generation(*row) for row in cur.fetchall()]
        layout.check_generations(generations, f"{install.SCHEMA}.{install.STREAMS_TABLE}")
        return generations

    def tables(self, include: list[str]) -> list[LogTable]:
        with _unavailable(self._db):
            return self._tables(include)

    def _tables(self, include: list[str]) -> list[LogTable]:
        installed = install.installed_tables(self._conn)
        if include:
            wanted = [TableId.parse(name) for name in include]
            for table in wanted:
                if table not in installed:
                    raise ConfigError("tables", f"table {table} has no log table: run "
                                      f"`tidemark logtable install DSN --table {table}`")
        else:
            wanted = installed
        if not wanted:
            raise ConfigError("tables", f"database {self._db} has no captured tables: run "
                              "`tidemark logtable install DSN --table …` first")
        out = []
        for table in wanted:
            install.check_installed(self._conn, table)
            schema = install.captured_schema(self._conn, table)
            out.append(LogTable(table, layout.log_table_name(table.table), schema))
        self.check_unchanged(out)
        return out

    def behind(self, group: int, position: Position, tables: list[LogTable]) -> int:
        prev = str(position["snapshot"])
        step = position.get("step") or {"snapshot": prev, "after": 0}
        total = 0
        with cursor(self._conn) as cur:
            for entry in tables:
                cur.execute(sql.SQL(
                    "SELECT count(*) FROM {log} WHERE {group} = %(group)s "
                    "AND {txid} >= pg_snapshot_xmin(%(prev)s::pg_snapshot) "
                    "AND NOT pg_visible_in_snapshot({txid}, %(prev)s::pg_snapshot) "
                    "AND (NOT pg_visible_in_snapshot({txid}, %(now)s::pg_snapshot) "
                    "OR {time} > %(after)s)").format(
                        log=sql.Identifier(entry.table.schema, entry.log),
                        group=sql.Identifier(layout.GROUP), txid=sql.Identifier(layout.TXID),
                        time=sql.Identifier(layout.TIME)),
                    {"group": group, "prev": prev, "now": str(step["snapshot"]),
                     "after": int(step["after"] or 0)})
                total += int(cur.fetchone()[0])
        return total

    def check_unchanged(self, tables: list[LogTable]) -> None:
        try:
            with cursor(self._conn) as cur:
                for entry in tables:
                    check_table(cur, entry)
        except psycopg.OperationalError as err:
            raise SourceUnavailableError(f"checking the log tables of {self._db}: "
                                         f"{str(err).strip()}") from None

    def start_position(self) -> Position:
        return {"snapshot": EMPTY_SNAPSHOT}

    def _query(self, entry: LogTable, *, paged: bool = True) -> sql.Composed:
        """One table's step query: a page of one group (*paged*, for the engine's
        reader), or every row of several groups (``group = ANY(…)``, streamed)."""
        key = (entry.log, id(entry.schema), paged)
        query = self._queries.get(key)
        if query is None:
            values: list[sql.Composable] = []
            for column in entry.schema.columns:
                values.append(output_text(column))
                if not column.is_key:
                    values.append(sql.Identifier(layout.deleted_column(column.name)))
            where = ("{group} = %(group)s AND {time} > %(after)s" if paged else
                     "{group} = ANY(%(groups)s) AND {txid} >= "
                     "pg_snapshot_xmin(%(prev)s::pg_snapshot)")
            query = sql.SQL(
                "SELECT {time}, {stream}, {generation}, {op}, {batch}, "
                "(extract(epoch FROM {ts}) * 1000000)::bigint, {txid}::text::bigint, {values} "
                "FROM {log} WHERE " + where + " "
                "AND pg_visible_in_snapshot({txid}, %(now)s::pg_snapshot) "
                "AND NOT pg_visible_in_snapshot({txid}, %(prev)s::pg_snapshot) "
                "ORDER BY {time}" + (" LIMIT %(limit)s" if paged else "")
            ).format(time=sql.Identifier(layout.TIME), stream=sql.Identifier(layout.STREAM),
                     generation=sql.Identifier(layout.GENERATION),
                     op=sql.Identifier(layout.OPERATION),
                     batch=sql.Identifier(layout.BATCH_SEQ), ts=sql.Identifier(layout.TS),
                     txid=sql.Identifier(layout.TXID), values=sql.SQL(", ").join(values),
                     log=sql.Identifier(entry.table.schema, entry.log),
                     group=sql.Identifier(layout.GROUP))
            self._queries[key] = query
        return query

    def end_position(self) -> Position:
        return {"snapshot": self._current_snapshot()}

    def check_positions(self, positions: Iterable[Position]) -> None:
        """Nothing to check: positions are transaction snapshots, which only grow, an
        install made again or not."""

    def clock(self) -> int:
        with cursor(self._conn) as cur:
            cur.execute(sql.SQL("SELECT last_value FROM {}.{}").format(
                sql.Identifier(install.SCHEMA), sql.Identifier(install.TIME_SEQUENCE)))
            return int(cur.fetchone()[0])

    def position_key(self, position: Position) -> int:
        # Between two snapshots with the same xmax only transactions below it can have
        # ended, which shortens the in-progress list: xmax first, then the list's
        # shortness, orders them (xid8 values stay far below 2^39 in practice).
        snapshot = str(position["snapshot"])
        xmax = int(snapshot.split(":")[1])
        return xmax << _XIP_BITS | ((1 << _XIP_BITS) - 1 - min(len(_xip(snapshot)),
                                                             (1 << _XIP_BITS) - 1))

    def _current_snapshot(self) -> str:
        with cursor(self._conn) as cur:
            cur.execute("SELECT pg_current_snapshot()::text")
            return str(cur.fetchone()[0])

    def read_range(self, groups: Sequence[int], start: Position, end: Position,
                   tables: list[LogTable], fetch_rows: int) -> Iterator[list[LogRow]]:
        prev, now = str(start["snapshot"]), str(end["snapshot"])
        _xip(prev)
        _xip(now)
        if prev == now:
            return
        # One sorted scan per table on a connection of its own (named cursors need a
        # transaction); the tables' rows are merged by time as they stream.
        conn = connect(self._dsn, application_name="tidemark-logtable-range")
        conn.autocommit = False
        try:
            params = {"groups": list(groups), "prev": prev, "now": now}
            streams = []
            budgets = []
            for index, entry in enumerate(tables):
                cur = conn.cursor(name=f"tidemark_range_{index}")
                cur.execute(self._query(entry, paged=False), params)
                budgets.append(FetchBudget(fetch_rows))
                streams.append(_streamed(index, entry, cur, budgets[-1]))
            yield from merged_pages(streams, budgets)
            conn.commit()
        except psycopg.OperationalError as err:
            raise SourceUnavailableError(f"reading the log tables of {self._db}: "
                                         f"{str(err).strip()}") from None
        finally:
            conn.close()

    def range_bytes(self, groups: Sequence[int], start: Position, end: Position,
                    tables: list[LogTable]) -> int:
        prev, now = str(start["snapshot"]), str(end["snapshot"])
        _xip(prev)
        _xip(now)
        if prev == now:
            return 0
        total = 0
        try:
            with cursor(self._conn) as cur:
                for entry in tables:
                    cur.execute(self._size_query(entry),
                                {"groups": list(groups), "prev": prev, "now": now})
                    rows, size = cur.fetchone()
                    total += int(size) + int(rows) * ROW_OVERHEAD_BYTES
        except psycopg.OperationalError as err:
            raise SourceUnavailableError(f"sizing the log of {self._db}: "
                                         f"{str(err).strip()}") from None
        return total

    def _size_query(self, entry: LogTable) -> sql.Composed:
        """The rows and value bytes of :meth:`_query`'s unpaged read. ``octet_length``
        of a text or bytea value reads its stored length, compressed or out of line,
        without fetching it."""
        sizes = sql.SQL(" + ").join(
            sql.SQL("coalesce(octet_length({}{}), 0)").format(
                sql.Identifier(column.name),
                sql.SQL("" if column.logical.kind is Kind.BYTES else "::text"))
            for column in entry.schema.columns)
        return sql.SQL(
            "SELECT count(*), coalesce(sum({sizes}), 0) FROM {log} "
            "WHERE {group} = ANY(%(groups)s) "
            "AND {txid} >= pg_snapshot_xmin(%(prev)s::pg_snapshot) "
            "AND pg_visible_in_snapshot({txid}, %(now)s::pg_snapshot) "
            "AND NOT pg_visible_in_snapshot({txid}, %(prev)s::pg_snapshot)").format(
                sizes=sizes, log=sql.Identifier(entry.table.schema, entry.log),
                group=sql.Identifier(layout.GROUP), txid=sql.Identifier(layout.TXID))

    def tick(self) -> None:
        # Autocommit: the id taken, its transaction ends and the next xmax is above it.
        self._conn.execute("SELECT pg_current_xact_id()")

    @contextlib.contextmanager
    def read_view(self) -> Iterator[tuple[Position, psycopg.Connection[Any]]]:
        conn = connect(self._dsn, application_name="tidemark-logtable-snapshot")
        try:
            conn.autocommit = False
            conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            conn.read_only = True
            with cursor(conn) as cur:
                # The transaction's snapshot is the position: the rows read in it are the
                # tables' state there, and the log from there on is what came after.
                cur.execute("SELECT pg_current_snapshot()::text")
                position = {"snapshot": str(cur.fetchone()[0])}
            yield position, conn
        finally:
            conn.close()

    @contextlib.contextmanager
    def snapshot(self, tables: list[LogTable], fetch_rows: int
                 ) -> Iterator[tuple[Position, Iterator[Snapshotted]]]:
        with self.read_view() as (position, conn):

            def rows() -> Iterator[Snapshotted]:
                for index, entry in enumerate(tables):
                    names = sql.SQL(", ").join(output_text(c) for c in entry.schema.columns)
                    with conn.cursor(name=f"tidemark_snapshot_{index}") as cur:
                        cur.execute(sql.SQL("SELECT {} FROM {}").format(
                            names, sql.Identifier(entry.table.schema, entry.table.table)))
                        for page in fetched(cur, FetchBudget(fetch_rows)):
                            yield index, page

            yield position, rows()

    def _begin_step(self, group: int, position: Position, tables: list[LogTable],
                    now: str | None = None) -> dict[str, Any] | None:
        """The next step after *position* (to snapshot *now*, default the current one):
        its snapshot and the time just below its first row; None when nothing committed
        since *position*."""
        prev = position["snapshot"]
        with cursor(self._conn) as cur:
            if now is None:
                cur.execute("SELECT pg_current_snapshot()::text")
                now = str(cur.fetchone()[0])
            if now == prev:
                return None
            earliest: int | None = None
            for entry in tables:
                # Every transaction not visible in prev has an xid >= its xmin: the
                # (group, txid) index finds the step's rows, whatever their times.
                cur.execute(sql.SQL(
                    "SELECT min({time}) FROM {log} WHERE {group} = %(group)s "
                    "AND {txid} >= pg_snapshot_xmin(%(prev)s::pg_snapshot) "
                    "AND pg_visible_in_snapshot({txid}, %(now)s::pg_snapshot) "
                    "AND NOT pg_visible_in_snapshot({txid}, %(prev)s::pg_snapshot)").format(
                        time=sql.Identifier(layout.TIME), txid=sql.Identifier(layout.TXID),
                        log=sql.Identifier(entry.table.schema, entry.log),
                        group=sql.Identifier(layout.GROUP)),
                    {"group": group, "prev": prev, "now": now})
                found = cur.fetchone()[0]
                if found is not None and (earliest is None or found < earliest):
                    earliest = int(found)
        if earliest is None:
            return {"snapshot": now, "after": None}
        return {"snapshot": now, "after": earliest - 1}

    def read(self, group: int, position: Position, tables: list[LogTable],
             limit: int) -> ReadResult:
        try:
            return self._read(group, position, tables, limit)
        except psycopg.OperationalError as err:
            raise SourceUnavailableError(f"reading the log tables of {self._db}: "
                                         f"{str(err).strip()}") from None

    def _read(self, group: int, position: Position, tables: list[LogTable],
              limit: int) -> ReadResult:
        _xip(position.get("snapshot", ""))
        step = position.get("step")
        began = step is None
        if step is None:
            step = self._begin_step(group, position, tables)
            if step is None:
                return ReadResult([], position, True)
            if step["after"] is None:  # commits, none in this group: move on
                return ReadResult([], {"snapshot": step["snapshot"]}, True)
        params = {"group": group, "after": int(step["after"]), "now": step["snapshot"],
                  "prev": position["snapshot"], "limit": limit}
        pages: list[list[LogRow]] = []
        full = False
        with cursor(self._conn) as cur:
            for index, entry in enumerate(tables):
                cur.execute(self._query(entry), params)
                fetched = cur.fetchall()
                full = full or len(fetched) >= limit
                pages.append(list(_rows(index, entry, fetched)))
        rows = list(heapq.merge(*pages, key=lambda row: row.time))
        if not full:
            # The whole step is read: the group is at the step's snapshot. Caught up
            # only if that was taken since we connected: a step an earlier run left
            # (stopped or killed mid-step) misses what committed after it.
            caught_up = began or self._began.pop(group, None) == step["snapshot"]
            return ReadResult(rows, {"snapshot": step["snapshot"]}, caught_up)
        if began:
            self._began[group] = str(step["snapshot"])
        rows = rows[:limit]
        return ReadResult(rows, {"snapshot": position["snapshot"],
                                 "step": {**step, "after": rows[-1].time}}, False)

    def register(self, reader: str, positions: Mapping[int, Position]) -> None:
        groups = sorted(positions)
        self._run("register the reader's positions", sql.SQL(
            "INSERT INTO {}.{} (reader, grp, position, updated_at) SELECT %s, g, p::jsonb, "
            "now() FROM unnest(%s::int[], %s::text[]) AS u(g, p) ON CONFLICT (reader, grp) "
            "DO UPDATE SET position = excluded.position, updated_at = excluded.updated_at")
            .format(sql.Identifier(install.SCHEMA), sql.Identifier(install.READERS_TABLE)),
            (reader, groups, [json.dumps(positions[g]) for g in groups]))

    def readers(self) -> list[ReaderPosition]:
        with cursor(self._conn) as cur:
            cur.execute(sql.SQL("SELECT reader, grp, position::text, updated_at::text FROM "
                                "{}.{} ORDER BY 1, 2").format(
                sql.Identifier(install.SCHEMA), sql.Identifier(install.READERS_TABLE)))
            return [ReaderPosition(r, int(g), json.loads(p), u) for r, g, p, u in cur.fetchall()]

    def forget(self, reader: str) -> int:
        with cursor(self._conn) as cur:
            cur.execute(sql.SQL("DELETE FROM {}.{} WHERE reader = %s").format(
                sql.Identifier(install.SCHEMA), sql.Identifier(install.READERS_TABLE)),
                (reader,))
            return int(cur.rowcount)

    def prune(self, groups: Sequence[int], tables: list[LogTable], retention_s: float) -> int:
        bounds: dict[int, int] = {}
        with _unavailable(self._db):
            registry = self.readers()
        for registered in registry:
            # Every transaction below a snapshot's xmin is visible in it: read.
            xmin = int(str(registered.position.get("snapshot", "0:0:")).split(":")[0])
            bounds[registered.group] = min(bounds.get(registered.group, xmin), xmin)
        deleted = 0
        for group in groups:
            if group not in bounds:
                continue  # no reader has saved a position in it yet
            for entry in tables:
                deleted += self._run("delete read log rows", sql.SQL(
                    "DELETE FROM {log} WHERE {group} = %s AND {txid} < %s::text::xid8 AND {ts} "
                    "< clock_timestamp() - make_interval(secs => %s)").format(
                        log=sql.Identifier(entry.table.schema, entry.log),
                        group=sql.Identifier(layout.GROUP), txid=sql.Identifier(layout.TXID),
                        ts=sql.Identifier(layout.TS)),
                    (group, bounds[group], retention_s))
        return deleted

    def _run(self, what: str, statement: sql.Composable, params: Any) -> int:
        try:
            with cursor(self._conn) as cur:
                cur.execute(statement, params)
                return int(cur.rowcount)
        except psycopg.OperationalError as err:
            raise SourceUnavailableError(f"cannot {what} in {self._db}: "
                                         f"{str(err).strip()}") from None

    def close(self) -> None:
        self._conn.close()


@contextlib.contextmanager
def _unavailable(database: str) -> Iterator[None]:
    """A lost or silent server (a restart, a stopped server's ServerTimeoutError) as
    SourceUnavailableError: the reader reconnects."""
    try:
        yield
    except psycopg.OperationalError as err:
        raise SourceUnavailableError(f"querying the log tables of {database}: "
                                     f"{str(err).strip()}") from None


def _streamed(index: int, entry: LogTable, cur: Any, budget: FetchBudget) -> Iterator[LogRow]:
    for rows in fetched(cur, budget):
        yield from _rows(index, entry, rows)


def _rows(index: int, entry: LogTable, fetched: list[tuple[Any, ...]]) -> Iterator[LogRow]:
    columns = entry.schema.columns
    for record in fetched:
        values: list[WireValue] = []
        i = 7
        for column in columns:
            value = record[i]
            i += 1
            if column.is_key:
                values.append(value)
                continue
            deleted = record[i]
            i += 1
            values.append(value if value is not None else None if deleted else UNAVAILABLE)
        yield LogRow(record[0], index, record[1], record[2], record[3], record[4], record[5],
                     record[6], tuple(values))
