"""Column types on a real PostgreSQL: native Python values and Debezium JSON values.

One table holds a column of every type of docs/debezium-format.md §8. Its rows are
captured twice, by the snapshot (op "r", rows present before the connector starts) and
by the stream (op "c", rows inserted after a ``no_data`` start), and both must give the
same values: the native ones of ``event.after`` and the JSON ones Debezium 3.x emits,
in every decimal and time precision mode. The unchanged TOASTed values of §9 get
their own table.
"""

from __future__ import annotations

import base64
import datetime as dt
import math
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any
from uuid import UUID

import pytest

from capture_helpers import as_json, drain, events, make_connector
from conftest import Database
from tidemark.event import UNAVAILABLE, ChangeEvent, Op
from tidemark.serde.modes import DecimalHandlingMode, TimePrecisionMode
from tidemark.source.postgres.types import Interval
from tidemark.testing.postgres import PostgresCluster

# Run on every PostgreSQL version CI tests (scripts/test.sh).
pytestmark = pytest.mark.every_pg_version

UTC = dt.UTC
PLUS_2 = dt.timezone(dt.timedelta(hours=2))
UNCHECKED = object()  # a cell the reference leaves open, or that a dedicated test checks


@dataclass(frozen=True)
class Col:
    """One column of the ``types`` table; rows 1-3 as listed, row 4 all NULL."""

    name: str
    sql_type: str
    sql: tuple[str, str, str]  # SQL literals of rows 1-3
    python: tuple[Any, Any, Any]  # event.after values
    debezium: tuple[Any, Any, Any]  # Debezium JSON values, default modes


COLUMNS = [
    Col("c_int2", "smallint", ("-32768", "32767", "0"),
        (-32768, 32767, 0), (-32768, 32767, 0)),
    Col("c_int4", "integer", ("2147483647", "-2147483648", "0"),
        (2147483647, -2147483648, 0), (2147483647, -2147483648, 0)),
    Col("c_int8", "bigint", ("9223372036854775807", "-9223372036854775808", "0"),
        (9223372036854775807, -9223372036854775808, 0),
        (9223372036854775807, -9223372036854775808, 0)),
    # Decimal: Base64 of the unscaled two's-complement big-endian bytes at the column
    # scale: 1234 = 04 d2, -1230 = fb 32, 500 = 01 f4.
    Col("c_num", "numeric(12,2)", ("12.34", "-12.30", "5"),
        (Decimal("12.34"), Decimal("-12.30"), Decimal("5.00")), ("BNI=", "+zI=", "AfQ=")),
    # VariableScaleDecimal: stripTrailingZeros, negative scale reset to 0.
    Col("c_numvar", "numeric", ("1.50", "100.00", "0.0000001"),
        (Decimal("1.50"), Decimal("100.00"), Decimal("1E-7")),
        ({"scale": 1, "value": "Dw=="}, {"scale": 0, "value": "ZA=="},
         {"scale": 7, "value": "AQ=="})),
    # Precise mode cannot carry them: Debezium throws (§8), so only the other modes'
    # JSON is checked (test_decimal_and_time_modes).
    Col("c_numspecial", "numeric", ("'NaN'", "'Infinity'", "'-Infinity'"),
        (Decimal("NaN"), Decimal("Infinity"), Decimal("-Infinity")),
        (UNCHECKED, UNCHECKED, UNCHECKED)),
    Col("c_real", "real", ("1.5", "'NaN'", "'-Infinity'"),
        (1.5, math.nan, -math.inf), (1.5, "NaN", "-Infinity")),
    Col("c_double", "double precision", ("3.141592653589793", "'Infinity'", "'NaN'"),
        (3.141592653589793, math.inf, math.nan), (3.141592653589793, "Infinity", "NaN")),
    Col("c_bool", "boolean", ("true", "false", "NULL"), (True, False, None), (True, False, None)),
    Col("c_text", "text", ("'héllo \"wörld\" ☃'", r"E'tab\there\nnewline'", "NULL"),
        ('héllo "wörld" ☃', "tab\there\nnewline", None),
        ('héllo "wörld" ☃', "tab\there\nnewline", None)),
    Col("c_varchar", "varchar(20)", ("'abc'", "''", "NULL"), ("abc", "", None), ("abc", "", None)),
    # char(n) keeps the blank padding.
    Col("c_char", "char(5)", ("'ab'", "'abcde'", "NULL"),
        ("ab   ", "abcde", None), ("ab   ", "abcde", None)),
    # Days since 1970-01-01.
    Col("c_date", "date", ("'2024-01-15'", "'1969-12-31'", "'1970-01-01'"),
        (dt.date(2024, 1, 15), dt.date(1969, 12, 31), dt.date(1970, 1, 1)), (19737, -1, 0)),
    # MicroTime: µs past midnight.
    Col("c_time", "time", ("'10:30:00.123456'", "'00:00:00'", "'23:59:59.999999'"),
        (dt.time(10, 30, 0, 123456), dt.time(0, 0), dt.time(23, 59, 59, 999999)),
        (37800123456, 0, 86399999999)),
    # time(0-3) is Time: ms past midnight.
    Col("c_time3", "time(3)", ("'10:30:00.123'", "'23:59:59.999'", "NULL"),
        (dt.time(10, 30, 0, 123000), dt.time(23, 59, 59, 999000), None),
        (37800123, 86399999, None)),
    # ZonedTime: converted to UTC, seconds always printed, fraction trimmed.
    Col("c_timetz", "timetz", ("'10:15:30.5+02'", "'01:00:00+02'", "'10:15:30+00'"),
        (dt.time(10, 15, 30, 500000, tzinfo=PLUS_2), dt.time(1, 0, tzinfo=PLUS_2),
         dt.time(10, 15, 30, tzinfo=UTC)),
        ("08:15:30.5Z", "23:00:00Z", "10:15:30Z")),
    # MicroTimestamp: µs since the epoch, wall clock read as UTC; infinity per §8.
    Col("c_ts", "timestamp",
        ("'2024-01-15 10:30:00.123456'", "'1969-12-31 23:59:59.5'", "'infinity'"),
        (dt.datetime(2024, 1, 15, 10, 30, 0, 123456), dt.datetime(1969, 12, 31, 23, 59, 59, 500000),
         dt.datetime.max),
        (1705314600123456, -500000, 9223372036825200000)),
    # timestamp(0-3) is Timestamp: ms since the epoch.
    Col("c_ts3", "timestamp(3)", ("'2024-01-15 10:30:00.123'", "'1969-12-31 23:59:59.5'", "NULL"),
        (dt.datetime(2024, 1, 15, 10, 30, 0, 123000), dt.datetime(1969, 12, 31, 23, 59, 59, 500000),
         None),
        (1705314600123, -500, None)),
    # ZonedTimestamp: UTC, 'Z', fraction zero-padded to the precision (6 when undeclared).
    Col("c_tstz", "timestamptz",
        ("'2024-01-15 10:30:00.123456+00'", "'2024-01-15 12:30:00+02'",
         "'1999-12-31 23:59:59.5-01'"),
        (dt.datetime(2024, 1, 15, 10, 30, 0, 123456, tzinfo=UTC),
         dt.datetime(2024, 1, 15, 10, 30, tzinfo=UTC),
         dt.datetime(2000, 1, 1, 0, 59, 59, 500000, tzinfo=UTC)),
        ("2024-01-15T10:30:00.123456Z", "2024-01-15T10:30:00.000000Z",
         "2000-01-01T00:59:59.500000Z")),
    Col("c_tstz3", "timestamptz(3)",
        ("'2024-01-15 10:30:00.5+00'", "'2024-01-15 10:30:00+00'", "NULL"),
        (dt.datetime(2024, 1, 15, 10, 30, 0, 500000, tzinfo=UTC),
         dt.datetime(2024, 1, 15, 10, 30, tzinfo=UTC), None),
        ("2024-01-15T10:30:00.500Z", "2024-01-15T10:30:00.000Z", None)),
    # Width 0: ISO_OFFSET_DATE_TIME, no fraction.
    Col("c_tstz0", "timestamptz(0)",
        ("'2024-01-15 10:30:00+00'", "'2024-01-15 10:30:00.7+00'", "'infinity'"),
        (dt.datetime(2024, 1, 15, 10, 30, tzinfo=UTC),
         dt.datetime(2024, 1, 15, 10, 30, 1, tzinfo=UTC), dt.datetime.max.replace(tzinfo=UTC)),
        ("2024-01-15T10:30:00Z", "2024-01-15T10:30:01Z", "infinity")),
    # MicroDuration with 30.4375 days per month.
    Col("c_interval", "interval",
        ("'1 year 2 mons 3 days 04:05:06.78'", "'1 mon'", "'-1 days -02:00:00'"),
        (Interval(14, 3, 14_706_780_000), Interval(1, 0, 0), Interval(0, -1, -7_200_000_000)),
        (37091106780000, 2629800000000, -93600000000)),
    Col("c_uuid", "uuid",
        ("'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11'", "'00000000-0000-0000-0000-000000000000'",
         "NULL"),
        (UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"), UUID(int=0), None),
        ("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "00000000-0000-0000-0000-000000000000", None)),
    # json keeps the text as written, jsonb is normalized by the server.
    Col("c_json", "json", ("'{\"b\": 1,  \"a\": [1, 2]}'", "'[]'", "'null'"),
        ('{"b": 1,  "a": [1, 2]}', "[]", "null"), ('{"b": 1,  "a": [1, 2]}', "[]", "null")),
    Col("c_jsonb", "jsonb", ("'{\"b\": 1,  \"a\": [1, 2]}'", "'{}'", "'null'"),
        ('{"a": [1, 2], "b": 1}', "{}", "null"), ('{"a": [1, 2], "b": 1}', "{}", "null")),
    Col("c_bytea", "bytea", (r"'\x00ff10'", "''", "'hello'::bytea"),
        (b"\x00\xff\x10", b"", b"hello"), ("AP8Q", "", "aGVsbG8=")),
    Col("c_int_arr", "int[]", ("'{1,2,NULL}'", "'{}'", "'{-2147483648}'"),
        ([1, 2, None], [], [-2147483648]), ([1, 2, None], [], [-2147483648])),
    Col("c_text_arr", "text[]",
        (r"""ARRAY['a,b', 'say "hi"', NULL, 'NULL', 'back\slash', '', '{x}', ' pad ']""",
         "'{}'", "ARRAY[NULL]::text[]"),
        (["a,b", 'say "hi"', None, "NULL", "back\\slash", "", "{x}", " pad "], [], [None]),
        (["a,b", 'say "hi"', None, "NULL", "back\\slash", "", "{x}", " pad "], [], [None])),
    # numeric[] elements use the column's numeric schema: VariableScaleDecimal here.
    Col("c_num_arr", "numeric[]", ("'{1.5,NULL,-2,100.00}'", "'{}'", "'{-0.5}'"),
        ([Decimal("1.5"), None, Decimal("-2"), Decimal("100.00")], [], [Decimal("-0.5")]),
        ([{"scale": 1, "value": "Dw=="}, None, {"scale": 0, "value": "/g=="},
          {"scale": 0, "value": "ZA=="}], [], [{"scale": 1, "value": "+w=="}])),
    Col("c_int_2d", "int[][]", ("'{{1,2},{3,4}}'", "'{{NULL,5}}'", "'{}'"),
        ([[1, 2], [3, 4]], [[None, 5]], []), ([[1, 2], [3, 4]], [[None, 5]], [])),
    Col("c_enum", "mood", ("'happy'", "'sad'", "NULL"), ("happy", "sad", None),
        ("happy", "sad", None)),
    # Enum arrays: ARRAY of the element's mapping (Enum strings), NULL elements null.
    Col("c_enum_arr", "mood[]", ("'{happy,NULL,sad}'", "'{}'", "NULL"),
        (["happy", None, "sad"], [], None), (["happy", None, "sad"], [], None)),
    # money: Decimal with scale 2 (money.fraction.digits).
    Col("c_money", "money", ("12.34", "-1234.56", "0"),
        (Decimal("12.34"), Decimal("-1234.56"), Decimal("0.00")), ("BNI=", "/h3A", "AA==")),
]
COLUMN = {c.name: c for c in COLUMNS}
ROWS = 4

# Debezium has no schema for arrays of money, name, interval, varbit, xml and point and
# drops such columns (§8); tidemark keeps them. Captured in a table of their own.
NO_SCHEMA_DDL = "CREATE TABLE no_schema (id int PRIMARY KEY, m money[], iv interval[])"
NO_SCHEMA_ROW = "INSERT INTO no_schema VALUES (1, '{1.50}', '{1 day}')"


def _row_sql(row: int) -> str:
    literals = [str(row + 1)] + [c.sql[row] if row < 3 else "NULL" for c in COLUMNS]
    return f"INSERT INTO types VALUES ({', '.join(literals)})"


@dataclass(frozen=True)
class Captured:
    snapshot: list[ChangeEvent]  # types rows, by id
    stream: list[ChangeEvent]
    no_schema: dict[str, ChangeEvent]  # path -> the no_schema row


def _by_table(got: list[ChangeEvent]) -> tuple[list[ChangeEvent], ChangeEvent]:
    rows = sorted((e for e in got if e.table.table == "types"),
                  key=lambda e: (e.key or {}).get("id", 0))
    (other,) = [e for e in got if e.table.table == "no_schema"]
    return rows, other


@pytest.fixture(scope="module")
def captured(pg_cluster: PostgresCluster) -> Iterator[Captured]:
    """The rows captured by the stream, then by a snapshot (each with its own slot)."""
    name = "capture_types"
    pg_cluster.create_database(name)
    try:
        db = Database(pg_cluster, name)
        db.execute("CREATE TYPE mood AS ENUM ('happy', 'sad', 'ok')",
                   "CREATE TABLE types (id int PRIMARY KEY, "
                   + ", ".join(f"{c.name} {c.sql_type}" for c in COLUMNS) + ")",
                   NO_SCHEMA_DDL)
        tables = ("public.types", "public.no_schema")
        conn = make_connector(db.dsn, *tables, snapshot_mode="no_data",
                              slot_name="types_stream", publication_name="types_stream")
        conn.start()
        try:
            drain(conn, db.insert_lsn())
            db.execute(*(_row_sql(i) for i in range(ROWS)), NO_SCHEMA_ROW)
            stream, stream_other = _by_table(events(drain(conn, db.insert_lsn())))
        finally:
            conn.stop()
        conn = make_connector(db.dsn, *tables, snapshot_mode="initial",
                              slot_name="types_snapshot", publication_name="types_snapshot")
        conn.start()
        try:
            snapshot, snapshot_other = _by_table(events(drain(conn, db.insert_lsn())))
        finally:
            conn.stop()
        yield Captured(snapshot, stream, {"snapshot": snapshot_other, "stream": stream_other})
    finally:
        pg_cluster.drop_database(name)


def _paths(captured: Captured) -> dict[str, list[ChangeEvent]]:
    return {"snapshot": captured.snapshot, "stream": captured.stream}


def assert_same(actual: Any, expected: Any, where: str = "") -> None:
    """Equal and of exactly the same type: True is not 1, 1 is not 1.0, NaN equals NaN,
    Decimals digit for digit, datetimes and times with the same UTC offset."""
    assert type(actual) is type(expected), \
        f"{where}: {actual!r} is a {type(actual).__name__}, expected {expected!r}"
    if isinstance(expected, list):
        assert len(actual) == len(expected), f"{where}: {actual!r} != {expected!r}"
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            assert_same(a, e, f"{where}[{i}]")
    elif isinstance(expected, dict):
        assert list(actual) == list(expected), f"{where}: {actual!r} != {expected!r}"
        for key in expected:
            assert_same(actual[key], expected[key], f"{where}.{key}")
    elif isinstance(expected, float) and math.isnan(expected):
        assert math.isnan(actual), f"{where}: {actual!r} is not NaN"
    elif isinstance(expected, Decimal):
        assert str(actual) == str(expected), f"{where}: {actual!r} != {expected!r}"
    elif isinstance(expected, dt.datetime | dt.time):
        assert (actual, actual.utcoffset()) == (expected, expected.utcoffset()), \
            f"{where}: {actual!r} != {expected!r}"
    else:
        assert actual == expected, f"{where}: {actual!r} != {expected!r}"


def _params() -> list[Any]:
    return [pytest.param(col.name, id=col.name) for col in COLUMNS]


# -- snapshot and stream agree ----------------------------------------------------------
def test_snapshot_and_stream_give_identical_rows(captured: Captured) -> None:
    snap, stream = captured.snapshot, captured.stream
    assert [e.op for e in snap] == [Op.READ] * ROWS
    assert [e.op for e in stream] == [Op.CREATE] * ROWS
    assert [e.key for e in snap] == [e.key for e in stream] == [{"id": i + 1} for i in range(ROWS)]
    for s, c in zip(snap, stream, strict=True):
        assert s.raw_after == c.raw_after
        assert s.after is not None and c.after is not None
        assert_same(s.after, c.after, f"row {c.after['id']}")
    snap_json, stream_json = as_json(snap), as_json(stream)
    assert [line["key"] for line in snap_json] == [line["key"] for line in stream_json] \
        == [{"id": i + 1} for i in range(ROWS)]
    assert [line["value"]["after"] for line in snap_json] \
        == [line["value"]["after"] for line in stream_json]


def test_after_has_every_column_in_table_order(captured: Captured) -> None:
    names = ["id", *(c.name for c in COLUMNS)]
    for path, got in _paths(captured).items():
        assert [list(e.after or ()) for e in got] == [names] * ROWS, path
        assert [list(line["value"]["after"]) for line in as_json(got)] == [names] * ROWS, path


def test_sql_null_of_every_type(captured: Captured) -> None:
    for path, got in _paths(captured).items():
        nulls = {c.name: None for c in COLUMNS}
        assert got[3].after == {"id": 4, **nulls}, path
        assert as_json(got[3:])[0]["value"]["after"] == {"id": 4, **nulls}, path


# -- per type: native Python values and Debezium JSON values -----------------------------
@pytest.mark.parametrize("column", _params())
def test_python_value(captured: Captured, column: str) -> None:
    expected = [*COLUMN[column].python, None]
    for path, got in _paths(captured).items():
        for row, event in enumerate(got):
            assert event.after is not None
            assert_same(event.after[column], expected[row], f"{path} row {row + 1} {column}")


@pytest.mark.parametrize("column", _params())
def test_debezium_json_value(captured: Captured, column: str) -> None:
    expected = [*COLUMN[column].debezium, None]
    for path, got in _paths(captured).items():
        for row, line in enumerate(as_json(got)):
            if expected[row] is not UNCHECKED:
                assert_same(line["value"]["after"][column], expected[row],
                            f"{path} row {row + 1} {column}")


# -- decimal_handling_mode and time_precision_mode ----------------------------------------
STRING = {"decimal_handling_mode": DecimalHandlingMode.STRING}
DOUBLE = {"decimal_handling_mode": DecimalHandlingMode.DOUBLE}
CONNECT = {"time_precision_mode": TimePrecisionMode.CONNECT}
MICROS = {"time_precision_mode": TimePrecisionMode.ADAPTIVE_TIME_MICROSECONDS}

MODE_CASES: list[tuple[str, dict[str, Any], str, tuple[Any, Any, Any]]] = [
    # string: BigDecimal.toPlainString() at the column scale; specials as enum names.
    ("string", STRING, "c_num", ("12.34", "-12.30", "5.00")),
    # 1E-7 (plain: 0.0000001) is test_string_mode_tiny_numeric_is_plain_text's.
    ("string", STRING, "c_numvar", ("1.50", "100.00", UNCHECKED)),
    ("string", STRING, "c_numspecial", ("NAN", "POSITIVE_INFINITY", "NEGATIVE_INFINITY")),
    ("string", STRING, "c_num_arr", (["1.5", None, "-2", "100.00"], [], ["-0.5"])),
    # money 0: §8 does not say how Debezium prints it in string mode.
    ("string", STRING, "c_money", ("12.34", "-1234.56", UNCHECKED)),
    # double: FLOAT64, specials as Jackson's quoted names.
    ("double", DOUBLE, "c_num", (12.34, -12.3, 5.0)),
    ("double", DOUBLE, "c_numvar", (1.5, 100.0, 1e-07)),
    ("double", DOUBLE, "c_numspecial", ("NaN", "Infinity", "-Infinity")),
    ("double", DOUBLE, "c_num_arr", ([1.5, None, -2.0, 100.0], [], [-0.5])),
    ("double", DOUBLE, "c_money", (12.34, -1234.56, 0.0)),
    # connect: Connect Date (days), Time (ms), Timestamp (ms); zoned types unchanged.
    ("connect", CONNECT, "c_date", (19737, -1, 0)),
    ("connect", CONNECT, "c_time", (37800123, 0, 86399999)),
    ("connect", CONNECT, "c_time3", (37800123, 86399999, None)),
    # infinity in ms is UNCONFIRMED in §8.
    ("connect", CONNECT, "c_ts", (1705314600123, -500, UNCHECKED)),
    ("connect", CONNECT, "c_ts3", (1705314600123, -500, None)),
    ("connect", CONNECT, "c_tstz", COLUMN["c_tstz"].debezium),
    ("connect", CONNECT, "c_tstz3", COLUMN["c_tstz3"].debezium),
    ("connect", CONNECT, "c_timetz", COLUMN["c_timetz"].debezium),
    # adaptive_time_microseconds: MicroTime for every time precision; timestamps adaptive.
    ("micros", MICROS, "c_time", (37800123456, 0, 86399999999)),
    ("micros", MICROS, "c_time3", (37800123000, 86399999000, None)),
    ("micros", MICROS, "c_ts", COLUMN["c_ts"].debezium),
    ("micros", MICROS, "c_ts3", COLUMN["c_ts3"].debezium),
    ("micros", MICROS, "c_date", COLUMN["c_date"].debezium),
    ("micros", MICROS, "c_tstz", COLUMN["c_tstz"].debezium),
]


@pytest.mark.parametrize(("options", "column", "expected"), [
    pytest.param(options, column, expected, id=f"{mode}-{column}")
    for mode, options, column, expected in MODE_CASES
])
def test_decimal_and_time_modes(captured: Captured, options: dict[str, Any], column: str,
                                expected: tuple[Any, Any, Any]) -> None:
    for path, got in _paths(captured).items():
        lines = as_json(got, **options)
        for row, want in enumerate([*expected, None]):
            if want is not UNCHECKED:
                assert_same(lines[row]["value"]["after"][column], want,
                            f"{path} row {row + 1} {column}")


def test_modes_leave_other_columns_alone(captured: Captured) -> None:
    changed = {(mode, column) for mode, _, column, _ in MODE_CASES}
    for mode, options in (("string", STRING), ("double", DOUBLE), ("connect", CONNECT),
                          ("micros", MICROS)):
        default, other = as_json(captured.stream), as_json(captured.stream, **options)
        for d, o in zip(default, other, strict=True):
            for name, value in d["value"]["after"].items():
                if (mode, name) not in changed:
                    assert o["value"]["after"][name] == value, (mode, name)


def test_string_mode_tiny_numeric_is_plain_text(captured: Captured) -> None:
    # Debezium 3.6.3 writes 0.000000123, not BigDecimal.toString()'s 1.23E-7
    # (tests/reference/debezium-3.6.3/decimal-string-time-connect.jsonl).
    for path, got in _paths(captured).items():
        line = as_json(got[2:3], **STRING)[0]
        assert line["value"]["after"]["c_numvar"] == "0.0000001", path


def test_arrays_without_a_debezium_schema_are_kept(captured: Captured) -> None:
    # Debezium has no schema for money[] and interval[] and drops such columns (§8);
    # tidemark keeps the data, converted element by element. A deliberate difference.
    for path, event in captured.no_schema.items():
        assert as_json([event])[0]["value"]["after"] == {
            "id": 1, "m": ["AJY="], "iv": [86400000000]}, path


# -- unchanged TOASTed values (§9) -------------------------------------------------------
PLACEHOLDER = "__debezium_unavailable_value"


def test_unchanged_toasted_bytea_and_arrays_are_placeholders(db: Database) -> None:
    toasted = ("b", "ta", "ia")
    db.execute("CREATE TABLE toasty (id int PRIMARY KEY, n int, b bytea, ta text[], ia int[])",
               *(f"ALTER TABLE toasty ALTER COLUMN {c} SET STORAGE EXTERNAL" for c in toasted))
    big_bytes = bytes(range(256)) * 400  # 100 kB, stored out of line uncompressed
    big_texts = ["x" * 100_000, None, "y"]
    big_ints = list(range(30_000))
    conn = make_connector(db.dsn, "public.toasty", snapshot_mode="no_data")
    conn.start()
    try:
        drain(conn, db.insert_lsn())
        db.execute("INSERT INTO toasty VALUES (1, 1, %s, %s, %s)",
                   params=(big_bytes, big_texts, big_ints))
        db.autocommit("UPDATE toasty SET n = 2 WHERE id = 1")
        got = events(drain(conn, db.insert_lsn()))
    finally:
        conn.stop()
    assert [e.op for e in got] == [Op.CREATE, Op.UPDATE]
    insert, update = got
    assert insert.after == {"id": 1, "n": 1, "b": big_bytes, "ta": big_texts, "ia": big_ints}
    assert update.before is None and update.after is not None
    assert update.after["n"] == 2
    for name in toasted:
        assert update.after[name] is UNAVAILABLE, name
    insert_json, update_json = (line["value"]["after"] for line in as_json(got))
    assert insert_json["b"] == base64.b64encode(big_bytes).decode()
    assert insert_json["ta"] == big_texts and insert_json["ia"] == big_ints
    assert update_json == {
        "id": 1,
        "n": 2,
        # bytea (binary.handling.mode=bytes): the placeholder's bytes, Base64.
        "b": "X19kZWJleml1bV91bmF2YWlsYWJsZV92YWx1ZQ==",
        "ta": [PLACEHOLDER],
        # int4[]: the placeholder's bytes as numbers.
        "ia": [95, 95, 100, 101, 98, 101, 122, 105, 117, 109, 95, 117, 110, 97, 118, 97, 105,
               108, 97, 98, 108, 101, 95, 118, 97, 108, 117, 101],
    }
    assert base64.b64decode(update_json["b"]) == PLACEHOLDER.encode() == bytes(update_json["ia"])


def test_ranges_in_snapshot_and_stream_and_negative_scale(db: Database) -> None:
    db.execute("CREATE TABLE r (id int PRIMARY KEY, span int4range, when_ tstzrange, "
               "hundreds numeric(5, -2))",
               "INSERT INTO r VALUES (1, '[1,5)', '[2024-01-01,2024-02-01)', 12345)")
    conn = make_connector(db.dsn, "public.r")
    conn.start()
    try:
        got = events(drain(conn, db.insert_lsn()))
        db.autocommit("INSERT INTO r VALUES (2, '[2,3)', NULL, 500)")
        got += events(drain(conn, db.insert_lsn()))
    finally:
        conn.stop()
    rows = [line["value"]["after"] for line in as_json(got)]
    assert rows[0]["span"] == "[1,5)" and rows[1]["span"] == "[2,3)"
    assert rows[0]["when_"].startswith("[\"2024-01-01 00:00:00+00\"")
    # numeric(5,-2): 12345 is stored as 12300, scale -2 -> unscaled 123
    assert rows[0]["hundreds"] == base64.b64encode(bytes([123])).decode()
    assert rows[1]["hundreds"] == base64.b64encode(bytes([5])).decode()


def test_times_are_the_same_in_snapshot_and_stream_when_the_server_is_not_on_utc(
        db: Database) -> None:
    """The snapshot reads values as text through a session; the stream gets the text
    of the walsender's session. With a TimeZone that is not UTC (set for the database,
    as a server's would be) both must still give one value for one instant."""
    db.autocommit(f"ALTER DATABASE {db.name} SET timezone TO 'America/St_Johns'")
    db.execute("CREATE TABLE tz (id int PRIMARY KEY, n int, ts timestamp, tstz timestamptz, "
               "t time, ttz timetz, d date)",
               "INSERT INTO tz VALUES (1, 0, '2024-03-10 02:30:00', "
               "'2024-03-10 02:30:00+00', '23:59:59.5', '12:00:00+05:30', '2024-03-10'), "
               "(2, 0, '1999-12-31 23:59:59.999999', '1999-12-31 23:59:59.999999-08', "
               "'00:00:00', '00:00:00-03', '1999-12-31')")
    conn = make_connector(db.dsn, "public.tz")
    conn.start()
    try:
        snapshot = events(drain(conn, db.insert_lsn()))
        db.autocommit("UPDATE tz SET n = 1")
        streamed = events(drain(conn, db.insert_lsn()))
    finally:
        conn.stop()
    def values(rows: list[ChangeEvent]) -> dict[int, dict[str, object]]:
        afters = [line["value"]["after"] for line in as_json(rows)]
        return {a["id"]: {k: x for k, x in a.items() if k != "n"} for a in afters}
    assert len(snapshot) == len(streamed) == 2
    assert values(snapshot) == values(streamed)
    assert values(snapshot)[1]["tstz"] == "2024-03-10T02:30:00.000000Z"

