"""``tidemark capture``: stream change events as Debezium JSON lines to stdout."""

from __future__ import annotations

import gc
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import TYPE_CHECKING, Any

import click
from click.core import ParameterSource

from tidemark.cli.capture_output import JsonLinesOutput
from tidemark.cli.capture_progress import CaptureProgress
from tidemark.cli.logs import redact
from tidemark.engine.config import DeliveryMode, EngineConfig
from tidemark.engine.converters import DebeziumJsonConverter
from tidemark.engine.engine import Engine, EngineCallbacks
from tidemark.engine.state import IllegalStateError
from tidemark.errors import TerminalError
from tidemark.offsets.memory import MemoryOffsetStore
from tidemark.offsets.store import OffsetStore
from tidemark.skipped_operations import DEFAULT as SKIPPED_DEFAULT
from tidemark.source.capture_stats import CaptureStats
from tidemark.source.kind import Capture, CaptureOptionError, CaptureRequest
from tidemark.source.postgres.config import (
    DecimalHandlingMode,
    SnapshotMode,
    TimePrecisionMode,
)
from tidemark.source.registry import kind_of

if TYPE_CHECKING:
    from prometheus_client.core import Metric

log = logging.getLogger(__name__)


@click.command()
@click.option("--dsn", envvar="TIDEMARK_DSN", required=True,
              help="PostgreSQL: a libpq connection string or URI; MariaDB: "
                   "mariadb://user:password@host:port/database; SQLite (log tables): "
                   "sqlite:///path/to/file.db (or $TIDEMARK_DSN, to keep secrets out of the "
                   "process list).")
@click.option("--source", "source", default=None, metavar="KIND",
              help="How to capture a PostgreSQL database: from its WAL (replication, the "
                   "default) or from log tables written by triggers (logtable; see "
                   "`tidemark logtable install`). SQLite is always log tables. A source kind "
                   "of another package may add its own.")
@click.option("--tasks", type=click.IntRange(min=1), default=1, show_default=True,
              help="Log tables: split the stream groups over this many captures ...")
@click.option("--task", "task_index", type=click.IntRange(min=0), default=0,
              show_default=True, help="... of which this is one (0-based).")
@click.option("--cells/--no-cells", default=True, show_default=True,
              help="Log tables: write non-key columns as Scylla's cells ({\"value\": …} "
                   "set, {\"value\": null} set to NULL, null unchanged); --no-cells writes "
                   "plain values with Debezium's placeholder for unchanged ones.")
@click.option("--retention-s", type=float, default=86_400.0, show_default=True,
              help="Log tables: delete log rows that every registered reader has read once "
                   "older than this (negative: never). A capture registers (as its "
                   "--topic-prefix) only with --offsets.")
@click.option("--table", "tables", multiple=True,
              help="schema.table to capture (repeatable; a regular expression matches "
                   "several; log tables: exact names). Default: all tables (log tables: "
                   "every table with a log).")
@click.option("--exclude-table", "exclude", multiple=True, help="Regex of tables to skip.")
@click.option("--slot", default="tidemark", show_default=True, help="Replication slot.")
@click.option("--publication", default="tidemark_publication", show_default=True)
@click.option("--on-slot-lost", type=click.Choice(["fail", "resnapshot"]), default="fail",
              show_default=True,
              help="The slot the offsets need is gone or invalidated: fail with an error "
                   "naming it, or create a new slot and re-read every table with an "
                   "incremental snapshot.")
@click.option("--snapshot-mode", type=click.Choice([m.value for m in SnapshotMode]),
              default=SnapshotMode.INITIAL.value, show_default=True)
@click.option("--offsets", type=click.Path(dir_okay=False),
              help="Offsets file: resume from it and save progress to it.")
@click.option("--stop-at-end", is_flag=True,
              help="Exit once everything committed before the start is delivered.")
@click.option("--max-events", type=click.IntRange(min=1), help="Stop after N events.")
@click.option("--transaction-metadata", is_flag=True,
              help="Add the transaction block and BEGIN/END records.")
@click.option("--tombstones/--no-tombstones", default=True, show_default=True,
              help="Emit a null-value record after each delete, as Debezium does.")
@click.option("--skipped-operations", default=SKIPPED_DEFAULT, show_default=True,
              help="Debezium's skipped.operations: changes to leave out, a comma-separated "
                   "list of c (inserts), u (updates), d (deletes, with their tombstones), "
                   "t (truncates), or none. Debezium's default is t; tidemark's none.")
@click.option("--topic-prefix", default="tidemark", show_default=True,
              help="source.name of the events (Debezium's topic.prefix).")
@click.option("--decimal-handling-mode", type=click.Choice([m.value for m in DecimalHandlingMode]),
              default=DecimalHandlingMode.PRECISE.value, show_default=True)
@click.option("--time-precision-mode", type=click.Choice([m.value for m in TimePrecisionMode]),
              default=TimePrecisionMode.ADAPTIVE.value, show_default=True)
@click.option("--heartbeat-interval-ms", type=click.IntRange(min=0), default=10_000,
              show_default=True)
@click.option("--offset-flush-interval-ms", type=click.IntRange(min=0), default=1_000,
              show_default=True,
              help="Save the offset at most this often (0: after every batch). A crash "
                   "redelivers at most what came after the last save.")
@click.option("--signal-table",
              help="schema.table of Debezium's signal table (id varchar(42) PRIMARY KEY, "
                   "type varchar(32), data varchar(2048)): rows inserted there are signals, "
                   "e.g. execute-snapshot for an incremental snapshot (see tidemark signal).")
@click.option("--incremental-snapshot-chunk-size", type=click.IntRange(min=1), default=1024,
              show_default=True,
              help="Rows of an incremental snapshot's first chunk; later chunks grow "
                   "while they read fast (to 32,768 rows and about 4 MB at most).")
@click.option("--incremental-snapshot-chunk-fixed", is_flag=True,
              help="Keep every chunk of an incremental snapshot at "
                   "--incremental-snapshot-chunk-size rows (no growth).")
@click.option("--progress-interval-s", type=click.FloatRange(min=0), default=30.0,
              show_default=True,
              help="Write a progress line to stderr this often: events written and their "
                   "rate, the position and (PostgreSQL) the WAL lag; 0 for none.")
@click.option("--metrics-port", type=click.IntRange(min=0, max=65535),
              help="Serve Prometheus metrics on this port (/metrics), with Debezium's "
                   "metric names.")
def capture(dsn: str, source: str | None, tasks: int, task_index: int, cells: bool,
            retention_s: float, tables: tuple[str, ...], exclude: tuple[str, ...], slot: str,
            publication: str, on_slot_lost: str, snapshot_mode: str, offsets: str | None,
            stop_at_end: bool,
            max_events: int | None, transaction_metadata: bool, tombstones: bool,
            skipped_operations: str, topic_prefix: str, decimal_handling_mode: str,
            time_precision_mode: str,
            heartbeat_interval_ms: int, offset_flush_interval_ms: int,
            signal_table: str | None, incremental_snapshot_chunk_size: int,
            incremental_snapshot_chunk_fixed: bool, progress_interval_s: float,
            metrics_port: int | None) -> None:
    """Capture changes and write one JSON object per line: {"key": …, "value": …}.

    Key and value are what Debezium's PostgreSQL connector (or, for a mariadb:// DSN,
    its MariaDB/MySQL connector) emits through Kafka Connect's JsonConverter
    (schemas.enable=false). Ctrl-C or SIGTERM stops after the current batch and saves
    the offset.
    """
    values: dict[str, Any] = {
        "dsn": dsn, "table_include_list": list(tables), "table_exclude_list": list(exclude),
        "slot_name": slot, "publication_name": publication, "snapshot_mode": snapshot_mode,
        "on_slot_lost": on_slot_lost,
        "provide_transaction_metadata": transaction_metadata, "topic_prefix": topic_prefix,
        "decimal_handling_mode": decimal_handling_mode,
        "time_precision_mode": time_precision_mode,
        "heartbeat_interval_ms": heartbeat_interval_ms, "signal_table": signal_table,
        "incremental_snapshot_chunk_size": incremental_snapshot_chunk_size,
        "incremental_snapshot_chunk_adaptive": not incremental_snapshot_chunk_fixed,
        "skipped_operations": skipped_operations,
    }
    if offsets:
        # Imported only when asked for (tempfile, shutil): every capture start would pay.
        from tidemark.offsets.file import FileOffsetStore  # noqa: PLC0415
    store: OffsetStore = FileOffsetStore(offsets) if offsets else MemoryOffsetStore()
    context = click.get_current_context()
    given = frozenset(name for name in context.params
                      if context.get_parameter_source(name) is ParameterSource.COMMANDLINE)
    kind = kind_of(dsn, source)
    try:
        chosen = kind.capture(CaptureRequest(
            values=values, given=given, topic_prefix=topic_prefix, tombstones=tombstones,
            transaction_metadata=transaction_metadata, cells=cells, tasks=tasks,
            task_index=task_index, retention_s=retention_s,
            saves_offsets=offsets is not None, stop_at_end=stop_at_end))
    except CaptureOptionError as err:
        raise click.UsageError(err.text) from None
    # Not sys.stdout.buffer: under PYTHONUNBUFFERED (or -u) that is the raw file, whose
    # write() may write only part (a signal, a reader gone) and tell only by its return
    # value; a buffered writer writes everything or raises. (It is never closed: it
    # does not own the descriptor, and is flushed after every batch.)
    out = open(sys.stdout.fileno(), "wb", closefd=False)  # noqa: SIM115
    engine: Engine | None = None

    def stats() -> CaptureStats | None:
        tasks = engine.tasks if engine is not None else []
        found = getattr(getattr(tasks[0], "connector", None), "stats", None) if tasks else None
        return found if isinstance(found, CaptureStats) else None

    progress = _progress(stats, chosen, progress_interval_s)
    output = JsonLinesOutput(out, max_events=max_events, stop=lambda: _stop(engine))
    engine = Engine(
        chosen.connector, output,
        # The writer in the reader's thread, as one loop: writing is Python work, so a
        # thread of its own would only trade the GIL and hold a second batch.
        config=EngineConfig(delivery_mode=DeliveryMode.BATCH, worker_count=1,
                            read_ahead=False,
                            offset_flush_interval_ms=offset_flush_interval_ms,
                            # A failure ends the capture with its error, as it always has.
                            errors_max_retries=0),
        converter=DebeziumJsonConverter(chosen.options), offset_store=store,
        # Everything allocated so far lives for the whole run; keep the collector off it.
        callbacks=EngineCallbacks(task_started=lambda index: gc.freeze()))
    stopped = _on_signals(engine)
    metrics = None
    if metrics_port is not None:
        # Imported only when asked for: every capture start would pay for it.
        from tidemark.metrics import serve  # noqa: PLC0415
        from tidemark.source.capture_metrics import capture_metrics  # noqa: PLC0415

        def families() -> Iterator[Metric]:
            current = stats()
            return iter(()) if current is None else capture_metrics(
                current, name=topic_prefix, plugin=kind.name)
        metrics = serve(metrics_port, families)
    started = time.monotonic()
    finished = threading.Event()
    if progress_interval_s > 0:
        # A thread of its own: an idle stream hands the consumer nothing, and the line
        # (with the lag) matters most then.
        threading.Thread(target=_report, args=(progress, output, progress_interval_s,
                                               finished),
                         name="tidemark-progress", daemon=True).start()
    try:
        engine.run()
    except IllegalStateError:
        if not stopped.is_set():  # a signal before the engine ran: nothing to deliver
            raise
    finally:
        finished.set()
        if metrics is not None:
            metrics.close()
        elapsed = time.monotonic() - started
        delivered = output.delivered
        log.info("delivered %d change events in %.3f s (%.0f events/s)", delivered, elapsed,
                 delivered / elapsed if elapsed > 0 else 0.0)
    if output.closed:
        _silence_stdout()
        if offsets:
            kept = (f"the offset of what was written in full is saved in {offsets}, so a "
                    "restart resumes after it")
        elif chosen.slot_keeps_position:
            kept = ("the replication slot is confirmed up to what was written in full, so a "
                    "restart resumes after it")
        else:
            kept = "no offset was saved (no --offsets): a restart starts over"
        # The reader may have wanted only this much (head -1), but a pipeline cannot tell
        # that from a consumer that died, so this is not a success.
        raise OutputClosedError(
            f"stdout was closed by its reader after {delivered} change event"
            f"{'' if delivered == 1 else 's'}; {kept}")


def _stop(engine: Engine | None) -> None:
    """Ask *engine* to stop without waiting for it (called from its own threads)."""
    if engine is not None:
        engine.request_stop()


def _on_signals(engine: Engine) -> threading.Event:
    """SIGINT and SIGTERM stop *engine* after the batch in hand, saving the offset; the
    event is set once one came."""
    stopped = threading.Event()

    def handle(signum: int, frame: FrameType | None) -> None:
        stopped.set()
        # Not here: the handler runs in the main thread, which may hold the engine's
        # state lock at this moment.
        threading.Thread(target=_stop, args=(engine,), name="tidemark-signal",
                         daemon=True).start()

    signal.signal(signal.SIGINT, handle)
    signal.signal(signal.SIGTERM, handle)
    return stopped


def _report(progress: CaptureProgress, output: JsonLinesOutput, interval_s: float,
            finished: threading.Event) -> None:
    """Write the progress line every *interval_s* until *finished*."""
    while not finished.wait(min(interval_s, 1.0)):
        progress.maybe_report(output.delivered)


def _progress(stats: Callable[[], CaptureStats | None], chosen: Capture,
              interval_s: float) -> CaptureProgress:
    """The progress line's writer: stderr, passwords masked (a lag query's error may
    quote the connection)."""
    def write(line: str) -> None:
        click.echo(redact(line), err=True)

    log_behind = chosen.log_behind
    if log_behind is None:
        return CaptureProgress(stats, interval_s, write)

    def behind() -> int:
        current = stats()
        return log_behind(current.position_lsn if current else 0)
    return CaptureProgress(stats, interval_s, write, position=chosen.position_text,
                           wal_behind=behind)


class OutputClosedError(TerminalError):
    """stdout was closed by its reader (``tidemark capture | head``) before the end."""


def _silence_stdout() -> None:
    """Point stdout at /dev/null: what is left in the writer's buffer (the cut batch,
    which goes nowhere anyway) is flushed again when the writer is collected and at
    exit, and each would print another BrokenPipeError."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
