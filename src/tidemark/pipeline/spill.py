"""Big micro-batches go to the driver through Parquet files, a piece at a time.

A micro-batch is collected to the driver in one Arrow table (``DataFrame.toArrow``):
fast, but the driver's JVM and Python then hold the whole batch, and a batch is whole
transactions, so one bulk load (a 10M-row ``INSERT … SELECT``) made the JVM run out of
heap and the pipeline stop. A batch of more source log than ``spark.collect_max_mb`` is
therefore written by the executors to ``<checkpoint>/tidemark-spill/<batch id>`` as
Parquet (Spark streams it: no process holds the batch), and each target's rows are read
back in pieces of ``spark.apply_step_rows`` rows and ``spark.apply_step_mb`` MB for
:func:`tidemark.lake.delta_writer.apply_changes_in_steps`, which commits them as one.
Every buffer on the way is bounded by rows and by bytes, so wide rows take no more
memory than narrow ones (``benchmarks/bench_memory_bound.py`` measures it); the cutting
into pieces is :mod:`tidemark.spark.arrow_pieces`, which the Delta sink shares.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame
from pyspark.sql.types import StructType

from tidemark.spark.arrow_pieces import DEFAULT_STEP_BYTES, pieces
from tidemark.spark.change_schemas import is_packed_envelope, typed_rows
from tidemark.spark.table_rows import rows_per_slice

log = logging.getLogger(__name__)

SPILL_DIR: Final = "tidemark-spill"
#: Envelope rows read from a spill file at once, at most, and about how many bytes
#: (Parquet's uncompressed size): a packed envelope row holds up to ``arrowBatchRows``
#: change rows and ``arrowBatchBytes`` bytes, a struct envelope row one change row.
_READ_PACKED: Final = 2
_READ_STRUCT: Final = 65_536
_READ_BYTES: Final = 16 << 20
_PART: Final = re.compile(r"part-(\d+)")




def previous_offset(checkpoint: str, batch_id: int) -> dict[str, Any] | None:
    """Where batch *batch_id* starts: the end of the batch before it in Spark's offset
    log; None when it is not there (the first batch of a query)."""
    previous = Path(checkpoint) / "offsets" / str(batch_id - 1)
    try:
        lines = previous.read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    offset: dict[str, Any] = json.loads(lines[-1])
    return offset


def spill_dir(checkpoint: str, batch_id: int) -> Path:
    """Where batch *batch_id* is spilled."""
    return Path(checkpoint) / SPILL_DIR / str(batch_id)


#: Parquet's writer (in the executor's JVM heap) buffers a row group until it reaches
#: ``parquet.block.size``, but measures it only every 100 rows at first: 100 packed
#: envelope rows of several MB each overflowed a 1 GB heap before the first measure.
#: After a measure it waits for the rows the average row size says will fill the row
#: group, up to ``…row.check.max`` rows: a small first row (a few changes) made it wait
#: 1,000 rows, and 171 rows of 1 MB were buffered as one row group (issue 34: a 1 GB
#: transaction overflowed a 512 MB heap). Measured from the first row and at least every
#: 10, with row groups of a few packed rows, the writer holds about one row group per
#: task, whatever the rows' width. A dictionary of blobs would only be dropped again, and
#: statistics would keep a copy of each row group's smallest and largest blob until the
#: file is closed (the spill is read whole, never filtered).
ROW_GROUP_OPTIONS: Final = {
    "parquet.block.size": str(32 << 20),
    "parquet.page.size.row.check.min": "1",
    "parquet.page.size.row.check.max": "10",
}
_WRITER_OPTIONS: Final = {
    **ROW_GROUP_OPTIONS,
    "parquet.enable.dictionary": "false",
    "parquet.column.statistics.enabled": "false",
}


def spill(batch: DataFrame, path: Path) -> None:
    """Have the executors write *batch* to *path* (replacing what a failed try left)."""
    shutil.rmtree(path.parent, ignore_errors=True)  # earlier batches' are done with
    batch.write.mode("overwrite").options(**_WRITER_OPTIONS).parquet(str(path))


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
                 rows_per_piece: int,
                 bytes_per_piece: int = DEFAULT_STEP_BYTES) -> Iterator[pa.Table]:
    """The change rows of *table* (typed by *schema*) in the spill at *path*, in commit
    order, in pieces of *rows_per_piece* rows or about *bytes_per_piece* bytes (the last
    one smaller; a piece may end inside a transaction). *envelope* is the Arrow schema
    Spark collects the batch as, which a struct envelope read back from Parquet is cast
    to."""
    return pieces(_table_rows(path, table, schema, envelope), rows_per_piece,
                  bytes_per_piece)


def _table_rows(path: Path, table: str, schema: StructType,
                envelope: pa.Schema | None) -> Iterator[pa.Table]:
    for file in _files_in_order(path):
        parquet = pq.ParquetFile(file)
        packed = is_packed_envelope(parquet.schema_arrow.names)
        size = _read_rows(parquet.metadata, _READ_PACKED if packed else _READ_STRUCT)
        for record_batch in parquet.iter_batches(batch_size=size):
            read = pa.Table.from_batches([record_batch])
            if not packed and envelope is not None:
                read = read.cast(envelope)
            yield typed_rows(read, table, schema)


def _read_rows(metadata: pq.FileMetaData, most: int) -> int:
    """Envelope rows per read of a spill file: at most *most*, and about
    :data:`_READ_BYTES` by the widest row group's rows."""
    step = most
    for i in range(metadata.num_row_groups):
        group = metadata.row_group(i)
        if group.num_rows:
            step = min(step, rows_per_slice(group.num_rows, group.total_byte_size, most,
                                            _READ_BYTES))
    return step
