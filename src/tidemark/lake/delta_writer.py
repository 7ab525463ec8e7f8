"""Apply a batch of change rows to a Delta Lake table with delta-rs: :func:`apply_changes`.

One batch is one Delta commit (a ``MERGE``), carrying the Delta app transaction
``(app_id, version)`` — Spark's query id and batch id — so a replayed batch is detected
and skipped, and the batch's highest sequence (the table's high-water mark, in the
commit's metadata). Creating the table and adding columns for new source columns are
separate commits before it; both are idempotent, so a crash between them and the merge
only means the replay finds them done. The target table and its new columns are
:mod:`tidemark.lake.delta_target`, the mark :mod:`tidemark.lake.high_water`, the MERGE
:mod:`tidemark.lake.delta_merge`.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
from collections.abc import Iterable, Iterator
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from tidemark.errors import ConfigError
from tidemark.lake.batch_pieces import taken, whole_key_changes, whole_versions
from tidemark.lake.branch import Branch, BranchUnsupportedError
from tidemark.lake.collapse import (
    IS_DELETE,
    PreparedBatch,
    drop_applied,
    prepare_batch,
    sequence_after,
)
from tidemark.lake.commit_conflicts import despite_other_writers
from tidemark.lake.delta_merge import merge_scd1, merge_scd2
from tidemark.lake.delta_target import (
    NewColumnValues,
    add_new_columns,
    create_target,
    open_target,
    target_fields,
)
from tidemark.lake.held_tables import HELD
from tidemark.lake.high_water import (
    HIGH_WATER_KEY,
    batch_high_water,
    encode_high_water,
    read_high_water,
)
from tidemark.lake.merge_choice import merges_on_read
from tidemark.lake.merge_on_read import merge_on_read, merge_on_read_steps
from tidemark.lake.spec import ApplySpec, ResolvedColumns
from tidemark.lake.utc_timestamps import utc_timestamps

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ApplyResult:
    """What one :func:`apply_changes` call did.

    ``inserted``/``updated``/``deleted`` count target rows (a truncate's deletes
    included; SCD2 closes a version by updating it and never deletes). ``skipped``
    counts changes that were not applied because the target already holds them or
    something newer (replayed, at or below the high-water mark, or older than the
    row); ``superseded`` those replaced by a later change of the same key in the batch
    (SCD1), or of the same key and version (SCD2). ``delta_version`` is the version
    the batch was committed as, or None when nothing was written. ``already_applied``
    is true when the whole batch was a replay recognised by its app transaction.
    """

    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    skipped: int = 0
    superseded: int = 0
    delta_version: int | None = None
    already_applied: bool = False
    merge: str = ""
    """How the batch was written: ``"copy_on_write"``, ``"merge_on_read"``, or empty
    when nothing was merged (a replay, a snapshot load)."""

    def __add__(self, other: ApplyResult) -> ApplyResult:
        return ApplyResult(
            inserted=self.inserted + other.inserted, updated=self.updated + other.updated,
            deleted=self.deleted + other.deleted, skipped=self.skipped + other.skipped,
            superseded=self.superseded + other.superseded,
            delta_version=other.delta_version if other.delta_version is not None
            else self.delta_version,
            already_applied=self.already_applied and other.already_applied,
            merge=other.merge or self.merge)


def _check_arguments(changes: object, app_id: object, version: object) -> None:
    if not isinstance(changes, pa.Table):
        raise ConfigError("changes", f"must be a pyarrow.Table of change rows, "
                                     f"got {type(changes).__name__}")
    if not isinstance(app_id, str) or not app_id:
        raise ConfigError("app_id", "must be a non-empty string (e.g. the query id)")
    if not isinstance(version, int) or version < 0:
        raise ConfigError("version", f"must be a non-negative integer, got {version!r}")


def apply_changes(target: str | os.PathLike[str], changes: pa.Table, spec: ApplySpec, *,
                  app_id: str, version: int,
                  storage_options: dict[str, str] | None = None,
                  new_column_values: NewColumnValues | None = None,
                  snapshot_load: SnapshotLoad | None = None) -> ApplyResult:
    """Apply one batch of change rows (see :mod:`tidemark.lake.change_rows`) to the
    Delta table at *target*, creating it on the first batch.

    ``(app_id, version)`` identify the batch (Spark: query id and batch id); versions of
    one app id must increase. A batch whose version the table already holds for
    *app_id* is skipped whole.

    When the changes bring columns the target lacks, they are added; the rows already in
    the target (the current versions, for SCD2) get the value *new_column_values*
    returns for a column (``ADD COLUMN … DEFAULT 'x'`` gives the existing rows ``'x'``
    in the source), else null.

    *snapshot_load* is for a snapshot's rows that no row of the target can conflict
    with, which the caller knows and the merge would find out at the cost of reading the
    table: ``"replace"`` makes them the table's whole content (a table's first chunk),
    ``"append"`` adds them (its later chunks, whose keys no earlier chunk holds). The
    batch is then written, not merged. SCD type 1 only; an SCD2 target merges anyway.

    When another writer commits to the table between this batch's read and its commit
    (delta-rs's ``CommitFailedError``), the batch is applied again on the new version,
    up to ``COMMIT_CONFLICT_RETRIES`` times (:mod:`tidemark.lake.commit_conflicts`).
    """
    _check_arguments(changes, app_id, version)
    changes = utc_timestamps(changes)
    uri = os.fspath(target)

    def attempt() -> ApplyResult:
        result, table = _apply_once(uri, changes, spec, app_id, version, storage_options,
                                    new_column_values, snapshot_load)
        if table is not None:
            HELD.give_back(uri, storage_options, table)
        return result

    return despite_other_writers(attempt, uri, app_id, version)


def _apply_once(uri: str, changes: pa.Table, spec: ApplySpec, app_id: str, version: int,
                storage_options: dict[str, str] | None,
                new_column_values: NewColumnValues | None,
                snapshot_load: SnapshotLoad | None) -> tuple[ApplyResult, DeltaTable | None]:
    """One attempt of :func:`apply_changes`, on the table's latest version; with the
    table, to be held for the next batch."""
    columns = spec.resolve(changes.schema)
    table = open_target(uri, storage_options)
    if table is not None and holds(table, app_id, version, uri):
        return ApplyResult(skipped=len(changes), delta_version=table.version(),
                           already_applied=True), table
    batch = prepare_batch(changes, spec, columns)
    skipped = 0
    previous_high_water = None
    if table is not None and spec.ordered_batches:
        previous_high_water = read_high_water(table, spec, changes.schema)
        if previous_high_water is not None:
            batch, skipped = drop_applied(batch, spec.sequence_by, previous_high_water)
    loads = snapshot_load is not None and spec.stored_as_scd_type == 1
    # An empty table's first chunk still replaces (and creates) the target.
    if len(batch.rows) == 0 and not batch.truncates and not (loads and snapshot_load ==
                                                             "replace"):
        return ApplyResult(skipped=skipped), table
    if table is None:
        table = create_target(uri, changes.schema, columns, spec, storage_options)
    else:
        table = add_new_columns(table, changes.schema, columns, spec, new_column_values)
    # An empty snapshot load (an empty table) carries no sequence to remember.
    high_water = {HIGH_WATER_KEY: encode_high_water(spec, batch_high_water(batch, spec))} \
        if len(batch.rows) or batch.truncates else None
    commit = CommitProperties(app_transactions=[Transaction(app_id, version)],
                              custom_metadata=high_water)
    if loads:
        assert snapshot_load is not None
        return _load(table, batch, spec, columns, commit, snapshot_load, skipped), table
    merge = merge_scd1 if spec.stored_as_scd_type == 1 else merge_scd2
    if merges_on_read(table, batch, spec, uri):
        done = merge_on_read(table, batch, spec, columns, app_id=app_id, version=version,
                             metadata=high_water, merge=merge, uri=uri)
        log.debug("applied %d changes to %s by deletion vectors: %d inserted, %d updated, "
                  "%d deleted, %d vector(s), %d file(s)", len(changes), uri, done.inserted,
                  done.updated, done.deleted, done.vectors, done.files_added)
        return ApplyResult(inserted=done.inserted, updated=done.updated,
                           deleted=done.deleted, skipped=skipped + done.skipped,
                           superseded=done.superseded, delta_version=done.version,
                           merge="merge_on_read"), table
    metrics, not_applied, superseded = merge(table, batch, spec, columns, commit, uri)
    table.update_incremental()
    inserted = int(metrics.get("num_target_rows_inserted", 0))
    updated = int(metrics.get("num_target_rows_updated", 0))
    deleted = int(metrics.get("num_target_rows_deleted", 0))
    log.debug("applied %d changes to %s: %d inserted, %d updated, %d deleted", len(changes),
              uri, inserted, updated, deleted)
    return ApplyResult(inserted=inserted, updated=updated, deleted=deleted,
                       skipped=skipped + not_applied, superseded=superseded,
                       delta_version=table.version(), merge="copy_on_write"), table


def apply_changes_in_steps(target: str | os.PathLike[str], pieces: Iterable[pa.Table],
                           spec: ApplySpec, *, app_id: str, version: int,
                           storage_options: dict[str, str] | None = None,
                           new_column_values: NewColumnValues | None = None) -> ApplyResult:
    """Apply one batch given as consecutive *pieces* of its change rows (in commit order,
    one schema) as one Delta commit, holding one piece at a time in memory.

    The same as :func:`apply_changes` of the pieces put together, for batches too big to
    merge at once (a bulk load's transaction): each piece is merged into a branch of the
    target (:class:`tidemark.lake.branch.Branch`), which is then committed to the target
    as one transaction with the app transaction ``(app_id, version)``. A reader sees all
    of the batch or none of it. A target the branch cannot serve (not on the local file
    system) gets the pieces put together in one merge instead. A replayed batch the
    target already holds is skipped without reading the pieces (``skipped`` is 0 then).

    An SCD type 2 target makes one version of a key per ``version_column`` value (per
    transaction), which must be planned from all of its changes at once: its pieces are
    cut again at such boundaries, so one transaction is held whole.
    """
    raw: Iterator[pa.Table] = map(utc_timestamps, pieces)
    head = [piece for piece in (next(raw, None), next(raw, None)) if piece is not None]
    if len(head) < 2:
        # A batch in one piece has no boundary to keep whole: cutting it would apply its
        # last transaction (SCD2) or its closing delete apart, in a second step.
        return ApplyResult() if not head else apply_changes(
            target, head[0], spec, app_id=app_id, version=version,
            storage_options=storage_options, new_column_values=new_column_values)
    chunks: Iterator[pa.Table] = itertools.chain(taken(head), raw)
    if spec.stored_as_scd_type == 2:
        chunks = iter(whole_versions(chunks, spec.version_column))
    else:
        chunks = iter(whole_key_changes(chunks))
    first = next(chunks, None)
    if first is None:
        return ApplyResult()
    second = next(chunks, None)
    if second is None:
        return apply_changes(target, first, spec, app_id=app_id, version=version,
                             storage_options=storage_options,
                             new_column_values=new_column_values)
    uri = os.fspath(target)
    prepared = _prepare(uri, first, spec, app_id, version, storage_options,
                        new_column_values)
    if isinstance(prepared, ApplyResult):
        return prepared
    table, columns, previous_high_water = prepared
    # SCD2 and soft-delete targets merge a piece's truncate with the rows it closes or
    # marks, which staging cannot (it would rewrite every row): they take the pieces in
    # one merge below once they have deletion vectors (a branch cannot carry those).
    if spec.stored_as_scd_type == 1 and spec.soft_delete_column is None and \
            merges_on_read(table, prepare_batch(first, spec, columns), spec, uri):
        # The pieces are let go once staged, the first two too.
        pending = [first, second]
        del first, second
        return _steps_on_read(table, itertools.chain(taken(pending), chunks), spec, columns,
                              previous_high_water, app_id, version, uri)
    try:
        branch = Branch(table, f"{app_id}-{version}")
    except BranchUnsupportedError as err:
        log.warning("%s: applying the batch in one merge, not in steps (%s)", uri, err)
        return apply_changes(target, pa.concat_tables([first, second, *chunks]), spec,
                             app_id=app_id, version=version, storage_options=storage_options,
                             new_column_values=new_column_values)
    result = ApplyResult()
    high_water: tuple[Any, ...] | None = None
    steps = 0
    # The first two pieces are let go once merged, like every other one.
    held = [first, second]
    del first, second
    try:
        for piece in itertools.chain(taken(held), chunks):
            applied, top = apply_step(branch.table, piece, spec, columns,
                                       previous_high_water, uri)
            result += applied
            steps += 1
            if top is not None and (high_water is None or top > high_water):
                high_water = top
        if high_water is None:  # every change was already applied
            branch.discard()
            return result
        commit = CommitProperties(
            app_transactions=[Transaction(app_id, version)],
            custom_metadata={HIGH_WATER_KEY: encode_high_water(spec, high_water)})
        delta_version = branch.publish(commit)
    except BaseException:
        branch.discard()
        raise
    log.info("applied batch %s to %s in %d steps as one commit (version %d)", version, uri,
             steps, delta_version)
    return dataclasses.replace(result, delta_version=delta_version)


def _steps_on_read(table: DeltaTable, pieces: Iterator[pa.Table], spec: ApplySpec,
                   columns: ResolvedColumns, previous_high_water: tuple[Any, ...] | None,
                   app_id: str, version: int, uri: str) -> ApplyResult:
    """:func:`apply_changes_in_steps` on a merge-on-read target: each piece staged as
    deletion vectors and new files, one commit for all (one piece held at a time)."""
    skipped = 0
    high_water: tuple[Any, ...] | None = None
    steps = 0

    def prepared() -> Iterator[PreparedBatch]:
        nonlocal skipped, high_water, steps
        for piece in pieces:
            batch = prepare_batch(piece, spec, columns)
            if previous_high_water is not None:
                batch, dropped = drop_applied(batch, spec.sequence_by, previous_high_water)
                skipped += dropped
            if len(batch.rows) == 0 and not batch.truncates:
                continue
            top = batch_high_water(batch, spec)
            if high_water is None or top > high_water:
                high_water = top
            steps += 1
            yield batch

    def metadata() -> dict[str, str] | None:
        return None if high_water is None else \
            {HIGH_WATER_KEY: encode_high_water(spec, high_water)}

    done = merge_on_read_steps(table, prepared(), spec, columns, app_id=app_id,
                               version=version, metadata=metadata,
                               merge=merge_scd1 if spec.stored_as_scd_type == 1 else merge_scd2,
                               uri=uri)
    log.info("applied batch %s to %s in %d steps as one commit by deletion vectors "
             "(version %d)", version, uri, steps, done.version)
    return ApplyResult(inserted=done.inserted, updated=done.updated, deleted=done.deleted,
                       skipped=skipped + done.skipped, superseded=done.superseded,
                       delta_version=done.version, merge="merge_on_read")


def _prepare(uri: str, first: pa.Table, spec: ApplySpec, app_id: str, version: int,
             storage_options: dict[str, str] | None,
             new_column_values: NewColumnValues | None
             ) -> ApplyResult | tuple[DeltaTable, ResolvedColumns, tuple[Any, ...] | None]:
    """The target of a batch applied in pieces, made or given the batch's new columns,
    its resolved columns and its high-water mark; or the result of a batch it already
    holds."""
    _check_arguments(first, app_id, version)
    columns = spec.resolve(first.schema)
    table = open_target(uri, storage_options)
    if table is not None:
        if holds(table, app_id, version, uri):
            return ApplyResult(delta_version=table.version(), already_applied=True)
        table = add_new_columns(table, first.schema, columns, spec, new_column_values)
    else:
        table = create_target(uri, first.schema, columns, spec, storage_options)
    previous_high_water = read_high_water(table, spec, first.schema) \
        if spec.ordered_batches else None
    return table, columns, previous_high_water


def load_in_steps(target: str | os.PathLike[str], pieces: Iterable[pa.Table],
                  spec: ApplySpec, *, app_id: str, version: int, how: SnapshotLoad,
                  storage_options: dict[str, str] | None = None,
                  new_column_values: NewColumnValues | None = None) -> ApplyResult:
    """Load a snapshot's rows given as consecutive *pieces* (see ``snapshot_load`` of
    :func:`apply_changes`: ``how`` is the first piece's) as one Delta commit, holding one
    piece at a time in memory.

    The same as :func:`apply_changes` of the pieces put together: each piece is written
    into a branch of the target (:class:`tidemark.lake.branch.Branch`), the first as
    *how*, the later ones appended (replacing, from a truncate on, when a piece holds one),
    and the branch is committed to the target as one transaction carrying ``(app_id,
    version)``. An SCD type 2 target merges its pieces in steps, as any batch.
    """
    chunks = map(utc_timestamps, pieces)
    first = next(chunks, None)
    if first is None:
        return ApplyResult()
    second = next(chunks, None)
    if second is None:
        return apply_changes(target, first, spec, app_id=app_id, version=version,
                             storage_options=storage_options,
                             new_column_values=new_column_values, snapshot_load=how)
    if spec.stored_as_scd_type != 1:
        return apply_changes_in_steps(target, itertools.chain(taken([first, second]), chunks),
                                      spec, app_id=app_id, version=version,
                                      storage_options=storage_options,
                                      new_column_values=new_column_values)
    uri = os.fspath(target)
    prepared = _prepare(uri, first, spec, app_id, version, storage_options,
                        new_column_values)
    if isinstance(prepared, ApplyResult):
        return prepared
    table, columns, previous_high_water = prepared
    try:
        branch = Branch(table, f"{app_id}-{version}")
    except BranchUnsupportedError as err:
        log.warning("%s: loading the snapshot's rows at once, not in steps (%s)", uri, err)
        return apply_changes(target, pa.concat_tables([first, second, *chunks]), spec,
                             app_id=app_id, version=version, storage_options=storage_options,
                             new_column_values=new_column_values, snapshot_load=how)
    result = ApplyResult()
    high_water: tuple[Any, ...] | None = None
    steps = 0
    held = [first, second]
    del first, second
    try:
        for piece in itertools.chain(taken(held), chunks):
            batch = prepare_batch(piece, spec, columns)
            skipped = 0
            if previous_high_water is not None:
                batch, skipped = drop_applied(batch, spec.sequence_by, previous_high_water)
            # A truncate ends what came before it, earlier pieces' rows included.
            step_how: SnapshotLoad = how if not steps else \
                "replace" if batch.truncates else "append"
            result += _load(branch.table, batch, spec, columns, CommitProperties(), step_how,
                            skipped)
            steps += 1
            if len(batch.rows) or batch.truncates:
                top = batch_high_water(batch, spec)
                if high_water is None or top > high_water:
                    high_water = top
        metadata = None if high_water is None else \
            {HIGH_WATER_KEY: encode_high_water(spec, high_water)}
        delta_version = branch.publish(CommitProperties(
            app_transactions=[Transaction(app_id, version)], custom_metadata=metadata))
    except BaseException:
        branch.discard()
        raise
    log.info("loaded batch %s into %s in %d steps as one commit (version %d)", version, uri,
             steps, delta_version)
    return dataclasses.replace(result, delta_version=delta_version)


def holds(table: DeltaTable, app_id: str, version: int, uri: str) -> bool:
    """Whether *table* already holds batch *version* of *app_id* (a replay)."""
    done = table.transaction_version(app_id)
    if done is not None and done >= version:
        log.info("batch %s of %s is already in %s (it holds version %s); skipping",
                 version, app_id, uri, done)
        return True
    return False


def apply_step(table: DeltaTable, changes: pa.Table, spec: ApplySpec,
                columns: ResolvedColumns, previous_high_water: tuple[Any, ...] | None,
                uri: str) -> tuple[ApplyResult, tuple[Any, ...] | None]:
    """Merge one piece of a batch into *table* (a branch); returns what it did and the
    piece's highest sequence (None when it held nothing to apply)."""
    batch = prepare_batch(changes, spec, columns)
    skipped = 0
    if previous_high_water is not None:
        batch, skipped = drop_applied(batch, spec.sequence_by, previous_high_water)
    if len(batch.rows) == 0 and not batch.truncates:
        return ApplyResult(skipped=skipped), None
    merge = merge_scd1 if spec.stored_as_scd_type == 1 else merge_scd2
    metrics, not_applied, superseded = merge(table, batch, spec, columns, CommitProperties(),
                                             uri)
    table.update_incremental()
    return ApplyResult(inserted=int(metrics.get("num_target_rows_inserted", 0)),
                       updated=int(metrics.get("num_target_rows_updated", 0)),
                       deleted=int(metrics.get("num_target_rows_deleted", 0)),
                       skipped=skipped + not_applied,
                       superseded=superseded), batch_high_water(batch, spec)


# -- snapshot loads -----------------------------------------------------------------------
SnapshotLoad = Literal["replace", "append"]


def _load(table: DeltaTable, batch: PreparedBatch, spec: ApplySpec, columns: ResolvedColumns,
          commit: CommitProperties, how: SnapshotLoad, skipped: int) -> ApplyResult:
    """Write a snapshot's rows without a merge (see ``snapshot_load``)."""
    rows = batch.rows
    if batch.truncates:  # a restarted snapshot's truncate: replaced anyway
        rows = rows.filter(sequence_after(rows, spec.sequence_by, batch.truncates[-1]))
    rows = rows.filter(pc.invert(rows.column(IS_DELETE)))
    data = rows.select(list(columns.data))
    if spec.soft_delete_column is not None:
        data = data.append_column(spec.soft_delete_column,
                                  pa.array([False] * len(data), pa.bool_()))
    data = data.cast(pa.schema(target_fields(rows.schema, columns, spec)))
    before = _row_count(table) if how == "replace" else 0
    write_deltalake(table, data, mode="overwrite" if how == "replace" else "append",
                    commit_properties=commit)
    table.update_incremental()
    log.debug("%s %d snapshot rows into %s", "replaced the table with" if how == "replace"
              else "appended", len(data), table.table_uri)
    return ApplyResult(inserted=len(data), deleted=before, skipped=skipped,
                       delta_version=table.version())


def _row_count(table: DeltaTable) -> int:
    return sum(int(n) for n in table.get_add_actions(flatten=True).column("num_records")
               .to_pylist() if n is not None)
