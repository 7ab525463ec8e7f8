"""The streaming query of ``tidemark run``: one envelope stream, ``apply_changes`` per table.

Exactly once end to end rests on three pieces that already exist, tied together here:

* the source's offsets (commit LSNs) live in Spark's checkpoint and a replayed batch
  reads exactly the same transactions (:mod:`tidemark.spark`);
* every Delta commit carries the app transaction ``(app_id, batch_id)``, and a batch the
  table already holds is skipped (:func:`tidemark.lake.apply_changes`);
* ``app_id`` is stable across restarts: it is derived from the query id Spark keeps in
  the checkpoint's ``metadata`` file (not the run id, which changes on every start), so
  a batch replayed after a crash is recognised.

The slot is advanced only after Spark commits the batch, so a crash anywhere replays the
batch, and each Delta table either already has it (skipped) or gets it once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from pyspark.errors import PySparkException
from pyspark.sql import SparkSession
from pyspark.sql.streaming.query import StreamingQuery
from pyspark.sql.types import StructType

import tidemark.spark as ts
from tidemark.lake.upkeep import UpkeepState
from tidemark.lake.written_targets import WrittenTargets
from tidemark.metrics import serve
from tidemark.pipeline.batch_apply import BatchApply
from tidemark.pipeline.batch_source import BatchSource
from tidemark.pipeline.config import PipelineConfig
from tidemark.pipeline.directories import MadeDirectories
from tidemark.pipeline.executor_apply import apply_on_executors
from tidemark.pipeline.identity import claim_checkpoint
from tidemark.pipeline.in_flight import InFlight
from tidemark.pipeline.progress import BatchReport
from tidemark.pipeline.query_errors import (
    STOPPED_BEFORE,
    PipelineError,
    QuietStops,
    message_of,
    source_unavailable,
)
from tidemark.pipeline.run_metrics import RunMetrics
from tidemark.pipeline.spark_session import build_session
from tidemark.pipeline.start_checks import check_before_start
from tidemark.run_record import records_runs
from tidemark.spark.options import SnapshotMode
from tidemark.spark.sources import reader_modules
from tidemark.spark.worker_warmup import warm_python_workers

__all__ = ["Pipeline", "PipelineError", "build_session", "source_unavailable"]

log = logging.getLogger(__name__)


_POLL_SECONDS = 0.2
_MAX_BACKOFF_S = 30.0


_PY4J_CALLBACKS: Final = "py4j.clientserver"


class Pipeline(BatchApply):
    """One ``pipeline.toml`` as a running streaming query.

    ``on_batch`` is called on the driver after each batch is applied. :meth:`run`
    blocks until the query ends: caught up (``available_now``), stopped by
    :meth:`request_stop` (after the batch in progress), or failed.
    """

    def __init__(self, config: PipelineConfig, *, spark: SparkSession | None = None,
                 on_batch: Callable[[BatchReport], None] | None = None) -> None:
        self.config = config
        self._spark = spark
        self._on_batch = on_batch
        self._stop = threading.Event()
        self._prepared = False
        self._noted = False
        self._made = MadeDirectories()
        self._undo_start: Callable[[], list[str]] | None = None
        self._stop_now = threading.Event()
        self._in_flight = InFlight()
        self._streaming = False
        self._query_id: str | None = None
        self._schemas: dict[str, StructType] | None = None
        self._written: WrittenTargets | None = None
        self._spill_path: Path | None = None
        self._upkeep_state: dict[str, UpkeepState] = {}
        self._batches_applied = 0
        self._last_batch_end: float | None = None
        self._source = BatchSource(config)
        self._metrics = RunMetrics(config.spark.app_name, self._source.kind.name,
                                   config.checkpoint)
        self.metrics_port: int | None = None
        """The port of the metrics endpoint while :meth:`run` serves it."""

    def request_stop(self, *, now: bool = False) -> None:
        """Stop once the batch in progress is committed, or with *now* without waiting
        for it (it replays on the next start). Safe from a signal handler: :meth:`run`
        stops the query itself, and returns once no batch runs."""
        if now:
            self._stop_now.set()
        self._stop.set()

    @property
    def streaming(self) -> bool:
        """True from the moment the streaming query is started until :meth:`run` has
        stopped it and no batch runs. Before, a KeyboardInterrupt can stop the
        pipeline safely; while streaming, :meth:`request_stop` must."""
        return self._streaming

    @property
    def stop_requested(self) -> bool:
        """True once :meth:`request_stop` was called."""
        return self._stop.is_set()

    def start(self) -> StreamingQuery:
        """Start the streaming query (validating the database through the source)."""
        try:
            self._prepare()
            return self._start_query()
        except PySparkException as err:
            # The source checks the database when the stream is loaded; its error comes
            # back wrapped in a Python traceback inside a Spark exception.
            self._undo_failed_start()
            raise PipelineError(message_of(err)) from None
        except BaseException:
            self._undo_failed_start()
            raise

    def _start(self, spark: SparkSession) -> StreamingQuery:
        source = self.config.source
        # Where the stream reads: a slot and publication, a log's reader name, …
        replication = self._source.kind.reader_options(
            slot=source.slot, publication=source.publication,
            checkpoint=self.config.checkpoint, slot_failover=source.slot_failover)
        stream = ts.read_changes(
            spark, dsn=self.config.dsn, tables=list(self.config.tables), **replication,
            max_changes_per_trigger=source.max_changes_per_trigger,
            num_partitions=source.num_partitions,
            onSchemaChange=source.on_schema_change.value,
            serverTimeoutMs=source.server_timeout_ms,
            **({"source": source.kind} if source.kind is not None else {}),
            **({"retentionS": str(source.retention_s)}
               if source.retention_s is not None else {}),
            **self._snapshot_options(),
            # Typed Arrow batches pass through Spark as opaque values: this query only
            # collects them. The change log is written by Spark's Parquet sink, which
            # needs real columns.
            row_format="struct" if self.config.changelog else "arrow")
        if self.config.spark.warm_workers:
            # The first batch's tasks reuse these workers instead of starting their own.
            modules = list(reader_modules(self._source.kind.name))
            if self.config.spark.apply_on == "executors":
                modules.append(apply_on_executors.__module__)
            warm_python_workers(spark, modules)
        writer = (stream.writeStream.foreachBatch(self._process)
                  .option("checkpointLocation", self.config.checkpoint)
                  .queryName(self.config.spark.app_name))
        if self.config.spark.available_now:
            writer = writer.trigger(availableNow=True)
        elif self.config.spark.trigger_interval_ms is not None:
            writer = writer.trigger(processingTime=f"{self.config.spark.trigger_interval_ms}"
                                                   " milliseconds")
        self._streaming = True
        return writer.start()

    def _snapshot_options(self) -> dict[str, Any]:
        source = self.config.source
        options: dict[str, Any] = {}
        if source.snapshot_chunk_rows is not None:
            options["snapshotChunkRows"] = source.snapshot_chunk_rows
        if source.signal_table is not None:
            options["signalTable"] = source.signal_table
        wanted = [t.table for t in self.config.targets if t.snapshot is SnapshotMode.INITIAL]
        if wanted:
            options.update(snapshot=SnapshotMode.INITIAL.value,
                           snapshotTables=",".join(wanted))
        if source.snapshot_chunks_per_trigger is not None:
            options["snapshotChunksPerTrigger"] = source.snapshot_chunks_per_trigger
        return options

    def run(self) -> None:
        """Run until done or stopped; raises PipelineError if the query fails, and
        CheckpointOwnerError (having written nothing) if the checkpoint is another
        pipeline's.

        When PostgreSQL becomes unreachable (a restart, a failover, a cut connection)
        the query is started again from its checkpoint after a backoff, up to
        ``source.reconnect_max_attempts`` times in a row: the batch in progress replays
        and exactly-once holds, as after any crash.
        """
        quiet = QuietStops(self._stop_now)
        logging.getLogger(_PY4J_CALLBACKS).addFilter(quiet)
        try:
            self._prepare()
            self._run()
        except BaseException:
            self._undo_failed_start()
            raise
        finally:
            logging.getLogger(_PY4J_CALLBACKS).removeFilter(quiet)

    def _undo_failed_start(self) -> None:
        """Drop what this start created in the source (its slot, its publication) when
        it failed before planning a batch: once one is planned, the checkpoint relies on
        the slot (the batch replays from it)."""
        undo, self._undo_start = self._undo_start, None
        if self._batches_applied or planned_a_batch(self.config.checkpoint):
            # An empty directory this start made (a lost target's) is no one's state.
            self._made.remove(only_empty=True)
            return
        if undo is not None:
            try:
                dropped = undo()
            except Exception as err:  # the start's own failure is what the user must see
                log.warning("could not drop what the failed start created: %s", err)
            else:
                if dropped:
                    log.info("the start failed: dropped the %s it created",
                             " and the ".join(dropped))
        removed = self._made.remove()
        if removed:
            log.info("the start failed: removed the directories it made (%s)",
                     ", ".join(removed))

    def _prepare(self) -> None:
        """Once per run, before anything is made: check the targets' directories, the
        columns the settings name and the source (:func:`check_before_start`, the kind's
        own checks), then make the checkpoint and the targets' directories and claim the
        checkpoint. A check that fails leaves nothing behind."""
        if self._prepared:
            return
        config, kind = self.config, self._source.kind
        existed = Path(config.checkpoint).is_dir()
        if existed:
            # Before the source's checks read it: another pipeline's checkpoint is
            # named as such (claiming writes nothing when it refuses).
            claim_checkpoint(config)
        check_before_start(config, kind)
        # A query restarted after an outage reads a slot it advanced: once per run.
        kind.check_before_start(config.dsn, slot=config.source.slot,
                                checkpoint=config.checkpoint)
        self._made.make(config.checkpoint, "spark.checkpoint")
        for target in config.targets:
            if target.local:
                self._made.make(target.path, f'targets."{target.table}".path')
        if not existed:
            claim_checkpoint(config)
        self._prepared = True

    @records_runs  # <checkpoint>/tidemark-status.json, for tidemark status
    def _run(self) -> None:
        source = self.config.source
        attempts = 0
        delay = source.reconnect_backoff_ms / 1000
        server = None
        if self.config.metrics is not None:
            server = serve(self.config.metrics.port, self._metrics.families,
                           addr=self.config.metrics.address)
            self.metrics_port = server.port
        try:
            while True:
                applied = self._batches_applied
                try:
                    self._run_query()
                    return
                except PySparkException as err:  # StreamingQueryException is one too
                    message = message_of(err)
                    if self._stop_now.is_set() or (self._stop.is_set()
                                                   and STOPPED_BEFORE in str(err)):
                        # How the stop ended the query, not a failure: the batch that
                        # did not finish runs again on the next start.
                        log.info("stopped (%s)", message)
                        return
                    if not source_unavailable(err) or self._stop.is_set():
                        raise PipelineError(message) from None
                    if self._batches_applied > applied:
                        # It ran again: a new outage gets every attempt again.
                        attempts, delay = 0, source.reconnect_backoff_ms / 1000
                    attempts += 1
                    if attempts > source.reconnect_max_attempts:
                        raise PipelineError(
                            f"PostgreSQL is unreachable ({message}); gave up after "
                            f"{source.reconnect_max_attempts} restarts of the query "
                            "(source.reconnect_max_attempts); started again, the pipeline "
                            "resumes from its checkpoint") from None
                    log.warning("PostgreSQL is unreachable (%s); restarting the query "
                                "from its checkpoint in %.1f s (%d/%d)", message, delay,
                                attempts, source.reconnect_max_attempts)
                    if self._stop.wait(delay):
                        return
                    delay = min(delay * 2, _MAX_BACKOFF_S)
        finally:
            if server is not None:
                server.close()
                self.metrics_port = None
            self._source.close()

    def _run_query(self) -> None:
        """Start the streaming query and wait until it ends (raises its failure); when
        this returns or raises, the query is stopped and no batch runs."""
        query: StreamingQuery | None = None
        try:
            query = self._start_query()
            while query.isActive:
                if self._stop.is_set():
                    _stop_between_batches(query, self._stop_now)
                    break
                time.sleep(_POLL_SECONDS)
            query.awaitTermination()
        finally:
            self._stopped(query)

    def _stopped(self, query: StreamingQuery | None) -> None:
        """Stop *query* if it still runs (this thread was interrupted), then wait until
        its last batch has returned (:mod:`tidemark.pipeline.in_flight`)."""
        if query is not None:
            try:
                if query.isActive:
                    query.stop()
            except Exception as err:  # stopping anyway: Spark's side may be gone already
                log.warning("could not stop the streaming query: %s", err)
        if self._in_flight.running:
            log.info("waiting for the batch in progress to return")
        if not self._in_flight.wait_idle(_BATCH_RETURN_S):
            log.warning("a batch is still running %.0f s after the query stopped",
                        _BATCH_RETURN_S)
        self._streaming = False

    def _start_query(self) -> StreamingQuery:
        # Before Spark starts: a target lost since the last run is a stop, not a new table.
        self._written = WrittenTargets(self.config.checkpoint)
        self._written.check(self.config.targets)
        if not self._noted and not planned_a_batch(self.config.checkpoint):
            # A first start: what it creates is dropped again if it fails.
            self._undo_start = self._source.kind.note_before_start(
                self.config.dsn, slot=self.config.source.slot,
                publication=self.config.source.publication)
        self._noted = True
        if self._spark is None:
            self._spark = build_session(self.config)
        return self._start(self._spark)


#: Longest wait for a batch to return once its query was stopped (its Spark jobs are
#: cancelled; a Delta commit in progress finishes).
_BATCH_RETURN_S: Final = 120.0


def planned_a_batch(checkpoint: str) -> bool:
    """Whether Spark planned a batch into *checkpoint* (its offset log has one)."""
    offsets = Path(checkpoint) / "offsets"
    return offsets.is_dir() and any(p.name.isdigit() for p in offsets.iterdir())


def _stop_between_batches(query: StreamingQuery, now: threading.Event) -> None:
    """Wait until no trigger is running (or until *now* is set), then stop: the last
    batch is committed whole.

    A batch that starts after the stop was requested ends the query before it does
    anything (``Pipeline._process``), so under load, with one batch right after another,
    this waits for the batch in progress only. A trigger that starts between the check
    and ``stop()`` is interrupted while it plans its batch, which is safe (the batch
    runs on the next start).
    """
    while query.isActive and query.status.get("isTriggerActive") and not now.is_set():
        time.sleep(0.05)
    query.stop()
