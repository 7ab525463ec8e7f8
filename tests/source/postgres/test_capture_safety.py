"""Capture must not harm the application's database, and says clearly what it refuses.

Each test starts tidemark the way a user would (the CLI, or the connector the engine
shares) against a real PostgreSQL and then checks the database: the application's own
statements still work, and nothing was left behind (publication entries, slots).
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
from collections.abc import Iterator

import psycopg
import pytest

from capture_helpers import drain, events, make_connector
from conftest import Database
from tidemark.errors import SourceError
from tidemark.event import Op, TableId

# Run on every PostgreSQL version CI tests (scripts/test.sh).
pytestmark = pytest.mark.every_pg_version

_PASSWORD = "cdc-role-pw-41d2"


def _run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tidemark", *args],
        capture_output=True, text=True, timeout=60, env=dict(os.environ), check=False,
    )


def _published(db: Database, publication: str) -> set[str]:
    return {f"{s}.{t}" for s, t in db.query(
        "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s",
        (publication,))}


def _slots(db: Database) -> int:
    """Replication slots of this test's database (settled: a walsender may be exiting)."""
    return int(db.settled_scalar("SELECT count(*) FROM pg_replication_slots "
                                 "WHERE database = current_database()", 0))


def _one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, proc.stderr
    return errors[0]


@contextlib.contextmanager
def _replication_role(db: Database, suffix: str, *grants: str) -> Iterator[tuple[str, str]]:
    """A LOGIN REPLICATION role that may connect to the test database (unique within the
    session's cluster), with *grants* (``{role}`` is replaced); yields (role, dsn)."""
    role = f"{db.name}_{suffix}"
    db.execute(f"CREATE ROLE {role} LOGIN REPLICATION PASSWORD '{_PASSWORD}'",
               f"GRANT CONNECT ON DATABASE {db.name} TO {role}",
               *(g.format(role=role) for g in grants))
    try:
        yield role, db.cluster.dsn(db.name, user=role, password=_PASSWORD)
    finally:
        db.execute(f"DROP OWNED BY {role}")
        db.execute(f"DROP ROLE {role}")


# -- 6. tables PostgreSQL cannot publish UPDATEs and DELETEs of ---------------------------
@pytest.mark.parametrize("identity", ["DEFAULT", "NOTHING"])
def test_keyless_table_named_explicitly_is_refused(db: Database, identity: str) -> None:
    db.execute("CREATE TABLE keyless (a int, b text)",
               f"ALTER TABLE keyless REPLICA IDENTITY {identity}",
               "INSERT INTO keyless VALUES (1, 'x')")
    proc = _run_cli("capture", "--dsn", db.dsn, "--table", "public.keyless",
                    "--publication", "safety_pub", "--stop-at-end")
    line = _one_error_line(proc)
    assert "public.keyless" in line
    assert f"REPLICA IDENTITY {identity}" in line  # what is wrong
    assert "add a primary key" in line  # and the three ways out
    assert "ALTER TABLE public.keyless REPLICA IDENTITY FULL" in line
    assert "REPLICA IDENTITY USING INDEX" in line
    assert proc.stdout == ""
    # The application is unharmed: its UPDATE and DELETE still work, nothing published.
    db.autocommit("UPDATE keyless SET b = 'y' WHERE a = 1", "DELETE FROM keyless WHERE a = 1")
    assert _published(db, "safety_pub") == set()
    assert _slots(db) == 0


def test_keyless_table_matched_by_a_pattern_is_skipped_with_a_warning(db: Database) -> None:
    db.execute("CREATE TABLE keyed (id int PRIMARY KEY, b text)",
               "CREATE TABLE keyless (a int, b text)",
               "INSERT INTO keyed VALUES (1, 'x')", "INSERT INTO keyless VALUES (1, 'x')")
    proc = _run_cli("capture", "--dsn", db.dsn, "--table", "public.key.*",
                    "--publication", "safety_pub", "--slot", "safety", "--stop-at-end")
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stderr.splitlines()
                if "WARNING" in line and "public.keyless" in line]
    assert len(warnings) == 1, proc.stderr  # shown at the default log level
    assert "skipped" in warnings[0]
    assert "ALTER TABLE public.keyless REPLICA IDENTITY FULL" in warnings[0]
    assert '"table":"keyed"' in proc.stdout and "keyless" not in proc.stdout
    db.autocommit("UPDATE keyless SET b = 'y' WHERE a = 1", "DELETE FROM keyless WHERE a = 1")
    assert _published(db, "safety_pub") == {"public.keyed"}


def test_pattern_matching_only_keyless_tables_is_an_error(db: Database) -> None:
    db.execute("CREATE TABLE keyless (a int)")
    proc = _run_cli("capture", "--dsn", db.dsn, "--table", "public.key.*",
                    "--publication", "safety_pub", "--stop-at-end")
    line = _one_error_line(proc)
    assert "no tables to capture" in line
    assert "public.keyless" in proc.stderr  # the warning says why it was left out
    assert _published(db, "safety_pub") == set()


def test_capturing_every_table_skips_keyless_ones_with_a_warning(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    db.execute("CREATE TABLE keyed (id int PRIMARY KEY)", "CREATE TABLE keyless (a int)")
    caplog.set_level(logging.WARNING)
    conn = make_connector(db.dsn, publication_name="safety_pub", snapshot_mode="no_data")
    conn.start()
    conn.stop()
    assert conn.tables == [TableId("public", "keyed")]
    assert _published(db, "safety_pub") == {"public.keyed"}
    assert "skipped public.keyless" in caplog.text


def test_partition_without_replica_identity_refuses_its_partitioned_table(
    db: Database,
) -> None:
    # Publishing a partitioned table publishes its partitions: an UPDATE of a partition
    # without replica identity fails even though the parent has one.
    db.execute("CREATE TABLE m (id int, v text) PARTITION BY RANGE (id)",
               "ALTER TABLE m REPLICA IDENTITY FULL",
               "CREATE TABLE m1 PARTITION OF m FOR VALUES FROM (0) TO (100)",
               "INSERT INTO m VALUES (1, 'x')")
    conn = make_connector(db.dsn, "public.m", publication_name="safety_pub")
    with pytest.raises(SourceError) as info:
        conn.start()
    conn.stop()
    assert "public.m1" in str(info.value)
    assert "ALTER TABLE public.m1 REPLICA IDENTITY FULL" in str(info.value)
    db.autocommit("UPDATE m SET v = 'y' WHERE id = 1")
    assert _published(db, "safety_pub") == set()


def test_keyless_table_with_full_identity_is_captured_with_a_warning(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    db.execute("CREATE TABLE keyless (a int, b text)", "ALTER TABLE keyless REPLICA IDENTITY FULL",
               "INSERT INTO keyless VALUES (1, 'x')")
    caplog.set_level(logging.WARNING)
    conn = make_connector(db.dsn, "public.keyless")
    conn.start()
    try:
        snap = events(drain(conn, db.insert_lsn()))
        db.autocommit("UPDATE keyless SET b = 'y'")
        got = events(drain(conn, db.insert_lsn()))
    finally:
        conn.stop()
    assert [(e.op, e.after) for e in snap] == [(Op.READ, {"a": 1, "b": "x"})]
    assert [(e.op, e.before, e.after) for e in got] == [
        (Op.UPDATE, {"a": 1, "b": "x"}, {"a": 1, "b": "y"})]
    warnings = [r.getMessage() for r in caplog.records
                if r.levelno == logging.WARNING and "public.keyless" in r.getMessage()]
    assert len(warnings) == 1, caplog.text
    assert "no primary key" in warnings[0]


def test_for_all_tables_publication_is_left_alone(db: Database) -> None:
    db.execute("CREATE TABLE keyed (id int PRIMARY KEY)", "CREATE TABLE keyless (a int)",
               "INSERT INTO keyed VALUES (1)", "CREATE PUBLICATION everything FOR ALL TABLES")
    before = db.query("SELECT * FROM pg_publication WHERE pubname = 'everything'")
    refused = _run_cli("capture", "--dsn", db.dsn, "--table", "public.keyless",
                       "--publication", "everything", "--stop-at-end")
    assert "public.keyless" in _one_error_line(refused)
    assert _slots(db) == 0
    captured = _run_cli("capture", "--dsn", db.dsn, "--table", "public.keyed",
                        "--publication", "everything", "--slot", "everything",
                        "--stop-at-end")
    assert captured.returncode == 0, captured.stderr
    assert '"id":1' in captured.stdout
    assert "WARNING" not in captured.stderr  # nothing was added to the publication
    assert db.query("SELECT * FROM pg_publication WHERE pubname = 'everything'") == before


def test_application_update_error_is_what_the_refusal_prevents(db: Database) -> None:
    """The harm the checks above prevent, shown on the server: a published table without
    replica identity refuses its UPDATEs (so the tests' UPDATEs mean something)."""
    db.execute("CREATE TABLE keyless (a int)", "INSERT INTO keyless VALUES (1)",
               "CREATE PUBLICATION harm FOR TABLE keyless")
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState):
        db.autocommit("UPDATE keyless SET a = 2")


# -- 7. publications that lack a captured table ------------------------------------------
def test_publication_missing_a_table_is_completed_with_a_warning(db: Database) -> None:
    db.execute("CREATE TABLE a (id int PRIMARY KEY)", "CREATE TABLE b (id int PRIMARY KEY)",
               "CREATE PUBLICATION shared_pub FOR TABLE a")
    proc = _run_cli("capture", "--dsn", db.dsn, "--table", "public.a", "--table", "public.b",
                    "--publication", "shared_pub", "--slot", "shared", "--stop-at-end")
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stderr.splitlines()
                if "WARNING" in line and "shared_pub" in line]
    assert len(warnings) == 1, proc.stderr  # shown at the default log level
    assert "public.b" in warnings[0] and "public.a" not in warnings[0]
    assert _published(db, "shared_pub") == {"public.a", "public.b"}


def test_publication_owned_by_another_role_is_a_clear_error(db: Database) -> None:
    db.execute("CREATE TABLE a (id int PRIMARY KEY)", "CREATE TABLE b (id int PRIMARY KEY)",
               "CREATE PUBLICATION shared_pub FOR TABLE a")
    with _replication_role(db, "notowner", "GRANT USAGE ON SCHEMA public TO {role}",
                           "GRANT SELECT ON a, b TO {role}") as (role, dsn):
        proc = _run_cli("capture", "--dsn", dsn, "--table", "public.a", "--table", "public.b",
                        "--publication", "shared_pub", "--slot", "shared", "--stop-at-end")
        line = _one_error_line(proc)
        assert _slots(db) == 0
    assert "'shared_pub'" in line  # the publication
    assert "public.b" in line and "public.a," not in line  # only the missing table
    assert "'postgres'" in line  # its owner, who can fix it
    assert "ALTER PUBLICATION shared_pub ADD TABLE public.b" in line
    assert "--publication" in line
    assert role in line
    assert _published(db, "shared_pub") == {"public.a"}


# -- 12. privileges, and no slot left behind ---------------------------------------------
@pytest.mark.parametrize("publication_exists", [True, False])
def test_role_without_select_is_a_clear_error_and_leaves_no_slot(
    db: Database, publication_exists: bool,
) -> None:
    db.execute("CREATE TABLE a (id int PRIMARY KEY)", "CREATE TABLE b (id int PRIMARY KEY)",
               "INSERT INTO a VALUES (1)", "INSERT INTO b VALUES (1)")
    if publication_exists:  # made by the DBA: nothing else stops capture before the slot
        db.execute("CREATE PUBLICATION granted_pub FOR TABLE a, b")
    with _replication_role(db, "noselect", "GRANT USAGE ON SCHEMA public TO {role}",
                           "GRANT SELECT ON a TO {role}") as (role, dsn):
        proc = _run_cli("capture", "--dsn", dsn, "--table", "public.a", "--table", "public.b",
                        "--publication", "granted_pub", "--slot", "noselect", "--stop-at-end")
        line = _one_error_line(proc)
        assert _slots(db) == 0
    assert "public.b" in line and "public.a" not in line
    assert "SELECT" in line
    assert f"GRANT SELECT ON public.b TO {role}" in line
    assert _PASSWORD not in proc.stderr
    assert proc.stdout == ""


def test_role_without_schema_usage_is_a_clear_error(db: Database) -> None:
    db.execute("CREATE SCHEMA app", "CREATE TABLE app.t (id int PRIMARY KEY)",
               "CREATE PUBLICATION granted_pub FOR TABLE app.t")
    with _replication_role(db, "nousage", "GRANT SELECT ON app.t TO {role}") as (role, dsn):
        proc = _run_cli("capture", "--dsn", dsn, "--table", "app.t",
                        "--publication", "granted_pub", "--slot", "nousage", "--stop-at-end")
        line = _one_error_line(proc)
        assert _slots(db) == 0
    assert "app.t" in line
    assert f"GRANT USAGE ON SCHEMA app TO {role}" in line


def test_spark_source_checks_select_before_the_publication(db: Database) -> None:
    from tidemark.spark.source import TidemarkDataSource  # noqa: PLC0415 - loads pyspark

    db.execute("CREATE TABLE a (id int PRIMARY KEY)", "CREATE TABLE b (id int PRIMARY KEY)",
               "CREATE PUBLICATION granted_pub FOR TABLE a, b")
    with _replication_role(db, "sparknoselect", "GRANT USAGE ON SCHEMA public TO {role}",
                           "GRANT SELECT ON a TO {role}") as (role, dsn):
        source = TidemarkDataSource({"dsn": dsn, "tables": "public.a,public.b",
                                     "publication": "granted_pub"})
        with pytest.raises(SourceError) as info:
            source.schema()
    assert f"GRANT SELECT ON public.b TO {role}" in str(info.value)


def test_failed_snapshot_drops_the_slot_this_start_created(db: Database) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY)", "INSERT INTO t VALUES (1)")
    conn = make_connector(db.dsn, "public.t", slot_name="fresh")
    conn.start()
    try:
        db.execute("DROP TABLE t")  # after the checks, before the snapshot reads it
        with pytest.raises(SourceError):
            drain(conn)
    finally:
        conn.stop()
    assert _slots(db) == 0


def test_failed_snapshot_keeps_a_slot_that_existed_before(db: Database) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY)", "INSERT INTO t VALUES (1)")
    db.execute("SELECT pg_create_logical_replication_slot('kept', 'pgoutput')")
    conn = make_connector(db.dsn, "public.t", slot_name="kept")
    conn.start()
    try:
        db.execute("DROP TABLE t")
        with pytest.raises(SourceError):
            drain(conn)
    finally:
        conn.stop()
    assert db.scalar("SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'kept'") == 1
