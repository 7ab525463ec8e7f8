"""Signals for the Spark source: Debezium's ``execute-snapshot`` reloads tables of a
running query (``signalTable``; ``[source] signal_table`` in ``pipeline.toml``).

The source's driver does not decode the log (the executors do), so it reads the signal
table itself: before each batch that starts no other snapshot, it reads the table's rows
(a signal table holds a handful) and takes those whose id it has not seen. The ids seen
are kept in the offset, so a replayed batch or a restarted query takes each signal once;
the rows already there when the query first reads the table are history, not requests.
A signal is written with :func:`tidemark.source.signals.send_signal`, ``tidemark signal
execute-snapshot TABLE --signal-table …``, or an ``INSERT`` as for Debezium.

A requested table is snapshotted as on its first start (:mod:`tidemark.spark.postgres.snapshot`):
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
from tidemark.source.signals import (
    ExecuteSnapshot,
    LogSignal,
    SignalError,
    parse_signal,
    signal_table_ddl,
)

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
                      seen: tuple[str, ...] | None,
                      tables: Sequence[str]) -> tuple[list[str], tuple[str, ...]]:
    """The tables new ``execute-snapshot`` signals ask for (in the order asked), and the
    ids of every signal row now in *table* (the next call's *seen*)."""
    rows = conn.execute(sql.SQL("SELECT id, type, data FROM {}").format(
        sql.Identifier(table.schema, table.table))).fetchall()
    return requests_in(rows, seen, tables)


def requests_in(rows: Sequence[Sequence[Any]], seen: tuple[str, ...] | None,
                tables: Sequence[str]) -> tuple[list[str], tuple[str, ...]]:
    """:func:`snapshot_requests` on the signal table's rows, however they were read
    (``(id, type, data)`` each): the part every source shares."""
    ids = tuple(sorted(str(row[0]) for row in rows))
    if seen is None:
        return [], ids
    taken = set(seen)
    requested: list[str] = []
    for signal_id, signal_type, data in rows:
        if signal_id in taken:
            continue
        try:
            signal = parse_signal(str(signal_id), str(signal_type), data)
        except SignalError as err:
            log.warning("signal skipped: %s", err)
            continue
        if isinstance(signal, LogSignal):
            log.info("signal %s: %s", signal.id, signal.message)
        elif not isinstance(signal, ExecuteSnapshot):
            log.warning("signal %s (%s) skipped: the Spark source takes execute-snapshot "
                        "and log signals", signal_id, signal_type)
        elif signal.additional_conditions or signal.surrogate_key:
            log.warning("signal %s skipped: the Spark source reloads whole tables by their "
                        "primary key; leave out additional-conditions and surrogate-key",
                        signal_id)
        else:
            for name in (str(t) for t in signal.data_collections):
                if name not in tables:
                    log.warning("signal %s: table %s skipped: it is not in this stream "
                                "(%s)", signal_id, name, ", ".join(tables))
                elif name not in requested:
                    log.info("signal %s: snapshot of %s requested", signal_id, name)
                    requested.append(name)
    return requested, ids
