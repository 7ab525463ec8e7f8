"""The PostgreSQL connector on the engine's SPI: one task per database.

Several databases of one server in one configuration (``databases``) become one task
each, the way Debezium's SQL Server connector runs a task per database. Replication
slots are per server, so each database's slot gets the database name appended.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from tidemark.errors import ConfigError
from tidemark.offsets.store import Offset, OffsetReader
from tidemark.postgres_connection import make_dsn
from tidemark.serde.debezium_json import DebeziumJsonOptions, DebeziumJsonSerializer
from tidemark.source.postgres.config import PostgresSourceConfig, check_identifier
from tidemark.source.postgres.reader import PostgresReader
from tidemark.source.reopening_task import ReopeningTask
from tidemark.source.spi import TaskConfig


class PostgresTask(ReopeningTask[PostgresReader]):
    """Captures one database; after a retriable failure the next poll reconnects from
    the last committed offset (records after it are delivered again: at-least-once)."""

    def __init__(self, config: PostgresSourceConfig, stop_at_lsn: int | None = None) -> None:
        super().__init__()
        self.config = config
        self._stop_at_lsn = stop_at_lsn
        self._rendered: DebeziumJsonOptions | None = None
        self._converted_records = False
        self._lines = False

    def render_debezium_json(self, options: DebeziumJsonOptions, *,
                             converted_records: bool = False, lines: bool = False) -> bool:
        """Emit streamed row changes as :class:`~tidemark.serde.rendered.RenderedEvent` s
        with Debezium JSON texts in *options*, made straight from the pgoutput bytes
        (the fused path of ``tidemark capture``); with *converted_records*, inserts and
        updates as :class:`~tidemark.serde.converted.RenderedRecord` s. Call before
        :meth:`start`. With *lines*, streamed changes come as JSON lines
        (:attr:`~tidemark.source.batch.SourceBatch.lines`) instead. Declined (False)
        with transaction metadata, whose blocks the fused path does not write."""
        if options.transaction_metadata or self.config.provide_transaction_metadata:
            return False
        self._rendered = options
        self._converted_records = converted_records
        self._lines = lines
        return True

    def _new_connector(self) -> PostgresReader:
        # A reconnect: the reader it replaces may still hold the slot on the server (a
        # network cut); its walsenders are this task's, not another reader's.
        previous = self._connector.backend_pids if self._connector is not None else None
        rendered = self._rendered
        if rendered is None:
            return PostgresReader(self.config, previous_backends=previous)
        if self._lines:
            return PostgresReader(self.config, json_lines=DebeziumJsonSerializer(rendered),
                                  previous_backends=previous)
        return PostgresReader(self.config, rendered_json=DebeziumJsonSerializer(rendered),
                              converted_records=self._converted_records,
                              previous_backends=previous)

    def _start_connector(self, connector: PostgresReader, offset: Offset | None,
                         offsets: OffsetReader | None) -> None:
        connector.start(offset, store=offsets, stop_at_lsn=self._stop_at_lsn)

    def _describe(self) -> str:
        return self.config.redacted_dsn()


class PostgresConnector:
    """The engine-facing PostgreSQL connector. *config* holds the settings of
    :class:`PostgresSourceConfig`; *databases*, if given, lists databases of the
    server to capture, each in its own task (the DSN's database is then ignored).
    *stop_at_lsn*: finish once everything committed before this LSN is delivered (a
    bounded run, like ``tidemark capture --stop-at-end``)."""

    def __init__(self, config: Mapping[str, Any], databases: Sequence[str] = (),
                 stop_at_lsn: int | None = None) -> None:
        self._base = dict(config)
        self._stop_at_lsn = stop_at_lsn
        PostgresSourceConfig.from_mapping(self._base)  # fail now, naming the bad key
        for db in databases:
            check_identifier("databases", db)
        self.databases = tuple(databases)

    #: The metrics' ``plugin`` label (Debezium's, for the PostgreSQL connector).
    plugin: Final = "postgres"

    @property
    def name(self) -> str:
        return "postgresql"

    def task_configs(self, tasks_max: int) -> list[TaskConfig]:
        if not self.databases:
            return [self._base]
        if len(self.databases) > tasks_max:
            raise ConfigError("tasks_max", f"{len(self.databases)} databases need one task "
                              f"each; set tasks_max to at least {len(self.databases)}")
        slot = self._base.get("slot_name", "tidemark")
        return [{**self._base,
                 "dsn": make_dsn(self._base["dsn"], dbname=db),
                 "slot_name": f"{slot}_{db}"} for db in self.databases]

    def create_task(self, config: TaskConfig) -> PostgresTask:
        return PostgresTask(PostgresSourceConfig.from_mapping(config), self._stop_at_lsn)
