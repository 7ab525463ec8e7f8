"""The MariaDB connector: checks, snapshot, then the binlog stream.

Use it as the PostgreSQL connector: ``start(offset)``, then ``poll()`` repeatedly,
handing each batch on and saving ``batch.offset`` once the batch is durable downstream;
``stop()`` at the end. Offsets are taken only after whole transactions, so a restart
resumes after the last saved one (at-least-once: the transactions after it may come
again). The server keeps its binlog by time and size, not by reader, so
:meth:`commit` releases nothing; a binlog purged before capture read it is reported
as such, never skipped.

The stream is read by a thread of its own (a binlog dump blocks until the server sends
something), which decodes whole transactions and queues them for :meth:`poll`; the
queue is bounded in transactions and in events, so a slow consumer holds the reader
back instead of growing memory. A transaction larger than
``max_transaction_rows_in_memory`` is queued in chunks, only the last with its offset.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any, Final, NamedTuple, cast

import pymysql.err

from tidemark.errors import SourceError, SourceUnavailableError, TransientError
from tidemark.event import ChangeEvent, Op, Record, TableId
from tidemark.offsets.store import Offset, OffsetReader
from tidemark.retry import retry_transient
from tidemark.serde.debezium_json import DebeziumJsonSerializer
from tidemark.source.batch import SourceBatch
from tidemark.source.capture_stats import CaptureStats
from tidemark.source.mariadb import client
from tidemark.source.mariadb import snapshot as snap
from tidemark.source.mariadb.change_builder import ChangeBuilder
from tidemark.source.mariadb.config import MariaDbSourceConfig, SnapshotMode
from tidemark.source.mariadb.grants import check_grants
from tidemark.source.mariadb.incremental_snapshot import ChunkedSnapshots
from tidemark.source.mariadb.json_lines import LineWriter, MixedLines
from tidemark.source.mariadb.position import BinlogPosition
from tidemark.source.mariadb.replica_id import ReplicaIdClaim
from tidemark.source.mariadb.transaction_records import Made
from tidemark.source.signals import SignalError, parse_signal
from tidemark.source.snapshot_progress import OFFSET_KEY

log = logging.getLogger(__name__)

_QUEUE_TRANSACTIONS: Final = 256
_QUEUE_BATCHES: Final = 4
_POLL_WAIT_S: Final = 0.5
_MAX_BACKOFF_S: Final = 30.0
_END: Final = object()  # the stream ended (a bounded capture reached the log's end)


class _Queued(NamedTuple):
    """What the reader thread hands to :meth:`MariaDbReader.poll`: a whole
    transaction's records (or a snapshot chunk's reads), the position after them, and
    the incremental snapshot's state there; or a chunk of a large transaction, with
    position None unless it is the last."""

    records: Made  # JSON lines only, from a reader asked for them
    position: BinlogPosition | None
    commit_us: int | None
    snapshot: dict[str, Any] | None
    reads: bool = False


class MariaDbReader:
    """Captures changes of the tables a :class:`MariaDbSourceConfig` selects."""

    def __init__(self, config: MariaDbSourceConfig,
                 json_lines: DebeziumJsonSerializer | None = None) -> None:
        self.config = config
        # Streamed changes as this serializer's JSON lines (SourceBatch.lines), written
        # from the rows events (json_lines.py); snapshot rows still come as records.
        self._json_lines = json_lines
        self.stats = CaptureStats()
        self._settings = config.connection
        self._batches: Iterator[SourceBatch] | None = None
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=_QUEUE_TRANSACTIONS)
        # Events queued: at most a few batches' worth (or one item, whatever its size).
        self._queue_events_limit = _QUEUE_BATCHES * config.max_batch_events
        self._queued_events = 0
        self._room = threading.Condition()
        self._reader: threading.Thread | None = None
        self._stream: client.BinlogStream | None = None
        self._stopping = threading.Event()
        self._captured = config.table_filter()
        self._signal_table = TableId.parse(config.signal_table) \
            if config.signal_table is not None else None
        self._snapshots = self._chunked_snapshots(None)
        self._replica_id = ReplicaIdClaim(self._settings, config.replica_server_id)
        self._end_key = 0  # a bounded capture's end: the binlog's end at its start

    @property
    def partition(self) -> str:
        """The offset key of this capture: one per server and topic prefix."""
        s = self._settings
        return f"mariadb/{s.host}:{s.port}/{self.config.topic_prefix}"

    # -- lifecycle -------------------------------------------------------------------
    def start(self, offset: Offset | None = None, *, store: OffsetReader | None = None,
              stop_at_end: bool = False) -> None:
        """Check the server, decide about the snapshot, and get ready to poll.

        The resume position is *offset*, or what *store* holds under :attr:`partition`.
        *stop_at_end*: finish once everything in the binlog now is handed on, and the
        incremental snapshots signalled in it (unless paused).
        """
        try:
            self._start(offset if offset is not None else
                        (store.load(self.partition) if store is not None else None),
                        stop_at_end)
        except BaseException:
            self.stop()
            raise

    def _start(self, offset: Offset | None, stop_at_end: bool) -> None:
        cfg = self.config
        conn = client.connect(self._settings)
        with contextlib.closing(conn):
            client.check_server(conn)
            # Before the snapshot: a user the binlog dump refuses is told now, not
            # after every row went out.
            dumps = cfg.snapshot_mode != SnapshotMode.INITIAL_ONLY  # reads the binlog
            check_grants(conn, self._settings, dump=dumps)
            if dumps:
                # Held until stop(): a second capture with this replica id would end
                # this one's dump (and this one its), so it is refused at its start.
                self._replica_id.claim()
            current = client.current_position(conn)
            self._end_key = current.key
            kept = client.binlog_files(conn) \
                if cfg.snapshot_mode == SnapshotMode.WHEN_NEEDED else []
        position = BinlogPosition.from_offset(offset["binlog"]) \
            if offset is not None and "binlog" in offset else None
        if position is not None and cfg.snapshot_mode == SnapshotMode.INITIAL_ONLY:
            log.info("the initial-only snapshot was taken before (offset at %s): nothing "
                     "to do", position)
            self._batches = iter([SourceBatch([], None, finished=True)])
        elif position is not None and cfg.snapshot_mode == SnapshotMode.WHEN_NEEDED \
                and position.file not in kept:
            log.warning("the binlog capture stopped in (%s) was purged from the server: "
                        "taking a new snapshot (snapshot_mode=when_needed)", position)
            self._batches = self._snapshot_then_stream(stop_at_end, False)
        elif position is not None:
            log.info("resuming MariaDB capture at %s", position)
            assert offset is not None
            state = offset.get(OFFSET_KEY)
            self._snapshots = self._chunked_snapshots(state if isinstance(state, dict)
                                                      else None)
            if self._snapshots.active:
                log.info("continuing the incremental snapshot of %s",
                         ", ".join(str(t.table) for t in self._snapshots.queue))
            self._batches = self._stream_from(position, stop_at_end)
        elif cfg.snapshot_mode in (SnapshotMode.INITIAL, SnapshotMode.INITIAL_ONLY,
                                   SnapshotMode.WHEN_NEEDED):
            self._batches = self._snapshot_then_stream(
                stop_at_end, cfg.snapshot_mode == SnapshotMode.INITIAL_ONLY)
        else:
            log.info("starting MariaDB capture at the binlog's end, %s", current)
            self._batches = self._stream_from(current, stop_at_end)

    def _chunked_snapshots(self, state: dict[str, Any] | None) -> ChunkedSnapshots:
        return ChunkedSnapshots(
            connect=lambda: client.connect(self._settings, conv=client.RAW_VALUES),
            captured=self._captured, chunk_size=self.config.incremental_snapshot_chunk_size,
            name=self.config.topic_prefix, state=state,
            adaptive_chunks=self.config.incremental_snapshot_chunk_adaptive)

    def poll(self) -> SourceBatch:
        """The next batch (possibly empty when the server is idle; returns within about
        half a second)."""
        if self._batches is None:
            raise SourceError("poll() before start()")
        self._replica_id.keep()
        try:
            return next(self._batches)
        except StopIteration:
            return SourceBatch([], None, finished=True)

    def commit(self, offset: Offset) -> None:
        """Nothing to release: the server keeps its binlog by time and size."""
        self.stats.position_lsn = int(offset.get("binlog", {}).get("pos", 0) or 0)

    def stop(self) -> None:
        """Stop the reader thread and close the stream (and a snapshot's connection)."""
        self._stopping.set()
        batches, self._batches = self._batches, None
        if batches is not None and hasattr(batches, "close"):
            with contextlib.suppress(Exception):  # running in another thread: it ends
                batches.close()
        stream = self._stream
        if stream is not None:
            stream.close()  # ends a read blocked in the reader thread
        reader, self._reader = self._reader, None
        if reader is not None:
            with contextlib.suppress(queue.Empty):
                while True:  # unblock a reader waiting for queue space
                    self._queue.get_nowait()
            reader.join(timeout=10)
        self._snapshots.close()
        self._replica_id.release()
        self.stats.connected = False

    # -- snapshot ----------------------------------------------------------------------
    def _snapshot_then_stream(self, stop_at_end: bool, only: bool) -> Iterator[SourceBatch]:
        cfg = self.config
        conn = client.connect(self._settings, conv=client.RAW_VALUES)
        self.stats.snapshot_running = True
        try:
            position = snap.begin_snapshot(conn)
            tables = snap.captured_tables(conn, self._captured)
            log.info("snapshot of %d table(s) at %s", len(tables), position)
            for events in snap.snapshot_events(
                    conn, tables, position=position, name=cfg.topic_prefix,
                    fetch_size=cfg.snapshot_fetch_size):
                self.stats.count_rows(events)
                yield SourceBatch(list(events), None)
            conn.commit()
        except pymysql.err.OperationalError as err:
            # A lost connection: worth retrying (the task reopens and snapshots again).
            raise SourceUnavailableError(f"the snapshot's connection to "
                                         f"{self._settings.host}:{self._settings.port} "
                                         f"failed: {err.args[-1]}") from None
        finally:
            conn.close()
        self.stats.snapshot_running = False
        self.stats.snapshot_completed = True
        if only:
            yield SourceBatch([], {"binlog": position.to_offset()}, finished=True)
        else:  # the stream's first batch holds the snapshot's position as offset
            yield from self._stream_from(position, stop_at_end)

    # -- streaming ---------------------------------------------------------------------
    def _stream_from(self, position: BinlogPosition, stop_at_end: bool
                     ) -> Iterator[SourceBatch]:
        self._reader = threading.Thread(target=self._read, args=(position, stop_at_end),
                                        name="tidemark-binlog-reader", daemon=True)
        self._reader.start()
        # Where the stream starts is already a position to resume from: a capture that
        # starts at the log's end (no snapshot) and is restarted before any change must
        # not take a snapshot, nor miss what was written in between.
        yield SourceBatch([], self._offset(position, self._snapshots.state()))
        limit = self.config.max_batch_events
        held: _Queued | None = None  # a part of a transaction that starts the next batch
        while True:
            if held is not None:
                item, held = held, None
            else:
                try:
                    item = self._queue.get(timeout=_POLL_WAIT_S)
                except queue.Empty:
                    yield SourceBatch([], None)
                    continue
            records: Made = []
            offset: Offset | None = None
            while True:
                if (offset is not None and isinstance(item, _Queued)
                        and item.position is None and item.records):
                    # The batch's offset is the position after its last record: a part
                    # of a transaction after whole ones starts the next batch, so that a
                    # consumer that stops inside it keeps the offset of those before.
                    held = item
                    break
                if item is _END:
                    yield self._batch(records, offset, finished=True)
                    return
                if isinstance(item, BaseException):
                    if records:
                        yield self._batch(records, offset)
                    raise item
                queued: _Queued = item
                self._taken(len(queued.records))
                records += queued.records
                if queued.reads:
                    self.stats.count_rows([r for r in queued.records
                                           if isinstance(r, ChangeEvent)])
                elif queued.records:
                    self.stats.saw_events(len(queued.records), queued.commit_us)
                    if queued.position is not None:
                        self.stats.transactions_committed += 1
                if queued.position is not None:  # not a resume point inside a transaction
                    offset = self._offset(queued.position, queued.snapshot)
                if len(records) >= limit:
                    break
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
            yield self._batch(records, offset)

    def _batch(self, made: Made, offset: Offset | None, finished: bool = False) -> SourceBatch:
        if self._json_lines is None:
            return SourceBatch(cast("list[Record]", made), offset, finished)
        return SourceBatch([], offset, finished, cast("list[str]", made))

    @staticmethod
    def _offset(position: BinlogPosition, snapshot: dict[str, Any] | None) -> Offset:
        offset: Offset = {"binlog": position.to_offset()}
        if snapshot is not None:
            offset[OFFSET_KEY] = snapshot
        return offset

    def _read(self, position: BinlogPosition, stop_at_end: bool) -> None:
        """The reader thread: dump, decode, queue whole transactions; reconnect on
        transient failures from where the last whole transaction ended."""
        cfg = self.config
        resume = [position]

        reached = [position]

        def log_retry(err: TransientError, attempt: int, delay: float) -> None:
            if resume[0] != reached[0]:
                # The dump got somewhere before it broke (a server restart a day): this
                # outage starts a new count of attempts, and reconnects at once.
                reached[0] = resume[0]
                log.warning("binlog stream failed (%s); reconnecting", err)
                raise _Progressed
            log.warning("binlog stream failed (%s); reconnecting in %.1f s (attempt %d)",
                        err, delay, attempt)

        def sleep(delay: float) -> None:
            if self._stopping.wait(delay):
                raise _Stopped

        try:
            while True:
                try:
                    retry_transient(lambda: self._dump(resume, stop_at_end),
                                    max_retries=cfg.reconnect_max_attempts,
                                    initial_delay_s=cfg.reconnect_backoff_ms / 1000,
                                    max_delay_s=_MAX_BACKOFF_S, on_retry=log_retry,
                                    sleep=sleep)
                    break
                except _Progressed:
                    continue
            self._put(_END)
        except _Stopped:
            return
        except BaseException as err:  # handed to poll(), which raises it
            if not self._stopping.is_set():
                self._put(err)

    def _dump(self, resume: list[BinlogPosition], stop_at_end: bool) -> None:
        """One dump from ``resume[0]``, which it moves past every queued transaction:
        a reconnect starts after the last whole one and decodes a partial one again."""
        signals = self._signal_table
        snapshots = self._snapshots
        cfg = self.config
        builder = ChangeBuilder(
            name=cfg.topic_prefix, position=resume[0],
            captured=self._captured if signals is None
            else lambda t: t == signals or self._captured(t),
            transaction_metadata=cfg.provide_transaction_metadata,
            max_rows_in_memory=cfg.max_transaction_rows_in_memory,
            skipped_operations=cfg.skipped, signal_table=signals,
            lines=None if self._json_lines is None else LineWriter(self._json_lines))
        out = self._out_of(builder)
        stream = client.BinlogStream(
            self._settings, resume[0], server_id=self.config.replica_server_id,
            blocking=True, heartbeat_s=self.config.heartbeat_interval_ms / 1000 or 5)
        self._stream = stream
        try:
            stream.open()
            builder.checksum = stream.checksum
            self.stats.connected = True
            handle = builder.handle
            for event in stream.events():
                records = handle(event)
                if records is not None:
                    if builder.has_rest:
                        # Too large to hold: its chunks go out as they are made. A
                        # restart before its last one starts it over (at-least-once).
                        for chunk in builder.rest(cfg.max_batch_events):
                            self._put(_Queued(out(records), None, builder.commit_us, None))
                            records = chunk
                    position = resume[0] = builder.position
                    self._put(_Queued(out(records), position, builder.commit_us,
                                      snapshots.state()))
                if snapshots.queue and not builder.in_transaction:
                    # Between transactions: a chunk whose read view the stream has
                    # reached goes out here, before any later transaction.
                    self._hand_on_chunks(builder)
                if stop_at_end and not builder.in_transaction \
                        and builder.position_key >= self._end_key \
                        and (not snapshots.active or snapshots.paused):
                    # Between transactions, whether or not the stream is idle (a steady
                    # writer never leaves it so). Snapshots signalled before the end are
                    # part of what it waits for; a paused one is not (nothing would
                    # resume it), its state is in the offset.
                    return
                if self._stopping.is_set():
                    raise _Stopped
        except _Stopped:
            raise
        except Exception:
            if self._stopping.is_set():
                raise _Stopped from None
            raise
        finally:
            self.stats.connected = False
            stream.close()
            builder.close()

    def _hand_on_chunks(self, builder: ChangeBuilder) -> None:
        snapshots = self._snapshots
        while (chunk := snapshots.due(builder.position_key)) is not None:
            position = builder.position
            reads = snapshots.emit(chunk, position)
            made: Made = list(reads)
            if self._json_lines is not None:
                self.stats.count_rows(reads)  # here: poll() finds no event among lines
                made = self._texts(made)
            self._put(_Queued(made, position, None, snapshots.state(), reads=True))
            if self._stopping.is_set():
                raise _Stopped
        self.stats.snapshot_running = snapshots.active and not snapshots.paused

    def _out_of(self, builder: ChangeBuilder) -> Callable[[Made], Made]:
        """What a transaction of *builder* becomes on the queue: without the signal
        table's rows (signals); as JSON lines only, if the reader writes lines."""
        table = self._signal_table
        if builder.lines is None:
            return lambda made: self._signals_out(made, table)

        def out(made: Made) -> Made:
            if made.__class__ is not MixedLines:  # lines only: nothing to look at
                return made
            return self._texts(self._signals_out(made, table))
        return out

    def _texts(self, made: Made) -> Made:
        """*made* as JSON lines: its records written by the serializer, in place."""
        serializer = self._json_lines
        assert serializer is not None
        texts: Made = []
        records: list[Record] = []
        for item in made:
            if isinstance(item, str):
                if records:
                    texts += serializer.text_lines(records)
                    records = []
                texts.append(item)
            else:
                records.append(item)
        if records:
            texts += serializer.text_lines(records)
        return texts

    def _signals_out(self, records: Made, table: TableId | None) -> Made:
        """*records* without the signal table's (if there is one), whose inserts are
        signals."""
        if table is None:
            return records
        kept: Made = []
        for record in records:
            if not isinstance(record, ChangeEvent) or record.table != table:
                kept.append(record)
                continue
            row = record.after
            if record.op is not Op.CREATE or row is None:
                continue
            try:
                signal = parse_signal(str(row.get("id")), str(row.get("type")),
                                      row.get("data"))
            except SignalError as err:
                log.warning("signal skipped: %s", err)
                continue
            self._snapshots.on_signal(signal)
        return kept

    def _put(self, item: object) -> None:
        events = len(item.records) if isinstance(item, _Queued) else 0
        with self._room:
            while self._queued_events and \
                    self._queued_events + events > self._queue_events_limit:
                if self._stopping.is_set():
                    raise _Stopped
                self._room.wait(0.5)
            self._queued_events += events
        while not self._stopping.is_set():
            try:
                self._queue.put(item, timeout=0.5)
                return
            except queue.Full:
                continue
        raise _Stopped


    def _taken(self, events: int) -> None:
        """*events* left the queue: room for the reader."""
        if events:
            with self._room:
                self._queued_events -= events
                self._room.notify()


class _Progressed(Exception):  # noqa: N818 - restarts the retry count, not an error
    pass


class _Stopped(Exception):  # noqa: N818 - a signal inside the reader thread, not an error
    pass
