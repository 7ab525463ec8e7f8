"""Which way a batch reaches a target's files: :func:`merges_on_read`.

``merge = "auto"`` picks merge-on-read when copy-on-write would rewrite much more than
the batch: the rows of the files whose range of the first key column meets the batch's
keys (what delta-rs's pruned merge rewrites) against the batch's own rows. A clustered
table whose changes fall among its newest keys stays copy-on-write (few files
rewritten, no deletion vectors for readers to apply); uniformly spread updates of a big
table go merge-on-read.
"""

from __future__ import annotations

import logging
from typing import Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from tidemark.errors import ConfigError
from tidemark.lake.branch import local_directory
from tidemark.lake.collapse import PreparedBatch
from tidemark.lake.spec import ApplySpec

log = logging.getLogger(__name__)

#: Below this many rows a table is rewritten cheaply enough: auto stays copy-on-write.
AUTO_MIN_ROWS: Final = 200_000
#: Auto goes merge-on-read when copy-on-write would rewrite more than this many rows per
#: row of the batch.
AUTO_REWRITE_FACTOR: Final = 8


def merges_on_read(table: DeltaTable, batch: PreparedBatch, spec: ApplySpec,
                   uri: str) -> bool:
    """Whether *batch* is applied to *table* by deletion vectors (see the module). A
    batch with a truncate never is."""
    if spec.merge == "copy_on_write" or batch.truncates or not len(batch.rows):
        return False
    if local_directory(uri) is None:
        if spec.merge == "merge_on_read":
            raise ConfigError("merge", f"merge_on_read writes deletion vectors on the local "
                                       f"file system only, and {uri} is not local: use "
                                       f"\"copy_on_write\" or \"auto\" for this target")
        return False
    return spec.merge == "merge_on_read" or _rewrite_is_large(table, batch, spec)


def _rewrite_is_large(table: DeltaTable, batch: PreparedBatch, spec: ApplySpec) -> bool:
    actions = pa.table(table.get_add_actions(flatten=True))
    records = np.asarray(pc.fill_null(actions.column("num_records"), 0).to_numpy(
        zero_copy_only=False), dtype=np.int64)
    total = int(records.sum())
    if total < AUTO_MIN_ROWS:
        return False
    key = spec.keys[0]
    rewrite = total
    low, high = f"min.{key}", f"max.{key}"
    kind = batch.rows.schema.field(key).type
    if pa.types.is_integer(kind) and low in actions.column_names:
        keys = np.unique(batch.rows.column(key).to_numpy())
        lows = actions.column(low).to_numpy(zero_copy_only=False)
        highs = actions.column(high).to_numpy(zero_copy_only=False)
        if not (np.isnan(lows.astype(float)).any() or np.isnan(highs.astype(float)).any()):
            hits = (np.searchsorted(keys, highs.astype(np.int64), side="right")
                    - np.searchsorted(keys, lows.astype(np.int64), side="left")) > 0
            rewrite = int(records[hits].sum())
    choice = rewrite > AUTO_REWRITE_FACTOR * len(batch.rows)
    log.debug("%s: copy-on-write would rewrite %d of %d rows for %d changes: %s",
              table.table_uri, rewrite, total, len(batch.rows),
              "merge-on-read" if choice else "copy-on-write")
    return choice
