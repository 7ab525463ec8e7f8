"""A ``tidemark-repair`` read by the log tables' read plan (PostgreSQL and SQLite) holds
its keys' rows exactly at the end of the batch that takes it: changes committed after
that end are not in them (they reach the target in the next batch, above the repair).
A batch replayed by another driver, which cannot read at that end any more, leaves the
repair to the next batch, read at its own end."""

from __future__ import annotations

from typing import Any

import pytest

from logtable_helpers import LogDb
from repair_sink import RowsSink
from tidemark.event import TableId
from tidemark.source.logtable.read_plan import LogTableReadPlan, make_read_plan
from tidemark.source.logtable.repair_read import HeldRepairRead
from tidemark.source.repair_signal import repair_signal_data
from tidemark.source.signals import send_signal, signal_table_ddl
from tidemark.spark.options import SourceOptions

pytestmark = pytest.mark.integration

KEYS = [{"id": 1}, {"id": 2}, {"id": 3}, {"id": 4}]


def _schema(db: LogDb) -> str:
    return "main" if db.kind == "sqlite" else "public"


def _plan(db: LogDb) -> LogTableReadPlan:
    schema = _schema(db)
    plan = make_read_plan(SourceOptions.parse(
        {"dsn": db.dsn, "table": f"{schema}.t", "signalTable": f"{schema}.dbz_signal"}))
    plan.tables()
    return plan


def _setup(db: LogDb) -> None:
    db.execute(signal_table_ddl(TableId(_schema(db), "dbz_signal")),
               "CREATE TABLE t (id int PRIMARY KEY, v text)")
    db.install(["t"])
    db.execute("INSERT INTO t (id, v) VALUES (1, 'a'), (2, 'b'), (4, 'd')")


def _read(plan: LogTableReadPlan, start: dict[str, Any], end: dict[str, Any]
          ) -> tuple[list[tuple[str, Any]], list[tuple[str, Any]], set[int]]:
    """The batch's repair rows, its change rows (op, values), and the repair's
    positions."""
    repairs, changes = RowsSink(["id", "v"]), RowsSink(["id", "v"])
    for part in plan.plan(start, end):
        for _ in plan.read(part, repairs if isinstance(part, HeldRepairRead) else changes):
            pass
    return (sorted((op, v) for op, v, _, _ in repairs.added),
            [(op, v) for op, v, _, _ in changes.added],
            {lsn for _, _, lsn, _ in repairs.added})


def _changes_after_the_end(db: LogDb) -> None:
    db.execute("UPDATE t SET v = 'later' WHERE id = 1", "INSERT INTO t VALUES (3, 'x')",
               "DELETE FROM t WHERE id = 4", "UPDATE t SET v = 'again' WHERE id = 1")


AT_THE_END = [("d", ("3", None)), ("r", ("1", "a")), ("r", ("2", "b")), ("r", ("4", "d"))]


def test_a_repair_reads_its_keys_at_the_end_of_its_batch(logdb: LogDb) -> None:
    _setup(logdb)
    plan = _plan(logdb)
    start = plan.latest(plan.initial_offset(), None)
    send_signal(logdb.dsn, f"{_schema(logdb)}.dbz_signal", "tidemark-repair",
                repair_signal_data(f"{_schema(logdb)}.t", KEYS))
    end = plan.latest(start, None)
    assert "repairs" in end
    _changes_after_the_end(logdb)  # committed after the batch's end
    repaired, _, positions = _read(plan, start, end)
    assert repaired == AT_THE_END
    later = plan.latest(end, None)
    assert "repairs" not in later, "the driver that read the repair took it again"
    assert plan.latest(later, None) == later
    _, changes, _ = _read(plan, end, later)
    assert [v[0] for _, v in changes] == ["1", "3", "4", "1"]
    # At the batch's end: above its changes, below the next batch's.
    [at] = positions
    assert all(r.key <= at for r in plan.plan(start, end) if not isinstance(r, HeldRepairRead))
    assert all(r.key > at for r in plan.plan(end, later))


def test_a_replayed_repair_batch_leaves_the_repair_to_the_next_batch(logdb: LogDb) -> None:
    _setup(logdb)
    first = _plan(logdb)
    start = first.latest(first.initial_offset(), None)
    send_signal(logdb.dsn, f"{_schema(logdb)}.dbz_signal", "tidemark-repair",
                repair_signal_data(f"{_schema(logdb)}.t", KEYS))
    end = first.latest(start, None)
    _changes_after_the_end(logdb)
    # The driver that planned the batch is gone; a new one replays it.
    second = _plan(logdb)
    repaired, changes, _ = _read(second, start, end)
    assert repaired == [] and changes == []
    following = second.latest(end, None)
    assert [r["id"] for r in following["repairs"]] == [r["id"] for r in end["repairs"]]
    repaired, changes, _ = _read(second, end, following)
    # Read at the next batch's end: after the changes that batch holds.
    assert repaired == [("d", ("4", None)), ("r", ("1", "again")), ("r", ("2", "b")),
                        ("r", ("3", "x"))]
    assert [v[0] for _, v in changes] == ["1", "3", "4", "1"]
    assert second.latest(following, None) == following, "the repair was taken a third time"
