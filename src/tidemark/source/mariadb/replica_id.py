"""One capture per replica id (``server_id``) of a MariaDB server.

The server ends a binlog dump when another connects with the same replica id, so two
captures with one id end each other's dump, reconnect, and end it again. A capture
holds a named lock for its id (``GET_LOCK``, released when its connection ends) on a
connection of its own, from before its snapshot to its stop; a second one is refused at
its start, with the id and the way out. The dump's own connection cannot hold it: the
server may still run a dead dump of the same capture when it reconnects.

The lock is taken again when its connection is lost (a server restart, a network cut);
after a cut the server keeps the old connection, and the lock, until ``wait_timeout``:
that connection is this capture's own (its ``CONNECTION_ID()`` was noted), so it is
ended (``KILL``) instead of refusing the capture its own id.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any, Final

import pymysql
import pymysql.err

from tidemark.errors import SourceError, SourceUnavailableError
from tidemark.source.mariadb import client

log = logging.getLogger(__name__)

#: How often the holding connection is pinged: an idle connection is ended by the
#: server after ``wait_timeout`` (8 hours by default), and its lock with it.
_PING_S: Final = 60.0
#: How often a lost lock is taken again while the server cannot be reached.
_RETRY_S: Final = 5.0
#: How long a start waits for the lock: a capture that just stopped (or died) lets it go
#: when the server has ended its connection, moments after it closed it.
_RELEASE_WAIT_S: Final = 3
#: The lock connection's read and write deadline: keep() runs on the poll thread, which
#: a server that stopped answering must not hold (GET_LOCK waits _RELEASE_WAIT_S).
_IO_TIMEOUT_S: Final = 10.0
#: How far two readings of the server's start time may differ and be one start.
_SAME_START_S: Final = 2

_LOCK_SQL: Final = """
SELECT GET_LOCK(%(name)s, %(wait)s), IS_USED_LOCK(%(name)s), CONNECTION_ID(),
       UNIX_TIMESTAMP() - (SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS
                           WHERE VARIABLE_NAME = 'UPTIME')
"""


class ReplicaIdInUseError(SourceError):
    """Another capture of the server uses this replica id (the message says what to do)."""


class ReplicaIdClaim:
    """The lock on *server_id* of the server *settings* name, while a capture runs."""

    def __init__(self, settings: client.ConnectionSettings, server_id: int) -> None:
        self._settings = settings
        self._server_id = server_id
        self._name = f"tidemark.server_id.{server_id}"
        self._conn: pymysql.Connection[Any] | None = None
        self._pinged = 0.0
        #: Between claim() and release(): a lost lock is taken again by keep().
        self._wanted = False
        #: The connection that took the lock last (its id, and when the server started):
        #: one the server still keeps after a cut is this capture's own.
        self._held_by: tuple[int, int] | None = None

    def claim(self) -> None:
        """Take the lock, or raise :class:`ReplicaIdInUseError` if another holds it."""
        self._wanted = True
        self._close()
        conn = client.connect(self._settings, read_timeout=_IO_TIMEOUT_S,
                              write_timeout=_IO_TIMEOUT_S)
        try:
            got, holder, conn_id, started = self._try_lock(conn)
            if not got and holder is not None and self._is_own(holder, started):
                self._kill(conn, holder)
                got, holder, conn_id, started = self._try_lock(conn)
        except BaseException:
            conn.close()
            raise
        if not got:
            conn.close()
            named = f" (connection {holder})" if holder is not None else ""
            s = self._settings
            raise ReplicaIdInUseError(
                f"server_id {self._server_id} is in use by another capture of "
                f"{s.host}:{s.port}{named}: two captures with one server_id end each "
                "other's binlog dump. Stop the other capture, or give this one another "
                "server_id (the server_id setting; by default it is derived from the "
                "server and the topic prefix, so --topic-prefix changes it)")
        self._conn = conn
        self._held_by = (conn_id, started)
        self._pinged = time.monotonic()

    def keep(self) -> None:
        """Ping now and then; after a lost connection (a server restart, a network cut),
        take the lock again (raising if another capture took it meanwhile), retrying
        while the server cannot be reached."""
        if not self._wanted:
            return
        wait = _PING_S if self._conn is not None else _RETRY_S
        if time.monotonic() - self._pinged < wait:
            return
        self._pinged = time.monotonic()
        if self._conn is not None:
            try:
                self._conn.ping(reconnect=False)
                return
            except pymysql.err.MySQLError:
                pass
        try:
            self.claim()
        except (SourceUnavailableError, pymysql.err.MySQLError):
            # Unreachable: the dump's own retries report it; the next keep() tries again.
            self._close()
            self._pinged = time.monotonic()

    def release(self) -> None:
        """Let the lock go (closing its connection)."""
        self._wanted = False
        self._close()

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def _try_lock(self, conn: pymysql.Connection[Any]) -> tuple[bool, int | None, int, int]:
        with conn.cursor() as cur:
            cur.execute(_LOCK_SQL, {"name": self._name, "wait": _RELEASE_WAIT_S})
            row = cur.fetchone()
        got, holder, conn_id, started = row
        return (got == 1, None if holder is None else int(holder), int(conn_id),
                int(float(started)))

    def _is_own(self, holder: int, started: int) -> bool:
        # Connection ids start again at 1 when the server restarts: an id is this
        # capture's only within the server start it was noted in.
        return self._held_by is not None and self._held_by[0] == holder \
            and abs(self._held_by[1] - started) <= _SAME_START_S

    def _kill(self, conn: pymysql.Connection[Any], holder: int) -> None:
        log.info("the lock on server_id %d is still held by this capture's previous "
                 "connection (%d, whose client side broke): ending it", self._server_id,
                 holder)
        # Without the right to (another user's connection), waiting is all there is.
        with contextlib.suppress(pymysql.err.MySQLError), conn.cursor() as cur:
            cur.execute(f"KILL CONNECTION {int(holder)}")
