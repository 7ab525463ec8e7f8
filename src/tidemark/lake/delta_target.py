"""The Delta table a batch is applied to: checking, opening and creating it, and giving
it the columns the source gained (:func:`add_new_columns`).

A column added to the source gets the value the source gives its existing rows (the
``DEFAULT`` of ``ADD COLUMN``) in two commits: the one that adds the column records the
values under :data:`FILL_KEY`, and an update of the existing rows marked with
:data:`FILLED_KEY` follows. An add without its fill (a crash between the two commits) is
finished by the next batch.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Field
from deltalake.exceptions import DeltaError, TableNotFoundError

from tidemark.errors import ConfigError
from tidemark.lake import change_rows as cr
from tidemark.lake import sql
from tidemark.lake.held_tables import HELD
from tidemark.lake.spec import ApplySpec, ResolvedColumns
from tidemark.lake.widening import widen_target

log = logging.getLogger(__name__)

#: Commit-metadata key of an added column's value for the rows already in the table,
#: on the commit that adds it; the fill that follows is marked with FILLED_KEY. An add
#: without its fill (a crash between the two commits) is finished by the next batch.
FILL_KEY: Final = "tidemark.fillNewColumns"
FILLED_KEY: Final = "tidemark.filledNewColumns"

#: Given the names of columns the target is about to gain, the value each holds in the
#: source for rows that existed before it was added (PostgreSQL: the DEFAULT of
#: ``ADD COLUMN``); a column left out stays null in those rows.
NewColumnValues = Callable[[Sequence[str]], Mapping[str, Any]]

#: Parts of delta-rs' error texts that are for its own debugging: terminal colours, the
#: arrows of its error chains, and Rust's ``Os { code, kind, message }``.
_ANSI: Final = re.compile(r"\x1b\[[0-9;]*m")
_RUST_OS_ERROR: Final = re.compile(r"Error: Os \{[^}]*message: \"([^\"]*)\"[^}]*\}")


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


def open_target(uri: str, storage_options: dict[str, str] | None) -> DeltaTable | None:
    """The Delta table at *uri* at its latest version (the one held since the last batch,
    if any: :mod:`tidemark.lake.held_tables`), or None where there is none yet."""
    held = HELD.take(uri, storage_options)
    if held is not None:
        return held
    try:
        return DeltaTable(uri, storage_options=storage_options)
    except DeltaError as err:
        # A plain file fails with delta-rs' "Path does not exist", which hides the cause.
        check_target(uri)
        if isinstance(err, TableNotFoundError):
            if "Unknown scheme" in str(err):  # no table can ever be made there
                raise target_error(uri, "open", err) from None
            return None
        raise


def target_error(uri: str, doing: str, err: BaseException) -> ConfigError:
    """A delta-rs failure to *doing* (open, create) the table at *uri*, in one line that
    names the path (ConfigError keyed ``target``: the caller knows the setting)."""
    return ConfigError("target", f"cannot {doing} the Delta table at {uri}: "
                                 f"{delta_reason(err)}")


def delta_reason(err: BaseException) -> str:
    """delta-rs' message of *err* on one line, without colours, arrows or Rust's
    ``Os { … }`` wrapping."""
    text = _RUST_OS_ERROR.sub(r"(\1)", _ANSI.sub("", str(err)))
    return " ".join(text.replace("\u21b3", " ").split()) or type(err).__name__


def target_fields(schema: pa.Schema, columns: ResolvedColumns,
                  spec: ApplySpec) -> list[pa.Field]:
    """The target's columns for change rows of *schema*: the data columns (keys not
    nullable), SCD2's ``__START_AT``/``__END_AT`` and the soft-delete flag."""
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


def create_target(uri: str, schema: pa.Schema, columns: ResolvedColumns, spec: ApplySpec,
                  storage_options: dict[str, str] | None) -> DeltaTable:
    """Create the target table (a no-op where another writer just did)."""
    log.info("creating Delta table %s (keys %s, SCD type %d)", uri, ", ".join(spec.keys),
             spec.stored_as_scd_type)
    try:
        return DeltaTable.create(uri, pa.schema(target_fields(schema, columns, spec)),
                                 mode="ignore", partition_by=list(spec.partition_by) or None,
                                 configuration={"delta.enableDeletionVectors": "true"}
                                 if spec.merge == "merge_on_read" else None,
                                 storage_options=storage_options)
    except (DeltaError, OSError) as err:  # OSError: an object store's failures
        raise target_error(uri, "create", err) from None


def add_new_columns(table: DeltaTable, schema: pa.Schema, columns: ResolvedColumns,
                    spec: ApplySpec, new_column_values: NewColumnValues | None) -> DeltaTable:
    """Schema evolution: source columns the target lacks become nullable columns, which
    the existing rows read as null or as the value *new_column_values* gives; columns
    whose type the source widened are widened (:mod:`tidemark.lake.widening`)."""
    fields = target_fields(schema, columns, spec)
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
    # history(1) of a table object behind the log (another writer committed since it
    # was read) lists the newer commits too: the one wanted is the object's own.
    version = table.version()
    latest = next((entry for entry in table.history(1) if entry.get("version") == version),
                  {})
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
