"""Configuration of the MariaDB connector, validated when it is built.

Keys follow Debezium's MariaDB/MySQL connectors with ``_`` for ``.``
(``database_include_list`` for ``database.include.list``), as the PostgreSQL
connector's do. Every invalid value raises :class:`tidemark.errors.ConfigError` naming
the key and what it accepts.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from tidemark.config_mapping import struct_from_mapping
from tidemark.errors import ConfigError
from tidemark.event import Op, TableId
from tidemark.serde.modes import DecimalHandlingMode, TimePrecisionMode
from tidemark.skipped_operations import DEFAULT as SKIPPED_DEFAULT
from tidemark.skipped_operations import parse_skipped_operations
from tidemark.source.mariadb.client import ConnectionSettings, parse_url
from tidemark.source.postgres.config import SnapshotMode

__all__ = ["MariaDbSourceConfig", "SnapshotMode"]

_QUALIFIED = re.compile(r"[^.`\s]+\.[^.`\s]+")

#: Databases that hold the server's own tables, never captured.
SYSTEM_DATABASES = frozenset({"mysql", "information_schema", "performance_schema", "sys"})


class MariaDbSourceConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Settings of one MariaDB capture. Build it with :meth:`from_mapping`."""

    dsn: str
    """``mariadb://user:password@host:port/database``: the server, and (optionally) the
    database whose tables are captured by default."""
    database_include_list: tuple[str, ...] = ()
    """Databases to capture (regular expressions); default: the DSN's database, or every
    non-system database when the DSN names none."""
    table_include_list: tuple[str, ...] = ()
    """``database.table`` names or regular expressions matched against the whole name."""
    table_exclude_list: tuple[str, ...] = ()
    server_id: int = 0
    """The replica id tidemark announces (``server_id`` must be unique among a server's
    replicas); 0 derives a stable one from the DSN in 5400-6399."""
    snapshot_mode: SnapshotMode = SnapshotMode.INITIAL
    decimal_handling_mode: DecimalHandlingMode = DecimalHandlingMode.PRECISE
    time_precision_mode: TimePrecisionMode = TimePrecisionMode.ADAPTIVE_TIME_MICROSECONDS
    topic_prefix: str = "tidemark"
    """Debezium's ``topic.prefix``: the ``source.name`` of every event."""
    provide_transaction_metadata: bool = False
    skipped_operations: str = SKIPPED_DEFAULT
    """Debezium's ``skipped.operations``: the changes left out while streaming, a
    comma-separated list of ``c``, ``u``, ``d``, ``t`` or ``none`` (tidemark's default;
    Debezium's is ``t``: see :mod:`tidemark.skipped_operations`)."""
    heartbeat_interval_ms: int = 5_000
    """How often the server sends a heartbeat on an idle stream; a stream silent for
    three of them is taken for dead and reopened."""
    max_batch_events: int = 10_000
    """Largest number of change events handed on together (whole transactions, unless
    one is larger than max_transaction_rows_in_memory)."""
    max_transaction_rows_in_memory: int = 10_000
    """Rows of an open transaction held in memory until its commit (checked per rows
    event, which holds up to about 8 KB of rows); a larger one keeps the rest in a
    temporary file (the binlog's bytes: about what it took in the binlog) and is handed
    on in batches of max_batch_events, its offset with the last one."""
    snapshot_fetch_size: int = 10_000
    reconnect_max_attempts: int = 10
    reconnect_backoff_ms: int = 500
    signal_table: str | None = None
    """``database.table`` of Debezium's signal table (``id varchar(42) PRIMARY KEY, type
    varchar(32), data varchar(2048)``): an insert there is a signal, read from the
    binlog; ``execute-snapshot`` re-reads tables chunk by chunk while the stream goes on
    (an incremental snapshot)."""
    incremental_snapshot_chunk_size: int = 1024
    """Rows of the first chunk of an incremental snapshot (one consistent read each);
    later chunks grow while they are cheap to read (see
    :mod:`tidemark.source.chunk_size`)."""
    incremental_snapshot_chunk_adaptive: bool = True
    """Let chunks grow from ``incremental_snapshot_chunk_size``; false pins them to it."""

    def __post_init__(self) -> None:
        parse_url(self.dsn)
        parse_skipped_operations(self.skipped_operations)
        for key in ("database_include_list", "table_include_list", "table_exclude_list"):
            for pattern in getattr(self, key):
                try:
                    re.compile(pattern)
                except re.error as err:
                    raise ConfigError(key, f"{pattern!r} is not a valid regular expression: "
                                      f"{err}") from None
        if not 0 <= self.server_id < 2**32:
            raise ConfigError("server_id", f"must be in 0..4294967295, got {self.server_id}")
        for key in ("max_batch_events", "max_transaction_rows_in_memory",
                    "snapshot_fetch_size", "reconnect_backoff_ms",
                    "incremental_snapshot_chunk_size"):
            if getattr(self, key) <= 0:
                raise ConfigError(key, f"must be > 0, got {getattr(self, key)}")
        if self.signal_table is not None and not _QUALIFIED.fullmatch(self.signal_table):
            raise ConfigError("signal_table", f"{self.signal_table!r} is not a table name; "
                              "expected database.table, e.g. shop.debezium_signal")
        for key in ("heartbeat_interval_ms", "reconnect_max_attempts"):
            if getattr(self, key) < 0:
                raise ConfigError(key, f"must be >= 0, got {getattr(self, key)}")

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], section: str = "") -> MariaDbSourceConfig:
        """Build from a plain mapping (a TOML table, CLI options), naming any bad key."""
        return struct_from_mapping(
            cls, values, section,
            required={"dsn": "the mariadb:// URL of the server to capture"})

    @property
    def connection(self) -> ConnectionSettings:
        return parse_url(self.dsn)

    @property
    def replica_server_id(self) -> int:
        """:attr:`server_id`, or the one derived from the DSN."""
        if self.server_id:
            return self.server_id
        settings = self.connection
        return 5400 + zlib.crc32(f"{settings.host}:{settings.port}/{self.topic_prefix}"
                                 .encode()) % 1000

    @property
    def skipped(self) -> frozenset[Op]:
        """The operations :attr:`skipped_operations` leaves out."""
        return parse_skipped_operations(self.skipped_operations)

    def redacted_dsn(self) -> str:
        """The server and user, without the password."""
        return self.connection.redacted()

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}"
                           for name in self.__struct_fields__ if name != "dsn")
        return f"MariaDbSourceConfig(dsn={self.redacted_dsn()!r}, {fields})"

    def table_filter(self) -> TableFilter:
        return TableFilter(self)


class TableFilter:
    """Which ``database.table`` names a configuration captures."""

    def __init__(self, config: MariaDbSourceConfig) -> None:
        database = config.connection.database
        databases = config.database_include_list or ((re.escape(database),) if database
                                                     else ())
        self._databases = [re.compile(p) for p in databases]
        self._include = [re.compile(p) for p in config.table_include_list]
        self._exclude = [re.compile(p) for p in config.table_exclude_list]
        self._memo: dict[TableId, bool] = {}

    def __call__(self, table: TableId) -> bool:
        known = self._memo.get(table)
        if known is None:
            known = self._memo[table] = self._decide(table)
        return known

    def snapshot_order(self, tables: Iterable[TableId]) -> list[TableId]:
        """*tables* (captured ones) in the order Debezium snapshots them: the include
        list's order, each entry's tables by name (``database.table``); without an
        include list, by name (Debezium's ``addSignalingCollectionAndSort``)."""
        by_name = sorted(tables, key=str)
        if not self._include:
            return by_name
        ordered: dict[TableId, None] = {}
        for pattern in self._include:
            for table in by_name:
                if table not in ordered and pattern.fullmatch(str(table)):
                    ordered[table] = None
        return [*ordered, *(t for t in by_name if t not in ordered)]

    def _decide(self, table: TableId) -> bool:
        if table.schema in SYSTEM_DATABASES:
            return False
        name = f"{table.schema}.{table.table}"
        if any(p.fullmatch(name) for p in self._exclude):
            return False
        if self._include:
            return any(p.fullmatch(name) for p in self._include)
        if self._databases:
            return any(p.fullmatch(table.schema) for p in self._databases)
        return True
