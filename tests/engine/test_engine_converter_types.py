"""Every converter on every type of every source: the engine's JSON, Avro and Arrow
converters given the same events agree on each value, after each converter's documented
encoding (Debezium's for JSON and Avro; Arrow's own types, or the source's text for a
type Arrow has no exact counterpart of: :mod:`tidemark.serde.arrow_changes`)."""

from __future__ import annotations

import base64
import datetime as dt
from decimal import Context, Decimal
from typing import Any

import pyarrow as pa
from test_engine_converters_per_source import _decoded, _run

from conftest import Database, MariaDatabase
from logtable_helpers import LogDb
from tidemark import LogTableConnector, MariaDbConnector
from tidemark.engine.arrow_converter import ArrowConverter
from tidemark.engine.avro_converter import AvroConverter
from tidemark.engine.records import ChangeRecord
from tidemark.event import ChangeEvent, Column
from tidemark.logical_type import Kind
from tidemark.serde.debezium_json import DebeziumJsonOptions
from tidemark.serde.modes import TimePrecisionMode
from tidemark.source.postgres.task import PostgresConnector
from type_lists import (
    MARIADB_TYPES,
    POSTGRES_LOGTABLE_TYPES,
    POSTGRES_TYPES,
    SQLITE_LOGTABLE_TYPES,
)

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _decimal_bytes(value: Decimal, scale: int) -> str:
    """Debezium's decimal bytes: the unscaled value, big-endian two's complement in the
    fewest bytes (Java's BigInteger.toByteArray), as base64."""
    unscaled = int(value.scaleb(scale, Context(prec=100)))
    size = (unscaled if unscaled >= 0 else ~unscaled).bit_length() // 8 + 1
    return base64.b64encode(unscaled.to_bytes(size, "big", signed=True)).decode()


def _variable_decimal(value: Decimal) -> dict[str, Any] | None:
    if not value.is_finite():
        return None
    scale = max(0, -int(value.as_tuple().exponent))
    return {"scale": scale, "value": _decimal_bytes(value, scale)}


def _as_json(column: Column, dtype: pa.DataType, value: Any,
             options: DebeziumJsonOptions) -> Any:
    """An Arrow value (integers for temporal types: the array cast to int64) as the
    JSON converter writes the same column."""
    if value is None:
        return None
    precision = column.logical.time_precision
    if (pa.types.is_time(dtype)
            and options.time_precision_mode is TimePrecisionMode.ADAPTIVE_TIME_MICROSECONDS):
        return value
    if pa.types.is_time(dtype) or (pa.types.is_timestamp(dtype) and dtype.tz is None):
        return value // 1000 if precision <= 3 else value  # Debezium's adaptive mode
    if pa.types.is_timestamp(dtype):
        stamp = _EPOCH + dt.timedelta(microseconds=value)
        digits = max(precision, 0) if precision <= 6 else 6
        text = stamp.strftime("%Y-%m-%dT%H:%M:%S")
        fraction = f"{stamp.microsecond:06d}"[:digits].rstrip("0") if digits else ""
        return f"{text}.{fraction}Z" if fraction else f"{text}Z"
    if pa.types.is_decimal(dtype):
        return _decimal_bytes(value, dtype.scale)
    if column.logical.kind is Kind.DECIMAL:  # no declared scale: Arrow has its text
        return _variable_decimal(Decimal(value))
    if pa.types.is_binary(dtype):
        return base64.b64encode(value).decode()
    return value


def _columns(batch: pa.RecordBatch) -> dict[str, list[Any]]:
    out = {}
    for field, array in zip(batch.schema, batch.columns, strict=True):
        temporal = pa.types.is_time(field.type) or pa.types.is_timestamp(field.type) \
            or pa.types.is_date(field.type)
        out[field.name] = (array.cast(pa.int64()) if pa.types.is_time(field.type) else
                           array.cast(pa.int32()) if pa.types.is_date(field.type) else
                           array.cast(pa.int64()) if temporal else array).to_pylist()
    return out


def _check(records: list[Any], options: DebeziumJsonOptions, textual: dict[str, Any]
           ) -> int:
    """Compare each column of each record's row in JSON, Avro and Arrow; a column in
    *textual* is one whose Arrow value is the source's text (no exact Arrow type): it
    must equal the text given there. Returns how many values were compared."""
    decoded = _decoded(records, options)
    events = [event for event, _, _ in decoded]
    batches = ArrowConverter().convert([ChangeRecord.of(e) for e in events])
    rows: list[dict[str, Any]] = []
    schemas: list[pa.Schema] = []
    for batch in batches:
        columns = _columns(batch.value)
        rows += [{k: v[i] for k, v in columns.items()} for i in range(batch.value.num_rows)]
        schemas += [batch.value.schema] * batch.value.num_rows
    assert len(rows) == len(decoded)
    compared = 0
    for (event, avro, json), row, schema in zip(decoded, rows, schemas, strict=True):
        assert isinstance(event, ChangeEvent) and event.schema is not None
        image = "before" if json["after"] is None else "after"
        for column in event.schema.columns:
            value = json[image][column.name]
            if options.cells and not column.is_key and value is not None:
                value = value["value"]
            avro_value = avro[image][column.name]
            if options.cells and not column.is_key and avro_value is not None:
                avro_value = avro_value["value"]
            arrow = row[column.name]
            dtype = schema.field(column.name).type
            where = f"{column.name} ({column.type_name}) of {json[image]}"
            if column.name in textual and arrow is not None:
                assert arrow == textual[column.name], where
            else:
                assert _as_json(column, dtype, arrow, options) == value, where
            assert _avro_as_json(avro_value, column) == value, where
            compared += 1
    return compared


def _avro_as_json(value: Any, column: Column) -> Any:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, Decimal):
        return _decimal_bytes(value, max(0, -int(value.as_tuple().exponent)))
    if isinstance(value, dict) and isinstance(value.get("value"), bytes):
        return {"scale": value["scale"], "value": base64.b64encode(value["value"]).decode()}
    return value


def test_every_mariadb_type_in_every_converter(mdb: MariaDatabase) -> None:
    """Snapshot rows and binlog rows (each decoded by its own code) of every type."""
    mdb.execute(f"CREATE TABLE t ({MARIADB_TYPES.columns})",
                "INSERT INTO t VALUES " + MARIADB_TYPES.row % (1, 2))
    # A MariaDB connector's default, which the engine's converters follow.
    options = DebeziumJsonOptions(
        time_precision_mode=TimePrecisionMode.ADAPTIVE_TIME_MICROSECONDS)

    def change() -> None:
        mdb.execute("INSERT INTO t VALUES " + MARIADB_TYPES.row % (3, 4))
        mdb.execute("UPDATE t SET t6 = '-838:59:59.999999', n = 0.001 WHERE id = 3",
                    "DELETE FROM t WHERE id = 4")

    records = _run(MariaDbConnector({"dsn": mdb.dsn}), AvroConverter(options),
                   (2, change), (6, lambda: None))
    assert _check(records, options, MARIADB_TYPES.arrow_text) == 6 * MARIADB_TYPES.width


def test_every_postgres_type_in_every_converter(db: Database) -> None:
    db.execute(*POSTGRES_TYPES.prelude,
               f"CREATE TABLE t ({POSTGRES_TYPES.columns})",
               "INSERT INTO t VALUES " + POSTGRES_TYPES.row % (1, "'NaN'"))
    options = DebeziumJsonOptions()

    def change() -> None:
        db.execute("INSERT INTO t VALUES " + POSTGRES_TYPES.row % (2, "-0.000123"))
        db.execute("UPDATE t SET nn = 1e20 WHERE id = 2", "DELETE FROM t WHERE id = 1")

    records = _run(PostgresConnector({"dsn": db.dsn}), AvroConverter(options),
                   (1, change), (4, lambda: None))
    assert _check(records, options, POSTGRES_TYPES.arrow_text) == 4 * POSTGRES_TYPES.width


def test_every_log_table_type_in_every_converter(logdb: LogDb) -> None:
    types = SQLITE_LOGTABLE_TYPES if logdb.kind == "sqlite" else POSTGRES_LOGTABLE_TYPES
    logdb.execute(f"CREATE TABLE t ({types.columns})")
    row, textual, width = types.row, types.arrow_text, types.width
    logdb.install(["t"])
    logdb.execute("INSERT INTO t VALUES " + row % (1, "-0.000123"),
                  "INSERT INTO t VALUES " + row % (2, "100000000000000000000"))
    logdb.execute("UPDATE t SET n = 0.5 WHERE id = 1", "DELETE FROM t WHERE id = 2")
    options = DebeziumJsonOptions(cells=True)
    connector = LogTableConnector({"dsn": logdb.dsn, "poll_interval_ms": 50})
    records = _run(connector, AvroConverter(options), (4, lambda: None))
    assert _check(records, options, textual) == 4 * width
