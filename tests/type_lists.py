"""Every type of every source, one list each: the columns (SQL after ``CREATE TABLE t``)
and the rows (``INSERT INTO t VALUES`` + the row text, ``%d`` its key, ``%s`` where a
test puts a value of its own), and the columns whose Arrow value is the source's text
(no exact Arrow type: :mod:`tidemark.serde.arrow_changes`). Used by the converters'
agreement test (tests/engine/test_engine_converter_types.py) and the conformance
matrix's sources (tests/conformance/sources.py); one place, so both test the same
types."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class TypeList:
    """One source's types."""

    columns: str
    """The column definitions, the first ``id``, the key."""
    row: str
    """One row's (or, for MariaDB, two rows') text, with ``%d`` for each key and, for
    PostgreSQL and the log tables, ``%s`` for a numeric of the test's choice."""
    width: int
    """How many columns, the key included."""
    arrow_text: dict[str, Any] = field(default_factory=dict)
    """Columns whose Arrow value is the source's text, and that text (in ``row``)."""
    prelude: tuple[str, ...] = ()
    """Statements the columns need first (a type they use)."""

    def names(self) -> list[str]:
        return [c.strip().split()[0] for c in _split(self.columns)]


def _split(columns: str) -> list[str]:
    """The column definitions (commas inside parentheses kept)."""
    out, depth, start = [], 0, 0
    for i, char in enumerate(columns):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            out.append(columns[start:i])
            start = i + 1
    return [*out, columns[start:]]


_MARIADB_COLUMNS = (
    "id INT PRIMARY KEY, t0 TIME, t3 TIME(3), t6 TIME(6), d DATE, dt DATETIME, "
    "dt3 DATETIME(3), dt6 DATETIME(6), ts TIMESTAMP NULL, ts6 TIMESTAMP(6) NULL, y YEAR, "
    "b1 BIT(1), b10 BIT(10), n DECIMAL(10,3), n0 DECIMAL(30,0), e ENUM('x','y'), "
    "s SET('p','q'), j JSON, bl BLOB, vb VARBINARY(10), f FLOAT, dd DOUBLE, ti TINYINT, "
    "u BIGINT UNSIGNED, mi MEDIUMINT, c CHAR(3), tx TEXT")
_MARIADB_ROWS = (
    "(%d, '-01:02:03', '838:59:59.5', '-00:00:00.000001', '2024-02-29', "
    "'1000-01-01 00:00:00', '2024-01-02 03:04:05.123', '9999-12-31 23:59:59.999999', "
    "'1970-01-01 00:00:01', '2038-01-19 03:14:07.999999', 2024, b'1', b'1010101010', "
    "-1234.567, 123456789012345678901234567890, 'y', 'p,q', '{\"a\": [1, 2]}', "
    "x'00ff10', x'0102', 1.5, -2.25e100, -128, 18446744073709551615, -8388608, 'ab', 'é'), "
    "(%d, '00:00:00', NULL, '12:34:56.789012', '1000-01-01', NULL, NULL, "
    "'1970-01-01 00:00:00', NULL, NULL, 1901, b'0', b'0', 0, -1, NULL, '', 'null', x'', "
    "NULL, NULL, 0, 127, 0, 0, '', NULL)")


_POSTGRES_COLUMNS = (
    "id int PRIMARY KEY, t time, t3 time(3), tz timetz, iv interval, n numeric(10,3), "
    "nn numeric, by bytea, ai int[], at text[], j json, jb jsonb, u uuid, au uuid[], "
    "ts timestamp, ts3 timestamp(3), tst timestamptz, d date, m money, b bool, f real, "
    "dp double precision, bi bigint, si smallint, bt bit(3), vb varbit, e mood, "
    "ip inet, c char(3), vc varchar(5)")
_POSTGRES_ROW = (
    "(%d, '23:59:59.999999', '12:00:00.5', '10:00:00+02', '1 year 2 mons 3 days "
    "04:05:06.7', -1234.567, %s, '\\x00ff', '{1,NULL,3}', '{\"a b\",c}', "
    "'{\"a\": 1}', '{\"b\": [1]}', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', "
    "'{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11}', '2024-01-02 03:04:05.123456', "
    "'1900-01-02 03:04:05.5', '2024-01-02 03:04:05.123456+02', '2024-02-29', 12.34, "
    "true, 1.5, -2.25e100, 9223372036854775807, -32768, B'101', B'11', 'happy', "
    "'10.0.0.1/8', 'ab', 'é')")
_POSTGRES_TEXT = {"tz": "10:00:00+02", "iv": "P1Y2M3DT4H5M6.7S", "m": "$12.34"}



MARIADB_TYPES = TypeList(_MARIADB_COLUMNS, _MARIADB_ROWS, 27)
POSTGRES_TYPES = TypeList(_POSTGRES_COLUMNS, _POSTGRES_ROW, 30, _POSTGRES_TEXT,
                          ("CREATE TYPE mood AS ENUM ('sad', 'happy')",))
SQLITE_LOGTABLE_TYPES = TypeList(
    "id INTEGER PRIMARY KEY, r REAL, tx TEXT, bl BLOB, b BOOLEAN, n NUMERIC, "
    "dc DECIMAL(10,2), d DATE, j JSON",
    "(%d, -2.5, 'é', x'00ff', 1, %s, 12.5, '2024-02-29', '{\"a\": 1}')", 9)
POSTGRES_LOGTABLE_TYPES = TypeList(
    "id int PRIMARY KEY, t time, iv interval, n numeric(10,3), nn numeric, by bytea, "
    "ai int[], j jsonb, u uuid, ts timestamp, tst timestamptz, d date, b bool",
    "(%d, '12:00:00.5', '-1 day', -1234.567, %s, '\\x00ff', '{1,NULL}', "
    "'{\"a\": 1}', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', "
    "'2024-01-02 03:04:05.123456', '2024-01-02 03:04:05.123456+02', "
    "'2024-02-29', true)", 13, {"iv": "P-1D"})

for _types in (MARIADB_TYPES, POSTGRES_TYPES, SQLITE_LOGTABLE_TYPES, POSTGRES_LOGTABLE_TYPES):
    assert len(_types.names()) == _types.width, _types.names()
