"""Configuration of the PostgreSQL connector, validated when it is built.

Keys follow Debezium's PostgreSQL connector where one exists, with ``_`` instead of
``.`` (``decimal_handling_mode`` for ``decimal.handling.mode``), so that a Debezium user
recognises them. Every invalid value raises :class:`tidemark.errors.ConfigError` naming
the key and what it accepts.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from enum import StrEnum
from typing import Any

import msgspec

from tidemark.config_mapping import struct_from_mapping
from tidemark.errors import ConfigError
from tidemark.event import Op
from tidemark.postgres_connection import check_identifier, parse_dsn, redact_dsn
from tidemark.serde.modes import DecimalHandlingMode, TimePrecisionMode
from tidemark.skipped_operations import DEFAULT as SKIPPED_DEFAULT
from tidemark.skipped_operations import parse_skipped_operations

__all__ = ["DecimalHandlingMode", "PostgresSourceConfig", "SnapshotMode", "TimePrecisionMode",
           "check_identifier", "redact_dsn"]


class SnapshotMode(StrEnum):
    """When to take the initial snapshot (Debezium's ``snapshot.mode``)."""

    INITIAL = "initial"  # snapshot once, when no offset exists, then stream
    NO_DATA = "no_data"  # never snapshot rows; stream from the slot
    INITIAL_ONLY = "initial_only"  # snapshot, then stop without streaming
    WHEN_NEEDED = "when_needed"  # like initial, and again if the offset is unusable


class SlotLostAction(StrEnum):
    """What capture does when the slot its offset needs is gone or invalidated."""

    FAIL = "fail"  # stop with an error that names the slot and what was lost
    RESNAPSHOT = "resnapshot"  # new slot, then an incremental snapshot of every table


_QUALIFIED_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}\.[a-z_][a-z0-9_]{0,62}")


class PostgresSourceConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Settings of one PostgreSQL capture.

    Build it with :meth:`from_mapping` (validates and names bad keys) or directly.
    """

    dsn: str
    """libpq connection string or URI of the database to capture."""
    table_include_list: tuple[str, ...] = ()
    """Tables to capture: ``schema.table`` names or regular expressions matched against
    the whole ``schema.table``; empty means every table with a primary key or replica
    identity in the database's non-system schemas."""
    table_exclude_list: tuple[str, ...] = ()
    """Regular expressions of ``schema.table`` names to leave out."""
    slot_name: str = "tidemark"
    """Logical replication slot (created if missing)."""
    publication_name: str = "tidemark_publication"
    """Publication (created for the captured tables if missing; missing tables added)."""
    snapshot_mode: SnapshotMode = SnapshotMode.INITIAL
    heartbeat_interval_ms: int = 10_000
    """How often an idle stream confirms the server's position so the slot advances
    while the captured tables are quiet (0 turns heartbeats off)."""
    heartbeat_action_query: str | None = None
    """SQL run on every heartbeat, e.g. an UPDATE of a heartbeat table, for databases
    with no traffic of their own whose slot would otherwise hold WAL written elsewhere."""
    decimal_handling_mode: DecimalHandlingMode = DecimalHandlingMode.PRECISE
    time_precision_mode: TimePrecisionMode = TimePrecisionMode.ADAPTIVE
    topic_prefix: str = "tidemark"
    """Debezium's ``topic.prefix``: the ``source.name`` of every event."""
    provide_transaction_metadata: bool = False
    """Add the ``transaction`` block to events and BEGIN/END transaction records."""
    skipped_operations: str = SKIPPED_DEFAULT
    """Debezium's ``skipped.operations``: the changes left out while streaming, a
    comma-separated list of ``c``, ``u``, ``d``, ``t`` or ``none`` (tidemark's default;
    Debezium's is ``t``: see :mod:`tidemark.skipped_operations`)."""
    status_interval_ms: int = 10_000
    """How often standby status updates are sent to the server (at least 1000)."""
    max_batch_messages: int = 10_000
    """Largest number of replication messages handed on together."""
    reconnect_max_attempts: int = 10
    """Attempts to reconnect after the replication connection drops (0: never)."""
    reconnect_backoff_ms: int = 500
    """First delay between reconnect attempts; doubles up to 30 s."""
    wal_receive_timeout_ms: int = 60_000
    """A replication connection that brings nothing (no data, no keepalive) for this
    long is taken for dead and reopened: a network partition or a stopped server sends
    no RST, and TCP keepalives do not notice a server whose kernel still answers. At
    half of it the server is asked for a keepalive, which a live one answers at once.
    0 turns the check off (PostgreSQL's standbys have the same: wal_receiver_timeout)."""
    snapshot_fetch_size: int = 10_000
    """Rows fetched per round trip while snapshotting."""
    drop_slot_on_stop: bool = False
    slot_failover: bool | None = None
    """Create the slot as a failover slot (PostgreSQL 17+), which a standby with
    ``sync_replication_slots = on`` keeps in step, so capture goes on after the standby
    is promoted. None (the default): on where the server supports it; true on an older
    server is an error."""
    on_slot_lost: SlotLostAction = SlotLostAction.FAIL
    """The slot the offset needs is gone (a failover to a standby without it, a drop) or
    invalidated (its WAL exceeded ``max_slot_wal_keep_size``): ``fail`` stops with an
    error naming the slot and the position since which changes are lost; ``resnapshot``
    creates a new slot and re-reads every captured table with an incremental snapshot
    while the stream goes on, so a target is repaired without a full reload (rows
    deleted while the slot was gone are not in the snapshot: see the docs)."""
    signal_table: str | None = None
    """``schema.table`` of Debezium's signal table (``id varchar(42) PRIMARY KEY, type
    varchar(32), data varchar(2048)``): an Insert there is a signal (``execute-snapshot``
    …), read from the stream; the table is published, never captured (Debezium's
    ``signal.data.collection``)."""
    incremental_snapshot_chunk_size: int = 1024
    """Rows of the first chunk (one window) of an incremental snapshot; later chunks
    grow while they are cheap to read (see :mod:`tidemark.source.chunk_size`)."""
    incremental_snapshot_chunk_adaptive: bool = True
    """Let chunks grow from ``incremental_snapshot_chunk_size`` (doubling while a full
    chunk reads in under 50 ms, up to 32,768 rows and about 4 MB); false pins every
    chunk to that size."""

    def __post_init__(self) -> None:
        # Here, not at the top: importing this module (as the MariaDB and log-table
        # sources do, for the names they share) must not load psycopg.
        import psycopg  # noqa: PLC0415

        parse_skipped_operations(self.skipped_operations)
        try:
            parse_dsn(self.dsn)
        except psycopg.ProgrammingError as err:
            raise ConfigError(
                "dsn",
                "not a valid libpq connection string "
                f"({_first_line(err)}); expected e.g. 'host=db port=5432 dbname=app "
                "user=cdc' or 'postgresql://cdc@db:5432/app'",
            ) from None
        for key in ("slot_name", "publication_name"):
            check_identifier(key, getattr(self, key))
        for key in ("table_include_list", "table_exclude_list"):
            for pattern in getattr(self, key):
                try:
                    re.compile(pattern)
                except re.error as err:
                    raise ConfigError(key, f"{pattern!r} is not a valid regular expression: "
                                      f"{err}") from None
        for key in ("heartbeat_interval_ms", "reconnect_max_attempts",
                    "wal_receive_timeout_ms"):
            if getattr(self, key) < 0:
                raise ConfigError(key, f"must be >= 0, got {getattr(self, key)}")
        if self.status_interval_ms < 1000:
            raise ConfigError("status_interval_ms",
                              f"must be >= 1000 (whole seconds on the wire), "
                              f"got {self.status_interval_ms}")
        if self.signal_table is not None and not _QUALIFIED_NAME.fullmatch(self.signal_table):
            raise ConfigError("signal_table", f"{self.signal_table!r} is not a table name; "
                              "expected schema.table of plain lower-case names, e.g. "
                              "public.debezium_signal")
        for key in ("max_batch_messages", "snapshot_fetch_size", "reconnect_backoff_ms",
                    "incremental_snapshot_chunk_size"):
            if getattr(self, key) <= 0:
                raise ConfigError(key, f"must be > 0, got {getattr(self, key)}")

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], section: str = "") -> PostgresSourceConfig:
        """Build from a plain mapping (a TOML table, CLI options), naming any bad key."""
        return struct_from_mapping(
            cls, values, section,
            required={"dsn": "the connection string of the database to capture"})

    def __repr__(self) -> str:
        fields = ", ".join(
            f"{name}={getattr(self, name)!r}" for name in self.__struct_fields__ if name != "dsn"
        )
        return f"PostgresSourceConfig(dsn={self.redacted_dsn()!r}, {fields})"

    def __rich_repr__(self) -> list[tuple[str, Any]]:
        return [("dsn", self.redacted_dsn())] + [
            (name, getattr(self, name)) for name in self.__struct_fields__ if name != "dsn"
        ]

    @property
    def skipped(self) -> frozenset[Op]:
        """The operations :attr:`skipped_operations` leaves out."""
        return parse_skipped_operations(self.skipped_operations)

    def redacted_dsn(self) -> str:
        """The DSN with any password removed, safe for logs and error messages."""
        return redact_dsn(self.dsn)

    @property
    def database(self) -> str:
        """The database name the DSN connects to (libpq's default: the user name)."""
        params = parse_dsn(self.dsn)
        return params.get("dbname") or params.get("user") or "postgres"


def _first_line(err: BaseException) -> str:
    # libpq's messages can echo the offending string (a whole URI, a percent-encoded
    # token); the DSN may hold a password, so nothing quoted from it is kept.
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    text = re.sub(r'"[^"]*"?', '"…"', text)
    return re.sub(r"password\s*=\s*\S+", "password=***", text)
