"""``tidemark verify``'s snapshot of log-table sources: the base tables and their logs
read together, and the keys the log holds after it.

**SQLite**: one read transaction. One writer at a time makes ``cdc$time`` the commit
order, and the clock read in the transaction is the newest time it sees: the position.
A Spark offset's groups at or past it have read every change in the snapshot
(:meth:`~tidemark.source.logtable.kind.LogTableKind.log_position` is the lowest group's
``after``). The changed keys are those of log rows above the position.

**PostgreSQL**: a REPEATABLE READ transaction whose snapshot *S* is the position.
Times are not commit order there (late commits), and snapshots are not totally
ordered: a Spark offset has brought *S* into the targets when each group's snapshot
sees every transaction *S* sees (:func:`sees_all_of`), which any snapshot taken after
*S* does, whatever long transaction is still running in both. (Its ``xmin`` at or
above *S*'s ``xmax``, the order :attr:`position` keeps, would wait for every such
transaction to end.) The changed keys are those of log rows whose writing transaction
*S* does not see, read on a second connection (they committed after it).
"""

from __future__ import annotations

import contextlib
import importlib
import sqlite3
from collections.abc import Mapping, Sequence
from typing import Any

from tidemark.errors import ConfigError
from tidemark.event import TableId
from tidemark.row_checksum import ChecksumSide, TableShape, key_hash_of
from tidemark.source.logtable import layout
from tidemark.source.logtable.config import is_sqlite
from tidemark.source.verify_snapshot import VerifySnapshot


def open_verify_snapshot(dsn: str, tables: Sequence[TableId], *,
                         publication: str) -> VerifySnapshot:
    """A snapshot of *tables* (with log tables) of *dsn*; *publication* is unused (log
    tables are read without one)."""
    del publication
    if is_sqlite(dsn):
        return SqliteVerifySnapshot(dsn, tables)
    return PostgresVerifySnapshot(dsn, tables)


def _check_tables(found: Sequence[str], tables: Sequence[TableId], where: str) -> None:
    missing = [str(t) for t in tables if t.table not in found]
    if missing:
        raise ConfigError("tables", f"table(s) {', '.join(missing)} have no log table in "
                          f"{where}: run `tidemark logtable install` for them")


class SqliteVerifySnapshot:
    """A read transaction on a SQLite file with log tables."""

    def __init__(self, dsn: str, tables: Sequence[TableId]) -> None:
        from tidemark.source.logtable import sqlite_install as install  # noqa: PLC0415
        from tidemark.source.logtable.sqlite import connect  # noqa: PLC0415

        self._dsn = dsn
        self._conn = connect(dsn)
        try:
            _check_tables(install.installed_tables(self._conn), tables, dsn)
            self._conn.execute("BEGIN")
            # The first read starts the snapshot: the clock and the tables are one state.
            clock = self._conn.execute(f"SELECT time FROM {install.CLOCK_TABLE}").fetchone()
            self._position = int(clock[0]) if clock else 0
        except BaseException:
            self._conn.close()
            raise

    @property
    def position(self) -> int:
        return self._position

    def side(self, table: TableId) -> ChecksumSide:
        from tidemark.source.logtable.sqlite_checksum import SqliteChecksumSide  # noqa: PLC0415

        return SqliteChecksumSide(self._conn, table)

    def changed_key_hashes(self, table: TableId, shape: TableShape) -> frozenset[int]:
        from tidemark.source.logtable import sqlite_install as install  # noqa: PLC0415
        from tidemark.source.logtable.sqlite import connect  # noqa: PLC0415
        from tidemark.source.logtable.sqlite_checksum import canonicals  # noqa: PLC0415

        keys = [next(c for c in shape.columns if c.name == k) for k in shape.keys]
        names = ", ".join(install.quote(k) for k in shape.keys)
        # Outside the snapshot: the log as it is now.
        with contextlib.closing(connect(self._dsn)) as conn:
            texts = canonicals(conn, table.table, keys)
            rows = conn.execute(
                f"SELECT DISTINCT {names} FROM "
                f"{install.quote(layout.log_table_name(table.table))} "
                f"WHERE {install.quote(layout.TIME)} > ?", (self._position,)).fetchall()
        return _key_hashes(rows, texts, shape)

    def close(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self._conn.execute("ROLLBACK")
        self._conn.close()


def _key_hashes(rows: Sequence[Sequence[Any]], texts: Sequence[Any],
                shape: TableShape) -> frozenset[int]:
    """Key hashes of key-column value rows, each value made text by *texts*."""
    position = {k: i for i, k in enumerate(shape.keys)}
    out = set()
    for row in rows:
        fields = tuple(texts[position[c.name]](row[position[c.name]])
                       if c.name in position else None for c in shape.columns)
        out.add(key_hash_of(fields, shape))
    return frozenset(out)


def snapshot_xmin(snapshot: str) -> int:
    """The ``xmin`` of a PostgreSQL snapshot's text (``xmin:xmax:xip``)."""
    return int(snapshot.split(":", maxsplit=1)[0])


def sees_all_of(later: str, earlier: str) -> bool:
    """Whether PostgreSQL snapshot *later* sees every transaction *earlier* sees (both
    ``xmin:xmax:xip``): it reaches *earlier*'s ``xmax``, and each transaction it has in
    progress below that is in progress in *earlier* too."""
    _, high, running = _parts(later)
    _, until, was_running = _parts(earlier)
    return high >= until and all(x in was_running for x in running if x < until)


def _parts(snapshot: str) -> tuple[int, int, frozenset[int]]:
    xmin, xmax, xip = snapshot.split(":")
    return int(xmin), int(xmax), frozenset(int(x) for x in xip.split(",") if x)


class PostgresVerifySnapshot:
    """A REPEATABLE READ transaction on a PostgreSQL database with log tables."""

    def __init__(self, dsn: str, tables: Sequence[TableId]) -> None:
        import psycopg  # noqa: PLC0415

        from tidemark.postgres_connection import connect  # noqa: PLC0415

        self._dsn = dsn
        self._tables = tuple(tables)
        self._conn = connect(dsn, application_name="tidemark-verify")
        try:
            self._conn.autocommit = False
            self._conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            with self._conn.cursor() as cur:
                # The first query takes the transaction's snapshot.
                cur.execute("SELECT pg_current_snapshot()::text")
                row = cur.fetchone()
                assert row is not None
                self._snapshot = str(row[0])
                cur.execute("SELECT schemaname, tablename FROM pg_tables")
                present = {f"{s}.{t}" for s, t in cur.fetchall()}
            _check_tables([t.table for t in tables
                           if f"{t.schema}.{layout.log_table_name(t.table)}" in present],
                          tables, "the database")
        except BaseException:
            self._conn.close()
            raise

    @property
    def position(self) -> int:
        """The snapshot's ``xmax``: every transaction it sees is below it."""
        return int(self._snapshot.split(":")[1])

    def reached_by(self, offset: Mapping[str, Any]) -> bool:
        """Whether every group of a Spark *offset* has read a snapshot that sees all this
        one sees (none while the offset's tables' rows are still to be loaded)."""
        groups = list((offset.get("groups") or {}).values())
        if offset.get("snapshot") or not groups:
            return False
        return all(sees_all_of(str(g["snapshot"]), self._snapshot) for g in groups)

    def side(self, table: TableId) -> ChecksumSide:
        # The base table lives in PostgreSQL: PostgreSQL's dialect computes its sums.
        module = importlib.import_module("tidemark.source.postgres.checksum")
        side: ChecksumSide = module.PostgresChecksumSide(self._conn, table, log_table=True)
        return side

    def changed_key_hashes(self, table: TableId, shape: TableShape) -> frozenset[int]:
        import pyarrow as pa  # noqa: PLC0415
        from psycopg import sql  # noqa: PLC0415

        from tidemark.postgres_connection import connect  # noqa: PLC0415
        from tidemark.row_checksum import value_text  # noqa: PLC0415

        keys = [next(c for c in shape.columns if c.name == k) for k in shape.keys]
        # Strings as the target holds them: PostgreSQL's text of the value.
        selected = sql.SQL(", ").join(
            sql.SQL("{}::text").format(sql.Identifier(c.name))
            if pa.types.is_string(c.target_type) or pa.types.is_large_string(c.target_type)
            else sql.Identifier(c.name) for c in keys)
        statement = sql.SQL(
            "SELECT DISTINCT {keys} FROM {log} WHERE {txid} >= "
            "pg_snapshot_xmin(%(snapshot)s::pg_snapshot) AND NOT "
            "pg_visible_in_snapshot({txid}, %(snapshot)s::pg_snapshot)").format(
                keys=selected, log=sql.Identifier(table.schema,
                                                  layout.log_table_name(table.table)),
                txid=sql.Identifier(layout.TXID))
        # Outside the snapshot (autocommit): the log as committed now.
        with contextlib.closing(connect(self._dsn, application_name="tidemark-verify")) \
                as conn:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute(statement, {"snapshot": self._snapshot})
                rows = cur.fetchall()
        texts = [lambda v, t=c.target_type: value_text(v, t) for c in keys]
        return _key_hashes(rows, texts, shape)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._conn.rollback()
        self._conn.close()
