"""A MariaDB user without the privileges of a binlog reader is refused before the
snapshot, in one line naming what is missing and the GRANT that gives it, by every
runtime: ``tidemark capture`` (nothing on stdout), the engine, the Spark source and
``tidemark run``. Privileges given through a default role count."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from conftest import MariaDatabase
from mariadb_helpers import capture, values
from tidemark import Engine, MariaDbConnector, MemoryOffsetStore
from tidemark.engine.converters import EventConverter
from tidemark.errors import SourceError
from tidemark.pipeline import load_config
from tidemark.pipeline.runner import Pipeline
from tidemark.source.mariadb.config import MariaDbSourceConfig
from tidemark.testing.sink import MemorySink

pytestmark = pytest.mark.integration


@contextlib.contextmanager
def _user(mdb: MariaDatabase, name: str, *grants: str) -> Iterator[str]:
    """A user of *mdb* with SELECT on its database and *grants* (``{user}`` in them is
    the account); yields its DSN."""
    account = f"'{name}'@'%'"
    server = mdb.server
    with contextlib.closing(server.connect()) as conn, conn.cursor() as cur:
        cur.execute(f"DROP USER IF EXISTS {account}")
        cur.execute(f"CREATE USER {account} IDENTIFIED BY 'pw'")
        cur.execute(f"GRANT SELECT ON {mdb.name}.* TO {account}")
        for grant in grants:
            cur.execute(grant.format(user=account))
    try:
        yield f"mariadb://{name}:pw@{server.host}:{server.port}/{mdb.name}"
    finally:
        with contextlib.closing(server.connect()) as conn, conn.cursor() as cur:
            cur.execute(f"DROP USER IF EXISTS {account}")


@pytest.fixture
def nodump(mdb: MariaDatabase) -> Iterator[str]:
    """A user that can see where the binlog ends but not read it."""
    mdb.execute("CREATE TABLE t (id INT PRIMARY KEY)",
                "INSERT INTO t VALUES " + ",".join(f"({i})" for i in range(1, 101)))
    with _user(mdb, f"nodump_{mdb.name}", "GRANT BINLOG MONITOR ON *.* TO {user}") as dsn:
        yield dsn


def _named(message: str, name: str) -> None:
    assert "lacks REPLICATION SLAVE" in message
    assert f"GRANT REPLICATION SLAVE ON *.* TO '{name}'@'%'" in message
    assert "pw" not in message


def test_capture_without_replication_slave_writes_nothing_and_one_line(
        mdb: MariaDatabase, nodump: str) -> None:
    result = subprocess.run([sys.executable, "-m", "tidemark", "capture", "--dsn", nodump],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode != 0
    assert result.stdout == ""  # not the snapshot, then the refusal
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    _named(lines[0], f"nodump_{mdb.name}")


def test_engine_fails_at_start_before_the_snapshot(mdb: MariaDatabase, nodump: str) -> None:
    sink = MemorySink()
    engine = Engine(MariaDbConnector({"dsn": nodump}), sink,
                    config={"offset_flush_interval_ms": 0}, converter=EventConverter(),
                    offset_store=MemoryOffsetStore())
    with pytest.raises(SourceError) as caught:
        engine.run()
    _named(str(caught.value), f"nodump_{mdb.name}")
    assert sink.records == []


def test_tidemark_run_refuses_before_spark_starts(mdb: MariaDatabase, nodump: str,
                                                  tmp_path: Path) -> None:
    file = tmp_path / "pipeline.toml"
    file.write_text(f'[source]\ndsn = "{nodump}"\n[spark]\ncheckpoint = "chk"\n'
                    f'available_now = true\n[targets."{mdb.name}.t"]\npath = "lake/t"\n'
                    'keys = ["id"]\n')
    result = subprocess.run([sys.executable, "-m", "tidemark", "run", str(file)],
                            capture_output=True, text=True, timeout=120, check=False,
                            env={**os.environ, "PYSPARK_PYTHON": sys.executable})
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines()
              if line.strip() and not line.startswith("tidemark run:")]
    assert len(errors) == 1, result.stderr
    _named(errors[0], f"nodump_{mdb.name}")
    assert not (tmp_path / "chk" / "offsets").exists()  # Spark never started
    # The same check in-process, without a Spark session to start.
    with pytest.raises(SourceError, match="lacks REPLICATION SLAVE"):
        Pipeline(load_config(file)).run()


def test_spark_source_refuses_when_the_stream_starts(
        spark: SparkSession, mdb: MariaDatabase, nodump: str) -> None:
    import tidemark.spark as ts  # noqa: PLC0415

    with pytest.raises(Exception, match="lacks REPLICATION SLAVE") as caught:
        ts.read_changes(spark, dsn=nodump, tables=[f"{mdb.name}.t"]).schema  # noqa: B018
    assert f"GRANT REPLICATION SLAVE ON *.* TO 'nodump_{mdb.name}'@'%'" in str(caught.value)


def test_every_missing_privilege_is_named_in_one_grant(mdb: MariaDatabase) -> None:
    name = f"nothing_{mdb.name}"
    with _user(mdb, name) as dsn, pytest.raises(SourceError) as caught:
        capture(MariaDbSourceConfig.from_mapping({"dsn": dsn, "snapshot_mode": "no_data"}))
    assert f"GRANT BINLOG MONITOR, REPLICATION SLAVE ON *.* TO '{name}'@'%'" \
        in str(caught.value)


def test_privileges_of_a_default_role_are_enough(mdb: MariaDatabase) -> None:
    role = f"cdc_{mdb.name}"
    with contextlib.closing(mdb.server.connect()) as conn, conn.cursor() as cur:
        cur.execute(f"DROP ROLE IF EXISTS {role}")
        cur.execute(f"CREATE ROLE {role}")
        cur.execute(f"GRANT REPLICATION SLAVE, BINLOG MONITOR ON *.* TO {role}")
    mdb.execute("CREATE TABLE t (id INT PRIMARY KEY)", "INSERT INTO t VALUES (1)")
    try:
        with _user(mdb, f"roled_{mdb.name}", f"GRANT {role} TO {{user}}",
                   f"SET DEFAULT ROLE {role} FOR {{user}}") as dsn:
            records, _ = capture(MariaDbSourceConfig.from_mapping({"dsn": dsn}))
        assert [v["after"] for v in values(records)] == [{"id": 1}]
    finally:
        with contextlib.closing(mdb.server.connect()) as conn, conn.cursor() as cur:
            cur.execute(f"DROP ROLE IF EXISTS {role}")
