"""A MariaDB (or MySQL-protocol) server read from its binlog: the source kind
``mariadb``, for ``mariadb://`` and ``mysql://`` URLs.

The implementation is imported by each method: a PostgreSQL capture never imports
PyMySQL.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from tidemark.source.kind import (
    Capture,
    CaptureOptionError,
    CaptureRequest,
    Row,
    SourceKind,
    SourceProgress,
    StatusModules,
)

if TYPE_CHECKING:
    from tidemark.event import TableId
    from tidemark.source.verify_snapshot import VerifySnapshot

SCHEMES: Final = ("mariadb://", "mysql://")

#: Options that only the PostgreSQL connector has; given explicitly with a MariaDB
#: URL they are an error, not silently ignored.
_POSTGRES_ONLY: Final = ("slot", "publication", "on_slot_lost")
#: Spark options only PostgreSQL's replication stream reads (a binlog has no slot or
#: publication, its snapshot is read whole, its reads have no server timeout): given
#: for a MariaDB stream, or as ``tidemark run``'s ``[source]`` settings, they are refused.
_SPARK_POSTGRES_ONLY: Final = ("slot", "publication", "slotFailover", "serverTimeoutMs",
                               "snapshotChunkRows", "snapshotChunksPerTrigger")
_MARIADB_KEYS: Final = ("dsn", "table_include_list", "table_exclude_list", "snapshot_mode",
                        "provide_transaction_metadata", "topic_prefix",
                        "decimal_handling_mode", "heartbeat_interval_ms", "signal_table",
                        "incremental_snapshot_chunk_size",
                        "incremental_snapshot_chunk_adaptive", "skipped_operations")


class BinlogProgress(SourceProgress):
    """Binlog written after a batch's end (0 across a file switch); a batch's bytes
    between two binlog positions."""

    def __init__(self, dsn: str) -> None:
        self._dsn = dsn

    def lag_bytes(self, end: Mapping[str, Any]) -> int:
        from tidemark.source.mariadb import client  # noqa: PLC0415
        from tidemark.source.mariadb.position import BinlogPosition  # noqa: PLC0415

        with contextlib.closing(client.connect(client.parse_url(self._dsn))) as conn:
            now = client.current_position(conn)
        done = BinlogPosition.from_offset(dict(end))
        return max(0, now.pos - done.pos) if now.file == done.file else 0

    def batch_bytes(self, start: Mapping[str, Any] | None,
                    end: Mapping[str, Any]) -> int | None:
        if start is None:
            return None
        return max(0, KIND.log_position(end) - KIND.log_position(start))


class MariaDbKind(SourceKind):
    """A MariaDB server's binlog (row format, GTIDs)."""

    name = "mariadb"
    place = "server"

    def claims(self, dsn: str, requested: str | None) -> bool:
        from tidemark.errors import ConfigError  # noqa: PLC0415

        if not dsn.startswith(SCHEMES):
            return False
        if requested == "logtable":
            raise ConfigError("source", "log tables are for PostgreSQL and SQLite; a "
                              "MariaDB server is captured from its binlog")
        return True

    def check_dsn(self, dsn: str, key: str) -> None:
        from tidemark.source.mariadb.client import parse_url  # noqa: PLC0415

        parse_url(dsn)  # names what is wrong with the URL

    def redact_dsn(self, dsn: str) -> str:
        from tidemark.source.mariadb.client import parse_url  # noqa: PLC0415

        return parse_url(dsn).redacted()

    def spark_option_refusal(self, option: str, value: str | None) -> str | None:
        if option in _SPARK_POSTGRES_ONLY and (value or "").strip():
            return ("applies to PostgreSQL replication only (a MariaDB binlog has no slot, "
                    "publication or chunked snapshot)")
        return super().spark_option_refusal(option, value)

    def capture(self, request: CaptureRequest) -> Capture:
        # Imported here: a PostgreSQL capture's start should not pay for PyMySQL.
        from tidemark.serde.debezium_json import DebeziumJsonOptions  # noqa: PLC0415
        from tidemark.source.mariadb.config import MariaDbSourceConfig  # noqa: PLC0415
        from tidemark.source.mariadb.task import MariaDbConnector  # noqa: PLC0415

        for option in _POSTGRES_ONLY:
            if option in request.given:
                raise CaptureOptionError(f"--{option.replace('_', '-')} applies to "
                                         "PostgreSQL only; a mariadb:// source has no such "
                                         "setting")
        chosen = {key: request.values[key] for key in _MARIADB_KEYS}
        # MariaDB's default time mode is Debezium's MySQL one (time always in
        # microseconds); the option's own default is PostgreSQL's.
        if "time_precision_mode" in request.given:
            chosen["time_precision_mode"] = request.values["time_precision_mode"]
        config = MariaDbSourceConfig.from_mapping(chosen)
        return Capture(MariaDbConnector(chosen, stop_at_end=request.stop_at_end),
                       DebeziumJsonOptions(
                           topic_prefix=request.topic_prefix,
                           decimal_handling_mode=config.decimal_handling_mode,
                           time_precision_mode=config.time_precision_mode,
                           tombstones_on_delete=request.tombstones,
                           transaction_metadata=request.transaction_metadata))

    def position_text(self, position: int) -> str:
        return f"binlog {position >> 32}:{position & 0xFFFFFFFF}"

    def log_position(self, offset: Mapping[str, Any]) -> int:
        from tidemark.source.mariadb.position import BinlogPosition  # noqa: PLC0415

        return BinlogPosition.from_offset(dict(offset)).key

    def progress(self, dsn: str, *, slot: str, tables: Sequence[str]) -> SourceProgress:
        return BinlogProgress(dsn)

    def reader_options(self, *, slot: str, publication: str, checkpoint: str,
                       slot_failover: bool | None) -> dict[str, str]:
        # A binlog has no slot or publication (the stream refuses them): the server
        # keeps it by time and size, and the checkpoint holds the position.
        return {}

    def check_before_start(self, dsn: str, *, slot: str, checkpoint: str) -> None:
        from tidemark.source.mariadb import client  # noqa: PLC0415
        from tidemark.source.mariadb.grants import check_grants  # noqa: PLC0415

        settings = client.parse_url(dsn)
        with contextlib.closing(client.connect(settings)) as conn:
            client.check_server(conn)
            check_grants(conn, settings)

    def table_columns(self, dsn: str,
                      tables: Sequence[str]) -> Mapping[str, Sequence[str]] | None:
        from tidemark.event import TableId  # noqa: PLC0415
        from tidemark.source.mariadb import client  # noqa: PLC0415

        found: dict[str, list[str]] = {}
        with contextlib.closing(client.connect(client.parse_url(dsn))) as conn, \
                conn.cursor() as cur:
            for name in tables:
                table = TableId.parse(name)
                cur.execute("SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE "
                            "TABLE_SCHEMA = %s AND TABLE_NAME = %s ORDER BY ORDINAL_POSITION",
                            (table.schema, table.table))
                columns = [str(row[0]) for row in cur.fetchall()]
                if columns:
                    found[str(table)] = columns
        return found

    def identity_database(self, dsn: str) -> str:
        from tidemark.source.mariadb.client import parse_url  # noqa: PLC0415

        settings = parse_url(dsn)
        return f"{settings.host}:{settings.port}"

    def read_plan_module(self) -> str:
        return "tidemark.source.mariadb.read_plan"

    def status_modules(self) -> StatusModules:
        return StatusModules("tidemark.status.mariadb", "tidemark.status.mariadb_pipeline")

    def write_signal(self, dsn: str, table: TableId, signal_id: str, signal_type: str,
                     data: str | None) -> None:
        from tidemark.source.mariadb.signal_table import write_signal  # noqa: PLC0415

        write_signal(dsn, table, signal_id, signal_type, data)

    def table_rows(self, dsn: str, table: str, columns: Sequence[str],
                   text_columns: Sequence[str], utc_columns: Sequence[str]) -> list[Row]:
        from tidemark.source.mariadb.table_rows import table_rows  # noqa: PLC0415

        return table_rows(dsn, table, columns, text_columns, utc_columns)

    def verify_snapshot(self, dsn: str, tables: Sequence[TableId], *,
                        publication: str, wait_s: float = 120.0) -> VerifySnapshot:
        from tidemark.source.mariadb.verify_snapshot import (  # noqa: PLC0415
            open_verify_snapshot,
        )

        # MariaDB has no publication: the binlog holds every table's changes.
        del wait_s  # nothing to wait for: its snapshot is taken at once
        return open_verify_snapshot(dsn, tables, publication=publication)


KIND: Final = MariaDbKind()
