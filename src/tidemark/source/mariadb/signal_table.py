"""A signal written into a MariaDB signal table (``tidemark signal``,
:func:`tidemark.source.signals.send_signal`; the table is ``database.table``)."""

from __future__ import annotations

import contextlib
from typing import Final

import pymysql.err

from tidemark.event import TableId
from tidemark.source.mariadb import client
from tidemark.source.signals import SignalError, signal_table_ddl

#: MariaDB's error codes: no such table, duplicate key, no privilege (table, database).
_NO_TABLE: Final = 1146
_DUPLICATE: Final = 1062
_DENIED: Final = (1142, 1044)


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def write_signal(dsn: str, table: TableId, signal_id: str, signal_type: str,
                 data: str | None) -> None:
    """Insert the signal row (*signal_id*, *signal_type*, *data*) into *table*; raises
    SignalError for a missing table, a duplicate id or a user that may not insert."""
    conn = client.connect(client.parse_url(dsn))
    with contextlib.closing(conn), conn.cursor() as cur:
        try:
            cur.execute(f"INSERT INTO {_quote(table.schema)}.{_quote(table.table)} "
                        "(id, type, data) VALUES (%s, %s, %s)", (signal_id, signal_type, data))
        except pymysql.err.MySQLError as err:
            code = err.args[0] if err.args else 0
            detail = err.args[-1] if err.args else str(err)
            if code == _NO_TABLE:
                raise SignalError(f"signal table {table} does not exist ({detail}); create "
                                  f"it with: {signal_table_ddl(table)}") from None
            if code == _DUPLICATE:
                raise SignalError(f"signal table {table} has a signal with id {signal_id!r} "
                                  "already; give another id (or none, for a random one)") \
                    from None
            if code in _DENIED:
                raise SignalError(f"the user may not insert into signal table {table} "
                                  f"({detail}); GRANT INSERT ON {table} TO it") from None
            raise SignalError(f"cannot write the signal into {table}: {detail}") from None
