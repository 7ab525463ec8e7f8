from typing import Any

FALLBACK: int
INT: int
DOUBLE: int
DECIMAL: int
DATETIME2: int
TIMESTAMP2: int
TIME2: int
DATE: int
YEAR: int
UTF8: int
BYTES: int

def decode_rows(
    data: bytes, pos: int, op: int, plan: tuple[tuple[int, int, int, bool, Any], ...], /
) -> list[tuple[Any, Any]]:
    """The rows of a rows event whose images hold every column."""

J_INT: int
J_STRING: int
J_DATE: int
J_ZONED: int
J_DECIMAL: int
J_DOUBLE: int

def rows_lines(
    data: bytes,
    pos: int,
    op: int,
    plan: tuple[tuple[int, int, int, bool, Any], ...],
    json: tuple[Any, ...],
    head: str,
    tail: str,
    ts_text: str,
    tombstones: bool,
    /,
) -> list[str] | None:
    """The Debezium JSON lines of a rows event, or None: left to decode_rows."""

def count_rows(
    data: bytes, pos: int, op: int, plan: tuple[tuple[int, int, int, bool, Any], ...], /
) -> int:
    """The rows of a rows event from the images' sizes, or -1."""
