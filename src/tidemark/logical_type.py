"""The logical type of a column: what every serializer, the Spark source and the Delta
writer switch on, whatever the source.

A source maps its own types to these once (PostgreSQL's OIDs and type modifiers in
:func:`tidemark.source.postgres.types.logical_type`; a MariaDB column type and its
metadata in its own mapper) and hands over values as text in the canonical form of the
logical type (:mod:`tidemark.wire_text`), or as bytes for :attr:`Kind.BYTES`. Debezium
draws the same line: each connector has a value-converter provider, the converters
that follow it know only Kafka Connect's schema types.
"""

from __future__ import annotations

from enum import StrEnum

import msgspec


class Kind(StrEnum):
    """The kinds of logical type. The canonical text of each is in :mod:`tidemark.wire_text`."""

    INT16 = "int16"
    INT32 = "int32"
    INT64 = "int64"
    FLOAT32 = "float32"
    FLOAT64 = "float64"
    BOOL = "bool"  # text "t" / "f"
    DECIMAL = "decimal"  # precision < 0: no declared precision (variable scale)
    MONEY = "money"  # a currency amount with two fraction digits ("$1,000.00")
    DATE = "date"
    TIME = "time"  # precision: fraction-second digits (< 0: unspecified, 6)
    TIMETZ = "timetz"
    TIMESTAMP = "timestamp"  # without time zone
    TIMESTAMPTZ = "timestamptz"  # an instant, printed in UTC
    INTERVAL = "interval"
    BYTES = "bytes"  # bytes, or text in the hex form "\\x0a1b"
    STRING = "string"
    JSON = "json"
    UUID = "uuid"
    ENUM = "enum"
    ARRAY = "array"  # element: the element's logical type; text "{1,2,NULL}"


#: Kinds whose values are whole numbers printed in decimal (valid JSON as they are).
INTEGER_KINDS = frozenset({Kind.INT16, Kind.INT32, Kind.INT64})
#: Kinds whose values are floating point (Java's text in Debezium JSON).
FLOAT_KINDS = frozenset({Kind.FLOAT32, Kind.FLOAT64})
#: Kinds whose values are text to every serializer.
TEXT_KINDS = frozenset({Kind.STRING, Kind.JSON, Kind.UUID, Kind.ENUM})


class LogicalType(msgspec.Struct, frozen=True, gc=False):
    """A column's logical type.

    ``precision`` is the decimal's number of digits, or the fraction-second digits of a
    time kind; -1 when the source declares none. ``scale`` is the decimal's scale (it
    may be negative). ``element`` is an array's element type.
    """

    kind: Kind
    precision: int = -1
    scale: int = 0
    element: LogicalType | None = None

    @property
    def time_precision(self) -> int:
        """Fraction-second digits of a time kind (6 when the source declares none)."""
        return self.precision if self.precision >= 0 else 6

    @property
    def fixed_decimal(self) -> bool:
        """A decimal with a declared precision and scale."""
        return self.kind is Kind.DECIMAL and self.precision >= 0

    def __str__(self) -> str:
        if self.kind is Kind.ARRAY:
            return f"array<{self.element}>"
        if self.kind is Kind.DECIMAL and self.precision >= 0:
            return f"decimal({self.precision},{self.scale})"
        if self.precision >= 0:
            return f"{self.kind}({self.precision})"
        return str(self.kind)


def array_of(element: LogicalType) -> LogicalType:
    """The logical type of an array of *element*."""
    return LogicalType(Kind.ARRAY, element=element)


STRING = LogicalType(Kind.STRING)
INT64 = LogicalType(Kind.INT64)
