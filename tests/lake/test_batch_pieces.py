"""Cutting a batch's pieces again (``tidemark.lake.batch_pieces``): a key change or an
SCD2 version never spans two pieces, and a batch given in one piece stays one."""

from __future__ import annotations

import pyarrow as pa

from tidemark.lake import change_rows as cr
from tidemark.lake.batch_pieces import whole_key_changes, whole_versions


def _ops(*ops: str) -> pa.Table:
    return pa.table({cr.OP: list(ops), "id": list(range(len(ops)))})


def _cut(pieces: list[pa.Table]) -> list[list[str]]:
    return [p.column(cr.OP).to_pylist() for p in whole_key_changes(iter(pieces))]


def test_one_piece_ending_in_a_delete_stays_one() -> None:
    # Every transaction of the soak ends in deletes: such batches were applied in two
    # steps, the second a single delete.
    assert _cut([_ops("c", "u", "d")]) == [["c", "u", "d"]]


def test_a_delete_ending_a_piece_moves_to_the_next() -> None:
    assert _cut([_ops("c", "d"), _ops("c", "u")]) == [["c"], ["d", "c", "u"]]


def test_the_last_piece_keeps_its_delete() -> None:
    assert _cut([_ops("c", "d"), _ops("u", "d")]) == [["c"], ["d", "u", "d"]]


def test_a_piece_of_one_delete_moves_to_the_next() -> None:
    assert _cut([_ops("d"), _ops("d"), _ops("c")]) == [["d"], ["d", "c"]]


def _versions(pieces: list[list[int]]) -> list[list[int]]:
    tables = [pa.table({"v": p}) for p in pieces]
    return [t.column("v").to_pylist() for t in whole_versions(iter(tables), "v")]


def test_one_piece_of_versions_stays_one() -> None:
    assert _versions([[1, 1, 2, 2]]) == [[1, 1, 2, 2]]


def test_a_version_spanning_pieces_is_kept_whole() -> None:
    assert _versions([[1, 2, 2], [2, 3], [3, 3]]) == [[1], [2, 2, 2], [3, 3, 3]]


def test_a_piece_of_one_version_joins_the_next() -> None:
    assert _versions([[1, 1], [1], [1, 2]]) == [[1, 1, 1, 1, 2]]
