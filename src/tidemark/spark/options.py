"""Options of the ``tidemark`` Spark source, validated before Spark reads anything.

Spark hands a Python data source its options as strings in a case-insensitive map.
:meth:`SourceOptions.parse` turns them into one frozen, typed object or raises
:class:`tidemark.errors.ConfigError` naming the option and what it accepts; an unknown
option is an error (a typo such as ``maxChangePerTrigger`` would otherwise be ignored
silently and the query would read everything in one batch).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import Final, TypeVar

from tidemark.errors import ConfigError
from tidemark.event import TableId
from tidemark.postgres_connection import check_identifier
from tidemark.skipped_operations import names_skipped_operations, not_offered
from tidemark.source.kind import SourceKind
from tidemark.source.registry import kind_named, kind_of


class OnSchemaChange(StrEnum):
    """What a typed stream does when a table gains a column the query's schema lacks."""

    FAIL = "fail"
    """Stop the query with an error that says to restart it (the default): the restarted
    query reads the new schema and re-reads the batch, so nothing is lost."""
    DROP_NEW_COLUMNS = "drop_new_columns"
    """Keep the schema the query started with; values of new columns are dropped, and
    so are those of an older layout's column that cannot be matched to today's."""


class SnapshotMode(StrEnum):
    """Whether the stream starts a table with its existing rows."""

    NEVER = "never"
    """Only changes from the slot's position on (the default of the source)."""
    INITIAL = "initial"
    """A table the query has not taken in yet (every table on the first start, a table
    added to ``tables`` later) first gets its rows as reads (``_op = 'r'``), then its
    changes: see :mod:`tidemark.source.postgres.chunked_snapshot`."""


class RowFormat(StrEnum):
    """How an envelope stream (many tables) carries each row's values."""

    JSON = "json"
    """``key``, ``before``, ``after`` as JSON objects of PostgreSQL's text (the default)."""
    STRUCT = "struct"
    """One struct column per table with the row in the table's typed shape: no text
    round trip, the fast path for :func:`tidemark.spark.table_changes`."""
    ARROW = "arrow"
    """Each row carries a whole Arrow IPC batch of one table's typed rows: for consumers
    that collect batches to the driver (``tidemark run``); see
    :func:`tidemark.spark.change_schemas.typed_rows`."""


#: Option names as users write them (Spark compares them case-insensitively).
DSN: Final = "dsn"
TABLES: Final = "tables"
TABLE: Final = "table"
SLOT: Final = "slot"
PUBLICATION: Final = "publication"
MAX_CHANGES_PER_TRIGGER: Final = "maxChangesPerTrigger"
NUM_PARTITIONS: Final = "numPartitions"
ON_SCHEMA_CHANGE: Final = "onSchemaChange"
ARROW_BATCH_ROWS: Final = "arrowBatchRows"
ARROW_BATCH_BYTES: Final = "arrowBatchBytes"
ROW_FORMAT: Final = "rowFormat"
SERVER_TIMEOUT_MS: Final = "serverTimeoutMs"
SNAPSHOT: Final = "snapshot"
SNAPSHOT_TABLES: Final = "snapshotTables"
SNAPSHOT_CHUNK_ROWS: Final = "snapshotChunkRows"
SNAPSHOT_CHUNKS_PER_TRIGGER: Final = "snapshotChunksPerTrigger"
SIGNAL_TABLE: Final = "signalTable"
SLOT_FAILOVER: Final = "slotFailover"
SOURCE: Final = "source"
RETENTION_S: Final = "retentionS"
READER_NAME: Final = "readerName"

ALLOWED: Final = (DSN, TABLES, TABLE, SLOT, PUBLICATION, MAX_CHANGES_PER_TRIGGER,
                  NUM_PARTITIONS, ON_SCHEMA_CHANGE, ARROW_BATCH_ROWS, ARROW_BATCH_BYTES,
                  ROW_FORMAT,
                  SERVER_TIMEOUT_MS, SNAPSHOT, SNAPSHOT_TABLES, SNAPSHOT_CHUNK_ROWS,
                  SNAPSHOT_CHUNKS_PER_TRIGGER, SIGNAL_TABLE, SLOT_FAILOVER, SOURCE,
                  RETENTION_S, READER_NAME)
_BY_LOWER: Final = {name.lower(): name for name in ALLOWED}
_TABLE_NAME: Final = re.compile(r"[^.\s]+\.[^.\s]+|[^.\s]+")

DEFAULT_SLOT: Final = "tidemark_spark"
DEFAULT_PUBLICATION: Final = "tidemark_spark"
DEFAULT_ARROW_BATCH_ROWS: Final = 65_536
#: Each record batch (and each packed envelope row) is one value that Spark's JVM copies
#: whole several times; a byte cap keeps that independent of the rows' width (65,536
#: narrow change rows are about 6 MB, 65,536 rows of a 1 KB column 70 MB). Small,
#: because in a small heap every copy is a humongous object for the collector.
DEFAULT_ARROW_BATCH_BYTES: Final = 2 << 20
DEFAULT_SERVER_TIMEOUT_MS: Final = 300_000
DEFAULT_SNAPSHOT_CHUNK_ROWS: Final = 100_000
#: Chunks per micro-batch, per partition: two tasks per core keep the cores busy while
#: a task waits on PostgreSQL, and the batch (collected by ``tidemark run``) stays
#: bounded; fewer, larger tasks measured faster than more, smaller ones (Spark's cost
#: per task).
SNAPSHOT_CHUNKS_PER_PARTITION: Final = 2


@dataclasses.dataclass(frozen=True)
class SourceOptions:
    """The validated options of one ``tidemark`` stream.

    Picklable (plain values and the source's kind): a copy travels with every partition
    to the executors.
    """

    dsn: str
    """libpq connection string of the captured database (never logged: see
    :meth:`redacted_dsn`)."""
    tables: tuple[TableId, ...]
    """Captured tables. For a typed stream (``table`` set) this is just that table."""
    table: TableId | None
    """Set for a typed stream (the table's own columns); None for the envelope stream."""
    slot: str
    """Logical replication slot; one per streaming query (its position is the query's)."""
    publication: str
    """Publication for the captured tables; created, or tables added, if needed."""
    max_changes_per_trigger: int | None
    """Admission control: at most this many changes per micro-batch, rounded down to
    whole transactions (at least one transaction per batch)."""
    num_partitions: int
    """Spark partitions per micro-batch; each decodes a slice of the batch's WAL range."""
    on_schema_change: OnSchemaChange
    arrow_batch_rows: int
    """Rows per Arrow record batch handed to Spark."""
    arrow_batch_bytes: int = DEFAULT_ARROW_BATCH_BYTES
    """Bytes (Arrow's, uncompressed) per record batch handed to Spark, roughly: a batch
    ends at whichever of this and ``arrow_batch_rows`` comes first (one row at least)."""
    row_format: RowFormat = RowFormat.JSON
    """The envelope stream's row format (ignored by a typed stream)."""
    server_timeout_ms: int = DEFAULT_SERVER_TIMEOUT_MS
    """Longest wait for one answer from PostgreSQL (a query, a fetch) before the source
    fails: a stopped or cut-off server sends nothing, not even an error, and would hold
    the query forever. Generous, since decoding a large transaction of other tables
    returns no rows for a while; ``tidemark run`` restarts the failed query."""
    snapshot: SnapshotMode = SnapshotMode.NEVER
    snapshot_tables: tuple[TableId, ...] = ()
    """The tables a snapshot may bring in (``snapshotTables``; all tables by default)."""
    snapshot_chunk_rows: int = DEFAULT_SNAPSHOT_CHUNK_ROWS
    """Rows per snapshot chunk: one Spark partition reads one chunk."""
    snapshot_chunks_per_trigger: int = SNAPSHOT_CHUNKS_PER_PARTITION
    """Snapshot chunks per micro-batch (the batch's rows are at most this many chunks)."""
    signal_table: TableId | None = None
    """Debezium's signal table: an ``execute-snapshot`` row inserted there reloads the
    tables it names (see :mod:`tidemark.source.postgres.stream_signals`)."""
    slot_failover: bool | None = None
    """Create the slot as a failover slot (PostgreSQL 17+; ``slotFailover``). None: where
    the server supports it."""
    retention_s: float = 86_400.0
    """Log tables: rows every registered reader has passed are deleted once older than
    this (``retentionS``; negative: never)."""
    reader_name: str = "spark"
    """Log tables: the query's name in the database's reader registry (``readerName``;
    ``tidemark run`` names it after its checkpoint). One per query."""
    kind: str = "postgres"
    """What is read: a PostgreSQL WAL (``postgres``), a MariaDB binlog (``mariadb://``),
    or log tables (``source=logtable`` on PostgreSQL, or a ``sqlite:`` DSN); a plugin's
    kind's name."""
    kind_object: SourceKind | None = dataclasses.field(default=None, compare=False,
                                                       repr=False)
    """The kind itself (it travels with the options to the executors, whose registry
    may not know a kind registered at run time)."""

    @classmethod
    def parse(cls, raw: Mapping[str, str], *, default_partitions: int = 1,
              kinds: Sequence[SourceKind] = ()) -> SourceOptions:
        """Validate Spark's option map; every bad value raises a ConfigError naming it.
        *kinds* are asked for the DSN before the registry (the kinds the data source
        carries: registered at run time, unknown to a Spark worker's registry)."""
        values: dict[str, str] = {}
        for key, value in raw.items():
            name = _BY_LOWER.get(str(key).lower())
            if name is None and names_skipped_operations(str(key)):
                raise not_offered(str(key), "the Spark source",
                                  "filter the stream instead, e.g. "
                                  "df.where(\"_op <> 't'\")")
            if name is None:
                raise ConfigError(
                    str(key), f"unknown option of the tidemark source; allowed options are: "
                    f"{', '.join(ALLOWED)}"
                )
            values[name] = str(value)
        dsn = values.get(DSN, "").strip()
        if not dsn:
            raise ConfigError(DSN, "required: the libpq connection string of the database, "
                              "e.g. 'host=db dbname=app user=cdc'")
        requested = values.get(SOURCE, "").strip().lower() or None
        source = next((k for k in kinds if k.claims(dsn.strip().lower(), requested)), None) \
            or kind_of(dsn, requested)
        source.check_dsn(dsn, DSN)
        for option in ALLOWED:
            refusal = source.spark_option_refusal(option, values.get(option))
            if refusal is not None:
                raise ConfigError(option, refusal)
        schema = source.default_schema(dsn)
        table = _parse_table(TABLE, values[TABLE], schema) if TABLE in values else None
        tables = tuple(_parse_table(TABLES, t, schema)
                       for t in values.get(TABLES, "").split(",") if t.strip())
        if table is not None:
            if tables and tables != (table,):
                raise ConfigError(TABLES, f"a typed stream reads one table: leave out "
                                  f"'{TABLES}' or set it to '{table}' only")
            tables = (table,)
        if not tables:
            raise ConfigError(TABLES, "required: comma-separated schema.table names to "
                              "capture (or 'table' for one typed table)")
        if len(set(tables)) != len(tables):
            raise ConfigError(TABLES, "names a table more than once")
        snapshot_tables = tables
        if SNAPSHOT_TABLES in values:
            snapshot_tables = tuple(_parse_table(SNAPSHOT_TABLES, t, schema)
                                    for t in values[SNAPSHOT_TABLES].split(",") if t.strip())
            stray = [str(t) for t in snapshot_tables if t not in tables]
            if stray:
                raise ConfigError(SNAPSHOT_TABLES, f"{', '.join(stray)} not in the stream's "
                                  f"tables ({', '.join(str(t) for t in tables)})")
        num_partitions = (_positive_int(values, NUM_PARTITIONS)
                          if NUM_PARTITIONS in values else max(1, default_partitions))
        return cls(
            dsn=dsn,
            tables=tables,
            table=table,
            slot=check_identifier(SLOT, values.get(SLOT, DEFAULT_SLOT)),
            publication=check_identifier(PUBLICATION,
                                         values.get(PUBLICATION, DEFAULT_PUBLICATION)),
            max_changes_per_trigger=(_positive_int(values, MAX_CHANGES_PER_TRIGGER)
                                     if MAX_CHANGES_PER_TRIGGER in values else None),
            num_partitions=num_partitions,
            on_schema_change=_enum(values, ON_SCHEMA_CHANGE, OnSchemaChange,
                                   OnSchemaChange.FAIL),
            arrow_batch_rows=(_positive_int(values, ARROW_BATCH_ROWS)
                              if ARROW_BATCH_ROWS in values else DEFAULT_ARROW_BATCH_ROWS),
            arrow_batch_bytes=(_positive_int(values, ARROW_BATCH_BYTES)
                               if ARROW_BATCH_BYTES in values else DEFAULT_ARROW_BATCH_BYTES),
            row_format=_enum(values, ROW_FORMAT, RowFormat, RowFormat.JSON),
            server_timeout_ms=(_positive_int(values, SERVER_TIMEOUT_MS)
                               if SERVER_TIMEOUT_MS in values else DEFAULT_SERVER_TIMEOUT_MS),
            signal_table=(_parse_table(SIGNAL_TABLE, values[SIGNAL_TABLE])
                          if values.get(SIGNAL_TABLE, "").strip() else None),
            snapshot=_enum(values, SNAPSHOT, SnapshotMode, SnapshotMode.NEVER),
            snapshot_tables=snapshot_tables,
            snapshot_chunk_rows=(_positive_int(values, SNAPSHOT_CHUNK_ROWS)
                                 if SNAPSHOT_CHUNK_ROWS in values
                                 else DEFAULT_SNAPSHOT_CHUNK_ROWS),
            snapshot_chunks_per_trigger=(
                _positive_int(values, SNAPSHOT_CHUNKS_PER_TRIGGER)
                if SNAPSHOT_CHUNKS_PER_TRIGGER in values
                else SNAPSHOT_CHUNKS_PER_PARTITION * num_partitions),
            slot_failover=_bool(values, SLOT_FAILOVER),
            retention_s=_float(values, RETENTION_S, 86_400.0),
            reader_name=values.get(READER_NAME, "").strip() or "spark",
            kind=source.name,
            kind_object=source,
        )

    def redacted_dsn(self) -> str:
        """The DSN without its password, for logs and errors."""
        return self.source_kind.redact_dsn(self.dsn)

    @property
    def source_kind(self) -> SourceKind:
        """The kind of source the stream reads (:attr:`kind` names it)."""
        return self.kind_object if self.kind_object is not None else kind_named(self.kind)

    def __repr__(self) -> str:
        # dataclass's repr would print the DSN and its password.
        fields = ", ".join(f"{f.name}={getattr(self, f.name)!r}"
                           for f in dataclasses.fields(self)
                           if f.name not in ("dsn", "kind_object"))
        return f"SourceOptions(dsn={self.redacted_dsn()!r}, {fields})"


def _parse_table(key: str, text: str, default_schema: str = "public") -> TableId:
    name = text.strip()
    if not _TABLE_NAME.fullmatch(name):
        raise ConfigError(key, f"{text!r} is not a table name; expected schema.table, e.g. "
                          "public.orders")
    return TableId.parse(name, default_schema)


def _positive_int(values: Mapping[str, str], key: str) -> int:
    text = values[key].strip()
    try:
        number = int(text)
    except ValueError:
        raise ConfigError(key, f"{text!r} is not an integer; expected a whole number > 0") \
            from None
    if number <= 0:
        raise ConfigError(key, f"must be > 0, got {number}")
    return number


def _float(values: Mapping[str, str], key: str, default: float) -> float:
    if key not in values:
        return default
    try:
        return float(values[key].strip())
    except ValueError:
        raise ConfigError(key, f"{values[key]!r} is not a number of seconds") from None


def _bool(values: Mapping[str, str], key: str) -> bool | None:
    if key not in values:
        return None
    text = values[key].strip().lower()
    if text not in ("true", "false"):
        raise ConfigError(key, f"{values[key]!r} is not allowed; choose true or false")
    return text == "true"


E = TypeVar("E", bound=StrEnum)


def _enum(values: Mapping[str, str], key: str, enum: type[E], default: E) -> E:
    if key not in values:
        return default
    try:
        return enum(values[key].strip().lower())
    except ValueError:
        raise ConfigError(key, f"{values[key]!r} is not allowed; choose one of "
                          f"{', '.join(e.value for e in enum)}") from None
