"""apply_changes, SCD type 2: versions per transaction, tracked columns, deletes,
truncates, TOAST, idempotence."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from lake_helpers import change, read, rows
from tidemark.lake import ApplySpec, apply_changes

SPEC = ApplySpec(keys=("id",), stored_as_scd_type=2)
COLS = ("id", "name", "body", "__START_AT", "__END_AT")


def apply(path: Path, batch: pa.Table, version: int, spec: ApplySpec = SPEC, app: str = "q"):
    return apply_changes(path, batch, spec, app_id=app, version=version)


def history(path: Path) -> list[tuple[object, ...]]:
    return [tuple(r.values()) for r in read(path, *COLS, sort=("id", "__START_AT"))]


def test_each_transaction_makes_one_version_and_delete_closes(tmp_path: Path) -> None:
    path = tmp_path / "t"
    result = apply(path, rows(change("c", 10, 1, id=1, name="a", body="x"),
                              change("u", 10, 2, id=1, name="a2", body="x"),  # same transaction
                              change("c", 10, 3, id=2, name="b", body="y")), 0)
    assert (result.inserted, result.superseded) == (2, 1)
    apply(path, rows(change("u", 11, id=1, name="A", body="x"),
                     change("d", 12, id=2),
                     change("u", 13, id=1, name="AA", body="x")), 1)
    assert history(path) == [
        (1, "a2", "x", 10, 11), (1, "A", "x", 11, 13), (1, "AA", "x", 13, None),
        (2, "b", "y", 10, 12)]


def test_start_and_end_have_the_sequence_type(tmp_path: Path) -> None:
    path = tmp_path / "t"
    apply(path, rows(change("c", 10, id=1, name="a")), 0)
    table = read(path)
    assert set(table[0]) == {"id", "name", "body", "__START_AT", "__END_AT"}


def test_insert_and_delete_in_one_transaction_leave_no_version(tmp_path: Path) -> None:
    path = tmp_path / "t"
    apply(path, rows(change("c", 10, 1, id=1, name="a"), change("d", 10, 2, id=1),
                     change("c", 10, 3, id=2, name="b")), 0)
    assert [r[0] for r in history(path)] == [2]


def test_untracked_columns_update_the_current_version_in_place(tmp_path: Path) -> None:
    path = tmp_path / "t"
    spec = ApplySpec(keys=("id",), stored_as_scd_type=2, track_history_except_column_list=("body",))
    apply(path, rows(change("c", 10, id=1, name="a", body="x")), 0, spec)
    apply(path, rows(change("u", 11, id=1, name="a", body="y")), 1, spec)
    apply(path, rows(change("u", 12, id=1, name="b", body="y")), 2, spec)
    assert history(path) == [(1, "a", "y", 10, 12), (1, "b", "y", 12, None)]
    only = ApplySpec(keys=("id",), stored_as_scd_type=2, track_history_column_list=("name",))
    apply(tmp_path / "u", rows(change("c", 10, id=1, name="a", body="x")), 0, only)
    apply(tmp_path / "u", rows(change("u", 11, id=1, name="a", body="z")), 1, only)
    assert history(tmp_path / "u") == [(1, "a", "z", 10, None)]


def test_truncate_closes_every_current_version(tmp_path: Path) -> None:
    path = tmp_path / "t"
    apply(path, rows(change("c", 10, 1, id=1, name="a"), change("c", 10, 2, id=2, name="b")), 0)
    apply(path, rows(change("u", 11, id=1, name="A"), change("t", 12),
                     change("c", 13, id=3, name="c")), 1)
    assert history(path) == [(1, "a", None, 10, 11), (1, "A", None, 11, 12),
                             (2, "b", None, 10, 12), (3, "c", None, 13, None)]


def test_unchanged_toast_value_is_copied_from_the_current_version(tmp_path: Path) -> None:
    path = tmp_path / "t"
    apply(path, rows(change("c", 10, id=1, name="a", body="big")), 0)
    apply(path, rows(change("u", 11, id=1, name="b", unavailable=("body",))), 1)
    assert history(path) == [(1, "a", "big", 10, 11), (1, "b", "big", 11, None)]


def test_replays_and_older_changes_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "t"
    first = rows(change("c", 10, id=1, name="a"))
    apply(path, first, 0)
    apply(path, rows(change("d", 11, id=1)), 1)
    assert apply(path, first, 0).already_applied
    # Another app id, unordered: the closed version is the key's tombstone.
    spec = ApplySpec(keys=("id",), stored_as_scd_type=2, ordered_batches=False)
    result = apply(path, first, 0, spec, app="other")
    assert result.skipped == 1
    assert history(path) == [(1, "a", None, 10, 11)]


def test_a_primary_key_change_moves_the_row(tmp_path: Path) -> None:
    path = tmp_path / "t"
    apply(path, rows(change("c", 10, id=1, name="a")), 0)
    apply(path, rows(change("d", 11, 1, id=1), change("c", 11, 2, id=5, name="a")), 1)
    assert history(path) == [(1, "a", None, 10, 11), (5, "a", None, 11, None)]


def test_a_transaction_that_changes_a_row_back_makes_no_version(tmp_path: Path) -> None:
    path = tmp_path / "t"
    apply(path, rows(change("c", 10, id=1, name="a", body="x")), 0)
    apply(path, rows(change("u", 11, 1, id=1, name="b", body="x"),
                     change("u", 11, 2, id=1, name="a", body="x")), 1)
    assert history(path) == [(1, "a", "x", 10, None)]


def test_list_columns_and_composite_keys(tmp_path: Path) -> None:
    table = pa.schema([pa.field("a", pa.int64()), pa.field("b", pa.string()),
                       pa.field("tags", pa.list_(pa.string())),
                       pa.field("doc", pa.struct([pa.field("x", pa.int64())]))])
    path = tmp_path / "t"
    spec = ApplySpec(keys=("a", "b"), stored_as_scd_type=2)
    apply(path, rows(change("c", 10, a=1, b="x", tags=["p"], doc={"x": 1}),
                     change("c", 10, 2, a=1, b="y", tags=[], doc=None), table=table), 0, spec)
    apply(path, rows(change("u", 11, a=1, b="x", unavailable=("tags",), doc={"x": 2}),
                     change("u", 12, a=1, b="x", tags=["q"], doc={"x": 2}),
                     change("u", 12, 2, a=1, b="y", tags=[], doc={"x": 3}), table=table), 1, spec)
    got = read(path, "a", "b", "tags", "doc", "__START_AT", "__END_AT",
               sort=("a", "b", "__START_AT"))
    assert [tuple(r.values()) for r in got] == [
        (1, "x", ["p"], {"x": 1}, 10, 11), (1, "x", ["p"], {"x": 2}, 11, 12),
        (1, "x", ["q"], {"x": 2}, 12, None),
        (1, "y", [], None, 10, 12), (1, "y", [], {"x": 3}, 12, None)]
