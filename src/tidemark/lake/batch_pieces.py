"""Cutting a batch's pieces again where a piece boundary must not fall: inside one
transaction of an SCD2 target, between a key change's delete and its insert."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import pyarrow as pa
import pyarrow.compute as pc

from tidemark.lake import change_rows as cr


def taken(pieces: list[pa.Table]) -> Iterator[pa.Table]:
    """The items of *pieces*, each removed from the list as it is handed out."""
    while pieces:
        yield pieces.pop(0)


def whole_versions(pieces: Iterable[pa.Table], column: str) -> Iterable[pa.Table]:
    """*pieces* cut again so that no value of *column* (in commit order, so its rows are
    contiguous) spans two pieces: each piece's last value moves on to the next."""
    carry: pa.Table | None = None
    for piece in pieces:
        rows = piece if carry is None else pa.concat_tables([carry, piece])
        if not len(rows):
            continue
        values = rows.column(column)
        tail = pc.index(values, values[-1]).as_py()
        if tail > 0:
            yield rows.slice(0, tail)
        carry = rows.slice(tail)
    if carry is not None and len(carry):
        yield carry


def whole_key_changes(pieces: Iterable[pa.Table]) -> Iterable[pa.Table]:
    """*pieces* cut again so that a primary-key change (a delete, then an insert at the
    same position) is never split: a piece's last row, when a delete, moves on to the
    next piece, whose insert may need the values of the key it deleted."""
    carry: pa.Table | None = None
    for piece in pieces:
        rows = piece if carry is None else pa.concat_tables([carry, piece])
        carry = None
        if len(rows) and cr.OP in rows.column_names and rows.column(cr.OP)[-1].as_py() == "d":
            rows, carry = rows.slice(0, len(rows) - 1), rows.slice(len(rows) - 1)
        if len(rows):
            yield rows
    if carry is not None:
        yield carry
