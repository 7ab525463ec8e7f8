"""Change rows in pieces bounded by rows and by bytes, to apply a batch in steps.

:func:`tidemark.lake.delta_writer.apply_changes_in_steps` holds one piece at a time;
:func:`pieces` cuts the Arrow tables read from staged or spilled files into such pieces
(of ``stepRows``/``stepBytes`` for the Delta sink, ``spark.apply_step_rows``/
``spark.apply_step_mb`` for ``tidemark run``), holding only the rows of the piece being
filled, so wide rows take no more memory than narrow ones.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Final

import pyarrow as pa

from tidemark.spark.table_rows import rows_per_slice

#: Default bytes of change rows merged per step (``spark.apply_step_mb``, ``stepBytes``).
DEFAULT_STEP_BYTES: Final = 64 << 20


def pieces(tables: Iterable[pa.Table], rows_per_piece: int,
           bytes_per_piece: int = DEFAULT_STEP_BYTES) -> Iterator[pa.Table]:
    """The rows of *tables* (one schema, in order) in pieces of *rows_per_piece* rows
    or about *bytes_per_piece* bytes, whichever is fewer rows (one row at least), the
    last one smaller; only the rows of the piece being filled are held."""
    pending: list[pa.Table] = []
    held = held_bytes = 0
    for rows in tables:
        if not rows.num_rows:
            continue
        pending.append(rows)
        held += rows.num_rows
        held_bytes += rows.nbytes
        if held >= rows_per_piece or held_bytes >= bytes_per_piece:
            joined = pa.concat_tables(pending)
            step = rows_per_slice(held, held_bytes, rows_per_piece, bytes_per_piece)
            start = 0
            while held - start >= step:
                yield joined.slice(start, step)
                start += step
            rest = joined.slice(start)
            pending, held, held_bytes = [rest], held - start, rest.nbytes
            del joined, rest  # only the rest's rows are held while the next piece fills
    if held:
        yield pa.concat_tables(pending)


def first_then(first: pa.Table, rest: Iterator[pa.Table]) -> Iterator[pa.Table]:
    """*first*, then *rest*, holding no reference to a piece already handed out."""
    yield first
    del first
    yield from rest
