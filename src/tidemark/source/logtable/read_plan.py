"""The log tables' read plan for the Spark stream: stream groups spread over partitions.

An offset holds one position per group (``{"groups": {"0": position, …}}``, the same
positions the engine stores per group), and the log's clock when it was taken
(``"clock"``: the changes between two offsets, near enough, which sizes the batch).
A micro-batch ends at the database's current end
(:meth:`~tidemark.source.logtable.database.LogDatabase.end_position`, one for all
groups). Its groups are split into ``numPartitions`` contiguous ranges, as Scylla's
connector spreads vnode groups over tasks; each partition reads its groups with one
streamed scan per table on a connection of its own.

Every row of a batch carries ``_commit_lsn`` = the batch end's position key, which
grows from batch to batch, and ``_seq`` = its ``cdc$time``, which orders a key's
changes within the batch (a key lives in one group, read by one partition). So the
high-water mark of ``apply_changes`` stays right although times are not commit order
across keys: a late commit with a small time lands in a later batch, above the mark.

``snapshot = initial`` reads the tables' rows first, in a batch of their own, by a
consistent read taken when the executor runs (at the planned position or later); the
log is then read from the planned position, so changes the rows already hold are
applied again over them, which an upsert by key absorbs (SCD type 1 is exact; an SCD2
history may show such a change once more as a version).

``signalTable`` (in the log tables' database, or their SQLite file as ``main.<name>``):
the driver reads it before each batch and takes each ``tidemark-repair`` signal once,
into the batch's end offset (``repairs``, with the ids seen in ``signals``). It reads
the keys' rows then, as the snapshot reads rows, in the read view whose position is
that batch's end (:mod:`tidemark.source.logtable.repair_read`); the batch has one more
partition that emits them at the end's position key, above every change of the batch
(:mod:`tidemark.source.repair`). A batch replayed by another driver has no such rows:
the next batch takes its repairs again. ``execute-snapshot`` is not taken here: a
table's rows are loaded by ``snapshot = initial`` only (a new checkpoint reloads them).
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Iterator, Sequence
from typing import Any, Final

from tidemark.event import ChangeEvent, Op, SnapshotMarker, SourceContext, TableId
from tidemark.source.change_feed import ChangeFeed
from tidemark.source.logtable.config import is_sqlite
from tidemark.source.logtable.database import LogDatabase, LogTable, Position
from tidemark.source.logtable.layout import assign_groups
from tidemark.source.logtable.reader import events_of, open_database
from tidemark.source.logtable.repair_read import (
    HeldRepairRead,
    Row,
    key_check,
    key_columns,
    read_repair,
    rows_at_end,
)
from tidemark.source.logtable.signal_table import check_signal_table, signal_rows
from tidemark.source.read_plan import (
    ROW_SEQ,
    SNAPSHOT_INITIAL,
    ChangeSink,
    ReadOptions,
    TableColumns,
)
from tidemark.source.repair import (
    RepairRequest,
    repair_request,
    requests_from,
    requests_json,
)
from tidemark.source.repair_signal import RepairSignal
from tidemark.source.signal_requests import requests_in

log = logging.getLogger(__name__)

#: Above every ``cdc$time`` (a counter), below ``REPAIR_SEQ``.
_REPAIR_SEQ_BASE: Final = 1 << 61

_PRUNE_INTERVAL_S = 60.0


class GroupRange:
    """One partition: some groups' changes between two positions they share, or (no
    groups) the rows of ``snapshot`` tables."""

    def __init__(self, groups: Sequence[int], start: Position | None, end: Position,
                 key: int, snapshot: Sequence[str] = ()) -> None:
        self.groups = tuple(groups)
        self.start = start
        self.end = end
        self.key = key
        self.snapshot = tuple(snapshot)

    def __repr__(self) -> str:
        return (f"GroupRange({list(self.groups)}, {self.start} .. {self.end}, "
                f"snapshot={list(self.snapshot)})")


def _tables(db: LogDatabase, options: ReadOptions) -> list[LogTable]:
    return db.tables([str(t) for t in options.tables])


def make_read_plan(options: ReadOptions) -> LogTableReadPlan:
    """The read plan of a stream of the log tables *options* name."""
    return LogTableReadPlan(options)


class LogTableReadPlan:
    """Micro-batches of log-table changes (see the module docstring)."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self._target: Position | None = None
        self._last_prune = 0.0
        self._checked = False
        # The rows of the repairs of the batch this driver last planned with some: its
        # end offset's groups and repairs, the tables' column names, the rows.
        self._held: tuple[str, list[list[str]], list[list[Row]]] | None = None
        self._emitted: set[str] = set()  # ids of the repairs this driver's batches read

    @contextlib.contextmanager
    def _db(self) -> Iterator[LogDatabase]:
        db = open_database(self.options.dsn)
        try:
            yield db
        finally:
            db.close()

    def tables(self) -> dict[TableId, TableColumns]:
        """Check the log tables and describe each captured table."""
        return table_columns(self.options)

    def initial_offset(self) -> dict[str, Any]:
        """A new query reads the whole log (everything since the tables were installed);
        with ``snapshot=initial``, the tables' rows first and the log from now on."""
        with self._db() as db:
            groups = db.generations()[0].groups
            _tables(db, self.options)
            if self.options.snapshot == SNAPSHOT_INITIAL:
                start = db.end_position()
                tables = [str(t) for t in self.options.snapshot_tables]
            else:
                start, tables = db.start_position(), []
            clock = db.clock()
        return {"groups": {str(g): start for g in range(groups)}, "snapshot": tables,
                "clock": clock}

    def prepare_available_now(self) -> None:
        with self._db() as db:
            self._target = db.end_position()

    def latest(self, start: dict[str, Any], max_changes: int | None = None) -> dict[str, Any]:
        """Every group up to the database's end now (a batch holding a snapshot holds
        only the rows; the log follows from the same positions)."""
        signals = start.get("signals")
        if start.get("snapshot"):
            return {"groups": start["groups"], "snapshot": [],
                    "loaded": list(start["snapshot"]), "clock": start.get("clock", 0),
                    **({} if signals is None else {"signals": signals})}
        repairs: list[RepairRequest] = []
        with self._db() as db:
            if not self._checked:  # the checkpoint's positions, once per query start
                db.check_positions(start["groups"].values())
                self._checked = True
            if self.options.signal_table is not None:
                # Before the end is taken: on PostgreSQL the end then holds the signal
                # row's commit, which moves it past the last batch's end.
                signals, repairs = self._signals(db, signals)
            repairs = self._carried(start) + repairs
            held = None
            if repairs:
                # AvailableNow: a repair taken during the run is read in it, past its
                # target (which the next batches then leave alone).
                end, held = self._read_repairs(db, repairs)
            else:
                end = self._target if self._target is not None else db.end_position()
            # The clock after the end: it counts at least the changes the end holds.
            clock = db.clock()
            groups = {g: (p if db.position_key(end) <= db.position_key(p) else end)
                      for g, p in start["groups"].items()}
        result: dict[str, Any] = {"groups": groups, "snapshot": [], "loaded": [],
                                  "clock": clock}
        if signals is not None:
            result["signals"] = signals
        repaired = int(start.get("repaired", 0)) + (1 if repairs else 0)
        if repaired:
            result["repaired"] = repaired  # batches that took repairs, for their _seq
        if held is not None:
            result["repairs"] = requests_json(repairs)
            self._held = (_held_key(result), *held)
        same = groups == start["groups"] and signals == start.get("signals") and not repairs
        return dict(start) if same else result

    def _carried(self, start: dict[str, Any]) -> list[RepairRequest]:
        """The repairs of the batch ending at *start* that no batch of this driver read:
        it was replayed without their rows, or ran under an earlier driver (taken again,
        they are applied once more, at this batch's end)."""
        carried = [r for r in requests_from(start.get("repairs"))
                   if r.id not in self._emitted]
        if carried:
            log.info("repair(s) %s of the last batch were not read by this run: taken "
                     "again at the end of this batch", ", ".join(r.id for r in carried))
        return carried

    def _read_repairs(self, db: LogDatabase, repairs: Sequence[RepairRequest]
                      ) -> tuple[Position, tuple[list[list[str]], list[list[Row]]]]:
        """The position that ends the batch taking *repairs*, and their rows there."""
        entries = {str(e.table): e for e in db.tables(sorted({r.table for r in repairs}))}
        wanted = [entries[r.table] for r in repairs]
        end, rows = rows_at_end(db, is_sqlite(self.options.dsn), wanted, repairs)
        return end, ([list(e.schema.column_names) for e in wanted], rows)

    def _signals(self, db: LogDatabase, seen: list[str] | None
                 ) -> tuple[list[str], list[RepairRequest]]:
        """The ids of the signal table's rows now, and the repairs new ones ask for."""
        table = self.options.signal_table
        assert table is not None
        tables = [str(t) for t in self.options.tables]
        taken: list[RepairSignal] = []
        requested, ids = requests_in(signal_rows(self.options.dsn, table),
                                     None if seen is None else tuple(seen), tables, taken)
        for name in requested:
            log.warning("execute-snapshot of %s skipped: a log-table stream loads a table's "
                        "rows only with snapshot = initial (a new checkpoint); to mend "
                        "some rows, send tidemark-repair with their keys", name)
        repairs = []
        if taken:
            entries = _tables(db, self.options)
            keys = {str(e.table): key_columns(e) for e in entries}
            check = key_check(self.options.dsn, entries)
            repairs = [repair_request(s, tables, keys, check=check) for s in taken]
        return list(ids), [r for r in repairs if r is not None]

    def report_latest(self) -> dict[str, Any] | None:
        return None

    def plan(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[Any]:
        if start.get("snapshot"):
            return [GroupRange((), None, {}, 0, [table]) for table in start["snapshot"]]
        repairs = requests_from(end.get("repairs"))
        # Groups that share their start and end positions (all of them, but after a
        # query's first batch) are read together, numPartitions ways: one task per core
        # rather than per group keeps a small batch cheap.
        ranges: list[GroupRange] = []
        with self._db() as db:
            for groups, begin, position in _spans(start, end):
                key = db.position_key(position)
                for chunk in assign_groups(len(groups), self.options.num_partitions):
                    ranges.append(GroupRange([groups[i] for i in chunk], begin,
                                             position, key))
            # Every change of the batch is at or below the end's highest key.
            top = max((db.position_key(p) for p in end["groups"].values()), default=0) \
                if repairs else 0
        if not repairs:
            return ranges
        if self._held is None or self._held[0] != _held_key(end):
            log.warning("this batch's repair(s) %s were read by the run that planned it, "
                        "which ended: the next batch takes them again at its end",
                        ", ".join(r.id for r in repairs))
            return ranges
        _, names, rows = self._held
        self._emitted.update(r.id for r in repairs)
        return [*ranges, HeldRepairRead(len(ranges), repairs, top, repair_seq(end), names,
                                        rows)]

    def commit(self, end: dict[str, Any]) -> None:
        """*end* is committed: at most once a minute (the driver, between batches),
        record it in the reader registry (``readerName``) and delete the log rows every
        registered reader has passed that are older than ``retentionS`` (negative:
        never)."""
        if end.get("snapshot"):
            return
        now = time.monotonic()
        if now - self._last_prune < _PRUNE_INTERVAL_S:
            return
        self._last_prune = now
        with self._db() as db:
            tables = _tables(db, self.options)
            positions = {int(g): p for g, p in end["groups"].items()}
            db.register(self.options.reader_name, positions)
            retention = self.options.retention_s
            # Negative is "never": passed on, it would make the cutoff the future.
            deleted = db.prune(sorted(positions), tables, retention) if retention >= 0 else 0
        if deleted:
            log.info("deleted %d log rows every registered reader has passed", deleted)

    def stop(self) -> None:
        """Nothing held between batches."""

    def read(self, partition: Any, sink: ChangeSink) -> Iterator[None]:
        """The partition's groups' changes, or its tables' rows, or the rows of the
        batch's repairs, into *sink*."""
        if isinstance(partition, HeldRepairRead):
            return read_repair(partition, sink)
        return self._read_groups(partition, sink)

    def _read_groups(self, partition: Any, sink: ChangeSink) -> Iterator[None]:
        assert isinstance(partition, GroupRange)
        feed = ChangeFeed(sink, unchanged_columns=True)
        with self._db() as db:
            tables = _tables(db, self.options)
            if partition.snapshot:
                yield from _snapshot(db, feed, [t for t in tables
                                                if str(t.table) in partition.snapshot],
                                     self.options.arrow_batch_rows)
            else:
                assert partition.start is not None
                for rows in db.read_range(partition.groups, partition.start, partition.end,
                                          tables, self.options.arrow_batch_rows):
                    for event in events_of(db, tables, rows, "tidemark",
                                           commit_key=partition.key):
                        feed.add(event, event.lsn or 0, event.lsn or 0)
                    yield


def _spans(start: dict[str, Any], end: dict[str, Any]
           ) -> list[tuple[list[int], Position, Position]]:
    """The groups that moved between two offsets, by the positions they share: sorted
    groups, their start and their end."""
    moved: dict[str, list[int]] = {}
    spans: dict[str, tuple[Position, Position]] = {}
    for group, position in end["groups"].items():
        begin = start["groups"].get(group)
        if begin != position:
            span = json.dumps([begin, position], sort_keys=True)
            moved.setdefault(span, []).append(int(group))
            spans[span] = (begin, position)
    return [(sorted(groups), *spans[span]) for span, groups in moved.items()]


def batch_bytes(dsn: str, tables: Sequence[str], start: dict[str, Any],
                end: dict[str, Any]) -> int | None:
    """The bytes of log rows the batch from offset *start* to *end* reads (see
    :meth:`~tidemark.source.logtable.database.LogDatabase.range_bytes`), asked of the
    database; None for a batch that holds tables' rows (a snapshot), whose size the
    log does not tell."""
    if start.get("snapshot") or end.get("loaded"):
        return None
    spans = _spans(start, end)
    if not spans:
        return 0
    with contextlib.closing(open_database(dsn)) as db:
        entries = db.tables(list(tables))
        return sum(db.range_bytes(groups, begin, position, entries)
                   for groups, begin, position in spans)


def _snapshot(db: LogDatabase, feed: ChangeFeed, tables: list[LogTable],
              fetch_rows: int) -> Iterator[None]:
    taken_us = time.time_ns() // 1000
    context = SourceContext(db.connector, "tidemark", db.database, taken_us, None, None)
    with db.snapshot(tables, fetch_rows) as (_, chunks):
        for index, rows in chunks:
            schema = tables[index].schema
            for row in rows:
                feed.add(ChangeEvent(Op.READ, schema, None, row, context, 0, 0, 0,
                                     taken_us, SnapshotMarker.TRUE), 0, ROW_SEQ)
            yield


def _held_key(end: dict[str, Any]) -> str:
    """What identifies the batch whose repairs a driver read: its end's groups and
    repairs."""
    return json.dumps([end["groups"], end.get("repairs")], sort_keys=True)


def repair_seq(end: dict[str, Any]) -> int:
    """``_seq`` of the repair rows of the batch ending at *end*: above every ``cdc$time``,
    and rising from repair to repair. (A repair's batch also ends past every earlier
    position, :func:`~tidemark.source.logtable.repair_read.rows_at_end`: SCD2 versions
    are ordered by ``_commit_lsn`` alone.)"""
    return _REPAIR_SEQ_BASE + 2 * int(end.get("repaired", 0))


def table_columns(options: ReadOptions) -> dict[TableId, TableColumns]:
    """Check the log tables and describe each captured table."""
    with contextlib.closing(open_database(options.dsn)) as db:
        db.generations()
        described = {entry.table: TableColumns(entry.schema.columns)
                     for entry in _tables(db, options)}
    if options.signal_table is not None:
        check_signal_table(options.dsn, options.signal_table)
    return described
