"""Parsers of the text forms in which sources hand over column values.

Every source delivers a column value as text in one canonical form per logical type
(:mod:`tidemark.logical_type`), or as raw bytes for binary values; serializers, the
engine's converters and the Spark source read that text with the functions here, so a
source only has to print its values in these forms. The forms are PostgreSQL's text
output under tidemark's session settings (the SQL standard's forms where it has them)::

    DateStyle=ISO, MDY   TimeZone=UTC   IntervalStyle=iso_8601
    extra_float_digits=3 bytea_output=hex lc_monetary=C

so the PostgreSQL source passes its values through untouched, and another source
(MariaDB's binlog carries binary values) prints them once. The parsers also accept the
common alternatives a user-supplied PostgreSQL session may print: any UTC offset on
``timestamptz``/``timetz`` values (including offsets with seconds, which the server
prints for local mean time before 1900), the default ``postgres`` IntervalStyle, and the
``escape`` bytea format.

Two families of functions:

* ``parse_*`` return native Python values (``datetime``, ``Decimal``, ``UUID``, ...).
  Python cannot represent every value: BC dates and years after 9999 raise
  :class:`ValueError` naming the value, and ``infinity``/``-infinity`` map to the
  ``max``/``min`` of the Python type (documented on each parser).
* ``*_to_epoch_*``, :func:`time_to_micros` and :func:`interval_to_micros` return the
  integers that Debezium's ``io.debezium.time`` logical types carry. The date and time
  helpers are exact (integer arithmetic only) over the whole PostgreSQL range, including
  BC dates (proleptic Gregorian, year 0 = 1 BC, as Java's ``LocalDate``);
  :func:`interval_to_micros` deliberately repeats Debezium's floating-point formula.
  ``infinity`` raises :class:`ValueError` in all of them.
"""

from __future__ import annotations

import ipaddress
import itertools
import re
from collections.abc import Callable
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import Any, Final, TypeAlias
from uuid import UUID

import msgspec

# -- shared constants ---------------------------------------------------------------
_UNIX_EPOCH_ORDINAL: Final = 719_163  # date(1970, 1, 1).toordinal()
_TIME_MAX_UTC: Final = time.max.replace(tzinfo=UTC)
_DATETIME_MAX_UTC: Final = datetime.max.replace(tzinfo=UTC)
_DATETIME_MIN_UTC: Final = datetime.min.replace(tzinfo=UTC)

_US_PER_SECOND: Final = 1_000_000
_US_PER_MINUTE: Final = 60 * _US_PER_SECOND
_US_PER_HOUR: Final = 60 * _US_PER_MINUTE
_US_PER_DAY: Final = 24 * _US_PER_HOUR

_INT32_MIN: Final = -(2**31)
_INT32_MAX: Final = 2**31 - 1
_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1


# -- Interval -------------------------------------------------------------------------
class Interval(msgspec.Struct, frozen=True):
    """A PostgreSQL ``interval`` in the server's own three-part representation.

    PostgreSQL keeps months, days and microseconds apart because their lengths are not
    fixed relative to each other (a month has 28-31 days, a day 23-25 hours across a DST
    change), so no single ``timedelta`` can represent an interval losslessly. This
    struct can: ``parse_interval(iv.to_iso8601()) == iv`` for every interval.

    ``infinity`` and ``-infinity`` (PostgreSQL 17+) are :data:`INTERVAL_POS_INFINITY`
    and :data:`INTERVAL_NEG_INFINITY`, which use the same all-max / all-min field
    values as the server does internally.
    """

    months: int
    days: int
    microseconds: int

    def to_timedelta(self) -> timedelta:
        """The interval as a ``timedelta``, counting a month as 30 days.

        30 days per month is the convention of PostgreSQL's ``justify_days`` and of
        interval comparison. Raises :class:`ValueError` for an infinite interval and
        :class:`OverflowError` beyond ``timedelta``'s range (999,999,999 days).
        """
        if self in (INTERVAL_POS_INFINITY, INTERVAL_NEG_INFINITY):
            raise ValueError(f"an infinite interval has no timedelta: {self!r}")
        return timedelta(days=self.months * 30 + self.days, microseconds=self.microseconds)

    def to_iso8601(self) -> str:
        """The text PostgreSQL prints for this interval with ``IntervalStyle=iso_8601``.

        For example ``'P1Y2M3DT4H5M6.5S'``, ``'PT0S'`` for zero and
        ``'P-1Y-2M3DT-4H-5M-6.5S'`` when components are negative: like the server,
        each component carries its own sign, because months, days and time are
        independent and may have different signs.
        """
        if self == INTERVAL_POS_INFINITY:
            return "infinity"
        if self == INTERVAL_NEG_INFINITY:
            return "-infinity"
        # The server splits the fields with C division, which truncates toward zero,
        # so every derived component has the sign of the field it came from.
        years, months = _tdivmod(self.months, 12)
        hours, rest = _tdivmod(self.microseconds, _US_PER_HOUR)
        minutes, rest = _tdivmod(rest, _US_PER_MINUTE)
        seconds, fraction = _tdivmod(rest, _US_PER_SECOND)
        if not (years or months or self.days or hours or minutes or seconds or fraction):
            return "PT0S"
        parts = ["P"]
        if years:
            parts.append(f"{years}Y")
        if months:
            parts.append(f"{months}M")
        if self.days:
            parts.append(f"{self.days}D")
        if hours or minutes or seconds or fraction:
            parts.append("T")
            if hours:
                parts.append(f"{hours}H")
            if minutes:
                parts.append(f"{minutes}M")
            if seconds or fraction:
                # -0.5 seconds has seconds == 0, so the sign must come from either part.
                sign = "-" if seconds < 0 or fraction < 0 else ""
                parts.append(f"{sign}{abs(seconds)}")
                if fraction:
                    parts.append("." + f"{abs(fraction):06d}".rstrip("0"))
                parts.append("S")
        return "".join(parts)


#: ``'infinity'::interval`` (PostgreSQL 17+), with the server's internal field values.
INTERVAL_POS_INFINITY: Final = Interval(_INT32_MAX, _INT32_MAX, _INT64_MAX)
#: ``'-infinity'::interval`` (PostgreSQL 17+), with the server's internal field values.
INTERVAL_NEG_INFINITY: Final = Interval(_INT32_MIN, _INT32_MIN, _INT64_MIN)


def _tdivmod(value: int, divisor: int) -> tuple[int, int]:
    """``divmod`` truncating toward zero (C semantics) for a positive *divisor*."""
    quotient = abs(value) // divisor
    if value < 0:
        quotient = -quotient
    return quotient, value - quotient * divisor


# -- scalar parsers -------------------------------------------------------------------
#: What :func:`parse_inet` returns.
InetValue: TypeAlias = (
    ipaddress.IPv4Interface
    | ipaddress.IPv6Interface
    | ipaddress.IPv4Address
    | ipaddress.IPv6Address
)

_BOOL_VALUES: Final[dict[str, bool]] = {"t": True, "f": False, "true": True, "false": False}


def parse_bool(text: str) -> bool:
    """``'t'`` -> ``True``, ``'f'`` -> ``False`` (``'true'``/``'false'`` also accepted)."""
    try:
        return _BOOL_VALUES[text]
    except KeyError:
        raise ValueError(f"invalid boolean: {text!r}") from None


def parse_int(text: str) -> int:
    """An ``int2``, ``int4``, ``int8`` or ``oid`` value."""
    return int(text)


def parse_float(text: str) -> float:
    """A ``float4``/``float8`` value; ``'NaN'``, ``'Infinity'``, ``'-Infinity'`` included.

    With ``extra_float_digits=3`` (or the PostgreSQL 12+ default of 1) the server
    prints the shortest text that round-trips, so ``float8`` values are exact.
    """
    return float(text)


def parse_numeric(text: str) -> Decimal:
    """A ``numeric`` value, exactly; ``'NaN'``, ``'Infinity'``, ``'-Infinity'`` included.

    The infinities exist from PostgreSQL 14 on.
    """
    return Decimal(text)


def parse_money(text: str) -> Decimal:
    """A ``money`` value as printed with ``lc_monetary=C``: ``'$1,234.56'``, ``'-$1,234.56'``.

    Other locales' symbols and separators are not recognised; a parenthesised negative
    amount (``'($1.00)'``, used by some locales) is.
    """
    cleaned = text.replace("$", "").replace(",", "")
    if cleaned.startswith("(") and cleaned.endswith(")"):
        cleaned = "-" + cleaned[1:-1]
    try:
        return Decimal(cleaned)
    except ArithmeticError:  # decimal.InvalidOperation, which is not a ValueError
        raise ValueError(f"invalid money value: {text!r}") from None


def parse_bytea(text: str) -> bytes:
    """A ``bytea`` value: ``'\\x0a0b'`` (hex format) -> ``b'\\n\\x0b'``.

    The legacy ``escape`` format (``bytea_output=escape``) is accepted too.
    """
    if text.startswith("\\x"):
        return bytes.fromhex(text[2:])
    return _parse_bytea_escape(text)


def _parse_bytea_escape(text: str) -> bytes:
    # Escape format: printable ASCII as itself, '\\' for a backslash, '\ooo' (octal)
    # for every other byte.
    out = bytearray()
    pos = 0
    while True:
        backslash = text.find("\\", pos)
        if backslash < 0:
            out += text[pos:].encode("ascii")
            return bytes(out)
        out += text[pos:backslash].encode("ascii")
        if text.startswith("\\", backslash + 1):
            out.append(0x5C)
            pos = backslash + 2
            continue
        octal = text[backslash + 1 : backslash + 4]
        if len(octal) != 3 or not all("0" <= ch <= "7" for ch in octal):
            raise ValueError(f"invalid bytea escape sequence in {text!r}")
        out.append(int(octal, 8))
        pos = backslash + 4


def parse_uuid(text: str) -> UUID:
    """A ``uuid`` value."""
    return UUID(text)


def parse_inet(text: str) -> InetValue:
    """An ``inet`` value: an address, or an interface when a netmask is printed.

    The output function omits a full-length mask (``'192.168.0.1'``) and prints any
    other (``'192.168.0.1/24'``), so this returns ``ip_address`` or ``ip_interface``.
    """
    if "/" in text:
        return ipaddress.ip_interface(text)
    return ipaddress.ip_address(text)


def parse_cidr(text: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    """A ``cidr`` value (always printed with its mask) as an ``ip_network``."""
    return ipaddress.ip_network(text)


# -- dates and times ------------------------------------------------------------------
def parse_date(text: str) -> date:
    """A ``date`` value.

    ``'infinity'`` maps to ``date.max`` and ``'-infinity'`` to ``date.min`` (so a real
    9999-12-31 and infinity are indistinguishable afterwards). BC dates and years after
    9999 cannot be represented by ``datetime.date`` and raise :class:`ValueError`; use
    :func:`date_to_epoch_days` for those.
    """
    try:
        return date.fromisoformat(text)
    except ValueError:
        pass
    if text == "infinity":
        return date.max
    if text == "-infinity":
        return date.min
    bc = text.endswith(" BC")
    _split_date(text[:-3] if bc else text, bc, text)  # raises its own error if malformed
    raise ValueError(f"date {text!r} is outside the range of datetime.date (years 1-9999)")


def parse_time(text: str) -> time:
    """A ``time`` value (``'HH:MM:SS[.ffffff]'``).

    PostgreSQL accepts and prints ``'24:00:00'``, one microsecond past
    ``datetime.time``'s range; it maps to ``time.max`` (23:59:59.999999).
    """
    try:
        return time.fromisoformat(text)
    except ValueError:
        if text == "24:00:00":
            return time.max
        raise


def parse_timetz(text: str) -> time:
    """A ``timetz`` value as an aware ``time``: ``'12:34:56.5+05:30'``, ``'12:34:56-08'``.

    The offset is kept as printed (a time of day cannot be converted to UTC without a
    date). ``'24:00:00+HH'`` maps to ``time.max`` with that offset.
    """
    try:
        value = time.fromisoformat(text)
    except ValueError:
        if text.startswith("24:00:00") and text[8:9] in ("+", "-"):
            if text[8:] in ("+00", "-00"):
                return _TIME_MAX_UTC
            return time.max.replace(tzinfo=timezone(timedelta(seconds=_offset_seconds(text[8:]))))
        raise
    if value.tzinfo is None:
        raise ValueError(f"timetz value without a UTC offset: {text!r}")
    return value


def parse_timestamp(text: str) -> datetime:
    """A ``timestamp`` (without time zone) value as a naive ``datetime``.

    ``'infinity'`` maps to ``datetime.max`` and ``'-infinity'`` to ``datetime.min``.
    BC timestamps and years after 9999 raise :class:`ValueError` (``datetime`` cannot
    represent them); :func:`timestamp_to_epoch_micros` handles them.
    """
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        if text == "infinity":
            return datetime.max
        if text == "-infinity":
            return datetime.min
        _parse_timestamp_text(text)  # raises its own error if the text is malformed
        raise ValueError(
            f"timestamp {text!r} is outside the range of datetime.datetime (years 1-9999)"
        ) from None
    if value.tzinfo is not None:
        raise ValueError(f"timestamp value with a UTC offset: {text!r}")
    return value


def parse_timestamptz(text: str) -> datetime:
    """A ``timestamptz`` value as an aware ``datetime`` in UTC.

    Any printed offset is accepted (``'+00'``, ``'+05:30'``, ``'+00:19:32'``) and the
    result converted to UTC. ``'infinity'``/``'-infinity'`` map to ``datetime.max`` /
    ``datetime.min`` with ``tzinfo=UTC``. BC timestamps and instants outside years
    1-9999 in UTC raise :class:`ValueError`; :func:`timestamptz_to_epoch_micros`
    handles them.
    """
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        if text == "infinity":
            return _DATETIME_MAX_UTC
        if text == "-infinity":
            return _DATETIME_MIN_UTC
        _parse_timestamp_text(text)
        raise ValueError(
            f"timestamptz {text!r} is outside the range of datetime.datetime (years 1-9999)"
        ) from None
    tzinfo = value.tzinfo
    if tzinfo is UTC:
        return value
    if tzinfo is None:
        raise ValueError(f"timestamptz value without a UTC offset: {text!r}")
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise ValueError(
            f"timestamptz {text!r} is outside the range of datetime.datetime in UTC"
        ) from None


def date_to_epoch_days(text: str) -> int:
    """Days from 1970-01-01 to a ``date`` value (Debezium's ``io.debezium.time.Date``).

    Exact over PostgreSQL's whole range, 4713 BC to 5874897 AD, in the proleptic
    Gregorian calendar with year 0 = 1 BC (as Java's ``LocalDate.toEpochDay``).
    ``infinity`` and ``-infinity`` raise :class:`ValueError`.
    """
    try:
        return date.fromisoformat(text).toordinal() - _UNIX_EPOCH_ORDINAL
    except ValueError:
        pass
    _reject_infinity(text, "date")
    bc = text.endswith(" BC")
    year, month, day = _split_date(text[:-3] if bc else text, bc, text)
    return _days_from_civil(year, month, day)


_DURATION: Final = re.compile(r"(-?)(\d+):(\d\d):(\d\d)(?:\.(\d{1,6}))?")


def time_to_micros(text: str) -> int:
    """Microseconds since midnight for a ``time`` value (Debezium's ``MicroTime``).

    ``'24:00:00'`` gives 86,400,000,000. MariaDB's ``time`` is a duration and may be
    negative or longer than a day (``'-838:59:59.5'``): those give the signed total.
    """
    try:
        value = time.fromisoformat(text)
    except ValueError:
        if text == "24:00:00":
            return _US_PER_DAY
        match = _DURATION.fullmatch(text)
        if match is None or int(match.group(3)) > 59 or int(match.group(4)) > 59:
            raise
        sign, hours, minutes, seconds, fraction = match.groups()
        total = ((int(hours) * 60 + int(minutes)) * 60 + int(seconds)) * _US_PER_SECOND \
            + int((fraction or "0").ljust(6, "0"))
        return -total if sign else total
    if value.tzinfo is not None:
        raise ValueError(f"time value with a UTC offset: {text!r}")
    return (
        (value.hour * 60 + value.minute) * 60 + value.second
    ) * _US_PER_SECOND + value.microsecond


def timestamp_to_epoch_micros(text: str) -> int:
    """Microseconds from 1970-01-01 00:00 to a ``timestamp`` value's wall-clock time.

    The naive value is read as UTC, which is what Debezium's ``MicroTimestamp`` does.
    Exact over PostgreSQL's whole range (4713 BC to 294276 AD); ``infinity`` and
    ``-infinity`` raise :class:`ValueError`. Values after 294247-01-10 04:00:54.775807
    exceed a signed 64-bit integer (Java's ``long``); the result is still exact, so a
    caller writing int64 must check.
    """
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        _reject_infinity(text, "timestamp")
        micros, offset = _parse_timestamp_text(text)
        if offset is not None:
            raise ValueError(f"timestamp value with a UTC offset: {text!r}") from None
        return micros
    if value.tzinfo is not None:
        raise ValueError(f"timestamp value with a UTC offset: {text!r}")
    # Field arithmetic rather than (value - epoch) // timedelta(microseconds=1): same
    # exact result, but timedelta floor division is about 40% slower.
    return (
        (value.toordinal() - _UNIX_EPOCH_ORDINAL) * 86_400
        + value.hour * 3_600
        + value.minute * 60
        + value.second
    ) * _US_PER_SECOND + value.microsecond


def timestamptz_to_epoch_micros(text: str) -> int:
    """Microseconds from the Unix epoch to a ``timestamptz`` value, whatever its offset.

    Exact over PostgreSQL's whole range (4713 BC to 294276 AD; as for
    :func:`timestamp_to_epoch_micros`, the last 30 years exceed int64); ``infinity``
    and ``-infinity`` raise :class:`ValueError`.
    """
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        _reject_infinity(text, "timestamptz")
        micros, offset = _parse_timestamp_text(text)
        if offset is None:
            raise ValueError(f"timestamptz value without a UTC offset: {text!r}") from None
        return micros - offset * _US_PER_SECOND
    # The printed wall-clock time minus the offset; never converted to UTC as a
    # datetime, which would overflow near years 1 and 9999.
    wall = (
        (value.toordinal() - _UNIX_EPOCH_ORDINAL) * 86_400
        + value.hour * 3_600
        + value.minute * 60
        + value.second
    ) * _US_PER_SECOND + value.microsecond
    if value.tzinfo is UTC:
        return wall
    utc_offset = value.utcoffset()
    if utc_offset is None:
        raise ValueError(f"timestamptz value without a UTC offset: {text!r}")
    return (
        wall
        - (utc_offset.days * 86_400 + utc_offset.seconds) * _US_PER_SECOND
        - utc_offset.microseconds
    )


def _reject_infinity(text: str, type_name: str) -> None:
    if text in ("infinity", "-infinity"):
        raise ValueError(f"{type_name} {text!r} has no epoch value")


def _split_date(date_text: str, bc: bool, text: str) -> tuple[int, int, int]:
    """``'YYYY-MM-DD'`` (any number of year digits) -> astronomical (year, month, day).

    The caller has removed the ``' BC'`` suffix and passes *bc*; the year is then
    converted so that 1 BC is year 0, 2 BC year -1 (astronomical numbering). *text* is
    the whole value, for error messages.
    """
    pieces = date_text.split("-")
    if len(pieces) != 3 or not all(p.isdigit() and p.isascii() for p in pieces):
        raise ValueError(f"invalid date in {text!r}")
    year, month, day = int(pieces[0]), int(pieces[1]), int(pieces[2])
    if bc:
        if year == 0:
            raise ValueError(f"invalid date (there is no year 0 BC) in {text!r}")
        year = 1 - year
    if not 1 <= month <= 12 or not 1 <= day <= _days_in_month(year, month):
        raise ValueError(f"invalid date in {text!r}")
    return year, month, day


def _days_in_month(year: int, month: int) -> int:
    if month == 2:
        return 29 if year % 4 == 0 and (year % 100 != 0 or year % 400 == 0) else 28
    return 30 if month in (4, 6, 9, 11) else 31


def _days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (astronomical year numbering).

    Howard Hinnant's ``days_from_civil``: count from 0000-03-01 in 400-year eras so that
    the leap day is the last day of each shifted year. Python's floor division makes the
    negative-year branch of the C++ original unnecessary.
    """
    if month <= 2:
        year -= 1
    era = year // 400
    year_of_era = year - era * 400
    day_of_year = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    day_of_era = year_of_era * 365 + year_of_era // 4 - year_of_era // 100 + day_of_year
    return era * 146_097 + day_of_era - 719_468


def civil_from_epoch_days(days: int) -> tuple[int, int, int]:
    """(year, month, day) of the proleptic Gregorian date *days* after 1970-01-01, with
    astronomical year numbering (year 0 = 1 BC), for any number of days: the inverse
    of :func:`date_to_epoch_days` (Howard Hinnant's ``civil_from_days``)."""
    days += 719_468
    era = days // 146_097
    day_of_era = days - era * 146_097
    year_of_era = (day_of_era - day_of_era // 1460 + day_of_era // 36_524
                   - day_of_era // 146_096) // 365
    day_of_year = day_of_era - (365 * year_of_era + year_of_era // 4 - year_of_era // 100)
    shifted_month = (5 * day_of_year + 2) // 153
    day = day_of_year - (153 * shifted_month + 2) // 5 + 1
    month = shifted_month + (3 if shifted_month < 10 else -9)
    return year_of_era + era * 400 + (month <= 2), month, day


def _clock_micros(clock: str, text: str) -> int:
    """``'HH:MM:SS[.ffffff]'`` -> microseconds since midnight (up to 24:00:00).

    *text* is the whole value, for error messages.
    """
    if len(clock) < 8 or clock[2] != ":" or clock[5] != ":":
        raise ValueError(f"invalid time of day in {text!r}")
    try:
        hour, minute, second = int(clock[0:2]), int(clock[3:5]), int(clock[6:8])
        micros = 0
        if len(clock) > 8:
            if clock[8] != "." or not (clock[9:].isdigit() and clock[9:].isascii()):
                raise ValueError
            # Digits beyond the sixth cannot come from the server (microsecond
            # resolution); ignore them rather than round, like datetime.fromisoformat.
            micros = int(clock[9:15].ljust(6, "0"))
    except ValueError:
        raise ValueError(f"invalid time of day in {text!r}") from None
    if hour > 24 or minute > 59 or second > 59 or (hour == 24 and (minute or second or micros)):
        raise ValueError(f"invalid time of day in {text!r}")
    return ((hour * 60 + minute) * 60 + second) * _US_PER_SECOND + micros


def _offset_seconds(offset: str) -> int:
    """``'+05'``, ``'-08:00'``, ``'+00:19:32'`` -> signed seconds east of UTC."""
    pieces = offset[1:].split(":")
    if (
        offset[:1] not in ("+", "-")
        or len(pieces) > 3
        or not all(len(p) == 2 and p.isdigit() for p in pieces)
    ):
        raise ValueError(f"invalid UTC offset: {offset!r}")
    seconds = int(pieces[0]) * 3600
    if len(pieces) > 1:
        seconds += int(pieces[1]) * 60
    if len(pieces) > 2:
        seconds += int(pieces[2])
    return -seconds if offset[0] == "-" else seconds


def _parse_timestamp_text(text: str) -> tuple[int, int | None]:
    """Parse ``'Y...Y-MM-DD HH:MM:SS[.ffffff][+HH[:MM[:SS]]][ BC]'`` by hand.

    Returns (microseconds from 1970-01-01 00:00 of the printed wall-clock time, offset
    in seconds east of UTC or ``None``). This is the slow path for what
    ``datetime.fromisoformat`` rejects: BC and years after 9999.
    """
    bc = text.endswith(" BC")
    body = text[:-3] if bc else text
    date_part, _, clock = body.partition(" ")
    if not clock:
        raise ValueError(f"invalid timestamp: {text!r}")
    year, month, day = _split_date(date_part, bc, text)
    offset: int | None = None
    # Only the offset can contain a sign; the clock part never does.
    sign_at = max(clock.find("+"), clock.find("-"))
    if sign_at >= 0:
        offset = _offset_seconds(clock[sign_at:])
        clock = clock[:sign_at]
    micros = _clock_micros(clock, text)
    if micros >= _US_PER_DAY:  # the server normalises 24:00:00 to the next day
        raise ValueError(f"invalid timestamp: {text!r}")
    return _days_from_civil(year, month, day) * _US_PER_DAY + micros, offset


# -- intervals ------------------------------------------------------------------------
# Regex on purpose: a single C-level fullmatch both validates the ISO 8601 form and
# splits its components, which is faster than scanning the letters in Python.
_ISO_INTERVAL: Final = re.compile(
    r"P(?:(-?\d+)Y)?(?:(-?\d+)M)?(?:(-?\d+)D)?"
    r"(?:T(?:(-?\d+)H)?(?:(-?\d+)M)?(?:(-?\d+(?:\.\d+)?)S)?)?",
    re.ASCII,
)


def parse_interval(text: str) -> Interval:
    """An ``interval`` value as :class:`Interval`.

    Accepts the ``iso_8601`` IntervalStyle that tidemark's sessions use
    (``'P1Y2M3DT4H5M6.5S'``, ``'PT0S'``, ``'P-1Y-2M3DT-4H-5M-6.5S'``) and the server's
    default ``postgres`` style (``'1 year 2 mons 3 days 04:05:06.5'``,
    ``'-1 days +02:03:00'``, ``'00:00:00'``). PostgreSQL 17's ``'infinity'`` and
    ``'-infinity'`` map to :data:`INTERVAL_POS_INFINITY` / :data:`INTERVAL_NEG_INFINITY`.
    """
    if text.startswith("P"):
        match = _ISO_INTERVAL.fullmatch(text)
        # The pattern's parts are all optional; 'P' and 'P...T' alone are not intervals.
        if match is None or text == "P" or text.endswith("T"):
            raise ValueError(f"invalid ISO 8601 interval: {text!r}")
        years, months, days, hours, minutes, seconds = match.groups()
        micros = 0
        if hours:
            micros = int(hours) * _US_PER_HOUR
        if minutes:
            micros += int(minutes) * _US_PER_MINUTE
        if seconds:
            micros += _seconds_micros(seconds)
        return Interval(
            (int(years) * 12 if years else 0) + (int(months) if months else 0),
            int(days) if days else 0,
            micros,
        )
    if text == "infinity":
        return INTERVAL_POS_INFINITY
    if text == "-infinity":
        return INTERVAL_NEG_INFINITY
    return _parse_postgres_interval(text)


def _seconds_micros(seconds: str) -> int:
    """``'-6.5'`` -> -6_500_000, exactly (no float)."""
    negative = seconds.startswith("-")
    whole, _, fraction = seconds.lstrip("+-").partition(".")
    micros = int(whole) * _US_PER_SECOND + (int(fraction[:6].ljust(6, "0")) if fraction else 0)
    return -micros if negative else micros


def _parse_postgres_interval(text: str) -> Interval:
    # The 'postgres' style is '[N year[s]] [N mon[s]] [N day[s]] [[+-]H+:MM:SS[.f]]'.
    # Each field has its own sign; a '+' appears on a field that follows a negative one.
    months = days = micros = 0
    tokens = text.split()
    if not tokens:
        raise ValueError("invalid interval: ''")
    index = 0
    try:
        while index < len(tokens):
            token = tokens[index]
            if ":" in token:
                negative = token.startswith("-")
                pieces = token.lstrip("+-").split(":")
                if len(pieces) != 3 or index != len(tokens) - 1:
                    raise ValueError
                micros = (
                    int(pieces[0]) * _US_PER_HOUR
                    + int(pieces[1]) * _US_PER_MINUTE
                    + _seconds_micros(pieces[2])
                )
                if negative:
                    micros = -micros
                index += 1
                continue
            value = int(token)
            unit = tokens[index + 1]
            if unit in ("year", "years"):
                months += value * 12
            elif unit in ("mon", "mons"):
                months += value
            elif unit in ("day", "days"):
                days += value
            else:
                raise ValueError
            index += 2
    except (ValueError, IndexError):
        raise ValueError(
            f"invalid interval {text!r} (expected IntervalStyle iso_8601 or postgres)"
        ) from None
    return Interval(months, days, micros)


def interval_to_micros(text: str, days_per_month: float = 30.4375) -> int:
    """An ``interval`` as Debezium's ``io.debezium.time.MicroDuration`` microseconds.

    Reproduces Debezium's PostgreSQL connector exactly: pgjdbc's ``PGInterval`` splits
    the value into years, months, days, hours, minutes and seconds (a ``double``), then
    ``MicroDuration.durationMicros`` computes, in IEEE ``double`` arithmetic::

        days    = (years * 12 + months) * daysPerMonthAvg + days
        seconds = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
        return (long) (seconds * 1e6)

    with ``daysPerMonthAvg = 365.25 / 12``. The ``(long)`` cast truncates toward zero.
    Python floats are the same IEEE doubles and the operations below are done in the
    same order, so the results match Debezium bit for bit, including its occasional
    off-by-one microsecond where the double product lands just below an integer (a
    small fraction of values with a fractional second, growing with the interval's
    size; for example ``'PT0.000249S'`` gives 248). :func:`parse_interval` gives the
    exact value. Infinite intervals raise :class:`ValueError`.
    """
    interval = parse_interval(text)
    if interval in (INTERVAL_POS_INFINITY, INTERVAL_NEG_INFINITY):
        raise ValueError(f"interval {text!r} has no MicroDuration value")
    # The components PGInterval would hold: the server prints the fields split with
    # truncating division, and PGInterval parses them back one by one.
    hours, rest = _tdivmod(interval.microseconds, _US_PER_HOUR)
    minutes, rest = _tdivmod(rest, _US_PER_MINUTE)
    whole_seconds, micros = _tdivmod(rest, _US_PER_SECOND)
    seconds = whole_seconds + micros / 1e6  # PGInterval.getSeconds()
    total_days = interval.months * days_per_month + interval.days
    total_seconds = ((total_days * 24 + hours) * 60 + minutes) * 60 + seconds
    return int(total_seconds * 1e6)  # int() truncates toward zero, like Java's (long)


# -- arrays ---------------------------------------------------------------------------
# The server reads an unquoted NULL in any letter case as SQL NULL (and prints "NULL");
# a set lookup keeps that exact without lower-casing every element.
# The characters the server's array parser skips around elements (scanner_isspace).
_ARRAY_SPACE: Final = " \t\n\r\v\f"
_NULL_SPELLINGS: Final = frozenset(
    "".join(chars) for chars in itertools.product("Nn", "Uu", "Ll", "Ll")
)


def parse_array(
    text: str, element_parser: Callable[[str], object], delimiter: str = ","
) -> list[Any]:
    """A PostgreSQL array literal as a (nested) list, parsing elements with *element_parser*.

    ``'{1,2,NULL}'`` -> ``[1, 2, None]``; multi-dimensional arrays become nested lists
    (``'{{1,2},{3,4}}'`` -> ``[[1, 2], [3, 4]]``); ``'{}'`` -> ``[]``. Quoted elements
    may contain backslash escapes, and a quoted ``"NULL"`` is the string NULL, not SQL
    NULL. A dimension decoration (``'[0:1]={1,2}'``, printed for lower bounds other
    than 1) is dropped. *delimiter* is the element type's ``typdelim``: ``','`` for all
    built-in types except ``box``, which uses ``';'``.
    """
    if text.startswith("["):
        # '[lo:hi][lo:hi]={...}': the bounds carry no information a list can keep.
        equals = text.find("=")
        if equals < 0:
            raise ValueError(f"invalid array dimension decoration: {text!r}")
        text = text[equals + 1 :]
    if text == "{}":
        return []
    body = text[1:-1]
    # Fast path: one dimension, nothing quoted, escaped or padded; this is every array
    # of numbers, dates and times and most arrays of short strings. The server quotes
    # any element containing whitespace, so the space test only diverts hand-written
    # literals such as '{1, 2}'.
    if (
        text.startswith("{")
        and text.endswith("}")
        and '"' not in body
        and "\\" not in body
        and "{" not in body
        and "}" not in body
        and " " not in body
    ):
        items = body.split(delimiter)
        if "" in items:
            raise ValueError(f"array literal has an empty element: {text!r}")
        return [None if item in _NULL_SPELLINGS else element_parser(item) for item in items]
    return _parse_array_general(text, element_parser, delimiter)


def _parse_array_general(
    text: str, element_parser: Callable[[str], object], delimiter: str
) -> list[Any]:
    length = len(text)
    pos = 0
    while pos < length and text[pos] in _ARRAY_SPACE:
        pos += 1
    if pos >= length or text[pos] != "{":
        raise ValueError(f"invalid array literal (must start with '{{'): {text!r}")
    pos += 1
    current: list[Any] = []
    outer: list[list[Any]] = []
    # True right after '{' or a delimiter: an element (or a sub-array) must come next.
    want_element = True
    while True:
        if pos >= length:
            raise ValueError(f"unterminated array literal: {text!r}")
        char = text[pos]
        if char in _ARRAY_SPACE:
            pos += 1
        elif char == "}":
            if want_element and current:
                raise ValueError(f"array literal has an empty element: {text!r}")
            pos += 1
            if not outer:
                break
            current = outer.pop()
            want_element = False
        elif char == delimiter:
            if want_element:
                raise ValueError(f"array literal has an empty element: {text!r}")
            want_element = True
            pos += 1
        elif not want_element:
            raise ValueError(f"array literal is missing a delimiter at {pos}: {text!r}")
        elif char == "{":
            nested: list[Any] = []
            current.append(nested)
            outer.append(current)
            current = nested
            pos += 1
        elif char == '"':
            value, pos = _quoted_element(text, pos + 1)
            current.append(element_parser(value))
            want_element = False
        else:
            value, pos, escaped = _unquoted_element(text, pos, delimiter)
            # An unquoted NULL (any case) is SQL NULL; a quoted or escaped one is text.
            if not escaped and value in _NULL_SPELLINGS:
                current.append(None)
            else:
                current.append(element_parser(value))
            want_element = False
    if text[pos:].strip(_ARRAY_SPACE):
        raise ValueError(f"junk after array literal: {text!r}")
    return current


def _quoted_element(text: str, pos: int) -> tuple[str, int]:
    """Read a quoted element whose opening quote is just before *pos*.

    Returns the unescaped value and the position after the closing quote.
    """
    pieces: list[str] = []
    while True:
        quote = text.find('"', pos)
        if quote < 0:
            raise ValueError(f"unterminated quoted array element: {text!r}")
        backslash = text.find("\\", pos, quote)
        if backslash < 0:
            pieces.append(text[pos:quote])
            return "".join(pieces), quote + 1
        # Copy up to the backslash, then the escaped character itself (which may be
        # the quote we found, so search again from after it).
        pieces.append(text[pos:backslash])
        if backslash + 1 >= len(text):
            raise ValueError(f"unterminated quoted array element: {text!r}")
        pieces.append(text[backslash + 1])
        pos = backslash + 2


def _unquoted_element(text: str, pos: int, delimiter: str) -> tuple[str, int, bool]:
    """Read an unquoted element starting at *pos* (at a non-space character).

    Returns the value (trailing whitespace removed, backslash escapes applied), the
    position of the delimiter or '}' that ends it, and whether it contained an escape.
    """
    # Common case first: find the end with two C-level searches and check the slice.
    end = text.find(delimiter, pos)
    brace = text.find("}", pos)
    if end < 0 or 0 <= brace < end:
        end = brace
    if end < 0:
        raise ValueError(f"unterminated array literal: {text!r}")
    value = text[pos:end]
    if "\\" not in value:
        if "{" in value or '"' in value:
            raise ValueError(f"unexpected '{{' or '\"' in an array element: {text!r}")
        return value.rstrip(_ARRAY_SPACE), end, False
    # A backslash may escape the delimiter or '}' the searches stopped at: rescan.
    pieces: list[str] = []
    start = end = pos
    length = len(text)
    while end < length:
        char = text[end]
        if char in (delimiter, "}"):
            break
        if char in '{"':
            raise ValueError(f"unexpected {char!r} in array element at {end}: {text!r}")
        if char == "\\":
            if end + 1 >= length:
                raise ValueError(f"unterminated array literal: {text!r}")
            pieces.append(text[start:end])
            pieces.append(text[end + 1])
            end += 2
            start = end
            continue
        end += 1
    if end >= length:
        raise ValueError(f"unterminated array literal: {text!r}")
    # Like the server, drop trailing whitespace unless it was escaped: only the last
    # unescaped run is stripped.
    pieces.append(text[start:end].rstrip(_ARRAY_SPACE))
    return "".join(pieces), end, True


