"""The log-table layout every database shares: names, columns, operations, streams, groups.

A captured table ``orders`` gets a log table ``orders_cdc_log`` beside it, in ScyllaDB's
CDC layout: one row per row change with the changed row's stream, a time that orders
the changes, the operation, the key columns, and each other column in one of three
states — unchanged, set to NULL, set to a value — kept as the column itself plus a
``cdc$deleted_<column>`` flag:

=====================  ===============  ==============================
state                  ``<column>``     ``cdc$deleted_<column>``
=====================  ===============  ==============================
set to a value         the value        NULL
set to NULL            NULL             true
unchanged              NULL             NULL
=====================  ===============  ==============================

**Streams and groups.** A row's key hashes to ``h`` in ``[0, 2^31)``; its stream is
``h * streams >> 31`` and its group ``h * groups >> 31`` (Scylla groups streams by
vnode, which is what a group is here: a fixed range of the hash space). ``streams`` is a
multiple of ``groups``, so every stream lies in one group, and a key's group does not
change when a new generation changes the number of streams: the one reader of a group
sees every change of a key, in order. The reader reads by group; the stream is kept for
Scylla's layout and for tools.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from enum import IntEnum
from typing import Final

import msgspec

from tidemark.errors import ConfigError

LOG_SUFFIX: Final = "_cdc_log"
STREAM: Final = "cdc$stream_id"
GROUP: Final = "cdc$group"
GENERATION: Final = "cdc$generation"
TIME: Final = "cdc$time"
BATCH_SEQ: Final = "cdc$batch_seq_no"
OPERATION: Final = "cdc$operation"
TXID: Final = "cdc$txid"  # PostgreSQL only: the writing transaction (xid8)
TS: Final = "cdc$ts"  # when the change was written (the event's source.ts_ms)
DELETED_PREFIX: Final = "cdc$deleted_"
META_COLUMNS: Final = (STREAM, GROUP, GENERATION, TIME, BATCH_SEQ, OPERATION, TXID, TS)

HASH_BITS: Final = 31
DEFAULT_STREAMS: Final = 256
DEFAULT_GROUPS: Final = 16
MAX_STREAMS: Final = 1 << 16
MAX_IDENTIFIER: Final = 63  # PostgreSQL's limit; SQLite has none, but one rule is simpler


class Operation(IntEnum):
    """``cdc$operation`` values, ScyllaDB's codes for the operations a row trigger sees."""

    UPDATE = 1
    INSERT = 2
    ROW_DELETE = 3


def log_table_name(table: str) -> str:
    """The log table of *table* (same schema); raises ConfigError when too long."""
    name = table + LOG_SUFFIX
    if len(name.encode()) > MAX_IDENTIFIER:
        raise ConfigError("tables", f"table {table!r}: its log table name {name!r} would be "
                          f"longer than {MAX_IDENTIFIER} bytes; rename the table or capture "
                          "it through logical replication instead")
    return name


def deleted_column(column: str) -> str:
    """The flag column that tells "set to NULL" from "unchanged" for *column*."""
    return DELETED_PREFIX + column


def check_columns(table: str, columns: Sequence[str]) -> None:
    """Refuse a table whose column names would clash with the log's own columns or be
    too long for their ``cdc$deleted_`` flag."""
    for column in columns:
        if column.startswith("cdc$"):
            raise ConfigError("tables", f"table {table!r} has a column {column!r}: names "
                              "starting with cdc$ are the log table's own; rename the column")
        if len(deleted_column(column).encode()) > MAX_IDENTIFIER:
            raise ConfigError("tables", f"table {table!r}: column {column!r} is too long for "
                              f"its flag column {deleted_column(column)!r} (at most "
                              f"{MAX_IDENTIFIER - len(DELETED_PREFIX)} bytes); rename it")


class Generation(msgspec.Struct, frozen=True):
    """One row of the stream description (Scylla's ``cdc_streams_descriptions``): from
    its start on, changes are spread over ``streams`` streams in ``groups`` groups."""

    number: int
    streams: int
    groups: int
    started_at: str = ""


def check_stream_counts(streams: int, groups: int) -> None:
    """Raise ConfigError unless *streams* and *groups* describe a valid split of the
    hash space."""
    if not 1 <= groups <= streams <= MAX_STREAMS:
        raise ConfigError("streams", f"need 1 <= groups <= streams <= {MAX_STREAMS}; got "
                          f"{streams} streams in {groups} groups")
    if streams % groups:
        raise ConfigError("streams", f"{streams} streams cannot be split into {groups} "
                          "groups: the number of streams must be a multiple of the groups")


def wanted_counts(previous: Generation | None, streams: int | None,
                  groups: int | None) -> tuple[int, int]:
    """The streams and groups an install asks for (defaults: the current generation's,
    or the defaults at the first install); raises ConfigError for a changed group count
    or counts that do not split the hash space."""
    wanted_groups = groups if groups is not None else (
        previous.groups if previous else DEFAULT_GROUPS)
    wanted_streams = streams if streams is not None else (
        previous.streams if previous else DEFAULT_STREAMS)
    check_stream_counts(wanted_streams, wanted_groups)
    if previous is not None and wanted_groups != previous.groups:
        raise ConfigError("groups", f"the log tables have {previous.groups} groups; groups "
                          "cannot change (every reader's offsets are per group): uninstall "
                          "and install again to change them")
    return wanted_streams, wanted_groups


def check_generations(generations: Sequence[Generation], where: str) -> None:
    """The description must number generations 1, 2, … without a gap, each covering the
    hash space with the same groups; raises ConfigError saying what to do otherwise."""
    if not generations:
        raise ConfigError("logtable", f"{where} describes no stream generation: run "
                          "`tidemark logtable install` first")
    for expected, generation in enumerate(generations, start=1):
        if generation.number != expected:
            raise ConfigError(
                "logtable", f"{where}: stream generation {expected} is missing (found "
                f"{generation.number}); the description was edited by hand: reinstall with "
                "`tidemark logtable uninstall` and `install`")
        try:
            check_stream_counts(generation.streams, generation.groups)
        except ConfigError as err:
            raise ConfigError("logtable", f"{where}: generation {generation.number} does not "
                              f"cover the hash space ({err}); reinstall the log tables") from None
        if generation.groups != generations[0].groups:
            raise ConfigError("logtable", f"{where}: generation {generation.number} has "
                              f"{generation.groups} groups, generation 1 has "
                              f"{generations[0].groups}; groups cannot change: reinstall")


def assign_groups(groups: int, tasks: int) -> list[list[int]]:
    """Groups split over at most *tasks* tasks as contiguous ranges, sizes differing by
    at most one (so a task's groups are one range of the hash space)."""
    if tasks < 1:
        raise ConfigError("tasks_max", f"must be at least 1, got {tasks}")
    tasks = min(tasks, groups)
    base, extra = divmod(groups, tasks)
    out: list[list[int]] = []
    start = 0
    for index in range(tasks):
        size = base + (1 if index < extra else 0)
        out.append(list(range(start, start + size)))
        start += size
    return out


_SAFE_NAME = re.compile(r"[^\x00]+")


def check_name(kind: str, name: str) -> str:
    """A schema, table or column name that may be quoted into SQL (no NUL, not empty,
    within the length limit); raises ConfigError naming it otherwise."""
    if not _SAFE_NAME.fullmatch(name) or len(name.encode()) > MAX_IDENTIFIER:
        raise ConfigError("tables", f"{kind} name {name!r} is not a valid identifier (1 to "
                          f"{MAX_IDENTIFIER} bytes, no NUL)")
    return name
