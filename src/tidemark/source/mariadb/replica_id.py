"""One capture per replica id (``server_id``) of a MariaDB server.

The server ends a binlog dump when another connects with the same replica id, so two
captures with one id end each other's dump, reconnect, and end it again. A capture
holds a named lock for its id (``GET_LOCK``, released when its connection ends) on a
connection of its own, from before its snapshot to its stop; a second one is refused at
its start, with the id and the way out. The dump's own connection cannot hold it: the
server may still run a dead dump of the same capture when it reconnects.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Final

import pymysql

from tidemark.errors import SourceError, SourceUnavailableError
from tidemark.source.mariadb import client

#: How often the holding connection is pinged: an idle connection is ended by the
#: server after ``wait_timeout`` (8 hours by default), and its lock with it.
_PING_S: Final = 60.0
#: How long a start waits for the lock: a capture that just stopped (or died) lets it go
#: when the server has ended its connection, moments after it closed it.
_RELEASE_WAIT_S: Final = 3


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

    def claim(self) -> None:
        """Take the lock, or raise :class:`ReplicaIdInUseError` if another holds it."""
        self.release()
        conn = client.connect(self._settings)
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT GET_LOCK(%s, %s), IS_USED_LOCK(%s)",
                            (self._name, _RELEASE_WAIT_S, self._name))
                row = cur.fetchone()
        except BaseException:
            conn.close()
            raise
        if not row or row[0] != 1:
            conn.close()
            holder = f" (connection {row[1]})" if row and row[1] is not None else ""
            s = self._settings
            raise ReplicaIdInUseError(
                f"server_id {self._server_id} is in use by another capture of "
                f"{s.host}:{s.port}{holder}: two captures with one server_id end each "
                "other's binlog dump. Stop the other capture, or give this one another "
                "server_id (the server_id setting; by default it is derived from the "
                "server and the topic prefix, so --topic-prefix changes it)")
        self._conn = conn
        self._pinged = time.monotonic()

    def keep(self) -> None:
        """Ping now and then; after a lost connection (a server restart), take the lock
        again (raising if another capture took it meanwhile)."""
        if self._conn is None or time.monotonic() - self._pinged < _PING_S:
            return
        self._pinged = time.monotonic()
        try:
            self._conn.ping(reconnect=False)
        except pymysql.err.MySQLError:
            with contextlib.suppress(SourceUnavailableError):
                self.claim()  # unreachable: the dump's own retries report it

    def release(self) -> None:
        """Let the lock go (closing its connection)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()
