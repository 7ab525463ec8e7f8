"""Replication slot and publication management.

The slot keeps the server from discarding WAL we have not confirmed; the publication
chooses which tables pgoutput sends. Both are created on first use and validated on
every later one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import psycopg2.extensions
from psycopg2 import sql

from tidemark.errors import SourceError, TransientError
from tidemark.event import TableId
from tidemark.source.postgres.session import cursor

log = logging.getLogger(__name__)


class SlotInUseError(TransientError):
    """The replication slot is held by another process (which may be going away)."""


class SlotInfo:
    """What the server reports about a slot."""

    __slots__ = ("active_pid", "confirmed_flush_lsn", "database", "name", "plugin",
                 "restart_lsn")

    def __init__(self, name: str, plugin: str, database: str, active_pid: int | None,
                 confirmed_flush_lsn: int | None, restart_lsn: int | None) -> None:
        self.name = name
        self.plugin = plugin
        self.database = database
        self.active_pid = active_pid
        self.confirmed_flush_lsn = confirmed_flush_lsn
        self.restart_lsn = restart_lsn


def get_slot(conn: psycopg2.extensions.connection, name: str) -> SlotInfo | None:
    """The slot called *name*, or None if it does not exist."""
    with cursor(conn) as cur:
        cur.execute(
            "SELECT slot_name, plugin, database, active_pid, "
            "(confirmed_flush_lsn - '0/0')::bigint, (restart_lsn - '0/0')::bigint "
            "FROM pg_replication_slots WHERE slot_name = %s",
            (name,),
        )
        row = cur.fetchone()
    if row is None:
        return None
    return SlotInfo(row[0], row[1] or "", row[2] or "", row[3],
                    None if row[4] is None else int(row[4]),
                    None if row[5] is None else int(row[5]))


def validate_slot(slot: SlotInfo, database: str) -> None:
    """Fail unless *slot* is a free pgoutput slot of *database*."""
    if slot.plugin != "pgoutput":
        raise SourceError(
            f"replication slot {slot.name!r} uses output plugin {slot.plugin!r}, not "
            "pgoutput: choose another slot_name or drop that slot"
        )
    if slot.database != database:
        raise SourceError(
            f"replication slot {slot.name!r} belongs to database {slot.database!r}, not "
            f"{database!r}: choose another slot_name"
        )
    if slot.active_pid is not None:
        raise SlotInUseError(
            f"replication slot {slot.name!r} is active in another process (PID "
            f"{slot.active_pid}): stop the other capture or use another slot_name"
        )


def drop_slot(conn: psycopg2.extensions.connection, name: str, wait_s: float = 10.0) -> None:
    """Drop the slot once no process holds it (a closing walsender may, briefly)."""
    deadline = time.monotonic() + wait_s
    with cursor(conn) as cur:
        while True:
            cur.execute("SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s",
                        (name,))
            row = cur.fetchone()
            if row is None:
                return
            if row[0] is None:
                cur.execute("SELECT pg_drop_replication_slot(%s)", (name,))
                log.info("dropped replication slot %s", name)
                return
            if time.monotonic() > deadline:
                log.warning("replication slot %s is still held by PID %s; not dropped",
                            name, row[0])
                return
            time.sleep(0.1)


def ensure_publication(
    conn: psycopg2.extensions.connection, name: str, tables: Sequence[TableId]
) -> None:
    """Create the publication for *tables*, or add the tables it lacks."""
    with cursor(conn) as cur:
        cur.execute("SELECT puballtables FROM pg_publication WHERE pubname = %s", (name,))
        row = cur.fetchone()
        table_list = sql.SQL(", ").join(
            sql.SQL("{}.{}").format(sql.Identifier(t.schema), sql.Identifier(t.table))
            for t in tables
        )
        try:
            if row is None:
                if not tables:
                    raise SourceError(f"no tables to capture for publication {name!r}")
                # Partitioned tables publish under their own name, as the snapshot
                # reads them, not under each partition's.
                cur.execute(
                    sql.SQL("CREATE PUBLICATION {} FOR TABLE {} "
                            "WITH (publish_via_partition_root = true)").format(
                        sql.Identifier(name), table_list
                    )
                )
                log.info("created publication %s for %d tables", name, len(tables))
                return
            if row[0]:
                return  # FOR ALL TABLES covers everything
            cur.execute(
                "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s",
                (name,),
            )
            present = {TableId(s, t) for s, t in cur.fetchall()}
            missing = [t for t in tables if t not in present]
            if missing:
                cur.execute(
                    sql.SQL("ALTER PUBLICATION {} ADD TABLE {}").format(
                        sql.Identifier(name),
                        sql.SQL(", ").join(
                            sql.SQL("{}.{}").format(sql.Identifier(t.schema),
                                                    sql.Identifier(t.table))
                            for t in missing
                        ),
                    )
                )
                log.info("added %s to publication %s", ", ".join(map(str, missing)), name)
        except psycopg2.errors.InsufficientPrivilege as err:
            raise SourceError(
                f"cannot create or alter publication {name!r}: {(err.pgerror or '').strip()}; "
                "create it as the tables' owner (CREATE PUBLICATION ... FOR TABLE ...) or "
                "grant ownership"
            ) from None
