"""What a capture has done so far: the figures metrics and status read.

Plain attributes, updated once per batch by the connector's loop (never per event on
the hot path) and read by other threads without a lock: each is a single value, and a
reader seeing one batch's figures next to another's is harmless for monitoring.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Sequence

from tidemark.event import ChangeEvent


@dataclasses.dataclass
class CaptureStats:
    """Counters and positions of one capture (Debezium's streaming and snapshot
    metrics, by the same names where :mod:`tidemark.metrics` exports them)."""

    events_seen: int = 0
    """Change events handed on (TotalNumberOfEventsSeen)."""
    transactions_committed: int = 0
    """Transactions whose commit was processed (NumberOfCommittedTransactions)."""
    last_event_commit_us: int | None = None
    """Commit time of the newest event's transaction, µs since the epoch."""
    last_event_at: float | None = None
    """When the newest event was handed on (``time.time()``)."""
    connected: bool = False
    """The replication stream is open (Connected)."""
    position_lsn: int = 0
    """The newest offset handed on (SourceEventPosition)."""
    snapshot_running: bool = False
    snapshot_completed: bool = False
    rows_scanned: dict[str, int] = dataclasses.field(default_factory=dict)
    """Snapshot rows read per table (RowsScanned)."""

    def saw_events(self, count: int, commit_us: int | None) -> None:
        """*count* events of a transaction committed at *commit_us* were handed on."""
        self.events_seen += count
        self.last_event_commit_us = commit_us
        self.last_event_at = time.time()

    def count_rows(self, reads: Sequence[ChangeEvent]) -> None:
        """Snapshot rows handed on, per table (RowsScanned)."""
        first = reads[0].schema if reads else None
        if first is not None and reads[-1].schema is first:  # one table's fetch: no loop
            tables = Counter({str(first.table): len(reads)})
        else:
            tables = Counter(str(e.schema.table) for e in reads if e.schema is not None)
        for table, count in tables.items():
            self.rows_scanned[table] = self.rows_scanned.get(table, 0) + count

    @property
    def millis_behind_source(self) -> float | None:
        """How old the newest event's commit was when it was handed on
        (MilliSecondsBehindSource); None before the first event."""
        if self.last_event_commit_us is None or self.last_event_at is None:
            return None
        return max(0.0, self.last_event_at * 1000 - self.last_event_commit_us / 1000)
