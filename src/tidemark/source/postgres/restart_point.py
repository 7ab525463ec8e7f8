"""Keeping a slot's ``restart_lsn`` close behind the batches the Spark source reads.

Every read of a batch decodes from the slot's ``restart_lsn``, not from the batch's
start: the scan that sizes a batch, each partition's copy of the slot and the advance
after it. PostgreSQL moves ``restart_lsn`` only past a record of the running transactions
(``xl_running_xacts``), which the background writer logs every 15 seconds of activity, so
each read decoded up to 15 seconds of changes it then dropped: 100 MB of WAL per read in
a 30-minute soak at 10,000 changes/s once full-page images filled the WAL. Logging that
record (``pg_log_standby_snapshot()``, PostgreSQL 16 on) as each batch's end is chosen
puts one in every batch or the next (once it is flushed) that follows at least
:data:`MIN_WAL_BYTES` of WAL, so once that batch is committed its slot restarts a batch
or two behind.

The function needs superuser or ``GRANT EXECUTE ON FUNCTION pg_log_standby_snapshot()``
and cannot run on a standby (recovery): where the server refuses it, for any reason, this
says so once and the source reads as before, only slower.
"""

from __future__ import annotations

import logging
from typing import Any, Final

import psycopg
from psycopg import sql

log = logging.getLogger(__name__)


#: WAL past the last record that makes the next one worth logging: less is cheap to
#: decode again, and another source's record (a few dozen bytes) must not make one, or
#: two sources on an idle server would answer each other's records for ever.
MIN_WAL_BYTES: Final = 1 << 20


class RestartPoints:
    """Logs a running-transactions record when enough WAL came after the last one."""

    def __init__(self) -> None:
        self._after: int | None = None
        self._enabled = True

    @property
    def enabled(self) -> bool:
        """False once the server refused the record (too old, no privilege, a standby)."""
        return self._enabled

    def due(self, flushed: int) -> bool:
        """Whether at least :data:`MIN_WAL_BYTES` of WAL were flushed past the end of
        the last record (an idle server gets none)."""
        return self._enabled and (self._after is None or
                                  flushed - self._after >= MIN_WAL_BYTES)

    def log_record(self, conn: psycopg.Connection[Any]) -> None:
        """Log the record on *conn* (autocommit), or say once why the server cannot."""
        if conn.info.server_version < 160000:
            self._disable("PostgreSQL before 16 has no pg_log_standby_snapshot()")
            return
        try:
            row = conn.execute(
                "SELECT (pg_log_standby_snapshot() - '0/0')::bigint").fetchone()
        except psycopg.errors.InsufficientPrivilege:
            user = sql.Identifier(conn.info.user).as_string(conn)
            self._disable("the source's user may not run pg_log_standby_snapshot() (GRANT "
                          f"EXECUTE ON FUNCTION pg_log_standby_snapshot() TO {user})")
            return
        except psycopg.DatabaseError as err:
            if _not_the_function(conn, err):
                raise  # the read fails as any other would
            # A standby (recovery is in progress), or a server without the function.
            self._disable(f"the server refused pg_log_standby_snapshot(): {err}".strip())
            return
        assert row is not None
        self._after = int(row[0])  # the record's end

    def _disable(self, reason: str) -> None:
        self._enabled = False
        log.info("each read of a batch decodes the WAL from up to 15 s before it (the "
                 "slot's restart point moves only with the server's own records of its "
                 "running transactions): %s", reason)


def _not_the_function(conn: psycopg.Connection[Any], err: psycopg.DatabaseError) -> bool:
    """Whether *err* is about the connection or the server (a timeout, a cut, a
    shutdown, a cancel), not about the function."""
    return conn.closed or err.sqlstate is None or err.sqlstate[:2] in {"08", "57"}
