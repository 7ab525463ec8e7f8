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
