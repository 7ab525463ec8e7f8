"""What to apply and how: :class:`ApplySpec`, Databricks ``APPLY CHANGES`` vocabulary.

The spec is validated when built (each bad value named with what is allowed) and again
against every batch's schema by :meth:`ApplySpec.resolve`, which decides the target's
columns.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc

from tidemark.errors import ConfigError, unknown_key_error
from tidemark.lake import change_rows as cr
from tidemark.lake.sql import check_identifier

#: ``_op == 'd'``: Debezium deletes.
DEFAULT_DELETES: Final = pc.field(cr.OP) == "d"
#: The values of :attr:`ApplySpec.merge`.
MERGE_MODES: Final = ("auto", "copy_on_write", "merge_on_read")
#: ``_op == 't'``: truncates.
DEFAULT_TRUNCATES: Final = pc.field(cr.OP) == "t"


def _names(value: object, setting: str, *, allow_empty: bool = True) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise ConfigError(setting, f"must be a list of column names, got {value!r}")
    names = tuple(check_identifier(v, setting) for v in value)
    if not names and not allow_empty:
        raise ConfigError(setting, "must name at least one column")
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigError(setting, f"lists {', '.join(duplicates)} more than once")
    return names


def _optional_names(value: object, setting: str) -> tuple[str, ...] | None:
    return None if value is None else _names(value, setting)


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)  # expressions do not compare
class ApplySpec:
    """How change rows are applied to a target table (Databricks ``AUTO CDC`` terms)."""

    keys: tuple[str, ...]
    """Columns identifying a row of the target (the source's primary key)."""

    sequence_by: tuple[str, ...] = cr.DEFAULT_SEQUENCE
    """Columns ordering the changes of one key, compared lexicographically; the latest
    wins. Default: the transaction's commit LSN, then the change's order in it."""

    apply_as_deletes: pc.Expression = dataclasses.field(default_factory=lambda: DEFAULT_DELETES)
    """Which change rows are deletes (a ``pyarrow.compute`` expression)."""

    apply_as_truncates: pc.Expression = dataclasses.field(
        default_factory=lambda: DEFAULT_TRUNCATES)
    """Which change rows are truncates (they carry no key)."""

    column_list: tuple[str, ...] | None = None
    """Columns to keep in the target (keys included); default: every table column."""

    except_column_list: tuple[str, ...] | None = None
    """Columns to leave out of the target (exclusive with ``column_list``)."""

    stored_as_scd_type: int = 1
    """1: the target holds the latest row per key. 2: it holds every version, with
    ``__START_AT``/``__END_AT`` (``__END_AT`` null on the current version)."""

    track_history_column_list: tuple[str, ...] | None = None
    """SCD2: only changes to these columns start a new version; other changes update the
    current version in place. Default: every column."""

    track_history_except_column_list: tuple[str, ...] | None = None
    """SCD2: changes to these columns update the current version in place."""

    ignore_null_updates: bool = False
    """A null in an upsert keeps the target's current value instead of writing null."""

    ordered_batches: bool = True
    """Batches arrive in sequence order (tidemark's source; a Debezium topic read in
    order). Then a change at or below the highest sequence already applied to the table
    is a replay and is skipped, which also keeps an old change from resurrecting a key
    deleted later (SCD1 keeps no tombstones). Set False only for a source that reorders
    across batches: live rows stay protected per key, deleted keys are not."""

    partition_by: tuple[str, ...] = ()
    """Partition columns used when the target is created."""

    soft_delete_column: str | None = None
    """SCD1: a boolean column (e.g. ``_deleted``) that marks deleted rows instead of
    removing them. A delete sets it true and keeps the row's last values (and moves its
    sequence on, so an older change cannot bring it back); a later insert or update of
    the key sets it false; a truncate marks every row before it. None: deletes remove."""

    merge: str = "copy_on_write"
    """How a batch's updates and deletes reach the files: ``"copy_on_write"`` rewrites
    each file holding a changed row; ``"merge_on_read"`` marks the changed rows in
    deletion vectors and writes only the batch's rows (:mod:`tidemark.lake.merge_on_read`:
    the cost follows the batch, not the table; readers must read deletion vectors);
    ``"auto"`` chooses per batch by how much of the table copy-on-write would rewrite."""

    def __post_init__(self) -> None:
        fix = object.__setattr__  # frozen: normalise lists to tuples once, here
        fix(self, "keys", _names(self.keys, "keys", allow_empty=False))
        fix(self, "sequence_by", _names(self.sequence_by, "sequence_by", allow_empty=False))
        for setting in ("column_list", "except_column_list", "track_history_column_list",
                        "track_history_except_column_list"):
            fix(self, setting, _optional_names(getattr(self, setting), setting))
        fix(self, "partition_by", _names(self.partition_by, "partition_by"))
        for setting in ("apply_as_deletes", "apply_as_truncates"):
            if not isinstance(getattr(self, setting), pc.Expression):
                raise ConfigError(setting, "must be a pyarrow.compute expression, e.g. "
                                           "pc.field('_op') == 'd'")
        if self.stored_as_scd_type not in (1, 2) or isinstance(self.stored_as_scd_type, bool):
            raise ConfigError("stored_as_scd_type",
                              f"must be 1 or 2, got {self.stored_as_scd_type!r}")
        if self.column_list is not None and self.except_column_list is not None:
            raise ConfigError("column_list", "set column_list or except_column_list, not both")
        tracked = (self.track_history_column_list, self.track_history_except_column_list)
        if tracked[0] is not None and tracked[1] is not None:
            raise ConfigError("track_history_column_list", "set track_history_column_list or "
                              "track_history_except_column_list, not both")
        if self.stored_as_scd_type == 1 and tracked != (None, None):
            setting = ("track_history_column_list" if tracked[0] is not None
                       else "track_history_except_column_list")
            raise ConfigError(setting, "only applies to stored_as_scd_type=2")
        if self.merge not in MERGE_MODES:
            raise ConfigError("merge", f"must be one of {', '.join(MERGE_MODES)}, got "
                                       f"{self.merge!r}")
        for setting in ("ignore_null_updates", "ordered_batches"):
            if not isinstance(getattr(self, setting), bool):
                raise ConfigError(setting, f"must be true or false, got "
                                           f"{getattr(self, setting)!r}")
        if self.soft_delete_column is not None:
            check_identifier(self.soft_delete_column, "soft_delete_column")
            if self.stored_as_scd_type != 1:
                raise ConfigError("soft_delete_column", "only applies to stored_as_scd_type=1 "
                                  "(SCD2 closes a deleted row's version instead)")
            if self.soft_delete_column in (*self.keys, *self.sequence_by):
                raise ConfigError("soft_delete_column", f"{self.soft_delete_column!r} is a "
                                  "key or sequence column; name a column of its own")
        for name in (*self.keys, *self.sequence_by):
            if name.startswith(cr.WORK_PREFIX) or name in (cr.START_AT, cr.END_AT):
                raise ConfigError("keys", f"{name!r} is a reserved column name")
        overlap = sorted(set(self.keys) & set(self.sequence_by))
        if overlap:
            raise ConfigError("sequence_by", f"{', '.join(overlap)} is a key column; "
                                             "sequence_by must name other columns")

    @property
    def version_column(self) -> str:
        """SCD2: the sequence column whose value is stored in ``__START_AT``/``__END_AT``.

        Changes of one key that share it become one version (for the default, one per
        transaction: the states inside a transaction were never visible to anyone)."""
        return self.sequence_by[0]

    def resolve(self, schema: pa.Schema) -> ResolvedColumns:
        """Check the spec against a batch's *schema* and decide the target's columns."""
        present = set(schema.names)
        allowed = ", ".join(schema.names)
        if len(present) != len(schema.names):
            twice = sorted({n for n in schema.names if schema.names.count(n) > 1})
            raise ConfigError("change rows", f"column {twice[0]!r} appears more than once")
        for setting, names in (("keys", self.keys), ("sequence_by", self.sequence_by)):
            for name in names:
                if name not in present:
                    raise ConfigError(setting, f"column {name!r} is not in the change rows; "
                                               f"their columns are: {allowed}")
        for name in schema.names:
            check_identifier(name, "change rows")
            if name.startswith(cr.WORK_PREFIX) or name in (cr.START_AT, cr.END_AT):
                raise ConfigError("change rows", f"column {name!r} uses a reserved name "
                                  f"(prefix {cr.WORK_PREFIX!r}, {cr.START_AT}, {cr.END_AT})")
        if self.soft_delete_column in present:
            raise ConfigError("soft_delete_column", f"{self.soft_delete_column!r} is a column "
                              "of the change rows; name a column the source does not have")
        table_columns = [n for n in schema.names if n not in cr.METADATA_COLUMNS]
        for setting in ("column_list", "except_column_list", "track_history_column_list",
                        "track_history_except_column_list"):
            for name in getattr(self, setting) or ():
                if name not in present:
                    raise ConfigError(setting, f"column {name!r} is not in the change rows; "
                                               f"their columns are: {allowed}")
        if self.column_list is not None:
            missing = [k for k in self.keys if k not in self.column_list]
            if missing:
                raise ConfigError("column_list", f"must include the key column(s) "
                                                 f"{', '.join(missing)}")
            data = [n for n in schema.names if n in self.column_list]
        else:
            excluded = set(self.except_column_list or ())
            dropped_keys = [k for k in self.keys if k in excluded]
            if dropped_keys:
                raise ConfigError("except_column_list", f"cannot leave out the key column(s) "
                                                        f"{', '.join(dropped_keys)}")
            data = [n for n in table_columns if n not in excluded]
        for name in self.partition_by:
            if name not in data:
                raise ConfigError("partition_by", f"column {name!r} is not a target column; "
                                                  f"target columns are: {', '.join(data)}")
        if self.stored_as_scd_type == 1:
            # The target keeps the sequence of each row: the merge compares it so that an
            # older change never overwrites a newer row.
            data += [s for s in self.sequence_by if s not in data]
            tracked: tuple[str, ...] = ()
        else:
            data = [n for n in data if n not in self.sequence_by or n in (self.column_list or ())]
            if self.track_history_column_list is not None:
                tracked = tuple(n for n in data if n in self.track_history_column_list)
            else:
                untracked = set(self.track_history_except_column_list or ())
                tracked = tuple(n for n in data if n not in untracked)
        return ResolvedColumns(data=tuple(data), tracked=tracked)


@dataclasses.dataclass(frozen=True)
class ResolvedColumns:
    """The target's data columns for one batch, and (SCD2) the history-tracked ones."""

    data: tuple[str, ...]
    tracked: tuple[str, ...]


def spec_from_mapping(values: dict[str, Any]) -> ApplySpec:
    """An :class:`ApplySpec` from a config mapping (unknown keys are errors)."""
    allowed = {f.name for f in dataclasses.fields(ApplySpec)} - {
        "apply_as_deletes", "apply_as_truncates"}
    for key in values:
        if key not in allowed:
            raise unknown_key_error("apply", key, allowed)
    return ApplySpec(**values)
