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

import contextlib
import dataclasses
import functools
import json
import logging
import os
import re
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Final, TypeVar

import psycopg
import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.query import StreamingQuery
from pyspark.sql.types import StructType

import tidemark.spark as ts
from tidemark import faults
from tidemark.errors import TerminalError
from tidemark.event import TableId
from tidemark.lake import ApplyResult, apply_changes
from tidemark.lake.delta_writer import SnapshotLoad, apply_changes_in_steps, load_in_steps
from tidemark.lake.split_apply import plan_target
from tidemark.lake.upkeep import HEAVY_TASKS, UpkeepState, upkeep
from tidemark.lake.widening import TypeChangeError
from tidemark.metrics import serve
from tidemark.pipeline import spill
from tidemark.pipeline.batch_seen import BatchSeen
from tidemark.pipeline.config import PipelineConfig, Target
from tidemark.pipeline.executor_apply import TargetWork, apply_on_executors
from tidemark.pipeline.identity import claim_checkpoint
from tidemark.pipeline.in_flight import InFlight
from tidemark.pipeline.progress import BatchReport
from tidemark.pipeline.run_metrics import RunMetrics
from tidemark.pipeline.run_record import record_batch, records_runs
from tidemark.pipeline.slot_check import check_slot_vouched
from tidemark.pipeline.written_targets import WrittenTargets
from tidemark.source.logtable.read_plan import batch_bytes as logtable_batch_bytes
from tidemark.source.postgres import wal_reads as wal
from tidemark.source.postgres.column_defaults import existing_row_values
from tidemark.source.postgres.pgoutput import lsn_to_str
from tidemark.source.postgres.snapshot_plan import SnapshotPlan
from tidemark.source.postgres.stream_offsets import SourceOffset
from tidemark.source.registry import SourceKind, source_kind
from tidemark.spark.change_schemas import arrow_schema, envelope_table_schemas, typed_rows
from tidemark.spark.options import SnapshotMode
from tidemark.spark.sources import reader_modules
from tidemark.spark.worker_warmup import warm_python_workers

log = logging.getLogger(__name__)

T = TypeVar("T")

_POLL_SECONDS = 0.2
_MAX_BACKOFF_S = 30.0


class PipelineError(TerminalError):
    """The streaming query stopped with an error (the message is Spark's first line)."""


class _StopBeforeBatch(Exception):  # noqa: N818 - not an error: how a stop ends the query
    """Raised by a batch that starts after a stop was requested (see ``_process``)."""


_STOPPED_BEFORE: Final = "stop requested before batch"


class _QuietStops(logging.Filter):
    """py4j logs an exception a batch raised, with its traceback, at ERROR: not when a
    stop ended the batch (:class:`_StopBeforeBatch`, or a batch stopped at once)."""

    def __init__(self, now: threading.Event) -> None:
        super().__init__()
        self._now = now

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.exc_info:
            return True
        return not (self._now.is_set() or isinstance(record.exc_info[1], _StopBeforeBatch))


#: The logger of py4j's callback server (a batch's exceptions).
_PY4J_CALLBACKS: Final = "py4j.clientserver"


def build_session(config: PipelineConfig) -> SparkSession:
    """The SparkSession of ``[spark]`` (or the one already running in this process)."""
    # Spark's Python workers must import this tidemark (local mode).
    # pyspark 4.3 warns about pandas 3 on every mapInArrow; tidemark's Arrow path does
    # not use pandas, so the warning would only clutter the progress lines.
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (SparkSession.builder.master(config.spark.master)
               .appName(config.spark.app_name)
               # The console progress bar would garble the per-batch lines.
               .config("spark.ui.showConsoleProgress", "false")
               # An arrow envelope row holds thousands of change rows: Spark's Arrow
               # batches for the executors' apply are cut by bytes, not only by rows.
               .config("spark.sql.execution.arrow.maxBytesPerBatch", str(64 << 20))
               # A collected batch's task results (its Arrow rows, up to collect_max_mb)
               # go to the driver with the task's status, not through the block
               # manager and a second fetch (Spark's default for that is 1 MiB); Spark
               # caps it at spark.rpc.message.maxSize.
               .config("spark.task.maxDirectResultSize", str(64 << 20)))
    for key, value in config.spark.conf.items():
        builder = builder.config(key, value)
    with _sigint_kept():
        session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    _quiet_query_failures(session)
    return session


@contextlib.contextmanager
def _sigint_kept() -> Iterator[None]:
    """Put back the SIGINT handler a new SparkContext replaces.

    pyspark's handler cancels every job and raises KeyboardInterrupt in the main thread,
    which ends the process while a batch may still be running in py4j's callback thread
    (see :mod:`tidemark.pipeline.in_flight`); ``tidemark run``'s own handler stops the
    query after the batch in progress instead.
    """
    main = threading.current_thread() is threading.main_thread()
    handler = signal.getsignal(signal.SIGINT) if main else None
    try:
        yield
    finally:
        if handler is not None:
            signal.signal(signal.SIGINT, handler)


def _quiet_query_failures(session: SparkSession) -> None:
    """Spark logs a failed query's whole trace (JVM and Python, ~50 lines) at ERROR;
    the pipeline reports the failure itself in one line, and retries it when
    PostgreSQL was only unreachable, so that log would only bury the message."""
    try:
        jvm = session.sparkContext._jvm
        assert jvm is not None
        # Only the class that logs a query's end: the package's warnings stay.
        jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(
            "org.apache.spark.sql.execution.streaming.runtime.MicroBatchExecution",
            jvm.org.apache.logging.log4j.Level.OFF)
    except Exception as err:  # only logging: never fail the pipeline for it
        log.debug("could not quiet Spark's query-failure log: %s", err)


class Pipeline:
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
        self._slot_checked = False
        self._stop_now = threading.Event()
        self._in_flight = InFlight()
        self._streaming = False
        self._query_id: str | None = None
        self._conn: psycopg.Connection[Any] | None = None
        self._schemas: dict[str, StructType] | None = None
        self._written: WrittenTargets | None = None
        self._spill_path: Path | None = None
        self._upkeep_state: dict[str, UpkeepState] = {}
        self._batches_applied = 0
        self._metrics = RunMetrics(config.spark.app_name)
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
        claim_checkpoint(self.config)
        try:
            return self._start_query()
        except PySparkException as err:
            # The source checks the database when the stream is loaded; its error comes
            # back wrapped in a Python traceback inside a Spark exception.
            raise PipelineError(_message(err)) from None

    def _start(self, spark: SparkSession) -> StreamingQuery:
        source = self.config.source
        # A replication slot and publication exist only where the WAL is read; a log's
        # reader registry knows the pipeline by its checkpoint.
        replication = {"readerName": f"run:{os.path.abspath(self.config.checkpoint)}"} \
            if self._kind == "logtable" else {
            "slot": source.slot, "publication": source.publication}
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
            modules = list(reader_modules(self._kind))
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
        options: dict[str, Any] = {"snapshotChunkRows": source.snapshot_chunk_rows}
        if source.signal_table is not None:
            options["signalTable"] = source.signal_table
        if source.slot_failover is not None and self._kind != "logtable":
            options["slotFailover"] = str(source.slot_failover).lower()
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
        # Before the run is recorded in the checkpoint, Spark plans a batch into it or
        # the source creates a slot: another pipeline's checkpoint must stay untouched.
        claim_checkpoint(self.config)
        quiet = _QuietStops(self._stop_now)
        logging.getLogger(_PY4J_CALLBACKS).addFilter(quiet)
        try:
            self._run()
        finally:
            logging.getLogger(_PY4J_CALLBACKS).removeFilter(quiet)

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
                    message = _message(err)
                    if self._stop_now.is_set() or (self._stop.is_set()
                                                   and _STOPPED_BEFORE in str(err)):
                        # How the stop ended the query, not a failure: the batch that
                        # did not finish runs again on the next start.
                        log.info("stopped (%s)", message)
                        return
                    if not _source_unavailable(err) or self._stop.is_set():
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
            if self._conn is not None:
                self._conn.close()

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
        if self._kind == "postgres" and not self._slot_checked:
            # Once per run: a query restarted after an outage reads a slot it advanced.
            check_slot_vouched(self.config.dsn, self.config.source.slot,
                               self.config.checkpoint)
            self._slot_checked = True
        if self._spark is None:
            self._spark = build_session(self.config)
        return self._start(self._spark)

    # -- the micro-batch, on the driver ------------------------------------------------
    def _process(self, batch: DataFrame, batch_id: int) -> None:
        if self._stop.is_set():
            # Under load the next trigger starts as soon as a batch is committed, so
            # there may be no moment between batches to stop in. Failing the batch
            # before it has done anything ends the query there: it is planned in the
            # checkpoint, not committed, and runs on the next start.
            raise _StopBeforeBatch(f"{_STOPPED_BEFORE} {batch_id} (it runs on the next "
                                   "start)")
        with self._in_flight.batch():
            self._process_batch(batch, batch_id)

    def _process_batch(self, batch: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        raw_offset = _batch_offset(self.config.checkpoint, batch_id)
        offset = None if self._kind != "postgres" else SourceOffset.parse(raw_offset)
        # A MariaDB or log-table batch that holds a table's snapshot holds only its rows
        # ("loaded").
        loads: dict[str, SnapshotLoad] = (
            dict.fromkeys(raw_offset.get("loaded", ()), "replace") if offset is None
            else snapshot_loads(offset.snapshot))
        if self._schemas is None:
            self._schemas = envelope_table_schemas(batch.schema)
        size = self._batch_bytes(batch_id, raw_offset, offset)
        if self.config.spark.apply_on == "executors":
            self._process_on_executors(batch, batch_id, raw_offset, offset, loads, size,
                                       started)
            return
        limit = self.config.spark.collect_max_mb << 20
        if size is None or size > limit:
            inputs = self._spilled(batch, batch_id, size)
        else:
            inputs = self._collected(batch, batch_id)
        timings = [f"read {time.monotonic() - started:.2f} s"]
        seen = BatchSeen()
        changes: dict[str, int] = {}
        replayed: list[str] = []
        try:
            for target in self.config.targets:
                rows = inputs.pop(target.table)
                load = loads.get(target.table)
                step_started = time.monotonic()
                result = self._apply(target, rows, load, batch_id, seen)
                timings.append(f"{target.table} {time.monotonic() - step_started:.2f} s")
                if result is None:
                    changes[target.table] = 0
                    continue
                faults.crash_point("between_targets", batch_id)
                changes[target.table] = 0 if result.already_applied else \
                    seen.rows.get(target.table, 0)
                if result.already_applied:
                    replayed.append(target.table)
        finally:
            if self._spill_path is not None:
                spill.remove(self._spill_path)
                self._spill_path = None
        self._finish(batch_id, changes, replayed, seen, timings, offset, raw_offset, started)

    def _process_on_executors(self, batch: DataFrame, batch_id: int,
                              raw_offset: dict[str, Any], offset: SourceOffset | None,
                              loads: dict[str, SnapshotLoad], size: int | None,
                              started: float) -> None:
        """Apply the batch on the executors (:mod:`tidemark.pipeline.executor_apply`):
        the driver plans each target and commits the parts of split ones."""
        with self._changelog_first(batch, batch_id) as rows:
            self._apply_on_executors(rows, batch_id, raw_offset, offset, loads, size,
                                     started)

    def _apply_on_executors(self, batch: DataFrame, batch_id: int,
                            raw_offset: dict[str, Any], offset: SourceOffset | None,
                            loads: dict[str, SnapshotLoad], size: int | None,
                            started: float) -> None:
        assert self._schemas is not None
        faults.crash_point("after_read", batch_id)
        written = self._written_targets()
        written.check(self.config.targets, identity=False)  # deleted while the query runs
        parts = self._apply_parts(size)
        changes: dict[str, int] = {}
        replayed: list[str] = []
        work: list[TargetWork] = []
        for target in self.config.targets:
            typed = self._schemas[target.table]
            try:
                plan = plan_target(
                    target.path, target.spec, arrow_schema(typed),
                    app_id=self._app_id(target), version=batch_id, parts=parts,
                    step_rows=self.config.spark.apply_step_rows,
                    step_bytes=self.config.spark.apply_step_mb << 20,
                    snapshot_load=loads.get(target.table),
                    storage_options=target.storage_options,
                    new_column_values=functools.partial(self._existing_row_values,
                                                        target.table))
            except TypeChangeError as err:
                raise PipelineError(f"{target.table}: {err}") from None
            if isinstance(plan, ApplyResult):
                changes[target.table] = 0
                replayed.append(target.table)
                continue
            work.append(TargetWork(target.table, typed, plan, functools.partial(
                existing_row_values_of, self.config.dsn, self._catalog, target.table)))
        planned = time.monotonic()
        outcomes = apply_on_executors(batch, work)
        seen = BatchSeen()
        targets = {t.table: t for t in self.config.targets}
        for item in work:
            outcome = outcomes.get(item.table)
            changes[item.table] = 0
            if outcome is None:
                if item.plan.snapshot_load == "replace":
                    # An empty table's snapshot: no task had rows, and the target must
                    # still become (or be replaced by) the empty table.
                    apply_changes(item.plan.uri, arrow_schema(item.schema).empty_table(),
                                  item.plan.spec, app_id=item.plan.app_id,
                                  version=batch_id, snapshot_load="replace",
                                  storage_options=item.plan.storage_options)
                    written.record(targets[item.table])
                continue
            seen.merge(outcome.seen)
            if outcome.result.already_applied:
                replayed.append(item.table)
            else:
                changes[item.table] = outcome.seen.rows.get(item.table, 0)
            written.record(targets[item.table])
        split = {t: o.parts for t, o in outcomes.items() if o.parts > 1}
        timings = [f"plan {planned - started:.2f} s",
                   f"executors {time.monotonic() - planned:.2f} s"
                   + (f" ({', '.join(f'{t} in {n} parts' for t, n in split.items())})"
                      if split else "")]
        self._finish(batch_id, changes, replayed, seen, timings, offset, raw_offset, started)

    def _apply_parts(self, size: int | None) -> int:
        """How many parts a target's batch may be split into: ``spark.apply_parts``
        (default: Spark's default parallelism), one per ``spark.apply_part_mb`` of
        source log."""
        most = self.config.spark.apply_parts
        if most is None:
            spark = self._spark
            most = spark.sparkContext.defaultParallelism if spark is not None else 1
        per_part = self.config.spark.apply_part_mb << 20
        if size is None or not per_part:
            return most
        return max(1, min(most, size // per_part))

    def _finish(self, batch_id: int, changes: dict[str, int], replayed: list[str],
                seen: BatchSeen, timings: list[str], offset: SourceOffset | None,
                raw_offset: dict[str, Any], started: float) -> None:
        """What follows a batch's writes: the crash point, upkeep, the report."""
        faults.crash_point("after_write", batch_id)
        applied = time.monotonic() - started
        upkeep = self._upkeep([t for t in self.config.targets if changes.get(t.table)])
        report = self._report(batch_id, changes, applied, replayed, seen.newest_commit_us,
                              offset, raw_offset)
        report = dataclasses.replace(report, upkeep=upkeep)
        log.info("batch %d applied: %s", batch_id, changes)
        log.debug("batch %d took %.2f s: %s", batch_id, applied, ", ".join(timings))
        self._metrics.observe(report, 0 if replayed else len(seen.commits))
        self._batches_applied += 1
        record_batch(self.config.checkpoint, report)  # for tidemark status
        if self._on_batch is not None:
            self._on_batch(report)

    def _upkeep(self, targets: Sequence[Target]) -> tuple[tuple[str, str, str], ...]:
        """Upkeep of the targets the batch wrote to, between this batch and the next
        (compaction or vacuum of one target at most, so a batch waits for one at most).
        A failure is logged: the batch is committed, and the next batch tries again."""
        done: list[tuple[str, str, str]] = []
        heavy = True
        for target in targets:
            state = self._upkeep_state.setdefault(target.table, UpkeepState())
            try:
                table = DeltaTable(target.path, storage_options=target.storage_options)
                tasks = upkeep(table, target.upkeep, state,
                               keys=target.spec.keys, heavy=heavy)
            except Exception as err:
                log.warning("upkeep of %s failed (the batch is committed; the next batch "
                            "tries again): %s", target.path, err)
                continue
            heavy = heavy and not any(t.name in HEAVY_TASKS for t in tasks)
            done += [(target.table, task.name, str(task)) for task in tasks]
        return tuple(done)

    def _read_once(self, batch: DataFrame, batch_id: int,
                   read: Callable[[DataFrame], T]) -> T:
        """*read* the batch (a Spark action), the change log written first."""
        with self._changelog_first(batch, batch_id) as rows:
            result = read(rows)
            faults.crash_point("after_read", batch_id)
        return result

    @contextlib.contextmanager
    def _changelog_first(self, batch: DataFrame, batch_id: int) -> Iterator[DataFrame]:
        """Write the change log (if there is one) first, then give what the batch is read
        from: the change log's files, so the source is read once (the batch, without one).
        Spark's cache of the batch did that before, but it builds blocks of 10,000 rows
        in the heap, whatever their width: a 1 GB transaction of 1 KB rows overflowed a
        512 MB heap."""
        if not self.config.changelog:
            yield batch
            return
        path = self._write_changelog(batch, batch_id)
        yield batch.sparkSession.read.schema(batch.schema).parquet(str(path))

    def _collected(self, batch: DataFrame, batch_id: int) -> dict[str, pa.Table]:
        """Every target's rows of the batch, brought to the driver in one Spark action."""
        # One action gives every table's rows and the batch's statistics.
        envelope = self._read_once(batch, batch_id, DataFrame.toArrow)
        assert self._schemas is not None
        return {t.table: typed_rows(envelope, t.table, self._schemas[t.table])
                for t in self.config.targets}

    def _spilled(self, batch: DataFrame, batch_id: int,
                 size: int | None) -> dict[str, Iterator[pa.Table]]:
        """Every target's rows of the batch as pieces read from the executors' spill."""
        path = spill.spill_dir(self.config.checkpoint, batch_id)
        step = self.config.spark.apply_step_rows
        log.info("batch %d spans %s of source log (spark.collect_max_mb = %d): the "
                 "executors write it to %s and it is applied in steps of %d rows or %d MB",
                 batch_id, "an unknown amount" if size is None else f"{size / 2**20:.0f} MB",
                 self.config.spark.collect_max_mb, path, step,
                 self.config.spark.apply_step_mb)
        self._read_once(batch, batch_id, lambda rows: spill.spill(rows, path))
        self._spill_path = path
        assert self._schemas is not None
        # What toArrow() would give (pyspark 4.3's DataFrame.toArrow).
        large = batch.sparkSession.conf.get("spark.sql.execution.arrow.useLargeVarTypes")
        envelope = to_arrow_schema(batch.schema, error_on_duplicated_field_names_in_struct=True,
                                   timezone="UTC", prefers_large_types=large == "true")
        return {t.table: spill.table_pieces(path, t.table, self._schemas[t.table], envelope,
                                            step, self.config.spark.apply_step_mb << 20)
                for t in self.config.targets}

    def _apply(self, target: Target, rows: pa.Table | Iterator[pa.Table],
               load: SnapshotLoad | None, batch_id: int, seen: BatchSeen) -> ApplyResult | None:
        """Apply one target's rows of the batch (a table, or pieces of a spilled batch);
        None when there was nothing to apply."""
        if isinstance(rows, pa.Table):
            # A collected batch too is applied in steps: its log can be far smaller than
            # its rows (values PostgreSQL compressed: 586 MB of rows in 10 MB of WAL).
            rows = spill.pieces([rows], self.config.spark.apply_step_rows,
                                self.config.spark.apply_step_mb << 20)
        pieces = seen.count(target.table, rows)
        first = next(pieces, None)
        if first is None and load == "replace":
            # An empty table's snapshot still replaces (or creates) the target.
            assert self._schemas is not None
            first = arrow_schema(self._schemas[target.table]).empty_table()
        if first is None or (not first.num_rows and load != "replace"):
            return None
        written = self._written_targets()
        written.check((target,), identity=False)  # deleted while the query runs
        new_column_values = functools.partial(self._existing_row_values, target.table)
        try:
            stream = _crash_between_steps(spill.first_then(first, pieces), batch_id)
            del first  # the stream lets go of it once applied, like any other piece
            if load is not None:  # a snapshot's rows: written, not merged
                result = load_in_steps(
                    target.path, stream, target.spec, app_id=self._app_id(target),
                    version=batch_id, how=load, new_column_values=new_column_values,
                    storage_options=target.storage_options)
            else:
                result = apply_changes_in_steps(
                    target.path, stream, target.spec,
                    app_id=self._app_id(target), version=batch_id,
                    storage_options=target.storage_options,
                    new_column_values=new_column_values)
        except TypeChangeError as err:
            raise PipelineError(f"{target.table}: {err}") from None
        except (MemoryError, DeltaError) as err:
            if isinstance(err, DeltaError) and "Resources exhausted" not in str(err):
                raise
            raise PipelineError(
                f"batch {batch_id} could not be applied to {target.path}: {err} (after "
                f"{seen.rows.get(target.table, 0)} change rows of {target.table}, "
                f"transactions committing up to {seen.last_commit(self._position_text)}); "
                f"lower "
                f"spark.apply_step_rows (now {self.config.spark.apply_step_rows}), "
                f"spark.apply_step_mb (now {self.config.spark.apply_step_mb}) or "
                "spark.collect_max_mb, or give the driver more memory. Nothing of the "
                "batch was committed: the pipeline resumes from its checkpoint and "
                "applies it again") from None
        written.record(target)
        return result

    @property
    def _kind(self) -> SourceKind:
        return source_kind(self.config.dsn, self.config.source.kind)

    @property
    def _catalog(self) -> bool:
        """The source is a PostgreSQL database whose catalog tells column defaults."""
        return self._kind == "postgres" or (self._kind == "logtable"
                                            and not self.config.dsn.startswith("sqlite:"))

    def _batch_bytes(self, batch_id: int, raw_offset: dict[str, Any],
                     offset: SourceOffset | None) -> int | None:
        """How many bytes of source log the batch spans; None when unknown (the batch
        is then spilled, the safe choice)."""
        if raw_offset.get("loaded") or (offset is not None and offset.snapshot is not None
                                        and offset.snapshot.chunks):
            # Tables' rows (a snapshot's, up to a whole table): the log tells nothing of
            # their bytes.
            return None
        if self._kind == "logtable":
            # Log rows are as wide as the captured rows: their count says nothing of
            # their bytes, so the database is asked.
            start = spill.previous_offset(self.config.checkpoint, batch_id)
            if start is None:
                return None
            try:
                return logtable_batch_bytes(self.config.dsn, self.config.tables, start,
                                            raw_offset)
            except Exception as err:  # only sizing: the spill is the safe choice
                log.warning("cannot size batch %d in the log tables (it is spilled): %s",
                            batch_id, err)
                return None
        size = spill.batch_log_bytes(self.config.checkpoint, batch_id, raw_offset,
                                     self._log_position)
        if size is None and offset is not None:
            size = self._first_batch_bytes(offset.lsn)
        return size

    def _first_batch_bytes(self, end: int) -> int | None:
        """The WAL a query's first batch spans: from the slot (where the source starts a
        new query) to *end*; None when the slot cannot be read."""
        try:
            if self._conn is None or self._conn.closed:
                self._conn = wal.connect(self.config.dsn, purpose="progress")
            return max(0, end - wal.slot_position(self._conn, self.config.source.slot))
        except Exception as err:  # only sizing: the spill is the safe choice
            log.debug("cannot read the slot's position: %s", err)
            return None

    def _position_text(self, position: int) -> str:
        if self._kind == "logtable":
            return f"log position {position}"
        return f"binlog {position >> 32}:{position & 0xFFFFFFFF}" if self._kind == "mariadb" \
            else lsn_to_str(position)

    def _log_position(self, offset: dict[str, Any]) -> int:
        """A batch end's position in the source's log, as a number of bytes."""
        if self._kind == "mariadb":
            from tidemark.source.mariadb.position import BinlogPosition  # noqa: PLC0415

            return BinlogPosition.from_offset(offset).key
        return SourceOffset.parse(offset).lsn

    def _existing_row_values(self, table: str, columns: Sequence[str]) -> dict[str, Any]:
        return existing_row_values_of(self.config.dsn, self._catalog, table, columns)

    def _written_targets(self) -> WrittenTargets:
        if self._written is None:
            self._written = WrittenTargets(self.config.checkpoint)
        return self._written

    def _write_changelog(self, batch: DataFrame, batch_id: int) -> Path:
        # One directory per batch, overwritten on replay: a batch replayed after a crash
        # replaces its own files instead of adding a second copy (readable as one
        # Parquet dataset partitioned by batch_id). Row groups sized as the spill's.
        path = Path(self.config.changelog or "") / f"batch_id={batch_id}"
        batch.write.mode("overwrite").options(**spill.ROW_GROUP_OPTIONS).parquet(str(path))
        return path

    def _app_id(self, target: Target) -> str:
        if self._query_id is None:
            self._query_id = _checkpoint_query_id(self.config.checkpoint)
        return f"tidemark-{self._query_id}-{target.table}"

    def _report(self, batch_id: int, changes: dict[str, int], seconds: float,
                replayed: list[str], newest_commit_us: int | None,
                offset: SourceOffset | None, raw_offset: dict[str, Any]) -> BatchReport:
        lag_bytes = 0
        try:
            if self._kind == "logtable":
                lag_bytes = _log_table_lag(self.config.dsn, raw_offset)
            elif offset is None:
                lag_bytes = _binlog_lag(self.config.dsn, raw_offset)
            else:
                if self._conn is None or self._conn.closed:
                    self._conn = wal.connect(self.config.dsn, purpose="progress")
                lag_bytes = max(0, wal.flush_lsn(self._conn) - offset.lsn)
        except Exception as err:  # progress must never fail the batch
            log.warning("cannot measure the lag behind the source: %s", err)
        # The age of the newest commit this batch applied (commit to Delta, end to end).
        # An empty batch means no captured change was committed up to its end, so the
        # pipeline is not behind in time even if other WAL (other tables, checkpoints)
        # makes the byte lag non-zero.
        lag_seconds = 0.0
        if newest_commit_us is not None:
            lag_seconds = max(0.0, time.time() - newest_commit_us / 1e6)
        snapshot = "" if offset is None or offset.snapshot is None else \
            offset.snapshot.progress(self.config.source.snapshot_chunk_rows)
        return BatchReport(batch_id=batch_id, changes=changes, seconds=seconds,
                           lag_bytes=lag_bytes, lag_seconds=lag_seconds,
                           replayed=tuple(replayed), snapshot=snapshot)


def _log_table_lag(dsn: str, end: dict[str, Any]) -> int:
    """The log written after a batch's end, in the bytes the sizing counts per change."""
    from tidemark.source.logtable.reader import open_database  # noqa: PLC0415

    with contextlib.closing(open_database(dsn)) as db:
        return max(0, db.clock() - int(end.get("clock", 0))) * _LOG_ROW_BYTES


def existing_row_values_of(dsn: str, catalog: bool, table: str,
                           columns: Sequence[str]) -> dict[str, Any]:
    """The values the source's existing rows hold in *columns*, new to the target (a
    module function: executors call it too); without a PostgreSQL *catalog* to ask
    (MariaDB, SQLite), none: new columns start null in Delta's older rows."""
    if not catalog:
        return {}
    with contextlib.closing(wal.connect(dsn, purpose="catalog")) as conn:
        return existing_row_values(conn, TableId.parse(table), columns)


def _crash_between_steps(pieces: Iterator[pa.Table], batch_id: int) -> Iterator[pa.Table]:
    """*pieces*, with :mod:`tidemark.faults`' ``between_steps`` point when the third is
    asked for: the first two are merged into the target's branch by then."""
    for n, piece in enumerate(pieces):
        if n == 2:
            faults.crash_point("between_steps", batch_id)
        yield piece


#: Bytes a log-table change is taken to span in the lag behind the log (an estimate,
#: for progress only: batches are sized by the database, :func:`logtable_batch_bytes`).
_LOG_ROW_BYTES: Final = 256

#: Longest wait for a batch to return once its query was stopped (its Spark jobs are
#: cancelled; a Delta commit in progress finishes).
_BATCH_RETURN_S: Final = 120.0


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


def _checkpoint_query_id(checkpoint: str) -> str:
    """The query id Spark stores in ``<checkpoint>/metadata`` (stable across restarts)."""
    text = (Path(checkpoint) / "metadata").read_text(encoding="utf-8")
    return str(json.loads(text.splitlines()[0])["id"])


def _batch_offset(checkpoint: str, batch_id: int) -> dict[str, Any]:
    """The batch's end offset from Spark's offset log (written before the batch runs)."""
    lines = (Path(checkpoint) / "offsets" / str(batch_id)).read_text(
        encoding="utf-8").splitlines()
    offset: dict[str, Any] = json.loads(lines[-1])
    return offset


def _binlog_lag(dsn: str, end: dict[str, Any]) -> int:
    """Bytes of binlog written after a MariaDB batch's end (0 across a file switch)."""
    from tidemark.source.mariadb import client  # noqa: PLC0415
    from tidemark.source.mariadb.position import BinlogPosition  # noqa: PLC0415

    with contextlib.closing(client.connect(client.parse_url(dsn))) as conn:
        now = client.current_position(conn)
    done = BinlogPosition.from_offset(end)
    return max(0, now.pos - done.pos) if now.file == done.file else 0


def snapshot_loads(plan: SnapshotPlan | None) -> dict[str, SnapshotLoad]:
    """How each table's rows of a batch holding snapshot chunks go into Delta.

    While a table's snapshot runs, its batches hold only its snapshot's rows (the
    stream drops its earlier changes and stops at the snapshot's point), in key order:
    the first chunk of a generation replaces the target's content, the later ones hold
    keys no earlier chunk held, so neither needs a merge.
    """
    if plan is None:
        return {}
    loads: dict[str, SnapshotLoad] = {}
    for chunk in plan.chunks:
        if chunk.after is None:
            loads[chunk.table] = "replace"
        else:
            loads.setdefault(chunk.table, "append")
    return loads


_TIDEMARK_ERROR = re.compile(r"tidemark\.[\w.]*?(?:Error|Exception): (.+)")
#: The last line of a Python traceback: ``package.module.SomeError: message``.
_RAISED = re.compile(r"^\s*(?:[\w]+\.)*(\w*(?:Error|Exception|Shutdown|Failure)): (.+)$",
                     re.MULTILINE)
#: What PostgreSQL being down, restarting or cut off looks like, from psycopg, libpq and
#: tidemark's own connect errors, inside a Spark exception's text.
_UNAVAILABLE = re.compile(
    r"SourceUnavailableError|AdminShutdown|CannotConnectNow|ConnectionFailure|"
    r"OperationalError|terminating connection due to administrator command|"
    r"server closed the connection unexpectedly|the database system is (?:starting up|"
    r"shutting down|in recovery mode|not yet accepting connections)|Connection refused|"
    r"connection is (?:lost|closed)|consuming input failed|could not receive data from server|"
    r"SSL SYSCALL error|EOF detected|ServerTimeoutError|"
    # A snapshot's export ended with its connection: the restarted query starts the
    # snapshot's next generation.
    r"SnapshotLostError")


def _source_unavailable(err: BaseException) -> bool:
    """True if the query failed because PostgreSQL could not be reached."""
    with contextlib.suppress(Exception):
        return bool(_UNAVAILABLE.search(str(err)))
    return False


def _message(err: BaseException) -> str:
    """The tidemark error inside a Spark exception's text, else its first line."""
    with contextlib.suppress(Exception):
        text = str(err).strip()
        found = _TIDEMARK_ERROR.findall(text)
        if found:
            return str(found[-1]).strip()
        # A Python traceback from the source or a batch: its last "SomeError: message"
        # line says what happened; the first line is only "Traceback (most recent …".
        raised = _RAISED.findall(text)
        if raised:
            name, message = raised[-1]
            return f"{name}: {message.strip()}"
        return text.splitlines()[0] if text else type(err).__name__
    return type(err).__name__
