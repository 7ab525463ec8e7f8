"""A private, throw-away MariaDB server for tests, the demo and benchmarks.

Like :mod:`tidemark.testing.postgres`: when the current user is root the server runs as
an unprivileged OS user (``tidemark-db``, created if missing; ``mariadbd --user`` drops
to it); it listens on 127.0.0.1 on
a free port, keeps its data directory in a temporary directory removed by
:meth:`MariaDbServer.stop`, and is configured as tidemark needs a source to be: binary
log on, ``binlog_format=ROW``, ``binlog_row_image=FULL``, ``binlog_row_metadata=FULL``
(MariaDB always writes GTIDs). A user ``tidemark`` with a random password holds every
privilege.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import pymysql

from tidemark.errors import TidemarkError
from tidemark.testing.local_server import ensure_os_user, free_port

log = logging.getLogger(__name__)

DEFAULT_OS_USER = "tidemark-db"
_START_TIMEOUT_S = 60.0

DEFAULT_SETTINGS: Mapping[str, str] = {
    "server-id": "1",
    "log-bin": "binlog",
    "binlog-format": "ROW",
    "binlog-row-image": "FULL",
    "binlog-row-metadata": "FULL",
    # Durability of a throw-away server is irrelevant; speed is not.
    "innodb-flush-log-at-trx-commit": "0",
    "sync-binlog": "0",
    "innodb-buffer-pool-size": "256M",
    "innodb-log-file-size": "256M",
    "max-connections": "200",
    "character-set-server": "utf8mb4",
    "collation-server": "utf8mb4_general_ci",
    "default-time-zone": "+00:00",
}

#: MariaDB's own defaults for what :data:`DEFAULT_SETTINGS` changes for speed: the redo
#: log flushed at every commit (the binlog left to the OS, as MariaDB does by default).
#: Benchmarks use these (``MariaDbServer(durable=True)``).
DURABLE_SETTINGS: Mapping[str, str] = {
    "innodb-flush-log-at-trx-commit": "1",
    "sync-binlog": "0",
}


class MariaDbNotInstalledError(TidemarkError):
    """No MariaDB server binaries (mariadbd, mariadb-install-db) could be found."""


class MariaDbStartError(TidemarkError):
    """The private server could not be initialised or started."""


def find_binaries() -> tuple[Path, Path]:
    """``mariadbd`` and ``mariadb-install-db``: from ``$TIDEMARK_MARIADB_BINDIR``, the
    PATH, or Debian's locations."""
    dirs = [os.environ.get("TIDEMARK_MARIADB_BINDIR", ""), "/usr/sbin", "/usr/bin",
            "/usr/local/mysql/bin"]
    server = next((Path(d) / "mariadbd" for d in dirs if d and (Path(d) / "mariadbd").is_file()),
                  None) or (Path(p) if (p := shutil.which("mariadbd")) else None)
    install = shutil.which("mariadb-install-db") or next(
        (str(Path(d) / "mariadb-install-db") for d in dirs
         if d and (Path(d) / "mariadb-install-db").is_file()), None)
    if server is None or install is None:
        raise MariaDbNotInstalledError(
            "MariaDB server binaries (mariadbd, mariadb-install-db) were not found. Install "
            "them (Debian: `apt-get install mariadb-server`) or set TIDEMARK_MARIADB_BINDIR "
            "to their directory.")
    return server, Path(install)


class MariaDbServer:
    """A private MariaDB server in a temporary directory.

    Use as a context manager, or call :meth:`start` and :meth:`stop`.
    :meth:`connect` opens an autocommit connection as ``tidemark``.
    """

    def __init__(self, *, settings: Mapping[str, str] | None = None,
                 os_user: str = DEFAULT_OS_USER, base_dir: str | None = None,
                 durable: bool = False) -> None:
        self.server_bin, self.install_bin = find_binaries()
        self.settings = {**DEFAULT_SETTINGS, **(DURABLE_SETTINGS if durable else {}),
                         **(settings or {})}
        self.user = "tidemark"
        self.password = secrets.token_urlsafe(12)
        self.host = "127.0.0.1"
        self.port = 0
        self._os_user = os_user
        self._base_dir = base_dir
        self._tmp: Path | None = None
        self._ids: tuple[int, int] | None = None
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def durability(self) -> str:
        """The durability settings the server runs with, for benchmarks to print."""
        return ", ".join(f"{key}={self.settings[key]}" for key in DURABLE_SETTINGS)

    @property
    def directory(self) -> Path:
        if self._tmp is None:
            raise MariaDbStartError("the server has not been started")
        return self._tmp

    @property
    def datadir(self) -> Path:
        return self.directory / "data"

    @property
    def socket_path(self) -> Path:
        return self.directory / "mariadb.sock"

    # -- lifecycle ---------------------------------------------------------------
    def start(self) -> MariaDbServer:
        """Initialise the data directory and start the server; returns self once the
        ``tidemark`` user can connect."""
        if os.geteuid() == 0:
            user = ensure_os_user(self._os_user)
            self._ids = (user.pw_uid, user.pw_gid)
        self._tmp = Path(tempfile.mkdtemp(prefix="tidemark-mariadb-", dir=self._base_dir))
        if self._ids is not None:
            os.chown(self._tmp, *self._ids)
        init = subprocess.run(
            [str(self.install_bin), "--no-defaults", f"--datadir={self.datadir}",
             "--auth-root-authentication-method=normal", "--skip-test-db",
             *([f"--user={self._os_user}"] if self._ids else [])],
            capture_output=True, text=True, check=False, cwd=str(self._tmp))
        if init.returncode != 0:
            self.stop()
            raise MariaDbStartError(f"mariadb-install-db failed ({init.returncode}): "
                                    f"{(init.stderr or init.stdout).strip()[-2000:]}")
        last_error = ""
        for _attempt in range(5):
            self.port = free_port()
            try:
                self._launch()
                self._create_user()
                log.info("private MariaDB started on %s:%d", self.host, self.port)
                return self
            except MariaDbStartError as err:
                last_error = str(err)
                self._terminate()
        self.stop()
        raise MariaDbStartError(f"could not start MariaDB: {last_error}")

    def _launch(self) -> None:
        argv = [str(self.server_bin), "--no-defaults", f"--datadir={self.datadir}",
                f"--socket={self.socket_path}", f"--port={self.port}",
                f"--bind-address={self.host}", f"--pid-file={self.directory / 'mariadb.pid'}",
                f"--log-error={self.directory / 'server.log'}", "--skip-name-resolve",
                *(f"--{key}={value}" for key, value in self.settings.items())]
        if self._ids is not None:  # mariadbd started as root drops to this user itself
            argv.append(f"--user={self._os_user}")
        self._process = subprocess.Popen(argv, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL, cwd=str(self.directory))
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise MariaDbStartError(f"mariadbd exited with {self._process.returncode}: "
                                        f"{self.server_log()[-2000:]}")
            with contextlib.suppress(pymysql.err.OperationalError):
                pymysql.connect(unix_socket=str(self.socket_path), user="root").close()
                return
            time.sleep(0.1)
        raise MariaDbStartError(f"mariadbd did not accept connections within "
                                f"{_START_TIMEOUT_S:.0f} s: {self.server_log()[-2000:]}")

    def _create_user(self) -> None:
        # root has no password and is reachable only through the socket in the private
        # directory; everything else uses the tidemark user over TCP, as users would.
        conn = pymysql.connect(unix_socket=str(self.socket_path), user="root", autocommit=True)
        with contextlib.closing(conn), conn.cursor() as cur:
            cur.execute("CREATE USER IF NOT EXISTS 'tidemark'@'%%' IDENTIFIED BY %s",
                        (self.password,))
            cur.execute("GRANT ALL PRIVILEGES ON *.* TO 'tidemark'@'%' WITH GRANT OPTION")

    def restart(self) -> None:
        """Stop the server cleanly and start it again on the same port and data."""
        self._terminate()
        self._launch()

    def kill(self) -> None:
        """SIGKILL the server (a crash); :meth:`restart` brings it back."""
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait(timeout=30)

    def _terminate(self) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)

    def stop(self) -> None:
        """Stop the server and delete its directory."""
        self._terminate()
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def __enter__(self) -> MariaDbServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def server_log(self) -> str:
        """The server's error log so far (for diagnosing failures)."""
        path = self.directory / "server.log"
        return path.read_text(errors="replace") if path.exists() else ""

    # -- connections -------------------------------------------------------------
    def dsn(self, database: str = "") -> str:
        """A ``mariadb://`` URL for *database* as the ``tidemark`` user."""
        return f"mariadb://{self.user}:{self.password}@{self.host}:{self.port}/{database}"

    def connect(self, database: str | None = None, **kwargs: Any) -> pymysql.Connection[Any]:
        """An autocommit connection as ``tidemark`` (to *database*, if given)."""
        return pymysql.connect(host=self.host, port=self.port, user=self.user,
                               password=self.password, database=database, autocommit=True,
                               charset="utf8mb4", **kwargs)

    @contextlib.contextmanager
    def database(self, name: str) -> Iterator[str]:
        """A fresh database for the duration of a ``with`` block; yields its name."""
        conn = self.connect()
        with contextlib.closing(conn), conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE `{name}`")
        try:
            yield name
        finally:
            conn = self.connect()
            with contextlib.closing(conn), conn.cursor() as cur:
                cur.execute(f"DROP DATABASE IF EXISTS `{name}`")
