"""ChunkSizer: chunk sizes from the size set, doubling while cheap, halving when dear,
bounded in rows and memory, pinned when not adaptive."""

from __future__ import annotations

import datetime
import decimal

from tidemark.source.chunk_size import (
    CHEAP_READ_S,
    DEAR_READ_S,
    ChunkSizer,
    row_memory,
    rows_memory,
)


def _rows(n: int, width: int = 10) -> list[tuple[str]]:
    return [("x" * width,)] * n


def test_full_cheap_chunks_double_up_to_the_most_rows() -> None:
    sizer = ChunkSizer(100, most_rows=500)
    sizes = []
    for _ in range(5):
        sizes.append(sizer.rows())
        sizer.saw(_rows(sizer.rows()), sizer.rows(), CHEAP_READ_S / 2)
    assert sizes == [100, 200, 400, 500, 500]


def test_a_short_chunk_does_not_grow_and_a_dear_one_halves_down_to_the_start() -> None:
    sizer = ChunkSizer(100)
    sizer.saw(_rows(50), 100, 0.0)  # the table's last chunk
    assert sizer.rows() == 100
    for _ in range(3):
        sizer.saw(_rows(sizer.rows()), sizer.rows(), 0.0)
    assert sizer.rows() == 800
    sizer.saw(_rows(800), 800, DEAR_READ_S * 2)
    assert sizer.rows() == 400
    for _ in range(5):
        sizer.saw(_rows(sizer.rows()), sizer.rows(), DEAR_READ_S * 2)
    assert sizer.rows() == 100
    sizer.saw(_rows(100), 100, 0.0)
    sizer.reset()
    assert sizer.rows() == 100


def test_the_memory_bound_limits_growth_but_not_the_size_set() -> None:
    wide = _rows(1, 10_000)
    sizer = ChunkSizer(4, most_bytes=20 * row_memory(wide[0]))
    for _ in range(10):
        sizer.saw(wide * sizer.rows(), sizer.rows(), 0.0)
    assert sizer.rows() == 20
    huge = ChunkSizer(4, most_bytes=row_memory(wide[0]))
    huge.saw(wide * 4, 4, 0.0)
    assert huge.rows() == 4


def test_a_pinned_size_never_changes() -> None:
    sizer = ChunkSizer(100, adaptive=False)
    sizer.saw(_rows(100), 100, 0.0)
    assert sizer.rows() == 100


def test_rows_memory_is_at_least_what_each_row_takes() -> None:
    """The column-at-a-time count bounds the row-by-row one from above, whatever the
    values: text, bytes, None, numbers, dates and types it does not know."""
    rows = [(1, "a" * 300, None, b"\x00" * 7, 2.5, decimal.Decimal("1.25"),
             datetime.date(2024, 1, 1), memoryview(b"xyz"), ""),
            (2, None, "wide" * 1000, b"", None, None, None, None, "b"),
            (3, "", "", None, 1.0, decimal.Decimal(0), None, b"zz", None)]
    exact = sum(row_memory(r) for r in rows)
    assert exact <= rows_memory(rows) <= exact + 8 * len(rows) * len(rows[0])
    assert rows_memory([]) == 0
