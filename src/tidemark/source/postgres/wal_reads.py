"""What the Spark source asks PostgreSQL: positions, slot copies, peeks, advances.

All reading goes through SQL (``pg_logical_slot_peek_binary_changes``), never the
replication protocol, so nothing is consumed until :func:`advance_slot` runs in the
source's ``commit``. Only one session at a time may use a slot (a second peek on the
same slot fails with "replication slot is active" — measured on PostgreSQL 15), so every
read peeks a **temporary copy** of the query's slot (``pg_copy_logical_replication_slot``,
a few milliseconds), fast-forwarded to the start of its range first. Copies let several
executors decode different parts of one batch at the same time, server side and in
Python, and they disappear with their session if an executor dies.

Connections are tidemark's (psycopg 3: a binary server-side cursor fetched peek rows
about 4x faster than psycopg2 here) with its session settings, which fix the text form of
the values pgoutput prints (the peeking backend's settings apply).
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
from collections.abc import Iterator
from typing import Any, Final

import psycopg

from tidemark import faults, postgres_connection
from tidemark.errors import SourceError, TerminalError
from tidemark.fetch_budget import FetchBudget
from tidemark.source.postgres.pgoutput import lsn_to_str
from tidemark.source.postgres.slot import makes_failover_slot
from tidemark.source.postgres.stream_offsets import TxnSummary

log = logging.getLogger(__name__)

_MAX_NAME: Final = 63
#: WAL messages per fetch of a peek, at most (a byte budget cuts wide ones' fetches).
_FETCH_ROWS: Final = 20_000

# One row per transaction: its commit LSN (bytes 2-9 of the Begin message) and the
# number of data messages (Insert, Update, Delete, Truncate). The server decodes, the
# network carries a few bytes per transaction.
_SCAN_SQL: Final = """
SELECT max(CASE WHEN get_byte(data, 0) = 66
                THEN ('x' || encode(substr(data, 2, 8), 'hex'))::bit(64)::bigint END),
       count(*) FILTER (WHERE get_byte(data, 0) IN (73, 85, 68, 84)),
       count(*)
FROM pg_logical_slot_peek_binary_changes(%(slot)s, %(upto)s::pg_lsn, %(rows)s,
     'proto_version', '1', 'publication_names', %(publication)s)
GROUP BY xid
"""

_PEEK_SQL: Final = """
SELECT (lsn - '0/0')::bigint, data
FROM pg_logical_slot_peek_binary_changes(%(slot)s, %(upto)s::pg_lsn, NULL,
     'proto_version', '1', 'publication_names', %(publication)s)
"""


class SlotMovedError(TerminalError):
    """The slot is already past the batch being read: its transactions are gone."""


def connect(dsn: str, *, purpose: str,
            server_timeout_s: float | None = None) -> psycopg.Connection[Any]:
    """tidemark's connection (:func:`tidemark.postgres_connection.connect`) for the Spark
    source's *purpose*; with *server_timeout_s*, no wait for the server lasts longer
    (:class:`~tidemark.postgres_connection.ServerTimeoutError`)."""
    return postgres_connection.connect(dsn, application_name=f"tidemark spark {purpose}",
                                       server_timeout_s=server_timeout_s)


def flush_lsn(conn: psycopg.Connection[Any]) -> int:
    """``pg_current_wal_flush_lsn()``: peeks decode up to here, so offsets stop here too.

    (``pg_current_wal_lsn()`` may be ahead of the flush position; a transaction between
    the two would be assigned to a batch whose reads cannot see it yet.)
    """
    row = conn.execute("SELECT (pg_current_wal_flush_lsn() - '0/0')::bigint").fetchone()
    assert row is not None
    return int(row[0])


# A failover slot's changes may go out only once the standbys it is synchronised to have
# them (synchronized_standby_slots: PostgreSQL waits on their physical slots' restart_lsn
# before it hands a failover slot's changes to a client). Batches are read through
# temporary copies of the slot, which are not failover slots and do not wait: their end
# is held to the same point, or a batch read from the primary could hold transactions
# that a promoted standby never had, and the positions after them on its own WAL would
# then be taken for read already.
_STANDBY_SAFE_END_SQL = """
SELECT (LEAST(pg_current_wal_flush_lsn(), (
    SELECT min(standby.restart_lsn) FROM pg_replication_slots standby
    WHERE standby.slot_type = 'physical'
      AND standby.slot_name = ANY (string_to_array(
          replace(current_setting('synchronized_standby_slots', true), ' ', ''), ','))
      AND EXISTS (SELECT 1 FROM pg_replication_slots own
                  WHERE own.slot_name = %s AND own.failover)
)) - '0/0')::bigint
"""


def readable_end(conn: psycopg.Connection[Any], slot: str) -> int:
    """Where a batch of *slot* may end: :func:`flush_lsn`, and for a failover slot
    (PostgreSQL 17+) no further than every standby in ``synchronized_standby_slots``
    has confirmed."""
    if conn.info.server_version < 170000:
        return flush_lsn(conn)
    row = conn.execute(_STANDBY_SAFE_END_SQL, (slot,)).fetchone()
    assert row is not None
    return int(row[0])


def slot_position(conn: psycopg.Connection[Any], slot: str) -> int:
    """The slot's ``confirmed_flush_lsn``; a clear error if the slot does not exist."""
    row = conn.execute(
        "SELECT (confirmed_flush_lsn - '0/0')::bigint, plugin, database = current_database() "
        "FROM pg_replication_slots WHERE slot_name = %s", (slot,)
    ).fetchone()
    if row is None:
        raise SourceError(
            f"replication slot {slot!r} does not exist (dropped while the query was stopped?): "
            "its unread changes are gone; start the query with a new checkpoint location"
        )
    position, plugin, same_db = row
    if plugin != "pgoutput" or not same_db or position is None:
        raise SourceError(f"replication slot {slot!r} is not a pgoutput slot of this "
                          "database: choose another slot name")
    return int(position)


def ensure_slot(conn: psycopg.Connection[Any], slot: str, failover: bool | None = None) -> int:
    """Create the logical slot if missing; returns its position (``confirmed_flush_lsn``).

    *failover*: a failover slot (PostgreSQL 17+), which standbys synchronise; None makes
    one where the server can."""
    exists = conn.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s",
                          (slot,)).fetchone()
    if exists is None:
        try:
            if makes_failover_slot(conn.info.server_version, failover, "slotFailover"):
                conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput', "
                             "false, false, true)", (slot,))
            else:
                conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')",
                             (slot,))
            log.info("created replication slot %s", slot)
            faults.crash_point("after_slot_created", 0)
        except psycopg.errors.DuplicateObject:
            pass  # created concurrently by another query start; validated below
    return slot_position(conn, slot)


def advance_slot(conn: psycopg.Connection[Any], slot: str, lsn: int) -> int:
    """Move the slot to *lsn* (never backwards): the WAL before it may be recycled."""
    if slot_position(conn, slot) >= lsn:
        return lsn
    row = conn.execute("SELECT (end_lsn - '0/0')::bigint FROM "
                       "pg_replication_slot_advance(%s, %s::pg_lsn)",
                       (slot, lsn_to_str(lsn))).fetchone()
    assert row is not None
    return int(row[0])


@contextlib.contextmanager
def slot_copy_at(conn: psycopg.Connection[Any], slot: str, lsn: int) -> Iterator[str]:
    """A temporary copy of *slot* positioned at *lsn*, dropped afterwards.

    Positioned means: a peek returns the transactions committing at or after *lsn*,
    and no earlier ones. Raises :class:`SlotMovedError` if *slot* is already past
    *lsn*: the transactions in between were released and cannot be read again.
    """
    suffix = f"_r{os.getpid()}_{secrets.token_hex(3)}"
    name = slot[: _MAX_NAME - len(suffix)] + suffix
    try:
        conn.execute("SELECT pg_copy_logical_replication_slot(%s, %s, true)", (slot, name))
    except psycopg.errors.UndefinedObject:
        slot_position(conn, slot)  # raises the explanatory error
        raise
    try:
        position = slot_position(conn, name)
        if position > lsn:
            raise SlotMovedError(
                f"replication slot {slot!r} is at {lsn_to_str(position)}, past the batch "
                f"start {lsn_to_str(lsn)}: the slot was advanced outside this query (or the "
                "checkpoint is older than the slot); those changes cannot be read again. "
                "Start the query with a new checkpoint location"
            )
        if position < lsn:
            # Fast-forward decoding: the server skips building output for transactions
            # before the range, much cheaper than peeking and dropping them.
            conn.execute("SELECT pg_replication_slot_advance(%s, %s::pg_lsn)",
                         (name, lsn_to_str(lsn)))
        yield name
    finally:
        if not conn.closed and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
            with contextlib.suppress(psycopg.Error):
                conn.execute("SELECT pg_drop_replication_slot(%s)", (name,))


def scan(conn: psycopg.Connection[Any], slot: str, publication: str, upto: int,
         max_rows: int) -> tuple[list[TxnSummary], bool]:
    """Transactions of *slot* (a positioned copy) committing before *upto*.

    Stops after about *max_rows* messages (whole transactions); the flag says whether
    it stopped early, in which case only commits up to the last one returned are known.
    """
    rows = conn.execute(_SCAN_SQL, {"slot": slot, "upto": lsn_to_str(upto), "rows": max_rows,
                                    "publication": publication}).fetchall()
    txns = sorted((TxnSummary(int(r[0]), int(r[1])) for r in rows if r[0] is not None
                   and int(r[0]) < upto), key=lambda t: t.commit_lsn)
    return txns, sum(int(r[2]) for r in rows) >= max_rows


def peek(conn: psycopg.Connection[Any], slot: str, publication: str,
         upto: int) -> Iterator[list[tuple[int, bytes]]]:
    """The messages of *slot* (a positioned copy) up to *upto*, in chunks of rows.

    Every transaction committing before *upto* is included (the server reads any WAL
    record that starts before it); a few committing just after may be too, so callers
    filter by commit LSN.
    """
    with conn.transaction(), conn.cursor(name="tidemark_peek", binary=True) as cur:
        cur.execute(_PEEK_SQL, {"slot": slot, "upto": lsn_to_str(upto),
                                "publication": publication})
        # A message carries a whole row: a fetch is bounded by bytes too.
        budget = FetchBudget(_FETCH_ROWS)
        while True:
            rows = cur.fetchmany(budget.rows())
            if not rows:
                return
            budget.saw(rows)
            yield rows
