"""PostgreSQL's read plan for the Spark stream: offsets, admission control, partitions,
reading and committing (:class:`tidemark.source.read_plan.ReadPlan`).

The driver-side methods may keep a connection; ``read`` runs on executors, in other
processes, on a pickled copy of the plan that never ran any other method — so ``read``
opens its own connection and uses nothing but the options and the partition.

Design (see :mod:`tidemark.source.postgres.stream_offsets` for the offset rule):

* ``latest`` returns the server's flush position (peeks decode only that far), or,
  under ``maxChangesPerTrigger``, the end of the last whole transaction that fits, found
  by a server-side scan that returns one row per transaction and is cached for the
  following batches.
* ``plan(start, end)`` cuts the range into up to ``numPartitions`` WAL slices. Each
  ``read`` peeks its own temporary copy of the slot fast-forwarded to its slice, so the
  server-side decoding and the Python decoding of one batch both run in parallel.
* ``commit(end)`` is the only place the slot moves (``pg_replication_slot_advance``):
  Spark calls it after the batch is committed to the checkpoint, so a batch Spark may
  still replay is never released.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator, Sequence
from typing import Any, Final

import psycopg

from tidemark import faults
from tidemark.event import TableId
from tidemark.source.postgres import slot_holder
from tidemark.source.postgres import wal_reads as wal
from tidemark.source.postgres.chunked_snapshot import (
    PendingExport,
    SkippingSink,
    SnapshotChunk,
    SnapshotExport,
    estimated_rows,
    next_boundary,
    primary_key,
    read_chunk_text,
)
from tidemark.source.postgres.pgoutput import lsn_to_str
from tidemark.source.postgres.pgoutput_walk import TransactionWalker
from tidemark.source.postgres.read_checks import table_columns
from tidemark.source.postgres.repair_hold import ExportedRepairRead, RepairHold
from tidemark.source.postgres.repair_read import key_problem, read_repair
from tidemark.source.postgres.restart_point import RestartPoints
from tidemark.source.postgres.snapshot_plan import ChunkRange, SnapshotPlan
from tidemark.source.postgres.stream_offsets import (
    SourceOffset,
    TxnIndex,
    end_for_limit,
    from_offset,
    split_range,
    to_offset,
)
from tidemark.source.postgres.stream_signals import snapshot_requests
from tidemark.source.read_plan import SNAPSHOT_INITIAL, ChangeSink, ReadOptions, TableColumns
from tidemark.source.repair import RepairRequest, repair_request
from tidemark.source.repair_signal import RepairSignal

log = logging.getLogger(__name__)

#: Messages one admission-control scan may decode before it stops (whole transactions).
_MIN_SCAN_ROWS: Final = 200_000

#: WAL below which a batch is not cut into more partitions: each partition costs a
#: connection, a slot copy and its fast-forward, more than decoding a few MB in
#: parallel saves (the empty or small batches of a running pipeline).
MIN_SLICE_BYTES: Final = 4 << 20


class WalSlice:
    """One partition: the transactions committing in ``[lo, hi)``, as plain integers;
    *skip* drops a snapshotted table's changes before its snapshot's position."""

    def __init__(self, index: int, lo: int, hi: int,
                 skip: dict[str, int] | None = None) -> None:
        self.index = index
        self.lo = lo
        self.hi = hi
        self.skip = skip or {}

    def __repr__(self) -> str:
        return f"WalSlice({self.index}, {lsn_to_str(self.lo)}, {lsn_to_str(self.hi)})"


def make_read_plan(options: ReadOptions) -> PostgresReadPlan:
    """The read plan of a stream of the PostgreSQL database *options* name."""
    return PostgresReadPlan(options)


class PostgresReadPlan:
    """Micro-batches of whole PostgreSQL transactions from one logical slot."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self._conn: psycopg.Connection[Any] | None = None
        self._index = TxnIndex()
        self._target: int | None = None  # Trigger.AvailableNow's end, once prepared
        self._commits = 0  # commit() calls so far, for tidemark.faults
        self._export: SnapshotExport | None = None  # the running snapshot's, if ours
        self._finished: set[str] = set()  # exports whose every chunk this driver read
        self._keys: dict[str, tuple[str, ...]] = {}
        self._repair_export: SnapshotExport | None = None  # the held repairs' export
        self._repair_pending: PendingExport | None = None  # one whose slot still waits
        self._repairs_read: set[str] = set()  # repair exports this driver read and closed
        #: The backends of this driver's earlier connections: after one broke (a
        #: ServerTimeoutError, a network cut) the server may keep it, and its claim on
        #: the slot, for a while; it is this driver's, so a new claim ends it.
        self._own_backends: dict[int, str] = {}
        self._restart_points = RestartPoints()

    def __getstate__(self) -> dict[str, Any]:
        # The driver's connections must not travel (nor fail pickling).
        state = dict(self.__dict__)
        state["_conn"] = None
        state["_export"] = None
        state["_repair_export"] = None
        state["_repair_pending"] = None
        return state

    # -- driver side -------------------------------------------------------------------
    def tables(self) -> dict[TableId, TableColumns]:
        """Check the database, the tables and the publication; describe each table."""
        return table_columns(self.options)

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            conn = wal.connect(self.options.dsn, purpose="driver",
                               server_timeout_s=self.options.server_timeout_ms / 1000)
            try:
                # Held while this driver (and so the query) runs: another reader of the
                # slot is refused at its start instead of taking this one's changes.
                slot_holder.claim(conn, self.options.slot, "the stream's slot option",
                                  own=self._own_backends)
            except BaseException:
                conn.close()
                raise
            self._own_backends[conn.info.backend_pid] = slot_holder.backend_start(conn)
            self._conn = conn
        return self._conn

    def initial_offset(self) -> dict[str, Any]:
        """A new query starts where the slot is, creating the slot if missing."""
        position = wal.ensure_slot(self._connection(), self.options.slot,
                                       self.options.slot_failover)
        log.info("slot %s starts at %s", self.options.slot, lsn_to_str(position))
        # No table is known yet: the first batch decides which ones get a snapshot.
        return SourceOffset(position, known=()).to_json()

    def prepare_available_now(self) -> None:
        """Trigger.AvailableNow: read what is flushed now, then stop."""
        self._target = wal.readable_end(self._connection(), self.options.slot)
        log.info("AvailableNow: reading up to %s", lsn_to_str(self._target))

    def latest(self, start: dict[str, Any], max_changes: int | None) -> dict[str, Any]:
        """The end of the next batch: everything flushed, or whole transactions up to
        ``maxChangesPerTrigger`` changes; while a snapshot runs, its next chunks, and
        the stream no further than the snapshot's consistent point."""
        state = SourceOffset.parse(start)
        planned = self._snapshot_step(state)
        start_lsn = state.lsn
        end_lsn = start_lsn
        available = self._available(restart_point=True)
        held = planned.held
        if held is not None and self._target is not None and self._target < held.at:
            # AvailableNow: a repair taken during the run is read in it, past its target.
            available = max(available, min(held.at, wal.readable_end(self._connection(),
                                                                      self.options.slot)))
        if available > start_lsn:
            if max_changes is not None:
                end_lsn = self._end_for_limit(start_lsn, available, max_changes)
            else:
                # Everything flushed. When only other tables wrote WAL the batch is
                # empty, and committing it still lets the slot release that WAL.
                end_lsn = available
        if planned.snapshot is not None:
            # A change past the snapshot's point must not reach the sink before the
            # snapshot's rows (see tidemark.source.postgres.chunked_snapshot).
            end_lsn = max(start_lsn, min(end_lsn, planned.snapshot.at))
        taken = None
        if held is not None and held.export:
            # The repair is read at its snapshot's point: the batch that ends there takes it.
            end_lsn = max(start_lsn, min(end_lsn, held.at))
            if end_lsn == held.at:
                held, taken = None, held
        skip = {t: at for t, at in planned.skip.items() if at > start_lsn}
        end = dataclasses.replace(planned, lsn=end_lsn, skip=skip, held=held, repairs=taken)
        # The last batch's repairs are not this one's: without anything new, no batch.
        same = dataclasses.replace(end, repairs=state.repairs) == state and taken is None
        return dict(start) if same else end.to_json()

    # -- snapshots (see tidemark.source.postgres.chunked_snapshot) ----------------------
    def _snapshot_step(self, state: SourceOffset) -> SourceOffset:
        """The snapshot state of the next batch: tables to take in, a generation to
        start or restart, the next chunks."""
        tables = [str(t) for t in self.options.tables]
        known = list(state.known) if state.known is not None else list(tables)
        skip = dict(state.skip)
        plan = state.snapshot
        if plan is not None and plan.done and (self._holds(plan)
                                               or plan.export in self._finished):
            # The batch that ended here read its last chunks.
            log.info("snapshot of %s done: %d chunks", ", ".join(plan.tables),
                     plan.chunks_done)
            self._finished.add(plan.export)
            self._close_export()
            known += [t for t in plan.tables if t not in known]
            plan = None
        elif plan is not None and not self._holds(plan):
            restarted = self._restart(plan)
            # The tables before the restarted ones were read whole at the old point,
            # which their skip entries keep: done, not new (or they would be read again).
            known += [t for t in plan.tables
                      if t not in restarted.tables and t not in known]
            plan = restarted
            skip.update(dict.fromkeys(plan.tables, plan.at))
        # Tables whose snapshot generation starts now (their skip moves to its point).
        started = set(plan.tables) if plan is not None and plan is not state.snapshot \
            else set()
        signals = state.signals
        repairs: list[RepairRequest] = []
        if plan is None:
            new = [t for t in tables if t not in known]
            wanted = {str(t) for t in self.options.snapshot_tables} \
                if self.options.snapshot == SNAPSHOT_INITIAL else set()
            known = [t for t in known if t in tables] + [t for t in new if t not in wanted]
            to_snapshot = [t for t in new if t in wanted]
            if self.options.signal_table is not None:
                taken: list[RepairSignal] = []
                requested, signals = snapshot_requests(
                    self._connection(), self.options.signal_table, signals, known, taken)
                to_snapshot += [t for t in requested if t not in to_snapshot]
                repairs = [r for r in (repair_request(
                    s, tables, self._key,
                    check=lambda r: key_problem(self._connection(), r)) for s in taken)
                    if r is not None]
            if to_snapshot:
                plan = self._generation(to_snapshot, 1, chunks_done=0)
                skip.update(dict.fromkeys(to_snapshot, plan.at))
                started.update(to_snapshot)
        if plan is not None:
            plan = self._plan_chunks(plan)
        return SourceOffset(state.lsn, tuple(known), skip, plan, signals,
                            self._repair_step(state, repairs, started))

    # -- repairs (see tidemark.source.postgres.repair_hold) -----------------------------
    def _repair_step(self, state: SourceOffset, new: list[RepairRequest],
                     snapshotted: set[str] | frozenset[str] = frozenset()
                     ) -> RepairHold | None:
        """The repairs the next batches wait for: those held, those of the batch ending
        here unless this driver read them itself (a replay, or a restart: whether an
        earlier driver read them is not known, and reading them again is exact at the
        new point), and *new*, under an export this driver holds, whose point the
        stream has not passed. A table in *snapshotted* starts a snapshot generation:
        its rows come from that snapshot, whose point drops the table's stream changes
        before it, so a repair read below that point could restore a row deleted in
        between; the snapshot supersedes its repairs."""
        done = state.repairs
        if done is not None and self._holds_repair(done.export):
            self._repairs_read.add(done.export)
            self._close_repair()  # the batch that ended here read them
        requests = list(state.held.requests) if state.held is not None else []
        if done is not None and done.export not in self._repairs_read:
            requests = [*done.requests, *requests]
        requests += new
        superseded = [r for r in requests if r.table in snapshotted]
        if superseded:
            log.info("the snapshot of %s supersedes its repair (signal(s) %s)",
                     ", ".join(sorted({r.table for r in superseded})),
                     ", ".join(r.id for r in superseded))
            requests = [r for r in requests if r.table not in snapshotted]
        if not requests:
            # Nothing to hold: an export made or being made for superseded repairs would
            # keep its slot (WAL) and snapshot (vacuum) for nothing.
            self._close_repair()
            self._abandon_pending()
            return None
        held = state.held
        if held is not None and self._holds_repair(held.export) and held.at >= state.lsn:
            return dataclasses.replace(held, requests=tuple(requests))
        export = self._new_repair_export()
        if export is None or export.at < state.lsn:
            if export is not None:  # the stream passed its point while it was made
                self._close_repair()
            # Held without an export: the stream goes on; a later batch takes one.
            return RepairHold(0, "", tuple(requests))
        log.info("repair of %s held until the stream reaches %s",
                 ", ".join(sorted({r.table for r in requests})), lsn_to_str(export.at))
        return RepairHold(export.at, export.name, tuple(requests))

    def _new_repair_export(self) -> SnapshotExport | None:
        """A new export for held repairs, or None while its slot waits for transactions
        to end (AvailableNow waits: its run must read the repair before it stops)."""
        if self._repair_pending is None:
            self._close_repair()
            self._repair_pending = PendingExport(
                self.options.dsn, f"{self.options.slot}_repair", self.options.publication)
        try:
            export = self._repair_pending.result(None if self._target is not None else 0.0)
        except BaseException:
            self._repair_pending = None  # the next batch tries a new one
            raise
        if export is not None:
            self._repair_pending = None
            self._repair_export = export
        return export

    def _abandon_pending(self) -> None:
        if self._repair_pending is not None:
            pending, self._repair_pending = self._repair_pending, None
            pending.abandon()

    def _holds_repair(self, export: str) -> bool:
        return self._repair_export is not None and self._repair_export.name == export

    def _close_repair(self) -> None:
        if self._repair_export is not None:
            self._repair_export.close()
            self._repair_export = None

    def _holds(self, plan: SnapshotPlan) -> bool:
        return self._export is not None and self._export.name == plan.export

    def _generation(self, tables: list[str], generation: int, *,
                    chunks_done: int) -> SnapshotPlan:
        self._close_export()
        self._export = SnapshotExport(self.options.dsn, f"{self.options.slot}_snapshot",
                                      self.options.publication)
        conn = self._connection()
        estimates = tuple(estimated_rows(conn, TableId.parse(t)) for t in tables)
        log.info("snapshot generation %d of %s at %s", generation, ", ".join(tables),
                 lsn_to_str(self._export.at))
        return SnapshotPlan(generation=generation, at=self._export.at,
                            export=self._export.name, taken_us=self._export.taken_us,
                            tables=tuple(tables), chunks_done=chunks_done,
                            estimates=estimates)

    def _restart(self, plan: SnapshotPlan) -> SnapshotPlan:
        """A snapshot whose export died with an earlier driver: a new generation from
        the table of the first chunk that may not have been read, from its start."""
        first = plan.chunks[0].table if plan.chunks else plan.tables[plan.position]
        remaining = list(plan.tables[plan.tables.index(first):])
        log.warning("snapshot generation %d of %s was interrupted (its exported snapshot "
                    "ended with the driver that held it); %s start again from a new "
                    "snapshot", plan.generation, ", ".join(plan.tables), ", ".join(remaining))
        return self._generation(remaining, plan.generation + 1,
                                chunks_done=plan.chunks_done - len(plan.chunks))

    def _plan_chunks(self, plan: SnapshotPlan) -> SnapshotPlan:
        """The next chunks (key ranges found by the server, never by reading rows here)."""
        conn = self._connection()
        chunks: list[ChunkRange] = []
        position, after = plan.position, plan.after
        while len(chunks) < self.options.snapshot_chunks_per_trigger and \
                position < len(plan.tables):
            table = plan.tables[position]
            upto = next_boundary(conn, TableId.parse(table), self._key(table), after,
                                 self.options.snapshot_chunk_rows)
            chunks.append(ChunkRange(table, after, upto))
            position, after = (position + 1, None) if upto is None else (position, upto)
        return dataclasses.replace(plan, position=position, after=after,
                                   chunks=tuple(chunks),
                                   chunks_done=plan.chunks_done + len(chunks))

    def _key(self, table: str) -> tuple[str, ...]:
        if table not in self._keys:
            self._keys[table] = primary_key(self._connection(), TableId.parse(table))
        return self._keys[table]

    def _close_export(self) -> None:
        if self._export is not None:
            self._export.close()
            self._export = None

    def report_latest(self) -> dict[str, Any] | None:
        return to_offset(self._available())

    def _available(self, *, restart_point: bool = False) -> int:
        conn = self._connection()
        flushed = wal.readable_end(conn, self.options.slot)
        if restart_point and self._restart_points.due(flushed):
            self._restart_points.log_record(conn)
        return flushed if self._target is None else min(flushed, self._target)

    def _end_for_limit(self, start: int, available: int, max_changes: int) -> int:
        if self._index.covers(start):
            planned = self._index.plan(start, max_changes)
            if planned is not None:
                return planned
        conn = self._connection()
        budget = max(_MIN_SCAN_ROWS, 2 * max_changes)
        with wal.slot_copy_at(conn, self.options.slot, start) as copy:
            txns, truncated = wal.scan(conn, copy, self.options.publication, available, budget)
        # A truncated scan knows every commit up to its last transaction only.
        known_until = txns[-1].commit_lsn + 1 if truncated and txns else available
        self._index = TxnIndex(start, known_until, txns)
        end = end_for_limit(txns, start, max_changes)
        log.debug("scan from %s: %d transactions, batch ends at %s", lsn_to_str(start),
                  len(txns), lsn_to_str(end if end is not None else known_until))
        return end if end is not None else known_until

    def plan(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[Any]:
        """Up to ``numPartitions`` equal WAL slices of the batch, each at least
        :data:`MIN_SLICE_BYTES` (one slice for a small batch), and one partition per
        snapshot chunk."""
        first, planned = from_offset(start), SourceOffset.parse(end)
        last = planned.lsn
        parts = min(self.options.num_partitions, max(1, (last - first) // MIN_SLICE_BYTES))
        skip = dict(planned.skip)
        partitions: list[WalSlice | SnapshotChunk | ExportedRepairRead] = [
            WalSlice(i, lo, hi, skip) for i, (lo, hi) in enumerate(split_range(first, last,
                                                                            parts))]
        plan = planned.snapshot
        if plan is not None and plan.chunks:
            if self._holds(plan):
                partitions += [
                    SnapshotChunk(len(partitions) + i, chunk, self._key(chunk.table), plan.at,
                                  plan.export, plan.taken_us,
                                  plan.generation > 1 and chunk.after is None)
                    for i, chunk in enumerate(plan.chunks)]
            else:
                log.warning("this batch's %d snapshot chunk(s) were planned under snapshot "
                            "%s, which ended with the driver that made it: the next batch "
                            "reads them again from a new snapshot", len(plan.chunks),
                            plan.export)
        taken = planned.repairs
        if taken is not None and self._holds_repair(taken.export):
            # Stamped below the batch's end: above every commit of the batch (before the
            # end), below every later one (at or after it), whatever the batch holds.
            partitions.append(ExportedRepairRead(len(partitions), taken.requests,
                                                 last - 1, taken.export))
        elif taken is not None:
            log.warning("this batch's repair of %s was planned under snapshot %s, which "
                        "ended with the driver that made it: the next batches read it "
                        "again under a new snapshot",
                        ", ".join(sorted({r.table for r in taken.requests})), taken.export)
        return partitions

    def commit(self, end: dict[str, Any]) -> None:
        """Spark has committed every batch up to *end*: release the WAL before it."""
        lsn = from_offset(end)
        faults.crash_point("before_advance", self._commits)
        self._commits += 1
        wal.advance_slot(self._connection(), self.options.slot, lsn)
        log.info("slot %s advanced to %s", self.options.slot, lsn_to_str(lsn))

    def stop(self) -> None:
        try:
            self._close_export()
            self._close_repair()
        finally:
            self._abandon_pending()
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # -- executor side -----------------------------------------------------------------
    def read(self, partition: Any, sink: ChangeSink) -> Iterator[None]:
        """The transactions committing in the partition's slice, or the rows of a
        snapshot chunk, into *sink*."""
        if isinstance(partition, SnapshotChunk):
            return read_chunk(self.options, partition, sink)
        if isinstance(partition, ExportedRepairRead):
            return read_repair(self.options, partition, sink)
        assert isinstance(partition, WalSlice)
        return read_slice(self.options, partition.lo, partition.hi, sink, partition.skip)


def read_chunk(options: ReadOptions, chunk: SnapshotChunk, sink: ChangeSink) -> Iterator[None]:
    """The rows of a snapshot chunk as reads, into *sink*."""
    columns = sink.columns(chunk.chunk.table)
    with wal.connect(options.dsn, purpose="snapshot",
                     server_timeout_s=options.server_timeout_ms / 1000) as conn:
        texts = read_chunk_text(conn, chunk.export, chunk.chunk, columns, chunk.keys)
    sink.snapshot(chunk.chunk.table, texts, chunk.at, chunk.taken_us, chunk.truncate_first,
                  chunk.keys)
    log.debug("%r: %d rows", chunk, texts.num_rows)
    yield


def read_slice(options: ReadOptions, lo: int, hi: int, sink: ChangeSink,
               skip: dict[str, int] | None = None) -> Iterator[None]:
    """Decode the transactions committing in ``[lo, hi)`` into *sink*, yielding after
    each chunk of messages; a table in *skip* loses its changes committing before its
    LSN there."""
    walker = TransactionWalker(lo, hi, SkippingSink(sink, skip) if skip else sink)
    with wal.connect(options.dsn, purpose="reader",
                     server_timeout_s=options.server_timeout_ms / 1000) as conn, \
            wal.slot_copy_at(conn, options.slot, lo) as copy:
        for chunk in wal.peek(conn, copy, options.publication, hi):
            walker.feed(chunk)
            yield
    log.debug("slice %s-%s: %d rows", lsn_to_str(lo), lsn_to_str(hi), walker.rows)
