"""The signal table of a log-table stream: Debezium's layout, in the database of the log
tables (PostgreSQL) or their file (SQLite, where it is ``main.<name>``).

The Spark stream (:mod:`tidemark.source.logtable.read_plan`) reads it before each batch;
``tidemark signal`` / :func:`tidemark.source.signals.send_signal` writes into it. A
PostgreSQL database's signal table is PostgreSQL's (its writer,
:mod:`tidemark.source.postgres.signal_table`, serves both ways of reading it).
"""

from __future__ import annotations

import contextlib
import sqlite3
from typing import Any

from tidemark.errors import SourceError
from tidemark.event import TableId
from tidemark.source.logtable.config import is_sqlite
from tidemark.source.signals import SIGNAL_TABLE_COLUMNS, SignalError, signal_table_ddl


def _sqlite_name(table: TableId) -> str:
    """*table* as SQLite names it; raises SignalError for a schema other than ``main``
    (an attached database is not in the DSN's file)."""
    if table.schema != "main":
        raise SignalError(f"signal table {table}: a SQLite signal table is in the main "
                          f"database of the file; name it main.{table.table}")
    return '"main"."' + table.table.replace('"', '""') + '"'


def signal_rows(dsn: str, table: TableId) -> list[tuple[Any, ...]]:
    """Every row of the signal table as ``(id, type, data)``."""
    if is_sqlite(dsn):
        from tidemark.source.logtable.sqlite import connect  # noqa: PLC0415

        with contextlib.closing(connect(dsn)) as conn:
            return list(conn.execute(f"SELECT id, type, data FROM {_sqlite_name(table)}"))
    from psycopg import sql  # noqa: PLC0415

    from tidemark.postgres_connection import connect as pg_connect  # noqa: PLC0415

    with contextlib.closing(pg_connect(dsn, application_name="tidemark-signals")) as conn:
        conn.autocommit = True
        return list(conn.execute(sql.SQL("SELECT id, type, data FROM {}").format(
            sql.Identifier(table.schema, table.table))).fetchall())


def check_signal_table(dsn: str, table: TableId) -> None:
    """Raise SourceError unless the signal table exists with Debezium's columns and is
    readable (its ``CREATE TABLE`` in the message)."""
    try:
        signal_rows(dsn, table)
    except SignalError as err:
        raise SourceError(str(err)) from None
    except sqlite3.Error as err:
        if "no such table" in str(err):
            raise SourceError(f"signal table {table} does not exist; create it with: "
                              f"{signal_table_ddl(table)}") from None
        raise SourceError(f"signal table {table} is not readable ({err}): it needs the "
                          f"columns {SIGNAL_TABLE_COLUMNS}") from None
    except Exception as err:
        import psycopg  # noqa: PLC0415

        if not isinstance(err, psycopg.Error):
            raise
        if isinstance(err, psycopg.errors.UndefinedTable | psycopg.errors.InvalidSchemaName):
            raise SourceError(f"signal table {table} does not exist; create it with: "
                              f"{signal_table_ddl(table)}") from None
        detail = err.diag.message_primary or str(err).strip()
        raise SourceError(f"signal table {table} is not readable ({detail}): it needs the "
                          f"columns {SIGNAL_TABLE_COLUMNS} and SELECT granted on it") from None


def write_sqlite_signal(dsn: str, table: TableId, signal_id: str, signal_type: str,
                        data: str | None) -> None:
    """Insert the signal row into a SQLite file's signal table; raises SignalError for a
    missing table, one of another layout or a duplicate id."""
    from tidemark.source.logtable.sqlite import connect  # noqa: PLC0415

    name = _sqlite_name(table)
    with contextlib.closing(connect(dsn)) as conn:
        try:
            conn.execute(f"INSERT INTO {name} (id, type, data) VALUES (?, ?, ?)",
                         (signal_id, signal_type, data))
        except sqlite3.IntegrityError:
            raise SignalError(f"signal table {table} has a signal with id {signal_id!r} "
                              "already; give another id (or none, for a random one)") \
                from None
        except sqlite3.OperationalError as err:
            if "no such table" in str(err):
                raise SignalError(f"signal table {table} does not exist ({err}); create "
                                  f"it with: {signal_table_ddl(table)}") from None
            if "has no column" in str(err):
                raise SignalError(f"signal table {table} does not have Debezium's layout "
                                  f"({err}); it needs the columns {SIGNAL_TABLE_COLUMNS}") \
                    from None
            raise SignalError(f"cannot write the signal into {table}: {err}") from None
