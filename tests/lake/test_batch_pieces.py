"""Cutting a batch's pieces again (``tidemark.lake.batch_pieces``): a key change or an
SCD2 version never spans two pieces; and a batch given in one piece is applied in one
step (``apply_changes_in_steps``), not cut."""

from __future__ import annotations

import logging
from pathlib import Path

import pyarrow as pa
import pytest

from lake_helpers import change, read, rows
from tidemark.lake import ApplySpec, apply_changes_in_steps
from tidemark.lake import change_rows as cr
from tidemark.lake.batch_pieces import whole_key_changes, whole_versions


def _ops(*ops: str) -> pa.Table:
    return pa.table({cr.OP: list(ops), "id": list(range(len(ops)))})


def _cut(pieces: list[pa.Table]) -> list[list[str]]:
    return [p.column(cr.OP).to_pylist() for p in whole_key_changes(iter(pieces))]


def test_a_delete_ending_a_piece_moves_to_the_next() -> None:
    assert _cut([_ops("c", "d"), _ops("c", "u")]) == [["c"], ["d", "c", "u"]]
    assert _cut([_ops("d"), _ops("d"), _ops("c")]) == [["d"], ["d", "c"]]


def _versions(pieces: list[list[int]]) -> list[list[int]]:
    tables = [pa.table({"v": p}) for p in pieces]
    return [t.column("v").to_pylist() for t in whole_versions(iter(tables), "v")]


def test_a_version_spanning_pieces_is_kept_whole() -> None:
    assert _versions([[1, 2, 2], [2, 3], [3, 3]]) == [[1], [2, 2, 2], [3, 3, 3]]
    assert _versions([[1, 1], [1], [1, 2]]) == [[1, 1, 1, 1], [2]]


@pytest.mark.parametrize("scd", [1, 2])
def test_a_batch_in_one_piece_is_applied_in_one_step(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, scd: int) -> None:
    # Every transaction of the soak ends in deletes: each batch was cut before its last
    # delete (SCD2: before its last transaction) and applied in two steps.
    spec = ApplySpec(keys=("id",), stored_as_scd_type=scd)
    path = tmp_path / "t"
    apply_changes_in_steps(path, iter([rows(*[change("c", 10, i, id=i, name="a", body="x")
                                              for i in range(1, 6)])]),
                           spec, app_id="q", version=0)
    batch = [change("u", 20, 1, id=1, name="b", body="y"), change("d", 30, 1, id=2),
             change("c", 40, 1, id=9, name="c", body="z"), change("d", 40, 2, id=3)]
    with caplog.at_level(logging.INFO, logger="tidemark.lake.delta_writer"):
        result = apply_changes_in_steps(path, iter([rows(*batch)]), spec, app_id="q",
                                        version=1)
    assert "steps" not in caplog.text
    if scd == 1:
        assert result.deleted == 2
        assert read(path, "id", "name") == [{"id": 1, "name": "b"}, {"id": 4, "name": "a"},
                                            {"id": 5, "name": "a"}, {"id": 9, "name": "c"}]
