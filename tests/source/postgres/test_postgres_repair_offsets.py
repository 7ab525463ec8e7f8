"""The repair state a PostgreSQL stream keeps in its offsets: a checkpoint of the
format before repairs were held, and which signals a committed offset has taken."""

from __future__ import annotations

from tidemark.source.postgres.repair_hold import RepairHold
from tidemark.source.postgres.stream_offsets import SourceOffset
from tidemark.source.registry import kind_of
from tidemark.source.repair import RepairRequest

REQUEST = RepairRequest("r1", "public.t", ("id",), ((1,),))


def test_an_old_offset_with_a_list_of_repairs_holds_them_again() -> None:
    """Before repairs were held, a batch's taken requests were a list, read on the
    executor under no export: they are held again, to be read under a new one."""
    state = SourceOffset.parse({"lsn": "0/1000", "signals": ["r1"],
                                "repairs": [REQUEST.to_json()]})
    assert state.repairs is None
    assert state.held == RepairHold(0x1000, "", (REQUEST,))
    assert SourceOffset.parse({"lsn": "0/1000", "repairs": []}).held is None


def test_a_held_repair_is_not_taken() -> None:
    """A repair is in ``signals`` from the batch that starts its hold; its rows are
    written by the batch that ends at the hold's point."""
    kind = kind_of("host=db dbname=app", None)
    other = RepairRequest("r2", "public.t", ("id",), ((2,),))
    holding = SourceOffset(0x1000, known=(), signals=("r1", "r2", "s"),
                           held=RepairHold(0x2000, "E", (REQUEST, other))).to_json()
    assert kind.taken_signals(holding) == frozenset({"s"})
    taking = SourceOffset(0x2000, known=(), signals=("r1", "r2", "s"),
                          repairs=RepairHold(0x2000, "E", (REQUEST, other))).to_json()
    assert kind.taken_signals(taking) == frozenset({"r1", "r2", "s"})
    assert kind.taken_signals({"lsn": "0/1000"}) is None
