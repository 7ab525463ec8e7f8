"""The PostgreSQL connector's offset: its shape, and whether it can belong to the server.

The connector saves ``{"lsn": <int>, "snapshot_completed": <bool>}``: the position up to
which everything has been handed on, and whether the initial snapshot is behind it; in
the middle of a transaction also ``partial_commit_lsn`` and ``partial_messages``
(:mod:`~tidemark.source.postgres.partial_transaction`), and while an incremental snapshot
runs its state, ``incremental_snapshot`` (:mod:`~tidemark.source.postgres.incremental_snapshot`). An
offset read back is checked before anything touches the publication or the slot: a
malformed one would otherwise fail halfway through the start, and one that is ahead of
the server's WAL (another server's, or edited by hand) would skip every change up to
that position and confirm the slot there, losing those changes for later captures too.
"""

from __future__ import annotations

from typing import Any

from tidemark.errors import ConfigError
from tidemark.offsets.store import show_json
from tidemark.postgres_connection import Connection, cursor
from tidemark.source.postgres.partial_transaction import COMMIT_LSN_KEY, MESSAGES_KEY
from tidemark.source.postgres.pgoutput import lsn_to_str

MAX_LSN = (1 << 64) - 1

SHAPE = '{"lsn": <integer from 0 to 2^64-1>, "snapshot_completed": true|false}'

# On a standby (logical decoding there needs PostgreSQL 16) there is no insert position;
# the WAL received or replayed so far is what the server has.
_SERVER_POSITION_SQL = (
    "SELECT (CASE WHEN pg_is_in_recovery() "
    "THEN greatest(pg_last_wal_receive_lsn(), pg_last_wal_replay_lsn()) "
    "ELSE pg_current_wal_insert_lsn() END - '0/0')::bigint"
)


def check_shape(offset: Any, where: str) -> None:
    """Fail (:class:`ConfigError`, key ``offsets``) unless *offset* is an offset this
    connector saves; *where* names it (``key 'postgres/db/slot' in offsets file …``)."""

    def wrong(problem: str) -> ConfigError:
        return ConfigError("offsets", f"{where}: {problem}; a PostgreSQL offset is {SHAPE}")

    if not isinstance(offset, dict):
        raise wrong(f"holds {show_json(offset)}, not a JSON object")
    if "lsn" not in offset:
        raise wrong(f"{show_json(offset)} has no lsn")
    lsn = offset["lsn"]
    # bool is an int to Python, but true is no position.
    if isinstance(lsn, bool) or not isinstance(lsn, int) or not 0 <= lsn <= MAX_LSN:
        raise wrong(f"lsn is {show_json(lsn)}")
    completed = offset.get("snapshot_completed", False)
    if not isinstance(completed, bool):
        raise wrong(f"snapshot_completed is {show_json(completed)}")
    state = offset.get("incremental_snapshot")
    if state is not None and not (
            isinstance(state, dict) and isinstance(state.get("tables"), list)
            and all(isinstance(t, dict) and isinstance(t.get("table"), str)
                    for t in state["tables"])):
        raise wrong(f"incremental_snapshot is {show_json(state)}, not "
                    '{"tables": [{"table": "schema.table", …}, …], "paused": true|false}')
    # Saved in the middle of a transaction: its commit LSN and its messages handed on.
    partial = [offset.get(key) for key in (COMMIT_LSN_KEY, MESSAGES_KEY)]
    if partial != [None, None]:
        for key, value in zip((COMMIT_LSN_KEY, MESSAGES_KEY), partial, strict=True):
            if isinstance(value, bool) or not isinstance(value, int) or \
                    not 0 <= value <= MAX_LSN:
                raise wrong(f"{key} is {show_json(value)} (with {COMMIT_LSN_KEY} and "
                            f"{MESSAGES_KEY} both integers, or neither)")


def server_position(conn: Connection) -> int | None:
    """The end of the server's WAL: no offset of this server can be beyond it (None on a
    standby that has neither received nor replayed anything)."""
    with cursor(conn) as cur:
        cur.execute(_SERVER_POSITION_SQL)
        value = cur.fetchone()[0]
    return None if value is None else int(value)


def check_not_ahead(conn: Connection, offset: dict[str, Any],
                    where: str) -> None:
    """Fail (:class:`ConfigError`, key ``offsets``) if *offset* (of the right shape) is
    beyond the server's WAL, saying what to do about it."""
    server = server_position(conn)
    lsn = int(offset["lsn"])
    if server is None or lsn <= server:
        return
    raise ConfigError(
        "offsets",
        f"{where} is at LSN {lsn_to_str(lsn)}, ahead of this server's current WAL position "
        f"{lsn_to_str(server)}: it comes from another server (or was edited), and resuming "
        "there would skip every change before it and confirm the replication slot past "
        "them; point the capture at the server the offsets came from, or delete that key "
        "(or the offsets file) to start from the replication slot's position (after a new "
        "snapshot, unless snapshot_mode is no_data)",
    )
