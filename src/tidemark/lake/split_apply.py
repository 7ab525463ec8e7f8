"""One batch applied to one Delta target by several processes, committed as one.

``tidemark run`` applies a batch on Spark's executors: every target is at least one task,
and a big batch of a big target is split into parts by ranges of the first key column,
one task each. A part merges its changes into a branch of the target
(:class:`tidemark.lake.branch.Branch`), and the driver commits all the parts' branches as
one Delta transaction carrying the batch's app transaction, so readers see the whole
batch or none of it and a replayed batch is still recognised.

The ranges are cut between the target's files, never inside one: the files whose ranges
of the first key overlap form groups (:func:`tidemark.lake.clustering.overlapping_groups`)
and a cut falls in a gap between two groups, placed to balance the parts' bytes. A part's
changes lie in its range, and delta-rs prunes a merge to the files whose range meets the
changes' keys, so no two parts rewrite the same file. The publish checks it anyway
(:class:`tidemark.lake.branch.OverlapError`: a truncate, which deletes in every range,
does that): the caller then applies the batch as one part. Once split, a target's parts
write files inside their ranges, so the next batch can be cut at the same places.

A batch is split only where every piece of that is safe: an integer first key column
with statistics, an unpartitioned local table without deletion vectors, not a snapshot
load. Everything else is one part, which applies and commits the batch itself
(:func:`tidemark.lake.delta_writer.apply_changes_in_steps`), as the driver used to.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, Transaction

from tidemark.lake import change_rows as cr
from tidemark.lake.batch_pieces import whole_versions
from tidemark.lake.branch import (
    Branch,
    BranchUnsupportedError,
    check_branchable,
    discard_branches,
    local_root,
    publish_branches,
)
from tidemark.lake.clustering import FileRange, key_ranges, overlapping_groups
from tidemark.lake.delta_target import NewColumnValues, add_new_columns, open_target
from tidemark.lake.delta_writer import (
    ApplyResult,
    SnapshotLoad,
    apply_changes,
    apply_changes_in_steps,
    apply_step,
    holds,
)
from tidemark.lake.high_water import HIGH_WATER_KEY, encode_high_water, read_high_water
from tidemark.lake.spec import ApplySpec

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class TargetPlan:
    """How one target takes one batch, made on the driver before the tasks run and
    shipped to them (picklable)."""

    uri: str
    spec: ApplySpec
    app_id: str
    version: int
    step_rows: int
    """Change rows merged at once (``spark.apply_step_rows``)."""
    storage_options: dict[str, str] | None = None
    snapshot_load: SnapshotLoad | None = None
    bounds: tuple[int, ...] = ()
    """Cut points of the first key column: part *i* holds the keys from
    ``bounds[i - 1]`` (inclusive) to ``bounds[i]`` (exclusive)."""
    base_version: int | None = None
    """The target's version the parts branch from (split plans only)."""
    previous_high_water: tuple[Any, ...] | None = None
    step_bytes: int = 64 << 20
    """Bytes of change rows merged at once, about (``spark.apply_step_mb``)."""

    @property
    def parts(self) -> int:
        """How many tasks apply the batch to this target."""
        return len(self.bounds) + 1

    def one_part(self) -> TargetPlan:
        """This plan with the batch applied as one part."""
        return dataclasses.replace(self, bounds=(), base_version=None,
                                   previous_high_water=None)


@dataclasses.dataclass(frozen=True)
class PartResult:
    """What one task did with its part of a batch for one target."""

    part: int
    result: ApplyResult
    branch: str | None = None
    """The branch the part merged into, for the driver to publish (split plans)."""
    high_water: tuple[Any, ...] | None = None
    needs_one_part: bool = False
    """The part holds a change without a key (a truncate, which reaches every range) or
    the insert of a primary-key change that must take values from the old key: nothing
    was applied, and the batch must be applied as one part."""


def plan_target(uri: str, spec: ApplySpec, schema: pa.Schema, *, app_id: str, version: int,
                parts: int, step_rows: int, step_bytes: int = 64 << 20,
                storage_options: dict[str, str] | None = None,
                snapshot_load: SnapshotLoad | None = None,
                new_column_values: NewColumnValues | None = None
                ) -> TargetPlan | ApplyResult:
    """The plan for applying batch *version* (rows of *schema*) to the target at *uri*
    in up to *parts* parts; an ApplyResult instead when the target already holds the
    batch (a replay). A split plan has given the target the batch's new columns."""
    plan = TargetPlan(uri, spec, app_id, version, step_rows, storage_options, snapshot_load,
                      step_bytes=step_bytes)
    table = open_target(uri, storage_options)
    if table is None:
        return plan
    if holds(table, app_id, version, uri):
        return ApplyResult(delta_version=table.version(), already_applied=True)
    if parts < 2 or snapshot_load is not None or not spec.keys:
        return plan
    try:
        check_branchable(table)
    except BranchUnsupportedError:
        return plan
    ranges = key_ranges(table, spec.keys[0])
    bounds = cut_points(ranges, parts) if ranges else ()
    if not bounds:
        return plan
    table = add_new_columns(table, schema, spec.resolve(schema), spec, new_column_values)
    discard_branches(local_root(table))
    high_water = read_high_water(table, spec, schema) if spec.ordered_batches else None
    return dataclasses.replace(plan, bounds=bounds, base_version=table.version(),
                               previous_high_water=high_water)


def cut_points(files: Sequence[FileRange], parts: int) -> tuple[int, ...]:
    """Up to ``parts - 1`` cut points between groups of overlapping *files*, each where
    the bytes before it come closest to an equal share; () when there is no gap."""
    groups = overlapping_groups(files)
    if len(groups) < 2 or parts < 2:
        return ()
    sizes = np.cumsum([sum(f.size for f in g) for g in groups])
    total = int(sizes[-1])
    cuts: list[int] = []
    for k in range(1, parts):
        # After group i (0-based) the share is sizes[i]; a cut after the last group
        # would leave a part without files.
        i = int(np.argmin(np.abs(sizes[:-1] - total * k / parts)))
        cut = min(f.low for f in groups[i + 1])
        if not cuts or cut > cuts[-1]:
            cuts.append(cut)
    return tuple(cuts)


def part_rows(plan: TargetPlan, part: int, rows: pa.Table) -> pa.Table:
    """The rows of *rows* that *part* applies: those whose first key falls in its range.
    Rows without a key (truncates, which reach every range) are kept, and the part then
    asks for the batch to be applied whole (:attr:`PartResult.needs_one_part`)."""
    if plan.parts == 1:
        return rows
    keys = rows.column(plan.spec.keys[0])
    if keys.null_count:
        return rows
    numbers = np.searchsorted(np.asarray(plan.bounds, dtype=np.int64), keys.to_numpy(),
                              side="right")
    return rows.filter(pa.array(numbers == part))


def apply_part(plan: TargetPlan, part: int, pieces: Iterable[pa.Table], attempt: str, *,
               new_column_values: NewColumnValues | None = None) -> PartResult:
    """Apply one part of a batch: *pieces* of its change rows in commit order. One part
    of one applies and commits the batch; a part of a split plan merges into a branch
    named by *part* and *attempt* (a retried task makes a new one)."""
    if plan.parts == 1:
        return PartResult(part, _apply_whole(plan, pieces, new_column_values))
    assert plan.base_version is not None
    table = DeltaTable(plan.uri, version=plan.base_version,
                       storage_options=plan.storage_options)
    branch = Branch(table, f"{plan.app_id}-{plan.version}-p{part}-{attempt}", alone=False)
    chunks: Iterable[pa.Table] = pieces
    if plan.spec.stored_as_scd_type == 2:
        chunks = whole_versions(chunks, plan.spec.version_column)
    result, high_water, columns = ApplyResult(), None, None
    for piece in chunks:
        if piece.column(plan.spec.keys[0]).null_count or _moves_keep_values(piece):
            return PartResult(part, ApplyResult(), str(branch.root), needs_one_part=True)
        columns = columns or plan.spec.resolve(piece.schema)
        applied, top = apply_step(branch.table, piece, plan.spec, columns,
                                   plan.previous_high_water, plan.uri)
        result += applied
        if top is not None and (high_water is None or top > high_water):
            high_water = top
    return PartResult(part, result, str(branch.root), high_water)


def _moves_keep_values(rows: pa.Table) -> bool:
    """Whether *rows* hold an insert that does not know a value: the new key of a
    primary-key change takes it from the old key, which may lie in another part, with
    changes of its own there; one part sees both."""
    if cr.OP not in rows.column_names or cr.UNAVAILABLE not in rows.column_names:
        return False
    inserts = rows.filter(pc.equal(rows.column(cr.OP), "c"))
    return bool(len(inserts)) and bool(
        pc.any(pc.greater(pc.list_value_length(inserts.column(cr.UNAVAILABLE)), 0)).as_py())


def _apply_whole(plan: TargetPlan, pieces: Iterable[pa.Table],
                 new_column_values: NewColumnValues | None) -> ApplyResult:
    if plan.snapshot_load is None:
        return apply_changes_in_steps(plan.uri, pieces, plan.spec, app_id=plan.app_id,
                                      version=plan.version,
                                      storage_options=plan.storage_options,
                                      new_column_values=new_column_values)
    # A snapshot's rows are bounded by the snapshot's chunk settings.
    chunks = list(pieces)
    return apply_changes(plan.uri, pa.concat_tables(chunks), plan.spec, app_id=plan.app_id,
                         version=plan.version, storage_options=plan.storage_options,
                         new_column_values=new_column_values,
                         snapshot_load=plan.snapshot_load)


def abandon(plan: TargetPlan) -> None:
    """Remove every branch the parts of a split plan made (nothing is published)."""
    discard_branches(local_root(DeltaTable(plan.uri, storage_options=plan.storage_options)))


def publish(plan: TargetPlan, parts: Sequence[PartResult]) -> ApplyResult:
    """Commit the branches of a split plan's *parts* as one Delta transaction (with the
    batch's app transaction and high-water mark) and remove every branch of the batch.
    Raises :class:`tidemark.lake.branch.OverlapError` (nothing committed, the branches
    removed) when two parts rewrote the same file."""
    assert plan.base_version is not None
    result = ApplyResult()
    for part in parts:
        result += part.result
    tops = [p.high_water for p in parts if p.high_water is not None]
    table = DeltaTable(plan.uri, storage_options=plan.storage_options)
    root = local_root(table)
    try:
        if not tops:  # every change was already applied
            return result
        commit = CommitProperties(
            app_transactions=[Transaction(plan.app_id, plan.version)],
            custom_metadata={HIGH_WATER_KEY: encode_high_water(plan.spec, max(tops))})
        branches = [Branch.attach(table, p.branch, plan.base_version) for p in parts
                    if p.branch is not None]
        version = publish_branches(table, branches, commit)
    finally:
        # Published, given up, or left by a failed try of a task.
        discard_branches(root)
    log.info("applied batch %s to %s in %d parts as one commit (version %d)", plan.version,
             plan.uri, len(parts), version)
    return dataclasses.replace(result, delta_version=version)

