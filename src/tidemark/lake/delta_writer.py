"""Apply a batch of change rows to a Delta Lake table with delta-rs: :func:`apply_changes`.

One batch is one Delta commit (a ``MERGE``), carrying the Delta app transaction
``(app_id, version)`` — Spark's query id and batch id — so a replayed batch is detected
and skipped, and the batch's highest sequence (the table's high-water mark, in the
commit's metadata). Creating the table and adding columns for new source columns are
separate commits before it; both are idempotent, so a crash between them and the merge
only means the replay finds them done.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import itertools
import json
import logging
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Final, Literal

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, Field, Transaction, write_deltalake
from deltalake.exceptions import DeltaError, TableNotFoundError

from tidemark.errors import ConfigError
from tidemark.lake import change_rows as cr
from tidemark.lake import sql
from tidemark.lake.branch import Branch, BranchUnsupportedError
from tidemark.lake.collapse import (
    IS_DELETE,
    PreparedBatch,
    collapse_to_latest,
    drop_applied,
    keep_column,
    prepare_batch,
    rows_with_keys,
    sequence_after,
)
from tidemark.lake.key_moves import carry_moved_values
from tidemark.lake.scd2 import MERGE_START, latest_versions, plan_versions
from tidemark.lake.spec import ApplySpec, ResolvedColumns
from tidemark.lake.widening import widen_target

log = logging.getLogger(__name__)

#: Commit-metadata key of the high-water mark: the highest sequence applied so far.
HIGH_WATER_KEY: Final = "tidemark.highWater"
#: Commit-metadata key of an added column's value for the rows already in the table,
#: on the commit that adds it; the fill that follows is marked with FILLED_KEY. An add
#: without its fill (a crash between the two commits) is finished by the next batch.
FILL_KEY: Final = "tidemark.fillNewColumns"
FILLED_KEY: Final = "tidemark.filledNewColumns"

#: Given the names of columns the target is about to gain, the value each holds in the
#: source for rows that existed before it was added (PostgreSQL: the DEFAULT of
#: ``ADD COLUMN``); a column left out stays null in those rows.
NewColumnValues = Callable[[Sequence[str]], Mapping[str, Any]]

_warned_unknown: set[tuple[str, str]] = set()


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

    def __add__(self, other: ApplyResult) -> ApplyResult:
        return ApplyResult(
            inserted=self.inserted + other.inserted, updated=self.updated + other.updated,
            deleted=self.deleted + other.deleted, skipped=self.skipped + other.skipped,
            superseded=self.superseded + other.superseded,
            delta_version=other.delta_version if other.delta_version is not None
            else self.delta_version,
            already_applied=self.already_applied and other.already_applied)


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
    """
    _check_arguments(changes, app_id, version)
    uri = os.fspath(target)
    columns = spec.resolve(changes.schema)
    table = _open(uri, storage_options)
    if table is not None and _holds(table, app_id, version, uri):
        return ApplyResult(skipped=len(changes), delta_version=table.version(),
                           already_applied=True)
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
        return ApplyResult(skipped=skipped)
    if table is None:
        table = _create(uri, changes.schema, columns, spec, storage_options)
    else:
        table = _add_new_columns(table, changes.schema, columns, spec, new_column_values)
    # An empty snapshot load (an empty table) carries no sequence to remember.
    high_water = {HIGH_WATER_KEY: _encode_high_water(spec, _high_water(batch, spec))} \
        if len(batch.rows) or batch.truncates else None
    commit = CommitProperties(app_transactions=[Transaction(app_id, version)],
                              custom_metadata=high_water)
    if loads:
        assert snapshot_load is not None
        return _load(table, batch, spec, columns, commit, snapshot_load, skipped)
    merge = _merge_scd1 if spec.stored_as_scd_type == 1 else _merge_scd2
    metrics, not_applied, superseded = merge(table, batch, spec, columns, commit, uri)
    table.update_incremental()
    inserted = int(metrics.get("num_target_rows_inserted", 0))
    updated = int(metrics.get("num_target_rows_updated", 0))
    deleted = int(metrics.get("num_target_rows_deleted", 0))
    log.debug("applied %d changes to %s: %d inserted, %d updated, %d deleted", len(changes),
              uri, inserted, updated, deleted)
    return ApplyResult(inserted=inserted, updated=updated, deleted=deleted,
                       skipped=skipped + not_applied, superseded=superseded,
                       delta_version=table.version())


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
    chunks = iter(pieces)
    if spec.stored_as_scd_type == 2:
        chunks = iter(_whole_versions(chunks, spec.version_column))
    else:
        chunks = iter(_whole_key_changes(chunks))
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
        for piece in itertools.chain(_taken(held), chunks):
            applied, top = _apply_step(branch.table, piece, spec, columns,
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
            custom_metadata={HIGH_WATER_KEY: _encode_high_water(spec, high_water)})
        delta_version = branch.publish(commit)
    except BaseException:
        branch.discard()
        raise
    log.info("applied batch %s to %s in %d steps as one commit (version %d)", version, uri,
             steps, delta_version)
    return dataclasses.replace(result, delta_version=delta_version)


def _prepare(uri: str, first: pa.Table, spec: ApplySpec, app_id: str, version: int,
             storage_options: dict[str, str] | None,
             new_column_values: NewColumnValues | None
             ) -> ApplyResult | tuple[DeltaTable, ResolvedColumns, tuple[Any, ...] | None]:
    """The target of a batch applied in pieces, made or given the batch's new columns,
    its resolved columns and its high-water mark; or the result of a batch it already
    holds."""
    _check_arguments(first, app_id, version)
    columns = spec.resolve(first.schema)
    table = _open(uri, storage_options)
    if table is not None:
        if _holds(table, app_id, version, uri):
            return ApplyResult(delta_version=table.version(), already_applied=True)
        table = _add_new_columns(table, first.schema, columns, spec, new_column_values)
    else:
        table = _create(uri, first.schema, columns, spec, storage_options)
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
    chunks = iter(pieces)
    first = next(chunks, None)
    if first is None:
        return ApplyResult()
    second = next(chunks, None)
    if second is None:
        return apply_changes(target, first, spec, app_id=app_id, version=version,
                             storage_options=storage_options,
                             new_column_values=new_column_values, snapshot_load=how)
    if spec.stored_as_scd_type != 1:
        return apply_changes_in_steps(target, itertools.chain(_taken([first, second]), chunks),
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
        for piece in itertools.chain(_taken(held), chunks):
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
                top = _high_water(batch, spec)
                if high_water is None or top > high_water:
                    high_water = top
        metadata = None if high_water is None else \
            {HIGH_WATER_KEY: _encode_high_water(spec, high_water)}
        delta_version = branch.publish(CommitProperties(
            app_transactions=[Transaction(app_id, version)], custom_metadata=metadata))
    except BaseException:
        branch.discard()
        raise
    log.info("loaded batch %s into %s in %d steps as one commit (version %d)", version, uri,
             steps, delta_version)
    return dataclasses.replace(result, delta_version=delta_version)


def _taken(pieces: list[pa.Table]) -> Iterator[pa.Table]:
    """The items of *pieces*, each removed from the list as it is handed out."""
    while pieces:
        yield pieces.pop(0)


def _holds(table: DeltaTable, app_id: str, version: int, uri: str) -> bool:
    """Whether *table* already holds batch *version* of *app_id* (a replay)."""
    done = table.transaction_version(app_id)
    if done is not None and done >= version:
        log.info("batch %s of %s is already in %s (it holds version %s); skipping",
                 version, app_id, uri, done)
        return True
    return False


def _whole_versions(pieces: Iterable[pa.Table], column: str) -> Iterable[pa.Table]:
    """*pieces* cut again so that no value of *column* (in commit order, so its rows are
    contiguous) spans two pieces: each piece's last value moves on to the next."""
    carry: pa.Table | None = None
    for piece in pieces:
        rows = piece if carry is None else pa.concat_tables([carry, piece])
        if not len(rows):
            continue
        values = rows.column(column)
        tail = pc.index(values, values[-1]).as_py()
        if tail > 0:
            yield rows.slice(0, tail)
        carry = rows.slice(tail)
    if carry is not None and len(carry):
        yield carry


def _whole_key_changes(pieces: Iterable[pa.Table]) -> Iterable[pa.Table]:
    """*pieces* cut again so that a primary-key change (a delete, then an insert at the
    same position) is never split: a piece's last row, when a delete, moves on to the
    next piece, whose insert may need the values of the key it deleted."""
    carry: pa.Table | None = None
    for piece in pieces:
        rows = piece if carry is None else pa.concat_tables([carry, piece])
        carry = None
        if len(rows) and cr.OP in rows.column_names and rows.column(cr.OP)[-1].as_py() == "d":
            rows, carry = rows.slice(0, len(rows) - 1), rows.slice(len(rows) - 1)
        if len(rows):
            yield rows
    if carry is not None:
        yield carry


def _apply_step(table: DeltaTable, changes: pa.Table, spec: ApplySpec,
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
    merge = _merge_scd1 if spec.stored_as_scd_type == 1 else _merge_scd2
    metrics, not_applied, superseded = merge(table, batch, spec, columns, CommitProperties(),
                                             uri)
    table.update_incremental()
    return ApplyResult(inserted=int(metrics.get("num_target_rows_inserted", 0)),
                       updated=int(metrics.get("num_target_rows_updated", 0)),
                       deleted=int(metrics.get("num_target_rows_deleted", 0)),
                       skipped=skipped + not_applied,
                       superseded=superseded), _high_water(batch, spec)


# -- the target table ---------------------------------------------------------------------
def check_target(uri: str) -> None:
    """Raise ConfigError if the local path *uri* exists but cannot be a Delta table.

    A Delta table's directory, a missing path and an empty directory are fine (the first
    batch creates the table); a file, or a directory of other files, is not: writing a
    table there would mix it with data that is not the table's.
    """
    expected = ("expected a Delta table's directory, or a new or empty directory for the "
                "first batch to create the table in")
    if os.path.exists(uri) and not os.path.isdir(uri):
        raise ConfigError("target", f"{uri} is a file, not a Delta table: {expected}")
    if os.path.isdir(uri) and os.listdir(uri) and not os.path.isdir(
            os.path.join(uri, "_delta_log")):
        raise ConfigError("target", f"{uri} exists and is not a Delta table (it holds files "
                                    f"but no _delta_log): {expected}")


def _open(uri: str, storage_options: dict[str, str] | None) -> DeltaTable | None:
    try:
        return DeltaTable(uri, storage_options=storage_options)
    except DeltaError as err:
        # A plain file fails with delta-rs' "Path does not exist", which hides the cause.
        check_target(uri)
        if isinstance(err, TableNotFoundError):
            return None
        raise


def _target_fields(schema: pa.Schema, columns: ResolvedColumns,
                   spec: ApplySpec) -> list[pa.Field]:
    fields = []
    for name in columns.data:
        field = schema.field(name)
        fields.append(field.with_nullable(name not in spec.keys))
    if spec.stored_as_scd_type == 2:
        at = schema.field(spec.version_column).type
        fields += [pa.field(cr.START_AT, at, nullable=False), pa.field(cr.END_AT, at)]
    if spec.soft_delete_column is not None:
        fields.append(pa.field(spec.soft_delete_column, pa.bool_()))
    return fields


def _create(uri: str, schema: pa.Schema, columns: ResolvedColumns, spec: ApplySpec,
            storage_options: dict[str, str] | None) -> DeltaTable:
    log.info("creating Delta table %s (keys %s, SCD type %d)", uri, ", ".join(spec.keys),
             spec.stored_as_scd_type)
    return DeltaTable.create(uri, pa.schema(_target_fields(schema, columns, spec)),
                             mode="ignore", partition_by=list(spec.partition_by) or None,
                             storage_options=storage_options)


def _add_new_columns(table: DeltaTable, schema: pa.Schema, columns: ResolvedColumns,
                     spec: ApplySpec, new_column_values: NewColumnValues | None) -> DeltaTable:
    """Schema evolution: source columns the target lacks become nullable columns, which
    the existing rows read as null or as the value *new_column_values* gives; columns
    whose type the source widened are widened (:mod:`tidemark.lake.widening`)."""
    fields = _target_fields(schema, columns, spec)
    table = widen_target(table, fields)
    present = {field.name for field in table.schema().fields}
    new = [f for f in fields if f.name not in present]
    if new:
        names = [f.name for f in new]
        log.info("adding column(s) %s to %s", ", ".join(names), table.table_uri)
        fills = _fill_literals(table.table_uri, new_column_values(names)
                               if new_column_values else {}, new)
        properties = CommitProperties(custom_metadata={FILL_KEY: json.dumps(fills)}) \
            if fills else None
        table.alter.add_columns([Field.from_arrow(f.with_nullable(True)) for f in new],
                                commit_properties=properties)
        table.update_incremental()
    _finish_fill(table, spec)
    return table


#: Arrow types whose values a fill writes exactly as a SQL literal of the source's value.
_FILLABLE = (pa.types.is_string, pa.types.is_large_string, pa.types.is_integer,
             pa.types.is_floating, pa.types.is_boolean, pa.types.is_decimal, pa.types.is_date,
             pa.types.is_timestamp)


def _fill_literals(uri: str, values: Mapping[str, Any], fields: list[pa.Field]
                   ) -> dict[str, str]:
    """Column -> SQL literal of its value for existing rows (None values are left out);
    a value that would not be written exactly (binary, lists, …; or one the column's
    type does not take) is left out with a warning."""
    fills: dict[str, str] = {}
    for field in fields:
        name = field.name
        value = values.get(name)
        if value is None:
            continue
        try:
            if not any(fillable(field.type) for fillable in _FILLABLE):
                raise ConfigError("new_column_values", f"type {field.type}")
            pa.scalar(value).cast(field.type)  # raises where the literal would be wrong
            fills[name] = sql.literal(value)
        except (ConfigError, pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            log.warning("%s: new column %r holds %r in the source's existing rows, which "
                        "tidemark cannot write as a literal; those rows read null in the "
                        "target until they change", uri, name, value)
    return fills


def _finish_fill(table: DeltaTable, spec: ApplySpec) -> None:
    """Give the existing rows the value of columns added by the latest commit, if that
    commit says so and the fill is not done yet (it is the latest commit then: a merge
    always follows the fill)."""
    (latest,) = table.history(1) or ({},)
    pending = latest.get(FILL_KEY)
    if pending is None:
        return
    fills: dict[str, str] = json.loads(pending)
    predicate = f"{sql.quote(cr.END_AT)} IS NULL" if spec.stored_as_scd_type == 2 else None
    log.info("setting new column(s) %s of the existing rows of %s to their source value",
             ", ".join(fills), table.table_uri)
    table.update(updates={sql.quote(name): literal for name, literal in fills.items()},
                 predicate=predicate,
                 commit_properties=CommitProperties(custom_metadata={FILLED_KEY: pending}))
    table.update_incremental()


# -- the high-water mark ------------------------------------------------------------------
def _high_water(batch: PreparedBatch, spec: ApplySpec) -> tuple[Any, ...]:
    seq = spec.sequence_by
    candidates = list(batch.truncates)
    if len(batch.rows):
        top = batch.rows.select(list(seq)).sort_by([(s, "descending") for s in seq])
        row = top.slice(0, 1).to_pylist()[0]
        candidates.append(tuple(row[s] for s in seq))
    return max(candidates)


def _encode_value(value: Any) -> Any:
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    return value


def _encode_high_water(spec: ApplySpec, values: tuple[Any, ...]) -> str:
    return json.dumps({"sequence_by": list(spec.sequence_by),
                       "values": [_encode_value(v) for v in values]})


def read_high_water(table: DeltaTable, spec: ApplySpec,
                    schema: pa.Schema) -> tuple[Any, ...] | None:
    """The highest sequence applied to *table* by tidemark, from its latest commits."""
    for limit in (1, 50):
        commits = sorted(table.history(limit), key=lambda c: c.get("version", -1),
                         reverse=True)
        for commit in commits:
            text = commit.get(HIGH_WATER_KEY)
            if text is None:
                continue
            mark = json.loads(text)
            if mark.get("sequence_by") != list(spec.sequence_by):
                log.warning("%s was applied with sequence_by %s, now %s; ignoring its "
                            "high-water mark", table.table_uri, mark.get("sequence_by"),
                            list(spec.sequence_by))
                return None
            return tuple(
                pa.array([value]).cast(schema.field(name).type)[0].as_py()
                for name, value in zip(spec.sequence_by, mark["values"], strict=True)
            )
    return None


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
    data = data.cast(pa.schema(_target_fields(rows.schema, columns, spec)))
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


# -- SCD type 1 ---------------------------------------------------------------------------
def _value(name: str, keep: dict[str, str], soft: str | None) -> str:
    """SQL for a column's new value: the source's, or the target's where kept (not from
    a row soft-deleted: one made again has nothing to keep, its unknown value is null)."""
    mask = keep.get(name)
    if mask is None:
        return sql.column("s", name)
    kept = sql.column("s", mask)
    if soft is not None:
        kept = f"{kept} AND NOT coalesce(t.{soft}, false)"
    return (f"CASE WHEN {kept} THEN {sql.column('t', name)} "
            f"ELSE {sql.column('s', name)} END")


def _merge_scd1(table: DeltaTable, batch: PreparedBatch, spec: ApplySpec,
                columns: ResolvedColumns, commit: CommitProperties,
                uri: str) -> tuple[dict[str, Any], int, int]:
    """One MERGE: upserts and deletes by key where the change is newer than the row,
    and a truncate's deletes. Returns the metrics, skipped and superseded counts."""
    seq = spec.sequence_by
    batch = _carry_moves(table, batch, spec, uri)
    rows = batch.rows
    changes = len(rows)
    if batch.truncates:  # what came before the last truncate is gone anyway
        rows = rows.filter(sequence_after(rows, seq, batch.truncates[-1]))
    collapsed = collapse_to_latest(batch.with_rows(rows), spec.keys, seq)
    source = collapsed.rows
    keep = {name: keep_column(i) for i, name in enumerate(collapsed.keep_columns)}
    if keep:
        _warn_unknown_kept(table, source, collapsed, spec, uri)
    newer = sql.sequence_after("s", "t", seq)
    is_delete = sql.column("s", IS_DELETE)
    merger = table.merge(source, predicate=sql.keys_equal(spec.keys), source_alias="s",
                         target_alias="t", commit_properties=commit, streamed_exec=False)
    soft = sql.quote(spec.soft_delete_column) if spec.soft_delete_column else None
    if len(source):
        updates = {sql.quote(n): _value(n, keep, soft) for n in columns.data
                   if n not in spec.keys}
        inserts = {sql.quote(n): sql.column("s", n) for n in columns.data}
        if soft is not None:
            updates[soft] = inserts[soft] = "false"
        merger = merger.when_matched_update(updates, predicate=f"NOT {is_delete} AND {newer}")
        if soft is None:
            merger = merger.when_matched_delete(predicate=f"{is_delete} AND {newer}")
        else:
            # A delete keeps the row's last values (a DEFAULT identity's delete brings
            # only its key) and takes the delete's sequence, so an older change that
            # comes later cannot bring the row back.
            merger = merger.when_matched_update(
                {soft: "true", **{sql.quote(n): sql.column("s", n) for n in seq}},
                predicate=f"{is_delete} AND {newer}")
        merger = merger.when_not_matched_insert(inserts, predicate=f"NOT {is_delete}")
    if batch.truncates:
        before = sql.sequence_before_literal("t", seq, batch.truncates[-1])
        if soft is None:
            merger = merger.when_not_matched_by_source_delete(predicate=before)
        else:
            merger = merger.when_not_matched_by_source_update({soft: "true"},
                                                               predicate=before)
    metrics = merger.execute()
    written = (int(metrics.get("num_target_rows_inserted", 0))
               + int(metrics.get("num_target_rows_updated", 0)))
    deletes = int(pc.sum(source.column(IS_DELETE)).as_py() or 0) if len(source) else 0
    # Upserts that wrote nothing were older than the row. (A delete that removed nothing
    # is not counted: its key is absent either way.)
    return metrics, max(0, len(source) - deletes - written), changes - len(source)


def _warn_unknown_kept(table: DeltaTable, source: pa.Table, batch: PreparedBatch,
                       spec: ApplySpec, uri: str) -> None:
    """Warn (once per target and column) when a kept value has no target row to come
    from: the column is left null."""
    for i, name in enumerate(batch.keep_columns):
        if (uri, name) in _warned_unknown:
            continue
        unknown = source.filter(source.column(keep_column(i)))
        if len(unknown) == 0:
            continue
        found = _rows_for_keys(table, unknown, spec.keys,
                               _columns_of(source.schema, spec.keys))
        if len(found) < len(unknown):
            _warned_unknown.add((uri, name))
            log.warning("%s: column %r of %d row(s) was not sent (unchanged TOASTed value) "
                        "and the target has no row to keep it from; writing null",
                        uri, name, len(unknown) - len(found))


def _carry_moves(table: DeltaTable, batch: PreparedBatch, spec: ApplySpec,
                 uri: str) -> PreparedBatch:
    """*batch* with the values its primary-key changes did not carry taken from the
    old keys (:mod:`tidemark.lake.key_moves`): the target's current rows."""
    wanted = _columns_of(batch.rows.schema, (*spec.keys, *batch.keep_columns))

    def current_rows(keys: pa.Table) -> pa.Table:
        if spec.stored_as_scd_type == 1:
            return _rows_for_keys(table, keys, spec.keys, wanted)
        at = batch.rows.schema.field(spec.version_column).type
        versions = _rows_for_keys(table, keys, spec.keys, pa.schema(
            [*wanted, pa.field(cr.START_AT, at), pa.field(cr.END_AT, at)]))
        latest = latest_versions(versions, spec.keys)
        return latest.filter(pc.is_null(latest.column(cr.END_AT))).select(wanted.names)

    return carry_moved_values(batch, spec.keys, spec.sequence_by, current_rows, uri)


def _columns_of(schema: pa.Schema, names: tuple[str, ...]) -> pa.Schema:
    return pa.schema([schema.field(name) for name in names])


def _rows_for_keys(table: DeltaTable, keys: pa.Table, key_names: tuple[str, ...],
                   schema: pa.Schema) -> pa.Table:
    """The target rows whose keys are in *keys* (all their versions, for SCD2), with
    the columns of *schema*, cast to its types (delta-rs reads strings as views)."""
    keys = keys.select(list(key_names)).group_by(list(key_names)).aggregate([])
    dataset = table.to_pyarrow_dataset()
    where = None
    for name in key_names:
        kind = dataset.schema.field(name).type
        if not (pa.types.is_integer(kind) or pa.types.is_temporal(kind)):
            # Pushed-down filters on strings fail against delta-rs's string-view Parquet
            # statistics; such keys are matched after the scan (rows_with_keys).
            continue
        term = pc.field(name).isin(keys.column(name).cast(kind))
        where = term if where is None else where & term
    wanted = list(dict.fromkeys([*key_names, *schema.names]))
    candidates = dataset.to_table(filter=where, columns=wanted)
    exact = where is not None and len(key_names) == 1
    nullable = pa.schema([f.with_nullable(True) for f in schema])
    candidates = candidates.select(schema.names).cast(nullable)
    if not exact and len(candidates):  # isin per column is a superset
        candidates = rows_with_keys(candidates, keys, key_names)
    return candidates


# -- SCD type 2 ---------------------------------------------------------------------------
def _merge_scd2(table: DeltaTable, batch: PreparedBatch, spec: ApplySpec,
                columns: ResolvedColumns, commit: CommitProperties,
                uri: str) -> tuple[dict[str, Any], int, int]:
    """One MERGE: new versions inserted, changed versions (closed or updated in place)
    matched by key and ``__START_AT``, a truncate's closes. Returns the metrics,
    skipped and superseded counts."""
    batch = _carry_moves(table, batch, spec, uri)
    schema = pa.schema([*_target_fields(batch.rows.schema, columns, spec),
                        pa.field(MERGE_START, batch.rows.schema.field(spec.version_column).type)])
    stored = _columns_of(schema, (*columns.data, cr.START_AT, cr.END_AT))
    latest = stored.empty_table()
    if len(batch.rows):
        versions = _rows_for_keys(table, batch.rows, spec.keys, stored)
        latest = latest_versions(versions, spec.keys)
    plan = plan_versions(batch, spec, columns, latest, schema)
    for name in sorted(plan.unknown_kept):
        if (uri, name) not in _warned_unknown:
            _warned_unknown.add((uri, name))
            log.warning("%s: column %r was not sent (unchanged TOASTed value) and the "
                        "target has no current row to keep it from; writing null", uri, name)
    source = plan.rows
    merger = table.merge(
        source, predicate=f"{sql.keys_equal(spec.keys)} AND "
                          f"{sql.column('t', cr.START_AT)} = {sql.column('s', MERGE_START)}",
        source_alias="s", target_alias="t", commit_properties=commit, streamed_exec=False)
    target_columns = [*columns.data, cr.START_AT, cr.END_AT]
    if len(source):
        merger = merger.when_matched_update(
            {sql.quote(n): sql.column("s", n) for n in target_columns if n not in spec.keys})
        merger = merger.when_not_matched_insert(
            {sql.quote(n): sql.column("s", n) for n in target_columns})
    if batch.truncates:
        first = batch.truncates[0][spec.sequence_by.index(spec.version_column)]
        merger = merger.when_not_matched_by_source_update(
            {sql.quote(cr.END_AT): sql.literal(first)},
            predicate=f"{sql.column('t', cr.END_AT)} IS NULL AND "
                      f"{sql.column('t', cr.START_AT)} < {sql.literal(first)}")
    return merger.execute(), plan.skipped, plan.superseded
