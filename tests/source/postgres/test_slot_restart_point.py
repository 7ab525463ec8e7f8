"""The Spark source keeps its slot's restart point about a batch behind
(:mod:`tidemark.source.postgres.restart_point`): on PostgreSQL 16 and later a committed
batch moves ``restart_lsn`` past its own changes; an idle server gets one record, not one
per trigger; where the server refuses the record (PostgreSQL 15, a user without the
grant) the source says so once and reads as before."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import psycopg
import pytest

from conftest import Database
from tidemark.source.postgres.read_plan import PostgresReadPlan, make_read_plan
from tidemark.spark.options import SourceOptions
from waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.every_pg_version]

_PASSWORD = "restart-point-pw"


def _plan(db: Database, dsn: str | None = None, slot: str = "") -> PostgresReadPlan:
    return make_read_plan(SourceOptions.parse(
        {"dsn": dsn or db.dsn, "table": "public.t", "slot": f"s_{db.name}{slot}",
         "publication": f"p_{db.name}"}))


def _insert(db: Database, number: int) -> None:
    """A transaction of 2,000 rows, over a MiB of WAL (MIN_WAL_BYTES), committed durably:
    the WAL before it (the last batch's record) is flushed too."""
    db.execute("SET LOCAL synchronous_commit = on",
               f"INSERT INTO t SELECT g, repeat('r{number}', 300) FROM "
               f"generate_series({number * 2000}, {number * 2000 + 1999}) g")


def _setup(db: Database) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text)",
               f"CREATE PUBLICATION p_{db.name} FOR TABLE t")


def _slot(db: Database) -> tuple[int, int]:
    """The slot's (restart_lsn, confirmed_flush_lsn)."""
    ((restart, confirmed),) = db.query(
        "SELECT (restart_lsn - '0/0')::bigint, (confirmed_flush_lsn - '0/0')::bigint "
        "FROM pg_replication_slots WHERE slot_name = %s", (f"s_{db.name}",))
    return int(restart), int(confirmed)


def _batches(db: Database, plan: PostgresReadPlan, rounds: int) -> list[int]:
    """*rounds* batches of a transaction each, read and committed; returns the WAL
    position before each one's transaction."""
    start = plan.latest(plan.initial_offset(), None)
    plan.commit(start)
    before = []
    for number in range(rounds):
        before.append(int(db.scalar("SELECT (pg_current_wal_lsn() - '0/0')::bigint")))
        _insert(db, number)
        end = wait_for(lambda s=start: (e := plan.latest(s, None)) != s and e, 30,
                       "the batch of the transaction")
        plan.commit(end)
        start = end
    return before


def test_a_committed_batch_moves_the_restart_point_past_its_changes(
        db: Database, caplog: pytest.LogCaptureFixture) -> None:
    _setup(db)
    plan = _plan(db)
    caplog.set_level(logging.INFO, logger="tidemark.source.postgres.restart_point")
    try:
        before = _batches(db, plan, 4)
        restart, confirmed = _slot(db)
        if int(db.scalar("SHOW server_version_num")) >= 160000:
            # The record logged as the third batch was planned was flushed with the
            # fourth's transaction and read in its batch: decoding restarts after the
            # changes of the first two (without it, where the server's own last record
            # was: it logs one every 15 s).
            assert restart >= before[2], (restart, before, confirmed)
            assert plan._restart_points.enabled
            assert not caplog.records
        else:
            assert not plan._restart_points.enabled
            (record,) = caplog.records  # once, for every batch
            assert "PostgreSQL before 16" in record.getMessage()
    finally:
        plan.stop()


@pytest.mark.parametrize("sources", [1, 2])
def test_an_idle_server_gets_no_record_per_trigger(db: Database, sources: int) -> None:
    """After a busy batch, triggers on an idle server write no WAL: neither for our own
    last record nor, with two sources on one server, for each other's."""
    _setup(db)
    plans = [_plan(db, slot=f"_{n}") for n in range(sources)]
    ends = [plan.latest(plan.initial_offset(), None) for plan in plans]

    def trigger() -> tuple[str, bool]:
        """Each source's trigger, its batch read and committed; the WAL position after
        them, and whether it is flushed (a flush past a record may make another due)."""
        for n, plan in enumerate(plans):
            ends[n] = plan.latest(ends[n], None)
            plan.commit(ends[n])
        ((written, flushed),) = db.query(
            "SELECT pg_current_wal_insert_lsn()::text, pg_current_wal_flush_lsn()::text")
        return written, flushed == written

    try:
        for plan, end in zip(plans, ends, strict=True):
            plan.commit(end)
        _insert(db, 0)  # a record is due after this one
        last = [trigger()]
        wait_for(lambda: last.append(trigger()) or (last[-1] == last[-2] and last[-1][1]),
                 30, "two triggers in a row that wrote no WAL, all of it flushed")
        settled = list(ends)
        assert {trigger() for _ in range(10)} == {last[-1]}
        assert ends == settled  # and no batch
        if int(db.scalar("SHOW server_version_num")) >= 160000:
            assert all(plan._restart_points._after is not None for plan in plans)
    finally:
        for plan in plans:
            plan.stop()


@contextlib.contextmanager
def _replication_role(db: Database) -> Iterator[str]:
    role = f"{db.name}_rp"
    db.execute(f"CREATE ROLE {role} LOGIN REPLICATION PASSWORD '{_PASSWORD}'",
               f"GRANT CONNECT ON DATABASE {db.name} TO {role}",
               f"GRANT SELECT ON t TO {role}")
    try:
        yield db.cluster.dsn(db.name, user=role, password=_PASSWORD)
    finally:
        db.execute(f"DROP OWNED BY {role}", f"DROP ROLE {role}")


def test_a_user_without_the_grant_is_told_once_and_reads_as_before(
        db: Database, caplog: pytest.LogCaptureFixture) -> None:
    _setup(db)
    caplog.set_level(logging.INFO, logger="tidemark.source.postgres.restart_point")
    with _replication_role(db) as dsn:
        plan = _plan(db, dsn)
        try:
            _batches(db, plan, 3)
        finally:
            plan.stop()
    assert not plan._restart_points.enabled
    (record,) = caplog.records  # once, for every batch
    if int(db.scalar("SHOW server_version_num")) >= 160000:
        assert "GRANT EXECUTE ON FUNCTION pg_log_standby_snapshot()" in record.getMessage()
        assert f"{db.name}_rp" in record.getMessage()


def test_what_disables_the_record_and_what_fails_the_read(db: Database) -> None:
    """A standby's refusal (recovery in progress) or a missing function disables the
    record; a timeout, a cancel, a shutdown or a broken connection fail the read as any
    other query's would."""
    from tidemark.postgres_bounded import ServerTimeoutError  # noqa: PLC0415
    from tidemark.source.postgres import wal_reads as wal  # noqa: PLC0415
    from tidemark.source.postgres.restart_point import _not_the_function  # noqa: PLC0415

    with contextlib.closing(wal.connect(db.dsn, purpose="test")) as conn:
        for refusal in (psycopg.errors.ObjectNotInPrerequisiteState("recovery is in "
                                                                     "progress"),
                        psycopg.errors.UndefinedFunction("no such function"),
                        psycopg.errors.FeatureNotSupported("not here")):
            assert not _not_the_function(conn, refusal), refusal
        for failure in (ServerTimeoutError.after(300), psycopg.errors.QueryCanceled(),
                        psycopg.errors.AdminShutdown(), psycopg.errors.ConnectionFailure()):
            assert _not_the_function(conn, failure), failure
        conn.close()
        assert _not_the_function(conn, psycopg.errors.UndefinedFunction("x"))
