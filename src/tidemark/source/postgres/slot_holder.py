"""Who else reads a replication slot: one slot, one reader, refused at start.

Two readers of one slot take each other's changes: each confirms (advances) what it
read, so the other finds the slot past its batch and cannot read those changes again.
A capture or an engine holds its slot while it streams (``active_pid`` of
``pg_replication_slots``); a Spark stream only peeks copies of it and advances it
between batches, so its driver holds a session advisory lock named after the slot for
as long as it runs (:func:`claim`). :func:`holder` finds either, and every runtime
refuses to start on a slot another process holds, with one line naming the slot, the
process and the way out (:class:`SlotHeldError`).

A reader that reconnects (its connection broke) is not another process: after a
network cut the server keeps the old backend, and with it the slot or the lock, until
``wal_sender_timeout`` (or TCP keepalives) notice. The reader remembers the backends
it used and passes them as *own*: such a holder is ended (``pg_terminate_backend``)
instead of refusing the slot. A backend is named by its PID and its start
(:func:`backend_start`): PIDs are reused (soon after a server restart, when they start
low again), and ending another process that got an old PID would be a disaster.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Mapping
from typing import Any, Final

from tidemark.errors import SourceError

log = logging.getLogger(__name__)

#: The advisory lock's first key (``tide`` in ASCII); the second is ``hashtext(slot)``.
LOCK_CLASS: Final = 0x74696465

#: How long a start waits for a holder to go away: a reader that just stopped (or whose
#: process died) lets go of the slot within moments.
RELEASE_WAIT_S: Final = 5.0

_HOLDER_SQL: Final = """
SELECT active_pid FROM pg_replication_slots
WHERE slot_name = %(slot)s AND active_pid IS NOT NULL AND active_pid <> pg_backend_pid()
UNION ALL
SELECT pid FROM pg_locks
WHERE locktype = 'advisory' AND granted AND classid = %(cls)s::oid
  AND objid = hashtext(%(slot)s)::oid AND objsubid = 2 AND pid <> pg_backend_pid()
  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
LIMIT 1
"""


class SlotHeldError(SourceError):
    """Another process reads the replication slot (the message names it and what to do)."""


def held_error(slot: str, pid: int, setting: str) -> SlotHeldError:
    """The error for *slot* held by process *pid*; *setting* names the slot's option."""
    return SlotHeldError(
        f"replication slot {slot!r} is in use by another process (PID {pid}: another "
        f"tidemark capture, engine or pipeline reading it): stop that one, or give this one "
        f"its own slot ({setting}); two readers of one slot would take each other's changes")


def holder(conn: Any, slot: str) -> int | None:
    """The PID of another session that streams from *slot* or claimed it; None if free."""
    row = conn.execute(_HOLDER_SQL, {"slot": slot, "cls": LOCK_CLASS}).fetchone()
    return None if row is None else int(row[0])


#: A backend's start, as text that every connection reads alike (not its TimeZone).
BACKEND_START_SQL: Final = ("SELECT extract(epoch FROM backend_start)::text "
                            "FROM pg_stat_activity WHERE pid = pg_backend_pid()")

#: The caller's earlier backends: PID to start (:func:`backend_start`).
OwnBackends = Mapping[int, str]


def backend_start(conn: Any) -> str:
    """When *conn*'s backend started (with its PID, it names the backend: see
    :data:`OwnBackends`)."""
    row = conn.execute(BACKEND_START_SQL).fetchone()
    return "" if row is None else str(row[0])


def end_own(conn: Any, slot: str, pid: int, own: OwnBackends) -> None:
    """If *pid* (a holder of *slot*) is one of *own*, the caller's earlier backends, end
    it: its client is gone (the connection broke), the server has not noticed yet.
    A process that reuses the PID (it started at another time) is left alone."""
    started = own.get(pid)
    if started is None:
        return
    log.info("replication slot %s is still held by this reader's previous connection "
             "(PID %d, whose client side broke): ending that backend", slot, pid)
    # Without the right to (another role's backend), waiting for it is all there is.
    with contextlib.suppress(Exception):
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                     "WHERE pid = %s AND extract(epoch FROM backend_start)::text = %s",
                     (pid, started))


def wait_until_free(conn: Any, slot: str, setting: str,
                    wait_s: float = RELEASE_WAIT_S, *, own: OwnBackends | None = None
                    ) -> None:
    """Return once no other session holds *slot*, waiting up to *wait_s* for one that
    is going away (ending it if it is one of *own*, the caller's earlier backends);
    raise :class:`SlotHeldError` otherwise."""
    deadline = time.monotonic() + wait_s
    while True:
        pid = holder(conn, slot)
        if pid is None:
            return
        end_own(conn, slot, pid, own or {})
        if time.monotonic() >= deadline:
            raise held_error(slot, pid, setting)
        time.sleep(0.2)


def claim(conn: Any, slot: str, setting: str, wait_s: float = RELEASE_WAIT_S, *,
          own: OwnBackends | None = None) -> None:
    """Hold *slot* for the life of *conn*'s session (an advisory lock), once no other
    session streams from it or holds it (one of *own*, the caller's earlier backends,
    is ended); raise :class:`SlotHeldError` otherwise."""
    deadline = time.monotonic() + wait_s
    while True:
        row = conn.execute("SELECT pg_try_advisory_lock(%s, hashtext(%s))",
                           (LOCK_CLASS, slot)).fetchone()
        if row is not None and row[0]:
            try:
                wait_until_free(conn, slot, setting, max(0.0, deadline - time.monotonic()),
                                own=own)
            except SlotHeldError:
                conn.execute("SELECT pg_advisory_unlock(%s, hashtext(%s))", (LOCK_CLASS, slot))
                raise
            return
        pid = holder(conn, slot)
        if pid is not None:
            end_own(conn, slot, pid, own or {})
        if time.monotonic() >= deadline and pid is not None:
            raise held_error(slot, pid, setting)
        time.sleep(0.2)
