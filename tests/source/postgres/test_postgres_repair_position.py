"""A ``tidemark-repair`` read by the PostgreSQL read plan holds its keys' rows exactly at
the end of the batch that takes it: a change committed after that end is not in them
(the stream brings it in a later batch), and they sort below every later commit."""

from __future__ import annotations

import time

import pytest

from conftest import Database
from repair_sink import RowsSink
from tidemark.source.postgres.read_plan import make_read_plan
from tidemark.source.postgres.stream_offsets import from_offset
from tidemark.source.repair import RepairRead
from tidemark.source.repair_signal import repair_signal_data
from tidemark.source.signals import send_signal
from tidemark.spark.options import SourceOptions

pytestmark = pytest.mark.integration


def test_a_repair_reads_its_keys_at_the_end_of_its_batch(db: Database) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text)",
               "CREATE TABLE dbz_signal (id varchar(42) PRIMARY KEY, type varchar(32) NOT "
               "NULL, data varchar(2048))",
               "INSERT INTO t VALUES (1, 'a'), (2, 'b')",
               f"CREATE PUBLICATION p_{db.name} FOR TABLE t")
    plan = make_read_plan(SourceOptions.parse(
        {"dsn": db.dsn, "table": "public.t", "slot": f"s_{db.name}",
         "publication": f"p_{db.name}", "signalTable": "public.dbz_signal"}))
    try:
        plan.tables()
        start = plan.latest(plan.initial_offset(), None)
        send_signal(db.dsn, "public.dbz_signal", "tidemark-repair",
                    repair_signal_data("public.t", [{"id": 1}, {"id": 3}]))
        deadline = time.monotonic() + 30
        end = plan.latest(start, None)
        while "repairs" not in end:
            assert time.monotonic() < deadline, f"no batch took the repair: {end}"
            start, end = end, plan.latest(end, None)
        # Committed after the batch's end: the repair must not hold them.
        db.execute("UPDATE t SET v = 'later' WHERE id = 1", "INSERT INTO t VALUES (3, 'x')")
        parts = [p for p in plan.plan(start, end) if isinstance(p, RepairRead)]
        assert len(parts) == 1
        sink = RowsSink(["id", "v"])
        for _ in plan.read(parts[0], sink):
            pass
        last = from_offset(end)
        assert [(op, values) for op, values, _, _ in sink.added] == [
            ("r", ("1", "a")), ("d", ("3", None))]
        # Below any commit at or after the end, above every one before it.
        assert {lsn for _, _, lsn, _ in sink.added} == {last - 1}
    finally:
        plan.stop()
