"""Keeping a Delta table healthy while it takes a commit every batch, for months.

A pipeline commits to each target once per micro-batch: at two a second an insert-heavy
target gains thousands of small files an hour and its ``_delta_log`` one JSON file per
batch, and every reader (Spark, DuckDB, Polars, delta-rs) slows down listing and
opening them. :func:`upkeep` is run by the writer itself between its batches, so it never
conflicts with a merge; each task runs only when due:

* **compaction** (``optimize.compact``, which keeps the files' order, so a table
  clustered by key stays so): when ``compact_min_files`` files are smaller than half of
  ``target_file_mb``. A compaction commit changes no data: readers and the app
  transactions that make batches exactly-once are unaffected. Its cost is bounded by the
  small files it rewrites, not the table. On a merge-on-read target tidemark rewrites
  the oldest small files into one file's worth itself
  (:func:`tidemark.lake.vector_compaction.compact_small`): delta-rs's would rewrite
  every file under the target size each time, the nearly full one it made last time
  included, and the key index would reload all its keys.
* **deleted rows** (merge-on-read targets, :mod:`tidemark.lake.vector_compaction`): a
  file whose deletion vector marks at least ``compact_deleted_fraction`` of its rows is
  rewritten without them, in its order (up to ``_DELETED_MAX_FILES`` target file's worth a
  call, the most deleted first);
* **clustering** (:mod:`tidemark.lake.clustering`): when ``cluster_min_files`` files
  overlap in their range of the first key column and hold more than one and a half
  target files, their rows are rewritten sorted by key, so that later merges, pruned by
  those ranges, rewrite few files (on a merge-on-read table, whose merges rewrite no
  file, less and less often while it keeps finding groups to sort);
* **checkpoint** every ``checkpoint_every`` commits, so a reader loads one Parquet
  checkpoint and the JSON commits after it instead of the whole log;
* **log cleanup** after a checkpoint: commits older than ``log_retention_hours`` (which
  also bounds time travel) are deleted;
* **vacuum** every ``vacuum_every_minutes``: data files that no version newer than
  ``vacuum_retention_hours`` references are deleted (the default, 7 days, is Delta's:
  longer than any reader or time travel should need), and deletion vector files no
  version in that time references (delta-rs's full vacuum deletes the live ones too once
  they are older than the retention, so on a table with deletion vectors it only lists:
  :func:`tidemark.lake.vector_vacuum.vacuum_keeping_vectors`).

``tidemark run`` calls it with ``background=True``: a merge-on-read table's rewrites
and a local table's checkpoints are written on a thread of their own while the next
batches are applied, and reported (the rewrites committed, the log cleaned up) by the
first call after they are done. After a rewrite beside the batches the next one waits
as long as it took (``_REWRITE_PAUSE``).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import logging
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Final

import msgspec
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from tidemark.lake import background_rewrite, delta_log
from tidemark.lake.background_rewrite import PendingRewrite
from tidemark.lake.branch import local_directory
from tidemark.lake.clustering import cluster
from tidemark.lake.delta_read import has_deletion_vectors_feature
from tidemark.lake.vector_compaction import (
    REWRITE_SCRATCH_DIR,
    RewritePlan,
    deleted_rows_plan,
    rewrite,
    small_files_plan,
)
from tidemark.lake.vector_vacuum import vacuum_keeping_vectors

log = logging.getLogger(__name__)

_LOG_RETENTION: Final = "delta.logRetentionDuration"
#: The largest group of overlapping files clustering sorts, in target file sizes: a
#: bigger one is most of the table (changes hitting keys everywhere), not worth a rewrite.
_CLUSTER_MAX_FILES: Final = 4
#: Calls (batches) between two clusterings of a target at least. Where the changes'
#: keys spread over more than the files clustering leaves, each merge makes its files
#: overlap again and sorting them would not make the next merge cheaper: this bounds
#: that waste to a twentieth of the merges' work.
_CLUSTER_EVERY: Final = 20
#: On a merge-on-read table the interval doubles each time clustering sorts a group, up
#: to this many batches, and is back to _CLUSTER_EVERY once it finds nothing to sort.
#: Its batches do not rewrite files, so clustering buys them nothing, and where updates
#: spread over every key each batch's file overlaps the whole table again: at 1M rows
#: and 10,000 changes/s it sorted the whole table (1.5-3 s) every 20 batches.
_CLUSTER_EVERY_MAX: Final = 1280
#: The most a rewrite of files with deleted rows takes at a time, in target file sizes:
#: where updates spread evenly, every file passes the threshold at about the same batch,
#: and the rewrite is spread over the following batches instead of stalling one (at 4,
#: a 10M-row soak's commit->visible p99 went from 1.6 to 2.2 s while they ran).
_DELETED_MAX_FILES: Final = 1
#: After a rewrite beside the batches, the next one waits this many times as long as
#: the last took to write its files, so that the rewrite thread has at most half of a
#: core: a rewrite's CPU comes out of the batches (on two cores the driver, Spark and
#: the source share them). Uniform deletes bring every file of a snapshot past
#: ``compact_deleted_fraction`` within a minute; back to back, six 2M-row rewrites of
#: 3-5 s each took a 10M-row soak's commit->visible p99 from 1.5 to 2.8 s for that
#: window.
_REWRITE_PAUSE: Final = 1.0
#: The tasks that read or list the table's files: at most one of them runs per batch.
HEAVY_TASKS: Final = frozenset({"compact_deleted", "compact", "cluster", "vacuum"})


Count = Annotated[int, msgspec.Meta(ge=0)]
Fraction = Annotated[float, msgspec.Meta(ge=0, le=1)]


class UpkeepSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """How a target is kept healthy (``[upkeep]`` in ``pipeline.toml``, or per target)."""

    enabled: bool = True
    target_file_mb: Annotated[int, msgspec.Meta(ge=1)] = 16
    """Compaction writes files of about this size; smaller merges then rewrite less."""
    compact_min_files: Count = 16
    """Compact once this many files are smaller than half of ``target_file_mb``
    (0: never compact)."""
    compact_deleted_fraction: Fraction = 0.3
    """Rewrite a file without its deleted rows once its deletion vector marks this
    fraction of them (merge-on-read targets; 0: never)."""
    cluster_min_files: Count = 2
    """Sort a group of files by key once this many overlap in their key range and hold
    more than one and a half ``target_file_mb`` (0: never); see
    :mod:`tidemark.lake.clustering`."""
    checkpoint_every: Count = 20
    """Commits between two checkpoints (0: only delta-rs' own, every 100 commits)."""
    log_retention_hours: Count = 168
    """Commits older than this are deleted after a checkpoint (time travel goes this far
    back at most)."""
    vacuum_every_minutes: Count = 60
    """How often unreferenced data files are deleted (0: never)."""
    vacuum_retention_hours: Count = 168
    """A file no version newer than this references is deleted by vacuum."""


@dataclasses.dataclass(frozen=True)
class UpkeepTask:
    """One upkeep task that ran: what it did and how long it took."""

    name: str
    """``compact_deleted``, ``compact``, ``cluster``, ``checkpoint``, ``cleanup`` or
    ``vacuum``."""
    detail: str
    seconds: float

    def __str__(self) -> str:
        return f"{self.detail} ({self.seconds:.1f} s)"


@dataclasses.dataclass
class UpkeepState:
    """What upkeep remembers of a target between batches (this process only)."""

    last_vacuum: float | None = None
    """When vacuum last ran (``time.time()``); the first call of :func:`upkeep` sets it."""
    batches_since_cluster: int = _CLUSTER_EVERY
    """Calls of :func:`upkeep` since clustering last ran (the first may cluster)."""
    cluster_every: int = _CLUSTER_EVERY
    """Calls between two clusterings (grows on merge-on-read tables, see
    ``_CLUSTER_EVERY_MAX``)."""
    log: delta_log.LogState | None = None
    """The live files with their deletion vectors, brought up to date from the newer
    commits at each call (merge-on-read targets only)."""
    rewrite: PendingRewrite | None = None
    """A rewrite of files running beside the batches (``upkeep(background=True)``)."""
    checkpoint: concurrent.futures.Future[list[UpkeepTask]] | None = None
    """A checkpoint being written beside the batches (``upkeep(background=True)``)."""
    scratch_cleared: bool = False
    """Whether what an earlier process's rewrites left in the scratch folder is gone."""
    rewrite_after: float = 0.0
    """When (``time.monotonic()``) the next rewrite may start: see ``_REWRITE_PAUSE``."""
    beside: bool = True
    """Whether the next rewrite may run beside the batches: after one was abandoned (it
    could not place the rows deleted meanwhile, or a file of it went), the next runs
    between two batches, so that the same files are not written again and again."""


def compaction_target(table: DeltaTable, settings: UpkeepSettings) -> int:
    """The file size compaction writes, in bytes: ``target_file_mb``, or half of it on a
    table with deletion vectors. delta-rs rewrites every file under this size: a
    merge-on-read table's batches add small files beside full ones, and the full ones
    would be copied again at every compaction (a 1M-row file every 16 batches)."""
    return settings.target_file_mb << (19 if has_deletion_vectors_feature(table) else 20)


def small_files(table: DeltaTable, settings: UpkeepSettings) -> int:
    """How many of the table's files are under half of the compaction target (see
    :func:`compaction_target`): what compaction is for."""
    sizes = pa.table(table.get_add_actions(flatten=True)).column("size_bytes")
    limit = compaction_target(table, settings) // 2
    return int(pc.sum(pc.less(sizes, limit)).as_py() or 0)


def last_checkpoint(root: Path) -> int | None:
    """The version of the local table's last checkpoint (None: none yet)."""
    try:
        return int(json.loads((root / "_delta_log" / "_last_checkpoint").read_text())
                   ["version"])
    except (OSError, ValueError, KeyError):
        return None


def table_properties(settings: UpkeepSettings) -> dict[str, str]:
    """The table properties that carry *settings* into delta-rs."""
    # delta-rs's checkpoint would also delete the expired log files, and a checkpoint is
    # written beside the batches: only the writer's thread deletes (cleanup_metadata).
    return {_LOG_RETENTION: f"interval {settings.log_retention_hours} hours",
            "delta.enableExpiredLogCleanup": "false",
            "delta.deletedFileRetentionDuration":
                f"interval {settings.vacuum_retention_hours} hours",
            "delta.targetFileSize": str(settings.target_file_mb << 20)}


def upkeep(table: DeltaTable, settings: UpkeepSettings, state: UpkeepState,
           *, keys: Sequence[str] = (), now: float | None = None,
           heavy: bool = True, background: bool = False) -> list[UpkeepTask]:
    """Run the upkeep tasks that are due on the local *table* (whose rows are keyed by
    *keys*, if any); returns those that ran.

    With *heavy* false, compaction, clustering and vacuum (which read or list files)
    wait for a later call even when due: a pipeline runs at most one of them per batch,
    so a batch is never late by more than one. With *background*, a merge-on-read
    table's rewrites write their files beside the caller's next batches and are
    committed by the first call after they are written
    (:mod:`tidemark.lake.background_rewrite`; no other heavy task runs meanwhile), and a
    local table's checkpoints are written beside them too."""
    if not settings.enabled:
        return []
    now = time.time() if now is None else now
    if state.last_vacuum is None:  # the first vacuum comes one interval after the start
        state.last_vacuum = now
    local = local_directory(table.table_uri)
    root = local if local is not None else Path(table.table_uri)
    tasks: list[UpkeepTask] = []
    if local is not None and not state.scratch_cleared:
        # A target has one writer: what an earlier process left there is not in use.
        shutil.rmtree(root / REWRITE_SCRATCH_DIR, ignore_errors=True)
        state.scratch_cleared = True
    if state.rewrite is not None:
        if state.rewrite.done():
            task = _finish_rewrite(table, root, state)
            if task is not None:
                tasks.append(task)
        # One rewrite at a time; clustering could pick its files and vacuum delete its
        # new ones, in no version yet.
        heavy = False
    # Paused after a rewrite beside the batches (_REWRITE_PAUSE): neither rewrite is
    # planned, nor the table's files counted for one.
    rewrites = heavy and not (background and time.monotonic() < state.rewrite_after)
    if rewrites and settings.compact_deleted_fraction and local is not None and \
            has_deletion_vectors_feature(table):
        task = _compact_deleted(table, root, settings, state, background)
        if task is not None:
            tasks.append(task)
    if rewrites and not tasks and settings.compact_min_files and \
            small_files(table, settings) >= settings.compact_min_files:
        if local is not None and has_deletion_vectors_feature(table):
            task = _compact_small(table, root, settings, state, background)
            if task is not None:
                tasks.append(task)
        else:
            started = time.monotonic()
            metrics = table.optimize.compact(target_size=compaction_target(table, settings),
                                             max_concurrent_tasks=1)
            table.update_incremental()
            tasks.append(UpkeepTask(
                "compact", f"compacted {metrics.get('numFilesRemoved', 0)} files into "
                           f"{metrics.get('numFilesAdded', 0)}", time.monotonic() - started))
    state.batches_since_cluster += 1
    if heavy and not tasks and settings.cluster_min_files and \
            state.batches_since_cluster >= state.cluster_every:
        started = time.monotonic()
        target = settings.target_file_mb << 20
        done = cluster(table, keys, min_files=settings.cluster_min_files,
                       min_bytes=target * 3 // 2, max_bytes=_CLUSTER_MAX_FILES * target,
                       target_file_size=target)
        if done is not None:
            state.batches_since_cluster = 0
            if has_deletion_vectors_feature(table):
                state.cluster_every = min(2 * state.cluster_every, _CLUSTER_EVERY_MAX)
            tasks.append(UpkeepTask("cluster", done, time.monotonic() - started))
        else:
            state.cluster_every = _CLUSTER_EVERY
    if state.checkpoint is not None and state.checkpoint.done():
        tasks += _checkpoint_done(table, state)
    version = table.version()
    last = last_checkpoint(root)
    if settings.checkpoint_every and state.checkpoint is None and \
            version - (last if last is not None else -1) >= settings.checkpoint_every:
        if background and local is not None:
            # A checkpoint of a table whose batches touch every file grows with them (0.1
            # to 0.5 s in 30 minutes of a 10M-row soak): written beside the batches, from
            # a table of its own at this version; the properties' commit stays here.
            _ensure_properties(table, settings)
            state.checkpoint = background_rewrite.REWRITER.submit(
                _checkpoint, root, table.version())
        else:
            tasks += _checkpoint(table, version)
            _ensure_properties(table, settings)
    # Vacuum reads the log's checkpoints: not while one is being written.
    heavy = heavy and state.checkpoint is None and \
        not any(task.name in HEAVY_TASKS for task in tasks)
    if heavy and settings.vacuum_every_minutes and \
            now - state.last_vacuum >= settings.vacuum_every_minutes * 60:
        started = time.monotonic()
        vectors = 0
        if local is not None and has_deletion_vectors_feature(table):
            deleted, vectors = vacuum_keeping_vectors(table, root,
                                                      settings.vacuum_retention_hours)
        else:
            deleted = len(table.vacuum(retention_hours=settings.vacuum_retention_hours,
                                       dry_run=False, enforce_retention_duration=False,
                                       full=True))
        state.last_vacuum = now
        tasks.append(UpkeepTask("vacuum", f"vacuum deleted {deleted} files"
                                + (f" and {vectors} deletion vector files" if vectors else ""),
                                time.monotonic() - started))
    for task in tasks:
        log.debug("%s: %s", table.table_uri, task)
    return tasks


def _compact_deleted(table: DeltaTable, root: Path, settings: UpkeepSettings,
                     state: UpkeepState, background: bool) -> UpkeepTask | None:
    """Rewrite the files with the most deleted rows, if any passes the threshold."""
    return _rewrite(table, root, state, "compact_deleted", "rewrite of files with deleted rows",
                    lambda log_state: deleted_rows_plan(
                        log_state, settings.compact_deleted_fraction,
                        _DELETED_MAX_FILES * (settings.target_file_mb << 20)), background)


def _compact_small(table: DeltaTable, root: Path, settings: UpkeepSettings,
                   state: UpkeepState, background: bool) -> UpkeepTask | None:
    """Merge the oldest small files of a merge-on-read table (under half the compaction
    target) into one file of up to ``target_file_mb``
    (:func:`tidemark.lake.vector_compaction.small_files_plan`): every uniform batch
    touches every file, so the fewer the better (half as many as with outputs of half
    the size)."""
    small = compaction_target(table, settings) // 2
    return _rewrite(table, root, state, "compact", "compaction of small files",
                    lambda log_state: small_files_plan(log_state, small,
                                                       settings.target_file_mb << 20),
                    background)


def _rewrite(table: DeltaTable, root: Path, state: UpkeepState, name: str, what: str,
             plan_of: Callable[[delta_log.LogState], RewritePlan | None],
             background: bool) -> UpkeepTask | None:
    """Run (or with *background*, start) one of :mod:`tidemark.lake.vector_compaction`'s
    rewrites, planned on the table's log brought up to date; a commit by another writer
    meanwhile skips this round."""
    started = time.monotonic()
    state.log = _latest_log(root, state)
    plan = plan_of(state.log)
    if plan is None:
        return None
    # A partitioned table's rewrite writes its rows in no known order: the rows deleted
    # meanwhile could not be placed.
    if background and state.beside and not plan.partitions:
        state.rewrite = background_rewrite.start(root, plan, name, what)
        return UpkeepTask(name, f"{what} started beside the batches ({len(plan.chosen)} "
                                "files)", time.monotonic() - started)
    try:
        done = rewrite(root, state.log, plan)
    except delta_log.CommitConflictError as err:
        log.info("%s: %s skipped: %s", table.table_uri, what, err)
        return None
    state.beside = True
    table.update_incremental()
    return UpkeepTask(name, str(done), time.monotonic() - started)


def _latest_log(root: Path, state: UpkeepState) -> delta_log.LogState:
    """The table's live files at its latest version, from what *state* last read."""
    return delta_log.read_log(root) if state.log is None else \
        delta_log.advance(root, state.log)


def _finish_rewrite(table: DeltaTable, root: Path, state: UpkeepState) -> UpkeepTask | None:
    """Commit the rewrite that ran beside the batches (its files are written)."""
    pending, state.rewrite = state.rewrite, None
    assert pending is not None
    started = time.monotonic()
    state.log = _latest_log(root, state)
    done = background_rewrite.finish(root, pending, state.log)
    state.rewrite_after = time.monotonic() + _REWRITE_PAUSE * pending.seconds
    if done is None:
        state.beside = False
        return None
    table.update_incremental()
    return UpkeepTask(pending.name, f"{done}, written beside the batches in "
                                    f"{started - pending.started:.1f} s",
                      time.monotonic() - started)


def _checkpoint(table: DeltaTable | Path, version: int) -> list[UpkeepTask]:
    """A checkpoint of *table*, then the cleanup of the log files older than its
    retention; of the local table at that path at *version* (beside the batches), the
    checkpoint only: readers list the log and then open what they listed, and only
    the writer's own thread may delete from it (:func:`_checkpoint_done` cleans up)."""
    started = time.monotonic()
    if isinstance(table, Path):
        DeltaTable(str(table), version=version).create_checkpoint()
        return [UpkeepTask("checkpoint", f"checkpoint at version {version} beside the "
                                         "batches", time.monotonic() - started)]
    table.create_checkpoint()
    tasks = [UpkeepTask("checkpoint", f"checkpoint at version {version}",
                        time.monotonic() - started)]
    return tasks + _cleanup(table)


def _cleanup(table: DeltaTable) -> list[UpkeepTask]:
    """Delete the log files older than the table's log retention (after a checkpoint)."""
    root = local_directory(table.table_uri)
    before = _log_files(root) if root is not None else 0
    started = time.monotonic()
    table.cleanup_metadata()
    removed = before - _log_files(root) if root is not None else 0
    return [UpkeepTask("cleanup", f"deleted {removed} old log files",
                       time.monotonic() - started)] if removed > 0 else []


def _checkpoint_done(table: DeltaTable, state: UpkeepState) -> list[UpkeepTask]:
    """What the checkpoint written beside the batches did (nothing if it failed: logged,
    and the next call finds it due again)."""
    future, state.checkpoint = state.checkpoint, None
    assert future is not None
    try:
        tasks = future.result()
    except Exception as err:
        log.warning("%s: a checkpoint failed (the next batch tries again): %s",
                    table.table_uri, err)
        return []
    return tasks + _cleanup(table)


def _log_files(root: Path) -> int:
    return sum(1 for _ in (root / "_delta_log").glob("*.json"))


def _ensure_properties(table: DeltaTable, settings: UpkeepSettings) -> None:
    """Give the table the properties of *settings* (one commit, once, at its first
    checkpoint): delta-rs reads them when it writes files (``delta.targetFileSize``) and
    cleans up the log (``delta.logRetentionDuration``). Checkpoints are taken here, not
    by delta-rs' own interval (every 100 commits), so that each shows in the batch line."""
    wanted = table_properties(settings)
    current = table.metadata().configuration
    if any(current.get(key) != value for key, value in wanted.items()):
        table.alter.set_table_properties(wanted)
        table.update_incremental()

