"""A key of a ``tidemark-repair`` signal from the key's canonical texts
(:mod:`tidemark.row_checksum`: what ``tidemark verify`` names a differing key by).

The canonical text of a key column depends on the *target's* type (dates as days since
1970, timestamps as microseconds, binary as hex); a repair signal needs the value as
the source prints it (numbers as JSON numbers, the rest as text the source's SQL
accepts for that column and the pipeline reads back into that target type, which it
does for a ``d`` of a key the source no longer has). :func:`key_value` converts one
back, exactly: every canonical form names one value, and the texts made here are the
forms PostgreSQL prints for it (a source kind whose SQL reads some other way overrides
``SourceKind.repair_key_value``).
"""

from __future__ import annotations

import datetime as dt
import decimal
from collections.abc import Callable, Mapping
from typing import Final

import pyarrow as pa

from tidemark import wire_text
from tidemark.logical_type import FLOAT_KINDS, INTEGER_KINDS, Kind, LogicalType
from tidemark.source.repair import RepairRequest, key_text
from tidemark.source.repair_signal import KeyValue

_EPOCH_DATE: Final = dt.date(1970, 1, 1)
_EPOCH: Final = dt.datetime(1970, 1, 1)


class RepairKeyError(ValueError):
    """A key value that cannot be put into a repair signal (the message says why)."""


def _float_value(text: str) -> KeyValue:
    special = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}
    if text in special:
        return special[text]  # not JSON numbers: the text PostgreSQL prints
    if text == "0":
        return 0.0
    sign, _, rest = text.rpartition("0.")
    digits, _, exponent = rest.partition("e")
    # 0.<digits>e<exp> = <digits>e(<exp> - len(digits)); the double it names exactly.
    return float(f"{sign}{digits}e{int(exponent) - len(digits)}")


def _wall_clock(micros: int) -> dt.datetime:
    try:
        return _EPOCH + dt.timedelta(microseconds=micros)
    except OverflowError:
        raise RepairKeyError(f"the timestamp of {micros} microseconds since 1970 is out of "
                             "the years 1 to 9999") from None


def timestamp_text(micros: int, *, zone: str | None) -> str:
    """``YYYY-MM-DD HH:MM:SS[.ffffff]`` of *micros* since 1970 (the fraction's trailing
    zeros dropped, as PostgreSQL prints it), ``+00`` appended when *zone* is given."""
    moment = _wall_clock(micros)
    text = (f"{moment.year:04d}-{moment.month:02d}-{moment.day:02d} "
            f"{moment.hour:02d}:{moment.minute:02d}:{moment.second:02d}")
    if moment.microsecond:
        text += f".{moment.microsecond:06d}".rstrip("0")
    return text + ("+00" if zone is not None else "")


def date_text(days: int) -> str:
    """``YYYY-MM-DD`` of *days* since 1970-01-01."""
    try:
        day = _EPOCH_DATE + dt.timedelta(days=days)
    except OverflowError:
        raise RepairKeyError(f"the date {days} days from 1970-01-01 is out of the years 1 "
                             "to 9999") from None
    return f"{day.year:04d}-{day.month:02d}-{day.day:02d}"


def time_text(micros: int) -> str:
    """``HH:MM:SS[.ffffff]`` of *micros* since midnight."""
    seconds, fraction = divmod(micros, 1_000_000)
    minutes, second = divmod(seconds, 60)
    hour, minute = divmod(minutes, 60)
    text = f"{hour:02d}:{minute:02d}:{second:02d}"
    return text + (f".{fraction:06d}".rstrip("0") if fraction else "")


def key_value(text: str, target_type: pa.DataType) -> KeyValue:
    """The repair signal's value of a key column whose canonical text is *text* and
    whose target column is of *target_type*; raises :class:`RepairKeyError` for a value
    no source text gives back (a list, a date beyond the year 9999)."""
    try:
        if pa.types.is_integer(target_type):
            return int(text)
        if pa.types.is_boolean(target_type):
            return {"t": "t", "f": "f"}[text]
        if pa.types.is_decimal(target_type):
            # Text, not a JSON number: a reader would take a number as a double.
            return f"{decimal.Decimal(text):f}"
        if pa.types.is_floating(target_type):
            return _float_value(text)
        if pa.types.is_binary(target_type) or pa.types.is_large_binary(target_type):
            return "\\x" + bytes.fromhex(text).hex()
        if pa.types.is_date(target_type):
            return date_text(int(text))
        if pa.types.is_timestamp(target_type):
            return timestamp_text(int(text), zone=target_type.tz)
        if pa.types.is_time(target_type):
            return time_text(int(text))
    except (KeyError, ValueError, decimal.InvalidOperation) as err:
        if isinstance(err, RepairKeyError):
            raise
        raise RepairKeyError(f"{text!r} is not a canonical value of {target_type}") \
            from None
    if pa.types.is_list(target_type) or pa.types.is_large_list(target_type):
        raise RepairKeyError(f"a key column of type {target_type} (a list) cannot be named "
                             "in a repair signal")
    return text  # strings: the text the pipeline received, which the source printed


def _timestamp(text: str) -> object:
    try:
        return wire_text.parse_timestamp(text)
    except ValueError:
        return wire_text.parse_timestamptz(text)


def _integer(bits: int) -> Callable[[str], object]:
    def read(text: str) -> object:
        value = wire_text.parse_int(text)
        if not -(1 << (bits - 1)) <= value < 1 << (bits - 1):
            raise ValueError(f"{value} is out of range for a {bits}-bit integer")
        return value
    return read


#: What reads a key's text as its column's kind, as the pipeline reads a ``d`` row's
#: key back (kinds not listed take any text).
_READERS: Final[dict[Kind, Callable[[str], object]]] = {
    Kind.INT16: _integer(16), Kind.INT32: _integer(32), Kind.INT64: _integer(64),
    **dict.fromkeys(FLOAT_KINDS, wire_text.parse_float),
    Kind.DECIMAL: wire_text.parse_numeric, Kind.BOOL: wire_text.parse_bool,
    Kind.UUID: wire_text.parse_uuid, Kind.DATE: wire_text.parse_date,
    Kind.TIMESTAMP: _timestamp, Kind.TIMESTAMPTZ: _timestamp,
}


def key_type_problem(request: RepairRequest, types: Mapping[str, LogicalType]) -> str | None:
    """Why a key of *request* is not a value of its column's logical type (*types*: the
    table's columns), or None: a ``1.5`` or ``"abc"`` for an integer key, a number out of
    the column's range. Asked on the driver when a signal is taken, for sources whose
    SQL would not refuse such a key itself: the key's ``d`` row would fail every replay
    of the batch that holds it. A boolean column takes JSON booleans and the texts
    ``t``/``f`` (what :func:`key_value` sends), ``true``/``false``."""
    for index, column in enumerate(request.key_columns):
        logical = types.get(column)
        if logical is None:
            return f"{request.table} has no column {column}"
        read = _READERS.get(logical.kind)
        if read is None:
            continue
        for key in request.keys:
            value = key[index]
            try:
                if isinstance(value, bool) and logical.kind is not Kind.BOOL:
                    raise ValueError(value)
                if isinstance(value, float) and logical.kind in INTEGER_KINDS:
                    raise ValueError(value)
                if not isinstance(value, bool):
                    read(key_text(value))
            except (ValueError, ArithmeticError):
                named = dict(zip(request.key_columns, key, strict=True))
                return (f"key {named} is not a value of {column} ({logical.kind}): give it "
                        f"as the text the source prints for a {logical.kind}")
    return None
