"""The log-table source on the engine's SPI: stream groups spread over tasks.

``task_configs(tasks_max)`` reads how many groups the log has and gives each task a
contiguous range of them (at most one task per group); each task reads its groups
with one offset per group (:class:`~tidemark.source.logtable.reader.LogTableReader`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any, Final

from tidemark.errors import ConfigError
from tidemark.offsets.store import Offset, OffsetReader
from tidemark.source.logtable.config import LogTableSourceConfig
from tidemark.source.logtable.layout import assign_groups
from tidemark.source.logtable.reader import LogTableReader, open_database
from tidemark.source.reopening_task import ReopeningTask
from tidemark.source.spi import TaskConfig


class LogTableTask(ReopeningTask[LogTableReader]):
    """Reads one range of groups; after a retriable failure the next poll reopens from
    the last committed positions (at-least-once)."""

    def __init__(self, config: LogTableSourceConfig, stop_at_end: bool = False) -> None:
        super().__init__()
        self.config = config
        self._stop_at_end = stop_at_end

    def _new_connector(self) -> LogTableReader:
        return LogTableReader(self.config)

    def _start_connector(self, connector: LogTableReader, offset: Offset | None,
                         offsets: OffsetReader | None) -> None:
        connector.start(offset, store=offsets, stop_at_end=self._stop_at_end)

    def _describe(self) -> str:
        return f"{self.config.redacted_dsn()} groups {list(self.config.groups) or 'all'}"

    def offsets_by_key(self, offset: Offset) -> dict[str, Offset]:
        """One stored offset per group that moved (see :class:`LogTableReader`)."""
        if self._connector is None:
            raise ConfigError("offsets", "known only after start()")
        return self._connector.offsets_by_key(offset)

    def saved(self, offset: Offset) -> None:
        if self._connector is not None:
            self._connector.saved(offset)


class LogTableConnector:
    """The engine-facing log-table connector. *config* holds the settings of
    :class:`LogTableSourceConfig`; without ``groups`` the connector assigns them to its
    tasks, with ``groups`` one task reads those.
    *stop_at_end*: finish once every group has read what the log held."""

    #: An update logs only the columns it set: the others are UNAVAILABLE, which the
    #: converters tell from NULL in every type only as cells (as ``tidemark capture``).
    cells_by_default: Final = True

    def __init__(self, config: Mapping[str, Any], stop_at_end: bool = False) -> None:
        self._base = dict(config)
        self._stop_at_end = stop_at_end
        LogTableSourceConfig.from_mapping(self._base)  # fail now, naming the bad key

    @property
    def name(self) -> str:
        return "logtable"

    def task_configs(self, tasks_max: int) -> list[TaskConfig]:
        config = LogTableSourceConfig.from_mapping(self._base)
        if config.groups:  # chosen by the caller (tidemark capture --task): one task
            return [self._base]
        db = open_database(config.dsn)
        try:
            groups = db.generations()[0].groups
        finally:
            with contextlib.suppress(Exception):
                db.close()
        return [{**self._base, "groups": tuple(chunk)}
                for chunk in assign_groups(groups, tasks_max)]

    def create_task(self, config: TaskConfig) -> LogTableTask:
        return LogTableTask(LogTableSourceConfig.from_mapping(config), self._stop_at_end)
