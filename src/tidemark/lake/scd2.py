"""SCD type 2: fold a batch of changes into versions of rows.

A version is the state of a key between two sequence values: ``__START_AT`` holds the
value of the first ``sequence_by`` column of the change that produced it (for the
default sequence, the commit LSN of its transaction), ``__END_AT`` that of the change
that replaced or deleted it, and is null on the current version. Changes that share
the first sequence value (the changes of one transaction, by default) make a single
version: the states in between were never visible outside the transaction.

A change that only touches columns outside the tracked history columns updates the
current version in place. A key's latest version, open or closed, also serves as its
tombstone: a change at or before it has already been applied and is skipped.

The output is the merge source: new versions (``MERGE_START`` null: inserted) and
changed existing versions (``MERGE_START`` = their ``__START_AT``: updated). Keys with
one version's worth of changes in the batch — nearly all of them in practice — are
planned with vectorised Arrow operations; keys with several, and batches with a
truncate, go through a per-change Python fold.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tidemark.lake import change_rows as cr
from tidemark.lake.collapse import (
    IS_DELETE,
    ROW,
    PreparedBatch,
    fill_kept_values,
    keep_column,
    order_by_key,
    rows_with_keys,
    run_starts,
)
from tidemark.lake.spec import ApplySpec, ResolvedColumns

log = logging.getLogger(__name__)

#: Working column of the merge source: the ``__START_AT`` of the target version a row
#: replaces, null for a new version.
MERGE_START = f"{cr.WORK_PREFIX}merge_start"


@dataclasses.dataclass(frozen=True)
class VersionPlan:
    """The merge source rows, how many changes were skipped as already applied, the
    kept columns that had no value anywhere (left null), and how many changes were
    folded into a later change of the same key and version value."""

    rows: pa.Table
    skipped: int
    unknown_kept: frozenset[str]
    superseded: int = 0


def latest_versions(versions: pa.Table, keys: tuple[str, ...]) -> pa.Table:
    """Each key's latest version (highest ``__START_AT``) among *versions*."""
    if len(versions) == 0:
        return versions
    ordered, starts = order_by_key(versions, keys, (cr.START_AT,))
    return ordered.filter(pa.array(_run_ends(starts)))


def _run_ends(starts: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Which rows end a run, given which rows start one."""
    return np.append(starts[1:], True) if len(starts) else starts


def plan_versions(batch: PreparedBatch, spec: ApplySpec, columns: ResolvedColumns,
                  latest: pa.Table, schema: pa.Schema) -> VersionPlan:
    """Plan the merge source of *schema* for *batch* over *latest* (each batch key's
    latest target version: the data columns, ``__START_AT`` and ``__END_AT``)."""
    keys, seq, at = spec.keys, spec.sequence_by, spec.version_column
    rows, starts = order_by_key(batch.rows, keys, seq)
    rows = fill_kept_values(rows, starts, batch.keep_columns)
    # One change per key and version value: the last one (its kept values are filled).
    last = _run_ends(run_starts(rows, (*keys, at)))
    collapsed = len(rows) - int(last.sum())
    rows = rows.filter(pa.array(last))
    starts = run_starts(rows, keys)
    single = starts & _run_ends(starts)
    if batch.truncates:
        single[:] = False
    vector = _plan_single_changes(rows.filter(pa.array(single)), spec, columns, latest, schema,
                                  batch.keep_columns)
    folded = rows.filter(pa.array(~single))
    fold = _fold(folded, spec, columns, latest, batch)
    table = pa.concat_tables([vector.rows, pa.Table.from_pylist(fold.rows, schema=schema)])
    log.debug("SCD2 plan: %d vectorised, %d folded, %d collapsed in-version", int(single.sum()),
              len(folded), collapsed)
    return VersionPlan(rows=table, skipped=vector.skipped + fold.skipped,
                       unknown_kept=vector.unknown_kept | fold.unknown_kept,
                       superseded=collapsed)


# -- vectorised: keys with a single version's worth of changes ------------------------------
def _null_aware_equal(left: pa.ChunkedArray, right: pa.ChunkedArray) -> np.ndarray[Any, Any]:
    if pa.types.is_nested(left.type):  # Arrow has no equality kernel for nested types
        return np.array([a == b for a, b in zip(left.to_pylist(), right.to_pylist(),
                                                strict=True)], dtype=bool)
    equal = pc.fill_null(pc.equal(left, right), False)
    both_null = pc.and_(pc.is_null(left), pc.is_null(right))
    return np.asarray(pc.or_(equal, both_null).to_numpy(zero_copy_only=False), dtype=bool)


def _bool(values: Any) -> np.ndarray[Any, Any]:
    return np.asarray(pc.fill_null(values, False).to_numpy(zero_copy_only=False), dtype=bool)


def _plan_single_changes(rows: pa.Table, spec: ApplySpec, columns: ResolvedColumns,
                         latest: pa.Table, schema: pa.Schema,
                         keep_columns: tuple[str, ...]) -> VersionPlan:
    keys, at = spec.keys, spec.version_column
    if len(rows) == 0:
        return VersionPlan(schema.empty_table(), 0, frozenset())
    # Pair each change with its key's latest version through row numbers, so that only
    # the keys go through the join.
    left = rows.select(list(keys)).append_column(ROW, pa.array(np.arange(len(rows))))
    right = latest.select(list(keys)).append_column(
        f"{ROW}_t", pa.array(np.arange(len(latest)), pa.int64()))
    pairs = left.join(right, list(keys), join_type="left outer").sort_by(ROW)
    target_row = pairs.column(f"{ROW}_t")
    has_target = _bool(pc.is_valid(target_row))
    # Unpaired changes take a row of nulls appended to the latest versions.
    nullable = pa.schema([f.with_nullable(True) for f in latest.schema])
    padded = pa.concat_tables([latest.cast(nullable),
                               pa.Table.from_pylist([{}], schema=nullable)])
    target = padded.take(pc.fill_null(target_row, len(latest)))
    when = rows.column(at)
    t_start = target.column(cr.START_AT).cast(when.type)
    t_end = target.column(cr.END_AT).cast(when.type)
    done_up_to = pc.coalesce(t_end, t_start)
    older = has_target & _bool(pc.less_equal(when, done_up_to))
    is_open = has_target & _bool(pc.is_null(t_end)) & ~older
    deletes = _bool(rows.column(IS_DELETE)) & ~older
    upserts = ~_bool(rows.column(IS_DELETE)) & ~older

    resolved: dict[str, Any] = {}
    unknown: set[str] = set()
    for i, name in enumerate(keep_columns):
        keep = _bool(rows.column(keep_column(i)))
        if (keep & upserts & ~is_open).any():
            unknown.add(name)
        resolved[name] = pc.if_else(pa.array(keep & is_open),
                                    target.column(name).cast(schema.field(name).type),
                                    rows.column(name))
    values = {n: resolved.get(n, rows.column(n)) for n in columns.data}
    same = np.ones(len(rows), dtype=bool)
    for name in columns.tracked:
        same &= _null_aware_equal(values[name], target.column(name).cast(values[name].type))
    in_place = upserts & is_open & same
    replaced = upserts & is_open & ~same
    closes = (deletes & is_open) | replaced
    opens = (upserts & ~is_open) | replaced

    def build(mask: np.ndarray[Any, Any], data: dict[str, Any], start: Any, end: Any,
              merge_start: Any) -> pa.Table:
        chosen = pa.array(mask)
        arrays = [pa.chunked_array(data[n]).filter(chosen).cast(schema.field(n).type)
                  for n in columns.data]
        count = int(mask.sum())
        for value in (start, end, merge_start):
            arrays.append(pa.nulls(count, when.type) if value is None
                          else pa.chunked_array(value).filter(chosen).cast(when.type))
        return pa.Table.from_arrays(arrays, schema=schema)

    target_values = {n: target.column(n) for n in columns.data}
    closed = build(closes, target_values, t_start, when, t_start)
    current_start = pc.if_else(pa.array(in_place), t_start, when)
    current_merge = pc.if_else(pa.array(in_place), t_start, pa.nulls(len(rows), when.type))
    current = build(opens | in_place, values, current_start, None, current_merge)
    return VersionPlan(pa.concat_tables([closed, current]), int(older.sum()), frozenset(unknown))


# -- the per-change fold: several versions of a key in one batch, or a truncate ----------
@dataclasses.dataclass
class _Version:
    values: dict[str, Any]
    existing_start: Any = None  # __START_AT of the target row this is, None if new
    changed: bool = False


@dataclasses.dataclass(frozen=True)
class _FoldResult:
    rows: list[dict[str, Any]]
    skipped: int
    unknown_kept: frozenset[str]


_DROPPED = object()


def _fold(rows: pa.Table, spec: ApplySpec, columns: ResolvedColumns, latest: pa.Table,
          batch: PreparedBatch) -> _FoldResult:
    """Fold *rows* (sorted by key then sequence, one per key and version value) over
    the keys' latest target versions, change by change."""
    if len(rows) == 0:
        return _FoldResult([], 0, frozenset())
    keys, seq, at = spec.keys, spec.sequence_by, spec.version_column
    data = columns.data
    targets: dict[tuple[Any, ...], dict[str, Any]] = {}
    if len(latest):
        mine = rows_with_keys(latest, rows, keys)
        targets = {tuple(r[k] for k in keys): r for r in mine.to_pylist()}
    changes = rows.to_pylist()
    truncates = batch.truncates
    at_index = seq.index(at)
    out: list[dict[str, Any]] = []
    skipped = 0
    unknown: set[str] = set()
    kept = [(name, keep_column(i)) for i, name in enumerate(batch.keep_columns)]
    tracked = columns.tracked

    def emit(version: _Version) -> None:
        if version.values[cr.END_AT] is _DROPPED or not version.changed:
            return
        row = {name: version.values.get(name) for name in data}
        row[cr.START_AT] = version.values[cr.START_AT]
        row[cr.END_AT] = version.values[cr.END_AT]
        row[MERGE_START] = version.existing_start
        out.append(row)

    def close(version: _Version | None, end: Any) -> None:
        if version is None:
            return
        if version.values[cr.START_AT] == end and version.existing_start is None:
            version.values[cr.END_AT] = _DROPPED  # born and gone in one sequence value
        else:
            version.values[cr.END_AT] = end
        version.changed = True
        emit(version)

    index = 0
    while index < len(changes):
        key = tuple(changes[index][k] for k in keys)
        end = index
        while end < len(changes) and tuple(changes[end][k] for k in keys) == key:
            end += 1
        target = targets.get(key)
        done_up_to = None
        current: _Version | None = None
        if target is not None:
            done_up_to = target[cr.START_AT] if target[cr.END_AT] is None else target[cr.END_AT]
            if target[cr.END_AT] is None:
                current = _Version(dict(target), existing_start=target[cr.START_AT])
        pending = 0  # next truncate to consider for this key
        for change in changes[index:end]:
            value = change[at]
            position = tuple(change[s] for s in seq)
            while pending < len(truncates) and truncates[pending] < position:
                current = _truncate(current, truncates[pending][at_index], close)
                pending += 1
            if done_up_to is not None and value <= done_up_to:
                skipped += 1
                continue
            if change[IS_DELETE]:
                close(current, value)
                current = None
                continue
            image = {name: change[name] for name in data}
            for name, mask in kept:
                if change[mask]:
                    if current is None:
                        unknown.add(name)
                        image[name] = None
                    else:
                        image[name] = current.values.get(name)
            if current is None:
                current = _Version({**image, cr.START_AT: value, cr.END_AT: None}, changed=True)
            elif current.values[cr.START_AT] == value or all(
                current.values.get(name) == image[name] for name in tracked
            ):
                current.values.update(image)  # same version value, or untracked columns only
                current.changed = True
            else:
                close(current, value)
                current = _Version({**image, cr.START_AT: value, cr.END_AT: None}, changed=True)
        while pending < len(truncates):
            current = _truncate(current, truncates[pending][at_index], close)
            pending += 1
        if current is not None:
            emit(current)
        index = end
    return _FoldResult(out, skipped, frozenset(unknown))


def _truncate(current: _Version | None, at: Any,
              close: Callable[[_Version | None, Any], None]) -> _Version | None:
    if current is not None and current.values[cr.START_AT] <= at:
        close(current, at)
        return None
    return current
