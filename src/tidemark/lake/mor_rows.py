"""The rows of a merge-on-read batch (:mod:`tidemark.lake.merge_on_read`): which target
rows it replaces, found through the key index, and the new rows it writes.

SCD type 1 without kept values decides from the index alone (:func:`plan_scd1`): a change
applies when its sequence is after the row's. Everything else (:func:`needs_rows`) reads
the target's rows of the batch's keys by position and merges them with the batch by the
copy-on-write merge in a scratch table (:func:`merge_with_rows`), whose result replaces
them. New files are written by delta-rs into a scratch table inside the target
(``_tidemark_scratch/``, hidden from readers and vacuum), which gives them delta-rs's
Parquet settings and statistics, and moved into the target (:func:`move_files`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, write_deltalake

from tidemark.lake import delta_log
from tidemark.lake.collapse import IS_DELETE, PreparedBatch, collapse_to_latest, from_key_column
from tidemark.lake.key_hashes import plain_schema
from tidemark.lake.key_index import KeyIndex
from tidemark.lake.spec import ApplySpec, ResolvedColumns

SCRATCH_DIR = "_tidemark_scratch"
_FILE_SIZE = "delta.targetFileSize"

MergeFn = Callable[[DeltaTable, PreparedBatch, ApplySpec, ResolvedColumns, CommitProperties,
                    str], tuple[dict[str, Any], int, int]]
#: (inserted, updated, deleted, skipped, superseded), as ApplyResult counts them.
Counts = tuple[int, int, int, int, int]


def needs_rows(batch: PreparedBatch, spec: ApplySpec, columns: ResolvedColumns,
                target: pa.Schema) -> bool:
    """Whether the batch's result depends on the target rows' values, not only on
    their sequence: SCD2 versions, soft deletes, kept (unsent) values, and target
    columns the batch does not carry (an update keeps their values)."""
    return bool(spec.stored_as_scd_type != 1 or spec.soft_delete_column is not None
                or batch.keep_columns or set(target.names) - set(columns.data))


# -- SCD type 1 from the index ------------------------------------------------------------
def sequence_greater(left: pa.Table, right: pa.Table,
                     names: tuple[str, ...]) -> np.ndarray[Any, np.dtype[np.bool_]]:
    """Row by row: whether *left*'s sequence is strictly after *right*'s
    (lexicographic over *names*)."""
    result = np.zeros(len(left), dtype=bool)
    equal = np.ones(len(left), dtype=bool)
    for name in names:
        a = left.column(name)
        b = right.column(name).cast(a.type)
        greater = np.asarray(pc.fill_null(pc.greater(a, b), False)
                             .to_numpy(zero_copy_only=False), dtype=bool)
        same = np.asarray(pc.fill_null(pc.equal(a, b), False)
                          .to_numpy(zero_copy_only=False), dtype=bool)
        result |= equal & greater
        equal &= same
    return result


def plan_scd1(index: KeyIndex, batch: PreparedBatch, spec: ApplySpec,
               columns: ResolvedColumns
               ) -> tuple[np.ndarray[Any, Any], pa.Table, Counts]:
    """The rows to mark deleted, the rows to write and the counts (inserted, updated,
    deleted, skipped, superseded) of an SCD1 batch that needs no target values."""
    source = collapse_to_latest(batch, spec.keys, spec.sequence_by).rows
    found = index.lookup(source.select(list(spec.keys)))
    seq = spec.sequence_by
    newer = sequence_greater(source.select(list(seq)).take(pa.array(found.probe)),
                             index.values(found.row, seq), seq) \
        if len(found.row) else np.zeros(0, dtype=bool)
    matched = np.zeros(len(source), dtype=bool)
    matched[found.probe] = True
    newer_key = np.zeros(len(source), dtype=bool)
    newer_key[found.probe[newer]] = True
    is_delete = np.asarray(source.column(IS_DELETE).to_numpy(zero_copy_only=False),
                           dtype=bool)
    write = ~is_delete & (~matched | newer_key)
    replaced = found.row[newer]
    inserted = int((write & ~matched).sum())
    updated = int((write & matched).sum())
    deleted = int(is_delete[found.probe[newer]].sum())
    skipped = int((~is_delete & matched & ~newer_key).sum())
    rows = source.filter(pa.array(write)).select(list(columns.data))
    return replaced, rows, (inserted, updated, deleted, skipped, len(batch.rows) - len(source))


# -- batches that need the target's rows --------------------------------------------------
def merge_with_rows(root: Path, scratch: Path, index: KeyIndex, state: delta_log.LogState,
                     batch: PreparedBatch, spec: ApplySpec, columns: ResolvedColumns,
                     target_schema: pa.Schema, merge: MergeFn, uri: str
                     ) -> tuple[np.ndarray[Any, Any], list[dict[str, Any]],
                                Counts]:
    """Merge the batch with the target rows of its keys (and of the keys its primary-key
    changes left) in a scratch table; the originals are replaced by its result."""
    keys = batch.rows.select(list(spec.keys))
    moved = [from_key_column(i) for i in range(len(spec.keys))]
    if all(name in batch.rows.column_names for name in moved):
        old = batch.rows.select(moved).rename_columns(list(spec.keys))
        old = old.filter(pc.is_valid(old.column(0)))
        keys = pa.concat_tables([keys, old.cast(keys.schema)])
    found = index.lookup(keys)
    rows = np.unique(found.row)
    current = read_rows(root, index, state, rows, target_schema)
    size = target_file_size(state)
    DeltaTable.create(os.fspath(scratch), target_schema, mode="error",
                      partition_by=list(spec.partition_by) or None,
                      configuration=None if size is None else {_FILE_SIZE: str(size)})
    if len(current):
        write_deltalake(os.fspath(scratch), current, mode="append")
    work = DeltaTable(os.fspath(scratch))
    metrics, not_applied, superseded = merge(work, batch, spec, columns, CommitProperties(),
                                             uri)
    counts = (int(metrics.get("num_target_rows_inserted", 0)),
              int(metrics.get("num_target_rows_updated", 0)),
              int(metrics.get("num_target_rows_deleted", 0)), not_applied, superseded)
    files = list(delta_log.read_log(scratch).files.values())
    return rows, files, counts


def read_rows(root: Path, index: KeyIndex, state: delta_log.LogState,
               rows: np.ndarray[Any, Any], schema: pa.Schema) -> pa.Table:
    """The full target rows at the given global row numbers, in *schema* (partition
    columns, which the files do not hold, from their add actions)."""
    partitions = list(state.metadata.get("partitionColumns") or [])
    parts = []
    for path, positions in index.locate(rows).items():
        found = rows_of_file(root / unquote(path), positions)
        found = with_partition_values(found, state.files[path], partitions, schema)
        parts.append(conform_columns(found, schema))
    if not parts:
        return schema.empty_table()
    return pa.concat_tables(parts)


def with_partition_values(rows: pa.Table, add: dict[str, Any], partitions: list[str],
                          schema: pa.Schema) -> pa.Table:
    """*rows* of the data file *add* with its partition values as columns of *schema*'s
    types (the files do not hold them; a null value is a null)."""
    values = add.get("partitionValues") or {}
    for name in partitions:
        if name in rows.column_names:
            continue
        value = values.get(name)
        kind = schema.field(name).type
        rows = rows.append_column(name, pa.nulls(len(rows), kind) if value is None
                                  else pa.array([value] * len(rows), pa.string()).cast(kind))
    return rows


def rows_of_file(path: Path, positions: np.ndarray[Any, Any]) -> pa.Table:
    """The rows at *positions* (sorted) of a Parquet file, reading only the row groups
    that hold them."""
    parquet = pq.ParquetFile(path)
    sizes = [parquet.metadata.row_group(i).num_rows
             for i in range(parquet.metadata.num_row_groups)]
    bounds = np.cumsum([0, *sizes])
    groups = np.unique(np.searchsorted(bounds, positions, side="right") - 1)
    table = parquet.read_row_groups([int(g) for g in groups])
    table = table.cast(plain_schema(table.schema))
    offsets = np.cumsum([0, *(sizes[int(g)] for g in groups)])
    group_of = np.searchsorted(bounds, positions, side="right") - 1
    local = positions - bounds[group_of] + offsets[np.searchsorted(groups, group_of)]
    return table.take(pa.array(local))


def conform_columns(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    """*rows* with *schema*'s columns in its order and types; absent ones null (a file
    written before a column was added)."""
    arrays = []
    for field in schema:
        if field.name in rows.column_names:
            arrays.append(rows.column(field.name).cast(field.type))
        else:
            arrays.append(pa.nulls(len(rows), field.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def conform(rows: pa.Table, schema: pa.Schema, spec: ApplySpec) -> pa.Table:
    """New rows of an SCD1 batch in the target's schema, sorted by key (so that files
    stay clustered where the keys allow it)."""
    rows = rows.sort_by([(k, "ascending") for k in spec.keys])
    return conform_columns(rows, pa.schema([f.with_nullable(True) for f in schema]))\
        .cast(schema)


def target_file_size(state: delta_log.LogState) -> int | None:
    """The target's ``delta.targetFileSize``: the scratch table's writes must cut their
    files as the target's own would (None: delta-rs's default)."""
    value = (state.metadata.get("configuration") or {}).get(_FILE_SIZE)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def write_files(scratch: Path, rows: pa.Table, spec: ApplySpec, schema: pa.Schema,
                file_size: int | None = None) -> list[dict[str, Any]]:
    """Write *rows* as new data files of about *file_size* bytes (through a scratch
    table); their add actions."""
    if not len(rows):
        return []
    write_deltalake(os.fspath(scratch), rows, mode="error",
                    partition_by=list(spec.partition_by) or None, target_file_size=file_size)
    return list(delta_log.read_log(scratch).files.values())


def move_files(scratch: Path, root: Path, adds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Move the scratch table's data files into the target, same relative paths."""
    moved = []
    for add in adds:
        relative = unquote(add["path"])  # the log holds paths URI-encoded
        destination = root / relative
        destination.parent.mkdir(parents=True, exist_ok=True)
        os.replace(scratch / relative, destination)
        moved.append({**add, "dataChange": True})
    return moved
