"""The matrix's ``types`` table: a :class:`~conformance.sources.Column` per type of a
source's list (:mod:`type_lists`), with the Arrow type the runtimes' rows are decoded to
(:mod:`tidemark.serde.arrow_changes`: a type without an exact Arrow counterpart is its
text) and a normal form (:func:`normal`) under which every runtime's documented
representation of a value and the source's own are equal."""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import json
import re
import uuid
from decimal import Decimal
from typing import Any

import pyarrow as pa

from type_lists import (
    MARIADB_TYPES,
    POSTGRES_LOGTABLE_TYPES,
    POSTGRES_TYPES,
    SQLITE_LOGTABLE_TYPES,
    TypeList,
)

_US = pa.time64("us")
_TS = pa.timestamp("us")
_TSZ = pa.timestamp("us", tz="UTC")
#: Debezium's adaptive modes write precision 0-3 in milliseconds (Time, Timestamp): the
#: JSON readers take the unit from the envelope's schema, or without one from these.
_MS = pa.time32("ms")
_TS_MS = pa.timestamp("ms")
#: A time that is a duration (MariaDB's TIME) in microseconds, as its envelope has it.
_DURATION = pa.int64()
#: PostgreSQL's money is Debezium's decimal of scale 2 (bytes in precise mode).
_MONEY = pa.decimal128(38, 2)

#: Column -> Arrow type, per type list; a column not named is a string (its text).
ARROW: dict[int, dict[str, pa.DataType]] = {
    id(POSTGRES_TYPES): {
        "t": _US, "t3": _MS, "n": pa.decimal128(10, 3), "by": pa.binary(), "m": _MONEY,
        "ai": pa.list_(pa.int32()), "at": pa.list_(pa.string()),
        "au": pa.list_(pa.string()), "ts": _TS, "ts3": _TS_MS, "tst": _TSZ, "d": pa.date32(),
        "b": pa.bool_(), "f": pa.float32(), "dp": pa.float64(), "bi": pa.int64(),
        "si": pa.int16()},
    id(POSTGRES_LOGTABLE_TYPES): {
        "t": _US, "n": pa.decimal128(10, 3), "by": pa.binary(), "ai": pa.list_(pa.int32()),
        "ts": _TS, "tst": _TSZ, "d": pa.date32(), "b": pa.bool_()},
    id(MARIADB_TYPES): {
        # MariaDB's TIME is a duration (signed, up to 838 h): Debezium's MicroTime.
        "t0": _DURATION, "t3": _DURATION, "t6": _DURATION, "d": pa.date32(), "dt": _TS_MS,
        "dt3": _TS_MS, "dt6": _TS,
        "ts": _TSZ, "ts6": _TSZ, "y": pa.int32(), "b1": pa.bool_(), "b10": pa.binary(),
        "u": pa.int64(),
        "n": pa.decimal128(10, 3), "n0": pa.decimal128(30, 0), "bl": pa.binary(),
        "vb": pa.binary(), "f": pa.float32(), "dd": pa.float64(), "ti": pa.int16(),
        "mi": pa.int32()},
    id(SQLITE_LOGTABLE_TYPES): {
        "r": pa.float64(), "bl": pa.binary(), "b": pa.bool_(), "dc": pa.decimal128(10, 2),
        "d": pa.date32()},
}


#: Columns the source is read as text (``SELECT x::text``): their driver's own value is
#: not the type's (psycopg's interval is a timedelta of 30-day months).
AS_TEXT = {"interval"}


#: Columns an Arrow batch carries as their number's text (decimals without a declared
#: precision: :func:`tidemark.serde.arrow_changes.arrow_type`), read back as decimals.
NUMERIC_TEXT: dict[int, set[str]] = {
    id(POSTGRES_TYPES): {"nn"}, id(POSTGRES_LOGTABLE_TYPES): {"nn"},
    id(SQLITE_LOGTABLE_TYPES): {"n"}, id(MARIADB_TYPES): set()}


def from_text(row: dict[str, Any], schema: pa.Schema, types: TypeList | None) -> dict[
        str, Any]:
    """*row* with the values a Spark row or a Delta table carries as text read as
    *schema* types them: the numbers of :data:`NUMERIC_TEXT` (Spark's decimals need a
    declared precision), and SQLite's DATE and DECIMAL (a storage class of text or
    real: their declared type is a name, the Spark type string); Bits as :func:`from_debezium`."""
    numeric = NUMERIC_TEXT[id(types)] if types is not None else set()
    out = from_debezium(row, types)
    for name, value in row.items():
        if isinstance(value, str) and name in schema.names:
            arrow = schema.field(name).type
            try:
                if name in numeric or pa.types.is_decimal(arrow):
                    out[name] = Decimal(value)
                elif pa.types.is_date32(arrow):
                    out[name] = dt.date.fromisoformat(value)
            except (ArithmeticError, ValueError):
                pass  # a type's own text (money's '$12.34'): normal() reads it
    return out


#: BIT(n > 1) columns: Debezium's Bits are the bits' bytes little-endian, the
#: driver's big-endian.
BITS: dict[int, set[str]] = {id(MARIADB_TYPES): {"b10"}}


def from_debezium(row: dict[str, Any], types: TypeList | None) -> dict[str, Any]:
    """*row*, decoded from a Debezium envelope, with its Bits in the driver's order."""
    bits = BITS.get(id(types), set())
    return {n: v[::-1] if n in bits and isinstance(v, bytes) else v for n, v in row.items()}


def time_millis(envelope: dict[str, Any], schema: pa.Schema) -> None:
    """Scale to microseconds, in place, the duration columns (:data:`_DURATION`) whose
    envelope schema says ``io.debezium.time.Time``: milliseconds, Debezium's adaptive
    mode for a TIME of precision 0-3."""
    for part in (envelope.get("schema") or {}).get("fields") or ():
        row = (envelope.get("payload") or envelope).get(part.get("field"))
        for field in part.get("fields") or ():
            name = field.get("field")
            if field.get("name") == "io.debezium.time.Time" and isinstance(row, dict) \
                    and name in schema.names and schema.field(name).type == _DURATION \
                    and isinstance(row.get(name), int):
                row[name] *= 1000


def from_batch(batch: pa.RecordBatch, schema: pa.Schema, types: TypeList | None) -> list[
        dict[str, Any]]:
    """An Arrow batch's rows (the engine's arrow converter) as the JSON readers read the
    same change: a time column that is a duration as its microseconds, a column the
    batch carries as text read as *schema* types it (:func:`from_text`)."""
    columns = {}
    for field in batch.schema:
        column = batch.column(field.name)
        want = schema.field(field.name).type if field.name in schema.names else None
        if pa.types.is_time64(field.type) and want == _DURATION:
            column = column.cast(_DURATION)
        columns[field.name] = column.to_pylist()
    return [from_text(dict(zip(columns, values, strict=True)), schema, types)
            for values in zip(*columns.values(), strict=True)]


def arrow_types(types: TypeList) -> dict[str, pa.DataType]:
    """Every non-key column of *types* with its Arrow type."""
    known = ARROW[id(types)]
    return {name: known.get(name, pa.string()) for name in types.names()[1:]}


def typed(value: Any, arrow: pa.DataType) -> Any:
    """A source driver's value as its column's type (SQLite's driver gives a value's
    storage class: 1 for a BOOLEAN, a float for a DECIMAL, text for a DATE)."""
    if pa.types.is_boolean(arrow) and isinstance(value, int):
        return bool(value)
    if pa.types.is_boolean(arrow) and isinstance(value, bytes):
        return any(value)  # MariaDB's BIT(1): Debezium's boolean
    if pa.types.is_int64(arrow) and isinstance(value, int) and value >= 2**63:
        return value - 2**64  # BIGINT UNSIGNED: int64, wrapped (Debezium's long mode)
    if isinstance(value, float) and (pa.types.is_decimal(arrow) or pa.types.is_string(arrow)):
        return Decimal(repr(value))
    if pa.types.is_date32(arrow) and isinstance(value, str):
        return dt.date.fromisoformat(value)
    return value


_CLOCK = re.compile(r"-?\d{2,3}:\d{2}:\d{2}(\.\d{1,9})?$")


def _clock_micros(text: str) -> int:
    """A clock's text (a time of day, or MariaDB's TIME: signed, past 24 hours) in
    microseconds."""
    sign = -1 if text.startswith("-") else 1
    hours, minutes, seconds = text.lstrip("-").split(":")
    whole, _, fraction = seconds.partition(".")
    micros = (int(hours) * 3600 + int(minutes) * 60 + int(whole)) * 10**6
    return sign * (micros + int((fraction + "000000")[:6]))


_ZONED = re.compile(r"(\d{2}):(\d{2}):(\d{2})(\.\d{1,6})?(Z|[+-]\d{2}(?::?\d{2})?)$")
_ISO_DURATION = re.compile(r"P(?:(-?\d+)Y)?(?:(-?\d+)M)?(?:(-?\d+)D)?"
                           r"(?:T(?:(-?\d+)H)?(?:(-?\d+)M)?(?:(-?[\d.]+)S)?)?$")
_MONEY_TEXT = re.compile(r"-?\$[\d,]+\.\d{2}$")
#: Debezium's MicroDuration: a month is 365.25 / 12 days.
_MONTH_US = Decimal("365.25") / 12 * 86_400 * 10**6


def _utc_clock(match: re.Match[str]) -> str:
    """A time with a zone as UTC text, as Debezium's ZonedTime writes it."""
    hours, minutes, seconds, fraction, zone = match.groups()
    offset = 0
    if zone != "Z":
        sign = -1 if zone[0] == "-" else 1
        digits = zone[1:].replace(":", "")
        offset = sign * (int(digits[:2]) * 60 + int(digits[2:4] or 0))
    total = (int(hours) * 60 + int(minutes) - offset) % (24 * 60)
    return f"{total // 60:02d}:{total % 60:02d}:{seconds}{fraction or ''}Z"


def _duration_micros(match: re.Match[str]) -> int:
    """An ISO 8601 duration (PostgreSQL's IntervalStyle iso_8601) as Debezium's
    MicroDuration."""
    years, months, days, hours, minutes, seconds = (Decimal(g or 0) for g in match.groups())
    micros = (years * 12 + months) * _MONTH_US + days * 86_400 * 10**6 \
        + (hours * 3600 + minutes * 60 + seconds) * 10**6
    return int(micros)


def normal(value: Any) -> Any:
    """One form for the shapes a value takes across runtimes and drivers: UUIDs and
    addresses as text, JSON text as its value, times as microseconds, lists element by
    element."""
    if isinstance(value, (list, tuple)):
        return [normal(v) for v in value]
    if isinstance(value, (uuid.UUID, ipaddress.IPv4Interface, ipaddress.IPv6Interface,
                          ipaddress.IPv4Network, ipaddress.IPv6Network,
                          ipaddress.IPv4Address, ipaddress.IPv6Address)):
        return str(value)
    if isinstance(value, dt.time) and value.tzinfo is None:
        return ((value.hour * 60 + value.minute) * 60 + value.second) * 10**6 \
            + value.microsecond
    if isinstance(value, dt.timedelta):
        return value // dt.timedelta(microseconds=1)
    if isinstance(value, str) and _CLOCK.match(value):
        return _clock_micros(value)
    if isinstance(value, dt.time):
        return _utc_clock(_ZONED.match(value.isoformat()))  # type: ignore[arg-type]
    if isinstance(value, str) and (zoned := _ZONED.match(value)):
        return _utc_clock(zoned)
    if isinstance(value, str) and (duration := _ISO_DURATION.match(value)) \
            and value != "P":
        return _duration_micros(duration)
    if isinstance(value, str) and _MONEY_TEXT.match(value):
        return Decimal(value.replace("$", "").replace(",", "")).normalize()
    if isinstance(value, str) and value.lstrip("-").isdigit() and len(value) > 6:
        return int(value)  # a number read as a string column's text (MicroDuration)
    if isinstance(value, dict) and value.keys() == {"scale", "value"}:
        # Debezium's VariableScaleDecimal: unscaled bytes (base64) and a scale.
        unscaled = int.from_bytes(base64.b64decode(value["value"]), "big", signed=True)
        return Decimal(unscaled).scaleb(-value["scale"]).normalize()
    if isinstance(value, str) and value[:1] in "{[":
        try:
            parsed = json.loads(value)
        except ValueError:
            return value
        return normal(parsed) if isinstance(parsed, dict) and \
            parsed.keys() == {"scale", "value"} else parsed
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return value
    if isinstance(value, Decimal):
        return value.normalize()
    return value
