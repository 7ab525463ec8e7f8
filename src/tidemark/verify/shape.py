"""What verify compares of a target: its data columns with their Arrow types, and its
keys (:class:`tidemark.row_checksum.TableShape`)."""

from __future__ import annotations

import pyarrow as pa

from tidemark.errors import ConfigError
from tidemark.lake import change_rows as cr
from tidemark.lake.spec import ApplySpec
from tidemark.row_checksum import ComparedColumn, TableShape, supported


def target_shape(table: str, schema: pa.Schema, spec: ApplySpec) -> TableShape:
    """The compared columns of a target of Delta *schema* kept by *spec*: every data
    column (not SCD2's ``__START_AT``/``__END_AT``, not the soft-delete flag, not the
    change metadata a target keeps to sequence its changes, ``_commit_lsn``/``_seq``;
    ``column_list``/``except_column_list`` already shaped the table). Raises
    ConfigError naming a column whose type has no canonical text."""
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
