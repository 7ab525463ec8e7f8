"""Big micro-batches go to the driver through Parquet files, a piece at a time.

A micro-batch is collected to the driver in one Arrow table (``DataFrame.toArrow``):
fast, but the driver's JVM and Python then hold the whole batch, and a batch is whole
transactions, so one bulk load (a 10M-row ``INSERT … SELECT``) made the JVM run out of
heap and the pipeline stop. A batch of more source log than ``spark.collect_max_mb`` is
therefore written by the executors to ``<checkpoint>/tidemark-spill/<batch id>`` as
Parquet (Spark streams it: no process holds the batch), and each target's rows are read
back in pieces of ``spark.apply_step_rows`` for
:func:`tidemark.lake.delta_writer.apply_changes_in_steps`, which commits them as one.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Final

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame
from pyspark.sql.types import StructType

from tidemark.spark.arrow_rows import is_packed_envelope, typed_rows

log = logging.getLogger(__name__)

SPILL_DIR: Final = "tidemark-spill"
#: Envelope rows read from a spill file at once: a packed envelope row holds up to
#: ``arrow_batch_rows`` change rows, a struct envelope row one.
_READ_PACKED: Final = 8
_READ_STRUCT: Final = 65_536
_PART: Final = re.compile(r"part-(\d+)")


def batch_log_bytes(checkpoint: str, batch_id: int, end: dict[str, Any],
                    position: Callable[[dict[str, Any]], int]) -> int | None:
    """How much source log the batch spans: from the end of the batch before it (Spark's
    offset log) to its own *end*, both turned into log positions by *position*; None
    when the start is not there (the first batch of a query)."""
    previous = Path(checkpoint) / "offsets" / str(batch_id - 1)
    try:
        lines = previous.read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    return max(0, position(end) - position(json.loads(lines[-1])))


def spill_dir(checkpoint: str, batch_id: int) -> Path:
    """Where batch *batch_id* is spilled."""
    return Path(checkpoint) / SPILL_DIR / str(batch_id)


def spill(batch: DataFrame, path: Path) -> None:
    """Have the executors write *batch* to *path* (replacing what a failed try left)."""
    shutil.rmtree(path.parent, ignore_errors=True)  # earlier batches' are done with
    batch.write.mode("overwrite").parquet(str(path))


def remove(path: Path) -> None:
    """Drop a spilled batch once it is applied."""
    shutil.rmtree(path, ignore_errors=True)


def _files_in_order(path: Path) -> list[Path]:
    """The spill's Parquet files in Spark partition order: the batch's WAL slices in
    commit order, then its snapshot chunks."""
    def number(file: Path) -> int:
        found = _PART.match(file.name)
        return int(found.group(1)) if found else -1
    return sorted(path.glob("part-*.parquet"), key=lambda f: (number(f), f.name))


def table_pieces(path: Path, table: str, schema: StructType, envelope: pa.Schema | None,
                 rows_per_piece: int) -> Iterator[pa.Table]:
    """The change rows of *table* (typed by *schema*) in the spill at *path*, in commit
    order, in pieces of *rows_per_piece* rows (the last one smaller; a piece may end
    inside a transaction). *envelope* is the Arrow schema Spark collects the batch as,
    which a struct envelope read back from Parquet is cast to."""
    return pieces(_table_rows(path, table, schema, envelope), rows_per_piece)


def _table_rows(path: Path, table: str, schema: StructType,
                envelope: pa.Schema | None) -> Iterator[pa.Table]:
    for file in _files_in_order(path):
        parquet = pq.ParquetFile(file)
        packed = is_packed_envelope(parquet.schema_arrow.names)
        size = _READ_PACKED if packed else _READ_STRUCT
        for record_batch in parquet.iter_batches(batch_size=size):
            read = pa.Table.from_batches([record_batch])
            if not packed and envelope is not None:
                read = read.cast(envelope)
            yield typed_rows(read, table, schema)


def pieces(tables: Iterable[pa.Table], rows_per_piece: int) -> Iterator[pa.Table]:
    """The rows of *tables* (one schema, in order) in pieces of *rows_per_piece* rows,
    the last one smaller; only the rows of the piece being filled are held."""
    pending: list[pa.Table] = []
    held = 0
    for rows in tables:
        if not rows.num_rows:
            continue
        pending.append(rows)
        held += rows.num_rows
        if held >= rows_per_piece:
            joined = pa.concat_tables(pending)
            start = 0
            while held - start >= rows_per_piece:
                yield joined.slice(start, rows_per_piece)
                start += rows_per_piece
            pending, held = [joined.slice(start)], held - start
            del joined  # only the rest's rows are held while the next piece fills
    if held:
        yield pa.concat_tables(pending)


def first_then(first: pa.Table, rest: Iterator[pa.Table]) -> Iterator[pa.Table]:
    """*first*, then *rest*, holding no reference to a piece already handed out."""
    yield first
    del first
    yield from rest
