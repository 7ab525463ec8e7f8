"""How far a pipeline's committed offset has brought a verified table's target: not at
all while a snapshot generation is still loading it (its target is partial), whatever
the stream's position."""

from __future__ import annotations

from tidemark.source.postgres.kind import PostgresKind
from tidemark.source.postgres.snapshot_plan import SnapshotPlan
from tidemark.source.postgres.stream_offsets import SourceOffset


def _offset(plan: SnapshotPlan | None) -> dict[str, object]:
    return SourceOffset(lsn=5_000, known=("public.a", "public.b"), snapshot=plan).to_json()


def test_a_table_still_being_snapshotted_is_not_reached() -> None:
    kind = PostgresKind()
    plan = SnapshotPlan(generation=2, at=4_000, export="00000003-1", taken_us=0,
                        tables=("public.a", "public.b"), position=1)
    offset = _offset(plan)
    assert kind.verified_position(offset, ["public.b"]) == 0
    # a is fully planned (its chunks are in committed batches), c is not in the plan
    assert kind.verified_position(offset, ["public.a"]) == 5_000
    assert kind.verified_position(offset, ["public.c"]) == 5_000
    done = SnapshotPlan(generation=2, at=4_000, export="00000003-1", taken_us=0,
                        tables=("public.a", "public.b"), position=2)
    assert kind.verified_position(_offset(done), ["public.b"]) == 5_000
    assert kind.verified_position(_offset(None), ["public.b"]) == 5_000
