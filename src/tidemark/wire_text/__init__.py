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

The parsers live by concern: :mod:`~tidemark.wire_text.scalars`,
:mod:`~tidemark.wire_text.temporal`, :mod:`~tidemark.wire_text.interval` and
:mod:`~tidemark.wire_text.arrays`; this package gathers their public names, which is
where callers take them from.
"""

from __future__ import annotations

from tidemark.wire_text.arrays import (
    parse_array,
)
from tidemark.wire_text.interval import (
    INTERVAL_NEG_INFINITY,
    INTERVAL_POS_INFINITY,
    Interval,
    interval_to_micros,
    parse_interval,
)
from tidemark.wire_text.scalars import (
    InetValue,
    parse_bool,
    parse_bytea,
    parse_cidr,
    parse_float,
    parse_inet,
    parse_int,
    parse_money,
    parse_numeric,
    parse_uuid,
)
from tidemark.wire_text.temporal import (
    civil_from_epoch_days,
    date_to_epoch_days,
    parse_date,
    parse_time,
    parse_timestamp,
    parse_timestamptz,
    parse_timetz,
    time_to_micros,
    timestamp_to_epoch_micros,
    timestamptz_to_epoch_micros,
)

__all__ = [
    "INTERVAL_NEG_INFINITY",
    "INTERVAL_POS_INFINITY",
    "InetValue",
    "Interval",
    "civil_from_epoch_days",
    "date_to_epoch_days",
    "interval_to_micros",
    "parse_array",
    "parse_bool",
    "parse_bytea",
    "parse_cidr",
    "parse_date",
    "parse_float",
    "parse_inet",
    "parse_int",
    "parse_interval",
    "parse_money",
    "parse_numeric",
    "parse_time",
    "parse_timestamp",
    "parse_timestamptz",
    "parse_timetz",
    "parse_uuid",
    "time_to_micros",
    "timestamp_to_epoch_micros",
    "timestamptz_to_epoch_micros",
]
