"""apply_changes: a primary-key change keeps the values it did not carry (unchanged
TOASTed values), taken from the old key, for SCD type 1 and 2, whole or in steps."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from lake_helpers import change, read, rows
from tidemark.lake import ApplySpec, apply_changes
from tidemark.lake.delta_writer import apply_changes_in_steps

SCD1 = ApplySpec(keys=("id",))
SCD2 = ApplySpec(keys=("id",), stored_as_scd_type=2)
BIG = "x" * 5000


def _move(commit_lsn: int, seq: int, old: int, new: int, **values: Any) -> list[dict[str, Any]]:
    """A primary-key change as the sources give it: a delete of the old key, then an
    insert of the new one at the same log position, the TOASTed body not sent."""
    gone = change("d", commit_lsn, seq, id=old)
    made = change("c", commit_lsn, seq + 1, unavailable=("body",), id=new, **values)
    made["_lsn"] = gone["_lsn"]
    return [gone, made]


def _current(path: Path, spec: ApplySpec) -> list[dict[str, Any]]:
    found = read(path, "id", "name", "body", *(("__END_AT",) if spec is SCD2 else ()))
    return [{k: v for k, v in r.items() if k != "__END_AT"} for r in found
            if r.get("__END_AT") is None]


@pytest.mark.parametrize("spec", [SCD1, SCD2], ids=["scd1", "scd2"])
def test_a_key_change_keeps_an_unchanged_toasted_value_from_the_target(
        spec: ApplySpec, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "t"
    apply_changes(path, rows(change("c", 10, 1, id=1, name="a", body=BIG),
                             change("c", 10, 2, id=2, name="b", body="small")),
                  spec, app_id="q", version=0)
    with caplog.at_level(logging.WARNING):
        apply_changes(path, rows(*_move(11, 1, 1, 3, name="a")), spec, app_id="q", version=1)
    assert _current(path, spec) == [{"id": 2, "name": "b", "body": "small"},
                                    {"id": 3, "name": "a", "body": BIG}]
    assert "writing null" not in caplog.text


@pytest.mark.parametrize("spec", [SCD1, SCD2], ids=["scd1", "scd2"])
def test_chained_key_changes_in_one_batch_take_the_latest_value_of_the_first_key(
        spec: ApplySpec, tmp_path: Path) -> None:
    path = tmp_path / "t"
    apply_changes(path, rows(change("c", 10, 1, id=1, name="a", body="old"),
                             change("c", 10, 2, id=7, name="z", body="seven")),
                  spec, app_id="q", version=0)
    # 1 gets a new body, then moves to 3 and on to 5; 7 moves to 1 (a key freed in the
    # batch), which must not take the first 1's body.
    batch = rows(change("u", 11, 1, id=1, name="a", body="new"),
                 *_move(12, 1, 1, 3, name="a"), *_move(13, 1, 3, 5, name="a"),
                 *_move(14, 1, 7, 1, name="z"))
    apply_changes(path, batch, spec, app_id="q", version=1)
    assert _current(path, spec) == [{"id": 1, "name": "z", "body": "seven"},
                                    {"id": 5, "name": "a", "body": "new"}]


@pytest.mark.parametrize("spec", [SCD1, SCD2], ids=["scd1", "scd2"])
def test_a_key_change_split_between_two_steps_keeps_the_value(
        spec: ApplySpec, tmp_path: Path) -> None:
    path = tmp_path / "t"
    apply_changes(path, rows(change("c", 10, 1, id=1, name="a", body=BIG)), spec,
                  app_id="q", version=0)
    gone, made = _move(11, 2, 1, 3, name="a")
    pieces = [rows(change("c", 11, 1, id=8, name="h", body="e"), gone),
              rows(made, change("c", 12, 1, id=9, name="i", body="f"))]
    apply_changes_in_steps(path, iter(pieces), spec, app_id="q", version=1)
    assert _current(path, spec) == [{"id": 3, "name": "a", "body": BIG},
                                    {"id": 8, "name": "h", "body": "e"},
                                    {"id": 9, "name": "i", "body": "f"}]


def test_a_key_change_from_a_key_the_target_lacks_is_null_with_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "t"
    apply_changes(path, rows(change("c", 10, 1, id=2, name="b", body="y")), SCD1,
                  app_id="q", version=0)
    with caplog.at_level(logging.WARNING):
        apply_changes(path, rows(*_move(11, 1, 1, 3, name="a")), SCD1, app_id="q",
                      version=1)
    assert read(path, "id", "body") == [{"id": 2, "body": "y"}, {"id": 3, "body": None}]
    assert "column 'body' of 1 row(s) whose key changed" in caplog.text


def test_an_insert_after_a_delete_at_another_position_is_no_key_change(
        tmp_path: Path) -> None:
    """Only a delete at the same position makes a pair: a later insert of another key
    with an unknown value has nothing to take (null), never the deleted row's."""
    path = tmp_path / "t"
    apply_changes(path, rows(change("c", 10, 1, id=1, name="a", body="one")), SCD1,
                  app_id="q", version=0)
    made = change("c", 11, 2, unavailable=("body",), id=3, name="c")
    apply_changes(path, rows(change("d", 11, 1, id=1), made), SCD1, app_id="q", version=1)
    assert read(path, "id", "body") == [{"id": 3, "body": None}]
