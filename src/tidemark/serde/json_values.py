"""Debezium JSON values of single columns: PostgreSQL-style text in, the value Debezium's
JSON converter writes out (decimals as base64 unscaled bytes, dates as epoch days,
timestamps as epoch micro/milliseconds, Java's float text …).

The functions here are the per-type converters the column mappings
(:mod:`tidemark.serde.json_columns`) choose from; the hottest ones (``*_fragment``) write
JSON text directly and carry the compiled writer's kind as ``compiled_kind``.
"""

from __future__ import annotations

import datetime as dt
import logging
from binascii import b2a_base64
from collections.abc import Callable
from decimal import Decimal
from typing import Any, Final

import msgspec

from tidemark import wire_text as wt

log = logging.getLogger(__name__)

UNAVAILABLE_PLACEHOLDER: Final = "__debezium_unavailable_value"

# Debezium's streaming values for infinite dates/timestamps (its own overflow artefacts,
# reproduced so that consumers written against Debezium see the same numbers).
_INF: Final = float("inf")
_INT_TEXT_DIGITS: Final = 4000  # below sys.get_int_max_str_digits()' default of 4300
_DATE_POS_INFINITY: Final = -2147472692
_DATE_NEG_INFINITY: Final = -2147472691
_TS_POS_INFINITY_US: Final = 9223372036825200000
_TS_NEG_INFINITY_US: Final = -9223372036832400000

KIND_DECIMAL: Final = 5   # numeric(p, s > 0), precise: parameter s
KIND_ZONED: Final = 6     # timestamptz as ZonedTimestamp: parameter the fraction digits
KIND_DATE: Final = 7      # date as epoch days
_COMPILED_DECIMAL_SCALE: Final = 38  # the C code holds at most 38 digits

# -- per-type value converters (text -> JSON value) -------------------------------------
def unscaled_bytes(unscaled: int) -> bytes:
    """Java's ``BigInteger.toByteArray()``: minimal two's-complement big-endian bytes."""
    magnitude = unscaled if unscaled >= 0 else ~unscaled
    return unscaled.to_bytes((magnitude.bit_length() >> 3) + 1, "big", signed=True)


def _numeric_parts(text: str) -> tuple[int, int]:
    """(unscaled, scale) of a finite numeric text such as ``-12.340``."""
    whole, _, frac = text.partition(".")
    digits = whole + frac
    if len(digits) > _INT_TEXT_DIGITS:
        # numeric holds up to 147,455 digits; int() of a text that long is refused
        # (Python's guard against quadratic conversions), a Decimal's is not.
        return int(Decimal(digits)), len(frac)
    return int(digits), len(frac)


def _special_numeric(text: str, column: str) -> None:
    log.warning(
        "column %s holds numeric %s, which decimal_handling_mode=precise cannot represent; "
        "emitting null (use decimal_handling_mode=string or double to keep it)",
        column, text,
    )


def _fixed_scale_decimal(scale: int, column: str) -> Callable[[str], Any]:
    def convert(text: str) -> Any:
        if not text[-1].isdigit():
            return _special_numeric(text, column)
        unscaled, have = _numeric_parts(text)
        if have != scale:  # negative or unusual scales: rescale exactly
            unscaled = unscaled * 10 ** (scale - have) if scale > have else \
                unscaled // 10 ** (have - scale)
        return unscaled_bytes(unscaled)

    return convert


def _decimal_fragment(scale: int, convert: Callable[[str], Any]) -> Callable[[str], str]:
    """numeric(p, s) text -> Debezium's base64 JSON string, in one step.

    The hottest converter of typical tables; PostgreSQL prints exactly ``s`` fraction
    digits for a numeric(p, s), so the unscaled value is the digits without the point.
    """
    def general(text: str) -> str:
        value = convert(text)  # special values, unusual scales
        if value is None:
            return "null"
        return '"' + b2a_base64(value, newline=False).decode() + '"'

    if scale <= 0:
        return general
    point = -scale - 1

    def fragment(text: str) -> str:
        # The common shape, checked cheaply: the point where the scale puts it, a digit
        # last (not NaN or Infinity). Anything else takes the general conversion.
        if len(text) > scale and text[point] == "." and "0" <= text[-1] <= "9":
            unscaled = int(text.replace(".", "", 1))
            # unscaled_bytes, inlined: this runs for every numeric of every row. With
            # one spare bit a non-negative value's unsigned bytes are its signed ones.
            if unscaled >= 0:
                raw = unscaled.to_bytes((unscaled.bit_length() >> 3) + 1)
            else:
                raw = unscaled.to_bytes(((~unscaled).bit_length() >> 3) + 1, "big",
                                        signed=True)
            return '"' + b2a_base64(raw, newline=False).decode() + '"'
        return general(text)

    if scale <= _COMPILED_DECIMAL_SCALE:
        setattr(fragment, "compiled_kind", (KIND_DECIMAL, scale))  # noqa: B010
    return fragment


def _variable_scale_decimal(column: str) -> Callable[[str], Any]:
    def convert(text: str) -> Any:
        if not text[-1].isdigit():
            return _special_numeric(text, column)
        if "." in text:
            text = text.rstrip("0").rstrip(".")
        unscaled, scale = _numeric_parts(text)
        return {"scale": scale, "value": unscaled_bytes(unscaled)}

    return convert


_SPECIAL_NUMERIC_NAMES: Final = {
    "NaN": "NAN", "Infinity": "POSITIVE_INFINITY", "-Infinity": "NEGATIVE_INFINITY",
}


def _numeric_string(text: str) -> str:
    """A numeric as Debezium's string mode emits it: ``BigDecimal.toPlainString()``,
    which is PostgreSQL's own text (``0.000000123`` stays so; confirmed by capture), or
    the enum name of a special value."""
    special = _SPECIAL_NUMERIC_NAMES.get(text)
    return text if special is None else special


def _numeric_string_fallback(scale: int) -> str:
    """The JSON text of string mode's zero for a NOT NULL column without a value:
    ``0`` at the column's scale (``"0.00"`` for numeric(8, 2); confirmed by capture)."""
    return '"0' + ("." + "0" * scale if scale > 0 else "") + '"'


def _money_decimal(text: str) -> bytes:
    value = wt.parse_money(text)
    return unscaled_bytes(int(value.scaleb(2)))


_DATE_CACHE_SIZE: Final = 4096
_date_cache: dict[str, int] = {}
_date_json_cache: dict[str, str] = {}


def _date_days(text: str) -> int:
    # Dates repeat heavily in real tables (order dates, birthdays); a bounded memo
    # makes the common case a dict lookup.
    days = _date_cache.get(text)
    if days is None:
        days = _date_days_uncached(text)
        if len(_date_cache) >= _DATE_CACHE_SIZE:
            _date_cache.clear()
        _date_cache[text] = days
    return days


def _date_fragment(text: str) -> str:
    """A date's epoch days as JSON text (memoized like :func:`_date_days`)."""
    fragment = _date_json_cache.get(text)
    if fragment is None:
        fragment = str(_date_days_uncached(text))
        if len(_date_json_cache) >= _DATE_CACHE_SIZE:
            _date_json_cache.clear()
        _date_json_cache[text] = fragment
    return fragment


def _date_days_uncached(text: str) -> int:
    if text == "infinity":
        return _DATE_POS_INFINITY
    if text == "-infinity":
        return _DATE_NEG_INFINITY
    return wt.date_to_epoch_days(text)


def _timestamp_micros(text: str) -> int:
    if text == "infinity":
        return _TS_POS_INFINITY_US
    if text == "-infinity":
        return _TS_NEG_INFINITY_US
    return wt.timestamp_to_epoch_micros(text)


def _timestamp_millis(text: str) -> int:
    return _timestamp_micros(text) // 1000


def _zoned_timestamp_fragment(width: int, zoned: Callable[[str], str]) -> Callable[[str], str]:
    """timestamptz text -> JSON string; slices for the two shapes a UTC session prints
    most (no fraction, or all six digits), :func:`_zoned_timestamp` for the rest."""
    whole = f".{'0' * width}Z\"" if width > 0 else 'Z"'

    def fragment(text: str) -> str:
        size = len(text)
        if size == 22 and text[19:] == "+00" and text[10] == " ":
            return f'"{text[:10]}T{text[11:19]}{whole}'
        if size == 29 and width == 6 and text[26:] == "+00" and text[10] == " ":
            return f'"{text[:10]}T{text[11:26]}Z"'
        return '"' + zoned(text) + '"'

    setattr(fragment, "compiled_kind", (KIND_ZONED, width))  # noqa: B010
    return fragment


def _java_year(year: int) -> str:
    """A year as Java's ISO_LOCAL_DATE prints it: four digits at least, a sign beyond
    9999 or before year 0 (``+294276``, ``-4712`` for 4713 BC)."""
    if year > 9999:
        return f"+{year}"
    return f"-{-year:04d}" if year < 0 else f"{year:04d}"


def _utc_date_and_clock(text: str) -> tuple[str, str]:
    """A timestamptz as (date, ``HH:MM:SS.ffffff``) in UTC, in integers: any year
    PostgreSQL holds (4713 BC to 294276 AD), which ``datetime`` does not."""
    days, micros = divmod(wt.timestamptz_to_epoch_micros(text), 86_400_000_000)
    year, month, day = wt.civil_from_epoch_days(days)
    seconds, fraction = divmod(micros, 1_000_000)
    minutes, second = divmod(seconds, 60)
    return (f"{_java_year(year)}-{month:02d}-{day:02d}",
            f"{minutes // 60:02d}:{minutes % 60:02d}:{second:02d}.{fraction:06d}")


def _zoned_timestamp(width: int) -> Callable[[str], str]:
    """Debezium's ZonedTimestamp: UTC, 'Z', fraction zero-padded to the column precision."""

    def convert(text: str) -> str:
        if text in ("infinity", "-infinity"):
            return text
        if text.endswith("+00") and len(text) >= 22 and text[10] == " " \
                and text[4] == "-":  # fast path: the session's TimeZone is UTC
            day, clock = text[:10], text[11:-3]
        else:
            day, clock = _utc_date_and_clock(text)
        seconds, _, frac = clock.partition(".")
        if width <= 0:
            frac = frac.rstrip("0")
            return f"{day}T{seconds}{'.' + frac if frac else ''}Z"
        return f"{day}T{seconds}.{frac.ljust(width, '0')[:width]}Z"

    return convert


def _zoned_time(text: str) -> str:
    value = wt.parse_timetz(text)
    utc = value.replace(tzinfo=None)
    offset = value.utcoffset()
    if offset:
        moment = dt.datetime.combine(dt.date(2000, 1, 1), utc) - offset
        utc = moment.time()
    text = utc.isoformat()
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text + "Z"


def _bytea(text: str) -> bytes:
    return wt.parse_bytea(text)


_INT64_MAX: Final = 2**63 - 1


def _interval_micros(text: str) -> int:
    if text in ("infinity", "-infinity"):
        # PostgreSQL 17's infinite intervals have no duration: the ends of MicroDuration's
        # int64, which is what Java's saturating (long) cast makes of an infinite one.
        return _INT64_MAX if text == "infinity" else -_INT64_MAX - 1
    return wt.interval_to_micros(text)


def _interval_string(text: str) -> str:
    return wt.parse_interval(text).to_iso8601()


def java_float_text(text: str) -> str:
    """The JSON text Jackson writes for a ``float4``/``float8`` value, from PostgreSQL's
    text of it: Java's ``Float/Double.toString`` (confirmed by capture).

    Plain notation with at least one fraction digit for 1e-3 <= |x| < 1e7 (``100.0``,
    ``0.001``), else ``d.dddE<n>`` (``1.23456789125E8``, ``1.0E-5``); NaN and
    ±Infinity as JSON strings of Java's names, which are PostgreSQL's too. The digits
    are PostgreSQL's, its shortest exact form (the default since PostgreSQL 12), which
    is what Java 19+ writes (older Java writes more digits for a few values).
    """
    if text[-1] > "9":  # NaN, Infinity, -Infinity
        return '"' + text + '"'
    whole, point, fraction = text.partition(".")
    if point and "e" not in fraction:  # the common case: plain text that may be Java's
        digits = whole.lstrip("-")
        if 0 < len(digits) <= 7 and (digits != "0" or fraction[:3].strip("0")) \
                and (digits == "0" or digits[0] != "0"):
            return text
    return _java_notation(text)


def _java_notation(text: str) -> str:
    """Java's Double.toString of the decimal *text* (sign, digits, optional exponent),
    keeping its digits."""
    sign = "-" if text[0] == "-" else ""
    mantissa, _, exponent_text = text.lstrip("-+").lower().partition("e")
    whole, _, fraction = mantissa.partition(".")
    all_digits = whole + fraction
    significant = all_digits.lstrip("0")
    digits = significant.rstrip("0")
    if not digits:
        return sign + "0.0"
    # value = int(digits) * 10**scale; sci: the exponent of its first digit
    scale = int(exponent_text or 0) - len(fraction) + len(significant) - len(digits)
    sci = len(digits) - 1 + scale
    if -3 <= sci < 7:
        if sci < 0:
            return f"{sign}0.{'0' * (-sci - 1)}{digits}"
        head = digits[:sci + 1].ljust(sci + 1, "0")
        return f"{sign}{head}.{digits[sci + 1:] or '0'}"
    return f"{sign}{digits[0]}.{digits[1:] or '0'}E{sci}"


def _java_double_text(text: str) -> str:
    """The JSON text of a numeric (or money amount) in Debezium's double mode: Java's
    Double.toString of the nearest double (``1.234567891E7``; confirmed by capture)."""
    if text[-1] > "9":  # NaN, Infinity, -Infinity: Java's names are PostgreSQL's
        return '"' + text + '"'
    value = float(text)
    if value in (_INF, -_INF):
        # Beyond a double (numeric holds 1e400): BigDecimal.doubleValue() is infinite,
        # which Jackson quotes; repr's "inf" would make the line invalid JSON.
        return '"Infinity"' if value > 0 else '"-Infinity"'
    return _java_notation(repr(value))


def _float_value(text: str) -> Any:
    """A float's JSON value inside other values (array elements): its Java text, raw."""
    return msgspec.Raw(java_float_text(text).encode())



setattr(_date_fragment, "compiled_kind", (KIND_DATE, 0))  # noqa: B010
