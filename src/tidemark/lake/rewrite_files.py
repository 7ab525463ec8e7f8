"""A merge-on-read rewrite's reads and writes, a row group at a time
(:func:`tidemark.lake.vector_compaction.prepare_rewrite`).

A rewrite copies the live rows of up to a target file's worth of files into new files.
Held whole, those rows took several times the target file size in memory (the rows, the
table they were concatenated into, and delta-rs's buffers). Here the old files are read
a batch at a time (:func:`live_batches`) and the new ones written a row group at a time
(:func:`write_in_order`), so a rewrite holds about one row group of each (an old
file's row group is read whole: Parquet reads a column chunk at a time).

delta-rs writes the batches of a stream in no fixed order, and the rows' order is what
places the rows deleted while the rewrite ran (:mod:`tidemark.lake.vector_compaction`),
so an unpartitioned table's new files are written by pyarrow, in order, and their add
actions (statistics included) come from ``convert_to_deltalake``, which reads them from
the Parquet footers as delta-rs's own writer does.
"""

from __future__ import annotations

import dataclasses
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import convert_to_deltalake, write_deltalake
from pyroaring import BitMap64

from tidemark.lake import delta_log
from tidemark.lake.deletion_vector import DeletionVector, read_vector
from tidemark.lake.key_hashes import plain_schema
from tidemark.lake.mor_rows import conform_columns, with_partition_values

#: Rows read from an old file at a time, at most, and their bytes (Parquet's
#: uncompressed size), about.
_READ_ROWS: Final = 65_536
_READ_BYTES: Final = 8 << 20
#: A new file's row group is written once it holds this many rows or bytes (Arrow's
#: size): delta-rs's row groups hold up to 1M rows too, and the bytes bound what a
#: rewrite of wide rows holds.
_GROUP_ROWS: Final = 1 << 20
_GROUP_BYTES: Final = 64 << 20


@dataclasses.dataclass(frozen=True)
class OldFile:
    """A live file to rewrite: its add action, the vector it has when read, and its
    physical and live row counts."""

    add: dict[str, Any]
    vector: BitMap64
    physical: int
    live: int

    @classmethod
    def read(cls, root: Path, add: dict[str, Any]) -> OldFile:
        """The file *add* of the local table *root*, its vector read now."""
        physical = pq.ParquetFile(root / unquote(add["path"])).metadata.num_rows
        vector = BitMap64()
        if add.get("deletionVector"):  # a small file may have none
            vector = read_vector(root, DeletionVector.from_json(add["deletionVector"]))
        deleted = vector.rank(physical - 1) if physical else 0
        return cls(add, vector, physical, physical - deleted)


def live_batches(root: Path, old: OldFile, schema: pa.Schema,
                 partitions: list[str]) -> Iterator[pa.RecordBatch]:
    """The live rows of *old*, in its order and in *schema* (nullable; its partition
    values as columns), a batch at a time."""
    deleted = np.frombuffer(old.vector.to_array(), dtype=np.uint64).astype(np.int64)
    nullable = pa.schema([f.with_nullable(True) for f in schema])
    start = 0
    for batch in _batches(pq.ParquetFile(root / unquote(old.add["path"]))):
        rows = pa.Table.from_batches([batch])
        rows = rows.cast(plain_schema(rows.schema))
        end = start + len(rows)
        gone = deleted[np.searchsorted(deleted, start):np.searchsorted(deleted, end)]
        if len(gone):
            keep = np.ones(len(rows), dtype=bool)
            keep[gone - start] = False
            rows = rows.filter(pa.array(keep))
        start = end
        rows = with_partition_values(rows, old.add, partitions, schema)
        if len(rows):
            yield from conform_columns(rows, nullable).to_batches()


def _batches(source: pq.ParquetFile) -> Iterator[pa.RecordBatch]:
    """*source*'s rows in order, a row group at a time, in batches of about
    _READ_BYTES: a reader of the whole file fills each batch from as many row groups as
    it takes (measured: a 47 MB file of 32 KiB rows read whole for batches of 65,536
    rows), and one row group's column chunks are read whole whatever the batch."""
    metadata = source.metadata
    for group in range(metadata.num_row_groups):
        info = metadata.row_group(group)
        rows = info.num_rows * _READ_BYTES // max(1, info.total_byte_size)
        yield from source.iter_batches(batch_size=max(1, min(_READ_ROWS, rows)),
                                       row_groups=[group])


class RowStream:
    """Batches of rows, taken a given number of rows at a time."""

    def __init__(self, batches: Iterator[pa.RecordBatch]) -> None:
        self._batches = batches
        self._left: pa.RecordBatch | None = None

    def take(self, count: int) -> Iterator[pa.RecordBatch]:
        """The next *count* rows; raises ValueError when the stream holds fewer."""
        while count > 0:
            batch = self._left if self._left is not None else next(self._batches, None)
            self._left = None
            if batch is None:
                raise ValueError(f"{count} rows fewer than counted in the files' vectors")
            if len(batch) > count:
                batch, self._left = batch.slice(0, count), batch.slice(count)
            count -= len(batch)
            yield batch

    def finish(self) -> None:
        """Raise ValueError if the stream holds rows no piece took."""
        if self._left is not None or next(self._batches, None) is not None:
            raise ValueError("more rows than counted in the files' vectors")


def write_in_order(folder: Path, batches: Iterator[pa.RecordBatch],
                   schema: pa.Schema) -> list[dict[str, Any]]:
    """Write *batches* in their order as one Parquet file of a new table in *folder*;
    returns its add actions (none without a row)."""
    folder.mkdir(parents=True)
    path = folder / f"part-00000-{uuid.uuid4()}-c000.snappy.parquet"
    rows = 0
    with pq.ParquetWriter(os.fspath(path), schema, compression="snappy") as writer:
        group: list[pa.RecordBatch] = []
        held = grouped = 0
        for batch in batches:
            left = batch
            while len(left):
                piece, left = left.slice(0, _GROUP_ROWS - grouped), \
                    left.slice(_GROUP_ROWS - grouped)
                group.append(piece)
                held += piece.nbytes
                grouped += len(piece)
                if grouped >= _GROUP_ROWS or held >= _GROUP_BYTES:
                    rows += _write_group(writer, group, schema)
                    group, held, grouped = [], 0, 0
        rows += _write_group(writer, group, schema)
    if not rows:
        path.unlink()
        return []
    convert_to_deltalake(os.fspath(folder))
    return list(delta_log.read_log(folder).files.values())


def _write_group(writer: pq.ParquetWriter, group: list[pa.RecordBatch],
                 schema: pa.Schema) -> int:
    if not group:
        return 0
    rows = pa.Table.from_batches(group, schema=schema)
    writer.write_table(rows, row_group_size=len(rows))
    return len(rows)


def write_partitioned(folder: Path, batches: Iterator[pa.RecordBatch], schema: pa.Schema,
                      partitions: list[str], size: int | None) -> list[dict[str, Any]]:
    """Write *batches* as a new partitioned table in *folder* (delta-rs cuts its files
    by partition and *size*, the rows in no known order); returns its add actions."""
    write_deltalake(os.fspath(folder), pa.RecordBatchReader.from_batches(schema, batches),
                    mode="error", partition_by=partitions, target_file_size=size)
    return list(delta_log.read_log(folder).files.values())
