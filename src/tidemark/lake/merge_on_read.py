"""Apply a batch to a Delta target by deletion vectors: :func:`merge_on_read`.

Copy-on-write rewrites every file that holds a changed row, which for uniformly spread
updates is every file of the table. Here the rows a batch replaces or deletes are marked
in deletion vectors on the files that hold them (found through
:class:`tidemark.lake.key_index.KeyIndex`, without reading the table), and the batch's new
rows go to new files: the cost follows the batch, not the table. One Delta commit per
batch carries the vectors, the new files and the app transaction, as a copy-on-write
merge does (a replayed batch is recognised the same way).

SCD type 1 without kept values (the common case) decides everything from the index: a
change applies when its sequence is after the row's. Everything else (SCD type 2,
soft deletes, unchanged TOASTed values, primary-key changes that must carry values)
needs the target's current rows of the batch's keys: they are read by position, merged
with the batch by the copy-on-write merge in a scratch table, and replace the originals.
A batch with a truncate is merged copy-on-write (it removes most of the table anyway).

New files are written by delta-rs into a scratch table inside the target
(``_tidemark_scratch/``, hidden from readers and vacuum), which gives them delta-rs's
Parquet settings and statistics, then moved into the target. A crash before the commit
leaves only unreferenced files, which vacuum deletes; after it, a replay is skipped.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final
from urllib.parse import unquote, urlparse

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, write_deltalake
from pyroaring import BitMap64

from tidemark import faults
from tidemark.lake import delta_log
from tidemark.lake.branch import discard_branches
from tidemark.lake.collapse import IS_DELETE, PreparedBatch, collapse_to_latest, from_key_column
from tidemark.lake.deletion_vector import DeletionVector, read_vector, write_vectors
from tidemark.lake.key_index import KeyIndex, plain_schema
from tidemark.lake.spec import ApplySpec, ResolvedColumns

log = logging.getLogger(__name__)

SCRATCH_DIR = "_tidemark_scratch"
#: Table property that lets writers add deletion vectors (Delta protocol).
ENABLE_DVS = "delta.enableDeletionVectors"

MergeFn = Callable[[DeltaTable, PreparedBatch, ApplySpec, ResolvedColumns, CommitProperties,
                    str], tuple[dict[str, Any], int, int]]


@dataclasses.dataclass(frozen=True)
class MergeOnReadResult:
    """What one merge-on-read batch did (row counts as :class:`ApplyResult`'s) and what
    it wrote: ``files_added``, ``vectors`` (files given a new deletion vector)."""

    inserted: int
    updated: int
    deleted: int
    skipped: int
    superseded: int
    version: int
    files_added: int
    vectors: int
    bytes_written: int


class _Targets:
    """The key index of each merge-on-read target this process writes, kept between
    batches (built from the table at first use)."""

    def __init__(self) -> None:
        self._held: dict[tuple[str, tuple[str, ...], tuple[str, ...]],
                         tuple[KeyIndex, delta_log.LogState]] = {}

    def current(self, root: Path, spec: ApplySpec) -> tuple[KeyIndex, delta_log.LogState]:
        """The index and log state of *root* at its latest version."""
        # SCD2 targets hold no sequence columns (and their batches read the rows).
        sequence = spec.sequence_by if spec.stored_as_scd_type == 1 else ()
        key = (os.fspath(root), spec.keys, sequence)
        held = self._held.get(key)
        if held is None:
            state = delta_log.read_log(root)
            index = KeyIndex(root, spec.keys, sequence)
        else:
            index, state = held
            state = delta_log.advance(root, state)
        index.sync(state)
        self._held[key] = (index, state)
        return index, state

    def forget(self, root: Path) -> None:
        """Drop what is held for *root* (after a failed commit: rebuilt from the table)."""
        for key in [k for k in self._held if k[0] == os.fspath(root)]:
            del self._held[key]


TARGETS = _Targets()


#: Writer features implied by a legacy writer version (Delta protocol, "Table Features"),
#: listed when a table moves to writer version 7.
_LEGACY_WRITER_FEATURES: Final = {
    2: ("appendOnly", "invariants"),
    3: ("appendOnly", "invariants", "checkConstraints"),
    4: ("appendOnly", "invariants", "checkConstraints", "changeDataFeed", "generatedColumns"),
    5: ("appendOnly", "invariants", "checkConstraints", "changeDataFeed", "generatedColumns",
        "columnMapping"),
    6: ("appendOnly", "invariants", "checkConstraints", "changeDataFeed", "generatedColumns",
        "columnMapping", "identityColumns"),
}


def feature_actions(state: delta_log.LogState) -> list[dict[str, Any]]:
    """The ``protocol`` and ``metaData`` actions that give the table the
    ``deletionVectors`` feature and turn it on, as part of the batch's own commit (one
    commit per batch still); none when it has both."""
    actions: list[dict[str, Any]] = []
    protocol = dict(state.protocol)
    readers = list(protocol.get("readerFeatures") or [])
    writers = list(protocol.get("writerFeatures") or [])
    if "deletionVectors" not in writers or "deletionVectors" not in readers:
        if int(protocol.get("minWriterVersion", 1)) < 7:
            writers = list(_LEGACY_WRITER_FEATURES.get(int(protocol.get("minWriterVersion", 1)),
                                                       ()))
        if int(protocol.get("minReaderVersion", 1)) == 2:
            readers = ["columnMapping"]
        elif int(protocol.get("minReaderVersion", 1)) < 3:
            readers = []
        actions.append({"protocol": {
            "minReaderVersion": 3, "minWriterVersion": 7,
            "readerFeatures": sorted({*readers, "deletionVectors"}),
            "writerFeatures": sorted({*writers, "deletionVectors"})}})
    metadata = dict(state.metadata)
    configuration = dict(metadata.get("configuration") or {})
    if configuration.get(ENABLE_DVS) != "true":
        configuration[ENABLE_DVS] = "true"
        metadata["configuration"] = configuration
        actions.append({"metaData": metadata})
    return actions


def local_root(uri: str) -> Path | None:
    """The local directory of *uri* (a path or a ``file://`` URI, percent-decoded), or
    None for an object store."""
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        return Path(unquote(parsed.path))
    if "://" in uri:
        return None
    return Path(uri)


def merge_on_read(table: DeltaTable, batch: PreparedBatch, spec: ApplySpec,
                  columns: ResolvedColumns, *, app_id: str, version: int,
                  metadata: Mapping[str, str] | None, merge: MergeFn,
                  uri: str) -> MergeOnReadResult:
    """Apply *batch* (prepared, replays dropped, no truncate) to *table* as one commit
    with deletion vectors, carrying the app transaction ``(app_id, version)`` and the
    commit *metadata*. *merge* is the copy-on-write merge used on the scratch table for
    batches that need the target's rows."""
    root = local_root(uri)
    assert root is not None, "merge-on-read needs a local target"
    for attempt in range(3):
        index, state = TARGETS.current(root, spec)
        try:
            result = _apply(root, table, index, state, batch, spec, columns, app_id, version,
                            metadata, merge, uri)
        except delta_log.CommitConflictError:
            # Another writer committed first: start again from the table.
            TARGETS.forget(root)
            if attempt == 2:
                raise
            log.warning("%s: another writer committed version %d first; retrying the "
                        "batch", uri, state.version + 1)
            continue
        TARGETS.current(root, spec)
        return result
    raise AssertionError("unreachable")


def _apply(root: Path, table: DeltaTable, index: KeyIndex, state: delta_log.LogState,
           batch: PreparedBatch, spec: ApplySpec, columns: ResolvedColumns, app_id: str,
           version: int, metadata: Mapping[str, str] | None, merge: MergeFn,
           uri: str) -> MergeOnReadResult:
    target_schema = plain_schema(pa.schema(table.schema().to_arrow()))
    # A target has one writer: what a crash left in its work folders is not in use.
    shutil.rmtree(root / SCRATCH_DIR, ignore_errors=True)
    discard_branches(root)
    scratch = root / SCRATCH_DIR / uuid.uuid4().hex
    try:
        if _needs_rows(batch, spec, columns, target_schema):
            replaced, new_files, counts = _merge_with_rows(
                root, scratch, index, state, batch, spec, columns, target_schema, merge, uri)
        else:
            replaced, new_rows, counts = _plan_scd1(index, batch, spec, columns)
            new_files = _write_files(scratch, _conform(new_rows, target_schema, spec), spec,
                                     target_schema)
        actions, vectors = _vector_actions(root, index, state, replaced)
        faults.crash_point("mor_after_vectors", version)
        actions = [*feature_actions(state), *actions]
        added = _move_files(scratch, root, new_files)
        faults.crash_point("mor_after_files", version)
        now = delta_log.now_ms()
        commit_info: dict[str, Any] = {
            "timestamp": now, "operation": "MERGE",
            "operationParameters": {"mode": "merge_on_read"},
            "clientVersion": "tidemark", **(metadata or {})}
        entries = [{"commitInfo": commit_info},
                   {"txn": {"appId": app_id, "version": version, "lastUpdated": now}},
                   *actions, *({"add": a} for a in added)]
        delta_log.commit(root, state.version + 1, entries)
        faults.crash_point("mor_after_commit", version)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    table.update_incremental()
    inserted, updated, deleted, skipped, superseded = counts
    return MergeOnReadResult(
        inserted=inserted, updated=updated, deleted=deleted, skipped=skipped,
        superseded=superseded,
        version=state.version + 1, files_added=len(added), vectors=vectors,
        bytes_written=sum(int(a["size"]) for a in added))


def _needs_rows(batch: PreparedBatch, spec: ApplySpec, columns: ResolvedColumns,
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


def _plan_scd1(index: KeyIndex, batch: PreparedBatch, spec: ApplySpec,
               columns: ResolvedColumns
               ) -> tuple[np.ndarray[Any, Any], pa.Table, tuple[int, int, int, int, int]]:
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
def _merge_with_rows(root: Path, scratch: Path, index: KeyIndex, state: delta_log.LogState,
                     batch: PreparedBatch, spec: ApplySpec, columns: ResolvedColumns,
                     target_schema: pa.Schema, merge: MergeFn, uri: str
                     ) -> tuple[np.ndarray[Any, Any], list[dict[str, Any]],
                                tuple[int, int, int, int, int]]:
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
    current = _read_rows(root, index, state, rows, target_schema)
    DeltaTable.create(os.fspath(scratch), target_schema, mode="error",
                      partition_by=list(spec.partition_by) or None)
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


def _read_rows(root: Path, index: KeyIndex, state: delta_log.LogState,
               rows: np.ndarray[Any, Any], schema: pa.Schema) -> pa.Table:
    """The full target rows at the given global row numbers, in *schema* (partition
    columns, which the files do not hold, from their add actions)."""
    partitions = list(state.metadata.get("partitionColumns") or [])
    parts = []
    for path, positions in index.locate(rows).items():
        found = _rows_of_file(root / unquote(path), positions)
        values = state.files[path].get("partitionValues") or {}
        for name in partitions:
            if name in found.column_names:
                continue
            value = values.get(name)
            kind = schema.field(name).type
            found = found.append_column(name, pa.nulls(len(found), kind) if value is None
                                        else pa.array([value] * len(found)).cast(kind))
        parts.append(_conform_columns(found, schema))
    if not parts:
        return schema.empty_table()
    return pa.concat_tables(parts)


def _rows_of_file(path: Path, positions: np.ndarray[Any, Any]) -> pa.Table:
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


def _conform_columns(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    """*rows* with *schema*'s columns in its order and types; absent ones null (a file
    written before a column was added)."""
    arrays = []
    for field in schema:
        if field.name in rows.column_names:
            arrays.append(rows.column(field.name).cast(field.type))
        else:
            arrays.append(pa.nulls(len(rows), field.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def _conform(rows: pa.Table, schema: pa.Schema, spec: ApplySpec) -> pa.Table:
    """New rows of an SCD1 batch in the target's schema, sorted by key (so that files
    stay clustered where the keys allow it)."""
    rows = rows.sort_by([(k, "ascending") for k in spec.keys])
    return _conform_columns(rows, pa.schema([f.with_nullable(True) for f in schema]))\
        .cast(schema)


def _write_files(scratch: Path, rows: pa.Table, spec: ApplySpec,
                 schema: pa.Schema) -> list[dict[str, Any]]:
    """Write *rows* as new data files (through a scratch table); their add actions."""
    if not len(rows):
        return []
    write_deltalake(os.fspath(scratch), rows, mode="error",
                    partition_by=list(spec.partition_by) or None)
    return list(delta_log.read_log(scratch).files.values())


def _move_files(scratch: Path, root: Path, adds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Move the scratch table's data files into the target, same relative paths."""
    moved = []
    for add in adds:
        relative = unquote(add["path"])  # the log holds paths URI-encoded
        destination = root / relative
        destination.parent.mkdir(parents=True, exist_ok=True)
        os.replace(scratch / relative, destination)
        moved.append({**add, "dataChange": True})
    return moved


def _vector_actions(root: Path, index: KeyIndex, state: delta_log.LogState,
                    replaced: np.ndarray[Any, Any]) -> tuple[list[dict[str, Any]], int]:
    """The remove/add actions that mark *replaced* rows deleted: each file's vector
    grown by its rows, or the file removed when none of its rows is left."""
    if not len(replaced):
        return [], 0
    by_file = index.locate(np.unique(replaced))
    now = delta_log.now_ms()
    actions: list[dict[str, Any]] = []
    growing: list[tuple[dict[str, Any], Any]] = []
    for path, positions in by_file.items():
        add = state.files[path]
        old = add.get("deletionVector")
        deleted = read_vector(root, DeletionVector.from_json(old)) if old else None
        bitmap = _bitmap(positions, deleted)
        if len(bitmap) >= index.file_rows(path):
            removal, _ = delta_log.replace_file_actions(add, None, now)
            actions.append(removal)
        else:
            growing.append((add, bitmap))
    vectors = write_vectors(root, [bitmap for _, bitmap in growing])
    for (add, _), vector in zip(growing, vectors, strict=True):
        removal, addition = delta_log.replace_file_actions(add, vector, now)
        actions += [removal, addition]
    return actions, len(growing)


def _bitmap(positions: np.ndarray[Any, Any], deleted: Any) -> BitMap64:
    bitmap = BitMap64(positions.tolist())
    if deleted is not None:
        bitmap |= deleted
    return bitmap
