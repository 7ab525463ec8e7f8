"""A ``tidemark-repair`` read by the PostgreSQL read plan holds its keys' rows exactly at
the end of the batch that takes it: a change committed after that end is not in them
(the stream brings it in a later batch), and they sort below every later commit."""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from conftest import Database
from repair_sink import RowsSink
from tidemark.source.postgres.pgoutput import str_to_lsn
from tidemark.source.postgres.read_plan import PostgresReadPlan, make_read_plan
from tidemark.source.postgres.repair_hold import RepairHold
from tidemark.source.postgres.stream_offsets import SourceOffset, from_offset
from tidemark.source.repair import RepairRead, RepairRequest
from tidemark.source.repair_signal import repair_signal_data
from tidemark.source.signals import execute_snapshot_data, send_signal
from tidemark.spark.options import SourceOptions
from tidemark.testing.postgres import sql_connection
from waiting import wait_for

pytestmark = pytest.mark.integration


def _plan(db: Database) -> PostgresReadPlan:
    return make_read_plan(SourceOptions.parse(
        {"dsn": db.dsn, "table": "public.t", "slot": f"s_{db.name}",
         "publication": f"p_{db.name}", "signalTable": "public.dbz_signal"}))


def _setup(db: Database) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text)",
               "CREATE TABLE dbz_signal (id varchar(42) PRIMARY KEY, type varchar(32) NOT "
               "NULL, data varchar(2048))",
               "INSERT INTO t VALUES (1, 'a'), (2, 'b')",
               f"CREATE PUBLICATION p_{db.name} FOR TABLE t")


def _taken(plan: PostgresReadPlan, start: dict[str, Any]
           ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The batch (start, end) that takes the repair the signal table holds."""
    deadline = time.monotonic() + 30
    end = plan.latest(start, None)
    while "repairs" not in end:
        assert time.monotonic() < deadline, f"no batch took the repair: {end}"
        start, end = end, plan.latest(end, None)
    return start, end


def _reading(offset: dict[str, Any]) -> list[str]:
    """The ids of the repairs *offset* holds or takes (its export may be reached at once)."""
    state = SourceOffset.parse(offset)
    return [r.id for hold in (state.held, state.repairs) if hold is not None
            for r in hold.requests]


def test_a_repair_reads_its_keys_at_the_end_of_its_batch(db: Database) -> None:
    _setup(db)
    plan = _plan(db)
    try:
        plan.tables()
        start = plan.latest(plan.initial_offset(), None)
        send_signal(db.dsn, "public.dbz_signal", "tidemark-repair",
                    repair_signal_data("public.t", [{"id": 1}, {"id": 3}]))
        start, end = _taken(plan, start)
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


def test_a_repair_a_new_driver_finds_taken_is_read_again(db: Database) -> None:
    """Whether the batch that took a repair ran with it (a replay after a restart runs
    without it: its export is gone) is known only to the driver that read it: a new
    driver starting from that batch's end reads the repair again."""
    _setup(db)
    plan = _plan(db)
    try:
        plan.tables()
        start = plan.latest(plan.initial_offset(), None)
        signal = send_signal(db.dsn, "public.dbz_signal", "tidemark-repair",
                             repair_signal_data("public.t", [{"id": 1}]))
        start, end = _taken(plan, start)
        assert [p for p in plan.plan(start, end) if isinstance(p, RepairRead)]
        # The driver that read it does not read it again (no batch, or one without it).
        after = plan.latest(end, None)
        assert after == end or _reading(after) == []
    finally:
        plan.stop()
    again = _plan(db)
    try:
        again.tables()
        after = again.latest(end, None)
        assert after != end and _reading(after) == [signal]
    finally:
        again.stop()


def test_a_snapshot_of_a_table_supersedes_its_held_repair(db: Database) -> None:
    """A repair read below a snapshot generation's point would restore a row deleted
    between the two (the generation drops the table's earlier stream changes): the
    generation drops the table's held repairs."""
    _setup(db)
    plan = _plan(db)
    try:
        plan.tables()
        start = SourceOffset.parse(plan.latest(plan.initial_offset(), None))
        request = RepairRequest("r1", "public.t", ("id",), ((1,),))
        holding = dataclasses.replace(start, held=RepairHold(start.lsn, "gone", (request,)))
        send_signal(db.dsn, "public.dbz_signal", "execute-snapshot",
                    execute_snapshot_data(["public.t"]))
        end = SourceOffset.parse(plan.latest(holding.to_json(), None))
        assert end.snapshot is not None and end.snapshot.tables == ("public.t",)
        assert end.held is None and end.repairs is None
    finally:
        plan.stop()


def _within(call: Callable[[], dict[str, Any]], timeout_s: float, what: str
            ) -> dict[str, Any]:
    """*call*'s result, made on a thread: an AssertionError naming *what* if it has not
    returned after *timeout_s* (it is left to finish on its own)."""
    done: list[dict[str, Any]] = []
    thread = threading.Thread(target=lambda: done.append(call()), daemon=True)
    thread.start()
    thread.join(timeout_s)
    assert done, f"{what} did not return in {timeout_s} s"
    return done[0]


def _slots(db: Database) -> list[str]:
    with contextlib.closing(sql_connection(db.dsn, autocommit=True)) as conn:
        return [r[0] for r in conn.execute("SELECT slot_name FROM pg_replication_slots "
                                           "WHERE slot_name LIKE %s", (f"s_{db.name}%",))]


def test_a_long_transaction_holds_the_repair_not_the_stream(db: Database) -> None:
    """The repair's slot waits, when made, until every transaction holding an id has
    ended. While one is open, the stream goes on past later commits and the repair waits
    held without an export (a driver stopped meanwhile ends its slot's wait); once the
    transaction ends, a batch takes the repair, read at its end."""
    _setup(db)
    db.execute("CREATE TABLE other (id int)")
    stopped = _plan(db)
    stopped.tables()
    first = stopped.latest(stopped.initial_offset(), None)  # the pipeline's slot made
    with contextlib.closing(sql_connection(db.dsn)) as long:
        long.execute("INSERT INTO other VALUES (1)")  # holds a transaction id, open
        send_signal(db.dsn, "public.dbz_signal", "tidemark-repair",
                    repair_signal_data("public.t", [{"id": 1}, {"id": 3}]))
        try:
            state = SourceOffset.parse(_within(lambda: stopped.latest(first, None), 60,
                                               "the end of the batch taking the signal"))
            assert state.held is not None and state.held.export == "" and \
                state.repairs is None
            assert f"s_{db.name}_repair" in _slots(db)  # made, waiting
        finally:
            stopped.stop()
        wait_for(lambda: _slots(db) == [f"s_{db.name}"], 30,
                 "the stopped driver's repair slot to end")

        plan = _plan(db)
        try:
            plan.tables()
            end = _within(lambda: plan.latest(first, None), 60, "a batch's end")
            db.execute("UPDATE t SET v = 'streamed' WHERE id = 2")
            with contextlib.closing(sql_connection(db.dsn, autocommit=True)) as conn:
                written = str_to_lsn(str(conn.execute(
                    "SELECT pg_current_wal_insert_lsn()").fetchone()[0]))
            after = wait_for(lambda: (o := _within(lambda: plan.latest(end, None), 60,
                                                   "a batch's end"))
                             and from_offset(o) >= written and o,
                             60, "a batch past the update, with the transaction open")
            assert SourceOffset.parse(after).repairs is None
            assert _reading(after) != []  # still held
            long.commit()
            start, taken = _taken(plan, after)
            parts = [p for p in plan.plan(start, taken) if isinstance(p, RepairRead)]
            sink = RowsSink(["id", "v"])
            for _ in plan.read(parts[0], sink):
                pass
            assert [(op, values) for op, values, _, _ in sink.added] == [
                ("r", ("1", "a")), ("d", ("3", None))]
        finally:
            plan.stop()
