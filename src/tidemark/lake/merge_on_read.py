"""Apply a batch to a Delta target by deletion vectors: :func:`merge_on_read`.

Copy-on-write rewrites every file that holds a changed row, which for uniformly spread
updates is every file of the table. Here the rows a batch replaces or deletes are marked
in deletion vectors on the files that hold them (found through
:class:`tidemark.lake.key_index.KeyIndex`, without reading the table), and the batch's new
rows go to new files (:mod:`tidemark.lake.mor_rows`): the cost follows the batch, not the
table. One Delta commit per batch carries the vectors, the new files and the app
transaction, as a copy-on-write merge does (a replayed batch is recognised the same way).

A batch too big to hold is applied in pieces (:func:`merge_on_read_steps`; SCD type 1
targets without soft deletes): each piece is staged (vectors and files written, the
index brought to the staged files) and the last commit carries them all, so readers see
the whole batch or none of it. A batch with a truncate is merged copy-on-write when whole
(it removes most of the table anyway); in pieces, a truncate marks every row before it
through the index.

A crash before the commit leaves only unreferenced files, which vacuum deletes; after it,
a replay is skipped.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from pyroaring import BitMap64

from tidemark import faults
from tidemark.errors import TidemarkError
from tidemark.lake import delta_log
from tidemark.lake.branch import discard_branches, local_directory
from tidemark.lake.collapse import PreparedBatch, sequence_after, sequence_before
from tidemark.lake.deletion_vector import write_vectors
from tidemark.lake.key_hashes import plain_schema
from tidemark.lake.key_index import KeyIndex
from tidemark.lake.mor_rows import (
    SCRATCH_DIR,
    Counts,
    MergeFn,
    conform,
    merge_with_rows,
    move_files,
    needs_rows,
    plan_scd1,
    target_file_size,
    write_files,
)
from tidemark.lake.spec import ApplySpec, ResolvedColumns

log = logging.getLogger(__name__)

#: Table property that lets writers add deletion vectors (Delta protocol).
ENABLE_DVS = "delta.enableDeletionVectors"


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
        if held is not None:
            index, state = held
            state = delta_log.advance(root, state)
            if state.metadata.get("id") != held[1].metadata.get("id"):
                held = None  # the table was made again at this path: nothing held holds
        if held is None:
            state = delta_log.read_log(root)
            index = KeyIndex(root, spec.keys, sequence)
        try:
            index.sync(state)
        except BaseException:
            self._held.pop(key, None)  # half brought up: built afresh next time
            raise
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


class TruncateInStepsError(TidemarkError):
    """A truncate inside a batch applied in pieces, on a merge-on-read target whose rows
    it would have to rewrite (SCD type 2, soft deletes): such batches are merged whole
    (:func:`tidemark.lake.delta_writer.apply_changes_in_steps`), never staged."""


@dataclasses.dataclass
class _Staged:
    """A batch's files as they will be once committed: the table's live files at the
    start (``original``), with the vectors and new files of the pieces staged so far."""

    original: delta_log.LogState
    files: dict[str, dict[str, Any]]
    step: int = 0
    vectors: set[str] = dataclasses.field(default_factory=set)
    added: set[str] = dataclasses.field(default_factory=set)

    def state(self) -> delta_log.LogState:
        """The staged files as a log state the key index can be brought to. Its
        version is not the table's: the index is brought to the table's after the
        commit."""
        return delta_log.LogState(version=-2 - self.step, files=self.files,
                                  protocol=self.original.protocol,
                                  metadata=self.original.metadata)


def merge_on_read(table: DeltaTable, batch: PreparedBatch, spec: ApplySpec,
                  columns: ResolvedColumns, *, app_id: str, version: int,
                  metadata: Mapping[str, str] | None, merge: MergeFn,
                  uri: str) -> MergeOnReadResult:
    """Apply *batch* (prepared, replays dropped, no truncate) to *table* as one commit
    with deletion vectors, carrying the app transaction ``(app_id, version)`` and the
    commit *metadata*. *merge* is the copy-on-write merge used on the scratch table for
    batches that need the target's rows."""
    return merge_on_read_steps(table, iter([batch]), spec, columns, app_id=app_id,
                               version=version, metadata=lambda: metadata, merge=merge,
                               uri=uri)


def merge_on_read_steps(table: DeltaTable, batches: Iterator[PreparedBatch], spec: ApplySpec,
                        columns: ResolvedColumns, *, app_id: str, version: int,
                        metadata: Callable[[], Mapping[str, str] | None], merge: MergeFn,
                        uri: str) -> MergeOnReadResult:
    """Apply *batches* (the prepared pieces of one batch, in order; one piece at a time
    in memory) as one commit: see :func:`merge_on_read`. *metadata* gives the commit's
    metadata once every piece is staged (the high-water mark of all of them). A commit
    conflict with another writer is an error here (the pieces cannot be read again)."""
    root = local_directory(uri)
    assert root is not None, "merge-on-read needs a local target"
    index, state = TARGETS.current(root, spec)
    target_schema = plain_schema(pa.schema(table.schema().to_arrow()))
    # A target has one writer: what a crash left in its work folders is not in use.
    shutil.rmtree(root / SCRATCH_DIR, ignore_errors=True)
    discard_branches(root)
    work = root / SCRATCH_DIR / uuid.uuid4().hex
    staged = _Staged(state, dict(state.files))
    counts = [0, 0, 0, 0, 0]
    try:
        for batch in batches:
            done = _stage(root, work / str(staged.step), index, staged, batch, spec, columns,
                          target_schema, merge, uri, version)
            counts = [a + b for a, b in zip(counts, done, strict=True)]
        _commit(root, staged, app_id, version, metadata())
        faults.crash_point("mor_after_commit", version)
    except BaseException:
        # The index holds the staged files: only the table is to be trusted now.
        TARGETS.forget(root)
        raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    # *table* stays at the version before the commit: whoever uses it next brings it up
    # (held_tables does; at 50 files each update_incremental took 22 ms, measured).
    TARGETS.current(root, spec)
    inserted, updated, deleted, skipped, superseded = counts
    return MergeOnReadResult(
        inserted=inserted, updated=updated, deleted=deleted, skipped=skipped,
        superseded=superseded, version=state.version + 1, files_added=len(staged.added),
        vectors=len(staged.vectors),
        bytes_written=sum(int(staged.files[p]["size"]) for p in staged.added
                          if p in staged.files))


def _stage(root: Path, scratch: Path, index: KeyIndex, staged: _Staged, batch: PreparedBatch,
           spec: ApplySpec, columns: ResolvedColumns, target_schema: pa.Schema,
           merge: MergeFn, uri: str, version: int) -> Counts:
    """Stage one piece: its vectors and new files written, the index brought to them."""
    state = staged.state()
    truncated = _truncated_rows(index, batch, spec) if batch.truncates else \
        np.zeros(0, np.int64)
    if needs_rows(batch, spec, columns, target_schema):
        replaced, new_files, counts = merge_with_rows(
            root, scratch, index, state, batch, spec, columns, target_schema, merge, uri)
    else:
        if batch.truncates:  # what came before the piece's last truncate is gone anyway
            batch = batch.with_rows(batch.rows.filter(
                sequence_after(batch.rows, spec.sequence_by, batch.truncates[-1])))
        replaced, new_rows, counts = plan_scd1(index, batch, spec, columns)
        new_files = write_files(scratch, conform(new_rows, target_schema, spec), spec,
                                target_schema, target_file_size(state))
    if len(truncated):
        counts = (counts[0], counts[1], counts[2] + len(truncated), counts[3], counts[4])
        replaced = np.concatenate([replaced, truncated])
    _stage_vectors(root, index, staged, replaced)
    faults.crash_point("mor_after_vectors", version)
    for add in move_files(scratch, root, new_files):
        staged.files[add["path"]] = add
        staged.added.add(add["path"])
    faults.crash_point("mor_after_files", version)
    staged.step += 1
    index.sync(staged.state())
    return counts


def _truncated_rows(index: KeyIndex, batch: PreparedBatch,
                    spec: ApplySpec) -> np.ndarray[Any, Any]:
    """The live rows a piece's last truncate removes (those before it): SCD type 1
    without soft deletes; the others would rewrite their rows."""
    if spec.stored_as_scd_type != 1 or spec.soft_delete_column is not None:
        raise TruncateInStepsError(
            "a TRUNCATE inside a transaction applied in pieces, on a merge-on-read "
            f"{'SCD type 2' if spec.stored_as_scd_type != 1 else 'soft-delete'} target, "
            "would rewrite every row; set merge = \"copy_on_write\" for this target")
    rows = index.alive_rows()
    if not len(rows):  # an empty table (maybe no file at all): nothing to remove
        return rows
    before = sequence_before(index.values(rows, spec.sequence_by), spec.sequence_by,
                             batch.truncates[-1])
    mask = np.asarray(pc.fill_null(before, False).to_numpy(zero_copy_only=False), dtype=bool)
    picked: np.ndarray[Any, Any] = rows[mask]
    return picked


def _stage_vectors(root: Path, index: KeyIndex, staged: _Staged,
                   replaced: np.ndarray[Any, Any]) -> None:
    """Mark *replaced* rows deleted in the staged files: each file's vector grown by its
    rows, or the file dropped when none of its rows is left. A file's current vector is
    the index's (no read of its vector file), and the index takes the new one as
    written (no read back): with spread changes every batch touches every file, and
    those reads grew with the table's files."""
    if not len(replaced):
        return
    now = delta_log.now_ms()
    growing: list[tuple[str, BitMap64]] = []
    added: dict[str, np.ndarray[Any, Any]] = {}
    for path, positions in index.locate(np.unique(replaced)).items():
        bitmap = index.vector(path) | BitMap64(positions.astype(np.uint64))
        if len(bitmap) >= index.file_rows(path):
            del staged.files[path]
        else:
            growing.append((path, bitmap))
            added[path] = positions
    for (path, bitmap), vector in zip(growing, write_vectors(root, [b for _, b in growing]),
                                      strict=True):
        _, addition = delta_log.replace_file_actions(staged.files[path], vector, now)
        staged.files[path] = addition["add"]
        staged.vectors.add(path)
        index.note_vector(path, vector, bitmap, added[path])


def _commit(root: Path, staged: _Staged, app_id: str, version: int,
            metadata: Mapping[str, str] | None) -> None:
    """Commit the staged files as the table's next version: the original files that
    changed removed (with the vector they had), their new state and the new files added,
    the feature upgrade if needed, the app transaction and *metadata*."""
    original = staged.original
    now = delta_log.now_ms()
    actions: list[dict[str, Any]] = [*feature_actions(original)]
    for path, add in original.files.items():
        new = staged.files.get(path)
        if new is add:
            continue
        removal, _ = delta_log.replace_file_actions(add, None, now)
        actions.append(removal)
        if new is not None:
            actions.append({"add": new})
    actions += [{"add": add} for path, add in staged.files.items()
                if path not in original.files]
    commit_info: dict[str, Any] = {
        "timestamp": now, "operation": "MERGE",
        "operationParameters": {"mode": "merge_on_read"},
        "clientVersion": "tidemark", **(metadata or {})}
    delta_log.commit(root, original.version + 1, [
        {"commitInfo": commit_info},
        {"txn": {"appId": app_id, "version": version, "lastUpdated": now}}, *actions])
