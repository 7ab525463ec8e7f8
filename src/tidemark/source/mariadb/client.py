"""Connections to a MariaDB server: the checks capture needs, and the binlog dump.

PyMySQL does the client protocol (handshake, authentication, queries); the replication
stream is one command, ``COM_BINLOG_DUMP``, after which the server sends one packet per
binlog event for as long as the connection lives. PyMySQL has no API for that command,
so :class:`BinlogStream` writes it and reads the packets with PyMySQL's packet layer
(the same two calls python-mysql-replication uses).

MariaDB positions a dump by GTID (``@slave_connect_state``) or by file and position;
tidemark uses the GTID when it has one, because it survives a failover to a replica.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
import struct
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import unquote, urlsplit

import msgspec
import pymysql
import pymysql.converters
import pymysql.err

from tidemark.errors import ConfigError, SourceError, SourceUnavailableError
from tidemark.source.mariadb.binlog import CHECKSUM_CRC32, CHECKSUM_OFF
from tidemark.source.mariadb.position import BinlogPosition

log = logging.getLogger(__name__)

COM_BINLOG_DUMP: Final = 0x12
_DUMP_NON_BLOCK: Final = 1
_MARIA_SLAVE_CAPABILITY_GTID: Final = 4
_READ_BUFFER_BYTES: Final = 1 << 20  # the binlog stream's read buffer (see BinlogStream.open)
_MAX_PACKET: Final = 0xFFFFFF  # a packet this long continues in the next
_CR_SERVER_LOST: Final = 2013
_LOST: Final = "Lost connection to MySQL server during query"

# Server error codes that say what to fix.
ER_ACCESS_DENIED: Final = 1045
ER_SPECIFIC_ACCESS_DENIED: Final = 1227
ER_MASTER_FATAL_READING_BINLOG: Final = 1236
ER_BAD_DB: Final = 1049
CR_CONNECTION_ERRORS: Final = frozenset({2002, 2003, 2006, 2013, 2055})


#: Converters for the text protocol that return every value as the server sent it (str,
#: or bytes for binary fields; only the parameter encoders are kept): the snapshot
#: brings values to canonical text itself.
RAW_VALUES: Final = {k: v for k, v in pymysql.converters.conversions.items()
                     if not isinstance(k, int)}


class ConnectionSettings(msgspec.Struct, frozen=True, kw_only=True):
    """Where and as whom to connect. Build from a URL with :func:`parse_url`."""

    host: str = "127.0.0.1"
    port: int = 3306
    user: str = "root"
    password: str = ""
    database: str = ""
    connect_timeout_s: float = 10.0

    def redacted(self) -> str:
        """``user@host:port/db`` without the password, for logs and errors."""
        return f"{self.user}@{self.host}:{self.port}/{self.database}"


def parse_url(url: str) -> ConnectionSettings:
    """``mariadb://user:password@host:port/database`` (``mysql://`` too)."""
    parts = urlsplit(url)
    if parts.scheme not in ("mariadb", "mysql"):
        raise ConfigError("dsn", f"{parts.scheme or url!r} is not a MariaDB URL: expected "
                          "mariadb://user:password@host:port/database")
    try:
        port = parts.port or 3306
    except ValueError:
        raise ConfigError("dsn", "the port of the MariaDB URL is not a number") from None
    return ConnectionSettings(host=parts.hostname or "127.0.0.1", port=port,
                              user=unquote(parts.username or "root"),
                              password=unquote(parts.password or ""),
                              database=parts.path.lstrip("/"))


if TYPE_CHECKING:
    _PyMySqlConnection = pymysql.connections.Connection[Any]
else:
    _PyMySqlConnection = pymysql.connections.Connection

_default_tls: list[ssl.SSLContext] = []
_default_tls_lock = threading.Lock()


class _Connection(_PyMySqlConnection):
    """PyMySQL's connection, with one TLS context per process for its default mode
    (TLS when the server offers it, its certificate not verified). PyMySQL makes that
    context anew for every connection, loading the system's CA certificates each time
    (tens of ms of CPU; a capture opens four connections before its first event)."""

    def _create_ssl_ctx(self, sslp: Any) -> ssl.SSLContext:
        make: Any = super()._create_ssl_ctx  # type: ignore[misc]
        if sslp != {}:  # TLS options given: PyMySQL's own context for them
            return make(sslp)  # type: ignore[no-any-return]
        with _default_tls_lock:
            if not _default_tls:
                _default_tls.append(make(sslp))
            return _default_tls[0]


def connect(settings: ConnectionSettings, **kwargs: Any) -> pymysql.Connection[Any]:
    """An autocommit connection; unreachable servers and refused logins become errors
    that say which server and what to check (never the password)."""
    try:
        return _Connection(host=settings.host, port=settings.port, user=settings.user,
                               password=settings.password,
                               database=settings.database or None, autocommit=True,
                               charset="utf8mb4", connect_timeout=settings.connect_timeout_s,
                               **kwargs)
    except pymysql.err.OperationalError as err:
        code = err.args[0] if err.args else 0
        if code == ER_ACCESS_DENIED:
            raise ConfigError("dsn", f"MariaDB refused the login of {settings.redacted()}: "
                              "check the user name and password") from None
        if code == ER_BAD_DB:
            raise ConfigError("dsn", f"database {settings.database!r} does not exist on "
                              f"{settings.host}:{settings.port}") from None
        raise SourceUnavailableError(f"cannot connect to MariaDB at {settings.host}:"
                                     f"{settings.port}: {err.args[-1]}") from None


def server_variables(conn: pymysql.Connection[Any], *names: str) -> dict[str, str]:
    """The global values of *names* (missing ones are absent)."""
    with conn.cursor() as cur:
        cur.execute("SELECT VARIABLE_NAME, VARIABLE_VALUE FROM information_schema."
                    "GLOBAL_VARIABLES WHERE VARIABLE_NAME IN ("
                    + ",".join(["%s"] * len(names)) + ")", [n.upper() for n in names])
        return {str(k).lower(): str(v) for k, v in cur.fetchall()}


def check_server(conn: pymysql.Connection[Any]) -> None:
    """Raise :class:`SourceError` naming the setting to change when the server cannot be
    captured: binary log off, not ROW-based, partial row images, or minimal metadata."""
    found = server_variables(conn, "log_bin", "binlog_format", "binlog_row_image",
                             "binlog_row_metadata", "version")
    wanted = (
        ("log_bin", "ON", "start the server with --log-bin"),
        ("binlog_format", "ROW", "set binlog_format=ROW (statement-based logs do not "
         "say which rows changed)"),
        ("binlog_row_image", "FULL", "set binlog_row_image=FULL (events must carry every "
         "column)"),
        ("binlog_row_metadata", "FULL", "set binlog_row_metadata=FULL (tidemark reads "
         "column names, keys and signedness from the binlog itself; MariaDB 10.5+)"),
    )
    problems = [f"{name} is {found.get(name, 'not available')!s}: {fix}"
                for name, value, fix in wanted if found.get(name, "").upper() != value]
    if problems:
        raise SourceError("MariaDB server " + found.get("version", "") + " cannot be "
                          "captured: " + "; ".join(problems))


def current_position(conn: pymysql.Connection[Any]) -> BinlogPosition:
    """The server's binlog end: the position a capture starting now would read from."""
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW MASTER STATUS")
            row = cur.fetchone()
            # The GTID state at exactly that file/position: @@gtid_binlog_pos, read in a
            # second statement, may already include a transaction committed in between,
            # which a dump resumed from it would then skip.
            gtid_row = None
            if row is not None:
                cur.execute("SELECT BINLOG_GTID_POS(%s, %s)", (row[0], row[1]))
                gtid_row = cur.fetchone()
    except pymysql.err.OperationalError as err:
        raise _privilege_error(err, "SHOW MASTER STATUS", "BINLOG MONITOR") from None
    if row is None:
        raise SourceError("SHOW MASTER STATUS returned nothing: the binary log is off "
                          "(start the server with --log-bin)")
    return BinlogPosition(str(row[0]), int(row[1]),
                          str(gtid_row[0]) if gtid_row and gtid_row[0] is not None else "")


def binlog_files(conn: pymysql.Connection[Any]) -> list[str]:
    """The binlog files the server still has (``SHOW BINARY LOGS``), oldest first."""
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW BINARY LOGS")
            return [str(row[0]) for row in cur.fetchall()]
    except pymysql.err.OperationalError as err:
        raise _privilege_error(err, "SHOW BINARY LOGS", "BINLOG MONITOR") from None


class MissingPrivilegeError(SourceError):
    """The server refused a statement or command for want of *privilege* (a global one:
    granted ``ON *.*``)."""

    def __init__(self, message: str, privilege: str) -> None:
        super().__init__(message)
        self.privilege = privilege


def _privilege_error(err: pymysql.err.MySQLError, what: str, privilege: str) -> Exception:
    code = err.args[0] if err.args else 0
    if code in (ER_SPECIFIC_ACCESS_DENIED, 1044, 1142):
        return MissingPrivilegeError(f"{what} was refused ({err.args[-1]}): grant the "
                                     f"capture user {privilege} (GRANT {privilege} ON *.* "
                                     "TO ...)", privilege)
    if code in CR_CONNECTION_ERRORS:
        return SourceUnavailableError(f"{what}: connection lost ({err.args[-1]})")
    return SourceError(f"{what} failed: {err.args[-1]}")


class BinlogStream:
    """One ``COM_BINLOG_DUMP``: the server's binlog events from *position* on.

    *blocking*: wait for new events at the end of the log (streaming); otherwise the
    server ends the stream there (:meth:`events` returns). Every event is yielded as
    its bytes, header first, checksum still attached.
    """

    def __init__(self, settings: ConnectionSettings, position: BinlogPosition, *,
                 server_id: int, blocking: bool = True, heartbeat_s: float = 5.0) -> None:
        self._settings = settings
        self._position = position
        self._server_id = server_id
        self._blocking = blocking
        self._heartbeat_s = heartbeat_s
        self._conn: pymysql.Connection[Any] | None = None
        #: The server's binlog_checksum (CHECKSUM_CRC32 or CHECKSUM_OFF), once open.
        self.checksum = CHECKSUM_OFF

    def open(self) -> None:
        """Connect and send the dump command."""
        # The read timeout ends a read that waits longer than three heartbeats: the
        # server sends one every heartbeat_s when idle, so silence means a dead link.
        conn = connect(self._settings, read_timeout=max(self._heartbeat_s * 3, 10.0))
        self._conn = conn
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT @@GLOBAL.binlog_checksum")
                row = cur.fetchone()
                self.checksum = CHECKSUM_CRC32 if row and str(row[0]).upper() == "CRC32" \
                    else CHECKSUM_OFF
                cur.execute("SET @master_binlog_checksum = @@GLOBAL.binlog_checksum")
                cur.execute("SET @mariadb_slave_capability = %s", (_MARIA_SLAVE_CAPABILITY_GTID,))
                cur.execute("SET @master_heartbeat_period = %s",
                            (int(self._heartbeat_s * 1_000_000_000),))
                if self._position.gtids:
                    cur.execute("SET @slave_connect_state = %s", (self._position.gtids,))
                    cur.execute("SET @slave_gtid_strict_mode = 0")
                    cur.execute("SET @slave_gtid_ignore_duplicates = 0")
        except pymysql.err.MySQLError as err:
            self.close()
            raise _privilege_error(err, "preparing the binlog dump", "REPLICATION SLAVE") \
                from None
        # With a GTID state the server finds the file itself and ignores these.
        file = b"" if self._position.gtids else self._position.file.encode()
        pos = 4 if self._position.gtids else self._position.pos
        flags = 0 if self._blocking else _DUMP_NON_BLOCK
        payload = struct.pack("<IHI", pos, flags, self._server_id) + file
        raw: Any = conn  # PyMySQL's packet layer: no public API for this command
        # A large read buffer: PyMySQL's default (8 KiB) makes a recv() per event or two,
        # and each one releases the GIL, which the reader thread then waits for up to a
        # switch interval to get back from the thread writing the events. Every earlier
        # reply was read whole, so the old buffer holds nothing.
        raw._rfile = raw._sock.makefile("rb", buffering=_READ_BUFFER_BYTES)
        raw._execute_command(COM_BINLOG_DUMP, payload)

    def events(self) -> Iterator[bytes]:
        """The events, as they arrive; ends at the log's end when not blocking.

        The packets are read here, as PyMySQL's ``_read_packet`` reads them (sequence
        numbers checked, packets of 16 MiB continued, error packets raised as its
        errors), without its packet object per event: a tenth of a capture's time.
        """
        conn: Any = self._conn  # PyMySQL's connection (see open())
        if conn is None:
            raise RuntimeError("BinlogStream.open() was not called")
        if conn._current_timeout != conn._read_timeout:
            conn._sock.settimeout(conn._read_timeout)
            conn._current_timeout = conn._read_timeout
        read = conn._rfile.read
        sequence = conn._next_seq_id
        try:
            while True:
                parts: list[bytes] = []
                while True:
                    header = read(4)
                    if len(header) < 4:
                        raise pymysql.err.OperationalError(_CR_SERVER_LOST, _LOST)
                    if header[3] != sequence:
                        if header[3] == 0:  # MariaDB's error packet at shutdown
                            raise pymysql.err.OperationalError(_CR_SERVER_LOST, _LOST)
                        raise pymysql.err.InternalError(
                            f"Packet sequence number wrong - got {header[3]} expected "
                            f"{sequence}")
                    sequence = (sequence + 1) & 0xFF
                    length = header[0] | header[1] << 8 | header[2] << 16
                    data = read(length)
                    if len(data) < length:
                        raise pymysql.err.OperationalError(_CR_SERVER_LOST, _LOST)
                    if length < _MAX_PACKET or parts:
                        if parts:
                            parts.append(data)
                            if length == _MAX_PACKET:
                                continue
                            data = b"".join(parts)
                        break
                    parts.append(data)
                first = data[0]
                if first == 0xFF:
                    pymysql.err.raise_mysql_exception(data)
                if first == 0xFE and len(data) < 9:
                    return
                yield data[1:]  # after the OK byte
        except OSError as err:
            raise self._dump_error(pymysql.err.OperationalError(
                _CR_SERVER_LOST, f"{_LOST} ({err})")) from None
        except (pymysql.err.OperationalError, pymysql.err.InternalError) as err:
            raise self._dump_error(err) from None
        finally:
            conn._next_seq_id = sequence

    def _dump_error(self, err: pymysql.err.MySQLError) -> Exception:
        code = err.args[0] if err.args else 0
        message = str(err.args[-1]) if err.args else str(err)
        if code == ER_MASTER_FATAL_READING_BINLOG:
            return SourceError(
                f"MariaDB cannot send the binlog from {self._position}: {message}. The "
                "binlog that capture needs was purged (or the GTID is unknown to this "
                "server): changes since then are lost to the stream. Recover with "
                "snapshot_mode=when_needed (re-snapshots and continues), or start over "
                "from a new snapshot.")
        if code == ER_SPECIFIC_ACCESS_DENIED:
            return _privilege_error(err, "the binlog dump", "REPLICATION SLAVE")
        return SourceUnavailableError(f"binlog stream from {self._settings.host}:"
                                      f"{self._settings.port} broke: {message}")

    def close(self) -> None:
        """Close the connection (the server ends the dump). Safe from another thread:
        a read blocked in :meth:`events` then ends (closing a socket alone does not wake
        a thread blocked reading it; shutting it down does)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            sock: Any = getattr(conn, "_sock", None)
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(Exception):
                conn.close()

    def __enter__(self) -> BinlogStream:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
