"""What ``tidemark run`` checks against the world before anything is created.

:mod:`tidemark.pipeline.config` checks the file alone; this asks the places it names,
before anything is made (a directory, a slot, a publication) and before Spark starts
(a mistake found after those holds WAL, and comes behind a traceback): each local
target's directory can be created (it is made after every check:
:mod:`tidemark.pipeline.directories`; an object store's table can be opened), and each
target's
settings that name a column (keys, ``column_list``, ``partition_by``, …) name one its
table has in the source's catalog.
Each failure is a :class:`~tidemark.errors.ConfigError` naming the key, what is wrong
and what exists.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from deltalake.exceptions import DeltaError

from tidemark.errors import ConfigError
from tidemark.lake import change_rows as cr
from tidemark.lake.delta_target import check_target, open_target, target_error
from tidemark.pipeline.config import PipelineConfig, Target
from tidemark.pipeline.directories import cannot_create
from tidemark.source.kind import SourceKind

#: The apply settings whose values are column names of the source table.
_COLUMN_SETTINGS = ("keys", "sequence_by", "column_list", "except_column_list",
                    "track_history_column_list", "track_history_except_column_list",
                    "partition_by")


def check_before_start(config: PipelineConfig, kind: SourceKind) -> None:
    """Raise ConfigError if a target's directory cannot be made or a setting names a
    column (or a table) the source does not have; makes nothing."""
    for target in config.targets:
        if target.local:
            check_target_directory(target)
        else:
            check_remote_merge(target)
            reach_target(target)
    check_columns(config.targets, kind.table_columns(config.dsn, list(config.tables)))


def check_remote_merge(target: Target) -> None:
    """Raise ConfigError if the object-store *target* is set to merge on read (its
    deletion vectors and exclusive commits are written on the local file system only):
    refused here, not at its first batch."""
    if target.spec.merge == "merge_on_read":
        raise ConfigError(f'targets."{target.table}".merge',
                          f"merge_on_read writes deletion vectors on the local file "
                          f"system only, and {target.path} is not local: use "
                          f"\"copy_on_write\" or \"auto\" (which merges it "
                          f"copy-on-write) for this target")


def check_target_directory(target: Target) -> None:
    """Raise naming the key, the path and why, if *target*'s directory holds something
    other than a Delta table or cannot be made (the start makes it after its checks;
    empty: the first batch creates the table in it)."""
    key = f'targets."{target.table}".path'
    try:
        check_target(target.path)  # a file or another directory took its place
    except ConfigError as err:
        raise ConfigError(key, str(err).removeprefix(f"{err.key}: ")) from None
    reason = cannot_create(Path(target.path))
    if reason is not None:
        raise ConfigError(key, f"cannot create the target directory {target.path}: "
                               f"{reason}")


def reach_target(target: Target) -> None:
    """Open *target*'s table in its object store (none there yet is fine), or raise
    naming the key, the URI and delta-rs' reason (an unknown scheme, a bucket or
    credentials it cannot use)."""
    key = f'targets."{target.table}".path'
    try:
        open_target(target.path, target.storage_options)
    except ConfigError as err:
        raise ConfigError(key, str(err).removeprefix(f"{err.key}: ")) from None
    except (DeltaError, OSError) as err:
        raise ConfigError(key, str(target_error(target.path, "open", err))
                          .removeprefix("target: ")) from None


def check_columns(targets: Sequence[Target],
                  columns: Mapping[str, Sequence[str]] | None) -> None:
    """Raise ConfigError if a target's table is not in *columns* (the source's catalog)
    or one of its settings names a column the table lacks; nothing if *columns* is
    None (unknown before the start)."""
    if columns is None:
        return
    for target in targets:
        section = f'targets."{target.table}"'
        have = columns.get(target.table)
        if have is None:
            raise ConfigError(section, f"table {target.table} does not exist in the source "
                                       "(or cannot be read): create it, or fix the name")
        known = set(have)
        for setting, names in _named_columns(target):
            unknown = [n for n in names if n not in known and n not in cr.METADATA_COLUMNS]
            if unknown:
                raise ConfigError(
                    f"{section}.{setting}",
                    f"table {target.table} has no column {', '.join(map(repr, unknown))}; "
                    f"its columns are {', '.join(have)}")


def _named_columns(target: Target) -> Iterator[tuple[str, Sequence[str]]]:
    for setting in _COLUMN_SETTINGS:
        value = getattr(target.spec, setting)
        if value is not None:
            yield setting, value
