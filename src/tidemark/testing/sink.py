"""An in-memory sink for engine tests: collects what it is given, optionally slowly or
failing, and works as a per-record consumer and as a batch consumer."""

from __future__ import annotations

import threading
import time

from tidemark.engine.consumers import BatchCommitter
from tidemark.engine.converters import ConvertedRecord


class MemorySink:
    """Collects delivered records (thread-safe).

    *delay_s*: sleep per record (an I/O-bound consumer); *fail_at*: raise
    ``RuntimeError`` when the record with this index (0-based, in arrival order) comes.
    """

    def __init__(self, delay_s: float = 0.0, fail_at: int | None = None) -> None:
        self.delay_s = delay_s
        self.fail_at = fail_at
        self.records: list[ConvertedRecord] = []
        self.batches = 0
        self._lock = threading.Lock()
        self.threads: set[str] = set()

    def __call__(self, record: ConvertedRecord) -> None:
        if self.delay_s:
            time.sleep(self.delay_s)
        with self._lock:
            if self.fail_at is not None and len(self.records) >= self.fail_at:
                raise RuntimeError(f"sink failed at record {self.fail_at} (as asked)")
            self.records.append(record)
            self.threads.add(threading.current_thread().name)

    def handle_batch(self, records: list[ConvertedRecord], committer: BatchCommitter) -> None:
        for record in records:
            self(record)
        with self._lock:
            self.batches += 1
        committer.mark_batch_finished()

    def __len__(self) -> int:
        with self._lock:
            return len(self.records)

    def positions(self) -> list[int]:
        """The source ``lsn`` of every record (the position, for the synthetic source)."""
        with self._lock:
            return [r.event.lsn for r in self.records  # type: ignore[union-attr,misc]
                    if r.value is not None]
