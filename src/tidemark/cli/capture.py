"""``tidemark capture``: stream change events as Debezium JSON lines to stdout."""

from __future__ import annotations

import gc
import logging
import os
import signal
import sys
import time
from types import FrameType
from typing import TYPE_CHECKING, Any

import click
from click.core import ParameterSource

from tidemark.cli.capture_progress import CaptureProgress
from tidemark.cli.logs import redact
from tidemark.errors import TerminalError
from tidemark.event import ChangeEvent, Record
from tidemark.offsets.file import FileOffsetStore
from tidemark.offsets.memory import MemoryOffsetStore
from tidemark.offsets.store import OffsetStore
from tidemark.source.kind import CaptureOptionError, CaptureRequest
from tidemark.source.logtable.reader import LogTableReader
from tidemark.source.postgres.config import (
    DecimalHandlingMode,
    SnapshotMode,
    TimePrecisionMode,
)
from tidemark.source.postgres.kind import server_end
from tidemark.source.postgres.pgoutput import lsn_to_str
from tidemark.source.postgres.reader import PostgresReader
from tidemark.source.registry import KINDS, kind_of
from tidemark.source.spi import save_offset

if TYPE_CHECKING:
    from tidemark.source.mariadb.reader import MariaDbReader

log = logging.getLogger(__name__)

_WRITE_SLICE = 100


class _StopFlag:
    """Set by SIGINT/SIGTERM: finish the batch in hand, save the offset, exit."""

    def __init__(self) -> None:
        self.stop = False

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.stop = True


def _first_events(records: list[Record], lines: list[str], remaining: int
                  ) -> tuple[list[Record], list[str], bool]:
    """The records and lines up to (excluding) the change event after the first
    *remaining* ones, and whether anything was cut. A batch holds records or lines."""
    if len(lines) > remaining:
        return records, lines[:remaining], True
    events = 0
    for cut, record in enumerate(records):
        if isinstance(record, ChangeEvent):
            events += 1
            if events > remaining:
                return records[:cut], lines, True
    return records, lines, False


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
    context = click.get_current_context()
    given = frozenset(name for name in context.params
                      if context.get_parameter_source(name) is ParameterSource.COMMANDLINE)
    kind = kind_of(dsn, source)
    try:
        built = kind.capture(CaptureRequest(
            values=values, given=given, topic_prefix=topic_prefix, tombstones=tombstones,
            transaction_metadata=transaction_metadata, cells=cells, tasks=tasks,
            task_index=task_index, retention_s=retention_s,
            saves_offsets=offsets is not None))
    except CaptureOptionError as err:
        raise click.UsageError(err.text) from None
    connector: PostgresReader | MariaDbReader | LogTableReader = built.connector
    serializer = built.serializer
    flag = _StopFlag()
    signal.signal(signal.SIGINT, flag)
    signal.signal(signal.SIGTERM, flag)
    metrics = None
    if metrics_port is not None:
        # Imported only when asked for: every capture start would pay for it.
        from tidemark.metrics import serve  # noqa: PLC0415
        from tidemark.source.capture_metrics import capture_metrics  # noqa: PLC0415

        stats = connector.stats
        metrics = serve(metrics_port, lambda: capture_metrics(stats, name=topic_prefix,
                                                                plugin=kind.name))
    try:
        built.start(store, stop_at_end)
    except BaseException:
        if metrics is not None:
            metrics.close()
        raise
    # Everything allocated so far lives for the whole run; keep the collector off it.
    gc.freeze()
    # Not sys.stdout.buffer: under PYTHONUNBUFFERED (or -u) that is the raw file, whose
    # write() may write only part (a signal, a reader gone) and tell only by its return
    # value; a buffered writer writes everything or raises. (It is never closed: it
    # does not own the descriptor, and is flushed after every batch.)
    out = open(sys.stdout.fileno(), "wb", closefd=False)  # noqa: SIM115
    progress = _progress(connector, progress_interval_s)
    delivered = 0  # change events written
    started = time.monotonic()
    flush_every = offset_flush_interval_ms / 1000
    pending: dict[str, Any] | None = None
    last_save = 0.0
    closed = False

    def save(offset: dict[str, Any]) -> None:
        nonlocal last_save
        save_offset(store, connector, offset)
        connector.commit(offset)
        last_save = time.monotonic()

    try:
        while not flag.stop:
            batch = connector.poll()
            records = batch.records
            lines = batch.lines or []
            offset = batch.offset
            done = batch.finished
            if max_events is not None:
                records, lines, cut = _first_events(records, lines, max_events - delivered)
                if cut:
                    offset = None  # the batch was not delivered whole
            if records or lines:
                try:
                    # Encode in slices of ~65 kB: larger buffers are mmapped or trimmed
                    # back to the OS by malloc on every batch, and faulting that memory
                    # in again costs ~10% of the run.
                    for start in range(0, len(records), _WRITE_SLICE):
                        out.write(serializer.encode_lines(records[start:start + _WRITE_SLICE]))
                    for start in range(0, len(lines), _WRITE_SLICE):
                        out.write("".join(lines[start:start + _WRITE_SLICE]).encode())
                    out.flush()
                except BrokenPipeError:
                    # The batch may be cut anywhere: its offset is not taken, only those
                    # of the batches before it, which were written in full.
                    closed = True
                    break
                delivered += sum(1 for r in records if isinstance(r, ChangeEvent)) + len(lines)
                done = done or (max_events is not None and delivered >= max_events)
            progress.maybe_report(delivered)
            if offset is not None:
                pending = offset
            if pending is not None and (done or time.monotonic() - last_save >= flush_every):
                save(pending)
                pending = None
            if done:
                break
        if pending is not None:  # stopped by a signal or a closed stdout: all of it written
            save(pending)
    finally:
        connector.stop()
        if metrics is not None:
            metrics.close()
        elapsed = time.monotonic() - started
        log.info("delivered %d change events in %.3f s (%.0f events/s)", delivered, elapsed,
                 delivered / elapsed if elapsed > 0 else 0.0)
    if closed:
        _silence_stdout()
        if offsets:
            kept = (f"the offset of what was written in full is saved in {offsets}, so a "
                    "restart resumes after it")
        elif isinstance(connector, PostgresReader):
            kept = ("the replication slot is confirmed up to what was written in full, so a "
                    "restart resumes after it")
        else:
            kept = "no offset was saved (no --offsets): a restart starts over"
        # The reader may have wanted only this much (head -1), but a pipeline cannot tell
        # that from a consumer that died, so this is not a success.
        raise OutputClosedError(
            f"stdout was closed by its reader after {delivered} change event"
            f"{'' if delivered == 1 else 's'}; {kept}")


def _progress(connector: PostgresReader | MariaDbReader | LogTableReader,
              interval_s: float) -> CaptureProgress:
    """The progress line's writer: stderr, passwords masked (a lag query's error may
    quote the connection)."""
    def write(line: str) -> None:
        click.echo(redact(line), err=True)

    if not isinstance(connector, PostgresReader):
        return CaptureProgress(connector.stats, interval_s, write)
    stats, dsn = connector.stats, connector.config.dsn
    return CaptureProgress(stats, interval_s, write, position=lsn_to_str,
                           wal_behind=lambda: server_end(dsn) - stats.position_lsn)


class OutputClosedError(TerminalError):
    """stdout was closed by its reader (``tidemark capture | head``) before the end."""


def _silence_stdout() -> None:
    """Point stdout at /dev/null: what is left in the writer's buffer (the cut batch,
    which goes nowhere anyway) is flushed again when the writer is collected and at
    exit, and each would print another BrokenPipeError."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
