"""Replication slot and publication management.

The slot keeps the server from discarding WAL we have not confirmed; the publication
chooses which tables pgoutput sends. Both are created on first use and validated on
every later one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql

from tidemark.errors import ConfigError, SourceError, TransientError
from tidemark.event import TableId
from tidemark.postgres_connection import Connection, cursor, on_standby
from tidemark.source.postgres import catalog

log = logging.getLogger(__name__)


class SlotInUseError(TransientError):
    """The replication slot is held by another process (which may be going away)."""


class SlotLostError(SourceError):
    """The slot the offsets need is gone or was invalidated: changes since the offset
    cannot be streamed any more (the message says how to recover)."""


def makes_failover_slot(server_version: int, setting: bool | None, name: str, *,
                        standby: bool = False) -> bool:
    """Whether a new slot is a failover slot (PostgreSQL 17+): *setting* None means
    where the server can; true on an older server, or on a *standby* (PostgreSQL
    refuses failover for a slot made there), is an error naming the setting *name*."""
    if setting and server_version < 170000:
        raise ConfigError(name, "failover slots need PostgreSQL 17 or later; this server "
                                f"is {server_version // 10000}: set {name} = false")
    if setting and standby:
        raise ConfigError(name, "this server is a standby, and a slot created on a standby "
                                f"cannot be a failover slot: set {name} = false, or capture "
                                "from the primary")
    return setting is not False and server_version >= 170000 and not standby


class SlotInfo:
    """What the server reports about a slot."""

    __slots__ = ("active_pid", "confirmed_flush_lsn", "database", "invalidation", "name",
                 "plugin", "restart_lsn")

    def __init__(self, name: str, plugin: str, database: str, active_pid: int | None,
                 confirmed_flush_lsn: int | None, restart_lsn: int | None,
                 invalidation: str | None = None) -> None:
        self.name = name
        self.plugin = plugin
        self.database = database
        self.active_pid = active_pid
        self.confirmed_flush_lsn = confirmed_flush_lsn
        self.restart_lsn = restart_lsn
        self.invalidation = invalidation
        """Why the server invalidated the slot (None: it is usable): ``wal_removed``
        (its WAL exceeded ``max_slot_wal_keep_size``), ``rows_removed`` (a standby's
        slot lost its catalog rows), ``idle_timeout``, ``wal_level_insufficient``."""


def get_slot(conn: Connection, name: str) -> SlotInfo | None:
    """The slot called *name*, or None if it does not exist."""
    with cursor(conn) as cur:
        cur.execute(
            # invalidation_reason (17+) and conflicting (16+) through to_jsonb: older
            # servers have only wal_status, whose "lost" means wal_removed.
            "SELECT slot_name, plugin, database, active_pid, "
            "(confirmed_flush_lsn - '0/0')::bigint, (restart_lsn - '0/0')::bigint, "
            "COALESCE(to_jsonb(s) ->> 'invalidation_reason', CASE WHEN wal_status = 'lost' "
            "THEN 'wal_removed' WHEN to_jsonb(s) ->> 'conflicting' = 'true' THEN "
            "'rows_removed' END) FROM pg_replication_slots s WHERE slot_name = %s",
            (name,),
        )
        row = cur.fetchone()
    if row is None:
        return None
    return SlotInfo(row[0], row[1] or "", row[2] or "", row[3],
                    None if row[4] is None else int(row[4]),
                    None if row[5] is None else int(row[5]), row[6])


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


def drop_slot(conn: Connection, name: str, wait_s: float = 10.0) -> None:
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


#: Attempts of ensure_publication when concurrent starts keep winning the race.
_PUBLICATION_ATTEMPTS = 10


def ensure_publication(
    conn: Connection, name: str, tables: Sequence[TableId]
) -> list[TableId]:
    """Create the publication for *tables*, or add the tables it lacks; returns the
    tables added to a publication that existed (not to one created now).

    Never publishes a table PostgreSQL would then refuse UPDATEs and DELETEs of (see
    :func:`catalog.tables_without_identity`); callers leave such tables out first, this
    is the last guard.

    Safe when several captures start at once on one publication: one that finds the
    publication created, or a table added, by another since it looked checks again and
    adds only what is still missing.
    """
    for attempt in range(1, _PUBLICATION_ATTEMPTS + 1):
        try:
            return _ensure_publication_once(conn, name, tables)
        except (psycopg.errors.DuplicateObject, psycopg.errors.UniqueViolation) as err:
            # Another start created the publication or added a table between our look
            # and our statement (which changed nothing: it failed as a whole).
            if attempt == _PUBLICATION_ATTEMPTS:
                raise SourceError(
                    f"publication {name!r} kept changing while tidemark completed it "
                    f"({_first_line(err)}): start again once the other captures started"
                ) from None
            log.debug("publication %s changed concurrently (%s); checking again", name,
                      _first_line(err))
    raise AssertionError("unreachable")


def _ensure_publication_once(
    conn: Connection, name: str, tables: Sequence[TableId]
) -> list[TableId]:
    with cursor(conn) as cur:
        cur.execute(
            "SELECT puballtables, pg_get_userbyid(pubowner), "
            "pg_has_role(pubowner, 'USAGE'), current_user, quote_ident(pubname), "
            "pubviaroot FROM pg_publication WHERE pubname = %s",
            (name,),
        )
        row = cur.fetchone()
        if row is not None and not row[5]:
            _refuse_partitions_by_their_own_names(cur, name, row[4], tables)
        if row is not None and row[0]:
            return []  # FOR ALL TABLES covers everything (and cannot be altered)
        if row is None:
            present: set[TableId] = set()
        else:
            cur.execute(
                "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s",
                (name,),
            )
            present = {TableId(s, t) for s, t in cur.fetchall()}
        missing = [t for t in tables if t not in present]
        refused = catalog.tables_without_identity(conn, missing)
        if refused:
            raise SourceError(f"not adding to publication {name!r}: "
                              + "; ".join(refused[t] for t in missing if t in refused))
        if row is not None and not missing:
            return []
        _refuse_on_standby(cur, name, missing, exists=row is not None)
        if row is None:
            _create_publication(cur, name, tables)
            return []
        _, owner, may_alter, user, quoted, _ = row
        statement = sql.SQL("ALTER PUBLICATION {} ADD TABLE {}").format(
            sql.Identifier(name), _table_list(missing))
        # The fix the message offers is SQL to paste: names quoted only where needed,
        # as PostgreSQL prints them.
        fix = f"ALTER PUBLICATION {quoted} ADD TABLE {_readable_names(cur, missing)}"
        listed = ", ".join(map(str, missing))
        if not may_alter:
            raise SourceError(
                f"publication {name!r} lacks table(s) {listed} and role {user!r} cannot add "
                f"them: the publication is owned by {owner!r}; ask that owner (or a "
                f"superuser) to run {fix}, or use another publication (--publication, "
                "publication_name) that tidemark may create"
            )
        try:
            cur.execute(statement)
        except psycopg.errors.InsufficientPrivilege as err:
            raise SourceError(
                f"cannot add table(s) {listed} to publication {name!r}: "
                f"{_first_line(err)}; ask the tables' owner (or a superuser) to run {fix}, "
                "or use another publication (--publication, publication_name)"
            ) from None
        # Other subscribers of this publication now receive these tables' changes too,
        # which whoever made it may not expect: say so where it shows by default.
        log.warning("added table(s) %s to existing publication %s (ALTER PUBLICATION ... "
                    "ADD TABLE): every subscriber of %s now receives their changes",
                    listed, name, name)
        return missing


def _refuse_partitions_by_their_own_names(cur: Any, name: str, quoted: str,
                                          tables: Sequence[TableId]) -> None:
    """A publication without publish_via_partition_root sends a partitioned table's
    changes under its partitions' names, which are not captured: every change of it
    would be dropped after the snapshot. Refuse, with the fix."""
    if not tables:
        return
    cur.execute(
        "SELECT n.nspname, c.relname FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE c.relkind = 'p' AND (n.nspname, c.relname) IN "
        "(SELECT * FROM unnest(%s::text[], %s::text[]))",
        ([t.schema for t in tables], [t.table for t in tables]))
    partitioned = [TableId(schema, table) for schema, table in cur.fetchall()]
    if partitioned:
        raise SourceError(
            f"publication {name!r} has publish_via_partition_root off, so it sends the "
            f"changes of partitioned table(s) {', '.join(map(str, partitioned))} under "
            "their partitions' names, which are not captured: all of them would be lost "
            f"after the snapshot. Run ALTER PUBLICATION {quoted} SET "
            "(publish_via_partition_root = true), or use another publication "
            "(--publication, publication_name) that tidemark creates")


def _publication_options(server_version: int) -> str:
    # Partitioned tables publish under their own name, as the snapshot reads them, not
    # under each partition's; from PostgreSQL 18 on, stored generated columns too.
    options = "publish_via_partition_root = true"
    if server_version >= 180000:
        options += ", publish_generated_columns = stored"
    return options


def _refuse_on_standby(cur: Any, name: str, missing: Sequence[TableId], *,
                       exists: bool) -> None:
    """A standby (logical decoding there: PostgreSQL 16+) is read-only: the publication
    must come from the primary, by replication. Say so with the statement to run there."""
    if not on_standby(cur.connection):
        return
    cur.execute("SELECT quote_ident(%s)", (name,))
    (quoted,) = cur.fetchone()
    listed = _readable_names(cur, missing)
    if exists:
        fix = f"ALTER PUBLICATION {quoted} ADD TABLE {listed}"
        what = f"publication {name!r} lacks table(s) {listed}"
    else:
        options = _publication_options(cur.connection.info.server_version)
        fix = f"CREATE PUBLICATION {quoted} FOR TABLE {listed} WITH ({options})"
        what = f"publication {name!r} does not exist"
    raise SourceError(
        f"{what}, and this server is a standby (read-only), where tidemark cannot change "
        f"it: run {fix} on the primary (it reaches the standby by replication), then "
        "start again")


def _create_publication(cur: Any, name: str, tables: Sequence[TableId]) -> None:
    if not tables:
        raise SourceError(f"no tables to capture for publication {name!r}")
    options = _publication_options(cur.connection.info.server_version)
    try:
        cur.execute(
            sql.SQL("CREATE PUBLICATION {} FOR TABLE {} WITH ({})").format(
                sql.Identifier(name), _table_list(tables), sql.SQL(options)
            )
        )
    except psycopg.errors.InsufficientPrivilege as err:
        cur.execute("SELECT quote_ident(%s)", (name,))
        quoted = cur.fetchone()[0]
        raise SourceError(
            f"cannot create publication {name!r}: {_first_line(err)}; creating it needs "
            "the CREATE privilege on the database and ownership of the tables: ask their "
            f"owner (or a superuser) to run CREATE PUBLICATION {quoted} FOR TABLE "
            f"{_readable_names(cur, tables)} WITH ({options})"
        ) from None
    log.info("created publication %s for %d tables", name, len(tables))


def _table_list(tables: Sequence[TableId]) -> sql.Composed:
    return sql.SQL(", ").join(
        sql.SQL("{}.{}").format(sql.Identifier(t.schema), sql.Identifier(t.table))
        for t in tables
    )


def _readable_names(cur: Any, tables: Sequence[TableId]) -> str:
    """*tables* as PostgreSQL prints them: quoted only where the name needs it."""
    cur.execute("SELECT string_agg(format('%%I.%%I', s, t), ', ' ORDER BY ord) "
                "FROM unnest(%s::text[], %s::text[]) WITH ORDINALITY AS w(s, t, ord)",
                ([t.schema for t in tables], [t.table for t in tables]))
    return str(cur.fetchone()[0])


def _first_line(err: psycopg.Error) -> str:
    text = (err.diag.message_primary or str(err)).strip()
    return text.splitlines()[0].removeprefix("ERROR:").strip() if text else "permission denied"
