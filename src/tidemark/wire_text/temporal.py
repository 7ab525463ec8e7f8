"""Parsers of dates, times and timestamps: to Python values (``parse_*``), and exactly to
the integers of Debezium's ``io.debezium.time`` types over PostgreSQL's whole range (BC
dates and years after 9999 included, in the proleptic Gregorian calendar)."""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, time, timedelta, timezone
from typing import Final

_UNIX_EPOCH_ORDINAL: Final = 719_163  # date(1970, 1, 1).toordinal()
_TIME_MAX_UTC: Final = time.max.replace(tzinfo=UTC)
_DATETIME_MAX_UTC: Final = datetime.max.replace(tzinfo=UTC)
_DATETIME_MIN_UTC: Final = datetime.min.replace(tzinfo=UTC)

US_PER_SECOND: Final = 1_000_000
US_PER_MINUTE: Final = 60 * US_PER_SECOND
US_PER_HOUR: Final = 60 * US_PER_MINUTE
US_PER_DAY: Final = 24 * US_PER_HOUR


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
            return US_PER_DAY
        match = _DURATION.fullmatch(text)
        if match is None or int(match.group(3)) > 59 or int(match.group(4)) > 59:
            raise
        sign, hours, minutes, seconds, fraction = match.groups()
        total = ((int(hours) * 60 + int(minutes)) * 60 + int(seconds)) * US_PER_SECOND \
            + int((fraction or "0").ljust(6, "0"))
        return -total if sign else total
    if value.tzinfo is not None:
        raise ValueError(f"time value with a UTC offset: {text!r}")
    return (
        (value.hour * 60 + value.minute) * 60 + value.second
    ) * US_PER_SECOND + value.microsecond


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
    ) * US_PER_SECOND + value.microsecond


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
        return micros - offset * US_PER_SECOND
    # The printed wall-clock time minus the offset; never converted to UTC as a
    # datetime, which would overflow near years 1 and 9999.
    wall = (
        (value.toordinal() - _UNIX_EPOCH_ORDINAL) * 86_400
        + value.hour * 3_600
        + value.minute * 60
        + value.second
    ) * US_PER_SECOND + value.microsecond
    if value.tzinfo is UTC:
        return wall
    utc_offset = value.utcoffset()
    if utc_offset is None:
        raise ValueError(f"timestamptz value without a UTC offset: {text!r}")
    return (
        wall
        - (utc_offset.days * 86_400 + utc_offset.seconds) * US_PER_SECOND
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
    return ((hour * 60 + minute) * 60 + second) * US_PER_SECOND + micros


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
    if micros >= US_PER_DAY:  # the server normalises 24:00:00 to the next day
        raise ValueError(f"invalid timestamp: {text!r}")
    return _days_from_civil(year, month, day) * US_PER_DAY + micros, offset
