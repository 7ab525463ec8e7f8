"""Rows per chunk of an incremental snapshot: from the size set, growing while cheap.

Each chunk costs a few round trips whatever its size (PostgreSQL: two watermarks, one a
flushed commit, and the chunk's transaction; MariaDB: the consistent read's start and
the binlog position), so small chunks spend most of their time on them: at 1,024 rows
the snapshot ran at a fraction of what the server reads. A :class:`ChunkSizer` starts at
the size set (``incremental_snapshot_chunk_size``) and doubles it after each full chunk
whose read took less than :data:`CHEAP_READ_S`, up to :data:`MOST_ROWS`, and never past
what keeps a chunk's rows within :data:`MOST_BYTES` of memory by the widest row of the
last chunk (the rows of the windows read ahead wait in memory until their closing
mark). A chunk whose read took longer than :data:`DEAR_READ_S` halves it again (not
below the size set). With ``adaptive`` off the size set is kept (pinned).

The bound by the last chunk's rows does not hold where the rows get wider further on:
each source's chunk read also stops at :data:`CHUNK_MOST_BYTES` itself (PostgreSQL's
counted by the server, :mod:`tidemark.source.postgres.chunk_query`; MariaDB's by
:func:`row_memory` as the rows arrive unbuffered,
:mod:`tidemark.source.mariadb.incremental_snapshot`).
"""

from __future__ import annotations

import datetime
import decimal
from collections.abc import Sequence
from typing import Any, Final

from tidemark.fetch_budget import value_bytes

#: The most rows a chunk grows to.
MOST_ROWS: Final = 32_768
#: The most memory (an estimate: values and Python's per-value overhead) a chunk grows
#: to hold; the PostgreSQL source reads up to 4 windows ahead, so 16 MB at most.
MOST_BYTES: Final = 4 << 20
#: The most memory a chunk's rows may take whatever its size said: twice the aim, so
#: that a chunk sized right by the rows before it is not cut (the server counts the
#: bytes its own way, a little over or under :func:`row_memory`).
CHUNK_MOST_BYTES: Final = 2 * MOST_BYTES
#: A full chunk read faster than this makes the next one twice as large.
CHEAP_READ_S: Final = 0.05
#: A chunk read slower than this makes the next one half as large.
DEAR_READ_S: Final = 0.5
#: Memory of one value beside its bytes: a Python object's header and its pointer.
VALUE_OVERHEAD: Final = 56
_SAMPLE: Final = 64
#: Value types :func:`row_memory` counts as 8 bytes: nothing to add to 8 per value.
_FIXED: Final = frozenset({type(None), int, float, bool, decimal.Decimal, datetime.datetime,
                           datetime.date, datetime.time, datetime.timedelta})
#: Value types counted by their length (with None, which has no length).
_SIZED: Final = frozenset({type(None), str, bytes})


class ChunkSizer:
    """The size of the next chunk, learnt from the ones read (see the module)."""

    def __init__(self, start: int, *, adaptive: bool = True, most_rows: int = MOST_ROWS,
                 most_bytes: int = MOST_BYTES) -> None:
        self.start = max(1, start)
        self.adaptive = adaptive
        self.most_rows = max(self.start, most_rows)
        self.most_bytes = most_bytes
        self.chunk_most_bytes = 2 * most_bytes
        """The most a chunk's rows may hold, however wide they turn out
        (:data:`CHUNK_MOST_BYTES`)."""
        self._rows = self.start

    def rows(self) -> int:
        """Rows of the next chunk."""
        return self._rows

    def saw(self, rows: Sequence[Sequence[Any]], asked: int, seconds: float) -> None:
        """A chunk of *asked* rows came back as *rows* after *seconds* of reading."""
        if not self.adaptive or not rows:
            return
        size = self._rows
        if len(rows) >= asked and seconds < CHEAP_READ_S:
            size = min(size * 2, self.most_rows)
        elif seconds > DEAR_READ_S:
            size //= 2
        widest = max(row_memory(row) for row in rows[::max(1, len(rows) // _SAMPLE)])
        self._rows = max(self.start, min(size, self.most_bytes // widest))

    def reset(self) -> None:
        """Start again from the size set (a new table)."""
        self._rows = self.start


def rows_memory(rows: Sequence[Sequence[Any]]) -> int:
    """At least the sum of :func:`row_memory` over *rows* (equal rows' width), counted a
    column at a time: text and bytes columns by ``len`` without a Python step per value,
    every value 8 bytes more. *rows* all have the same number of values."""
    if not rows:
        return 0
    width = len(rows[0])
    total = (VALUE_OVERHEAD * (width + 1) + 8 * width) * len(rows)
    for column in zip(*rows, strict=True):
        kinds = set(map(type, column))
        if kinds <= _SIZED:
            # None and empty values are the falsy ones here: they add nothing.
            total += sum(map(len, filter(None, column)))
        elif not kinds <= _FIXED:
            total += value_bytes(column)
    return total


def row_memory(row: Sequence[Any]) -> int:
    """About how much memory *row* takes while buffered: its values' bytes and a
    Python object for each."""
    return value_bytes(row) + VALUE_OVERHEAD * (len(row) + 1)
