"""Rows per fetch from a database cursor, bounded by bytes as well as by rows.

A cursor fetches a number of rows, whatever their width: 20,000 WAL messages or 65,536
log rows are a few MB when narrow and gigabytes when each carries a 100 KB value. A
:class:`FetchBudget` turns a byte budget into rows per fetch from the width of the rows
fetched last (a sample of them), so what one fetch holds stays near the budget
whatever the rows' width; the first fetch takes a few rows to learn it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

#: Bytes of values one fetch aims at.
FETCH_BYTES: Final = 16 << 20
#: Rows of the first fetch, before any width is known.
_FIRST_ROWS: Final = 16
#: Rows of a fetch whose widths are measured.
_SAMPLE: Final = 64


class FetchBudget:
    """Rows per fetch: at most *most_rows*, and about *most_bytes* by the widest of
    the rows sampled in the last fetch (one row at least)."""

    def __init__(self, most_rows: int, most_bytes: int = FETCH_BYTES) -> None:
        self.most_rows = max(1, most_rows)
        self.most_bytes = max(1, most_bytes)
        self._row_bytes: int | None = None

    def rows(self) -> int:
        """Rows to fetch next."""
        if self._row_bytes is None:
            return min(self.most_rows, _FIRST_ROWS)
        return max(1, min(self.most_rows, self.most_bytes // max(1, self._row_bytes)))

    def saw(self, rows: Sequence[Sequence[Any]]) -> None:
        """Learn the width of rows from *rows*, just fetched (tuples of values)."""
        if not rows:
            return
        # The widest of the sample: a fetch of rows of mixed width stays under budget.
        self._row_bytes = max(value_bytes(row) for row in rows[::max(1, len(rows) // _SAMPLE)])


def value_bytes(row: Sequence[Any]) -> int:
    """About how many bytes *row*'s values hold (text and bytes by length, others 8)."""
    return sum(len(v) if isinstance(v, str | bytes | bytearray | memoryview) else 8
               for v in row)
