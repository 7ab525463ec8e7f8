"""The PostgreSQL connector: prerequisites, slot, snapshot, then the change stream.

Use it as ``start(offset)``, then ``poll()`` repeatedly, handing each batch on and
calling ``commit(batch.offset)`` once the batch is durable downstream; ``stop()`` at
the end. The slot is confirmed only up to committed offsets, so a crash anywhere
loses nothing: the next start resumes from the last committed offset (at-least-once;
the transactions after it may be delivered again).
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg

from tidemark import faults
from tidemark import postgres_connection as pgconn
from tidemark.errors import SourceError, SourceUnavailableError, TransientError
from tidemark.event import Record, TableId
from tidemark.offsets.store import Offset, OffsetReader
from tidemark.retry import retry_transient
from tidemark.serde.debezium_json import DebeziumJsonSerializer
from tidemark.source.batch import SourceBatch
from tidemark.source.capture_stats import CaptureStats
from tidemark.source.postgres import catalog, slot, slot_holder
from tidemark.source.postgres import offset as pg_offset
from tidemark.source.postgres.change_builder import ChangeEventBuilder
from tidemark.source.postgres.config import PostgresSourceConfig, SlotLostAction, SnapshotMode
from tidemark.source.postgres.json_lines import JsonLineBuilder, RenderedEventBuilder
from tidemark.source.postgres.partial_transaction import (
    COMMIT_LSN_KEY,
    MESSAGES_KEY,
    Skipper,
    open_transaction_messages,
    partial_of,
)
from tidemark.source.postgres.pgoutput import lsn_to_str
from tidemark.source.postgres.slot import SlotLostError
from tidemark.source.postgres.snapshot import begin_snapshot, snapshot_events
from tidemark.source.snapshot_progress import OFFSET_KEY as SNAPSHOT_OFFSET_KEY

if TYPE_CHECKING:
    from tidemark.source.postgres.incremental_snapshot import IncrementalSnapshot
    from tidemark.source.postgres.replication import ReplicationStream

log = logging.getLogger(__name__)
_T = TypeVar("_T")

# start() loads the replication module in the background while the prerequisite checks
# wait on the network. (psycopg itself is loaded by then: the first connect needs it.)
_REPLICATION_MODULE = "tidemark.source.postgres.replication"

_MAX_BACKOFF_S = 30.0
_FIRST_BATCH_MESSAGES = 128
#: While an incremental snapshot's marks stream in, batches with nothing to hand on are
#: not handed to the engine; one goes at least this often all the same (the engine
#: checks for a stop and saves offsets between batches).
_BUSY_SNAPSHOT_YIELD_S = 0.2


class PostgresReader:
    """Captures changes of one PostgreSQL database.

    With *json_lines* (a serializer without transaction metadata), streamed changes are
    delivered as that serializer's JSON lines (:attr:`SourceBatch.lines`), made straight
    from the pgoutput bytes, which is about twice as fast as making change events and
    serializing them; snapshot rows still come as records. With *rendered_json* (the
    same kind of serializer) streamed changes stay records, but the row changes carry
    that serializer's texts (:class:`~tidemark.serde.rendered.RenderedEvent`), made the
    same way; with *converted_records* too, inserts and updates come as the engine's
    converted records (:class:`~tidemark.serde.converted.RenderedRecord`).
    """

    def __init__(self, config: PostgresSourceConfig, *,
                 json_lines: DebeziumJsonSerializer | None = None,
                 rendered_json: DebeziumJsonSerializer | None = None,
                 converted_records: bool = False,
                 previous_backends: Mapping[int, str] | None = None) -> None:
        if json_lines is not None and rendered_json is not None:
            raise ValueError("json_lines and rendered_json exclude each other")
        self.config = config
        self._json_lines = json_lines
        self._rendered_json = rendered_json
        self._converted_records = converted_records
        self.tables: list[TableId] = []
        self.database = ""
        self._catalog_conn: Any = None
        self._stream: ReplicationStream | None = None
        self._batches: Iterator[SourceBatch] | None = None
        self._stop_at: int | None = None
        self._keys: dict[TableId, tuple[str, ...]] = {}
        self._generated = False  # the publication sends stored generated columns (18+)
        self._type_infos: dict[int, tuple[str, int]] = {}
        self._stopped = False
        #: What this capture has done so far (read by metrics and status).
        self.stats = CaptureStats()
        #: The last offset committed (at start: the offset resumed from).
        self._committed: Offset | None = None
        self._snapshots: IncrementalSnapshot | None = None
        #: An offset handed on that must be saved before the connector goes on.
        self._awaited: Offset | None = None
        #: The walsenders of this reader's replication connections, and of the reader
        #: it replaces (*previous_backends*, after a reconnect): after a network cut
        #: the server keeps one active on the slot until wal_sender_timeout.
        self._own_backends: dict[int, str] = dict(previous_backends or {})
        self._reconnect = bool(self._own_backends)

    @property
    def partition(self) -> str:
        """The offset key of this capture: one per database and slot (after start())."""
        if not self.database:
            raise SourceError("the offset key is known only after start()")
        return f"postgres/{self.database}/{self.config.slot_name}"

    @property
    def backend_pids(self) -> dict[int, str]:
        """The server backends this reader (and the one it replaces) streamed on: pass
        them to the reader that replaces this one (``previous_backends``)."""
        return dict(self._own_backends)

    @property
    def incremental_snapshot(self) -> IncrementalSnapshot | None:
        """The incremental snapshots of the running stream (None before the stream has
        started, or without a signal table and nothing left to snapshot)."""
        return self._snapshots

    # -- lifecycle -------------------------------------------------------------------
    def start(self, offset: Offset | None = None, *, store: OffsetReader | None = None,
              stop_at_lsn: int | None = None) -> None:
        """Check prerequisites, prepare publication and slot, decide about the snapshot.

        The resume position is *offset*, or what *store* holds under :attr:`partition`
        (known once connected: it names the database actually connected to).
        *stop_at_lsn*: finish once everything committed before this LSN is delivered.
        """
        threading.Thread(target=importlib.import_module, args=(_REPLICATION_MODULE,),
                         name="tidemark-preload", daemon=True).start()
        try:
            self._start(offset, store, stop_at_lsn)
        except BaseException:
            self.stop()
            raise

    def _start(self, offset: Offset | None, store: OffsetReader | None,
               stop_at_lsn: int | None) -> None:
        cfg = self.config
        conn = self._catalog_conn = pgconn.connect(cfg.dsn)
        catalog.check_wal_level(conn)
        catalog.check_replication_privilege(conn)
        # Before anything is created; create_slot decides the same way later.
        slot.makes_failover_slot(conn.info.server_version, cfg.slot_failover, "slot_failover",
                                 standby=pgconn.on_standby(conn))
        self.database = catalog.current_database(conn)
        where = "the offset given to start()"
        if offset is None and store is not None:
            offset = store.load(self.partition)
            where = f"key {self.partition!r} in {store}"
        if offset is not None:
            # Before the publication and slot are touched, so that a bad offset leaves
            # nothing behind and nothing is ever confirmed past what was delivered.
            pg_offset.check_shape(offset, where)
            pg_offset.check_not_ahead(conn, offset, where)
            self._committed = offset
        self.tables = catalog.resolve_tables(conn, cfg.table_include_list, cfg.table_exclude_list)
        if cfg.snapshot_mode != SnapshotMode.INITIAL_ONLY:  # the one mode that publishes nothing
            self.tables = catalog.publishable_tables(conn, self.tables, cfg.table_include_list)
        if not self.tables:
            raise SourceError("no tables to capture: table_include_list matched nothing "
                              "after table_exclude_list and the tables PostgreSQL cannot "
                              "publish (see the warnings)")
        catalog.check_read_privileges(conn, self.tables)
        self._keys = catalog.primary_keys(conn, self.tables)
        catalog.warn_about_keyless(conn, self.tables, self._keys)
        catalog.warn_about_identity_index(conn, self.tables, self._keys)
        self._stop_at = stop_at_lsn
        if cfg.snapshot_mode == SnapshotMode.INITIAL_ONLY:
            catalog.warn_about_unstreamed(conn, self.tables)
            if offset and offset.get("snapshot_completed"):
                self._batches = iter([SourceBatch([], offset, finished=True)])
            else:
                self._batches = self._snapshot_only()
            return
        # The signal table is published (its Inserts are the signals) but not captured.
        signals = [TableId.parse(cfg.signal_table)] if cfg.signal_table else []
        if signals:
            # Imported only for a signal table: every capture start would pay for it.
            from tidemark.source.postgres.incremental_snapshot import (  # noqa: PLC0415
                signal_table_layout,
            )
            for table in signals:
                signal_table_layout(conn, table)
        added = slot.ensure_publication(conn, cfg.publication_name, [*self.tables, *signals])
        added = [t for t in added if t in self.tables]
        if added and offset and offset.get("snapshot_completed"):
            # Streaming was under way: the stream resumes before this point, where these
            # tables were not published, and the snapshot is done. Say what they lack.
            log.warning(
                "table(s) %s joined the capture now (added to publication %s): their "
                "changes before this point were not published, and their existing rows "
                "are not in the snapshot taken before. To bring their rows in, send an "
                "execute-snapshot signal for them (signal_table; `tidemark signal "
                "execute-snapshot`): an incremental snapshot reads them while the stream "
                "goes on", ", ".join(map(str, added)), cfg.publication_name)
        self._generated = catalog.publishes_generated(conn, cfg.publication_name)
        catalog.warn_about_unstreamed(conn, self.tables, generated_published=self._generated)
        existing = self._wait_for_slot()
        self._batches = self._run(offset, existing)

    def poll(self) -> SourceBatch:
        """The next batch (possibly empty when the source is idle for a moment)."""
        if self._batches is None:
            raise SourceError("poll() called before start()")
        try:
            return next(self._batches)
        except StopIteration:
            return SourceBatch([], None, finished=True)

    def commit(self, offset: Offset) -> None:
        """*offset* (from a polled batch) is durably handed on: release WAL up to it."""
        if offset is self._awaited:
            self._awaited = None
            self._committed = offset
        lsn = offset.get("lsn")
        if self._stream is not None and isinstance(lsn, int) and offset.get("snapshot_completed"):
            self._stream.confirm(lsn)
            self._committed = offset

    def _skipper(self, restart_lsn: int) -> Skipper | None:
        """What to skip of the first transaction after *restart_lsn*: the part of it
        that the last committed offset (or the start offset) says was handed on."""
        offset = self._committed
        if offset is None or offset.get("lsn") != restart_lsn:
            return None
        partial = partial_of(offset)
        return None if partial is None else Skipper(*partial)

    def stop(self) -> None:
        """Close the stream and connections (offsets already committed stay)."""
        if self._stopped:
            return
        self._stopped = True
        if self._batches is not None and hasattr(self._batches, "close"):
            self._batches.close()  # ends an unfinished snapshot's transaction
        if self._stream is not None:
            self._stream.close()
            self._stream = None
        if self._snapshots is not None:
            with contextlib.suppress(Exception):
                self._snapshots.close()
        if self._catalog_conn is not None:
            if self.config.drop_slot_on_stop:
                with contextlib.suppress(Exception):
                    slot.drop_slot(self._catalog_conn, self.config.slot_name)
            with contextlib.suppress(Exception):
                self._catalog_conn.close()
            self._catalog_conn = None

    # -- helpers ---------------------------------------------------------------------
    def _retrying(self, action: Callable[[], _T], *, max_delay_s: float) -> _T:
        """Run *action*, retrying transient failures with exponential backoff up to
        reconnect_max_attempts times."""
        attempts = self.config.reconnect_max_attempts

        def log_retry(err: TransientError, attempt: int, delay: float) -> None:
            log.warning("%s; retry %d/%d in %.1fs", err, attempt, attempts, delay)

        return retry_transient(action, max_retries=attempts,
                               initial_delay_s=self.config.reconnect_backoff_ms / 1000,
                               max_delay_s=max_delay_s, on_retry=log_retry)

    def _wait_for_slot(self) -> slot.SlotInfo | None:
        """The existing slot (validated), waiting out a previous holder that is exiting
        (briefly: a walsender whose client died goes away within seconds)."""

        def existing() -> slot.SlotInfo | None:
            # A reader that is going away lets go within moments; one that stays (a
            # second capture, engine or pipeline on the slot) is refused now, in one
            # line. This reader's own previous walsender (a reconnect after a network
            # cut) is ended instead; on a reconnect, a holder that stays is retried:
            # it may be a previous connection not known here.
            try:
                slot_holder.wait_until_free(self._catalog_conn, self.config.slot_name,
                                            "slot_name, --slot", own=self._own_backends)
            except slot_holder.SlotHeldError as err:
                if not self._reconnect:
                    raise
                raise slot.SlotInUseError(str(err)) from None
            info = slot.get_slot(self._catalog_conn, self.config.slot_name)
            if info is not None:
                slot.validate_slot(info, self.database)
            return info

        return self._retrying(existing, max_delay_s=5.0)

    def _catalog(self, query: Callable[[Any], _T]) -> _T:
        """Run a catalog query, reconnecting once if the connection was lost (the
        server restarted, or an idle connection was cut)."""
        for attempt in (1, 2):
            try:
                if self._catalog_conn is None or self._catalog_conn.closed:
                    self._catalog_conn = pgconn.connect(self.config.dsn)
                return query(self._catalog_conn)
            except (psycopg.OperationalError, psycopg.InterfaceError) as err:
                with contextlib.suppress(Exception):
                    self._catalog_conn.close()
                self._catalog_conn = None
                if attempt == 2:
                    raise SourceUnavailableError(
                        f"catalog connection failed: {str(err).strip().splitlines()[0]}"
                    ) from None
        raise AssertionError("unreachable")

    def _key_columns(self, table: TableId) -> tuple[str, ...] | None:
        if table not in self._keys:
            self._keys.update(self._catalog(lambda c: catalog.primary_keys(c, [table])))
        return self._keys.get(table)

    def _type_info(self, oid: int) -> tuple[str, int]:
        info = self._type_infos.get(oid)
        if info is None:
            info = self._type_infos[oid] = self._catalog(lambda c: catalog.type_info(c, oid))
        return info

    def _snapshot(self, snapshot_name: str | None, lsn: int) -> Iterator[SourceBatch]:
        cfg = self.config
        conn = pgconn.connect(cfg.dsn, application_name="tidemark-snapshot")
        try:
            txid = begin_snapshot(conn, snapshot_name)
            schemas = [catalog.table_schema(conn, t, self._keys.get(t), generated=self._generated)
                       for t in self.tables]
            started = time.time_ns() // 1000
            log.info("snapshot of %d tables at %s started", len(schemas), lsn_to_str(lsn))
            stats = self.stats
            stats.snapshot_running = True
            for events in snapshot_events(
                conn, schemas, topic_prefix=cfg.topic_prefix, database=self.database,
                lsn=lsn, txid=txid, ts_us=started, fetch_size=cfg.snapshot_fetch_size,
            ):
                stats.count_rows(events)
                stats.saw_events(len(events), started)
                yield SourceBatch(list(events), None)
            conn.rollback()
            stats.snapshot_running = False
            stats.snapshot_completed = True
        finally:
            conn.close()

    def _snapshot_only(self) -> Iterator[SourceBatch]:
        with contextlib.closing(pgconn.connect(self.config.dsn)) as conn:
            lsn = pg_offset.server_position(conn) or 0  # a standby has no WAL of its own
        yield from self._snapshot(None, lsn)
        yield SourceBatch([], {"lsn": lsn, "snapshot_completed": True}, finished=True)

    def _run(self, offset: Offset | None, existing: slot.SlotInfo | None) -> Iterator[SourceBatch]:
        cfg = self.config
        mode = cfg.snapshot_mode
        completed = bool(offset and offset.get("snapshot_completed"))
        start_lsn = int(offset["lsn"]) if offset and "lsn" in offset else 0
        # source.sequence's last commit for the first streamed transaction: where a
        # previous run (its offset) or this run's snapshot left off, as Debezium restores
        # it from its offset; null on a first start without a snapshot, as there.
        last_commit = start_lsn or None
        self.stats.snapshot_completed = completed
        from tidemark.source.postgres.replication import (  # noqa: PLC0415 - see above
            ReplicationStream,
        )

        stream = ReplicationStream(cfg.dsn, cfg.slot_name, cfg.publication_name,
                                   status_interval_s=cfg.status_interval_ms / 1000,
                                   receive_timeout_s=cfg.wal_receive_timeout_ms / 1000,
                                   backend_pids=self._own_backends)
        if existing is not None and existing.invalidation is not None and offset:
            existing = self._lost_slot(existing, start_lsn)
        if existing is None:
            resnapshot = False
            if offset and completed:
                if mode == SnapshotMode.WHEN_NEEDED:
                    log.warning("slot %s is missing: taking a new snapshot (when_needed)",
                                cfg.slot_name)
                elif cfg.on_slot_lost == SlotLostAction.RESNAPSHOT:
                    resnapshot = True
                else:
                    raise SlotLostError(
                        f"replication slot {cfg.slot_name!r} is gone but the offsets say "
                        f"capture had reached {lsn_to_str(start_lsn)}: the changes since "
                        "then are lost to capture (the slot was dropped, or the server is "
                        "a promoted standby that did not have it). Recover with "
                        "on_slot_lost = \"resnapshot\" (a new slot, then an incremental "
                        "snapshot of every captured table while the stream goes on), "
                        "snapshot_mode = \"when_needed\" (a new full snapshot), or reset "
                        "the offsets")
            if resnapshot:
                yield from self._resnapshot(stream, start_lsn)
                return
            stream.connect()
            consistent, snapshot_name = stream.create_slot(failover=cfg.slot_failover)
            log.info("created replication slot %s at %s", cfg.slot_name, lsn_to_str(consistent))
            if offset:
                faults.crash_point("after_slot_created", 0)
            start_lsn = consistent
            if mode == SnapshotMode.NO_DATA:
                stream.close()
            else:
                last_commit = consistent
                # The exported snapshot lives until the slot's connection is used again;
                # import it (begin_snapshot) before that connection is closed.
                snapshots = self._dropping_slot_on_failure(
                    stream, self._snapshot(snapshot_name, consistent))
                first = next(snapshots, None)
                stream.close()
                if offset:
                    # Offsets of an earlier slot exist: they must stop vouching for a
                    # finished snapshot before any row of the new one is handed on (the
                    # position stays theirs: nothing past it is delivered yet).
                    yield from self._until_saved({"lsn": int(offset.get("lsn", 0)),
                                                  "snapshot_completed": False})
                if first is not None:
                    yield first
                    yield from snapshots
            yield SourceBatch([], {"lsn": start_lsn, "snapshot_completed": True})
        else:
            # Offsets are saved before the slot is confirmed to them, so the slot this
            # capture has been reading is never ahead of them. One that is was not
            # confirmed by it: dropped and made again (by an operator, or by a capture
            # that died before it saved where the new slot starts). Streaming from it
            # would skip what was committed in between.
            slot_lsn = existing.confirmed_flush_lsn or 0
            if offset and completed and slot_lsn > start_lsn:
                unvouched = self._unvouched_slot(slot_lsn, start_lsn)
                if unvouched == "resnapshot":
                    yield from self._resnapshot(stream, start_lsn, existing=slot_lsn)
                    return
                completed = False  # when_needed: a new snapshot, from the slot
            needs_snapshot = not completed and mode in (SnapshotMode.INITIAL,
                                                        SnapshotMode.WHEN_NEEDED)
            if needs_snapshot:
                # No exported snapshot is available for an existing slot: a snapshot taken
                # now overlaps the stream from the slot's position, so rows changed in
                # between arrive twice (at-least-once), never zero times.
                yield from self._snapshot(None, slot_lsn)
                start_lsn = last_commit = slot_lsn
                yield SourceBatch([], {"lsn": start_lsn, "snapshot_completed": True})
            start_lsn = max(start_lsn, slot_lsn)
        self._stream = stream
        yield from self._recovering(stream, start_lsn,
                                    self._stream_changes(stream, start_lsn, last_commit))

    def _recovering(self, stream: ReplicationStream, start_lsn: int,
                    batches: Iterator[SourceBatch]) -> Iterator[SourceBatch]:
        """*batches* of the stream; if the server invalidates or drops the slot under
        it, ``on_slot_lost = "resnapshot"`` goes on with a new slot and an incremental
        snapshot, in this run (otherwise the error stops capture)."""
        try:
            yield from batches
        except SlotLostError as err:
            if self.config.on_slot_lost != SlotLostAction.RESNAPSHOT:
                raise
            # Where the stream started counts when nothing streamed was confirmed yet.
            lost_at = max(stream.confirmed_lsn, start_lsn)
            log.warning("%s", str(err).split(":", 1)[0])
            stream.close()
            if self._snapshots is not None:
                self._snapshots.close()
                self._snapshots = None
            # drop_slot does nothing if the slot was dropped, not invalidated.
            self._catalog(lambda c: slot.drop_slot(c, self.config.slot_name))
            yield from self._resnapshot(stream, lost_at)

    def _resnapshot(self, stream: ReplicationStream, lost_at: int, *,
                    existing: int | None = None) -> Iterator[SourceBatch]:
        """After the slot was lost past *lost_at*: a new slot (or the *existing* one,
        at that position, that the offsets do not vouch for), and every captured table
        with a key re-read by an incremental snapshot while the slot streams."""
        cfg = self.config
        state = {"tables": [{"table": str(t)} for t in self.tables if self._keys.get(t)],
                 "paused": False}
        # The re-read is saved as pending before a new slot exists: a capture that dies
        # after making the slot and before saving where it starts must not resume from
        # the slot as if nothing were missing.
        pending: Offset = {**(self._committed or {}), "lsn": lost_at,
                           "snapshot_completed": True, SNAPSHOT_OFFSET_KEY: state}
        for key in (COMMIT_LSN_KEY, MESSAGES_KEY):  # of the old slot's stream
            pending.pop(key, None)
        yield from self._until_saved(pending)
        if existing is None:
            stream.connect()
            consistent, _ = stream.create_slot(failover=cfg.slot_failover)
            stream.close()
            faults.crash_point("after_slot_created", 0)
        else:
            consistent = existing
        self._committed = {**(self._committed or {}), "lsn": consistent,
                           "snapshot_completed": True, SNAPSHOT_OFFSET_KEY: state}
        for key in (COMMIT_LSN_KEY, MESSAGES_KEY):  # of the old slot's stream
            self._committed.pop(key, None)
        log.warning("replication slot %s was lost after %s: %s streams from %s, and "
                    "every captured table with a key is re-read by an incremental snapshot "
                    "(on_slot_lost=resnapshot)", cfg.slot_name, lsn_to_str(lost_at),
                    "a new one" if existing is None else "the slot found in its place",
                    lsn_to_str(consistent))
        yield SourceBatch([], {"lsn": consistent, "snapshot_completed": True,
                               SNAPSHOT_OFFSET_KEY: state})
        self._stream = stream
        yield from self._recovering(stream, consistent,
                                    self._stream_changes(stream, consistent, consistent))

    def _unvouched_slot(self, slot_lsn: int, saved_lsn: int) -> str:
        """The slot is at *slot_lsn*, past the *saved_lsn* the offsets reached: what to
        do (``"resnapshot"`` or ``"snapshot"``), or the error that stops capture."""
        cfg = self.config
        gap = (f"replication slot {cfg.slot_name!r} is at {lsn_to_str(slot_lsn)}, past "
               f"{lsn_to_str(saved_lsn)} where the offsets say capture got to: this "
               "capture never confirmed that position, so the slot is not the one the "
               "offsets were taken from (it was dropped and made again)")
        if cfg.on_slot_lost == SlotLostAction.RESNAPSHOT:
            log.warning("%s; the changes in between are unknown, so every captured table "
                        "with a key is re-read by an incremental snapshot "
                        "(on_slot_lost=resnapshot)", gap)
            return "resnapshot"
        if cfg.snapshot_mode == SnapshotMode.WHEN_NEEDED:
            log.warning("%s; taking a new snapshot (when_needed)", gap)
            return "snapshot"
        raise SlotLostError(
            f"{gap}. The changes committed between the two positions were never streamed. "
            "Recover with on_slot_lost = \"resnapshot\" (every captured table is re-read "
            "by an incremental snapshot while the stream goes on), snapshot_mode = "
            "\"when_needed\" (a new full snapshot), or reset the offsets if those changes "
            "are not needed")

    def _until_saved(self, offset: Offset) -> Iterator[SourceBatch]:
        """Hand on *offset* and wait until the caller has committed it (saved it
        durably): what follows must not happen before it is on record."""
        self._awaited = offset
        yield SourceBatch([], offset)
        while self._awaited is not None:
            yield SourceBatch([], None)
            if self._awaited is not None:
                time.sleep(0.05)

    def _lost_slot(self, existing: slot.SlotInfo, start_lsn: int) -> slot.SlotInfo | None:
        """*existing* was invalidated by the server: an error that says what was lost,
        or (``on_slot_lost = "resnapshot"``, ``snapshot_mode = "when_needed"``) None once
        the slot is dropped, to be made again as a missing one is."""
        cfg = self.config
        why = {"wal_removed": "its WAL was removed (it exceeded max_slot_wal_keep_size)",
               "rows_removed": "catalog rows it needed were removed (a standby's slot "
                               "conflicting with recovery)",
               "idle_timeout": "it was idle longer than idle_replication_slot_timeout",
               "wal_level_insufficient": "wal_level is below logical on the primary"
               }.get(existing.invalidation or "", existing.invalidation or "")
        if cfg.on_slot_lost != SlotLostAction.RESNAPSHOT \
                and cfg.snapshot_mode != SnapshotMode.WHEN_NEEDED:
            raise SlotLostError(
                f"replication slot {cfg.slot_name!r} was invalidated by the server: {why}. "
                f"Capture had reached {lsn_to_str(start_lsn)}; the changes since then are "
                "lost to the slot. Recover with on_slot_lost = \"resnapshot\" (the slot is "
                "dropped and created again, then every captured table is re-read by an "
                "incremental snapshot while the stream goes on), or drop the slot "
                f"(SELECT pg_drop_replication_slot('{cfg.slot_name}')) and restart with "
                "snapshot_mode = \"when_needed\" for a full snapshot")
        log.warning("replication slot %s was invalidated (%s): dropping it", cfg.slot_name,
                    why)
        self._catalog(lambda c: slot.drop_slot(c, cfg.slot_name))
        return None

    def _dropping_slot_on_failure(self, stream: ReplicationStream,
                                  batches: Iterator[SourceBatch]) -> Iterator[SourceBatch]:
        """*batches*, the snapshot of the slot this start created; if they fail, the slot
        is dropped: no offset covers it yet, so the next start takes a new snapshot (and
        slot) anyway, and left behind it would hold WAL until someone noticed."""
        try:
            yield from batches
        except Exception:
            stream.close()  # the slot is active on it; dropping waits for that to end
            name = self.config.slot_name
            try:
                self._catalog(lambda c: slot.drop_slot(c, name))
            except Exception as err:
                log.warning("could not drop replication slot %s after the failed snapshot "
                            "(%s): drop it with SELECT pg_drop_replication_slot('%s')",
                            name, str(err).strip().splitlines()[0], name)
            raise

    def _stream_changes(self, stream: ReplicationStream, start_lsn: int,
                        last_commit_lsn: int | None) -> Iterator[SourceBatch]:
        cfg = self.config
        builder = ChangeEventBuilder(
            topic_prefix=cfg.topic_prefix, database=self.database,
            key_columns=self._key_columns, type_info=self._type_info,
            captured=frozenset(self.tables),
            not_null_columns=lambda table: self._catalog(
                lambda c: catalog.not_null_columns(c, table)),
            transaction_metadata=cfg.provide_transaction_metadata,
            # source.sequence's last commit must keep growing across restarts: consumers
            # of Debezium JSON order transactions by it (Debezium keeps it in its offset).
            last_commit_lsn=last_commit_lsn,
            skipped_operations=cfg.skipped,
        )
        lines = JsonLineBuilder(builder, self._json_lines) if self._json_lines else None
        to_records = (RenderedEventBuilder(builder, self._rendered_json,
                                           converted_records=self._converted_records).process
                      if self._rendered_json else builder.process)
        resume = start_lsn
        stats = self.stats
        snap = self._incremental_snapshot()
        skipper = self._skipper(start_lsn)
        open_messages = 0  # change messages of the open transaction handed on so far
        handed_partial: tuple[int, int] | None = None
        self._open_with_retry(stream, resume)
        stats.connected = True
        heartbeat_s = cfg.heartbeat_interval_ms / 1000
        last_heartbeat = time.monotonic()
        emitted = start_lsn  # the last offset handed on in a batch
        # Start with small batches so that the first events are handed on within
        # milliseconds of the stream opening, then grow to max_batch_messages, where
        # per-batch costs stop mattering.
        limit = min(_FIRST_BATCH_MESSAGES, cfg.max_batch_messages)
        last_yield = time.monotonic()
        while True:
            try:
                # While windows wait for their closing marks, a batch ends as soon as
                # nothing more is at hand: the 50 ms gather would hold a closing mark
                # already read for as long as a writer's changes keep coming.
                messages = stream.read_batch(limit, 0.2) if snap is None or not snap.windows \
                    else stream.read_batch(limit, 0.2, 0.0)
                messages_read = bool(messages)
                if messages:
                    limit = min(limit * 4, cfg.max_batch_messages)
            except SourceUnavailableError as err:
                stream.close()
                stats.connected = False
                if cfg.reconnect_max_attempts == 0:
                    raise
                # Resume from what the caller has committed, not from what was handed on:
                # batches after it may still be in the caller's hands and lost with it,
                # so the transactions in between are delivered again (at-least-once).
                restart = max(stream.confirmed_lsn, start_lsn)
                log.warning("%s; reconnecting from %s", err, lsn_to_str(restart))
                builder.in_transaction = False
                skipper = self._skipper(restart)
                open_messages = 0
                if snap is not None:
                    snap.abandon_windows()  # the stream restarts before their marks
                self._open_with_retry(stream, restart)
                stats.connected = True
                continue
            now_us = time.time_ns() // 1000
            if skipper is not None and messages:
                # Handed on before the restart: decoded for the builder's state only.
                seen, messages = skipper.split(messages)
                if seen and snap is not None:
                    snap.observe(seen)
                if seen:
                    if lines is not None:
                        lines.process(seen, now_us)
                    else:
                        to_records(seen, now_us)
                    open_messages = open_transaction_messages(seen, open_messages)
                if skipper.done:
                    skipper = None
            if snap is not None and messages and snap.scanning:
                # Signals and snapshot windows: a window's close releases its rows right
                # there, between the changes before and after it (incremental_snapshot).
                split = snap.split(messages, builder.context)
                while split.after is not None:
                    records, texts = self._handle(split.before, now_us, lines, to_records,
                                                  builder)
                    if records or texts:
                        yield SourceBatch(records, None, False, texts)
                    if split.reads:
                        stats.count_rows(split.reads)
                        stats.saw_events(len(split.reads), now_us)
                    # The chunk's reads carry the offset that says they were handed on
                    # (the changes before them end with whole transactions), so a stop
                    # between here and the rest of the batch repeats neither.
                    if builder.last_end_lsn is not None and builder.last_end_lsn > resume:
                        resume = builder.last_end_lsn
                    emitted = stats.position_lsn = resume
                    handed_partial = None
                    yield SourceBatch(list(split.reads), _offset(resume, None, snap))
                    snap.maybe_open_window()
                    split = snap.split(split.after, builder.context)
                messages = split.before
            records, texts = self._handle(messages, now_us, lines, to_records, builder)
            if builder.last_end_lsn is not None and builder.last_end_lsn > resume:
                resume = builder.last_end_lsn
            finished = False
            idle = not messages and not builder.in_transaction
            # Idle: everything sent so far is handed on, so the server's position is a
            # safe resume point; confirming it lets the slot advance past WAL written
            # for tables we do not capture.
            server = stream.wal_end if idle else 0
            if idle and heartbeat_s and time.monotonic() - last_heartbeat >= heartbeat_s:
                last_heartbeat = time.monotonic()
                self._heartbeat_action()
                resume = max(resume, server)
            if self._stop_at is not None and not builder.in_transaction:
                # Between transactions, and never only when idle: under a steady writer
                # the stream is never idle, and the end is reached once a commit past it
                # is handed on. Snapshots signalled before the end are part of what it
                # waits for. (A paused one is not waited for: nothing would resume it.)
                if max(server, resume) >= self._stop_at and (
                        snap is None or not snap.active or snap.paused):
                    finished = True
                    resume = max(resume, server)
                elif idle:
                    stream.request_keepalive()
            # In the middle of a transaction, the offset also says how much of it was
            # handed on, so that a restart skips that part (partial_transaction).
            partial = None
            if builder.in_transaction:
                if messages:
                    open_messages = open_transaction_messages(messages, open_messages)
                if open_messages and builder.context.commit_lsn is not None:
                    partial = (builder.context.commit_lsn, open_messages)
            else:
                open_messages = 0
            if messages_read and not records and not texts and not finished and \
                    snap is not None and snap.active and not snap.paused and \
                    time.monotonic() - last_yield < _BUSY_SNAPSHOT_YIELD_S:
                # The stream is bringing the snapshot's marks: read on at once. An empty
                # batch would make the engine wait as for an idle source (50 ms a
                # window). What it would have carried goes with the next one.
                snap.maybe_open_window()
                continue
            snap_changed = snap is not None and snap.changed
            offset: Offset | None = None
            if resume > emitted or finished or partial != handed_partial or snap_changed:
                offset = _offset(resume, partial, snap)
                emitted = stats.position_lsn = resume
                handed_partial = partial
            last_yield = time.monotonic()
            yield SourceBatch(records, offset, finished, texts)
            if finished:
                return
            if snap is not None:
                snap.maybe_open_window()
                # SnapshotRunning covers incremental snapshots too (metrics).
                stats.snapshot_running = snap.active and not snap.paused

    def _handle(self, messages: list[tuple[bytes, int]], now_us: int,
                lines: JsonLineBuilder | None,
                to_records: Callable[[list[tuple[bytes, int]], int], list[Record]],
                builder: ChangeEventBuilder) -> tuple[list[Record], list[str] | None]:
        """The records (or JSON lines) of *messages*, counted in the stats."""
        records: list[Record] = []
        texts: list[str] | None = None
        if lines is not None:
            texts = lines.process(messages, now_us) if messages else []
        elif messages:
            records = to_records(messages, now_us)
        if messages:
            stats = self.stats
            stats.transactions_committed = builder.commits
            events = len(records) + (len(texts) if texts else 0)
            if events:
                stats.saw_events(events, builder.context.ts_us)
        return records, texts

    def _incremental_snapshot(self) -> IncrementalSnapshot | None:
        """The incremental snapshots of this capture (None without a signal table and
        with nothing left over from an earlier run)."""
        cfg = self.config
        state = self._committed.get(SNAPSHOT_OFFSET_KEY) if self._committed else None
        if cfg.signal_table is None and not state:
            return None
        from tidemark.source.postgres.incremental_snapshot import (  # noqa: PLC0415
            IncrementalSnapshot,
        )
        snap = IncrementalSnapshot(
            dsn_connect=lambda: pgconn.connect(cfg.dsn, application_name="tidemark-snapshot"),
            captured=self.tables, keys=self._keys,
            signal_table=TableId.parse(cfg.signal_table) if cfg.signal_table else None,
            chunk_size=cfg.incremental_snapshot_chunk_size, topic_prefix=cfg.topic_prefix,
            database=self.database, state=state if isinstance(state, dict) else None,
            generated=self._generated, skipped=cfg.skipped,
            adaptive_chunks=cfg.incremental_snapshot_chunk_adaptive)
        snap.open()
        self._snapshots = snap
        snap.maybe_open_window()
        return snap

    def _heartbeat_action(self) -> None:
        query = self.config.heartbeat_action_query
        if not query:
            return
        def run(conn: Any) -> None:
            with pgconn.cursor(conn) as cur:
                cur.execute(query)

        try:
            self._catalog(run)
        except Exception as err:  # a failing heartbeat must not stop capture
            log.warning("heartbeat_action_query failed: %s", str(err).strip().splitlines()[0])

    def _release_own_slot(self, conn: Any) -> None:
        """Wait for the slot to be free before streaming again, ending this reader's own
        previous walsender; another holder is retried (transient)."""
        try:
            slot_holder.wait_until_free(conn, self.config.slot_name, "slot_name, --slot",
                                        own=self._own_backends)
        except slot_holder.SlotHeldError as err:
            raise slot.SlotInUseError(str(err)) from None

    def _open_with_retry(self, stream: ReplicationStream, lsn: int) -> None:
        """Open the stream, retrying transient failures up to reconnect_max_attempts."""

        def open_once() -> None:
            try:
                stream.connect()
                stream.start(lsn)
            except TransientError:
                stream.close()
                raise

        def open_stream() -> None:
            try:
                open_once()
            except slot.SlotInUseError:
                # The broken connection's walsender may still hold the slot (the server
                # has not noticed the cut): it is this reader's, so it is ended, and the
                # slot, free now, opened at once (not counted as a failed attempt).
                # Asked only once the server answered: a catalog query to a server that
                # stopped answering would wait without a deadline.
                if not self._own_backends:
                    raise
                self._catalog(self._release_own_slot)
                open_once()

        self._retrying(open_stream, max_delay_s=_MAX_BACKOFF_S)


def _offset(lsn: int, partial: tuple[int, int] | None,
            snapshots: IncrementalSnapshot | None) -> Offset:
    """A streamed batch's offset: the resume position, how much of an open transaction
    was handed on, and the incremental snapshot's state (now saved: not changed)."""
    offset: Offset = {"lsn": lsn, "snapshot_completed": True}
    if partial is not None:
        offset[COMMIT_LSN_KEY], offset[MESSAGES_KEY] = partial
    if snapshots is not None:
        snapshots.changed = False
        state = snapshots.state()
        if state is not None:
            offset[SNAPSHOT_OFFSET_KEY] = state
    return offset
