"""How serializers represent values whose type has several Debezium representations.

Debezium names these per connector (``decimal.handling.mode``,
``time.precision.mode``); they belong to the serializers, not to a source: every source's
decimals and times go through them.
"""

from __future__ import annotations

from enum import StrEnum


class DecimalHandlingMode(StrEnum):
    """How ``numeric``/``decimal``/``money`` values are represented."""

    PRECISE = "precise"
    STRING = "string"
    DOUBLE = "double"


class TimePrecisionMode(StrEnum):
    """How ``time``/``timestamp`` values are represented (Debezium's names)."""

    ADAPTIVE = "adaptive"
    ADAPTIVE_TIME_MICROSECONDS = "adaptive_time_microseconds"
    CONNECT = "connect"
