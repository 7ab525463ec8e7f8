"""Settings of the embedded engine, validated when built.

Names follow Debezium's engine properties where one exists (``errors.max.retries`` →
``errors_max_retries``), so that a Debezium user recognises them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from enum import StrEnum
from typing import Any

import msgspec

from tidemark.config_mapping import struct_from_mapping
from tidemark.errors import ConfigError


class DeliveryMode(StrEnum):
    """How records reach the consumer (see :mod:`tidemark.engine.delivery`)."""

    BATCH = "batch"  # (a) handle_batch(records, committer) per polled batch
    ORDERED = "ordered"  # (b) one call per record, in source order
    ASYNC = "async"  # (c) one call per record, concurrently; no order
    PER_KEY = "per_key"  # (d) one call per record; same key → same worker, in order


class KeyBy(StrEnum):
    """What decides a record's worker in PER_KEY mode."""

    KEY = "key"  # the record key (tables without one: the table)
    TABLE = "table"


class EngineConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How the engine runs tasks and delivers records. Build it with :meth:`from_mapping`
    to get errors that name the bad key."""

    tasks_max: int = 1
    """Most tasks a connector may split into; each runs in its own worker."""
    delivery_mode: DeliveryMode = DeliveryMode.BATCH
    worker_count: int = 0
    """Workers that transform, convert and (per-record modes) consume; 0 = CPU cores."""
    key_by: KeyBy = KeyBy.KEY
    max_in_flight: int = 10_000
    """Records handed on and not yet passed by the committable offset (with
    ``offset_flush_interval_ms = 0``: by the saved offset), per task. The reader waits
    above it. A crash redelivers at most this many records with an interval of 0, in
    every mode; with an interval, this many plus those processed since the last save."""
    offset_flush_interval_ms: int = 1_000
    """Save offsets at most this often; 0 saves after every processed batch (and then
    records count against ``max_in_flight`` until saved)."""
    read_ahead: bool = True
    """Delivery modes ``batch`` and ``ordered`` with one consumer: poll the next batch
    while the consumer (in a thread of its own) works on this one; a call that returned
    within 2 ms is still made in the task's reader thread while the worker is idle, so a
    consumer that then blocks stops polling until it returns. False calls the
    consumer in the task's thread and polls again once it returns: one batch in memory
    and no hand-off between threads, for a consumer that is Python work (the two
    threads would only trade the GIL), like ``tidemark capture``'s writer."""
    errors_max_retries: int = -1
    """Retries of a task operation that failed with a retriable error (-1: no limit)."""
    errors_retry_delay_initial_ms: int = 300
    errors_retry_delay_max_ms: int = 10_000
    polling_shutdown_timeout_ms: int = 5_000
    """On close, how long in-flight records may still be processed (0: stop at once)."""
    task_management_timeout_ms: int = 180_000
    """Longest a task may take to start or to stop."""
    metrics_port: int | None = None
    """Serve Prometheus metrics (``/metrics``) on this port while the engine runs
    (0: any free port, see :attr:`Engine.metrics_port`); None: no endpoint."""

    def __post_init__(self) -> None:
        positive = ("tasks_max", "max_in_flight", "errors_retry_delay_initial_ms",
                    "errors_retry_delay_max_ms", "task_management_timeout_ms")
        for key in positive:
            if getattr(self, key) <= 0:
                raise ConfigError(key, f"must be > 0, got {getattr(self, key)}")
        for key in ("worker_count", "offset_flush_interval_ms", "polling_shutdown_timeout_ms"):
            if getattr(self, key) < 0:
                raise ConfigError(key, f"must be >= 0, got {getattr(self, key)}")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise ConfigError("metrics_port", f"must be a TCP port (0-65535), got "
                                              f"{self.metrics_port}")
        if self.errors_max_retries < -1:
            raise ConfigError("errors_max_retries",
                              f"must be -1 (no limit) or >= 0, got {self.errors_max_retries}")

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], section: str = "") -> EngineConfig:
        """Build from a plain mapping (a TOML table, a dict), naming any bad key."""
        return struct_from_mapping(cls, values, section)

    @property
    def workers(self) -> int:
        """The worker pool size actually used."""
        return self.worker_count or os.cpu_count() or 1
