"""Shared fixtures: one private PostgreSQL (and, for the MariaDB tests, one private
MariaDB) per test session, a fresh database per test.

Nothing here skips: if a server cannot start, every test that needs it errors.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import settings

from conformance.matrix_report import (  # noqa: F401  (hooks: the matrix's report)
    pytest_runtest_logreport,
    pytest_terminal_summary,
)
from logtable_helpers import LogDb
from tidemark.testing.mariadb import MariaDbServer
from tidemark.testing.postgres import PostgresCluster, sql_connection

#: Lake tests run in both merge modes (see merge_modes.py).
pytest_plugins = ["merge_modes"]

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# No per-example time limit: the first example of a property test runs cold code paths
# (imports, caches), and CI machines are slow and noisy; a deadline there only makes the
# suite flaky. Correctness, not speed, is what the properties check.
settings.register_profile("tidemark", deadline=None)
settings.load_profile("tidemark")

_counter = itertools.count()


class Database:
    """A fresh database of the session cluster, with small SQL helpers."""

    def __init__(self, cluster: PostgresCluster, name: str) -> None:
        self.cluster = cluster
        self.name = name
        self.dsn = cluster.dsn(name)

    def execute(self, *statements: str, params: Any = None) -> None:
        """Run statements in one transaction."""
        with contextlib.closing(sql_connection(self.dsn)) as conn, conn.transaction(), \
                conn.cursor() as cur:
            for sql in statements:
                cur.execute(sql, params)

    def autocommit(self, *statements: str) -> None:
        """Run each statement in its own transaction."""
        with contextlib.closing(sql_connection(self.dsn, autocommit=True)) as conn, \
                conn.cursor() as cur:
            for sql in statements:
                cur.execute(sql)

    def query(self, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        with contextlib.closing(sql_connection(self.dsn)) as conn, conn.cursor() as cur:
            cur.execute(sql, params)
            return list(cur.fetchall())

    def scalar(self, sql: str, params: Any = None) -> Any:
        return self.query(sql, params)[0][0]

    def settled_scalar(self, sql: str, expected: Any, timeout_s: float = 15.0) -> Any:
        """``scalar(sql)`` once it equals *expected*, or its last value after *timeout_s*.

        For what the server finishes after the client has gone (a backend exiting, a
        slot released, a final status update applied): checked at once, it races."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = self.scalar(sql)
            if value == expected or time.monotonic() > deadline:
                return value
            time.sleep(0.05)

    def insert_lsn(self) -> int:
        """The current WAL insert position: everything committed so far is before it."""
        return int(self.scalar("SELECT (pg_current_wal_insert_lsn() - '0/0')::bigint"))


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PostgresCluster]:
    with PostgresCluster() as cluster:
        yield cluster


@pytest.fixture
def db(pg_cluster: PostgresCluster) -> Iterator[Database]:
    name = f"t{next(_counter)}"
    pg_cluster.create_database(name)
    try:
        yield Database(pg_cluster, name)
    finally:
        pg_cluster.drop_database(name)


class MariaDatabase:
    """A fresh database of the session's MariaDB server, with small SQL helpers."""

    def __init__(self, server: MariaDbServer, name: str) -> None:
        self.server = server
        self.name = name
        self.dsn = server.dsn(name)

    def execute(self, *statements: str, params: Any = None) -> None:
        """Run *statements* in one transaction."""
        conn = self.server.connect(self.name)
        with contextlib.closing(conn), conn.cursor() as cur:
            cur.execute("BEGIN")
            for statement in statements:
                cur.execute(statement, params)
            cur.execute("COMMIT")

    def query(self, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        conn = self.server.connect(self.name)
        with contextlib.closing(conn), conn.cursor() as cur:
            cur.execute(sql, params)
            return list(cur.fetchall())


@pytest.fixture(scope="session")
def mariadb_server() -> Iterator[MariaDbServer]:
    with MariaDbServer() as server:
        yield server


@pytest.fixture
def mdb(mariadb_server: MariaDbServer) -> Iterator[MariaDatabase]:
    name = f"m{next(_counter)}"
    with mariadb_server.database(name):
        yield MariaDatabase(mariadb_server, name)


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """One local SparkSession for every Spark test (starting one takes ~10 s), with the
    tidemark source registered. pyspark is imported here so that tests without Spark do
    not pay for it."""
    from pyspark.sql import SparkSession  # noqa: PLC0415

    import tidemark.spark  # noqa: PLC0415

    os.environ["PYSPARK_PYTHON"] = sys.executable
    session = (SparkSession.builder.master("local[2]").appName("tidemark-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    tidemark.spark.register(session)
    yield session
    session.stop()


@pytest.fixture(params=["postgres", "sqlite"])
def logdb(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LogDb]:
    """A database with CDC log tables: a fresh PostgreSQL database, or a SQLite file."""
    if request.param == "sqlite":
        path = tmp_path / "app.db"
        path.touch()
        yield LogDb("sqlite", f"sqlite:///{path}", path)
    else:
        yield LogDb("postgres", request.getfixturevalue("db").dsn)


@pytest.fixture
def kill_on_exit() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes a test started: killed at its end if still running."""
    processes: list[subprocess.Popen[bytes]] = []
    yield processes
    for process in processes:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=30)
