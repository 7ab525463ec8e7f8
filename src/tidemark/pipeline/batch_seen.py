"""What a micro-batch's change rows held, counted as they pass on to Delta."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import pyarrow as pa
import pyarrow.compute as pc


class BatchSeen:
    """Rows per table, the transactions (commit positions) and the newest commit time
    of the change rows counted; picklable, so the executors' tasks count theirs and the
    driver merges them (:meth:`merge`)."""

    def __init__(self) -> None:
        self.rows: dict[str, int] = {}
        self.commits: set[int] = set()
        self.newest_commit_us: int | None = None
        """Microseconds since the epoch (the column's unit), None for an empty batch."""

    def last_commit(self, position: Callable[[int], str]) -> str:
        """The newest commit position seen, as *position* writes it."""
        return position(max(self.commits)) if self.commits else "none"

    def merge(self, other: BatchSeen) -> None:
        """Add what *other* counted."""
        for table, rows in other.rows.items():
            self.rows[table] = self.rows.get(table, 0) + rows
        self.commits |= other.commits
        self._newest(other.newest_commit_us)

    def count(self, table: str, pieces: Iterable[pa.Table]) -> Iterator[pa.Table]:
        """*pieces* of *table*'s change rows, counted as they are read."""
        for piece in pieces:
            if piece.num_rows:
                self.rows[table] = self.rows.get(table, 0) + piece.num_rows
                self.commits.update(pc.unique(piece.column("_commit_lsn")).to_pylist())
                self._newest(pc.max(piece.column("_commit_ts")).value)
            yield piece

    def _newest(self, commit_us: int | None) -> None:
        if commit_us is not None and (self.newest_commit_us is None
                                      or commit_us > self.newest_commit_us):
            self.newest_commit_us = commit_us
