"""CDC log tables written by triggers, on PostgreSQL or SQLite: the source kind
``logtable``, for ``sqlite:`` DSNs and PostgreSQL with ``--source logtable``.

SQLite and PostgreSQL log databases are one kind; what differs between them stays in
this folder (:func:`tidemark.source.logtable.reader.open_database`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from tidemark.errors import ConfigError
from tidemark.source.kind import (
    Capture,
    CaptureOptionError,
    CaptureRequest,
    Row,
    SourceKind,
    SourceProgress,
    StatusModules,
)
from tidemark.source.logtable.config import is_sqlite

if TYPE_CHECKING:
    from tidemark.event import TableId
    from tidemark.source.verify_snapshot import VerifySnapshot

#: Bytes a log-table change is taken to span in the lag behind the log (an estimate,
#: for progress only: batches are sized by the database, :func:`batch_bytes`).
LOG_ROW_BYTES: Final = 256

#: Options that a log-table capture has, beside the DSN and the table list.
_CAPTURE_UNUSED: Final = ("slot", "publication", "on_slot_lost", "snapshot_mode",
                          "transaction_metadata", "decimal_handling_mode",
                          "time_precision_mode", "signal_table", "exclude")
#: Spark options a log-table stream has no use for (``tidemark run`` refuses the
#: ``[source]`` settings that set them by the same list).
_SPARK_UNUSED: Final = ("maxChangesPerTrigger", "slot", "publication",
                        "slotFailover", "serverTimeoutMs", "snapshotChunkRows",
                        "snapshotChunksPerTrigger")


class LogTableProgress(SourceProgress):
    """The log written after a batch's end (in the bytes the sizing counts per change);
    a batch's bytes asked of the database (log rows are as wide as the captured rows:
    their count says nothing of their bytes)."""

    def __init__(self, dsn: str, tables: Sequence[str]) -> None:
        self._dsn = dsn
        self._tables = tuple(tables)

    def lag_bytes(self, end: Mapping[str, Any]) -> int:
        from tidemark.source.logtable.reader import open_database  # noqa: PLC0415

        with contextlib.closing(open_database(self._dsn)) as db:
            return max(0, db.clock() - int(end.get("clock", 0))) * LOG_ROW_BYTES

    def batch_bytes(self, start: Mapping[str, Any] | None,
                    end: Mapping[str, Any]) -> int | None:
        from tidemark.source.logtable.read_plan import batch_bytes  # noqa: PLC0415

        if start is None:
            return None
        return batch_bytes(self._dsn, self._tables, dict(start), dict(end))


class LogTableKind(SourceKind):
    """Log tables on PostgreSQL or SQLite (the only way to capture SQLite)."""

    name = "logtable"
    requested_names = ("logtable",)

    def claims(self, dsn: str, requested: str | None) -> bool:
        if is_sqlite(dsn):
            if requested is not None and requested not in self.requested_names:
                raise ConfigError("source", "SQLite has no replication stream; it is "
                                  "captured through log tables (leave out the source kind)")
            return True
        return requested in self.requested_names

    def check_dsn(self, dsn: str, key: str) -> None:
        if not is_sqlite(dsn):
            from tidemark.source.postgres.kind import check_libpq_dsn  # noqa: PLC0415

            check_libpq_dsn(dsn, key)

    def redact_dsn(self, dsn: str) -> str:
        if is_sqlite(dsn):
            return dsn
        from tidemark.postgres_connection import redact_dsn  # noqa: PLC0415

        return redact_dsn(dsn)

    def default_schema(self, dsn: str) -> str:
        return "main" if is_sqlite(dsn) else "public"

    def spark_option_refusal(self, option: str, value: str | None) -> str | None:
        if option in _SPARK_UNUSED and (value or "").strip():
            return ("does not apply to log tables (a batch reads every stream group up to "
                    "the log's end)")
        return None

    def capture(self, request: CaptureRequest) -> Capture:
        from tidemark.serde.debezium_json import DebeziumJsonOptions  # noqa: PLC0415
        from tidemark.source.logtable.layout import assign_groups  # noqa: PLC0415
        from tidemark.source.logtable.reader import open_database  # noqa: PLC0415
        from tidemark.source.logtable.task import LogTableConnector  # noqa: PLC0415

        for option in _CAPTURE_UNUSED:
            if option in request.given:
                raise CaptureOptionError(f"--{option.replace('_', '-')} does not apply to "
                                         "log tables")
        tasks, task_index = request.tasks, request.task_index
        if task_index >= tasks:
            raise CaptureOptionError(f"--task {task_index} is not one of --tasks {tasks} "
                                     f"(0 to {tasks - 1})")
        values = request.values
        # Without --offsets nothing is saved: such a capture must not register (its
        # position would let retention delete what a real reader still needs).
        base = {"dsn": values["dsn"], "table_include_list": values["table_include_list"],
                "topic_prefix": values["topic_prefix"], "retention_s": request.retention_s,
                "register": request.saves_offsets,
                "skipped_operations": values["skipped_operations"]}
        groups: tuple[int, ...] = ()
        if tasks > 1:
            db = open_database(values["dsn"])
            try:
                total = db.generations()[0].groups
            finally:
                db.close()
            split = assign_groups(total, tasks)
            if task_index >= len(split):
                raise CaptureOptionError(f"the log has {total} groups: at most {total} "
                                         "tasks")
            groups = tuple(split[task_index])
        return Capture(LogTableConnector({**base, "groups": groups},
                                         stop_at_end=request.stop_at_end),
                       DebeziumJsonOptions(topic_prefix=request.topic_prefix,
                                           tombstones_on_delete=request.tombstones,
                                           cells=request.cells))

    def position_text(self, position: int) -> str:
        return f"log position {position}"

    def log_position(self, offset: Mapping[str, Any]) -> int:
        """How far every group of a Spark offset has read: on SQLite the lowest group's
        ``cdc$time``; on PostgreSQL the lowest ``xmin`` of the groups' snapshots (every
        transaction below it is read, whatever its times). An offset whose tables'
        rows are still to be loaded (``snapshot``) has read nothing."""
        if offset.get("snapshot"):
            return 0
        groups = list((offset.get("groups") or {}).values())
        if not groups:
            return int(offset.get("clock", 0))
        if all("after" in g for g in groups):
            return min(int(g["after"]) for g in groups)
        from tidemark.source.logtable.verify_snapshot import snapshot_xmin  # noqa: PLC0415

        return min(snapshot_xmin(str(g["snapshot"])) for g in groups)

    def reload_hint(self, table: str, signal_table: str | None) -> str:
        # The log tables' Spark stream takes no execute-snapshot (read_plan's docstring).
        return ("start the pipeline on a new checkpoint with snapshot = \"initial\": a "
                "log-table stream reloads its tables only so")

    def verify_snapshot(self, dsn: str, tables: Sequence[TableId], *,
                        publication: str, wait_s: float = 120.0) -> VerifySnapshot:
        from tidemark.source.logtable.verify_snapshot import (  # noqa: PLC0415
            open_verify_snapshot,
        )

        del wait_s  # nothing to wait for: its snapshot is taken at once
        return open_verify_snapshot(dsn, tables, publication=publication)

    def progress(self, dsn: str, *, slot: str, tables: Sequence[str]) -> SourceProgress:
        return LogTableProgress(dsn, tables)

    def reader_options(self, *, slot: str, publication: str, checkpoint: str,
                       slot_failover: bool | None) -> dict[str, str]:
        # No slot or publication: the log's reader registry knows the pipeline by its
        # checkpoint.
        return {"readerName": f"run:{os.path.abspath(checkpoint)}"}

    def table_columns(self, dsn: str,
                      tables: Sequence[str]) -> Mapping[str, Sequence[str]] | None:
        from tidemark.source.logtable.reader import open_database  # noqa: PLC0415

        db = open_database(dsn)
        try:
            # A table without a log table is refused here, with the command that adds it.
            return {str(t.table): t.schema.column_names for t in db.tables(list(tables))}
        finally:
            db.close()

    def identity_database(self, dsn: str) -> str:
        if is_sqlite(dsn):
            from tidemark.source.logtable.sqlite import sqlite_path  # noqa: PLC0415

            return str(sqlite_path(dsn).resolve())
        from tidemark.source.postgres.kind import database_of  # noqa: PLC0415

        return database_of(dsn)

    def knows_column_defaults(self, dsn: str) -> bool:
        return not is_sqlite(dsn)

    def existing_row_values(self, dsn: str, table: str,
                            columns: Sequence[str]) -> dict[str, Any]:
        if is_sqlite(dsn):
            return {}
        from tidemark.source.postgres.kind import existing_row_values  # noqa: PLC0415

        return existing_row_values(dsn, table, columns)

    def read_plan_module(self) -> str:
        return "tidemark.source.logtable.read_plan"

    def status_modules(self) -> StatusModules:
        return StatusModules("tidemark.status.logtable", "tidemark.status.logtable_pipeline")

    def write_signal(self, dsn: str, table: TableId, signal_id: str, signal_type: str,
                     data: str | None) -> None:
        # The Spark stream reads the signal table (tidemark run's signal_table): in the
        # SQLite file, or PostgreSQL's own (PostgreSQL's writer).
        if is_sqlite(dsn):
            from tidemark.source.logtable.signal_table import (  # noqa: PLC0415
                write_sqlite_signal,
            )

            write_sqlite_signal(dsn, table, signal_id, signal_type, data)
            return
        from tidemark.source.postgres.signal_table import write_signal  # noqa: PLC0415

        write_signal(dsn, table, signal_id, signal_type, data)

    def table_rows(self, dsn: str, table: str, columns: Sequence[str],
                   text_columns: Sequence[str], utc_columns: Sequence[str]) -> list[Row]:
        if is_sqlite(dsn):
            from tidemark.source.logtable.table_rows import sqlite_rows  # noqa: PLC0415

            return sqlite_rows(dsn, table, columns)
        from tidemark.source.postgres.table_rows import table_rows  # noqa: PLC0415

        return table_rows(dsn, table, columns, text_columns)


KIND: Final = LogTableKind()
