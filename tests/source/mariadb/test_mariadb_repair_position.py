"""A ``tidemark-repair`` read by the MariaDB read plan holds its keys' rows exactly at
the end of the batch that takes it: changes committed after that end (an update, an
insert, a delete) are taken back out of the rows read later, from the binlog."""

from __future__ import annotations

import pytest

from conftest import MariaDatabase
from repair_sink import RowsSink
from tidemark.source.mariadb.position import BinlogPosition
from tidemark.source.mariadb.read_plan import make_read_plan
from tidemark.source.repair import RepairRead
from tidemark.source.repair_signal import repair_signal_data
from tidemark.source.signals import send_signal
from tidemark.spark.options import SourceOptions

pytestmark = pytest.mark.integration


def test_a_repair_reads_its_keys_at_the_end_of_its_batch(mdb: MariaDatabase) -> None:
    mdb.execute("CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(20))",
                "CREATE TABLE dbz_signal (id VARCHAR(42) PRIMARY KEY, type VARCHAR(32) NOT "
                "NULL, data VARCHAR(2048))",
                "INSERT INTO t VALUES (1, 'a'), (2, 'b'), (4, 'd')")
    plan = make_read_plan(SourceOptions.parse(
        {"dsn": mdb.dsn, "table": f"{mdb.name}.t",
         "signalTable": f"{mdb.name}.dbz_signal"}))
    plan.tables()
    start = plan.latest(plan.initial_offset(), None)
    send_signal(mdb.dsn, f"{mdb.name}.dbz_signal", "tidemark-repair",
                repair_signal_data(f"{mdb.name}.t",
                                   [{"id": 1}, {"id": 2}, {"id": 3}, {"id": 4}]))
    end = plan.latest(start, None)
    assert "repairs" in end
    # Committed after the batch's end: the repair must not hold them.
    mdb.execute("UPDATE t SET v = 'later' WHERE id = 1", "INSERT INTO t VALUES (3, 'x')",
                "DELETE FROM t WHERE id = 4", "UPDATE t SET v = 'again' WHERE id = 1")
    parts = [p for p in plan.plan(start, end) if isinstance(p, RepairRead)]
    assert len(parts) == 1
    sink = RowsSink(["id", "v"])
    for _ in plan.read(parts[0], sink):
        pass
    assert sorted((op, values) for op, values, _, _ in sink.added) == [
        ("d", ("3", None)), ("r", ("1", "a")), ("r", ("2", "b")), ("r", ("4", "d"))]
    assert {lsn for _, _, lsn, _ in sink.added} == {BinlogPosition.from_offset(end).key}


def test_repair_keys_in_verify_s_texts_find_their_rows(mdb: MariaDatabase) -> None:
    """Keys as ``tidemark verify`` names them (PostgreSQL's forms: a fraction without
    trailing zeros and ``+00``, ``\\x<hex>`` bytes) find MariaDB's rows: an ``r`` for
    each, no ``d`` (only for the key that is absent)."""
    mdb.execute("CREATE TABLE k (ts TIMESTAMP(6) NOT NULL DEFAULT '2000-01-01 00:00:00', "
                "b VARBINARY(8), v VARCHAR(20), PRIMARY KEY (ts, b))",
                "CREATE TABLE dbz_signal (id VARCHAR(42) PRIMARY KEY, type VARCHAR(32) NOT "
                "NULL, data VARCHAR(2048))",
                "SET time_zone = '+00:00'",
                "INSERT INTO k VALUES ('2024-03-04 05:06:01.5', x'0102', 'a')")
    plan = make_read_plan(SourceOptions.parse(
        {"dsn": mdb.dsn, "table": f"{mdb.name}.k",
         "signalTable": f"{mdb.name}.dbz_signal"}))
    plan.tables()
    start = plan.latest(plan.initial_offset(), None)
    send_signal(mdb.dsn, f"{mdb.name}.dbz_signal", "tidemark-repair",
                repair_signal_data(f"{mdb.name}.k", [
                    {"ts": "2024-03-04 05:06:01.5+00", "b": "\\x0102"},
                    {"ts": "2024-03-04 05:06:02+00", "b": "\\x03"}]))
    end = plan.latest(start, None)
    parts = [p for p in plan.plan(start, end) if isinstance(p, RepairRead)]
    sink = RowsSink(["ts", "b", "v"])
    for _ in plan.read(parts[0], sink):
        pass
    rows = [(op, values) for op, values, _, _ in sink.added if values is not None]
    assert ("r", ("2024-03-04 05:06:01.500000+00", b"\x01\x02", "a")) in rows, rows
    assert ("d", ("2024-03-04 05:06:02+00", "\\x03", None)) in rows, rows


@pytest.mark.parametrize("ddl", ["ADD COLUMN w INT", "RENAME COLUMN v TO u",
                                 "MODIFY n BIGINT"])
def test_a_key_changed_before_a_schema_change_is_left_out(mdb: MariaDatabase,
                                                          ddl: str) -> None:
    """A key whose row at the batch's end is in another column layout than the read
    view's (DDL in between: a column added, renamed, retyped) cannot be restored: it is
    left out, never deleted."""
    mdb.execute("CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(20), n INT)",
                "CREATE TABLE dbz_signal (id VARCHAR(42) PRIMARY KEY, type VARCHAR(32) NOT "
                "NULL, data VARCHAR(2048))",
                "INSERT INTO t VALUES (1, 'a', 1), (2, 'b', 2)")
    plan = make_read_plan(SourceOptions.parse(
        {"dsn": mdb.dsn, "table": f"{mdb.name}.t",
         "signalTable": f"{mdb.name}.dbz_signal"}))
    plan.tables()
    start = plan.latest(plan.initial_offset(), None)
    send_signal(mdb.dsn, f"{mdb.name}.dbz_signal", "tidemark-repair",
                repair_signal_data(f"{mdb.name}.t", [{"id": 1}, {"id": 2}]))
    end = plan.latest(start, None)
    assert "repairs" in end
    mdb.execute("UPDATE t SET v = 'later' WHERE id = 1", f"ALTER TABLE t {ddl}")
    parts = [p for p in plan.plan(start, end) if isinstance(p, RepairRead)]
    sink = RowsSink(["id", "v", "n"])
    for _ in plan.read(parts[0], sink):
        pass
    assert [(op, values[:2]) for op, values, _, _ in sink.added if values is not None] \
        == [("r", ("2", "b"))]


def test_a_repair_key_that_is_no_value_of_its_column_is_skipped(
        mdb: MariaDatabase, caplog: pytest.LogCaptureFixture) -> None:
    """MariaDB reads ``'abc'`` for an integer key as 0 and finds nothing, so the repair
    would send a ``d`` of key ``abc``, which the pipeline cannot read back into the
    integer column (every replay of the batch would fail): such a signal is skipped
    with a warning naming the key, when taken; a good one in the same batch is not."""
    mdb.execute("CREATE TABLE t (id INT PRIMARY KEY, d DATE, v VARCHAR(20))",
                "CREATE TABLE u (d DATE PRIMARY KEY, v VARCHAR(20))",
                "CREATE TABLE dbz_signal (id VARCHAR(42) PRIMARY KEY, type VARCHAR(32) NOT "
                "NULL, data VARCHAR(2048))",
                "INSERT INTO t VALUES (1, '2024-01-01', 'a')")
    plan = make_read_plan(SourceOptions.parse(
        {"dsn": mdb.dsn, "tables": f"{mdb.name}.t,{mdb.name}.u",
         "signalTable": f"{mdb.name}.dbz_signal"}))
    plan.tables()
    start = plan.latest(plan.initial_offset(), None)
    bad = [send_signal(mdb.dsn, f"{mdb.name}.dbz_signal", "tidemark-repair",
                       repair_signal_data(table, [key]))
           for table, key in ((f"{mdb.name}.t", {"id": "abc"}), (f"{mdb.name}.t", {"id": 1.5}),
                              (f"{mdb.name}.u", {"d": "not a date"}))]
    good = send_signal(mdb.dsn, f"{mdb.name}.dbz_signal", "tidemark-repair",
                       repair_signal_data(f"{mdb.name}.t", [{"id": 1}, {"id": "2"}]))
    end = plan.latest(start, None)
    assert [r["id"] for r in end["repairs"]] == [good]
    for signal in bad:
        assert f"signal {signal} (tidemark-repair) skipped: key" in caplog.text
    assert "key {'id': 'abc'} is not a value of id" in caplog.text
