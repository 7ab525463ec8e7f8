"""Vectorized decoding of many pgoutput row messages of one table into Arrow columns.

The per-message Python decoder spends most of its time on per-value interpreter work
(a slice and a branch per column per row). Here the messages of one table are joined
into one buffer and each column is located in every row at once with numpy: a column's
kind bytes, lengths and value offsets are arrays, so the Python cost is per column and
per chunk, not per value. Arrow then gathers each column's values into a compact string
array (a ``take`` over a zero-copy view of the messages).

Only messages with one tuple right after a fixed 8-byte header take this path (their
layout is ``type, relation id (4), tuple kind, column count (2)``): Insert (``N``),
Delete (``K`` or ``O``) and an Update that carries only its new row (``N``). Updates
with an old row take the per-message decoder (they are rare: key changes, ``REPLICA
IDENTITY FULL``). Binary-format values (``b``) never occur: tidemark requests text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import numpy as np
import pyarrow as pa

#: Bytes before the tuple's first column in an Insert, Delete or new-row-only Update.
HEADER: Final = 8

_TEXT: Final = 0x74  # 't'
_NULL: Final = 0x6E  # 'n'
_UNCHANGED: Final = 0x75  # 'u'


class TupleLayoutError(ValueError):
    """The messages do not have the expected layout (column count, kinds, lengths)."""


class TupleColumns:
    """The columns of *n* decoded rows: string arrays in relation column order.

    ``unchanged`` lists, per row with unchanged-TOAST columns, the row index and the
    column indexes the server did not send (those values are null in the arrays).
    """

    __slots__ = ("arrays", "unchanged")

    def __init__(self, arrays: list[pa.StringArray],
                 unchanged: list[tuple[int, list[int]]]) -> None:
        self.arrays = arrays
        self.unchanged = unchanged


def join_messages(messages: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """*messages* joined into one byte array, with each message's start and length."""
    n = len(messages)
    lengths = np.fromiter(map(len, messages), np.int64, n)
    buf = np.frombuffer(b"".join(messages), np.uint8)
    return buf, np.cumsum(lengths) - lengths, lengths


def decode_tuples(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray,
                  ncols: int) -> TupleColumns:
    """Decode the tuples of the messages at *starts* (with *lengths*) in *buf*, all of
    one relation with *ncols* columns, in increasing order of *starts*.

    Raises :class:`TupleLayoutError` if any message does not fit the layout exactly;
    the caller then decodes those messages one by one, which names the fault.
    """
    n = len(starts)
    if n == 0:
        return TupleColumns([pa.array([], pa.string()) for _ in range(ncols)], [])
    ends = starts + lengths
    if int(lengths.min()) < HEADER:
        raise TupleLayoutError("message shorter than its header")
    counts = (buf[starts + 6].astype(np.int64) << 8) | buf[starts + 7]
    if not bool((counts == ncols).all()):
        raise TupleLayoutError(f"column count differs from the relation's {ncols}")

    kinds = np.empty((ncols, n), np.uint8)
    # Where each value starts and ends in *buf*; a NULL or unchanged value is the empty
    # range at its kind byte, so that ranges never decrease (see _column).
    value_starts = np.empty((ncols, n), np.int64)
    value_ends = np.empty((ncols, n), np.int64)
    size = len(buf)
    pos = starts + HEADER
    for column in range(ncols):
        if int(pos.max()) >= size:
            raise TupleLayoutError("tuple runs past the end of its message")
        kind = buf[pos]
        kinds[column] = kind
        text = kind == _TEXT
        at = pos[text]
        if len(at) and int(at.max()) + 4 >= size:
            raise TupleLayoutError("value length runs past the end of its message")
        length = ((buf[at + 1].astype(np.int64) << 24) | (buf[at + 2].astype(np.int64) << 16)
                  | (buf[at + 3].astype(np.int64) << 8) | buf[at + 4])
        value_starts[column] = pos
        value_starts[column, text] += 5
        pos = pos + 1
        pos[text] += 4 + length
        value_ends[column] = value_starts[column]
        value_ends[column, text] += length
    if not bool((pos == ends).all()):
        raise TupleLayoutError("tuple does not end where its message ends")
    if not bool(np.isin(kinds, (_TEXT, _NULL, _UNCHANGED)).all()):
        raise TupleLayoutError("unexpected column kind (binary values are not requested)")

    data = pa.py_buffer(buf)
    valid = kinds == _TEXT
    arrays = [_column(data, value_starts[c], value_ends[c], valid[c]) for c in range(ncols)]
    unchanged: list[tuple[int, list[int]]] = []
    marks = kinds == _UNCHANGED
    if bool(marks.any()):
        for row in np.flatnonzero(marks.any(axis=0)).tolist():
            unchanged.append((row, np.flatnonzero(marks[:, row]).tolist()))
    return TupleColumns(arrays, unchanged)


def _column(data: pa.Buffer, value_starts: np.ndarray, value_ends: np.ndarray,
            valid: np.ndarray) -> pa.StringArray:
    """One column's values as a compact string array, gathered in C++.

    The values lie in increasing, non-overlapping ranges of *data*, so one binary
    array over *data* whose elements alternate value, gap, value, gap… needs no copy
    (its offsets are just the range bounds); taking every other element gathers the
    values into a compact array, with NULL (or unchanged) values as null indexes.
    """
    n = len(value_starts)
    bounds = np.empty(2 * n + 1, np.int64)
    bounds[0:2 * n:2] = value_starts
    bounds[1:2 * n:2] = value_ends
    bounds[2 * n] = value_ends[-1]
    if not bool((np.diff(bounds) >= 0).all()):  # Arrow would read out of bounds
        raise TupleLayoutError("values overlap")
    spans = pa.LargeBinaryArray.from_buffers(pa.large_binary(), 2 * n,
                                             [None, pa.py_buffer(bounds), data])
    picks = pa.array(np.arange(0, 2 * n, 2, dtype=np.int64), mask=~valid)
    values = spans.take(picks)
    try:
        # Arrow strings must be UTF-8 (checked here); the per-message decoder reports
        # bad bytes exactly.
        result: pa.StringArray = values.cast(pa.string())
    except pa.ArrowInvalid:
        raise TupleLayoutError("a value is not valid UTF-8 (or a column exceeds 2 GiB)"
                               ) from None
    return result
