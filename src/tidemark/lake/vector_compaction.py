"""Upkeep of a merge-on-read target's deletion vectors: :func:`compact_deleted` and
:func:`delete_unreferenced_vectors`.

Every merge-on-read batch marks the rows it replaces in deletion vectors, so the files of
a target updated everywhere hold more and more dead rows that every reader still reads
and drops. A file whose deleted fraction (its vector's cardinality over its
``numRecords``) reaches ``compact_deleted_fraction`` is rewritten without its deleted
rows, in its own row order (a file's key range only shrinks, so a table clustered by key
stays so), through a scratch table as merge-on-read writes its files
(:mod:`tidemark.lake.merge_on_read`). One commit removes each (file, vector) and adds its
rewrite, ``dataChange: false``: readers and the app transactions are unaffected. The
writer's key index picks the change up at its next batch, told which rows went where
(:mod:`tidemark.lake.relocations`): it checks the new files' key columns but hashes
none of their rows again.

delta-rs's vacuum keeps the vector files live files reference but never deletes the
others; :func:`delete_unreferenced_vectors` does, once no version newer than the vacuum
retention can need them.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any, Final
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable, Schema, write_deltalake

from tidemark.lake import delta_log
from tidemark.lake.deletion_vector import DeletionVector, read_vector
from tidemark.lake.key_hashes import plain_schema
from tidemark.lake.mor_rows import SCRATCH_DIR, conform_columns, move_files, target_file_size
from tidemark.lake.relocations import RELOCATIONS, MovedFile, Relocation

#: delta-rs's file size where the table sets none (``delta.targetFileSize``).
_DEFAULT_FILE_SIZE: Final = 100 << 20
#: How a file holding deletion vectors is named (Delta protocol).
_VECTOR_FILE_GLOB: Final = "deletion_vector_*.bin"


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


def compact_small(root: Path, state: delta_log.LogState, small_bytes: int,
                  max_bytes: int) -> VectorCompaction | None:
    """Rewrite the oldest files of the local table *root* under *small_bytes* (up to
    *max_bytes* of them) into one file's worth, without their deleted rows, as one
    commit; None when fewer than two are that small. delta-rs's compaction would also
    rewrite every file under its target size, so the file it made last time (nearly
    full) again and again, and the writer's key index would load all its keys again at
    each; here a file past *small_bytes* is left to :func:`compact_deleted`. Raises
    :class:`tidemark.lake.delta_log.CommitConflictError` as :func:`compact_deleted`."""
    chosen = small_files_due(state, small_bytes, max_bytes)
    return _rewrite(root, state, chosen, {"reason": "small files"}, small=True) \
        if chosen else None


def compact_deleted(root: Path, state: delta_log.LogState, threshold: float,
                    max_bytes: int) -> VectorCompaction | None:
    """Rewrite the files of the local table *root* (at *state*, its latest version)
    whose deleted fraction is at least *threshold* (up to *max_bytes* of them) without
    their deleted rows, as one commit. None when no file is due. Raises
    :class:`tidemark.lake.delta_log.CommitConflictError` when another writer committed
    first (nothing is changed then)."""
    chosen = due_files(state, threshold, max_bytes)
    if not chosen:
        return None
    return _rewrite(root, state, chosen, {"reason": "deleted rows",
                                          "deletedFraction": str(threshold)})


def _rewrite(root: Path, state: delta_log.LogState, chosen: list[dict[str, Any]],
             parameters: dict[str, str], *, small: bool = False) -> VectorCompaction:
    """Rewrite the *chosen* live files (their live rows, in order) as one commit of
    removes and adds, ``dataChange: false``; note where the rows went
    (:data:`tidemark.lake.relocations.RELOCATIONS`) for the writer's key index."""
    schema = _table_schema(state)
    partitions = list(state.metadata.get("partitionColumns") or [])
    scratch = root / SCRATCH_DIR / uuid.uuid4().hex
    added: list[dict[str, Any]] = []
    dropped = 0
    try:
        live, moved = [], []
        for add in chosen:
            rows, deleted = _live_rows(root, add, schema, partitions)
            dropped += deleted
            live.append(rows)
            dv = add.get("deletionVector")
            moved.append(MovedFile(add["path"], DeletionVector.from_json(dv).unique_id
                                   if dv else None, len(rows)))
        # One chunk: delta-rs writes a table of several chunks in no fixed order.
        written = _write_pieces(scratch, pa.concat_tables(live).combine_chunks(), partitions,
                                chosen, state)
        outputs: list[tuple[str, int]] = []
        for piece, adds in written:
            added += [{**a, "dataChange": False} for a in move_files(piece, root, adds)]
            if len(adds) == 1:
                outputs.append((adds[0]["path"], delta_log.num_records(adds[0]) or -1))
        relocation = Relocation(tuple(moved), tuple(outputs)) \
            if len(outputs) == len(written) else None
        now = delta_log.now_ms()
        actions: list[dict[str, Any]] = [{"commitInfo": {
            "timestamp": now, "operation": "OPTIMIZE", "operationParameters": parameters,
            "clientVersion": "tidemark"}}]
        for add in chosen:
            removal, _ = delta_log.replace_file_actions(add, None, now)
            removal["remove"]["dataChange"] = False
            actions.append(removal)
        actions += [{"add": a} for a in added]
        try:
            delta_log.commit(root, state.version + 1, actions)
        except delta_log.CommitConflictError:
            for a in added:  # unreferenced: not worth waiting for vacuum
                (root / unquote(a["path"])).unlink(missing_ok=True)
            raise
        if relocation is not None:  # the index checks it before taking it
            RELOCATIONS.note(root, relocation)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return VectorCompaction(files_removed=len(chosen), files_added=len(added),
                            rows_dropped=dropped, version=state.version + 1, small=small)


def _write_pieces(scratch: Path, rows: pa.Table, partitions: list[str],
                  chosen: list[dict[str, Any]], state: delta_log.LogState
                  ) -> list[tuple[Path, list[dict[str, Any]]]]:
    """Write *rows* as files of about the target's file size: each piece of them into a
    scratch table of its own, so that which rows each new file holds is known (a
    partitioned table's rows go in one write: its files split by partition). Returns
    each scratch table with its add actions."""
    if not len(rows):
        return []
    size = target_file_size(state)
    if partitions:
        pieces = [rows]
    else:
        records = [delta_log.num_records(add) for add in chosen]
        estimate = float(sum(int(add["size"]) for add in chosen))
        if all(records):  # the live rows' share of the bytes
            estimate *= len(rows) / sum(r or 0 for r in records)
        # Rounded: a rewrite of a file a little over the size stays one file (two
        # halves would double the files every uniform batch touches).
        count = min(len(rows), max(1, round(estimate / (size or _DEFAULT_FILE_SIZE))))
        bounds = [len(rows) * i // count for i in range(count + 1)]
        pieces = [rows.slice(a, b - a) for a, b in itertools.pairwise(bounds)]
        size = 2 * (size or _DEFAULT_FILE_SIZE)  # one file a piece
    written = []
    for number, piece in enumerate(pieces):
        target = scratch / str(number)
        write_deltalake(os.fspath(target), piece, mode="error",
                        partition_by=partitions or None, target_file_size=size)
        written.append((target, list(delta_log.read_log(target).files.values())))
    return written


def _table_schema(state: delta_log.LogState) -> pa.Schema:
    return plain_schema(pa.schema(Schema.from_json(state.metadata["schemaString"]).to_arrow()))


def _live_rows(root: Path, add: dict[str, Any], schema: pa.Schema, partitions: list[str]
               ) -> tuple[pa.Table, int]:
    """The live rows of the data file *add*, in its order and in *schema* (its
    partition values as columns), and how many deleted rows were dropped."""
    rows = pq.read_table(root / unquote(add["path"]))
    rows = rows.cast(plain_schema(rows.schema))
    keep = np.ones(len(rows), dtype=bool)
    if add.get("deletionVector"):  # a small file may have none
        deleted = read_vector(root, DeletionVector.from_json(add["deletionVector"]))
        positions = np.frombuffer(deleted.to_array(), dtype=np.uint64).astype(np.int64)
        keep[positions[positions < len(rows)]] = False
        rows = rows.filter(pa.array(keep))
    values = add.get("partitionValues") or {}
    for name in partitions:
        field = schema.field(name)
        value = values.get(name)
        column = pa.nulls(len(rows), field.type) if value is None else \
            pa.array([value] * len(rows), pa.string()).cast(field.type)
        rows = rows.append_column(name, column) if name not in rows.column_names else rows
    nullable = pa.schema([f.with_nullable(True) for f in schema])
    return conform_columns(rows, nullable), len(keep) - int(keep.sum())


# -- vacuum ------------------------------------------------------------------------------
def vacuum_keeping_vectors(table: DeltaTable, root: Path,
                           retention_hours: int) -> tuple[int, int]:
    """Vacuum of a local table with deletion vectors: the data files delta-rs's full
    vacuum would delete, then the vector files :func:`delete_unreferenced_vectors`
    finds. Returns how many of each were deleted.

    delta-rs's full vacuum (deltalake 1.6.6) deletes every vector file older than the
    retention, the live ones too (measured: the table is then unreadable), so it only
    lists here, and its vector files are left out."""
    listed = table.vacuum(retention_hours=retention_hours, dry_run=True,
                          enforce_retention_duration=False, full=True)
    data = {name for name in listed if not _is_vector_file(Path(name).name)}
    for name in data:
        path = root / name
        (path if path.exists() else root / unquote(name)).unlink(missing_ok=True)
    return len(data), delete_unreferenced_vectors(root, retention_hours)


def _is_vector_file(name: str) -> bool:
    return name.startswith("deletion_vector_") and name.endswith(".bin")


def delete_unreferenced_vectors(root: Path, retention_hours: float,
                                now: float | None = None) -> int:
    """Delete the deletion vector files in the local table *root* that no version newer
    than *retention_hours* can reference: referenced by no live file, named by no commit
    or checkpoint written since, and older than that themselves. Returns how many."""
    now = time.time() if now is None else now
    cutoff = now - retention_hours * 3600
    candidates = [p for p in root.glob(_VECTOR_FILE_GLOB) if _mtime(p) < cutoff]
    if not candidates:
        return 0
    state = delta_log.read_log(root)
    needed = {path for add in state.files.values()
              if (path := _vector_file(root, add.get("deletionVector"))) is not None}
    for entry in (root / "_delta_log").iterdir():
        if _mtime(entry) < cutoff:
            continue
        if entry.name.endswith(".json"):
            for action in _read_actions(entry):
                for kind in ("add", "remove"):
                    if kind in action and (path := _vector_file(
                            root, action[kind].get("deletionVector"))) is not None:
                        needed.add(path)
        elif entry.name.endswith(".parquet"):
            needed |= _checkpoint_vectors(root, entry)
    deleted = 0
    for path in candidates:
        if path not in needed:
            path.unlink(missing_ok=True)
            deleted += 1
    return deleted


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return float("inf")  # gone meanwhile: neither a candidate nor a reference


def _read_actions(path: Path) -> list[dict[str, Any]]:
    try:
        with open(path, encoding="utf-8") as source:
            return [json.loads(line) for line in source if line.strip()]
    except FileNotFoundError:
        return []


def _vector_file(root: Path, dv: dict[str, Any] | None) -> Path | None:
    if not dv or dv.get("storageType") == "i":
        return None
    try:
        return DeletionVector.from_json(dv).absolute_path(root)
    except ValueError:
        return None


def _checkpoint_vectors(root: Path, path: Path) -> set[Path]:
    """The vector files a checkpoint's adds and removes reference."""
    found: set[Path] = set()
    names = pq.read_schema(path).names
    for kind in ("add", "remove"):
        if kind not in names:
            continue
        for value in pq.read_table(path, columns=[kind]).column(kind).to_pylist():
            if value is not None and (file := _vector_file(
                    root, value.get("deletionVector"))) is not None:
                found.add(file)
    return found
