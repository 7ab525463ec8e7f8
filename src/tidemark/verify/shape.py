"""What verify compares of a target: its data columns with their Arrow types, and its
keys (:class:`tidemark.row_checksum.TableShape`)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import pyarrow as pa

from tidemark.errors import ConfigError
from tidemark.lake import change_rows as cr
from tidemark.lake.spec import ApplySpec
from tidemark.pipeline.config import PipelineConfig, Target
from tidemark.row_checksum import ComparedColumn, TableShape, supported
from tidemark.source.kind import SourceKind
from tidemark.verify.result import Difference, TableResult


def target_shape(table: str, schema: pa.Schema, spec: ApplySpec) -> TableShape:
    """The compared columns of a target of Delta *schema* kept by *spec*: every data
    column (not SCD2's ``__START_AT``/``__END_AT``, not the soft-delete flag, not the
    change metadata a target keeps to sequence its changes, ``_commit_lsn``/``_seq``;
    ``column_list``/``except_column_list`` already shaped the table). Raises
    ConfigError naming a column whose type has no canonical text, and for a target
    that differs from its source by design (``ignore_null_updates``)."""
    if spec.ignore_null_updates:
        raise ConfigError(f'targets."{table}".ignore_null_updates', "this target keeps a "
                          "column's old value where the source set it to NULL "
                          "(ignore_null_updates = true), so it differs from its source by "
                          "design wherever that happened and verify cannot tell those rows "
                          "from real differences (nor --repair mend them): verify the other "
                          "targets (--table), or drop ignore_null_updates and reload this "
                          "table to verify it")
    left_out = {cr.START_AT, cr.END_AT, *cr.METADATA_COLUMNS}
    if spec.soft_delete_column is not None:
        left_out.add(spec.soft_delete_column)
    columns = []
    for field in schema:
        if field.name in left_out:
            continue
        if not supported(field.type):
            raise ConfigError(f'targets."{table}"', f"column {field.name!r} of type "
                              f"{field.type} cannot be verified (no canonical text for "
                              "structs, maps and other nested types); leave it out of "
                              "the target (except_column_list) to verify the rest")
        columns.append(ComparedColumn(field.name, field.type))
    names = {c.name for c in columns}
    missing = [k for k in spec.keys if k not in names]
    if missing:
        raise ConfigError(f'targets."{table}".keys', f"key column(s) {', '.join(missing)} "
                          "are not columns of the target table")
    return TableShape(tuple(columns), tuple(spec.keys))


def source_only_columns(spec: ApplySpec, target_columns: Iterable[str],
                        source_columns: Sequence[str]) -> list[Difference]:
    """A ``column`` difference for each column of the source table (as the stream
    carries it) that the target does not hold although *spec* keeps it
    (``column_list``/``except_column_list`` leave columns out on purpose): its values
    are nowhere in the target, so the target cannot equal the source."""
    kept = [c for c in source_columns
            if (spec.column_list is None or c in spec.column_list or c in spec.keys)
            and c not in (spec.except_column_list or ())]
    have = set(target_columns)
    return [Difference("column", {}, (name,), detail=f"column {name} is in the source but "
                       "not in the target") for name in kept if name not in have]


def add_column_differences(kind: SourceKind, config: PipelineConfig,
                           tables: Sequence[tuple[Target, TableShape | None, TableResult]]
                           ) -> None:
    """Add to each table's result the source columns its target lacks
    (:func:`source_only_columns`), asking the source's catalog once."""
    columns = kind.carried_columns(config.dsn, [t.table for t, _, _ in tables],
                                   publication=config.source.publication)
    if columns is None:
        return
    for target, shape, result in tables:
        source = columns.get(target.table)
        if source is not None and shape is not None:
            result.differences += source_only_columns(
                target.spec, (c.name for c in shape.columns), source)
