"""Two ``tidemark-repair`` signals of the same key of a SQLite log table, with no change
logged between them: the later one's rows must still sort above the earlier one's, by
position (SCD2) and sequence, or ``apply_changes`` skips them as not newer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from logtable_helpers import LogDb
from repair_sink import RowsSink
from tidemark.event import TableId
from tidemark.source.logtable.read_plan import make_read_plan
from tidemark.source.repair import RepairRead
from tidemark.source.repair_signal import repair_signal_data
from tidemark.source.signals import send_signal, signal_table_ddl
from tidemark.spark.options import SourceOptions


def _repair(plan: Any, start: dict[str, Any], dsn: str) -> tuple[dict[str, Any], tuple[int, int]]:
    send_signal(dsn, "main.dbz_signal", "tidemark-repair",
                repair_signal_data("main.t", [{"id": 1}]))
    end = plan.latest(start, None)
    parts = [p for p in plan.plan(start, end) if isinstance(p, RepairRead)]
    assert len(parts) == 1
    sink = RowsSink(["id", "v"])
    for _ in plan.read(parts[0], sink):
        pass
    [(op, values, lsn, seq)] = sink.added
    assert (op, values) == ("r", ("1", "a"))
    return end, (lsn, seq)


def test_a_later_repair_of_a_key_is_newer_at_the_same_position(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    path.touch()
    db = LogDb("sqlite", f"sqlite:///{path}", path)
    db.execute(signal_table_ddl(TableId("main", "dbz_signal")),
               "CREATE TABLE t (id int PRIMARY KEY, v text)")
    db.install(["t"])
    db.execute("INSERT INTO t (id, v) VALUES (1, 'a')")
    plan = make_read_plan(SourceOptions.parse(
        {"dsn": db.dsn, "table": "main.t", "signalTable": "main.dbz_signal"}))
    plan.tables()
    start = plan.latest(plan.initial_offset(), None)
    end, first = _repair(plan, start, db.dsn)
    _, second = _repair(plan, end, db.dsn)
    assert second > first
    # At a higher position, not only a higher _seq: SCD2 orders versions by the
    # position alone and takes one at its current version's own for a replay.
    assert second[0] > first[0]
