"""The MERGE that applies a prepared batch to a Delta table: :func:`merge_scd1` (the
table holds each key's latest row) and :func:`merge_scd2` (it holds every version of
each key, with ``__START_AT``/``__END_AT``). Both take the values a primary-key change
did not carry from the target's current rows first (:mod:`tidemark.lake.key_moves`).
"""

from __future__ import annotations

import logging
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable

from tidemark.lake import change_rows as cr
from tidemark.lake import sql
from tidemark.lake.collapse import (
    CARRIES,
    IS_DELETE,
    PreparedBatch,
    collapse_to_latest,
    keep_column,
    rows_with_keys,
    sequence_after,
)
from tidemark.lake.delta_read import live_rows
from tidemark.lake.delta_target import target_fields
from tidemark.lake.key_moves import carry_moved_values
from tidemark.lake.scd2 import MERGE_START, latest_versions, plan_versions
from tidemark.lake.spec import ApplySpec, ResolvedColumns

log = logging.getLogger(__name__)

_warned_unknown: set[tuple[str, str]] = set()


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


def merge_scd1(table: DeltaTable, batch: PreparedBatch, spec: ApplySpec,
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
    collapsed = collapse_to_latest(batch.with_rows(rows), spec.keys, seq,
                                   carry_into_deletes=spec.soft_delete_column is not None)
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
            # A delete keeps the row's last values: the batch's upsert of the key right
            # before it, if any, else the target's (a DEFAULT identity's delete brings
            # only its key); and it takes the delete's sequence, so an older change that
            # comes later cannot bring the row back.
            carries = sql.column("s", CARRIES)
            merger = merger.when_matched_update(
                {**updates, **{sql.quote(n): sql.column("s", n) for n in seq}, soft: "true"},
                predicate=f"{is_delete} AND {carries} AND {newer}")
            merger = merger.when_matched_update(
                {soft: "true", **{sql.quote(n): sql.column("s", n) for n in seq}},
                predicate=f"{is_delete} AND {newer}")
            # A row made and deleted within the batch is kept, marked, as it would be
            # had the batch ended between its changes.
            merger = merger.when_not_matched_insert({**inserts, soft: "true"},
                                                    predicate=f"{is_delete} AND {carries}")
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
    dataset = live_rows(table)
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
def merge_scd2(table: DeltaTable, batch: PreparedBatch, spec: ApplySpec,
               columns: ResolvedColumns, commit: CommitProperties,
               uri: str) -> tuple[dict[str, Any], int, int]:
    """One MERGE: new versions inserted, changed versions (closed or updated in place)
    matched by key and ``__START_AT``, a truncate's closes. Returns the metrics,
    skipped and superseded counts."""
    batch = _carry_moves(table, batch, spec, uri)
    schema = pa.schema([*target_fields(batch.rows.schema, columns, spec),
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
