"""The MariaDB connector on the engine's SPI: one task per server.

A binlog is one ordered stream for the whole server, so one task reads it (splitting it
would only make every task read and discard the others' events); the databases and
tables it captures are the configuration's filters.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tidemark.errors import ConfigError
from tidemark.offsets.store import Offset, OffsetReader
from tidemark.serde.debezium_json import DebeziumJsonOptions, DebeziumJsonSerializer
from tidemark.serde.modes import TimePrecisionMode
from tidemark.source.mariadb.config import MariaDbSourceConfig
from tidemark.source.mariadb.reader import MariaDbReader
from tidemark.source.reopening_task import ReopeningTask
from tidemark.source.spi import TaskConfig


class MariaDbTask(ReopeningTask[MariaDbReader]):
    """Captures one server; after a retriable failure the next poll reconnects from the
    last committed offset (records after it are delivered again: at-least-once)."""

    def __init__(self, config: MariaDbSourceConfig, stop_at_end: bool = False) -> None:
        super().__init__()
        self.config = config
        self._stop_at_end = stop_at_end
        self._lines: DebeziumJsonOptions | None = None

    def render_debezium_json(self, options: DebeziumJsonOptions, *,
                             converted_records: bool = False, lines: bool = False) -> bool:
        """Emit streamed changes as Debezium JSON lines in *options*, written straight
        from the rows events (the fused path of ``tidemark capture``). Call before
        :meth:`start`. Declined (False) unless *lines*: rendered events or records would
        only cost an object per row again; and with transaction metadata, whose blocks
        the fused path does not write."""
        del converted_records  # events are made as before when lines are not wanted
        if not lines or options.transaction_metadata or \
                self.config.provide_transaction_metadata:
            return False
        self._lines = options
        return True

    def _new_connector(self) -> MariaDbReader:
        lines = self._lines
        return MariaDbReader(self.config, json_lines=None if lines is None
                             else DebeziumJsonSerializer(lines))

    def _start_connector(self, connector: MariaDbReader, offset: Offset | None,
                         offsets: OffsetReader | None) -> None:
        connector.start(offset, store=offsets, stop_at_end=self._stop_at_end)

    def _describe(self) -> str:
        return self.config.redacted_dsn()


class MariaDbConnector:
    """The engine-facing MariaDB connector. *config* holds the settings of
    :class:`MariaDbSourceConfig`. *stop_at_end*: finish at the binlog's end as it is at
    start (a bounded run, like ``tidemark capture --stop-at-end``)."""

    def __init__(self, config: Mapping[str, Any], stop_at_end: bool = False) -> None:
        self._base = dict(config)
        self._stop_at_end = stop_at_end
        # Fail now, naming the bad key.
        self._time_precision_mode = MariaDbSourceConfig.from_mapping(
            self._base).time_precision_mode

    @property
    def time_precision_mode(self) -> TimePrecisionMode:
        """The connector's ``time_precision_mode`` (Debezium's MySQL/MariaDB connectors:
        ``adaptive_time_microseconds`` unless set): converters left at their default
        follow it (:func:`~tidemark.source.spi.source_time_precision_mode`)."""
        return self._time_precision_mode

    @property
    def name(self) -> str:
        return "mariadb"

    def task_configs(self, tasks_max: int) -> list[TaskConfig]:
        if tasks_max < 1:
            raise ConfigError("tasks_max", f"must be at least 1, got {tasks_max}")
        return [self._base]

    def create_task(self, config: TaskConfig) -> MariaDbTask:
        return MariaDbTask(MariaDbSourceConfig.from_mapping(config), self._stop_at_end)
