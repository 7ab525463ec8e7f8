"""MariaDB's read plan for the Spark stream: micro-batches of whole binlog transactions.

Offsets are binlog positions (``file``/``pos``, with the GTID state) taken between
transactions; a batch is the stretch of binlog from the last batch's end to the server's
binlog end when Spark asks (``SHOW MASTER STATUS``: always after a commit). A binlog is
one ordered stream, so a batch is one partition: an executor dumps that stretch, decodes
it with the same code as ``tidemark capture`` and hands the change rows to the stream's
sink (:class:`tidemark.source.change_feed.ChangeFeed`), so typed streams, envelopes,
``apply_changes`` and ``tidemark run`` work unchanged. Nothing is released on commit: the
server keeps its binlog by time and size.

``snapshot = initial`` takes a table's existing rows first. MariaDB cannot share one
read view between connections, so the rows are read in the batch that starts at the
position the snapshot was planned at, by a consistent read taken when the executor runs
(at that position or later), and are ordered before every change of that batch. Every
change after the planned position is then applied after the rows: a change the rows
already hold is applied again, which an upsert by key (``apply_changes``, SCD type 1)
absorbs. An SCD type 2 history may show such a change once more as a new version.

``maxChangesPerTrigger`` ends a batch after the last whole transaction that keeps it
within the limit (a larger transaction is a batch of its own): the driver decodes the
stretch to find it. ``signalTable`` (``db.table``, Debezium's columns): an
``execute-snapshot`` signal reloads whole tables as the initial snapshot does (the
driver reads the table before each batch, as for PostgreSQL).
"""

from __future__ import annotations

import contextlib
import logging
import random
from collections.abc import Iterator, Sequence
from typing import Any, Final

from tidemark.errors import SourceError
from tidemark.event import ChangeEvent, TableId
from tidemark.source.change_feed import ChangeFeed
from tidemark.source.mariadb import client
from tidemark.source.mariadb import snapshot as snap
from tidemark.source.mariadb.change_builder import ChangeBuilder
from tidemark.source.mariadb.grants import check_grants
from tidemark.source.mariadb.position import BinlogPosition
from tidemark.source.mariadb.read_view import read_view_from
from tidemark.source.mariadb.repair_read import BinlogRepairRead, read_repair
from tidemark.source.mariadb.types import logical_type
from tidemark.source.read_plan import (
    SNAPSHOT_INITIAL,
    ChangeSink,
    ColumnLayout,
    ReadOptions,
    TableColumns,
)
from tidemark.source.repair import (
    RepairRequest,
    repair_request,
    requests_from,
    requests_json,
)
from tidemark.source.repair_keys import key_type_problem
from tidemark.source.repair_signal import RepairSignal
from tidemark.source.signal_requests import requests_in

log = logging.getLogger(__name__)

#: ``_seq`` of snapshot rows. They are read at a position between transactions: the
#: transaction that ends there has its changes at that commit position too, numbered
#: from 1 (source order), and the rows hold their result, so they sort after all of them
#: (a reload's rows below a target's mark would be dropped as applied, and the target
#: replaced by nothing).
_SNAPSHOT_SEQ: Final = 1 << 62


__all__ = ["MariaDbReadPlan", "make_read_plan", "read_view_from", "table_columns"]


def _replica_id() -> int:
    """A replica id for one dump. The server ends a dump when another connects with the
    same id, so every dump of every query takes a random one (2^31 of them)."""
    return random.randrange(1 << 20, 1 << 31)

_NO_SUCH_TABLE: Final = 1146


def _raw_connection(options: ReadOptions) -> Any:
    return client.connect(client.parse_url(options.dsn), conv=client.RAW_VALUES)


class BinlogRange:
    """One partition: the transactions between two binlog positions, and the tables whose
    rows are read first (the snapshot of this batch)."""

    def __init__(self, start: dict[str, Any], end: dict[str, Any],
                 snapshot: Sequence[str] = ()) -> None:
        self.start = start
        self.end = end
        self.snapshot = tuple(snapshot)


    def __repr__(self) -> str:
        return f"BinlogRange({self.start}, {self.end}, snapshot={list(self.snapshot)})"


def make_read_plan(options: ReadOptions) -> MariaDbReadPlan:
    """The read plan of a stream of the MariaDB server *options* name."""
    return MariaDbReadPlan(options)


class MariaDbReadPlan:
    """Micro-batches of whole MariaDB transactions (see the module docstring)."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self._settings = client.parse_url(options.dsn)
        self._target: dict[str, Any] | None = None

    def _current(self) -> BinlogPosition:
        with contextlib.closing(client.connect(self._settings)) as conn:
            return client.current_position(conn)

    def tables(self) -> dict[TableId, TableColumns]:
        """Check the server, the tables and the signal table; describe each table."""
        return table_columns(self.options)

    def initial_offset(self) -> dict[str, Any]:
        """A new query starts at the binlog's end; with ``snapshot=initial`` its tables'
        rows come first, in the first batch."""
        position = self._current()
        log.info("MariaDB stream starts at %s", position)
        tables = [str(t) for t in self.options.snapshot_tables] \
            if self.options.snapshot == SNAPSHOT_INITIAL else []
        return {**position.to_offset(), "snapshot": tables, "signals": None}

    def prepare_available_now(self) -> None:
        self._target = self._current().to_offset()

    def latest(self, start: dict[str, Any], max_changes: int | None) -> dict[str, Any]:
        """Everything written so far (a batch holding a snapshot ends where it started:
        its rows first, then the stream from there in the next batches)."""
        signals = start.get("signals")
        if start.get("snapshot"):
            # "loaded": the tables whose whole content this batch holds (tidemark run
            # replaces its targets with them instead of merging).
            return {**_position(start).to_offset(), "snapshot": [],
                    "loaded": list(start["snapshot"]), "signals": signals}
        requested: list[str] = []
        repairs: list[RepairRequest] = []
        if self.options.signal_table is not None:
            # Taken in this batch's end offset: the next batch reads the tables' rows
            # (a repair's are read in this one, after its changes).
            requested, ids, repairs = self._signals(signals)
            signals = list(ids)
        end = self._target if self._target is not None else self._current().to_offset()
        if BinlogPosition.from_offset(end).key <= _position(start).key:
            end = _position(start).to_offset()
        elif max_changes is not None:
            end = self._end_for_limit(_position(start), BinlogPosition.from_offset(end),
                                      max_changes).to_offset()
        result = {**end, "snapshot": requested, "loaded": [], "signals": signals}
        if repairs:
            result["repairs"] = requests_json(repairs)
        same = _position(start).to_offset() == end and not requested \
            and signals == start.get("signals") and not repairs
        return dict(start) if same else result

    def _signals(self, seen: list[str] | None
                 ) -> tuple[list[str], tuple[str, ...], list[RepairRequest]]:
        table = self.options.signal_table
        assert table is not None
        tables = [str(t) for t in self.options.tables]
        taken: list[RepairSignal] = []
        with contextlib.closing(client.connect(self._settings)) as conn:
            with conn.cursor() as cur:
                cur.execute(f"SELECT id, type, data FROM {snap.quote(table.schema)}."
                            f"{snap.quote(table.table)}")
                rows = cur.fetchall()
            requested, ids = requests_in(rows, None if seen is None else tuple(seen),
                                         tables, taken)
            repairs = [repair_request(s, tables, lambda name: snap.primary_key(
                conn, TableId.parse(name)), check=lambda r: key_type_problem(r, {
                    c.name: logical_type(c)
                    for c in snap.describe(conn, TableId.parse(r.table))}))
                for s in taken]
        return requested, ids, [r for r in repairs if r is not None]

    def _end_for_limit(self, start: BinlogPosition, end: BinlogPosition,
                       max_changes: int) -> BinlogPosition:
        """The end of the last whole transaction from *start* that keeps the batch within
        *max_changes* captured changes (at least one transaction, however large), found
        by decoding the binlog here on the driver."""
        wanted = {TableId.parse(str(t)) for t in self.options.tables}
        rows, held = self.options.arrow_batch_rows, self.options.arrow_batch_bytes
        builder = ChangeBuilder(name="tidemark", position=start, captured=wanted.__contains__,
                                max_rows_in_memory=rows, max_bytes_in_memory=held)
        changes = 0
        reached = start
        with client.BinlogStream(self._settings, start, server_id=_replica_id(),
                                 blocking=False) as stream, contextlib.closing(builder):
            builder.checksum = stream.checksum
            for event in stream.events():
                records = builder.handle(event)
                if records is not None:
                    count = sum(1 for chunk in builder.with_rest(records, rows, held)
                                for r in chunk if isinstance(r, ChangeEvent))
                    if changes and changes + count > max_changes:
                        return reached
                    changes += count
                    reached = builder.position
                if not builder.in_transaction and builder.position_key >= end.key:
                    return end
        return reached if changes else end

    def report_latest(self) -> dict[str, Any] | None:
        return None

    def plan(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[Any]:
        repairs = requests_from(end.get("repairs"))
        # The repairs' rows as they were at the batch's end (see repair_read).
        return [BinlogRange(start, end, start.get("snapshot") or ()),
                *([BinlogRepairRead(1, repairs, end)] if repairs else [])]

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to release: the server keeps its binlog by time and size."""

    def stop(self) -> None:
        """Nothing held between batches."""

    def read(self, partition: Any, sink: ChangeSink) -> Iterator[None]:
        """The partition's snapshot rows, then its transactions, into *sink*; or the
        rows of a batch's repairs."""
        if isinstance(partition, BinlogRepairRead):
            return read_repair(self.options, partition, sink)
        return self._read_range(partition, sink)

    def _read_range(self, partition: Any, sink: ChangeSink) -> Iterator[None]:
        assert isinstance(partition, BinlogRange)
        feed = ChangeFeed(sink)
        start, end = _position(partition.start), _position(partition.end)
        if partition.snapshot:
            yield from self._snapshot(feed, partition.snapshot, start)
        if end.key > start.key:
            yield from self._stream(feed, start, end)

    def _snapshot(self, feed: ChangeFeed, tables: Sequence[str],
                  at: BinlogPosition) -> Iterator[None]:
        conn = _raw_connection(self.options)
        with contextlib.closing(conn):
            read_view_from(conn, at)
            for events in snap.snapshot_events(
                    conn, [TableId.parse(t) for t in tables], position=at,
                    name="tidemark", fetch_size=self.options.arrow_batch_rows):
                for event in events:
                    feed.add(event, at.key, _SNAPSHOT_SEQ)
                yield
            conn.commit()

    def _stream(self, feed: ChangeFeed, start: BinlogPosition,
                end: BinlogPosition) -> Iterator[None]:
        wanted = {TableId.parse(str(t)) for t in self.options.tables}
        # A transaction larger than a few Arrow batches waits in a temporary file, not in
        # the executor's memory, and is fed chunk by chunk.
        rows, held = self.options.arrow_batch_rows, self.options.arrow_batch_bytes
        builder = ChangeBuilder(name="tidemark", position=start,
                                captured=wanted.__contains__, max_rows_in_memory=rows,
                                max_bytes_in_memory=held)
        stream = client.BinlogStream(self._settings, start, server_id=_replica_id(),
                                     blocking=True)
        with stream, contextlib.closing(builder):
            builder.checksum = stream.checksum
            stop = end.key
            for event in stream.events():
                records = builder.handle(event)
                if records is not None:
                    for chunk in builder.with_rest(records, rows, held):
                        for record in chunk:
                            if isinstance(record, ChangeEvent):
                                feed.add(record, record.lsn or 0, record.total_order)
                        yield
                if not builder.in_transaction and builder.position_key >= stop:
                    break


def table_columns(options: ReadOptions) -> dict[TableId, TableColumns]:
    """Check the server and the tables, and describe each table."""
    settings = client.parse_url(options.dsn)
    with contextlib.closing(client.connect(settings)) as conn:
        client.check_server(conn)
        check_grants(conn, settings)
        # Changes committed before this position were made under the columns read now
        # or older ones, whose names the binlog gives (tidemark.spark.column_history).
        read_at = client.current_position(conn).key
        described: dict[TableId, TableColumns] = {}
        keyless = []
        for table in options.tables:
            schema = snap.table_schema(conn, table)
            if not schema.key_indexes:
                keyless.append(str(table))
            described[table] = TableColumns(schema.columns,
                                            layout=ColumnLayout(0, read_at, None))
    if keyless:
        raise SourceError(f"table(s) {', '.join(keyless)} have no primary key: change streams "
                          "are keyed by it; add one (ALTER TABLE ... ADD PRIMARY KEY (...)) "
                          "or leave the table out")
    if options.signal_table is not None:
        check_signal_table(options)
    return described


def check_signal_table(options: ReadOptions) -> None:
    """Raise SourceError unless the signal table has Debezium's columns and is readable."""
    import pymysql.err  # noqa: PLC0415

    from tidemark.source.signals import signal_table_ddl  # noqa: PLC0415

    table = options.signal_table
    assert table is not None
    try:
        with contextlib.closing(client.connect(client.parse_url(options.dsn))) as conn, \
                conn.cursor() as cur:
            cur.execute(f"SELECT id, type, data FROM {snap.quote(table.schema)}."
                        f"{snap.quote(table.table)} LIMIT 0")
    except pymysql.err.ProgrammingError as err:
        code = err.args[0] if err.args else 0
        if code == _NO_SUCH_TABLE:
            raise SourceError(f"signal table {table} does not exist; create it with: "
                              f"{signal_table_ddl(table)}") from None
        raise SourceError(f"signal table {table} lacks Debezium's columns (id, type, data): "
                          f"expected {signal_table_ddl(table)}") from None
    except pymysql.err.OperationalError as err:
        raise SourceError(f"signal table {table} is not readable ({err.args[-1]}): GRANT "
                          "SELECT on it to the source's user") from None


def _position(offset: dict[str, Any]) -> BinlogPosition:
    return BinlogPosition.from_offset(offset)
