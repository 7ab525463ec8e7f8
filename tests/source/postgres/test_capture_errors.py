"""Errors on a real PostgreSQL: each names what is wrong and says what would be right.

Also: passwords never reach error messages, the CLI's stderr or the logs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import time

import pytest

from capture_helpers import drain, events, make_connector
from conftest import Database
from tidemark.errors import (
    ConfigError,
    SourceError,
    SourceUnavailableError,
    TerminalError,
    TransientError,
)
from tidemark.source.postgres.config import PostgresSourceConfig
from tidemark.source.postgres.reader import PostgresReader
from tidemark.testing.local_server import free_port
from tidemark.testing.postgres import PostgresCluster

# Run on every PostgreSQL version CI tests (scripts/test.sh).
pytestmark = pytest.mark.every_pg_version

_SECRET = "Sekr3t-pw-7f3a9c"


def _start_error(connector: PostgresReader) -> BaseException:
    """The exception ``connector.start()`` raises (it must raise); the connector is stopped."""
    try:
        with pytest.raises(Exception) as info:
            connector.start()
    finally:
        connector.stop()
    return info.value


def _run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tidemark", *args],
        capture_output=True, text=True, timeout=60, env=dict(os.environ), check=False,
    )


# -- server and role prerequisites ------------------------------------------------------
def test_wal_level_not_logical() -> None:
    with PostgresCluster(settings={"wal_level": "replica"}) as cluster:
        with contextlib.closing(cluster.connect()) as conn, conn.cursor() as cur:
            cur.execute("CREATE TABLE t (id int PRIMARY KEY)")
        err = _start_error(make_connector(cluster.dsn(), "public.t"))
    assert isinstance(err, SourceError)
    message = str(err)
    assert "wal_level" in message
    assert "'replica'" in message  # what it is
    assert "wal_level = logical" in message  # what it must be
    assert "restart" in message.lower()  # and how to get there


def test_role_without_replication_privilege(db: Database) -> None:
    role = f"{db.name}_noreplication"
    db.execute("CREATE TABLE t (id int PRIMARY KEY)",
               f"CREATE ROLE {role} LOGIN PASSWORD '{_SECRET}'",
               f"GRANT CONNECT ON DATABASE {db.name} TO {role}",
               f"GRANT USAGE ON SCHEMA public TO {role}",
               f"GRANT SELECT ON public.t TO {role}")
    try:
        dsn = db.cluster.dsn(db.name, user=role, password=_SECRET)
        err = _start_error(make_connector(dsn, "public.t"))
    finally:
        db.execute(f"DROP OWNED BY {role}")
        db.execute(f"DROP ROLE {role}")
    assert isinstance(err, SourceError)
    message = str(err)
    assert repr(role) in message
    assert "REPLICATION" in message
    assert f'ALTER ROLE "{role}" WITH REPLICATION' in message
    assert _SECRET not in message


# -- tables -----------------------------------------------------------------------------
def test_table_not_found_is_named(db: Database) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    err = _start_error(make_connector(db.dsn, "public.t", "public.nope"))
    assert isinstance(err, SourceError)
    message = str(err)
    assert "public.nope" in message
    assert repr(db.name) in message
    assert "include list" in message
    assert "public.t " not in message  # only the missing table is blamed


def test_include_pattern_matching_nothing_is_named(db: Database) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    err = _start_error(make_connector(db.dsn, "public.nope_.*"))
    assert isinstance(err, SourceError)
    assert "'public.nope_.*'" in str(err)
    assert "pattern" in str(err)


def test_include_pattern_with_backslash_is_named_as_written(db: Database) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    pattern = r"public\.nope_.*"
    err = _start_error(make_connector(db.dsn, pattern))
    assert isinstance(err, SourceError)
    assert pattern in str(err)


# -- the replication slot ---------------------------------------------------------------
def test_slot_active_in_another_process(db: Database) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    holder = make_connector(db.dsn, "public.t", slot_name="held_slot",
                            snapshot_mode="no_data")
    holder.start()
    try:
        deadline = time.monotonic() + 10
        while not db.scalar("SELECT count(*) FROM pg_replication_slots "
                            "WHERE slot_name = 'held_slot' AND active_pid IS NOT NULL"):
            assert time.monotonic() < deadline, "the first connector never held the slot"
            holder.poll()
        pid = db.scalar("SELECT active_pid FROM pg_replication_slots "
                        "WHERE slot_name = 'held_slot'")
        # Default retries: a slot another reader keeps is refused once it did not go
        # away within moments, not retried for half a minute.
        second = make_connector(db.dsn, "public.t", slot_name="held_slot",
                                snapshot_mode="no_data")
        began = time.monotonic()
        err = _start_error(second)
        took = time.monotonic() - began
    finally:
        holder.stop()
    assert isinstance(err, TerminalError)
    message = str(err)
    assert "\n" not in message
    assert "'held_slot'" in message
    assert f"PID {pid}" in message
    assert "slot_name" in message  # the way out: stop the other capture or another slot
    assert took < 15, took


# -- connecting -------------------------------------------------------------------------
def test_unreachable_database_names_host_and_port() -> None:
    port = free_port()
    dsn = (f"host=127.0.0.1 port={port} dbname=app user=cdc password={_SECRET} "
           "connect_timeout=3")
    err = _start_error(make_connector(dsn, "public.t"))
    assert isinstance(err, SourceUnavailableError)
    assert isinstance(err, TransientError)
    message = str(err)
    assert "127.0.0.1" in message
    assert str(port) in message
    assert _SECRET not in message


def test_wrong_password_is_an_authentication_error_without_the_password(
    db: Database,
) -> None:
    dsn = db.cluster.dsn(db.name, password=_SECRET)
    err = _start_error(make_connector(dsn, "public.t"))
    assert isinstance(err, SourceError)
    assert isinstance(err, TerminalError)
    message = str(err)
    assert "authentication" in message
    assert "'postgres'" in message  # the user it tried
    assert _SECRET not in message
    assert db.cluster.password not in message


# -- configuration ----------------------------------------------------------------------
@pytest.mark.parametrize("dsn", ["host=x =y", "not a dsn"])
def test_bad_dsn_is_a_config_error(dsn: str) -> None:
    with pytest.raises(ConfigError) as info:
        PostgresSourceConfig.from_mapping({"dsn": dsn})
    assert info.value.key == "dsn"
    message = str(info.value)
    assert message.startswith("dsn: ")
    assert "not a valid libpq connection string" in message
    assert "host=" in message and "postgresql://" in message  # examples of what is right


def test_bad_dsn_with_password_does_not_echo_it() -> None:
    with pytest.raises(ConfigError) as info:
        PostgresSourceConfig.from_mapping({"dsn": f"host=x password={_SECRET} bogus"})
    assert info.value.key == "dsn"
    assert _SECRET not in str(info.value)


def test_malformed_uri_dsn_does_not_echo_password() -> None:
    for dsn in (f"postgresql://cdc:{_SECRET}@[::1/app",
                f"postgresql://cdc:{_SECRET}%zz@db/app"):
        with pytest.raises(ConfigError) as info:
            PostgresSourceConfig.from_mapping({"dsn": dsn})
        assert info.value.key == "dsn"
        assert _SECRET not in str(info.value)


def test_unknown_config_key_lists_allowed_keys() -> None:
    with pytest.raises(ConfigError) as info:
        PostgresSourceConfig.from_mapping({"dsn": "host=x", "slot": "s"}, section="source")
    assert info.value.key == "source.slot"
    message = str(info.value)
    assert "unknown setting" in message
    for allowed in ("dsn", "slot_name", "snapshot_mode", "table_include_list"):
        assert allowed in message


def test_invalid_snapshot_mode_lists_allowed_values() -> None:
    with pytest.raises(ConfigError) as info:
        PostgresSourceConfig.from_mapping({"dsn": "host=x", "snapshot_mode": "always"})
    assert info.value.key == "snapshot_mode"
    message = str(info.value)
    assert "'always'" in message
    for allowed in ("initial", "no_data", "initial_only", "when_needed"):
        assert allowed in message


def test_invalid_slot_name() -> None:
    with pytest.raises(ConfigError) as info:
        PostgresSourceConfig.from_mapping({"dsn": "host=x", "slot_name": "My-Slot"})
    assert info.value.key == "slot_name"
    message = str(info.value)
    assert "'My-Slot'" in message
    assert "lower-case letters, digits and underscores" in message


# -- the CLI ----------------------------------------------------------------------------
def test_cli_missing_table_is_one_error_line(db: Database) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    proc = _run_cli("capture", "--dsn", db.dsn, "--table", "public.nope", "--stop-at-end")
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ")
    assert "public.nope" in lines[0]
    assert proc.stdout == ""
    assert db.cluster.password not in proc.stderr


def test_cli_wrong_password_is_not_printed(db: Database) -> None:
    dsn = db.cluster.dsn(db.name, password=_SECRET)
    proc = _run_cli("capture", "--dsn", dsn, "--table", "public.t", "--stop-at-end")
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith("error: ")
    assert "authentication" in proc.stderr
    assert _SECRET not in proc.stderr
    assert _SECRET not in proc.stdout


# -- passwords in logs ------------------------------------------------------------------
def test_password_never_logged(db: Database, caplog: pytest.LogCaptureFixture) -> None:
    password = db.cluster.password
    assert f"password={password}" in db.dsn
    db.execute("CREATE TABLE t (id int PRIMARY KEY)", "CREATE TABLE keyless (v int)",
               "ALTER TABLE keyless REPLICA IDENTITY FULL", "INSERT INTO t VALUES (1)")
    caplog.set_level(logging.DEBUG)
    conn = make_connector(db.dsn, "public.t", "public.keyless")
    conn.start()
    try:
        drain(conn, db.insert_lsn())
        db.autocommit("INSERT INTO t VALUES (2)", "INSERT INTO keyless VALUES (3)")
        assert len(events(drain(conn, db.insert_lsn()))) == 2
    finally:
        conn.stop()
    assert caplog.records  # something was logged, so the check below means something
    assert password not in caplog.text
    assert password not in repr(conn.config)
    config = PostgresSourceConfig(dsn=f"postgresql://cdc:{_SECRET}@db:5432/app")
    assert _SECRET not in repr(config)
    assert _SECRET not in str(config)
    assert "cdc" in repr(config) and "app" in repr(config)  # the rest is still shown



def test_every_secret_dsn_parameter_is_redacted() -> None:
    config = PostgresSourceConfig(dsn="host=db user=u password=pw1 sslpassword=pw2")
    for text in (repr(config), config.redacted_dsn(), str(config.__rich_repr__())):
        assert "pw1" not in text and "pw2" not in text


def test_failed_start_leaves_no_connection_open(db: Database) -> None:
    conn = make_connector(db.dsn, "public.nope")
    with pytest.raises(SourceError):
        conn.start()
    open_sessions = db.settled_scalar("SELECT count(*) FROM pg_stat_activity WHERE "
                                      "application_name LIKE 'tidemark%%' "
                                      "AND datname = current_database()", 0)
    assert open_sessions == 0


def test_stop_during_snapshot_ends_the_snapshot_transaction(db: Database) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY)",
               "INSERT INTO t SELECT generate_series(1, 50000)")
    conn = make_connector(db.dsn, "public.t", snapshot_fetch_size=1000)
    conn.start()
    conn.poll()  # part of the snapshot
    conn.stop()
    left = db.settled_scalar("SELECT count(*) FROM pg_stat_activity WHERE "
                             "application_name LIKE 'tidemark%%' "
                             "AND datname = current_database()", 0)
    assert left == 0
