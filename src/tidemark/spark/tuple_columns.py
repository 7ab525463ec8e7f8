"""Vectorized decoding of many pgoutput row messages of one table into Arrow columns.

The per-message Python decoder spends most of its time on per-value interpreter work
(a slice and a branch per column per row). Here the messages of one table are joined
into one buffer and each column is located in every row at once with numpy: a column's
kind bytes, lengths and value offsets are arrays, so the Python cost is per column and
per chunk, not per value. The values are then gathered column by column into one
contiguous data buffer and wrapped as Arrow string arrays without copying again.

Only messages with one tuple right after a fixed 8-byte header take this path (their
layout is ``type, relation id (4), tuple kind, column count (2)``): Insert (``N``),
Delete (``K`` or ``O``) and an Update that carries only its new row (``N``). Updates
with an old row take the per-message decoder (they are rare: key changes, ``REPLICA
IDENTITY FULL``). Binary-format values (``b``) never occur: tidemark requests text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

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


def decode_tuples(messages: Sequence[bytes], ncols: int) -> TupleColumns:
    """Decode the tuples of *messages* (all of one relation with *ncols* columns).

    Raises :class:`TupleLayoutError` if any message does not fit the layout exactly;
    the caller then decodes those messages one by one, which names the fault.
    """
    n = len(messages)
    if n == 0:
        return TupleColumns([pa.array([], pa.string()) for _ in range(ncols)], [])
    lengths = np.fromiter(map(len, messages), np.int64, n)
    buf = np.frombuffer(b"".join(messages), np.uint8)
    ends = np.cumsum(lengths)
    starts = ends - lengths
    if int(lengths.min()) < HEADER:
        raise TupleLayoutError("message shorter than its header")
    counts = (buf[starts + 6].astype(np.int64) << 8) | buf[starts + 7]
    if not bool((counts == ncols).all()):
        raise TupleLayoutError(f"column count differs from the relation's {ncols}")

    kinds = np.empty((ncols, n), np.uint8)
    value_starts = np.empty((ncols, n), np.int64)
    value_lengths = np.zeros((ncols, n), np.int64)
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
        value_lengths[column, text] = length
        value_starts[column] = pos + 5
        pos = pos + 1
        pos[text] += 4 + length
    if not bool((pos == ends).all()):
        raise TupleLayoutError("tuple does not end where its message ends")
    if not bool(np.isin(kinds, (_TEXT, _NULL, _UNCHANGED)).all()):
        raise TupleLayoutError("unexpected column kind (binary values are not requested)")

    # Gather every value, column after column, into one data buffer: index of each
    # output byte = its value's start in the input + its position inside the value.
    flat_lengths = value_lengths.ravel()
    offsets = np.zeros(flat_lengths.size + 1, np.int64)
    np.cumsum(flat_lengths, out=offsets[1:])
    total = int(offsets[-1])
    if total >= 2**31:
        raise TupleLayoutError("more than 2 GiB of values in one chunk")
    shift = np.repeat(value_starts.ravel() - offsets[:-1], flat_lengths)
    data = buf[shift + np.arange(total, dtype=np.int64)]
    data_buffer = pa.py_buffer(data)
    offsets32 = offsets.astype(np.int32)
    try:
        # Arrow strings must be UTF-8; the per-message decoder reports bad bytes exactly.
        pa.StringArray.from_buffers(flat_lengths.size, pa.py_buffer(offsets32),
                                    data_buffer).validate(full=True)
    except pa.ArrowInvalid:
        raise TupleLayoutError("a value is not valid UTF-8") from None
    valid = kinds == _TEXT
    arrays: list[pa.StringArray] = []
    for column in range(ncols):
        column_valid = valid[column]
        nulls = n - int(np.count_nonzero(column_valid))
        validity = (pa.py_buffer(np.packbits(column_valid, bitorder="little"))
                    if nulls else None)
        column_offsets = pa.py_buffer(offsets32[column * n:(column + 1) * n + 1])
        array: Any = pa.StringArray.from_buffers(n, column_offsets, data_buffer, validity,
                                                 nulls)
        arrays.append(array)
    unchanged: list[tuple[int, list[int]]] = []
    marks = kinds == _UNCHANGED
    if bool(marks.any()):
        for row in np.flatnonzero(marks.any(axis=0)).tolist():
            unchanged.append((row, np.flatnonzero(marks[:, row]).tolist()))
    return TupleColumns(arrays, unchanged)
