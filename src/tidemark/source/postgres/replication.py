"""The streaming replication connection: reads pgoutput messages, confirms positions.

This is the only module that does replication I/O. It speaks the streaming
replication sub-protocol itself, over libpq's COPY BOTH through psycopg's low-level
``pq`` layer, because the position reported to the server decides what a restart can
recover: it must be exactly what the caller has committed, never more. (psycopg2's
replication cursor moves its reported flush position forward by itself on server
keepalives whenever the last received message starts below the last confirmed LSN —
true in the middle of any transaction that began before an already-committed one —
which confirms transactions the caller has received but not yet committed.)

Messages are handed on in batches of ``(payload, data_start)`` pairs because
per-message hand-offs cost more than decoding.

Protocol reference: https://www.postgresql.org/docs/15/protocol-replication.html
"""

from __future__ import annotations

import logging
import select
import struct
import time
from typing import Final

import psycopg
from psycopg import pq

from tidemark.errors import SourceError, SourceUnavailableError
from tidemark.postgres_connection import classify_connect_message, session_conninfo
from tidemark.source.postgres import slot_holder
from tidemark.source.postgres.copy_data import GOT_EMPTY, GOT_END, GOT_LIMIT, read_copy
from tidemark.source.postgres.pgoutput import PG_EPOCH_OFFSET_US, lsn_to_str, str_to_lsn
from tidemark.source.postgres.slot import SlotInUseError, SlotLostError, makes_failover_slot
from tidemark.source.postgres.socket_fill import SocketFill

log = logging.getLogger(__name__)

#: One replication message: the pgoutput payload and the WAL position it starts at.
WalMessage = tuple[bytes, int]

_DATA_START: Final = struct.Struct(">Q")  # XLogData begins with dataStart (walEnd, sendTime)
_KEEPALIVE: Final = struct.Struct(">QqB")  # walEnd, sendTime, replyRequested
_STATUS: Final = struct.Struct(">cQQQqB")  # 'r', write, flush, apply, clock, reply
_XLOG_DATA: Final = 0x77  # 'w'
_KEEPALIVE_TYPE: Final = 0x6B  # 'k'
_GATHER_S: Final = 0.05
_GATHER_PAUSE_S: Final = 0.002
# Messages a batch holds before its reads wait for the socket to fill (socket_fill): a
# batch's first messages, the first event's among them, are handed on as they arrive.
_FILL_AFTER: Final = 256


def _now_pg_us() -> int:
    return time.time_ns() // 1000 - PG_EPOCH_OFFSET_US


class ReplicationStream:
    """A pgoutput stream from a logical replication slot.

    ``read_batch`` returns ``(payload, data_start)`` pairs. ``confirm(lsn)`` records that
    everything before *lsn* has been durably handed on; only then may the server recycle
    that WAL. Nothing else moves the position reported to the server.
    """

    def __init__(self, dsn: str, slot: str, publication: str, *,
                 status_interval_s: float = 10.0, receive_timeout_s: float = 60.0,
                 backend_pids: dict[int, str] | None = None) -> None:
        self._dsn = dsn
        #: Every server backend (walsender) this stream connected to, oldest first
        #: (*backend_pids*, if given, is added to): one still holding the slot after
        #: the connection broke is this reader's own, not another reader.
        self.backend_pids: dict[int, str] = {} if backend_pids is None else backend_pids
        self._slot = slot
        self._publication = publication
        self._status_interval = status_interval_s
        self._receive_timeout = receive_timeout_s
        self._last_received = 0.0
        self._pinged = False
        self._conn: pq.abc.PGconn | None = None
        self._streaming = False
        self._confirmed = 0
        self._server_wal_end = 0
        self._last_status = 0.0
        self._fill: SocketFill | None = None  # while streaming
        self._reply_requested = False  # a keepalive asked for and not yet received

    # -- connection and slot creation ---------------------------------------------------
    def connect(self) -> None:
        """Open the replication connection (does not start streaming yet)."""
        conninfo = session_conninfo(self._dsn, application_name="tidemark",
                                    replication="database")
        conn = pq.PGconn.connect(conninfo.encode())
        if conn.status != pq.ConnStatus.OK:
            message = conn.get_error_message()
            conn.finish()
            raise classify_connect_message(self._dsn, message)
        self._conn = conn
        # With its start: a PID alone may name another process later (see slot_holder).
        result = self._exec(conn, slot_holder.BACKEND_START_SQL)
        started = result.get_value(0, 0) if result.ntuples else None
        self.backend_pids[conn.backend_pid] = (started or b"").decode()
        self._streaming = False

    def _require(self) -> pq.abc.PGconn:
        if self._conn is None:
            raise SourceUnavailableError("the replication connection is closed")
        return self._conn

    def create_slot(self, *, temporary: bool = False,
                    failover: bool | None = None) -> tuple[int, str]:
        """Create the slot, exporting its snapshot; returns (consistent LSN, snapshot name).

        The snapshot stays importable (``SET TRANSACTION SNAPSHOT``) until this
        connection runs another command, so import it before :meth:`start`. A
        *temporary* slot disappears with the connection. *failover*: a failover slot
        (PostgreSQL 17+) that standbys synchronise; None makes one where the server can.
        """
        conn = self._require()
        options = ["SNAPSHOT 'export'"]
        standby = conn.parameter_status(b"in_hot_standby") == b"on"
        if not temporary and makes_failover_slot(conn.server_version, failover,
                                                 "slot_failover", standby=standby):
            options.append("FAILOVER true")
        if standby:
            log.info("creating slot %s on a standby: it is ready once the primary's next "
                     "running-transactions record is replayed here (every 15 s while the "
                     "primary is busy; SELECT pg_log_standby_snapshot() on the primary "
                     "writes one now)", self._slot)
        # The slot name was validated as a plain identifier by the config.
        kind = "TEMPORARY LOGICAL" if temporary else "LOGICAL"
        result = self._exec(conn, f'CREATE_REPLICATION_SLOT "{self._slot}" {kind} pgoutput '
                                  f"({', '.join(options)})")
        if result.status != pq.ExecStatus.TUPLES_OK:
            message = _result_error(result)
            if "already exists" in message:
                raise SourceError(f"replication slot {self._slot!r} already exists")
            raise SourceError(f"cannot create replication slot {self._slot!r}: {message}")
        consistent = (result.get_value(0, 1) or b"").decode()
        snapshot = (result.get_value(0, 2) or b"").decode()
        # A slot made again (on_slot_lost = "resnapshot") starts afresh: positions
        # confirmed to the lost one say nothing about it (start() forgets what its
        # walsender said it had sent).
        self._confirmed = 0
        return str_to_lsn(consistent), snapshot

    def start(self, start_lsn: int) -> None:
        """Start streaming transactions that commit at or after *start_lsn* (0: the
        slot's confirmed position). Does not change the confirmed position."""
        if self._conn is None:
            self.connect()
        conn = self._require()
        command = (
            f'START_REPLICATION SLOT "{self._slot}" LOGICAL {lsn_to_str(start_lsn)} '
            f"(proto_version '1', publication_names '{self._publication}', messages 'true')"
        )
        result = self._exec(conn, command)
        if result.status != pq.ExecStatus.COPY_BOTH:
            message = _result_error(result)
            sqlstate = (result.error_field(pq.DiagnosticField.SQLSTATE) or b"").decode()
            if sqlstate == "55006":  # object_in_use
                raise SlotInUseError(
                    f"replication slot {self._slot!r} is active in another process "
                    f"({message.rstrip('.')}): stop the other reader or use another slot "
                    "(slot_name, --slot)")
            if sqlstate and not sqlstate.startswith(("08", "57")):
                raise _slot_error(self._slot, f"cannot stream from slot {self._slot!r}: "
                                              f"{message}")
            raise SourceUnavailableError(f"replication connection failed: {message}")
        conn.nonblocking = 1
        self._close_fill()
        self._fill = SocketFill(conn.socket)
        self._streaming = True
        # A new walsender: what the last one said it had sent may be past transactions
        # whose messages died with its connection, unread, and come again from here.
        self._server_wal_end = 0
        self._reply_requested = False
        self._last_status = self._last_received = time.monotonic()
        self._pinged = False
        log.info("streaming from slot %s at %s", self._slot, lsn_to_str(start_lsn))

    @staticmethod
    def _exec(conn: pq.abc.PGconn, command: str) -> pq.abc.PGresult:
        try:
            return conn.exec_(command.encode())
        except psycopg.OperationalError as err:
            raise SourceUnavailableError(
                f"replication connection failed: {str(err).strip()}"
            ) from None

    # -- streaming -----------------------------------------------------------------------
    def read_batch(self, max_messages: int, timeout_s: float,
                   gather_s: float = _GATHER_S) -> list[WalMessage]:
        """Up to *max_messages* messages; waits at most *timeout_s* for the first, and
        gathers more while they keep coming, for up to *gather_s*."""
        conn = self._require()
        get = conn.get_copy_data
        data_start = _DATA_START.unpack_from
        batch: list[WalMessage] = []
        append = batch.append
        # Until the first XLogData, wait this long, or until the answer to a keepalive
        # request: a keepalive the walsender sends of its own accord does not end the
        # wait (it often sends one just before the data, and an empty batch costs the
        # caller an idle pause).
        deadline = time.monotonic() + timeout_s
        answered = False
        # Keep reading while the socket has data at hand (up to _GATHER_S), so batches
        # are large: per-batch costs downstream (flushes, offset saves) are high.
        gather_until = time.monotonic() + gather_s
        sock = conn.socket
        fill = self._fill
        heard = False
        try:
            while len(batch) < max_messages:
                # The XLogData messages at hand, in bulk (compiled where built).
                had = len(batch)
                status, data = read_copy(get, batch, max_messages)
                if len(batch) > had:
                    heard = True
                if status == GOT_LIMIT:
                    break
                if status == GOT_EMPTY:  # nothing complete in libpq's buffer: read the socket
                    if len(batch) >= _FILL_AFTER and fill is not None:
                        # The gathering time bounds the batch: the fill waits would
                        # otherwise soak up the pauses that end it, holding a trickle's
                        # changes until max_messages.
                        if time.monotonic() >= gather_until:
                            break
                        fill.wait(_GATHER_PAUSE_S)  # a read worth its syscall (socket_fill)
                    conn.consume_input()
                    size, data = get(1)
                    if size == 0:
                        if batch:
                            # A busy stream never pauses for 2 ms; an idle one returns
                            # what it has after at most that.
                            if time.monotonic() < gather_until and \
                                    select.select([sock], [], [], _GATHER_PAUSE_S)[0]:
                                continue
                            break
                        remaining = deadline - time.monotonic()
                        if remaining <= 0 or answered:
                            break
                        select.select([sock], [], [], remaining)
                        continue
                    if size < 0:
                        raise self._broken(conn)  # the server ended COPY
                elif status == GOT_END:
                    raise self._broken(conn)
                heard = True
                kind = data[0]
                if kind == _XLOG_DATA:
                    # tobytes() of a slice, not bytes(): half the cost per message.
                    append((data[25:].tobytes(), data_start(data, 1)[0]))
                elif kind == _KEEPALIVE_TYPE:
                    wal_end, _, reply = _KEEPALIVE.unpack_from(data, 1)
                    self._server_wal_end = max(self._server_wal_end, wal_end)
                    if self._reply_requested:
                        answered = True
                        self._reply_requested = False
                    if reply:
                        self._send_status(reply=False)
            if heard:
                self._last_received = time.monotonic()
                self._pinged = False
            elif self._receive_timeout:
                self._check_alive()
            self._maybe_send_status()
        except psycopg.OperationalError as err:
            raise self._broken(conn, str(err)) from None
        return batch

    def _check_alive(self) -> None:
        """Ask a silent server for a keepalive at half the receive timeout; take the
        connection for dead at the whole of it."""
        silent = time.monotonic() - self._last_received
        if silent >= self._receive_timeout:
            raise SourceUnavailableError(
                f"nothing from the server for {silent:.0f} s, not even an answer to a "
                f"keepalive request (wal_receive_timeout_ms): the connection looks dead "
                f"(a network partition or a stopped server)")
        if silent >= self._receive_timeout / 2 and not self._pinged:
            self._pinged = True
            self._send_status(reply=True)

    def _broken(self, conn: pq.abc.PGconn, detail: str = "") -> Exception:
        message = detail or conn.get_error_message() or "the server ended the stream"
        result = conn.get_result()
        if result is not None and result.status == pq.ExecStatus.FATAL_ERROR:
            message = _result_error(result)
            sqlstate = (result.error_field(pq.DiagnosticField.SQLSTATE) or b"").decode()
            if sqlstate and not sqlstate.startswith(("08", "57")):
                return _slot_error(self._slot, f"replication stream failed: {message}")
        return SourceUnavailableError(f"replication stream broke: {message.strip()}")

    @property
    def wal_end(self) -> int:
        """The server's sent position as of its last keepalive."""
        return self._server_wal_end

    @property
    def confirmed_lsn(self) -> int:
        """The position last confirmed to the server (what the caller committed)."""
        return self._confirmed

    def confirm(self, lsn: int) -> None:
        """Everything before *lsn* is durably handed on; tell the server (throttled).

        Best effort: if the connection is broken the next :meth:`read_batch` says so,
        and the position is reported again after reconnecting.
        """
        self._confirmed = max(self._confirmed, lsn)
        try:
            self._maybe_send_status()
        except SourceUnavailableError as err:
            log.debug("status update not sent: %s", err)

    def request_keepalive(self) -> None:
        """Ask the server for a keepalive now, so :attr:`wal_end` becomes current
        (best effort, like :meth:`confirm`)."""
        try:
            self._send_status(reply=True)
        except SourceUnavailableError as err:
            log.debug("keepalive request not sent: %s", err)

    def _maybe_send_status(self) -> None:
        if time.monotonic() - self._last_status >= self._status_interval:
            self._send_status(reply=False)

    def _send_status(self, reply: bool) -> None:
        conn = self._conn
        if conn is None or not self._streaming:
            return
        lsn = self._confirmed
        message = _STATUS.pack(b"r", lsn, lsn, lsn, _now_pg_us(), 1 if reply else 0)
        try:
            conn.put_copy_data(message)
            conn.flush()
        except psycopg.OperationalError as err:
            raise self._broken(conn, str(err)) from None
        if reply:
            self._reply_requested = True
        self._last_status = time.monotonic()

    def close(self) -> None:
        """Send a final status update (best effort) and close the connection."""
        conn = self._conn
        if conn is None:
            return
        try:
            if self._streaming and self._confirmed:
                self._send_status(reply=False)
        except (SourceError, SourceUnavailableError):
            pass  # the connection is going away anyway
        finally:
            self._conn = None
            self._streaming = False
            self._close_fill()
            conn.finish()

    def _close_fill(self) -> None:
        if self._fill is not None:
            self._fill.close()
            self._fill = None


def _slot_error(slot: str, message: str) -> SourceError:
    """A server error about the stream; a slot the server invalidated says how to
    recover."""
    # PostgreSQL 15 at START_REPLICATION: "cannot read from logical replication slot";
    # 16-17 "can no longer get changes from replication slot"; 18 "can no longer access
    # replication slot".
    if "can no longer" in message or "has been invalidated" in message or \
            "cannot read from logical replication slot" in message or \
            ("replication slot" in message and "does not exist" in message):
        return SlotLostError(
            f"{message}: replication slot {slot!r} was invalidated by the server or "
            "dropped, and the changes it held are lost to capture. Run capture with "
            "on_slot_lost = \"resnapshot\" (a new slot, then an incremental snapshot of "
            "every captured table), or drop the slot and restart with snapshot_mode = "
            "\"when_needed\"")
    return SourceError(message)


def _result_error(result: pq.abc.PGresult) -> str:
    text = (result.error_message or b"").decode(errors="replace").strip()
    return text.splitlines()[0] if text else str(result.status)
