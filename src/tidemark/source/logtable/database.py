"""What a database must provide for its log tables to be read: the reader interface.

The reader (:mod:`tidemark.source.logtable.reader`) knows groups, positions and events;
a :class:`LogDatabase` knows its SQL: how the log was installed, how to read one
group's next changes after a position without ever missing a late commit, and how to
delete what every reader has passed. PostgreSQL (:mod:`.postgres`) and SQLite
(:mod:`.sqlite`) implement it; a ScyllaDB adapter would read its own CDC log the same
way (its ``cdc$time`` windows and confidence delay in place of PostgreSQL's snapshots).

A *position* is a JSON-able dict (stored as one offset per group) whose meaning only
the database that made it knows; :meth:`LogDatabase.start_position` is the position
before the first change of an empty log.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Final, NamedTuple, Protocol

import msgspec

from tidemark.event import TableId, TableSchema, WireTuple
from tidemark.fetch_budget import FetchBudget
from tidemark.source.logtable.layout import Generation

Position = dict[str, Any]
#: Bytes a change row takes besides its values once read (its log fields, the
#: envelope's source fields and Arrow's offsets), for :meth:`LogDatabase.range_bytes`.
ROW_OVERHEAD_BYTES: Final = 128
#: A chunk of a snapshot: the table's index and its rows as text.
Snapshotted = tuple[int, list[tuple[str | None, ...]]]


class LogTable(msgspec.Struct, frozen=True):
    """A captured table: its current columns and key (``schema``) and its log's name."""

    table: TableId
    log: str
    schema: TableSchema


class LogRow(NamedTuple):
    """One change read from a log table.

    ``values`` follow the captured table's columns: text (or bytes) for a set value,
    None for NULL, :data:`~tidemark.event.UNAVAILABLE` for an unchanged column. A
    delete carries the key columns only (the others unchanged).
    """

    time: int
    table: int  # index into the tables passed to read()
    stream: int
    generation: int
    operation: int
    batch_seq: int
    ts_us: int
    txid: int | None
    values: WireTuple


class ReaderPosition(NamedTuple):
    """A registered reader's saved position in one group, and when it saved it."""

    reader: str
    group: int
    position: Position
    updated_at: str


class ReadResult(NamedTuple):
    """Rows in ``cdc$time`` order, the position after them, and whether the group has
    nothing more to read right now (the caller may move to another group or wait).

    ``caught_up`` also promises that every change of the group committed before the
    :class:`LogDatabase` connected has been read: a bounded capture ends on it."""

    rows: list[LogRow]
    position: Position
    caught_up: bool


def merged_pages(streams: Sequence[Iterator[LogRow]], budgets: Sequence[FetchBudget]
                 ) -> Iterator[list[LogRow]]:
    """Tables' row streams, each in ``cdc$time`` order, merged into one, in pages of
    the rows the narrowest of the streams' *budgets* allows (bounded by bytes)."""
    page: list[LogRow] = []
    for row in heapq.merge(*streams, key=lambda r: r.time):
        page.append(row)
        if len(page) >= min(b.rows() for b in budgets):
            yield page
            page = []
    if page:
        yield page


def fetched(cursor: Any, budget: FetchBudget) -> Iterator[list[tuple[Any, ...]]]:
    """A cursor's rows, fetch by fetch, each of the rows *budget* allows."""
    while True:
        rows = cursor.fetchmany(budget.rows())
        if not rows:
            return
        budget.saw(rows)
        yield rows


class LogDatabase(Protocol):
    """One connection's worth of log-table access. Not thread-safe: one per task."""

    @property
    def connector(self) -> str:
        """The ``source.connector`` of its events (``postgresql``, ``sqlite``)."""
        ...

    @property
    def database(self) -> str:
        """The ``source.db`` of its events."""
        ...

    def generations(self) -> list[Generation]:
        """The stream description, oldest generation first (checked for gaps)."""
        ...

    def tables(self, include: list[str]) -> list[LogTable]:
        """The captured tables named by *include* (``schema.table`` or ``table``; empty:
        every table with a log); raises ConfigError for a table without a log."""
        ...

    def start_position(self) -> Position:
        """The position before everything the log holds."""
        ...

    def read(self, group: int, position: Position, tables: list[LogTable],
             limit: int) -> ReadResult:
        """Up to *limit* changes of *group* after *position*, over all *tables*."""
        ...

    def end_position(self) -> Position:
        """The position after everything committed now (the same for every group)."""
        ...

    def check_positions(self, positions: Iterable[Position]) -> None:
        """Raise ConfigError (key ``offsets``) for a saved position this log cannot
        continue from without skipping changes (a log installed again since)."""
        ...

    def clock(self) -> int:
        """The newest ``cdc$time`` handed out: how many changes were ever logged, near
        enough (it sizes a batch before it is read)."""
        ...

    def position_key(self, position: Position) -> int:
        """An int64 that grows with positions taken by :meth:`end_position`: a later
        end position that holds more changes has a larger key (it orders batches)."""
        ...

    def read_range(self, groups: Sequence[int], start: Position, end: Position,
                   tables: list[LogTable], fetch_rows: int) -> Iterator[list[LogRow]]:
        """The changes of *groups* after *start* up to *end* (an :meth:`end_position`;
        the groups share both), in ``cdc$time`` order, in pages of *fetch_rows*: one
        streamed scan per table, however many groups."""
        ...

    def range_bytes(self, groups: Sequence[int], start: Position, end: Position,
                    tables: list[LogTable]) -> int:
        """The bytes of the values :meth:`read_range` would return for the same
        arguments (as text; bytes as bytes), plus :data:`ROW_OVERHEAD_BYTES` per row:
        what sizes a Spark batch before it is read, whatever the rows' width. Asked of
        the database, without fetching the values."""
        ...

    def tick(self) -> None:
        """Move the end position past every position taken so far, logging no change
        (PostgreSQL: a transaction id used up; SQLite: the clock moved on), so that a
        batch ending after it sorts above every earlier one."""
        ...

    def read_view(self) -> AbstractContextManager[tuple[Position, Any]]:
        """A read-only transaction on a connection of its own, in a ``with``, and the
        position it sees: every change logged at or before the position is in what it
        reads, none after (PostgreSQL: a REPEATABLE READ transaction whose snapshot is
        the position; SQLite: a read transaction and the clock it sees)."""
        ...

    def snapshot(self, tables: list[LogTable], fetch_rows: int
                 ) -> AbstractContextManager[tuple[Position, Iterator[Snapshotted]]]:
        """The tables' rows as one consistent read, in a ``with``: the position it was
        taken at, and ``(table index, rows as text)`` chunks, read lazily; the read's
        connection ends with the block."""
        ...

    def register(self, reader: str, positions: Mapping[int, Position]) -> None:
        """Record that *reader* has durably saved *positions* (by group): retention
        deletes only what every registered reader of a group has passed."""
        ...

    def readers(self) -> list[ReaderPosition]:
        """The registered readers' positions, by reader and group."""
        ...

    def forget(self, reader: str) -> int:
        """Unregister *reader* (one that will not come back); the groups it held."""
        ...

    def prune(self, groups: Sequence[int], tables: list[LogTable], retention_s: float) -> int:
        """Delete the log rows of *groups* that every registered reader has passed and
        that are older than *retention_s*; the number deleted."""
        ...

    def behind(self, group: int, position: Position, tables: list[LogTable]) -> int:
        """How many logged changes of *group* are after *position* (for status)."""
        ...

    def check_unchanged(self, tables: list[LogTable]) -> None:
        """Raise SourceError when a captured table's columns no longer match its log."""
        ...

    def close(self) -> None:
        """Close the connection."""
        ...
