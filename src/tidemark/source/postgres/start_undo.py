"""Undoing what a failed start of a Spark stream made: its slot and its publication.

A pipeline's stream creates its publication when it is loaded and its slot when its
first batch is planned; a start that fails in between (Spark cannot start the query, a
check after them fails) would leave them behind, the slot holding WAL. What existed
before the start is noted first (:func:`note_before_start`) and only what did not is
dropped: never a slot or a publication the start found, and never once the start
planned a batch (then the pipeline's checkpoint relies on the slot: the caller decides).
Nothing is dropped while another process holds the slot (streams from it, or holds its
advisory lock as a running pipeline's driver does): two pipelines that start together on
one slot both find it absent, and the one refused must not drop what the other made.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql

from tidemark.source.postgres import slot_holder
from tidemark.source.postgres import wal_reads as wal

log = logging.getLogger(__name__)

_SLOT_SQL = "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s"
_PUBLICATION_SQL = "SELECT 1 FROM pg_publication WHERE pubname = %s"


def note_before_start(dsn: str, slot: str, publication: str) -> Callable[[], list[str]]:
    """What exists now; returns the function that drops the slot and the publication
    that did not (and names what it dropped)."""
    with contextlib.closing(wal.connect(dsn, purpose="start check")) as conn:
        had_slot = conn.execute(_SLOT_SQL, (slot,)).fetchone() is not None
        had_publication = conn.execute(_PUBLICATION_SQL, (publication,)).fetchone() \
            is not None

    def undo() -> list[str]:
        dropped: list[str] = []
        with contextlib.closing(wal.connect(dsn, purpose="failed start")) as conn:
            conn.autocommit = True
            # Under the slot's advisory lock, with no other session streaming from the
            # slot or holding it: another pipeline that started at the same moment
            # holds the lock while it runs (slot_holder.claim), and what it made is its.
            if not _take_lock(conn, slot):
                log.info("replication slot %s is held by another process: a failed start "
                         "leaves it and publication %s", slot, publication)
                return dropped
            try:
                if slot_holder.holder(conn, slot) is not None:
                    return dropped
                if not had_slot and conn.execute(_SLOT_SQL, (slot,)).fetchone() is not None:
                    try:
                        conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
                        dropped.append(f"replication slot {slot}")
                    except psycopg.Error as err:
                        log.warning("could not drop replication slot %s: %s", slot, err)
                if not had_publication and \
                        conn.execute(_PUBLICATION_SQL, (publication,)).fetchone() is not None:
                    conn.execute(sql.SQL("DROP PUBLICATION IF EXISTS {}")
                                 .format(sql.Identifier(publication)))
                    dropped.append(f"publication {publication}")
            finally:
                conn.execute("SELECT pg_advisory_unlock(%s, hashtext(%s))",
                             (slot_holder.LOCK_CLASS, slot))
        return dropped

    return undo


def _take_lock(conn: psycopg.Connection[Any], slot: str) -> bool:
    row = conn.execute("SELECT pg_try_advisory_lock(%s, hashtext(%s))",
                       (slot_holder.LOCK_CLASS, slot)).fetchone()
    return row is not None and bool(row[0])
