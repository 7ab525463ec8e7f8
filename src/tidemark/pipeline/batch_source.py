"""What a pipeline asks its source between batches: how much log a batch spans, how far
the pipeline is behind, how log positions read; and the batch's offsets in Spark's
checkpoint. The source's own answers come from its kind
(:class:`tidemark.source.kind.SourceKind`): nothing here knows which source it is."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tidemark.lake.delta_writer import SnapshotLoad
from tidemark.pipeline import spill
from tidemark.pipeline.config import PipelineConfig
from tidemark.pipeline.progress import BatchReport
from tidemark.source.kind import SourceKind, SourceProgress
from tidemark.source.postgres.snapshot_plan import SnapshotPlan
from tidemark.source.postgres.stream_offsets import SourceOffset
from tidemark.source.registry import kind_of

log = logging.getLogger(__name__)


class BatchSource:
    """The source of one pipeline, as its batches see it."""

    def __init__(self, config: PipelineConfig) -> None:
        self.config = config
        self.kind: SourceKind = kind_of(config.dsn, config.source.kind)
        self._progress: SourceProgress | None = None

    @property
    def progress(self) -> SourceProgress:
        if self._progress is None:
            self._progress = self.kind.progress(self.config.dsn,
                                                slot=self.config.source.slot,
                                                tables=list(self.config.tables))
        return self._progress

    def close(self) -> None:
        """Let go of the connection the lag and sizing queries keep."""
        if self._progress is not None:
            self._progress.close()
            self._progress = None

    def offset(self, raw_offset: dict[str, Any]) -> SourceOffset | None:
        """The batch end's offset with its snapshot plan, for a source whose Spark
        offsets carry one (None for the others: their batches list what they
        ``loaded``)."""
        return SourceOffset.parse(raw_offset) if self.kind.plans_snapshots_in_offset \
            else None

    def loads(self, raw_offset: dict[str, Any],
              offset: SourceOffset | None) -> dict[str, SnapshotLoad]:
        """How each table's rows of the batch go into Delta (a snapshot's: written, not
        merged); a batch that holds a table's snapshot without a plan holds only its
        rows (``loaded``)."""
        if offset is None:
            return dict.fromkeys(raw_offset.get("loaded", ()), "replace")
        return snapshot_loads(offset.snapshot)

    def position_text(self, position: int) -> str:
        """A log position as people read it."""
        return self.kind.position_text(position)

    def batch_bytes(self, batch_id: int, raw_offset: dict[str, Any],
                    offset: SourceOffset | None) -> int | None:
        """How many bytes of source log the batch spans; None when unknown (the batch
        is then spilled, the safe choice)."""
        if raw_offset.get("loaded") or (offset is not None and offset.snapshot is not None
                                        and offset.snapshot.chunks):
            # Tables' rows (a snapshot's, up to a whole table): the log tells nothing of
            # their bytes.
            return None
        start = spill.previous_offset(self.config.checkpoint, batch_id)
        try:
            return self.progress.batch_bytes(start, raw_offset)
        except Exception as err:  # only sizing: the spill is the safe choice
            log.warning("cannot size batch %d in the source's log (it is spilled): %s",
                        batch_id, err)
            return None

    def existing_row_values(self, table: str, columns: Sequence[str]) -> dict[str, Any]:
        return existing_row_values_of(self.kind, self.config.dsn, table, columns)

    def report(self, batch_id: int, changes: dict[str, int], seconds: float,
               replayed: list[str], newest_commit_us: int | None,
               offset: SourceOffset | None, raw_offset: dict[str, Any]) -> BatchReport:
        lag_bytes = 0
        try:
            lag_bytes = self.progress.lag_bytes(raw_offset)
        except Exception as err:  # progress must never fail the batch
            log.warning("cannot measure the lag behind the source: %s", err)
        # The age of the newest commit this batch applied (commit to Delta, end to end).
        # An empty batch means no captured change was committed up to its end, so the
        # pipeline is not behind in time even if other WAL (other tables, checkpoints)
        # makes the byte lag non-zero.
        lag_seconds = 0.0
        if newest_commit_us is not None:
            lag_seconds = max(0.0, time.time() - newest_commit_us / 1e6)
        snapshot = "" if offset is None or offset.snapshot is None else \
            offset.snapshot.progress(self.config.source.chunk_rows)
        return BatchReport(batch_id=batch_id, changes=changes, seconds=seconds,
                           lag_bytes=lag_bytes, lag_seconds=lag_seconds,
                           replayed=tuple(replayed), snapshot=snapshot)


def existing_row_values_of(kind: SourceKind, dsn: str, table: str,
                           columns: Sequence[str]) -> dict[str, Any]:
    """The values the source's existing rows hold in *columns*, new to the target (a
    module function: executors call it too, given the driver's *kind* — a kind
    registered at run time is unknown to their registry); without a catalog to ask
    (MariaDB, SQLite), none: new columns start null in Delta's older rows."""
    if not kind.knows_column_defaults(dsn):
        return {}
    return kind.existing_row_values(dsn, table, columns)


def checkpoint_query_id(checkpoint: str) -> str:
    """The query id Spark stores in ``<checkpoint>/metadata`` (stable across restarts)."""
    text = (Path(checkpoint) / "metadata").read_text(encoding="utf-8")
    return str(json.loads(text.splitlines()[0])["id"])


def batch_offset(checkpoint: str, batch_id: int) -> dict[str, Any]:
    """The batch's end offset from Spark's offset log (written before the batch runs)."""
    lines = (Path(checkpoint) / "offsets" / str(batch_id)).read_text(
        encoding="utf-8").splitlines()
    offset: dict[str, Any] = json.loads(lines[-1])
    return offset


def snapshot_loads(plan: SnapshotPlan | None) -> dict[str, SnapshotLoad]:
    """How each table's rows of a batch holding snapshot chunks go into Delta.

    While a table's snapshot runs, its batches hold only its snapshot's rows (the
    stream drops its earlier changes and stops at the snapshot's point), in key order:
    the first chunk of a generation replaces the target's content, the later ones hold
    keys no earlier chunk held, so neither needs a merge.
    """
    if plan is None:
        return {}
    loads: dict[str, SnapshotLoad] = {}
    for chunk in plan.chunks:
        if chunk.after is None:
            loads[chunk.table] = "replace"
        else:
            loads.setdefault(chunk.table, "append")
    return loads
