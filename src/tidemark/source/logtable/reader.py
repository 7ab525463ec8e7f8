"""The log-table reader: one task's stream groups, polled in turn, one offset per group.

A task reads the groups the connector gave it (:func:`~.layout.assign_groups`), each
from its own position. A poll reads the next group that has changes, up to
``max_batch_events`` of them, and hands them on with the positions of all the task's
groups (the batch's offset: ``{"groups": {"3": position, …}}``).
:meth:`LogTableReader.offsets_by_key` splits that into one stored offset per group —
only the groups that moved since the last save — so thousands of groups cost one
small write per save.

Events are Debezium envelopes: an insert ``c`` and an update ``u`` carry ``after``, a
delete ``d`` carries ``before`` with the key; non-key columns that a change did not set
are :data:`~tidemark.event.UNAVAILABLE` (written as Scylla's ``null`` cell, or kept
from the target by ``apply_changes``). ``source`` adds the log's fields: ``stream_id``,
``generation``, ``time``, ``batch_seq_no`` (and ``txId`` on PostgreSQL).
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

from tidemark.errors import ConfigError, SourceError, SourceUnavailableError
from tidemark.event import ChangeEvent, Op, SourceContext
from tidemark.offsets.store import Offset, OffsetReader, load_offsets
from tidemark.source.batch import SourceBatch
from tidemark.source.capture_stats import CaptureStats
from tidemark.source.logtable.config import LogTableSourceConfig, is_sqlite
from tidemark.source.logtable.database import LogDatabase, LogRow, LogTable, Position
from tidemark.source.logtable.layout import Operation
from tidemark.source.logtable.source_block import LOGTABLE_BLOCK, LogTableSourceFields

log = logging.getLogger(__name__)

#: ``cdc$operation`` codes to Debezium's (plain ints: no enum call per row).
_OPS: dict[int, Op] = {int(Operation.INSERT): Op.CREATE, int(Operation.UPDATE): Op.UPDATE,
                       int(Operation.ROW_DELETE): Op.DELETE}

#: Longest wait between reconnect attempts.
_MAX_BACKOFF_S = 30.0


def open_database(dsn: str, *, server_timeout_s: float | None = None) -> LogDatabase:
    """The log-table access of the database *dsn* names; on PostgreSQL, with
    *server_timeout_s*, no wait for the server lasts longer (the query then raises
    SourceUnavailableError)."""
    if is_sqlite(dsn):
        from tidemark.source.logtable.sqlite import SqliteLogDatabase  # noqa: PLC0415

        return SqliteLogDatabase(dsn)
    from tidemark.source.logtable.postgres import PostgresLogDatabase  # noqa: PLC0415

    return PostgresLogDatabase(dsn, server_timeout_s=server_timeout_s)


class LogTableReader:
    """Reads one task's groups (the engine's task, :class:`LogTableTask`, drives it)."""

    def __init__(self, config: LogTableSourceConfig) -> None:
        self.config = config
        self._db: LogDatabase | None = None
        self._tables: list[LogTable] = []
        self._groups: list[int] = []
        self._positions: dict[int, Position] = {}
        self._saved: dict[int, Position] = {}
        self._next = 0
        self._caught_up: set[int] = set()
        self._stop_at_end = False
        self._last_prune = time.monotonic()
        self._idle_until = 0.0  # every group was idle: no query before this moment
        self._broken = False  # the database became unreachable: reconnect before reading
        self._attempts = 0  # reconnect attempts since the last successful poll
        self._retry_at = 0.0
        self.stats = CaptureStats()
        #: ``cdc$operation`` codes of the skipped operations (skipped.operations).
        self._skipped_codes = frozenset(code for code, op in _OPS.items()
                                        if op in config.skipped)

    @property
    def partition(self) -> str:
        """The offset key prefix of this task's groups."""
        return f"{self.config.topic_prefix}/logtable"

    @property
    def groups(self) -> list[int]:
        return list(self._groups)

    def start(self, offset: Offset | None = None, *, store: OffsetReader | None = None,
              stop_at_end: bool = False) -> None:
        """Open the database and position every group: at *offset* (a batch's offset,
        after a reconnect) or its stored offset in *store*, else at the log's start."""
        self._stop_at_end = stop_at_end
        db = self._db = self._open()
        generations = db.generations()
        total = generations[0].groups
        groups = list(self.config.groups) or list(range(total))
        beyond = [g for g in groups if g >= total]
        if beyond:
            raise ConfigError("groups", f"groups {beyond} do not exist: the log has {total} "
                              f"groups (0 to {total - 1})")
        self._groups = groups
        self._tables = db.tables(list(self.config.table_include_list))
        given = (offset or {}).get("groups", {})
        stored = load_offsets(store, [self.config.offset_key(g) for g in groups
                                      if str(g) not in given]) if store is not None else {}
        saved = {}
        for group in groups:
            position = given.get(str(group)) or stored.get(self.config.offset_key(group))
            if position:
                saved[group] = dict(position)
        db.check_positions(saved.values())
        for group in groups:
            self._positions[group] = saved.get(group) or db.start_position()
        self._saved = {g: p for g, p in self._positions.items()}
        self.stats.connected = True
        log.info("reading %d log table(s) of %s, groups %s", len(self._tables),
                 self.config.redacted_dsn(), _ranges(groups))

    def poll(self) -> SourceBatch:
        """The next group's changes; empty when every group is idle, and then, until
        ``poll_interval_ms`` has passed, empty at once without querying: the poll never
        waits, so the engine saves offsets on time (a crash redelivers no more) and
        stops promptly.

        When the database becomes unreachable (a server restart) the poll returns
        empty and reconnects after ``reconnect_backoff_ms`` (doubling), up to
        ``reconnect_max_attempts`` times, then reads on from the positions handed on:
        nothing is lost or read twice. After the last attempt it raises the error."""
        if self._broken:
            if time.monotonic() < self._retry_at:
                return SourceBatch([], None)
            try:
                self._reconnect()
            except SourceUnavailableError as err:
                self._unreachable(err)
                return SourceBatch([], None)
        # A poll that fails after its read (the prune's queries) hands on nothing: the
        # groups go back to where the last batch left them, so the rows it read come
        # again after the reconnect.
        positions, caught_up, following = dict(self._positions), set(self._caught_up), self._next
        try:
            batch = self._poll()
        except SourceUnavailableError as err:
            self._positions, self._caught_up, self._next = positions, caught_up, following
            self._unreachable(err)
            return SourceBatch([], None)
        self._attempts = 0
        return batch

    def _unreachable(self, err: SourceUnavailableError) -> None:
        """Let the connection go and plan the next attempt, or raise *err* once the
        attempts are spent."""
        if self._db is not None:
            with contextlib.suppress(Exception):
                self._db.close()
            self._db = None
        self._broken = True
        self.stats.connected = False
        self._attempts += 1
        limit = self.config.reconnect_max_attempts
        if self._attempts > limit:
            if limit:
                raise SourceUnavailableError(f"{err} (gave up after {limit} reconnect "
                                             "attempts, reconnect_max_attempts)") from None
            raise err
        delay = min(self.config.reconnect_backoff_ms / 1000 * 2 ** (self._attempts - 1),
                    _MAX_BACKOFF_S)
        self._retry_at = time.monotonic() + delay
        log.warning("%s; reconnecting in %.1f s (attempt %d/%d)", err, delay,
                    self._attempts, limit)

    def _reconnect(self) -> None:
        """Open the database again; the groups read on from their positions."""
        db = self._open()
        try:
            tables = db.tables(list(self.config.table_include_list))
        except BaseException:
            with contextlib.suppress(Exception):
                db.close()
            raise
        self._db, self._tables, self._broken = db, tables, False
        self.stats.connected = True
        log.info("reconnected to %s", self.config.redacted_dsn())

    def _open(self) -> LogDatabase:
        return open_database(self.config.dsn,
                             server_timeout_s=self.config.server_timeout_ms / 1000)

    def _poll(self) -> SourceBatch:
        db = self._require()
        if time.monotonic() < self._idle_until:
            self._maybe_prune()
            return SourceBatch([], None)
        moved = False
        for _ in range(len(self._groups)):
            group = self._groups[self._next]
            self._next = (self._next + 1) % len(self._groups)
            position = self._positions[group]
            result = db.read(group, position, self._tables, self.config.max_batch_events)
            if result.position != position:
                self._positions[group] = result.position
                moved = True
            if result.caught_up:
                self._caught_up.add(group)
            if result.rows:
                self._maybe_prune()
                events = self._events(result.rows)
                self.stats.saw_events(len(events), result.rows[-1].ts_us)
                self.stats.position_lsn = result.rows[-1].time
                # Checked here too, not only on a pass that found every group empty: a
                # steady writer may never leave one (a group caught up since the start
                # has read everything committed before it).
                return SourceBatch(events, self._offset(), self._finished())
        finished = self._finished()
        if not finished:
            self._maybe_prune()
            if not moved:
                # Every group is idle: look again after the interval, rather than query
                # the database in a loop.
                self._idle_until = time.monotonic() + self.config.poll_interval_ms / 1000
        return SourceBatch([], self._offset() if moved or finished else None, finished)

    def _finished(self) -> bool:
        """A bounded capture's end: every group caught up once since the start."""
        return self._stop_at_end and len(self._caught_up) == len(self._groups)

    def _offset(self) -> Offset:
        return {"groups": {str(g): p for g, p in self._positions.items()}}

    def offsets_by_key(self, offset: Offset) -> dict[str, Offset]:
        """*offset* (a batch's) as one stored offset per group, only the groups whose
        position differs from the last call's."""
        out: dict[str, Offset] = {}
        for key, position in offset.get("groups", {}).items():
            group = int(key)
            if self._saved.get(group) != position:
                out[self.config.offset_key(group)] = position
        return out

    def saved(self, offset: Offset) -> None:
        """*offset*'s positions are stored: later :meth:`offsets_by_key` calls skip them."""
        for key, position in offset.get("groups", {}).items():
            self._saved[int(key)] = position

    def commit(self, offset: Offset) -> None:
        """Everything up to *offset* is stored and processed: prune may delete it."""
        self.saved(offset)

    def _maybe_prune(self) -> None:
        """Every ``prune_interval_s``: check that the tables still match their logs (an
        ALTER without ``tidemark logtable install`` stops the capture here, where no
        event trigger guards them), record the saved positions in the database's reader
        registry, then delete what every registered reader has passed and retention
        allows."""
        config = self.config
        now = time.monotonic()
        if now - self._last_prune < config.prune_interval_s:
            return
        self._last_prune = now
        db = self._require()
        db.check_unchanged(self._tables)
        if not config.register:
            return
        db.register(config.reader, self._saved)
        if config.retention_s < 0:
            return
        deleted = db.prune(self._groups, self._tables, config.retention_s)
        if deleted:
            log.info("deleted %d log rows read by every registered reader and older than "
                     "%.0f s", deleted, config.retention_s)

    def _events(self, rows: list[LogRow]) -> list[Any]:
        skipped = self._skipped_codes
        if skipped:
            # Dropped here, after the read: the group's position has moved past them.
            rows = [row for row in rows if row.operation not in skipped]
        return events_of(self._require(), self._tables, rows, self.config.topic_prefix)

    def _require(self) -> LogDatabase:
        if self._db is None:
            raise ConfigError("poll", "start() the reader first")
        return self._db

    def stop(self) -> None:
        self._broken = False
        if self._db is not None:
            self._db.close()
            self._db = None
        self.stats.connected = False


def events_of(db: LogDatabase, tables: list[LogTable], rows: list[LogRow], name: str, *,
              commit_key: int | None = None) -> list[ChangeEvent]:
    """*rows* as change events. Their position (``lsn``) is the row's ``cdc$time``;
    their commit position is *commit_key* when given (the Spark source's batch key),
    else the time too."""
    connector, database = db.connector, db.database
    now_us = time.time_ns() // 1000
    events: list[ChangeEvent] = []
    for row in rows:
        schema = tables[row.table].schema
        op = _OPS.get(row.operation)
        if op is None:
            raise SourceError(f"log table of {schema.table} holds cdc$operation "
                              f"{row.operation} at time {row.time}; tidemark writes 1, 2 or "
                              "3 (was the log written by something else?)")
        fields = LogTableSourceFields(row.stream, row.generation, row.time, row.batch_seq,
                                      row.txid)
        context = SourceContext(connector, name, database, row.ts_us, row.txid, None,
                                commit_lsn=row.time if commit_key is None else commit_key,
                                source_fields=fields, block=LOGTABLE_BLOCK)
        if op is Op.DELETE:
            events.append(ChangeEvent(op, schema, row.values, None, context, row.time, 0, 0,
                                      now_us))
        else:
            events.append(ChangeEvent(op, schema, None, row.values, context, row.time, 0, 0,
                                      now_us))
    return events


def _ranges(groups: list[int]) -> str:
    if not groups:
        return "none"
    if groups == list(range(groups[0], groups[-1] + 1)):
        return f"{groups[0]}-{groups[-1]}" if len(groups) > 1 else str(groups[0])
    return ",".join(map(str, groups))
