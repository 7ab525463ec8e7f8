"""Helpers that run the PostgreSQL connector in-process and collect what it emits."""

from __future__ import annotations

import time
from typing import Any

import msgspec

from tidemark.event import ChangeEvent, TransactionBoundary
from tidemark.offsets.store import OffsetReader
from tidemark.serde.debezium_json import DebeziumJsonOptions, DebeziumJsonSerializer
from tidemark.source.postgres.config import PostgresSourceConfig
from tidemark.source.postgres.reader import PostgresReader


def make_connector(dsn: str, *tables: str, **settings: Any) -> PostgresReader:
    values: dict[str, Any] = {"dsn": dsn, "table_include_list": list(tables),
                              "heartbeat_interval_ms": 200, **settings}
    return PostgresReader(PostgresSourceConfig.from_mapping(values))


def drain(connector: PostgresReader, until_lsn: int | None = None,
          timeout_s: float = 30.0) -> list[ChangeEvent | TransactionBoundary]:
    """Poll until the committed offset reaches *until_lsn* (or the source finishes)."""
    records: list[ChangeEvent | TransactionBoundary] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        batch = connector.poll()
        records.extend(batch.records)
        if batch.offset is not None:
            connector.commit(batch.offset)
            if until_lsn is not None and batch.offset["lsn"] >= until_lsn:
                return records
        if batch.finished:
            return records
    raise AssertionError(f"source did not reach {until_lsn} within {timeout_s}s; "
                         f"got {len(records)} records")


def events(records: list[Any]) -> list[ChangeEvent]:
    return [r for r in records if isinstance(r, ChangeEvent)]


def as_json(records: list[Any], **options: Any) -> list[dict[str, Any]]:
    """The records as decoded Debezium JSON lines."""
    serializer = DebeziumJsonSerializer(DebeziumJsonOptions(**options))
    data = serializer.encode_lines(records)
    return [msgspec.json.decode(line) for line in data.splitlines()]


def stream_changes(db: Any, tables: list[str], *statements: str,
                   store: OffsetReader | None = None, **settings: Any) -> list[ChangeEvent]:
    """Change events of *statements* (each its own transaction), streamed from a new
    slot on *tables* (no snapshot unless *settings* ask for one), or from where *store*
    says an earlier capture got to."""
    connector = make_connector(db.dsn, *tables, **{"snapshot_mode": "no_data", **settings})
    connector.start(store=store)
    try:
        drain(connector, db.insert_lsn())
        db.autocommit(*statements)
        return events(drain(connector, db.insert_lsn()))
    finally:
        connector.stop()
