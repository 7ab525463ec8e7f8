"""What the server says about a replication slot, for ``tidemark status``.

Read-only: a handful of catalog and statistics views, never the replication protocol and
never a peek, so asking cannot disturb (or be refused by) a capture holding the slot.
Positions are integers (bytes of WAL); :func:`tidemark.source.postgres.pgoutput.lsn_to_str`
prints them as PostgreSQL does.

Time lag is reported only where it was measured: the lag the server itself measured for
the walsender holding the slot (``pg_stat_replication``), or zero when the slot has
confirmed the server's whole WAL. A slot's position carries no time (the commit it
stands for is not recorded anywhere a query can reach without decoding WAL), so
otherwise the lag in seconds is unknown, and :class:`TimeLag` says why.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Final

from tidemark.postgres_connection import Connection, cursor

# On a standby (logical decoding there needs PostgreSQL 16) there is no insert position;
# the WAL received or replayed so far is what the server has.
_SERVER_SQL: Final = (
    "SELECT current_database(), current_setting('server_version_num')::int, "
    "pg_is_in_recovery(), "
    "(CASE WHEN pg_is_in_recovery() "
    "THEN greatest(pg_last_wal_receive_lsn(), pg_last_wal_replay_lsn()) "
    "ELSE pg_current_wal_insert_lsn() END - '0/0')::bigint, "
    "(CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() "
    "ELSE pg_current_wal_insert_lsn() END - '0/0')::bigint"
)

# wal_status and safe_wal_size exist from PostgreSQL 13 on.
_WAL_COLUMNS: Final = "s.wal_status, s.safe_wal_size"
_NO_WAL_COLUMNS: Final = "NULL::text, NULL::bigint"

# The process holding the slot (pg_stat_activity: a walsender, or a SQL session peeking
# or advancing it) and, for a walsender, what the server measured of its client.
_SLOT_SQL: Final = (
    "SELECT s.slot_name, s.plugin, s.slot_type, s.database, s.temporary, s.active, "
    "s.active_pid, (s.restart_lsn - '0/0')::bigint, "
    "(s.confirmed_flush_lsn - '0/0')::bigint, {wal_columns}, "
    "a.application_name, a.backend_type, host(a.client_addr), "
    "r.pid IS NOT NULL, r.state, (r.sent_lsn - '0/0')::bigint, "
    "(r.flush_lsn - '0/0')::bigint, extract(epoch FROM r.write_lag)::float8, "
    "extract(epoch FROM r.flush_lag)::float8, extract(epoch FROM r.replay_lag)::float8 "
    "FROM pg_replication_slots s "
    "LEFT JOIN pg_stat_activity a ON a.pid = s.active_pid "
    "LEFT JOIN pg_stat_replication r ON r.pid = s.active_pid "
    "WHERE s.slot_name = %s"
)


@dataclasses.dataclass(frozen=True)
class ServerWal:
    """The server's side: the database connected to and its WAL positions."""

    database: str
    version_num: int
    """``server_version_num`` (150018 for 15.18)."""
    in_recovery: bool
    end_lsn: int | None
    """The end of the server's WAL (``pg_current_wal_insert_lsn()``; on a standby the
    WAL received or replayed): no position of this server can be beyond it."""
    current_lsn: int | None
    """``pg_current_wal_insert_lsn()`` (on a standby the replay position): lags are taken
    against it. Not ``pg_current_wal_lsn()``: under ``synchronous_commit = off`` a
    commit is visible before the WAL writer writes it out, and a lag taken against the
    write position would read 0 for changes already committed."""


@dataclasses.dataclass(frozen=True)
class WalSender:
    """What ``pg_stat_replication`` shows of the walsender holding a slot.

    Lags are the server's own measurements (seconds), None when it has none: it shows
    none once the client has caught up and the server is idle, and none of other roles'
    walsenders to a role without ``pg_read_all_stats``.
    """

    state: str | None
    sent_lsn: int | None
    flush_lsn: int | None
    write_lag_s: float | None
    flush_lag_s: float | None
    replay_lag_s: float | None


@dataclasses.dataclass(frozen=True)
class SlotHolder:
    """The process holding an active slot."""

    pid: int
    application_name: str | None
    backend_type: str | None
    """``walsender`` for a replication connection (``tidemark capture``), ``client
    backend`` for a SQL session (the Spark source advancing its slot)."""
    client_addr: str | None
    walsender: WalSender | None


@dataclasses.dataclass(frozen=True)
class SlotState:
    """One row of ``pg_replication_slots`` and who holds the slot."""

    name: str
    plugin: str | None
    slot_type: str
    database: str | None
    temporary: bool
    active: bool
    restart_lsn: int | None
    """The oldest WAL the slot keeps (None once the slot is invalidated)."""
    confirmed_flush_lsn: int | None
    """Everything before it is confirmed by the slot's consumer."""
    wal_status: str | None
    """``reserved``, ``extended``, ``unreserved`` or ``lost`` (PostgreSQL 13+)."""
    safe_wal_size: int | None
    """Bytes of WAL that can still be written before the slot risks being lost (None
    when ``max_slot_wal_keep_size`` is unlimited, or before PostgreSQL 13)."""
    holder: SlotHolder | None


@dataclasses.dataclass(frozen=True)
class TimeLag:
    """The lag in seconds, and how it was measured (or why it could not be)."""

    seconds: float | None
    source: str | None
    """``walsender_flush_lag`` / ``walsender_replay_lag`` / ``walsender_write_lag`` (the
    server's measurement for the client holding the slot), ``caught_up`` (the slot has
    confirmed all of the server's WAL), or None when unknown."""
    note: str
    """One sentence for people: what the figure is, or why there is none."""


def read_server(conn: Connection) -> ServerWal:
    """The database *conn* is connected to and the server's WAL positions."""
    with cursor(conn) as cur:
        cur.execute(_SERVER_SQL)
        database, version, in_recovery, end, current = cur.fetchone()
    return ServerWal(database=str(database), version_num=int(version),
                     in_recovery=bool(in_recovery), end_lsn=_int(end),
                     current_lsn=_int(current))


def read_slot(conn: Connection, name: str,
              server: ServerWal) -> SlotState | None:
    """The slot called *name*, or None if the server has no such slot."""
    wal_columns = _WAL_COLUMNS if server.version_num >= 130000 else _NO_WAL_COLUMNS
    with cursor(conn) as cur:
        cur.execute(_SLOT_SQL.format(wal_columns=wal_columns), (name,))
        row = cur.fetchone()
    if row is None:
        return None
    (slot_name, plugin, slot_type, database, temporary, active, active_pid, restart,
     confirmed, wal_status, safe_wal_size, application, backend_type, client_addr,
     is_walsender, state, sent, flushed, write_lag, flush_lag, replay_lag) = row
    holder = None
    if active_pid is not None:
        walsender = WalSender(state=state, sent_lsn=_int(sent), flush_lsn=_int(flushed),
                              write_lag_s=_float(write_lag), flush_lag_s=_float(flush_lag),
                              replay_lag_s=_float(replay_lag)) if is_walsender else None
        holder = SlotHolder(pid=int(active_pid), application_name=application,
                            backend_type=backend_type, client_addr=client_addr,
                            walsender=walsender)
    return SlotState(name=str(slot_name), plugin=plugin, slot_type=str(slot_type),
                     database=database, temporary=bool(temporary), active=bool(active),
                     restart_lsn=_int(restart), confirmed_flush_lsn=_int(confirmed),
                     wal_status=wal_status, safe_wal_size=_int(safe_wal_size),
                     holder=holder)


def lag_bytes(slot: SlotState, server: ServerWal) -> int | None:
    """WAL the slot's consumer has not confirmed: the server's position minus the slot's
    confirmed position (0 if the slot is at or past it)."""
    if slot.confirmed_flush_lsn is None or server.current_lsn is None:
        return None
    return max(0, server.current_lsn - slot.confirmed_flush_lsn)


def retained_bytes(slot: SlotState, server: ServerWal) -> int | None:
    """WAL the server keeps for the slot: its position minus the slot's restart LSN."""
    if slot.restart_lsn is None or server.current_lsn is None:
        return None
    return max(0, server.current_lsn - slot.restart_lsn)


def time_lag(slot: SlotState | None, behind: int | None) -> TimeLag:
    """The lag in seconds where the server measured it (see the module docstring);
    *behind* is the consumer's lag in bytes (:func:`lag_bytes`, or a pipeline's)."""
    walsender = slot.holder.walsender if slot and slot.holder else None
    if walsender is not None:
        # The client confirms what it has handed on as its flush position (tidemark
        # capture reports write = flush = apply), so flush lag is the one that counts.
        for source, value in (("walsender_flush_lag", walsender.flush_lag_s),
                              ("walsender_replay_lag", walsender.replay_lag_s),
                              ("walsender_write_lag", walsender.write_lag_s)):
            if value is not None:
                return TimeLag(value, source, "measured by the server for the walsender "
                               f"holding the slot (pg_stat_replication.{source[10:]}; it "
                               "includes the client's status interval, 10 s for tidemark "
                               "capture)")
    if behind == 0:
        return TimeLag(0.0, "caught_up", "the slot has confirmed all of the server's WAL")
    if walsender is not None:
        why = ("the walsender holding the slot reports no lag time: the server measures it "
               "from its client's position reports, and shows none before they cover recent "
               "WAL, once the client has caught up and the server is idle, or to a role "
               "without pg_read_all_stats")
    elif slot is None:
        why = "there is no slot"
    elif slot.active:
        why = ("the slot is held by a SQL session, not a walsender, so the server "
               "measures no lag for it")
    else:
        why = "no process is streaming from the slot, and a slot's position carries no time"
    return TimeLag(None, None, why)


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _float(value: Any) -> float | None:
    return None if value is None else float(value)
