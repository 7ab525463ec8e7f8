"""Primary-key changes: the values a moved row did not carry come from its old key.

A primary-key change is a delete of the old key then an insert of the new one, at one
position in the source's log. PostgreSQL sends an unchanged TOASTed value as
"unchanged" even then, so the insert does not know it; the row held it under the old
key, in the target or in an earlier change of the batch.
:func:`tidemark.lake.collapse.prepare_batch` finds such inserts while the pair is still
side by side and records the old key in working columns; :func:`carry_moved_values`
fills their unknown values from the old key's state just before its delete, following
chains of moves (1 -> 3 -> 5) in sequence order. Only the keys involved in moves are
walked, in Python: a batch without moves with unknown values pays nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from tidemark.lake.collapse import (
    IS_DELETE,
    ROW,
    PreparedBatch,
    from_key_column,
    keep_column,
    rows_with_keys,
)

log = logging.getLogger(__name__)

#: Reads the target's current rows of the keys in a table (the key columns and the
#: kept columns, cast to the batch's types).
TargetRows = Callable[[pa.Table], pa.Table]


def carry_moved_values(batch: PreparedBatch, keys: tuple[str, ...],
                       sequence_by: tuple[str, ...], target_rows: TargetRows,
                       uri: str) -> PreparedBatch:
    """*batch* with the unknown values of moved rows filled from their old key (see
    the module docstring), without the old keys' working columns. A
    value the old key has nowhere (not in the batch, not in the target) is null, with
    a warning."""
    rows = batch.rows
    if from_key_column(0) not in rows.column_names:
        return batch
    from_names = [from_key_column(i) for i in range(len(keys))]
    moved = np.asarray(rows.column(from_names[0]).is_valid().to_numpy(zero_copy_only=False),
                       dtype=bool)
    involved_keys = pa.concat_tables([
        rows.filter(pa.array(moved)).select(from_names).rename_columns(list(keys)),
        rows.filter(pa.array(moved)).select(list(keys))])
    numbered = rows.append_column(ROW, pa.array(np.arange(len(rows), dtype=np.int64)))
    involved = rows_with_keys(numbered, involved_keys, keys).sort_by(
        [(s, "ascending") for s in sequence_by])
    index = involved.column(ROW).to_pylist()
    key_of = list(zip(*(involved.column(k).to_pylist() for k in keys), strict=True))
    from_of = list(zip(*(involved.column(f).to_pylist() for f in from_names), strict=True))
    deletes = involved.column(IS_DELETE).to_pylist()
    masks = [involved.column(keep_column(i)).to_pylist()
             for i in range(len(batch.keep_columns))]
    # A key's state: per kept column, where its value is: ("row", n), ("target", key),
    # or None (no value: the key was deleted, or made again after a delete).
    state: dict[tuple[Any, ...], list[tuple[str, Any] | None]] = {}
    before_delete: dict[tuple[Any, ...], list[tuple[str, Any] | None]] = {}
    resolved: dict[int, list[tuple[str, Any] | None]] = {}
    width = len(batch.keep_columns)
    for j, n in enumerate(index):
        key = key_of[j]
        if deletes[j]:
            before_delete[key] = state.get(key, [("target", key)] * width)
            state[key] = [None] * width
            continue
        origin = from_of[j]
        if origin[0] is not None:
            base = before_delete.get(origin, [("target", origin)] * width)
        else:
            base = state.get(key, [("target", key)] * width)
        now = [base[c] if masks[c][j] else ("row", n) for c in range(width)]
        state[key] = now
        if origin[0] is not None:
            resolved[n] = now
    rows = _fill(rows, batch.keep_columns, resolved, keys, target_rows, uri)
    return batch.with_rows(rows.drop_columns(from_names))


def _fill(rows: pa.Table, kept: tuple[str, ...],
          resolved: dict[int, list[tuple[str, Any] | None]], keys: tuple[str, ...],
          target_rows: TargetRows, uri: str) -> pa.Table:
    wanted = sorted({ref[1] for refs in resolved.values() for ref in refs
                     if ref is not None and ref[0] == "target"})
    target = target_rows(pa.Table.from_pylist(
        [dict(zip(keys, key, strict=True)) for key in wanted],
        schema=pa.schema([rows.schema.field(k) for k in keys]))) if wanted else None
    at: dict[tuple[Any, ...], int] = {}
    if target is not None:
        at = {key: i for i, key in enumerate(zip(
            *(target.column(k).to_pylist() for k in keys), strict=True))}
    n = len(rows)
    for c, name in enumerate(kept):
        mask_name = keep_column(c)
        take = np.arange(n, dtype=np.int64)
        nulls = np.zeros(n, dtype=bool)
        mask = np.asarray(rows.column(mask_name).to_numpy(zero_copy_only=False), dtype=bool)
        lost = 0
        for row, refs in resolved.items():
            ref = refs[c]
            if not mask[row]:
                continue
            mask[row] = False
            if ref is not None and ref[0] == "row":
                take[row] = ref[1]
            elif ref is not None and ref[1] in at:
                take[row] = n + at[ref[1]]
            else:
                nulls[row] = True
                lost += ref is not None  # an old key deleted before its move had none
        if lost:
            log.warning("%s: column %r of %d row(s) whose key changed was not sent "
                        "(unchanged TOASTed value) and the target has no row under the "
                        "old key to take it from; writing null", uri, name, lost)
        column = rows.column(name)
        pool = column if target is None else pa.chunked_array(
            [*column.chunks, *target.column(name).cast(column.type).chunks], column.type)
        values = pool.take(pa.array(take, mask=nulls))
        rows = rows.set_column(rows.schema.get_field_index(name), name, values)
        rows = rows.set_column(rows.schema.get_field_index(mask_name), mask_name,
                               pa.array(mask))
    return rows
