"""Signals for the PostgreSQL Spark stream: Debezium's ``execute-snapshot`` reloads tables of a
running query (``signalTable``; ``[source] signal_table`` in ``pipeline.toml``).

The source's driver does not decode the log (the executors do), so it reads the signal
table itself: before each batch that starts no other snapshot, it reads the table's rows
(a signal table holds a handful) and takes those whose id it has not seen. The ids seen
are kept in the offset, so a replayed batch or a restarted query takes each signal once;
the rows already there when the query first reads the table are history, not requests.
A signal is written with :func:`tidemark.source.signals.send_signal`, ``tidemark signal
execute-snapshot TABLE --signal-table …``, or an ``INSERT`` as for Debezium.

A requested table is snapshotted as on its first start
(:mod:`tidemark.source.postgres.chunked_snapshot`):
``tidemark run`` replaces its SCD1 target with the snapshot's rows, so a target that
drifted from the source (restored from a backup, edited by hand) equals the source again.
``additional-conditions`` and ``surrogate-key`` (a partial or differently keyed snapshot,
which a replace would turn into a loss) are refused with a warning, as are signals
other than ``execute-snapshot`` and ``log``; a malformed signal is logged with the reason
and skipped. None of them stops the stream.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql

from tidemark.errors import SourceError
from tidemark.event import TableId
from tidemark.source.repair_signal import RepairSignal
from tidemark.source.signal_requests import requests_in
from tidemark.source.signals import signal_table_ddl

log = logging.getLogger(__name__)


def check_signal_table(conn: psycopg.Connection[Any], table: TableId) -> None:
    """Raise SourceError unless *table* has Debezium's columns and can be read."""
    try:
        conn.execute(sql.SQL("SELECT id, type, data FROM {} LIMIT 0").format(
            sql.Identifier(table.schema, table.table)))
    except psycopg.errors.UndefinedTable:
        raise SourceError(f"signal table {table} does not exist; create it with: "
                          f"{signal_table_ddl(table)}") from None
    except psycopg.errors.UndefinedColumn:
        raise SourceError(f"signal table {table} lacks Debezium's columns (id, type, data): "
                          f"expected {signal_table_ddl(table)}") from None
    except psycopg.errors.InsufficientPrivilege:
        raise SourceError(f"signal table {table} is not readable: GRANT SELECT ON {table} "
                          "TO the source's user") from None


def snapshot_requests(conn: psycopg.Connection[Any], table: TableId,
                      seen: tuple[str, ...] | None, tables: Sequence[str],
                      repairs: list[RepairSignal] | None = None,
                      ) -> tuple[list[str], tuple[str, ...]]:
    """The tables new ``execute-snapshot`` signals ask for (in the order asked), and the
    ids of every signal row now in *table* (the next call's *seen*); new
    ``tidemark-repair`` signals are appended to *repairs*."""
    rows = conn.execute(sql.SQL("SELECT id, type, data FROM {}").format(
        sql.Identifier(table.schema, table.table))).fetchall()
    return requests_in(rows, seen, tables, repairs)
