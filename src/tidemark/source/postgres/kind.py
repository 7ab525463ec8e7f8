"""PostgreSQL read through logical replication (pgoutput): the source kind ``postgres``.

Takes any libpq connection string or URI, so it is asked last. The implementation is
imported by each method: asking which kind a DSN is imports no driver.
"""

from __future__ import annotations

import contextlib
import getpass
import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from tidemark.errors import ConfigError
from tidemark.source.kind import (
    Capture,
    CaptureRequest,
    Row,
    SourceKind,
    StatusModules,
)

if TYPE_CHECKING:
    from tidemark.event import TableId
    from tidemark.source.kind import SourceProgress
    from tidemark.source.verify_snapshot import VerifySnapshot


def server_end(dsn: str) -> int:
    """The end of the server's WAL: its insert position (a standby's: what it received
    or replayed)."""
    from tidemark import postgres_connection  # noqa: PLC0415
    from tidemark.source.postgres import offset  # noqa: PLC0415

    with contextlib.closing(postgres_connection.connect(dsn)) as conn:
        return offset.server_position(conn) or 0


def database_of(dsn: str) -> str:
    """The database a libpq connection string names, with libpq's defaults (the
    environment's, then the user's name)."""
    import psycopg  # noqa: PLC0415

    try:
        params = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as err:
        raise ConfigError("source.dsn", f"not a libpq connection string: {err}") from None
    name = params.get("dbname") or os.environ.get("PGDATABASE")
    if not name:
        name = params.get("user") or os.environ.get("PGUSER") or getpass.getuser()
    return str(name)


def check_libpq_dsn(dsn: str, key: str) -> None:
    """Raise ConfigError naming *key* if *dsn* is not a libpq connection string."""
    import psycopg  # noqa: PLC0415

    from tidemark.postgres_connection import parse_dsn  # noqa: PLC0415

    try:
        parse_dsn(dsn)
    except psycopg.ProgrammingError:
        raise ConfigError(key, "not a valid libpq connection string; expected e.g. "
                          "'host=db port=5432 dbname=app user=cdc'") from None


class PostgresKind(SourceKind):
    """A PostgreSQL database's WAL, through a replication slot and a publication."""

    name = "postgres"
    requested_names = ("replication",)
    plans_snapshots_in_offset = True

    def claims(self, dsn: str, requested: str | None) -> bool:
        return requested is None or requested in self.requested_names

    def check_dsn(self, dsn: str, key: str) -> None:
        check_libpq_dsn(dsn, key)

    def redact_dsn(self, dsn: str) -> str:
        from tidemark.postgres_connection import redact_dsn  # noqa: PLC0415

        return redact_dsn(dsn)

    def capture(self, request: CaptureRequest) -> Capture:
        from tidemark.serde.debezium_json import DebeziumJsonOptions  # noqa: PLC0415
        from tidemark.source.postgres.config import PostgresSourceConfig  # noqa: PLC0415
        from tidemark.source.postgres.pgoutput import lsn_to_str  # noqa: PLC0415
        from tidemark.source.postgres.task import PostgresConnector  # noqa: PLC0415

        config = PostgresSourceConfig.from_mapping(dict(request.values))
        dsn = config.dsn
        return Capture(
            PostgresConnector(dict(request.values), stop_at_lsn=server_end(dsn)
                              if request.stop_at_end else None),
            DebeziumJsonOptions(topic_prefix=request.topic_prefix,
                                decimal_handling_mode=config.decimal_handling_mode,
                                time_precision_mode=config.time_precision_mode,
                                tombstones_on_delete=request.tombstones,
                                transaction_metadata=request.transaction_metadata),
            log_behind=lambda position: server_end(dsn) - position,
            position_text=lsn_to_str, slot_keeps_position=True)

    def position_text(self, position: int) -> str:
        from tidemark.source.postgres.pgoutput import lsn_to_str  # noqa: PLC0415

        return lsn_to_str(position)

    def log_position(self, offset: Mapping[str, Any]) -> int:
        from tidemark.source.postgres.stream_offsets import from_offset  # noqa: PLC0415

        return from_offset(offset)

    def verified_position(self, offset: Mapping[str, Any], tables: Sequence[str]) -> int:
        from tidemark.source.postgres.stream_offsets import SourceOffset  # noqa: PLC0415

        parsed = SourceOffset.parse(offset)
        plan = parsed.snapshot
        # A snapshot generation (first start, execute-snapshot) replaces a table's target
        # with its first chunk and fills it chunk by chunk, while the stream's position
        # may already be past any verify's: the tables not fully planned are partial.
        if plan is not None and not plan.done \
                and set(plan.tables[plan.position:]) & set(tables):
            return 0
        return parsed.lsn

    def taken_signals(self, offset: Mapping[str, Any] | None) -> frozenset[str] | None:
        """The signal ids the stream had taken, less those of repairs it still holds:
        a ``tidemark-repair`` is in ``signals`` from the batch that starts its hold, and
        its rows are written only by the batch that ends at the hold's point
        (:mod:`tidemark.source.postgres.repair_hold`)."""
        taken = super().taken_signals(offset)
        held = None if offset is None else offset.get("held")
        if taken is None or not isinstance(held, Mapping):
            return taken
        return taken - {str(r["id"]) for r in held.get("requests") or ()
                        if isinstance(r, Mapping) and "id" in r}

    def progress(self, dsn: str, *, slot: str, tables: Sequence[str]) -> SourceProgress:
        from tidemark.source.postgres.progress import PostgresProgress  # noqa: PLC0415

        return PostgresProgress(dsn, slot, tables)

    def check_before_start(self, dsn: str, *, slot: str, checkpoint: str) -> None:
        from tidemark.source.postgres.slot_check import (  # noqa: PLC0415
            check_slot_free,
            check_slot_vouched,
        )

        check_slot_free(dsn, slot)
        check_slot_vouched(dsn, slot, checkpoint)

    def note_before_start(self, dsn: str, *, slot: str,
                          publication: str) -> Callable[[], list[str]] | None:
        from tidemark.source.postgres.start_undo import note_before_start  # noqa: PLC0415

        return note_before_start(dsn, slot, publication)

    def table_columns(self, dsn: str,
                      tables: Sequence[str]) -> Mapping[str, Sequence[str]] | None:
        from tidemark.source.postgres.read_checks import columns_of  # noqa: PLC0415

        return columns_of(dsn, tables)

    def carried_columns(self, dsn: str, tables: Sequence[str], *,
                        publication: str) -> Mapping[str, Sequence[str]] | None:
        from tidemark.source.postgres.read_checks import columns_of  # noqa: PLC0415

        return columns_of(dsn, tables, publication=publication)

    def identity_database(self, dsn: str) -> str:
        return database_of(dsn)

    def identity_slot(self, slot: str) -> str | None:
        return slot

    def knows_column_defaults(self, dsn: str) -> bool:
        return True

    def existing_row_values(self, dsn: str, table: str,
                            columns: Sequence[str]) -> dict[str, Any]:
        return existing_row_values(dsn, table, columns)

    def read_plan_module(self) -> str:
        return "tidemark.source.postgres.read_plan"

    def status_modules(self) -> StatusModules:
        return StatusModules("tidemark.status.postgres", "tidemark.status.postgres_pipeline")

    def write_signal(self, dsn: str, table: TableId, signal_id: str, signal_type: str,
                     data: str | None) -> None:
        from tidemark.source.postgres.signal_table import write_signal  # noqa: PLC0415

        write_signal(dsn, table, signal_id, signal_type, data)

    def verify_snapshot(self, dsn: str, tables: Sequence[TableId], *,
                        publication: str, wait_s: float = 120.0) -> VerifySnapshot:
        from tidemark.source.postgres.verify_snapshot import (  # noqa: PLC0415
            open_verify_snapshot,
        )

        return open_verify_snapshot(dsn, tables, publication=publication, wait_s=wait_s)

    def table_rows(self, dsn: str, table: str, columns: Sequence[str],
                   text_columns: Sequence[str], utc_columns: Sequence[str]) -> list[Row]:
        from tidemark.source.postgres.table_rows import table_rows  # noqa: PLC0415

        return table_rows(dsn, table, columns, text_columns)


def existing_row_values(dsn: str, table: str, columns: Sequence[str]) -> dict[str, Any]:
    """The values the database's existing rows of *table* hold in *columns* (its
    catalog's missing values)."""
    from tidemark.event import TableId  # noqa: PLC0415
    from tidemark.source.postgres import wal_reads  # noqa: PLC0415
    from tidemark.source.postgres.column_defaults import (  # noqa: PLC0415
        existing_row_values as values_of,
    )

    with contextlib.closing(wal_reads.connect(dsn, purpose="catalog")) as conn:
        return values_of(conn, TableId.parse(table), columns)


KIND: Final = PostgresKind()
