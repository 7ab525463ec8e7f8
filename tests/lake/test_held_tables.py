"""The Delta table kept open between batches (tidemark.lake.held_tables): the next batch
takes it instead of opening the table, sees every other writer's commits, and a table
made again at the same path is opened afresh."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from lake_helpers import change, read, rows
from tidemark.lake import (
    ApplySpec,
    apply_changes,
    delta_target,
    delta_writer,
    held_tables,
    merge_on_read,
)
from tidemark.lake.held_tables import HELD, HeldTables

SPEC = ApplySpec(keys=("id",))


def apply(path: Path, batch: pa.Table, version: int, app: str = "q"):
    return apply_changes(path, batch, SPEC, app_id=app, version=version)


def one(commit: int, key: int, name: str, op: str = "c") -> pa.Table:
    return rows(change(op, commit, id=key, name=name, body="x"))


@contextlib.contextmanager
def other_process(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Apply as another process would: with tables held apart from this one's."""
    apart = HeldTables()
    with monkeypatch.context() as scope:
        scope.setattr(delta_target, "HELD", apart)
        scope.setattr(delta_writer, "HELD", apart)
        scope.setattr(merge_on_read, "TARGETS", merge_on_read._Targets())
        yield


def held(path: Path) -> DeltaTable | None:
    """The table held for *path* (held again after the look)."""
    table = HELD.take(str(path), None)
    if table is not None:
        HELD.give_back(str(path), None, table)
    return table


def test_the_next_batch_takes_the_table_the_last_one_left(tmp_path: Path) -> None:
    path = tmp_path / "t"
    apply(path, one(10, 1, "a"), 0)
    left = held(path)
    assert left is not None
    apply(path, one(11, 2, "b"), 1)
    taken = HELD.take(str(path), None)
    assert taken is left
    assert taken.version() == DeltaTable(str(path)).version()
    assert read(path, "id", "name") == [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}]


def test_a_held_table_sees_the_batches_another_process_applied(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "t"
    apply(path, one(10, 1, "a"), 0)
    assert held(path) is not None
    with other_process(monkeypatch):
        assert not apply(path, one(11, 1, "b", op="u"), 1).already_applied
    # Batch 1 again here (a replay after a restart): the held table must know the other
    # process's commit, or the replay is merged a second time.
    again = apply(path, one(11, 1, "b", op="u"), 1)
    assert again.already_applied
    assert again.delta_version == DeltaTable(str(path)).version()
    apply(path, one(12, 2, "c"), 2)
    assert read(path, "id", "name") == [{"id": 1, "name": "b"}, {"id": 2, "name": "c"}]


@pytest.mark.parametrize("again", [1, 3, 5], ids=["fewer", "as-many", "more"])
def test_a_table_made_again_at_the_same_path_is_opened_afresh(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, again: int) -> None:
    path = tmp_path / "t"
    for version, key in enumerate((1, 2, 3)):
        apply(path, one(10 + version, key, f"old-{key}"), version)
    old = held(path)
    assert old is not None and old.version() == 3
    shutil.rmtree(path)
    with other_process(monkeypatch):  # a new table, with fewer, as many or more versions
        for version in range(again):
            apply(path, one(20 + version, 10 + version, "new"), version, app="other")
    assert DeltaTable(str(path)).version() == again
    # An update of the new table's first row: found in the new table, not the old.
    apply(path, rows(change("c", 30, id=9, name="newest", body="x"),
                     change("u", 30, 2, id=10, name="updated", body="x")), again, app="other")
    assert read(path, "id", "name") == [{"id": 9, "name": "newest"},
                                        {"id": 10, "name": "updated"}] + [
        {"id": 10 + version, "name": "new"} for version in range(1, again)]
    versions = sorted(int(p.name.split(".")[0]) for p in (path / "_delta_log").glob("*.json"))
    assert versions == list(range(again + 2))


def test_a_held_table_whose_commit_changed_is_not_trusted(tmp_path: Path) -> None:
    path = tmp_path / "t"
    apply(path, one(10, 1, "a"), 0)
    table = held(path)
    assert table is not None
    commit = path / "_delta_log" / f"{table.version():020d}.json"
    copy = commit.with_suffix(".copy")
    shutil.copy(commit, copy)
    copy.replace(commit)  # same bytes, another file: the log was rewritten under it
    assert HELD.take(str(path), None) is None


def test_only_the_latest_tables_are_held(tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(held_tables, "_HELD_MAX", 2)
    held = HeldTables()
    paths = [tmp_path / name for name in "abc"]
    for path in paths:
        apply(path, one(10, 1, "a"), 0)
        held.give_back(str(path), None, DeltaTable(str(path)))
    assert held.take(str(paths[0]), None) is None
    assert held.take(str(paths[1]), None) is not None
    assert held.take(str(paths[2]), None) is not None
