"""Rewrites of a merge-on-read target's files: :func:`compact_deleted` and
:func:`compact_small`.

Every merge-on-read batch marks the rows it replaces in deletion vectors, so the files of
a target updated everywhere hold more and more dead rows that every reader still reads
and drops. A file whose deleted fraction (its vector's cardinality over its
``numRecords``) reaches ``compact_deleted_fraction`` is rewritten without its deleted
rows, in its own row order (a file's key range only shrinks, so a table clustered by key
stays so), a row group at a time through a scratch table
(:mod:`tidemark.lake.rewrite_files`). One commit removes each (file, vector) and adds its
rewrite, ``dataChange: false``: readers and the app transactions are unaffected. The
writer's key index picks the change up at its next batch, told which rows went where
(:mod:`tidemark.lake.relocations`): it checks the new files' key columns but hashes
none of their rows again.

A rewrite is two steps: :func:`prepare_rewrite` reads and writes the files (the slow
part, which upkeep runs beside the batches, :mod:`tidemark.lake.background_rewrite`) and
:func:`commit_rewrite` commits them, marking in the new files' vectors the rows the
batches deleted meanwhile.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
from deltalake import Schema
from pyroaring import BitMap64

from tidemark.lake import delta_log
from tidemark.lake.deletion_vector import DeletionVector, read_vector, write_vectors
from tidemark.lake.key_hashes import plain_schema
from tidemark.lake.mor_rows import move_files, target_file_size
from tidemark.lake.relocations import RELOCATIONS, MovedFile, Relocation
from tidemark.lake.rewrite_files import (
    OldFile,
    RowStream,
    live_batches,
    write_in_order,
    write_partitioned,
)

#: delta-rs's file size where the table sets none (``delta.targetFileSize``).
_DEFAULT_FILE_SIZE: Final = 100 << 20
#: Where a rewrite writes its files before moving them into the table (apart from the
#: batches' scratch folder, which each merge-on-read batch empties: a rewrite may run
#: beside the batches).
REWRITE_SCRATCH_DIR: Final = "_tidemark_rewrite"


@dataclasses.dataclass(frozen=True)
class VectorCompaction:
    """What one :func:`compact_deleted` or :func:`compact_small` did."""

    files_removed: int
    files_added: int
    rows_dropped: int
    version: int
    small: bool = False

    def __str__(self) -> str:
        if self.small:
            return (f"compacted {self.files_removed} small files into {self.files_added}, "
                    f"{self.rows_dropped} deleted rows dropped")
        return (f"rewrote {self.files_removed} files with deleted rows into "
                f"{self.files_added}, {self.rows_dropped} deleted rows dropped")


def deleted_fraction(add: dict[str, Any]) -> float:
    """The fraction of the rows of the live file *add* (an add action) its deletion
    vector marks deleted (0 without a vector or record count)."""
    dv = add.get("deletionVector")
    if not dv:
        return 0.0
    records = delta_log.num_records(add)
    return int(dv["cardinality"]) / records if records else 0.0


def due_files(state: delta_log.LogState, threshold: float,
              max_bytes: int) -> list[dict[str, Any]]:
    """The live files whose deleted fraction is at least *threshold*, most deleted
    first, as many as fit in *max_bytes* (one at least)."""
    due = sorted((add for add in state.files.values()
                  if add.get("deletionVector") and deleted_fraction(add) >= threshold),
                 key=deleted_fraction, reverse=True)
    chosen: list[dict[str, Any]] = []
    total = 0
    for add in due:
        if chosen and total + int(add["size"]) > max_bytes:
            break
        chosen.append(add)
        total += int(add["size"])
    return chosen


def small_files_due(state: delta_log.LogState, small_bytes: int,
                    max_bytes: int) -> list[dict[str, Any]]:
    """The live files under *small_bytes* of one partition (the one with the oldest of
    them among those with two at least: files of different partitions cannot become one),
    oldest first, as many as fit in *max_bytes* (two at least, or none)."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for add in state.files.values():
        if int(add["size"]) < small_bytes:
            partition = json.dumps(add.get("partitionValues") or {}, sort_keys=True)
            groups.setdefault(partition, []).append(add)
    candidates = [sorted(g, key=_age) for g in groups.values() if len(g) >= 2]
    if not candidates:
        return []
    small = min(candidates, key=lambda g: _age(g[0]))
    chosen: list[dict[str, Any]] = []
    total = 0
    for add in small:
        if len(chosen) >= 2 and total + int(add["size"]) > max_bytes:
            break
        chosen.append(add)
        total += int(add["size"])
    return chosen if len(chosen) >= 2 else []


def _age(add: dict[str, Any]) -> int:
    return int(add.get("modificationTime") or 0)


def small_files_plan(state: delta_log.LogState, small_bytes: int,
                     max_bytes: int) -> RewritePlan | None:
    """The rewrite of the oldest files of the table at *state* under *small_bytes* (up
    to *max_bytes* of them) into one file's worth, without their deleted rows; None when
    fewer than two are that small. delta-rs's compaction would also rewrite every file
    under its target size, so the file it made last time (nearly full) again and again,
    and the writer's key index would load all its keys again at each; here a file past
    *small_bytes* is left to :func:`deleted_rows_plan`."""
    chosen = small_files_due(state, small_bytes, max_bytes)
    return RewritePlan.of(state, chosen, {"reason": "small files"}, small=True) \
        if chosen else None


def deleted_rows_plan(state: delta_log.LogState, threshold: float,
                      max_bytes: int) -> RewritePlan | None:
    """The rewrite of the files of the table at *state* whose deleted fraction is at
    least *threshold* (up to *max_bytes* of them) without their deleted rows; None when
    no file is due."""
    chosen = due_files(state, threshold, max_bytes)
    return RewritePlan.of(state, chosen, {"reason": "deleted rows",
                                          "deletedFraction": str(threshold)}) \
        if chosen else None


def compact_small(root: Path, state: delta_log.LogState, small_bytes: int,
                  max_bytes: int) -> VectorCompaction | None:
    """:func:`small_files_plan` of the local table *root* at *state* (its latest
    version), done as one commit. Raises
    :class:`tidemark.lake.delta_log.CommitConflictError` as :func:`compact_deleted`."""
    plan = small_files_plan(state, small_bytes, max_bytes)
    return None if plan is None else rewrite(root, state, plan)


def compact_deleted(root: Path, state: delta_log.LogState, threshold: float,
                    max_bytes: int) -> VectorCompaction | None:
    """:func:`deleted_rows_plan` of the local table *root* at *state* (its latest
    version), done as one commit. None when no file is due. Raises
    :class:`tidemark.lake.delta_log.CommitConflictError` when another writer committed
    first (nothing is changed then)."""
    plan = deleted_rows_plan(state, threshold, max_bytes)
    return None if plan is None else rewrite(root, state, plan)


def rewrite(root: Path, state: delta_log.LogState, plan: RewritePlan) -> VectorCompaction:
    """Rewrite the plan's live files of *state* (their live rows, in order) as one
    commit of removes and adds, ``dataChange: false``; note where the rows went
    (:data:`tidemark.lake.relocations.RELOCATIONS`) for the writer's key index."""
    prepared = prepare_rewrite(root, plan)
    done = commit_rewrite(root, prepared, state)
    assert done is not None, "nothing changed between writing and committing"
    return done


@dataclasses.dataclass(frozen=True)
class RewritePlan:
    """What a rewrite reads (chosen at the table's *version*) and how it writes: plain
    values, so that :func:`prepare_rewrite` can run beside the batches."""

    version: int
    chosen: tuple[dict[str, Any], ...]
    schema: pa.Schema
    partitions: tuple[str, ...]
    file_size: int | None
    parameters: dict[str, str]
    small: bool

    @classmethod
    def of(cls, state: delta_log.LogState, chosen: list[dict[str, Any]],
           parameters: dict[str, str], *, small: bool = False) -> RewritePlan:
        """The plan of rewriting *chosen*, live files of *state*."""
        return cls(state.version, tuple(dict(add) for add in chosen), _table_schema(state),
                   tuple(state.metadata.get("partitionColumns") or ()),
                   target_file_size(state), parameters, small)

    def compaction(self, files_added: int, rows_dropped: int,
                   version: int) -> VectorCompaction:
        """What the rewrite did, once committed as *version*."""
        return VectorCompaction(files_removed=len(self.chosen), files_added=files_added,
                                rows_dropped=rows_dropped, version=version, small=self.small)


@dataclasses.dataclass(frozen=True)
class PreparedRewrite:
    """A rewrite's new files, in the table's folder but in no version yet: the live rows
    of ``plan.chosen`` (as their vectors were when read: ``read_vectors``; each file's
    physical row count in ``physical``, its live rows in ``moved``), file after file,
    are the rows of ``added``, file after file (``output_rows`` each)."""

    plan: RewritePlan
    read_vectors: tuple[BitMap64, ...]
    physical: tuple[int, ...]
    moved: tuple[int, ...]
    added: tuple[dict[str, Any], ...]
    output_rows: tuple[int, ...]
    rows_dropped: int
    one_file_a_piece: bool

    def discard(self, root: Path) -> None:
        """Delete the new files (unreferenced: not worth waiting for vacuum)."""
        for add in self.added:
            (root / unquote(add["path"])).unlink(missing_ok=True)


def prepare_rewrite(root: Path, plan: RewritePlan) -> PreparedRewrite:
    """Read the live rows of the plan's files and write them as new files in the table's
    folder, committing nothing: the slow part of a rewrite, which may run while batches
    commit (each file's vector at the time is what it reads). Rows are read and written
    a row group at a time (:mod:`tidemark.lake.rewrite_files`)."""
    scratch = root / REWRITE_SCRATCH_DIR / uuid.uuid4().hex
    added: list[dict[str, Any]] = []
    try:
        old = [OldFile.read(root, add) for add in plan.chosen]
        partitions = list(plan.partitions)
        rows = itertools.chain.from_iterable(
            live_batches(root, o, plan.schema, partitions) for o in old)
        written = _write_pieces(scratch, rows, old, plan.schema, partitions, plan.file_size)
        outputs: list[int] = []
        for piece, adds in written:
            added += [{**a, "dataChange": False} for a in move_files(piece, root, adds)]
            outputs += [delta_log.num_records(a) or -1 for a in adds]
    except BaseException:
        for add in added:
            (root / unquote(add["path"])).unlink(missing_ok=True)
        raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return PreparedRewrite(
        plan=plan, read_vectors=tuple(o.vector for o in old),
        physical=tuple(o.physical for o in old), moved=tuple(o.live for o in old),
        added=tuple(added), output_rows=tuple(outputs),
        rows_dropped=sum(o.physical - o.live for o in old),
        # delta-rs writes a partitioned table's rows in no known order.
        one_file_a_piece=not plan.partitions and len(added) == len(written))


def commit_rewrite(root: Path, prepared: PreparedRewrite,
                   state: delta_log.LogState) -> VectorCompaction | None:
    """Commit *prepared* as the version after *state* (the table's latest): each old
    file removed with the vector it has now, the new files added. Rows deleted from the
    old files since they were read are marked in the new files' vectors (the rows keep
    their order, so their new positions follow). None, the new files deleted, when an
    old file is no longer live, a new file would have no live row left, or the rows
    deleted meanwhile cannot be placed (a partitioned table's). Raises
    :class:`tidemark.lake.delta_log.CommitConflictError`, or what failed before the
    commit was written (the new files deleted either way)."""
    try:
        return _commit_rewrite(root, prepared, state)
    except BaseException:
        prepared.discard(root)  # in no version: not worth waiting for vacuum
        raise


def _commit_rewrite(root: Path, prepared: PreparedRewrite,
                    state: delta_log.LogState) -> VectorCompaction | None:
    plan = prepared.plan
    later = _deleted_since(root, prepared, state)
    if later is None:
        prepared.discard(root)
        return None
    now = delta_log.now_ms()
    adds = list(prepared.added)
    marked = [(i, bitmap) for i, bitmap in enumerate(later) if len(bitmap)]
    for (i, _), vector in zip(marked, write_vectors(root, [b for _, b in marked]),
                              strict=True):
        _, addition = delta_log.replace_file_actions(adds[i], vector, now)
        adds[i] = {**addition["add"], "dataChange": False}
    actions: list[dict[str, Any]] = [{"commitInfo": {
        "timestamp": now, "operation": "OPTIMIZE", "operationParameters": plan.parameters,
        "clientVersion": "tidemark"}}]
    for add in plan.chosen:
        removal, _ = delta_log.replace_file_actions(state.files[add["path"]], None, now)
        removal["remove"]["dataChange"] = False
        actions.append(removal)
    actions += [{"add": a} for a in adds]
    delta_log.commit(root, state.version + 1, actions)
    if prepared.one_file_a_piece:  # the index checks it before taking it
        RELOCATIONS.note(root, Relocation(
            tuple(MovedFile(add["path"], _dv_id(add), moved, vector)
                  for add, vector, moved in zip(plan.chosen, prepared.read_vectors,
                                                prepared.moved, strict=True)),
            tuple((a["path"], rows) for a, rows in
                  zip(prepared.added, prepared.output_rows, strict=True))))
    return plan.compaction(len(adds), prepared.rows_dropped, state.version + 1)


def _dv_id(add: dict[str, Any]) -> str | None:
    dv = add.get("deletionVector")
    return DeletionVector.from_json(dv).unique_id if dv else None


def _deleted_since(root: Path, prepared: PreparedRewrite,
                   state: delta_log.LogState) -> list[BitMap64] | None:
    """For each new file, its rows deleted from the old files after they were read (as
    positions in the new file); None when an old file is gone or a new file would keep
    no live row."""
    bounds = np.cumsum([0, *prepared.output_rows])
    later = [BitMap64() for _ in prepared.added]
    offset = 0
    # Else a partition's rows, or a file of no row count, are in no known place.
    ordered = prepared.one_file_a_piece and min(prepared.output_rows, default=0) >= 0
    for add, before, physical, moved in zip(prepared.plan.chosen, prepared.read_vectors,
                                            prepared.physical, prepared.moved, strict=True):
        current = state.files.get(add["path"])
        if current is None:
            return None
        if _dv_id(current) != _dv_id(add):
            dv = current.get("deletionVector")
            now = read_vector(root, DeletionVector.from_json(dv)) if dv else BitMap64()
            if not before.issubset(now):  # a vector only grows while its file lives
                return None
            new = np.frombuffer((now - before).to_array(), dtype=np.uint64).astype(np.int64)
            new = new[new < physical]
            if len(new) and not ordered:
                return None
            if len(new):
                gone = np.frombuffer(before.to_array(), dtype=np.uint64).astype(np.int64)
                # A row's place among the rows read: its position less the deleted before it.
                at = offset + new - np.searchsorted(gone, new)
                output = np.searchsorted(bounds, at, side="right") - 1
                for o in np.unique(output):
                    later[o] |= BitMap64((at[output == o] - bounds[o]).astype(np.uint64))
        offset += moved
    if any(len(bitmap) and len(bitmap) >= rows
           for bitmap, rows in zip(later, prepared.output_rows, strict=True)):
        return None
    return later


def _write_pieces(scratch: Path, rows: Iterator[pa.RecordBatch], old: list[OldFile],
                  schema: pa.Schema, partitions: list[str], size: int | None
                  ) -> list[tuple[Path, list[dict[str, Any]]]]:
    """Write *rows* (the live rows of *old*) as files of about the target's file size:
    each piece of them, in order, into a scratch table of its own, so that which rows
    each new file holds is known (a partitioned table's rows go in one write: its files
    split by partition). Returns each scratch table with its add actions."""
    total = sum(o.live for o in old)
    if not total:
        return []
    nullable = pa.schema([f.with_nullable(True) for f in schema])
    if partitions:
        target = scratch / "0"
        return [(target, write_partitioned(target, rows, nullable, partitions, size))]
    records = [delta_log.num_records(o.add) for o in old]
    estimate = float(sum(int(o.add["size"]) for o in old))
    if all(records):  # the live rows' share of the bytes
        estimate *= total / sum(r or 0 for r in records)
    # Rounded: a rewrite of a file a little over the size stays one file (two halves
    # would double the files every uniform batch touches).
    count = min(total, max(1, round(estimate / (size or _DEFAULT_FILE_SIZE))))
    bounds = [total * i // count for i in range(count + 1)]
    stream = RowStream(rows)
    written = []
    for number, (a, b) in enumerate(itertools.pairwise(bounds)):
        target = scratch / str(number)
        written.append((target, write_in_order(target, stream.take(b - a), nullable)))
    stream.finish()
    return written


def _table_schema(state: delta_log.LogState) -> pa.Schema:
    return plain_schema(pa.schema(Schema.from_json(state.metadata["schemaString"]).to_arrow()))
