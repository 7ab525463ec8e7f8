"""Change rows -> what to write: classify, order, and collapse changes by key.

Everything here is vectorised over Arrow arrays (numpy for the forward fill), because
it runs once per micro-batch on up to millions of rows.

Unchanged TOASTed values (and, with ``ignore_null_updates``, nulls) become per-column
"keep" masks: a true value means "this change does not know the column's value; keep
the current one". Collapsing fills them from the key's previous change in the batch;
what is still unknown after that is taken from the target row by the merge.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads

from tidemark.errors import ConfigError, TidemarkError
from tidemark.lake import change_rows as cr
from tidemark.lake.spec import ApplySpec, ResolvedColumns

log = logging.getLogger(__name__)

#: Working column: true for a delete, false for an upsert.
IS_DELETE = f"{cr.WORK_PREFIX}is_delete"
#: Working column: a row number.
ROW = f"{cr.WORK_PREFIX}row"
#: Working column: a delete that carries the values of the key's upsert before it in the
#: same batch (a soft delete keeps the row's last values: those, not the target's).
CARRIES = f"{cr.WORK_PREFIX}carries"


def from_key_column(index: int) -> str:
    """Name of the working column holding a moved row's old value of key column *index*
    (see :mod:`tidemark.lake.key_moves`); null on rows that did not move."""
    return f"{cr.WORK_PREFIX}from_{index}"


def keep_column(index: int) -> str:
    """Name of the keep mask of the *index*-th kept column (names are data, never SQL)."""
    return f"{cr.WORK_PREFIX}keep_{index}"


@dataclasses.dataclass(frozen=True)
class PreparedBatch:
    """The key-carrying changes of one batch, ready for a writer.

    ``rows`` holds the target's data columns, the sequence columns, :data:`IS_DELETE`
    and one keep mask per entry of ``keep_columns``; ``truncates`` are the sequences of
    the batch's truncates, in order.
    """

    rows: pa.Table
    keep_columns: tuple[str, ...]
    truncates: tuple[tuple[Any, ...], ...]

    def with_rows(self, rows: pa.Table) -> PreparedBatch:
        return dataclasses.replace(self, rows=rows)


class ChangeRowsError(TidemarkError):
    """Change rows that break the contract (a null key, a null sequence value)."""


def _mask(table: pa.Table, expression: pc.Expression,
          setting: str) -> np.ndarray[Any, np.dtype[np.bool_]]:
    # A projection evaluates the expression over the whole table in Arrow's engine.
    try:
        result = pads.dataset(table).to_table(columns={"m": expression}).column("m")
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as err:
        raise ConfigError(setting, f"cannot evaluate {expression} over the change rows "
                                   f"(columns: {', '.join(table.column_names)}): {err}") from err
    return np.asarray(pc.fill_null(result, False).to_numpy(zero_copy_only=False), dtype=bool)


def _unavailable_masks(changes: pa.Table,
                       names: tuple[str, ...]) -> dict[str, np.ndarray[Any, Any]]:
    """For each column named in ``_unavailable`` somewhere: which rows lack its value."""
    if cr.UNAVAILABLE not in changes.column_names:
        return {}
    lists = changes.column(cr.UNAVAILABLE).combine_chunks()
    flat = pc.list_flatten(lists)
    if len(flat) == 0:
        return {}
    parents = pc.list_parent_indices(lists).to_numpy()
    flat_names = np.asarray(flat.to_numpy(zero_copy_only=False), dtype=object)
    masks: dict[str, np.ndarray[Any, Any]] = {}
    for name in set(flat_names.tolist()) & set(names):
        mask = np.zeros(len(changes), dtype=bool)
        mask[parents[flat_names == name]] = True
        masks[name] = mask
    return masks


def prepare_batch(changes: pa.Table, spec: ApplySpec, columns: ResolvedColumns) -> PreparedBatch:
    """Classify *changes* into upserts, deletes and truncates, with keep masks."""
    truncate = _mask(changes, spec.apply_as_truncates, "apply_as_truncates")
    is_delete = _mask(changes, spec.apply_as_deletes, "apply_as_deletes") & ~truncate
    for name in spec.sequence_by:
        if changes.column(name).null_count:
            raise ChangeRowsError(f"sequence column {name!r} holds nulls; every change needs "
                                  "a sequence value")
    truncates: tuple[tuple[Any, ...], ...] = ()
    if truncate.any():
        seq = changes.filter(pa.array(truncate)).select(list(spec.sequence_by))
        ordered = seq.sort_by([(s, "ascending") for s in spec.sequence_by]).to_pylist()
        truncates = tuple(tuple(row[s] for s in spec.sequence_by) for row in ordered)
    keyed = pa.array(~truncate)
    data = [*columns.data, *(s for s in spec.sequence_by if s not in columns.data)]
    rows = changes.filter(keyed).select(data)
    for key in spec.keys:
        if rows.column(key).null_count:
            raise ChangeRowsError(f"key column {key!r} is null in a change that is not a "
                                  "truncate; every insert, update and delete needs its key")
    deletes = is_delete[~truncate]
    masks = _unavailable_masks(changes, columns.data)
    masks = {name: mask[~truncate] & ~deletes for name, mask in masks.items()}
    if spec.ignore_null_updates:
        for name in columns.data:
            if name in spec.keys or name in spec.sequence_by:
                continue
            nulls = np.asarray(rows.column(name).is_null().to_numpy(zero_copy_only=False))
            nulls &= ~deletes
            if nulls.any():
                masks[name] = masks[name] | nulls if name in masks else nulls
    keep = tuple(name for name in columns.data if name in masks and masks[name].any())
    rows = rows.append_column(IS_DELETE, pa.array(deletes))
    for i, name in enumerate(keep):
        rows = rows.append_column(keep_column(i), pa.array(masks[name]))
    if keep:
        unknown = np.logical_or.reduce([masks[name] for name in keep])
        moved = _moved_rows(changes.filter(keyed), deletes, unknown)
        rows = _mark_moves(rows, moved, spec.keys)
    return PreparedBatch(rows=rows, keep_columns=keep, truncates=truncates)


def _moved_rows(changes: pa.Table, is_delete: np.ndarray[Any, Any],
                unknown: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Which of *changes* (in commit order) are the insert of a primary-key change that
    does not know some value (*unknown*): an insert right after a delete at the same
    position of the log. Changes without tidemark's ``_op`` and ``_lsn`` have none."""
    moved = np.zeros(len(changes), dtype=bool)
    if len(changes) < 2 or cr.OP not in changes.column_names \
            or cr.LSN not in changes.column_names:
        return moved
    inserts = np.asarray(pc.fill_null(pc.equal(changes.column(cr.OP), "c"), False)
                         .to_numpy(zero_copy_only=False), dtype=bool)
    lsn = changes.column(cr.LSN)
    same = np.asarray(pc.fill_null(pc.equal(lsn.slice(1), lsn.slice(0, len(lsn) - 1)), False)
                      .to_numpy(zero_copy_only=False), dtype=bool)
    moved[1:] = inserts[1:] & unknown[1:] & is_delete[:-1] & same
    return moved


def _mark_moves(rows: pa.Table, moved: np.ndarray[Any, Any], keys: tuple[str, ...]) -> pa.Table:
    """*rows* with each *moved* row's old key (the row before it: the delete) in the
    :func:`from_key_column` working columns; unchanged when no row moved."""
    if not moved.any():
        return rows
    before = np.flatnonzero(moved) - 1
    positions = np.full(len(rows), -1, dtype=np.int64)
    positions[moved] = np.arange(len(before))
    index = pa.array(positions, mask=positions < 0)
    for i, key in enumerate(keys):
        old = rows.column(key).take(pa.array(before))
        rows = rows.append_column(from_key_column(i), old.take(index))
    return rows


def sequence_after(table: pa.Table, columns: tuple[str, ...],
                   values: tuple[Any, ...]) -> pa.ChunkedArray | pa.Array:
    """Which rows of *table* have a sequence strictly after *values* (lexicographic)."""
    return _compare_sequence(table, columns, values, pc.greater)


def sequence_before(table: pa.Table, columns: tuple[str, ...],
                    values: tuple[Any, ...]) -> pa.ChunkedArray | pa.Array:
    """Which rows of *table* have a sequence strictly before *values* (lexicographic)."""
    return _compare_sequence(table, columns, values, pc.less)


def _compare_sequence(table: pa.Table, columns: tuple[str, ...], values: tuple[Any, ...],
                      strictly: Any) -> pa.ChunkedArray | pa.Array:
    result: Any = pa.array(np.zeros(len(table), dtype=bool))
    equal_so_far: Any = pa.array(np.ones(len(table), dtype=bool))
    for name, value in zip(columns, values, strict=True):
        col = table.column(name)
        bound = pa.scalar(value, type=col.type)
        result = pc.or_(result, pc.and_(equal_so_far, strictly(col, bound)))
        equal_so_far = pc.and_(equal_so_far, pc.equal(col, bound))
    return result


def drop_applied(batch: PreparedBatch, sequence_by: tuple[str, ...],
                 high_water: tuple[Any, ...]) -> tuple[PreparedBatch, int]:
    """Drop the changes below *high_water* (already applied); returns the count.

    Changes *at* the mark are kept: sequences need only be unique per key, and several
    keys' changes may share one (the rows of a COPY or of a snapshot share an LSN in
    Debezium's events), so a batch boundary can fall between changes at the mark. A
    kept change that was in fact applied is harmless: the merge's per-row sequence check
    skips it, and a delete applied twice deletes nothing.
    """
    keep = pc.invert(sequence_before(batch.rows, sequence_by, high_water))
    rows = batch.rows.filter(keep)
    truncates = tuple(t for t in batch.truncates if t >= high_water)
    dropped = len(batch.rows) - len(rows) + len(batch.truncates) - len(truncates)
    return dataclasses.replace(batch, rows=rows, truncates=truncates), dropped


def rows_with_keys(table: pa.Table, keys: pa.Table, key_names: tuple[str, ...]) -> pa.Table:
    """The rows of *table* whose key is among the rows of *keys*.

    Only keys and row numbers go through the join: Arrow's hash join cannot carry
    list or struct columns.
    """
    numbered = table.select(list(key_names)).append_column(
        ROW, pa.array(np.arange(len(table), dtype=np.int64)))
    wanted = keys.select(list(key_names)).group_by(list(key_names)).aggregate([])
    hits = numbered.join(wanted, list(key_names), join_type="left semi").column(ROW)
    return table.take(pa.array(np.sort(hits.to_numpy())))


def run_starts(rows: pa.Table, columns: tuple[str, ...]) -> np.ndarray[Any, Any]:
    """For rows sorted by *columns*: which rows start a new run of equal values."""
    starts = np.ones(len(rows), dtype=bool)
    if len(rows) > 1:
        differs = np.zeros(len(rows) - 1, dtype=bool)
        for name in columns:
            col = rows.column(name)
            ne = pc.not_equal(col.slice(1), col.slice(0, len(rows) - 1))
            differs |= np.asarray(pc.fill_null(ne, True).to_numpy(zero_copy_only=False),
                                  dtype=bool)
        starts[1:] = differs
    return starts


def order_by_key(rows: pa.Table, keys: tuple[str, ...],
                 sequence_by: tuple[str, ...]) -> tuple[pa.Table, np.ndarray[Any, Any]]:
    """*rows* sorted by key then sequence, and a mask of the rows that start a key."""
    order = pc.sort_indices(rows, sort_keys=[(c, "ascending") for c in (*keys, *sequence_by)])
    rows = rows.take(order)
    return rows, run_starts(rows, keys)


def fill_kept_values(rows: pa.Table, starts: np.ndarray[Any, Any],
                     keep_columns: tuple[str, ...]) -> pa.Table:
    """Fill each kept (unknown) value from the key's latest earlier change that knows it.

    *rows* are ordered by key then sequence; *starts* marks each key's first row. A
    value still unknown afterwards keeps its mask set (the target's value is used),
    unless a delete of the key came before it in the batch: a row made again after a
    delete has nothing to keep (neither the delete's before-image nor the target's old
    row), so the value is null.
    """
    if not keep_columns or len(rows) == 0:
        return rows
    positions = np.arange(len(rows))
    group_start = np.maximum.accumulate(np.where(starts, positions, 0))
    if IS_DELETE in rows.column_names:
        deletes = np.asarray(rows.column(IS_DELETE).to_numpy(zero_copy_only=False),
                             dtype=bool)
        last_delete = np.maximum.accumulate(np.where(deletes, positions, -1))
        after_delete = last_delete >= group_start
        floor = np.where(after_delete, last_delete + 1, group_start)
    else:
        after_delete = np.zeros(len(rows), dtype=bool)
        floor = group_start
    for i, name in enumerate(keep_columns):
        mask_name = keep_column(i)
        keep = np.asarray(rows.column(mask_name).to_numpy(zero_copy_only=False), dtype=bool)
        if not keep.any():
            continue
        source = np.maximum.accumulate(np.where(~keep, positions, -1))
        known = source >= floor  # an earlier change of the same row knows it
        take_from = np.where(keep & known, source, positions)
        index = rows.schema.get_field_index(name)
        values = rows.column(name).take(pa.array(take_from))
        unknown_new = keep & ~known & after_delete
        if unknown_new.any():
            values = pc.if_else(pa.array(unknown_new), pa.scalar(None, values.type), values)
        rows = rows.set_column(index, name, values)
        mask_index = rows.schema.get_field_index(mask_name)
        rows = rows.set_column(mask_index, mask_name, pa.array(keep & ~known & ~after_delete))
    return rows


def collapse_to_latest(batch: PreparedBatch, keys: tuple[str, ...],
                       sequence_by: tuple[str, ...], *,
                       carry_into_deletes: bool = False) -> PreparedBatch:
    """One change per key: the latest by sequence, with kept values filled in-batch.

    A delete followed by an insert of the same key collapses to the insert (the final
    state); a primary-key change is a delete of one key and an insert of another. With
    *carry_into_deletes* (soft deletes), a delete right after an upsert of its key takes
    that upsert's values and is marked in :data:`CARRIES`.
    """
    if len(batch.rows) == 0:
        if carry_into_deletes and CARRIES not in batch.rows.column_names:
            return batch.with_rows(batch.rows.append_column(CARRIES, pa.array([], pa.bool_())))
        return batch
    rows, starts = order_by_key(batch.rows, keys, sequence_by)
    rows = fill_kept_values(rows, starts, batch.keep_columns)
    last = np.append(starts[1:], True)
    if carry_into_deletes:
        rows = _carry_into_deletes(rows, starts, keys, sequence_by)
    return batch.with_rows(rows.filter(pa.array(last)))


def _carry_into_deletes(rows: pa.Table, starts: np.ndarray[Any, Any], keys: tuple[str, ...],
                        sequence_by: tuple[str, ...]) -> pa.Table:
    """*rows* (ordered by key then sequence) where each delete that follows an upsert of
    its key takes that upsert's values (keep masks included), with :data:`CARRIES`."""
    deletes = np.asarray(rows.column(IS_DELETE).to_numpy(zero_copy_only=False), dtype=bool)
    carries = np.zeros(len(rows), dtype=bool)
    carries[1:] = deletes[1:] & ~starts[1:] & ~deletes[:-1]
    if carries.any():
        take_from = np.arange(len(rows))
        take_from[carries] -= 1
        index = pa.array(take_from)
        fixed = {*keys, *sequence_by, IS_DELETE}
        for name in rows.column_names:
            if name in fixed or name.startswith(f"{cr.WORK_PREFIX}from_"):
                continue
            at = rows.schema.get_field_index(name)
            rows = rows.set_column(at, name, rows.column(name).take(index))
    return rows.append_column(CARRIES, pa.array(carries))
