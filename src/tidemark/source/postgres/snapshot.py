"""The initial snapshot: every captured row as a read (``r``) event.

Rows are read inside one REPEATABLE READ transaction — importing the snapshot the slot
exported when it was created, when there is one — so the snapshot and the stream that
follows meet exactly at the slot's consistent point. Values are fetched as the text
the type output functions print (the same text pgoutput sends), so one set of
converters handles snapshot and stream rows alike.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator, Sequence
from typing import Any

import psycopg
import psycopg.postgres
from psycopg import sql
from psycopg.types.string import TextLoader

from tidemark.event import ChangeEvent, Op, SnapshotMarker, SourceContext, TableSchema
from tidemark.postgres_connection import Connection
from tidemark.source.postgres.change_builder import CONNECTOR_NAME
from tidemark.source.postgres.source_block import POSTGRES_BLOCK

log = logging.getLogger(__name__)


def begin_snapshot(conn: Connection, snapshot_name: str | None) -> int:
    """Open the snapshot transaction on *conn*; returns its transaction id.

    The transaction (REPEATABLE READ, READ ONLY) stays open: every read of the snapshot
    must run in it, and the caller ends it (``conn.rollback()``)."""
    # psycopg opens the transaction itself, with these characteristics, before the first
    # statement; SET TRANSACTION SNAPSHOT must be that first statement.
    conn.autocommit = False
    conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
    conn.read_only = True
    with conn.cursor() as cur:
        if snapshot_name:
            # SET takes no bound parameters: the name goes in as a quoted literal.
            cur.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(
                sql.Literal(snapshot_name)))
        # The snapshot's own transaction id, as Debezium's source.txId of snapshot rows
        # (it assigns one; confirmed by capture): the next free id, which the snapshot's
        # xmin would be, is the first streamed transaction's, and the two would look
        # like one transaction. A standby cannot assign one: its snapshot's xmin then.
        cur.execute("SELECT CASE WHEN pg_is_in_recovery() "
                    "THEN txid_snapshot_xmin(txid_current_snapshot()) "
                    "ELSE txid_current() END")
        row = cur.fetchone()
    assert row is not None
    return int(row[0])


def register_text_types(cur: psycopg.Cursor[Any]) -> None:
    """Make *cur* return every column as the text its type's output function prints.

    Every type psycopg would convert (numeric, ranges, json, arrays, bytea …) must come
    back as that text, like pgoutput sends it, so that one set of converters (and one
    form of keys) serves snapshot and stream rows alike. Only the cursor's own loaders
    change: catalog queries on the same connection still get Python values."""
    # Only the types psycopg knows are converted; every other one arrives as text.
    for oid in _known_oids():
        cur.adapters.register_loader(oid, TextLoader)


@functools.cache
def _known_oids() -> tuple[int, ...]:
    oids: set[int] = set()
    for info in psycopg.postgres.types:
        oids.update(oid for oid in (info.oid, info.array_oid) if oid)
    return tuple(sorted(oids))


def read_rows(
    conn: Connection, schema: TableSchema, fetch_size: int
) -> Iterator[list[tuple[str | None, ...]]]:
    """The table's rows as text tuples, in chunks of *fetch_size* (server-side cursor)."""
    query = sql.SQL("SELECT {} FROM {}.{}").format(
        sql.SQL(", ").join(sql.Identifier(c.name) for c in schema.columns),
        sql.Identifier(schema.table.schema),
        sql.Identifier(schema.table.table),
    )
    with conn.cursor(name=f"tidemark_snapshot_{schema.table.table[:40]}") as cur:
        register_text_types(cur)
        cur.itersize = fetch_size
        cur.execute(query)
        while True:
            rows = cur.fetchmany(fetch_size)
            if not rows:
                return
            yield rows


def snapshot_events(
    conn: Connection,
    schemas: Sequence[TableSchema],
    *,
    topic_prefix: str,
    database: str,
    lsn: int,
    txid: int,
    ts_us: int,
    fetch_size: int,
) -> Iterator[list[ChangeEvent]]:
    """Read (``r``) events for every row of *schemas*, in chunks.

    ``source.snapshot`` is ``first`` on the very first event, ``last`` on the very last,
    ``first_in_data_collection``/``last_in_data_collection`` at each table's edges, and
    ``true`` in between, as in Debezium. One event is held back so the last can be
    marked.
    """
    pending: ChangeEvent | None = None
    first_overall = True
    context = SourceContext(CONNECTOR_NAME, topic_prefix, database, ts_us, txid, None,
                            block=POSTGRES_BLOCK)
    for t_index, schema in enumerate(schemas):
        first_in_table = True
        count = 0
        for rows in read_rows(conn, schema, fetch_size):
            out: list[ChangeEvent] = []
            for row in rows:
                if pending is not None:
                    out.append(pending)
                marker = SnapshotMarker.TRUE
                if first_overall:
                    marker = SnapshotMarker.FIRST
                elif first_in_table:
                    marker = SnapshotMarker.FIRST_IN_DATA_COLLECTION
                first_overall = first_in_table = False
                pending = ChangeEvent(Op.READ, schema, None, row, context, lsn, 0, 0, ts_us,
                                      marker)
                count += 1
            if out:
                yield out
        if pending is not None and count and t_index < len(schemas) - 1 \
                and pending.snapshot == SnapshotMarker.TRUE:
            pending = _with_marker(pending, SnapshotMarker.LAST_IN_DATA_COLLECTION)
        log.info("snapshot of %s: %d rows", schema.table, count)
    if pending is not None:
        yield [_with_marker(pending, SnapshotMarker.LAST)]


def _with_marker(event: ChangeEvent, marker: SnapshotMarker) -> ChangeEvent:
    return ChangeEvent(event.op, event.schema, None, event.raw_after, event.context,
                       event.lsn, 0, 0, event.ts_us, marker)
