"""A signal written into a PostgreSQL signal table (``tidemark signal``,
:func:`tidemark.source.signals.send_signal`), with errors that say how to fix the table or
the role's grants."""

from __future__ import annotations

import contextlib
from typing import Any

import psycopg
from psycopg import sql

from tidemark import postgres_connection
from tidemark.event import TableId
from tidemark.source.signals import SIGNAL_TABLE_COLUMNS, SignalError, signal_table_ddl


def write_signal(dsn: str, table: TableId, signal_id: str, signal_type: str,
                 data: str | None) -> None:
    """Insert the signal row (*signal_id*, *signal_type*, *data*) into *table*; raises
    SignalError for a missing table, a table of another layout, a role that may not
    insert, a duplicate id or data too long."""
    statement = sql.SQL("INSERT INTO {}.{} (id, type, data) VALUES (%s, %s, %s)").format(
        sql.Identifier(table.schema), sql.Identifier(table.table))
    conn = postgres_connection.connect(dsn, application_name="tidemark signal")
    with contextlib.closing(conn), postgres_connection.cursor(conn) as cur:
        try:
            cur.execute(statement, (signal_id, signal_type, data))
        except psycopg.Error as err:
            raise _insert_error(conn, table, signal_id, data, err) from None


def _quote(name: str) -> str:
    # PostgreSQL's quoting of an identifier: double quotes, inner ones doubled.
    return '"' + name.replace('"', '""') + '"'


def _insert_error(conn: Any, table: TableId, signal_id: str, text: str | None,
                  err: psycopg.Error) -> SignalError:
    """The error to report for an INSERT into the signal table that failed."""
    # The server's one-line message, without "ERROR:" and the statement it quotes.
    detail = err.diag.message_primary or (str(err).strip().splitlines() or [repr(err)])[0]
    if isinstance(err, psycopg.errors.UndefinedTable | psycopg.errors.InvalidSchemaName):
        return SignalError(f"signal table {table} does not exist ({detail}); create it with: "
                           f"{signal_table_ddl(table)}")
    if isinstance(err, psycopg.errors.UndefinedColumn):
        return SignalError(f"signal table {table} does not have Debezium's layout "
                           f"({detail}); it needs the columns {SIGNAL_TABLE_COLUMNS}")
    if isinstance(err, psycopg.errors.InsufficientPrivilege):
        role = "this role"
        with contextlib.suppress(psycopg.Error), conn.cursor() as cur:
            cur.execute("SELECT current_user")
            role = _quote(str(cur.fetchone()[0]))
        return SignalError(
            f"{role} may not insert into signal table {table} ({detail}); grant it: "
            f"GRANT USAGE ON SCHEMA {_quote(table.schema)} TO {role}; "
            f"GRANT INSERT ON {_quote(table.schema)}.{_quote(table.table)} TO {role}")
    if isinstance(err, psycopg.errors.UniqueViolation):
        return SignalError(f"signal table {table} has a signal with id {signal_id!r} "
                           "already; give another id (or none, for a random one)")
    if isinstance(err, psycopg.errors.StringDataRightTruncation):
        size = 0 if text is None else len(text)
        return SignalError(f"the signal does not fit signal table {table} ({detail}); its "
                           f"data is {size} characters long, Debezium's layout holds 2048")
    return SignalError(f"cannot write the signal into {table}: {detail}")
