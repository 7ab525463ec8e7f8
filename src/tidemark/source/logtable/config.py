"""Configuration of a log-table capture, validated when it is built.

Every invalid value raises :class:`tidemark.errors.ConfigError` naming the key.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from tidemark.config_mapping import struct_from_mapping
from tidemark.errors import ConfigError
from tidemark.event import Op
from tidemark.skipped_operations import DEFAULT as SKIPPED_DEFAULT
from tidemark.skipped_operations import parse_skipped_operations
from tidemark.source.postgres.config import redact_dsn


def is_sqlite(dsn: str) -> bool:
    """Whether *dsn* names a SQLite file (``sqlite:///path.db``)."""
    return dsn.strip().lower().startswith("sqlite:")


class LogTableSourceConfig(msgspec.Struct, frozen=True, kw_only=True,
                           forbid_unknown_fields=True):
    """Settings of one log-table capture. Build it with :meth:`from_mapping`."""

    dsn: str
    """A PostgreSQL connection string, or ``sqlite:///path/to/file.db``."""
    table_include_list: tuple[str, ...] = ()
    """Captured tables (``schema.table`` or ``table``); default every table with a log."""
    topic_prefix: str = "tidemark"
    """Debezium's ``topic.prefix``: the ``source.name`` of every event, and the start of
    every group's offset key."""
    groups: tuple[int, ...] = ()
    """The stream groups this task reads (set by the connector's ``task_configs``);
    empty: all of them."""
    max_batch_events: int = 10_000
    """Most changes read from one group at a time (one query per table)."""
    poll_interval_ms: int = 500
    """How long an idle reader waits before looking again."""
    reader_name: str = ""
    """This reader's name in the database's reader registry (default: the
    ``topic_prefix``). Readers of one log under one name share positions there: give
    each independent consumer its own."""
    register: bool = True
    """Record saved positions in the registry and delete what every registered reader
    has passed (off for a capture whose offsets are not saved anywhere)."""
    retention_s: float = 86_400.0
    """Log rows older than this that every registered reader of their group has passed
    are deleted (by a reader, after its offsets are saved); 0 deletes them as soon as
    read, negative never."""
    prune_interval_s: float = 60.0
    """How often a reader deletes what it may."""
    reconnect_max_attempts: int = 10
    """Attempts to reconnect after the database became unreachable (a server restart, a
    failover), each from the positions already handed on (0: fail at once). An
    attempt that reads again starts a new count."""
    reconnect_backoff_ms: int = 500
    """First delay before such an attempt; doubles up to 30 s."""
    server_timeout_ms: int = 300_000
    """Longest wait for PostgreSQL's answer to one query (as the Spark source's
    ``serverTimeoutMs``): a stopped or unreachable server then counts as unreachable,
    and the reader reconnects, instead of waiting for ever. Not for SQLite."""
    skipped_operations: str = SKIPPED_DEFAULT
    """Debezium's ``skipped.operations``: the changes left out while streaming, a
    comma-separated list of ``c``, ``u``, ``d``, ``t`` or ``none`` (the default); log
    tables hold no truncates, so ``t`` skips nothing (see
    :mod:`tidemark.skipped_operations`)."""

    def __post_init__(self) -> None:
        parse_skipped_operations(self.skipped_operations)
        if self.reconnect_max_attempts < 0:
            raise ConfigError("reconnect_max_attempts",
                              f"must be >= 0, got {self.reconnect_max_attempts}")
        for key in ("max_batch_events", "poll_interval_ms", "reconnect_backoff_ms",
                    "server_timeout_ms"):
            if getattr(self, key) <= 0:
                raise ConfigError(key, f"must be > 0, got {getattr(self, key)}")
        if self.prune_interval_s < 0:
            raise ConfigError("prune_interval_s", f"must be >= 0, got {self.prune_interval_s}")
        if any(g < 0 for g in self.groups):
            raise ConfigError("groups", f"group numbers are >= 0, got {list(self.groups)}")
        if not self.topic_prefix or "/" in self.topic_prefix:
            raise ConfigError("topic_prefix", f"{self.topic_prefix!r}: must be a non-empty "
                              "name without '/'")

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], section: str = "") -> LogTableSourceConfig:
        """Build from a plain mapping (a TOML table, CLI options), naming any bad key."""
        return struct_from_mapping(
            cls, values, section,
            required={"dsn": "a PostgreSQL connection string or sqlite:///path.db"})

    @property
    def skipped(self) -> frozenset[Op]:
        """The operations :attr:`skipped_operations` leaves out."""
        return parse_skipped_operations(self.skipped_operations)

    def redacted_dsn(self) -> str:
        """The DSN without its password."""
        return self.dsn if is_sqlite(self.dsn) else redact_dsn(self.dsn)

    @property
    def reader(self) -> str:
        """The name this reader registers under."""
        return self.reader_name or self.topic_prefix

    def offset_key(self, group: int) -> str:
        """The offset key of one group: one stored offset per group."""
        return f"{self.topic_prefix}/logtable/group-{group}"

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}"
                           for name in self.__struct_fields__ if name != "dsn")
        return f"LogTableSourceConfig(dsn={self.redacted_dsn()!r}, {fields})"
