"""``tidemark capture``: stream change events as Debezium JSON lines to stdout."""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import TYPE_CHECKING, Any, NamedTuple

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
from tidemark.offsets.file import FileOffsetStore
from tidemark.offsets.memory import MemoryOffsetStore
from tidemark.offsets.store import OffsetStore
from tidemark.serde.debezium_json import DebeziumJsonOptions
from tidemark.source.capture_stats import CaptureStats
from tidemark.source.postgres import offset as pg_offset
from tidemark.source.postgres import session
from tidemark.source.postgres.config import (
    DecimalHandlingMode,
    PostgresSourceConfig,
    SnapshotMode,
    TimePrecisionMode,
)
from tidemark.source.postgres.pgoutput import lsn_to_str
from tidemark.source.registry import KINDS, source_kind
from tidemark.source.spi import SourceConnector

if TYPE_CHECKING:
    from prometheus_client.core import Metric

log = logging.getLogger(__name__)


def _server_position(dsn: str) -> int:
    """The end of the server's WAL: its insert position (a standby's: what it received
    or replayed)."""
    with contextlib.closing(session.connect(dsn)) as conn:
        return pg_offset.server_position(conn) or 0


@click.command()
@click.option("--dsn", envvar="TIDEMARK_DSN", required=True,
              help="PostgreSQL: a libpq connection string or URI; MariaDB: "
                   "mariadb://user:password@host:port/database; SQLite (log tables): "
                   "sqlite:///path/to/file.db (or $TIDEMARK_DSN, to keep secrets out of the "
                   "process list).")
@click.option("--source", "source", type=click.Choice(KINDS), default=None,
              help="How to capture a PostgreSQL database: from its WAL (replication, the "
                   "default) or from log tables written by triggers (logtable; see "
                   "`tidemark logtable install`). SQLite is always log tables.")
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
              show_default=True, help="Rows per chunk of an incremental snapshot.")
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
            topic_prefix: str, decimal_handling_mode: str, time_precision_mode: str,
            heartbeat_interval_ms: int, offset_flush_interval_ms: int,
            signal_table: str | None, incremental_snapshot_chunk_size: int,
            progress_interval_s: float, metrics_port: int | None) -> None:
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
    }
    store: OffsetStore = FileOffsetStore(offsets) if offsets else MemoryOffsetStore()
    chosen = _source(source_kind(dsn, source), values, tombstones=tombstones, cells=cells,
                     tasks=tasks, task_index=task_index, retention_s=retention_s,
                     saved=offsets is not None, stop_at_end=stop_at_end)
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

    progress = _progress(stats, chosen.wal_dsn, progress_interval_s)
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
            return iter(()) if current is None else capture_metrics(current,
                                                                    name=topic_prefix)
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
        elif chosen.wal_dsn is not None:
            kept = ("the replication slot is confirmed up to what was written in full, so a "
                    "restart resumes after it")
        else:
            kept = "no offset was saved (no --offsets): a restart starts over"
        # The reader may have wanted only this much (head -1), but a pipeline cannot tell
        # that from a consumer that died, so this is not a success.
        raise OutputClosedError(
            f"stdout was closed by its reader after {delivered} change event"
            f"{'' if delivered == 1 else 's'}; {kept}")


class _Source(NamedTuple):
    """What capture runs for one kind of source."""

    connector: SourceConnector
    options: DebeziumJsonOptions
    """How the events are written."""
    wal_dsn: str | None = None
    """PostgreSQL's DSN: the WAL lag of the progress line is read there, and the slot
    keeps the position without --offsets."""


def _source(kind: str, values: dict[str, Any], *, tombstones: bool, cells: bool,
            tasks: int, task_index: int, retention_s: float, saved: bool,
            stop_at_end: bool) -> _Source:
    """The connector of *kind* configured from the options (*values*), and the JSON
    options of its events."""
    topic_prefix, metadata = values["topic_prefix"], values["provide_transaction_metadata"]
    if kind == "logtable":
        from tidemark.source.logtable.task import LogTableConnector  # noqa: PLC0415

        logtable = _logtable_config(values, tasks, task_index, retention_s, saved)
        return _Source(LogTableConnector(logtable, stop_at_end=stop_at_end),
                       DebeziumJsonOptions(topic_prefix=topic_prefix,
                                           tombstones_on_delete=tombstones, cells=cells))
    if kind == "mariadb":
        # Imported here: a PostgreSQL capture's start should not pay for PyMySQL.
        from tidemark.source.mariadb.config import MariaDbSourceConfig  # noqa: PLC0415
        from tidemark.source.mariadb.task import MariaDbConnector  # noqa: PLC0415

        chosen = _mariadb_config(values)
        mariadb = MariaDbSourceConfig.from_mapping(chosen)
        return _Source(MariaDbConnector(chosen, stop_at_end=stop_at_end), DebeziumJsonOptions(
            topic_prefix=topic_prefix, decimal_handling_mode=mariadb.decimal_handling_mode,
            time_precision_mode=mariadb.time_precision_mode, tombstones_on_delete=tombstones,
            transaction_metadata=metadata))
    from tidemark.source.postgres.task import PostgresConnector  # noqa: PLC0415

    config = PostgresSourceConfig.from_mapping(values)
    # Without transaction metadata the task writes each streamed event's JSON straight
    # from the pgoutput bytes (the fused path), as the engine asks it to.
    return _Source(
        PostgresConnector(values, stop_at_lsn=_server_position(config.dsn)
                          if stop_at_end else None),
        DebeziumJsonOptions(topic_prefix=topic_prefix,
                            decimal_handling_mode=config.decimal_handling_mode,
                            time_precision_mode=config.time_precision_mode,
                            tombstones_on_delete=tombstones, transaction_metadata=metadata),
        wal_dsn=config.dsn)


def _stop(engine: Engine | None) -> None:
    """Ask *engine* to stop without waiting for it (called from its own threads)."""
    if engine is not None:
        engine.close(timeout_s=0)


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


def _progress(stats: Callable[[], CaptureStats | None], wal_dsn: str | None,
              interval_s: float) -> CaptureProgress:
    """The progress line's writer: stderr, passwords masked (a lag query's error may
    quote the connection)."""
    def write(line: str) -> None:
        click.echo(redact(line), err=True)

    if wal_dsn is None:
        return CaptureProgress(stats, interval_s, write)

    def wal_behind() -> int:
        current = stats()
        return _server_position(wal_dsn) - (current.position_lsn if current else 0)
    return CaptureProgress(stats, interval_s, write, position=lsn_to_str,
                           wal_behind=wal_behind)


#: Options that only the PostgreSQL connector has; given explicitly with a MariaDB
#: URL they are an error, not silently ignored.
_POSTGRES_ONLY = {"slot": "slot_name", "publication": "publication_name",
                  "on_slot_lost": "on_slot_lost"}
_MARIADB_KEYS = ("dsn", "table_include_list", "table_exclude_list", "snapshot_mode",
                 "provide_transaction_metadata", "topic_prefix", "decimal_handling_mode",
                 "heartbeat_interval_ms", "signal_table", "incremental_snapshot_chunk_size")


def _mariadb_config(values: dict[str, Any]) -> dict[str, Any]:
    """The MariaDB connector's settings of the options."""
    context = click.get_current_context()
    for option in _POSTGRES_ONLY:
        if context.get_parameter_source(option) is ParameterSource.COMMANDLINE:
            raise click.UsageError(f"--{option.replace('_', '-')} applies to PostgreSQL "
                                   "only; a mariadb:// source has no such setting")
    chosen = {key: values[key] for key in _MARIADB_KEYS}
    # MariaDB's default time mode is Debezium's MySQL one (time always in microseconds);
    # the option's own default is PostgreSQL's.
    if context.get_parameter_source("time_precision_mode") is ParameterSource.COMMANDLINE:
        chosen["time_precision_mode"] = values["time_precision_mode"]
    return chosen


#: Options that a log-table capture has, beside the DSN and the table list.
_LOGTABLE_UNUSED = ("slot", "publication", "on_slot_lost", "snapshot_mode",
                    "transaction_metadata", "decimal_handling_mode", "time_precision_mode",
                    "signal_table", "exclude")


def _logtable_config(values: dict[str, Any], tasks: int, task_index: int,
                     retention_s: float, saved: bool) -> dict[str, Any]:
    """The log-table connector's settings of the options (the groups of --task)."""
    from tidemark.source.logtable.layout import assign_groups  # noqa: PLC0415
    from tidemark.source.logtable.reader import open_database  # noqa: PLC0415

    context = click.get_current_context()
    for option in _LOGTABLE_UNUSED:
        if context.get_parameter_source(option) is ParameterSource.COMMANDLINE:
            raise click.UsageError(f"--{option.replace('_', '-')} does not apply to log "
                                   "tables")
    if task_index >= tasks:
        raise click.UsageError(f"--task {task_index} is not one of --tasks {tasks} (0 to "
                               f"{tasks - 1})")
    # Without --offsets nothing is saved: such a capture must not register (its position
    # would let retention delete what a real reader still needs).
    base = {"dsn": values["dsn"], "table_include_list": values["table_include_list"],
            "topic_prefix": values["topic_prefix"], "retention_s": retention_s,
            "register": saved}
    groups: tuple[int, ...] = ()
    if tasks > 1:
        db = open_database(values["dsn"])
        try:
            total = db.generations()[0].groups
        finally:
            db.close()
        split = assign_groups(total, tasks)
        if task_index >= len(split):
            raise click.UsageError(f"the log has {total} groups: at most {total} tasks")
        groups = tuple(split[task_index])
    return {**base, "groups": groups}


class OutputClosedError(TerminalError):
    """stdout was closed by its reader (``tidemark capture | head``) before the end."""


def _silence_stdout() -> None:
    """Point stdout at /dev/null: what is left in the writer's buffer (the cut batch,
    which goes nowhere anyway) is flushed again when the writer is collected and at
    exit, and each would print another BrokenPipeError."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
