"""A table's repair is applied only when the verify after it finds the target caught up."""

from __future__ import annotations

from tidemark.verify.repair import repair_after
from tidemark.verify.result import TableRepair, TableResult


def test_a_repair_is_applied_only_when_the_target_is_not_behind() -> None:
    queued = TableRepair("queued", keys=2, signal_ids=("s1",))
    caught_up = TableResult("public.t", "/lake/t")
    assert repair_after(queued, caught_up).state == "applied"
    behind = repair_after(queued, TableResult("public.t", "/lake/t", target_behind=True))
    assert behind.state == "queued" and behind.message is not None
    assert "behind" in behind.message and behind.signal_ids == ("s1",)
