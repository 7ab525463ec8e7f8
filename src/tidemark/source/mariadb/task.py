"""The MariaDB connector on the engine's SPI: one task per server.

A binlog is one ordered stream for the whole server, so one task reads it (splitting it
would only make every task read and discard the others' events); the databases and
tables it captures are the configuration's filters.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from typing import Any

from tidemark.errors import ConfigError, TransientError
from tidemark.offsets.store import Offset, OffsetReader
from tidemark.source.batch import SourceBatch
from tidemark.source.mariadb.config import MariaDbSourceConfig
from tidemark.source.mariadb.connector import MariaDbConnector
from tidemark.source.spi import TaskConfig

log = logging.getLogger(__name__)


class MariaDbTask:
    """Captures one server; after a retriable failure the next poll reconnects from the
    last committed offset (records after it are delivered again: at-least-once)."""

    def __init__(self, config: MariaDbSourceConfig, stop_at_end: bool = False) -> None:
        self.config = config
        self._stop_at_end = stop_at_end
        self._connector: MariaDbConnector | None = None
        self._offsets: OffsetReader | None = None
        self._committed: Offset | None = None
        self._broken = False

    @property
    def partition(self) -> str:
        if self._connector is None:
            raise ConfigError("partition", "known only after start()")
        return self._connector.partition

    @property
    def connector(self) -> MariaDbConnector | None:
        """The running capture (for tests and metrics)."""
        return self._connector

    def start(self, offsets: OffsetReader) -> None:
        self._offsets = offsets
        self._open(None)

    def _open(self, offset: Offset | None) -> None:
        connector = MariaDbConnector(self.config)
        self._connector = connector
        connector.start(offset, store=self._offsets, stop_at_end=self._stop_at_end)

    def poll(self) -> SourceBatch:
        if self._connector is None:
            raise ConfigError("poll", "start() the task first")
        if self._broken:
            self._reopen()
        try:
            return self._connector.poll()
        except TransientError:
            self._broken = True
            raise

    def _reopen(self) -> None:
        assert self._connector is not None
        with contextlib.suppress(Exception):
            self._connector.stop()
        resume = self._committed
        if resume is None and self._offsets is not None:
            with contextlib.suppress(Exception):
                resume = self._offsets.load(self._connector.partition)
        log.info("reconnecting capture of %s from %s", self.config.redacted_dsn(),
                 resume or "its saved offset")
        self._open(resume)
        self._broken = False

    def commit(self, offset: Offset) -> None:
        self._committed = offset
        if self._connector is not None:
            self._connector.commit(offset)

    def stop(self) -> None:
        if self._connector is not None:
            self._connector.stop()


class MariaDbSourceConnector:
    """The engine-facing MariaDB connector. *config* holds the settings of
    :class:`MariaDbSourceConfig`. *stop_at_end*: finish at the binlog's end as it is at
    start (a bounded run, like ``tidemark capture --stop-at-end``)."""

    def __init__(self, config: Mapping[str, Any], stop_at_end: bool = False) -> None:
        self._base = dict(config)
        self._stop_at_end = stop_at_end
        MariaDbSourceConfig.from_mapping(self._base)  # fail now, naming the bad key

    @property
    def name(self) -> str:
        return "mariadb"

    def task_configs(self, tasks_max: int) -> list[TaskConfig]:
        if tasks_max < 1:
            raise ConfigError("tasks_max", f"must be at least 1, got {tasks_max}")
        return [self._base]

    def create_task(self, config: TaskConfig) -> MariaDbTask:
        return MariaDbTask(MariaDbSourceConfig.from_mapping(config), self._stop_at_end)
