"""One batch applied by several parts (key ranges of the target), committed as one:
:mod:`tidemark.lake.split_apply` without Spark (the executors' side is in
``test_pipeline_executor_apply.py``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from lake_helpers import change, read, rows
from tidemark.lake import ApplyResult, ApplySpec, apply_changes
from tidemark.lake.branch import BRANCHES_DIR, OverlapError
from tidemark.lake.clustering import FileRange
from tidemark.lake.split_apply import (
    TargetPlan,
    abandon,
    apply_part,
    cut_points,
    part_rows,
    plan_target,
    publish,
)

SPEC = ApplySpec(keys=("id",))
SCHEMA = rows().schema


def _two_files(path: Path) -> None:
    """Keys 1..50 and 51..100, one file each (two batches of inserts)."""
    for version, (lo, hi) in enumerate(((1, 51), (51, 101))):
        apply_changes(path, rows(*[change("c", 10 + version, i, id=i, name="old", body="x")
                                   for i in range(lo, hi)]), SPEC, app_id="q", version=version)


def _changes() -> list[dict[str, Any]]:
    """Updates and deletes all over both files, and inserts past the end."""
    changes = [change("u", 20, i, id=i, name="new", body="y") for i in range(1, 101, 3)]
    changes += [change("d", 20, 200 + i, id=i) for i in range(2, 101, 10)]
    changes += [change("c", 20, 300 + i, id=i, name="added", body="z") for i in range(101, 111)]
    return changes


def _plan(path: Path, spec: ApplySpec = SPEC, *, version: int = 2,
          parts: int = 2) -> TargetPlan | ApplyResult:
    """The plan for batch *version* of app ``q`` in up to *parts* parts."""
    return plan_target(str(path), spec, SCHEMA, app_id="q", version=version, parts=parts,
                       step_rows=1000)


def _apply_in_parts(plan: TargetPlan, changes: list[dict[str, Any]]) -> ApplyResult:
    parts = [apply_part(plan, part, [part_rows(plan, part, rows(*changes))], attempt="0")
             for part in range(plan.parts)]
    return publish(plan, parts)


def test_a_batch_applied_in_two_parts_is_one_commit_equal_to_one_merge(
        tmp_path: Path) -> None:
    path, whole = tmp_path / "t", tmp_path / "whole"
    _two_files(path)
    _two_files(whole)
    plan = _plan(path)
    assert isinstance(plan, TargetPlan) and plan.bounds == (51,)
    before = DeltaTable(str(path)).version()

    result = _apply_in_parts(plan, _changes())

    table = DeltaTable(str(path))
    assert table.version() == before + 1 == result.delta_version
    assert table.transaction_version("q") == 2
    apply_changes(whole, rows(*_changes()), SPEC, app_id="q", version=2)
    assert read(path, "id", "name", "body") == read(whole, "id", "name", "body")
    assert not (path / BRANCHES_DIR).exists()
    # The replay of the batch is recognised before any part runs.
    replay = _plan(path)
    assert isinstance(replay, ApplyResult) and replay.already_applied


def test_parts_that_rewrite_the_same_file_publish_nothing(tmp_path: Path) -> None:
    """A cut inside a file (not what plan_target makes): both parts rewrite it."""
    path = tmp_path / "t"
    _two_files(path)
    plan = _plan(path)
    assert isinstance(plan, TargetPlan)
    inside = dataclasses.replace(plan, bounds=(25,))
    before = read(path)
    with pytest.raises(OverlapError, match="rewritten by more than one branch"):
        _apply_in_parts(inside, _changes())
    assert DeltaTable(str(path)).version() == plan.base_version
    assert read(path) == before
    assert not (path / BRANCHES_DIR).exists()


def test_a_truncate_asks_for_the_batch_whole(tmp_path: Path) -> None:
    path = tmp_path / "t"
    _two_files(path)
    plan = _plan(path)
    assert isinstance(plan, TargetPlan)
    batch = rows(change("u", 20, 1, id=3, name="new", body="y"), change("t", 21, 1))
    results = [apply_part(plan, p, [part_rows(plan, p, batch)], "0") for p in range(2)]
    assert all(r.needs_one_part for r in results)
    result = apply_part(plan.one_part(), 0, [batch], "0")
    assert result.result.delta_version is not None and read(path) == []


def test_a_key_change_across_parts_with_an_unsent_value_asks_for_the_batch_whole(
        tmp_path: Path) -> None:
    """Key 3 moves to 60 (another part) without its body: only one part sees both."""
    path = tmp_path / "t"
    _two_files(path)
    plan = _plan(path)
    assert isinstance(plan, TargetPlan)
    gone = change("d", 20, 1, id=3)
    made = change("c", 20, 2, unavailable=("body",), id=60, name="moved")
    made["_lsn"] = gone["_lsn"]
    batch = rows(gone, made)
    results = [apply_part(plan, p, [part_rows(plan, p, batch)], "0") for p in range(2)]
    assert [r.needs_one_part for r in results] == [False, True]
    abandon(plan)
    apply_part(plan.one_part(), 0, [batch], "0")
    moved = [r for r in read(path, "id", "name", "body") if r["id"] in (3, 60)]
    assert moved == [{"id": 60, "name": "moved", "body": "x"}]


def test_no_split_without_a_gap_between_files_or_an_integer_key(tmp_path: Path) -> None:
    path = tmp_path / "t"
    apply_changes(path, rows(*[change("c", 10, i, id=i, name="a", body="x")
                               for i in range(1, 51)]), SPEC, app_id="q", version=0)
    one_file = _plan(path, version=1, parts=4)
    assert isinstance(one_file, TargetPlan) and one_file.parts == 1
    by_name = ApplySpec(keys=("name",))
    apply_changes(tmp_path / "s", rows(change("c", 10, 1, id=1, name="a", body="x")),
                  by_name, app_id="q", version=0)
    apply_changes(tmp_path / "s", rows(change("c", 11, 1, id=2, name="b", body="x")),
                  by_name, app_id="q", version=1)
    strings = _plan(tmp_path / "s", by_name)
    assert isinstance(strings, TargetPlan) and strings.parts == 1


@pytest.mark.parametrize(("sizes", "parts", "cuts"), [
    ([10, 10, 10, 10], 2, (21,)),  # four groups of one file: the middle gap
    ([30, 1, 1, 1], 2, (11,)),  # the big first group is a part alone
    ([10, 10], 4, (11,)),  # no more cuts than gaps
    ([10], 2, ()),
])
def test_cut_points_balance_bytes_between_groups(sizes: list[int], parts: int,
                                                 cuts: tuple[int, ...]) -> None:
    files = [FileRange(i * 10 + 1, i * 10 + 10, size) for i, size in enumerate(sizes)]
    assert cut_points(files, parts) == cuts


def test_cut_points_never_fall_inside_overlapping_files() -> None:
    files = [FileRange(1, 50, 10), FileRange(40, 90, 10), FileRange(91, 100, 10)]
    assert cut_points(files, 2) == (91,)
