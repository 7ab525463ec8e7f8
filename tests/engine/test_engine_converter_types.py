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
from tidemark.source.postgres.task import PostgresConnector

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


def _as_json(column: Column, dtype: pa.DataType, value: Any) -> Any:
    """An Arrow value (integers for temporal types: the array cast to int64) as the
    JSON converter writes the same column."""
    if value is None:
        return None
    precision = column.logical.time_precision
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
                assert _as_json(column, dtype, arrow) == value, where
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


_MARIADB_TYPES = (
    "id INT PRIMARY KEY, t0 TIME, t3 TIME(3), t6 TIME(6), d DATE, dt DATETIME, "
    "dt3 DATETIME(3), dt6 DATETIME(6), ts TIMESTAMP NULL, ts6 TIMESTAMP(6) NULL, y YEAR, "
    "b1 BIT(1), b10 BIT(10), n DECIMAL(10,3), n0 DECIMAL(30,0), e ENUM('x','y'), "
    "s SET('p','q'), j JSON, bl BLOB, vb VARBINARY(10), f FLOAT, dd DOUBLE, ti TINYINT, "
    "u BIGINT UNSIGNED, mi MEDIUMINT, c CHAR(3), tx TEXT")
_MARIADB_ROWS = (
    "(%d, '-01:02:03', '838:59:59.5', '-00:00:00.000001', '2024-02-29', "
    "'1000-01-01 00:00:00', '2024-01-02 03:04:05.123', '9999-12-31 23:59:59.999999', "
    "'1970-01-01 00:00:01', '2038-01-19 03:14:07.999999', 2024, b'1', b'1010101010', "
    "-1234.567, 123456789012345678901234567890, 'y', 'p,q', '{\"a\": [1, 2]}', "
    "x'00ff10', x'0102', 1.5, -2.25e100, -128, 18446744073709551615, -8388608, 'ab', 'é'), "
    "(%d, '00:00:00', NULL, '12:34:56.789012', '1000-01-01', NULL, NULL, "
    "'1970-01-01 00:00:00', NULL, NULL, 1901, b'0', b'0', 0, -1, NULL, '', 'null', x'', "
    "NULL, NULL, 0, 127, 0, 0, '', NULL)")


def test_every_mariadb_type_in_every_converter(mdb: MariaDatabase) -> None:
    """Snapshot rows and binlog rows (each decoded by its own code) of every type."""
    mdb.execute(f"CREATE TABLE t ({_MARIADB_TYPES})",
                "INSERT INTO t VALUES " + _MARIADB_ROWS % (1, 2))
    options = DebeziumJsonOptions()

    def change() -> None:
        mdb.execute("INSERT INTO t VALUES " + _MARIADB_ROWS % (3, 4))
        mdb.execute("UPDATE t SET t6 = '-838:59:59.999999', n = 0.001 WHERE id = 3",
                    "DELETE FROM t WHERE id = 4")

    records = _run(MariaDbConnector({"dsn": mdb.dsn}), AvroConverter(options),
                   (2, change), (6, lambda: None))
    assert _check(records, options, {}) == 6 * 27


_POSTGRES_TYPES = (
    "id int PRIMARY KEY, t time, t3 time(3), tz timetz, iv interval, n numeric(10,3), "
    "nn numeric, by bytea, ai int[], at text[], j json, jb jsonb, u uuid, au uuid[], "
    "ts timestamp, ts3 timestamp(3), tst timestamptz, d date, m money, b bool, f real, "
    "dp double precision, bi bigint, si smallint, bt bit(3), vb varbit, e mood, "
    "ip inet, c char(3), vc varchar(5)")
_POSTGRES_ROW = (
    "(%d, '23:59:59.999999', '12:00:00.5', '10:00:00+02', '1 year 2 mons 3 days "
    "04:05:06.7', -1234.567, %s, '\\x00ff', '{1,NULL,3}', '{\"a b\",c}', "
    "'{\"a\": 1}', '{\"b\": [1]}', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', "
    "'{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11}', '2024-01-02 03:04:05.123456', "
    "'1900-01-02 03:04:05.5', '2024-01-02 03:04:05.123456+02', '2024-02-29', 12.34, "
    "true, 1.5, -2.25e100, 9223372036854775807, -32768, B'101', B'11', 'happy', "
    "'10.0.0.1/8', 'ab', 'é')")
_POSTGRES_TEXT = {"tz": "10:00:00+02", "iv": "P1Y2M3DT4H5M6.7S", "m": "$12.34"}


def test_every_postgres_type_in_every_converter(db: Database) -> None:
    db.execute("CREATE TYPE mood AS ENUM ('sad', 'happy')",
               f"CREATE TABLE t ({_POSTGRES_TYPES})",
               "INSERT INTO t VALUES " + _POSTGRES_ROW % (1, "'NaN'"))
    options = DebeziumJsonOptions()

    def change() -> None:
        db.execute("INSERT INTO t VALUES " + _POSTGRES_ROW % (2, "-0.000123"))
        db.execute("UPDATE t SET nn = 1e20 WHERE id = 2", "DELETE FROM t WHERE id = 1")

    records = _run(PostgresConnector({"dsn": db.dsn}), AvroConverter(options),
                   (1, change), (4, lambda: None))
    assert _check(records, options, _POSTGRES_TEXT) == 4 * 30


def test_every_log_table_type_in_every_converter(logdb: LogDb) -> None:
    if logdb.kind == "sqlite":
        logdb.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, r REAL, tx TEXT, bl BLOB, "
                      "b BOOLEAN, n NUMERIC, dc DECIMAL(10,2), d DATE, j JSON)")
        row = "(%d, -2.5, 'é', x'00ff', 1, %s, 12.5, '2024-02-29', '{\"a\": 1}')"
        textual: dict[str, Any] = {}
        width = 9
    else:
        logdb.execute("CREATE TABLE t (id int PRIMARY KEY, t time, iv interval, "
                      "n numeric(10,3), nn numeric, by bytea, ai int[], j jsonb, u uuid, "
                      "ts timestamp, tst timestamptz, d date, b bool)")
        row = ("(%d, '12:00:00.5', '-1 day', -1234.567, %s, '\\x00ff', '{1,NULL}', "
               "'{\"a\": 1}', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', "
               "'2024-01-02 03:04:05.123456', '2024-01-02 03:04:05.123456+02', "
               "'2024-02-29', true)")
        textual = {"iv": "P-1D"}
        width = 13
    logdb.install(["t"])
    logdb.execute("INSERT INTO t VALUES " + row % (1, "-0.000123"),
                  "INSERT INTO t VALUES " + row % (2, "100000000000000000000"))
    logdb.execute("UPDATE t SET n = 0.5 WHERE id = 1", "DELETE FROM t WHERE id = 2")
    options = DebeziumJsonOptions(cells=True)
    connector = LogTableConnector({"dsn": logdb.dsn, "poll_interval_ms": 50})
    records = _run(connector, AvroConverter(options), (4, lambda: None))
    assert _check(records, options, textual) == 4 * width
