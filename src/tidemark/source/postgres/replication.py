"""The streaming replication connection: reads pgoutput messages, confirms positions.

This is the only module that does replication I/O. It hands messages on in batches
(a list per call, up to ``max_messages``) because per-message hand-offs cost more than
the decoding, and it reports to the server (standby status update) only positions the
caller says are durably handed on — that is the at-least-once contract.
"""

from __future__ import annotations

import logging
import select
import time
from typing import Any

import psycopg2
import psycopg2.extensions
import psycopg2.extras

from tidemark.errors import SourceError, SourceUnavailableError
from tidemark.source.postgres import session
from tidemark.source.postgres.pgoutput import lsn_to_str, str_to_lsn
from tidemark.source.postgres.slot import SlotInUseError

log = logging.getLogger(__name__)


class ReplicationStream:
    """A pgoutput stream from a logical replication slot.

    ``read_batch`` returns psycopg2 ``ReplicationMessage`` objects (``payload`` bytes and
    ``data_start`` LSN). ``confirm(lsn)`` records that everything before *lsn* has been
    durably handed on; the server may then recycle that WAL.
    """

    def __init__(self, dsn: str, slot: str, publication: str, *,
                 status_interval_s: float = 10.0) -> None:
        self._dsn = dsn
        self._slot = slot
        self._publication = publication
        self._status_interval = status_interval_s
        self._conn: Any = None
        self._cur: Any = None
        self._confirmed = 0
        self._last_status = 0.0

    # -- slot creation (before streaming) ---------------------------------------------
    def connect(self) -> None:
        """Open the replication connection (does not start streaming yet)."""
        self._conn = session.connect(self._dsn, replication=True)
        self._cur = self._conn.cursor()

    def create_slot(self) -> tuple[int, str]:
        """Create the slot, exporting its snapshot; returns (consistent LSN, snapshot name).

        The snapshot stays importable (``SET TRANSACTION SNAPSHOT``) until this
        connection runs another command, so import it before :meth:`start`.
        """
        try:
            self._cur.execute(
                f'CREATE_REPLICATION_SLOT "{self._slot}" LOGICAL pgoutput EXPORT_SNAPSHOT'
            )
        except psycopg2.errors.DuplicateObject:
            raise SourceError(f"replication slot {self._slot!r} already exists") from None
        except psycopg2.Error as err:
            raise SourceError(
                f"cannot create replication slot {self._slot!r}: {_first_line(err)}"
            ) from None
        _name, consistent, snapshot, _plugin = self._cur.fetchone()
        return str_to_lsn(consistent), str(snapshot)

    def start(self, start_lsn: int) -> None:
        """Start streaming changes committed at or after *start_lsn* (0: the slot's).

        The confirmed position is not touched: after a reconnect the stream may resume
        past what the caller has committed, but only :meth:`confirm` moves the slot.
        """
        if self._conn is None:
            self.connect()
        try:
            self._cur.start_replication(
                slot_name=self._slot,
                decode=False,
                start_lsn=start_lsn,
                options={"proto_version": "1", "publication_names": self._publication,
                         "messages": "true"},
                status_interval=self._status_interval,
            )
        except psycopg2.errors.ObjectInUse as err:
            raise SlotInUseError(
                f"replication slot {self._slot!r} is active in another process: "
                f"{_first_line(err)}"
            ) from None
        except psycopg2.errors.UndefinedObject as err:
            raise SourceError(f"cannot stream from slot {self._slot!r}: "
                              f"{_first_line(err)}") from None
        except psycopg2.OperationalError as err:
            raise SourceUnavailableError(f"replication connection failed: "
                                         f"{_first_line(err)}") from None
        log.info("streaming from slot %s at %s", self._slot, lsn_to_str(start_lsn))

    # -- streaming -----------------------------------------------------------------------
    def read_batch(self, max_messages: int, timeout_s: float) -> list[Any]:
        """Up to *max_messages* messages; waits at most *timeout_s* for the first."""
        cur = self._cur
        read = cur.read_message
        batch: list[Any] = []
        try:
            while len(batch) < max_messages:
                msg = read()
                if msg is None:
                    if batch or timeout_s <= 0:
                        break
                    ready = select.select([self._conn], [], [], timeout_s)[0]
                    timeout_s = 0
                    if not ready:
                        break
                    continue
                batch.append(msg)
            self._maybe_send_status()
        except psycopg2.OperationalError as err:
            raise SourceUnavailableError(f"replication stream broke: {_first_line(err)}") \
                from None
        except psycopg2.DatabaseError as err:
            raise _classify_stream_error(err, self._slot) from None
        return batch

    @property
    def wal_end(self) -> int:
        """The server's WAL position as of its last message or keepalive."""
        return int(self._cur.wal_end) if self._cur is not None else 0

    @property
    def confirmed_lsn(self) -> int:
        return self._confirmed

    def confirm(self, lsn: int) -> None:
        """Everything before *lsn* is durably handed on; tell the server (throttled)."""
        self._confirmed = max(self._confirmed, lsn)
        self._maybe_send_status()

    def request_keepalive(self) -> None:
        """Ask the server for a keepalive now, so :attr:`wal_end` becomes current."""
        self._send_status(reply=True)

    def _maybe_send_status(self) -> None:
        if time.monotonic() - self._last_status >= self._status_interval:
            self._send_status(reply=False)

    def _send_status(self, reply: bool) -> None:
        if self._cur is None:
            return
        try:
            self._cur.send_feedback(write_lsn=self._confirmed, flush_lsn=self._confirmed,
                                    apply_lsn=self._confirmed, reply=reply, force=True)
        except psycopg2.Error as err:
            raise SourceUnavailableError(f"replication stream broke: {_first_line(err)}") \
                from None
        self._last_status = time.monotonic()

    def close(self) -> None:
        """Send a final status update (best effort) and close the connection."""
        if self._conn is None:
            return
        try:
            if self._cur is not None and self._confirmed:
                self._cur.send_feedback(flush_lsn=self._confirmed, write_lsn=self._confirmed,
                                        apply_lsn=self._confirmed, force=True)
        except psycopg2.Error:
            pass  # the connection is going away anyway
        try:
            self._conn.close()
        finally:
            self._conn = None
            self._cur = None


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _classify_stream_error(err: psycopg2.DatabaseError, slot: str) -> Exception:
    if isinstance(err, psycopg2.errors.ObjectInUse):
        return SlotInUseError(f"replication slot {slot!r} is active in another process")
    return SourceError(f"replication stream failed: {_first_line(err)}")
