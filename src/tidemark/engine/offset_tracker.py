"""The contiguous offset tracker: which offset is safe to commit.

Records are numbered in source order as they are handed to workers (``track``) and
completed in any order (``complete``). The committable position is the offset of the
highest record whose predecessors have all completed — never beyond a record still in
flight, so a crash redelivers only records after it (at-least-once). A tracked entry may
stand for several records (a unit of a batch): :meth:`OffsetTracker.complete` says how
many records the committable position passed, so that the engine counts a record as in
flight until then, not merely until it is processed. Records processed after one that is
not are redelivered after a crash too; counting them bounds the redelivered records by
the in-flight limit even while one worker lags behind the others.
"""

from __future__ import annotations

import threading
from typing import Generic, TypeVar

T = TypeVar("T")


class OffsetTracker(Generic[T]):
    """Tracks in-flight records and yields the highest contiguous completed offset.

    Each tracked record carries the source offset to commit once it and everything
    before it are processed (for a database source: the resume position after the
    record's transaction, or None for records that do not move it). Thread-safe:
    workers call :meth:`complete` concurrently.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next_seq = 0  # sequence number of the next tracked record
        self._done_upto = 0  # every record with seq < this has completed
        self._completed: set[int] = set()  # completed records at or after _done_upto
        self._offsets: dict[int, T] = {}  # records that carry an offset, by seq
        self._sizes: dict[int, int] = {}  # records each entry stands for, if not 1
        self._committable: T | None = None
        self._withheld_from: int | None = None  # entries from here on carry no offset

    def track(self, offset: T | None = None, records: int = 1) -> int:
        """Register the next entry (in source order), standing for *records* records;
        returns its sequence number."""
        with self._lock:
            seq = self._next_seq
            self._next_seq += 1
            if offset is not None and self._withheld_from is None:
                self._offsets[seq] = offset
            if records != 1:
                self._sizes[seq] = records
            return seq

    def complete(self, seq: int) -> int:
        """Mark entry *seq* processed; advances the committable offset if contiguous.
        Returns how many records the contiguously completed position passed."""
        with self._lock:
            if seq < self._done_upto or seq >= self._next_seq or seq in self._completed:
                raise ValueError(f"record {seq} is not in flight")
            self._completed.add(seq)
            passed = 0
            sizes = self._sizes
            while self._done_upto in self._completed:
                done = self._done_upto
                self._completed.remove(done)
                offset = self._offsets.pop(done, None)
                if offset is not None:
                    self._committable = offset
                passed += sizes.pop(done, 1)
                self._done_upto = done + 1
            return passed

    def withhold_from(self, seq: int) -> None:
        """Entry *seq* was not processed in full (a consumer stopped part-way): neither
        its offset nor any later entry's is ever committable, so a restart delivers it
        again. Its records and the later ones still complete, to free their places."""
        with self._lock:
            if self._withheld_from is not None and self._withheld_from <= seq:
                return
            self._withheld_from = seq
            for later in [s for s in self._offsets if s >= seq]:
                del self._offsets[later]

    @property
    def committable(self) -> T | None:
        """The offset whose predecessors have all completed (None: nothing yet)."""
        with self._lock:
            return self._committable

    @property
    def in_flight(self) -> int:
        """Records tracked but not yet counted as contiguously complete."""
        with self._lock:
            return self._next_seq - self._done_upto

    def take_committable(self) -> T | None:
        """The committable offset if it changed since the last call, else None."""
        with self._lock:
            offset, self._committable = self._committable, None
            return offset

    def put_back(self, offset: T) -> None:
        """*offset*, taken by :meth:`take_committable`, was not saved after all: it is
        the committable offset again, unless a newer one became committable meanwhile
        (which covers it)."""
        with self._lock:
            if self._committable is None:
                self._committable = offset
