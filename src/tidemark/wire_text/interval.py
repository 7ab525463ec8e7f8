"""PostgreSQL's ``interval``: the :class:`Interval` value, its parser (both the
``iso_8601`` and the ``postgres`` IntervalStyle) and Debezium's ``MicroDuration``."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Final

import msgspec

from tidemark.wire_text.temporal import US_PER_HOUR, US_PER_MINUTE, US_PER_SECOND

_INT32_MIN: Final = -(2**31)
_INT32_MAX: Final = 2**31 - 1
_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1


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
        hours, rest = _tdivmod(self.microseconds, US_PER_HOUR)
        minutes, rest = _tdivmod(rest, US_PER_MINUTE)
        seconds, fraction = _tdivmod(rest, US_PER_SECOND)
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
            micros = int(hours) * US_PER_HOUR
        if minutes:
            micros += int(minutes) * US_PER_MINUTE
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
    micros = int(whole) * US_PER_SECOND + (int(fraction[:6].ljust(6, "0")) if fraction else 0)
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
                    int(pieces[0]) * US_PER_HOUR
                    + int(pieces[1]) * US_PER_MINUTE
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
    hours, rest = _tdivmod(interval.microseconds, US_PER_HOUR)
    minutes, rest = _tdivmod(rest, US_PER_MINUTE)
    whole_seconds, micros = _tdivmod(rest, US_PER_SECOND)
    seconds = whole_seconds + micros / 1e6  # PGInterval.getSeconds()
    total_days = interval.months * days_per_month + interval.days
    total_seconds = ((total_days * 24 + hours) * 60 + minutes) * 60 + seconds
    return int(total_seconds * 1e6)  # int() truncates toward zero, like Java's (long)
