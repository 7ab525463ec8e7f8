"""PostgreSQL log tables where PostgreSQL's own rules bite: session settings, names
past 63 bytes, partitions, isolation levels, types without equality, DDL and triggers
turned off — each logged right or refused with a clear error, never silently lost."""

from __future__ import annotations

import time
from typing import Any

import psycopg
import pytest

from logtable_helpers import LogDb, drain, reader, replay
from tidemark.errors import ConfigError, SourceError
from tidemark.event import Op

pytestmark = [pytest.mark.integration, pytest.mark.every_pg_version]


@pytest.fixture
def logdb(db: Any) -> LogDb:
    return LogDb("postgres", db.dsn)


def test_a_key_lands_in_one_group_whatever_the_session_settings(logdb: LogDb) -> None:
    logdb.execute("CREATE TABLE ev (at timestamptz PRIMARY KEY, amount numeric, v text)")
    logdb.install(["ev"], streams=64, groups=16)
    logdb.execute("SET LOCAL TimeZone = 'UTC'",
                  *(f"INSERT INTO ev VALUES ('2024-01-01 00:00+00'::timestamptz + {i} * "
                    f"interval '1 hour', 1.50, 'a')" for i in range(40)))
    logdb.execute("SET LOCAL TimeZone = 'Asia/Tokyo'", "SET LOCAL DateStyle = 'German'",
                  "UPDATE ev SET v = 'b'")
    events = drain(reader(logdb))
    groups: dict[Any, set[int]] = {}
    for event in events:
        fields = event.source.fields
        assert fields is not None
        groups.setdefault(str(event.key), set()).add(fields["stream_id"] * 16 // 64)
    assert len(groups) == 40 and all(len(g) == 1 for g in groups.values())


def test_long_non_ascii_names_keep_their_four_triggers_apart(logdb: LogDb) -> None:
    name = "заказы_покупателей_магазина_x"  # 29 characters, 56 bytes
    logdb.execute(f'CREATE TABLE "{name}" (id int PRIMARY KEY, v text)')
    logdb.install([name])
    logdb.execute(f'INSERT INTO "{name}" VALUES (1, \'a\'), (2, \'b\')',
                  f'UPDATE "{name}" SET v = \'c\' WHERE id = 1',
                  f'DELETE FROM "{name}" WHERE id = 2')
    events = sorted(drain(reader(logdb)), key=lambda e: e.lsn or 0)
    assert [e.op for e in events] == [Op.CREATE, Op.CREATE, Op.UPDATE, Op.DELETE]


def test_partitioned_tables_and_partitions_are_refused(logdb: LogDb) -> None:
    logdb.execute("CREATE TABLE p (id int PRIMARY KEY) PARTITION BY RANGE (id)",
                  "CREATE TABLE p1 PARTITION OF p FOR VALUES FROM (0) TO (100)")
    for name in ("p", "p1"):
        with pytest.raises(ConfigError, match="partition"):
            logdb.install([name])


def test_truncate_outside_read_committed_is_refused_not_half_logged(logdb: LogDb) -> None:
    logdb.execute("CREATE TABLE t (id int PRIMARY KEY)", "INSERT INTO t VALUES (1)")
    logdb.install(["t"])
    with pytest.raises(psycopg.Error, match="READ COMMITTED"):
        logdb.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ", "TRUNCATE t")
    logdb.execute("INSERT INTO t VALUES (2)")
    logdb.execute("TRUNCATE t")
    events = drain(reader(logdb))
    assert sorted((e.op.value, e.key["id"]) for e in events) == [  # type: ignore[index]
        ("c", 2), ("d", 1), ("d", 2)]


def test_columns_without_equality_and_a_changed_type_are_logged(logdb: LogDb) -> None:
    logdb.execute("CREATE TABLE doc (id int PRIMARY KEY, body json, pos point, "
                  "code varchar(5))")
    logdb.install(["doc"])
    logdb.execute("INSERT INTO doc VALUES (1, '{\"a\": 1}', '(1,2)', 'abc')")
    logdb.execute("UPDATE doc SET body = '{\"a\": 2}' WHERE id = 1")
    logdb.install(["doc"], ddl=["ALTER TABLE doc ALTER COLUMN code TYPE varchar(50)"])
    logdb.execute("UPDATE doc SET code = 'a much longer code than before' WHERE id = 1")
    events = sorted(drain(reader(logdb)), key=lambda e: e.lsn or 0)
    assert [e.op for e in events] == [Op.CREATE, Op.UPDATE, Op.UPDATE]
    state = replay(events)
    assert state[(1,)]["code"] == "a much longer code than before"
    assert state[(1,)]["body"] == '{"a": 2}'


def test_a_rename_is_stopped_by_the_guard(logdb: LogDb) -> None:
    logdb.execute("CREATE TABLE t (id int PRIMARY KEY)")
    logdb.install(["t"])
    for statement in ("ALTER TABLE t RENAME TO u", "ALTER TABLE t ADD COLUMN x int",
                      "DROP TABLE t"):
        with pytest.raises(psycopg.Error, match="captured by a tidemark log table"):
            logdb.execute(statement)


def test_a_disabled_trigger_stops_the_reader(logdb: LogDb) -> None:
    logdb.execute("CREATE TABLE t (id int PRIMARY KEY)")
    logdb.install(["t"])
    logdb.execute("SET tidemark.logtable_ddl = 'on'",
                  "ALTER TABLE t DISABLE TRIGGER tidemark_cdc_insert")
    with pytest.raises(SourceError, match=r"tidemark_cdc_insert of public\.t is disabled"):
        reader(logdb)


def test_changes_applied_by_a_replica_session_are_logged(logdb: LogDb) -> None:
    """session_replication_role = replica (a logical replication subscriber, a restore
    with --disable-triggers) skips ordinary triggers; the log's fire ALWAYS."""
    logdb.execute("CREATE TABLE t (id int PRIMARY KEY)")
    logdb.install(["t"])
    logdb.execute("SET LOCAL session_replication_role = replica", "INSERT INTO t VALUES (1)")
    assert [e.key for e in drain(reader(logdb))] == [{"id": 1}]


def test_retention_waits_for_every_registered_reader(logdb: LogDb) -> None:
    logdb.execute("CREATE TABLE t (id int PRIMARY KEY)")
    logdb.install(["t"], streams=4, groups=1)
    logdb.execute(*(f"INSERT INTO t VALUES ({i})" for i in range(10)))
    slow = reader(logdb, reader_name="slow", prune_interval_s=0, retention_s=0)
    slow.poll()  # registers its position (nothing read yet) in the group
    fast = reader(logdb, reader_name="fast", prune_interval_s=0, retention_s=0)
    assert len(drain(fast)) == 10
    fast.saved(fast._offset())
    fast.poll()  # registers and prunes: the slow reader holds everything
    assert logdb.query("SELECT count(*) FROM t_cdc_log") == [(10,)]
    from tidemark.source.logtable.reader import open_database  # noqa: PLC0415

    db = open_database(logdb.dsn)
    try:
        assert {r.reader for r in db.readers()} == {"slow", "fast"}
        assert db.forget("slow") == 1
    finally:
        db.close()
    fast.poll()
    assert logdb.query("SELECT count(*) FROM t_cdc_log") == [(0,)]


def test_an_idle_reader_neither_spins_nor_blocks_the_engine(logdb: LogDb) -> None:
    """An idle reader looks at its log once per poll interval, and its polls in between
    return at once (a poll that slept would hold back the engine's offset saves, and
    so add to what a crash redelivers)."""
    logdb.execute("CREATE TABLE t (id int PRIMARY KEY)")
    logdb.install(["t"], groups=2)
    r = reader(logdb, poll_interval_ms=200)
    drain(r)
    db = r._require()
    reads = [0]
    read = db.read

    def counted(*args: Any) -> Any:
        reads[0] += 1
        return read(*args)

    db.read = counted  # type: ignore[method-assign]
    started = time.perf_counter()
    slowest = 0.0
    while time.perf_counter() - started < 1.0:
        before = time.perf_counter()
        r.poll()
        slowest = max(slowest, time.perf_counter() - before)
        time.sleep(0.01)  # the engine's pace between empty polls, about
    passes = reads[0] / 2  # one read per group
    assert passes <= 6, f"{passes} passes over the log in a second: the idle reader spins"
    assert slowest < 0.1, f"an idle poll took {slowest:.3f}s: it blocks the engine"
    logdb.execute("INSERT INTO t VALUES (1)")
    assert len(drain(r)) == 1
