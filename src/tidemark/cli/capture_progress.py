"""``tidemark capture``'s progress line: what a capture has written, how fast, and how far
it is behind, on stderr every ``--progress-interval-s`` while it runs (stdout carries
only the events)."""

from __future__ import annotations

import time
from collections.abc import Callable

from tidemark.source.capture_stats import CaptureStats

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


class CaptureProgress:
    """Writes one progress line per *interval_s* (0: never) through *write*, of the
    figures *stats* gives (None: the capture has not started).

    *wal_behind*, for PostgreSQL, gives the bytes of WAL between the server's insert
    position and the capture's; *position* renders ``stats.position_lsn``. A failing
    *wal_behind* leaves the lag out of that line, never stops the capture.
    """

    def __init__(self, stats: Callable[[], CaptureStats | None], interval_s: float,
                 write: Callable[[str], None], *, wal_behind: Callable[[], int] | None = None,
                 position: Callable[[int], str] | None = None) -> None:
        self._stats = stats
        self._interval_s = interval_s
        self._write = write
        self._wal_behind = wal_behind
        self._position = position
        self._last_at = time.monotonic()
        self._last_written = 0

    def maybe_report(self, written: int) -> None:
        """Report if an interval has passed; *written* is the change events written so far."""
        if self._interval_s <= 0:
            return
        now = time.monotonic()
        if now - self._last_at < self._interval_s:
            return
        self._write(self.line(written, now))

    def line(self, written: int, now: float) -> str:
        """The progress line (and the start of the next interval)."""
        stats = self._stats() or CaptureStats()
        span = now - self._last_at
        rate = (written - self._last_written) / span if span > 0 else 0.0
        self._last_at, self._last_written = now, written
        parts = [f"capture: {written:,} change events written, {rate:,.0f}/s over the "
                 f"last {span:.1f} s"]
        if stats.snapshot_running:
            parts.append(f"snapshot running, {sum(stats.rows_scanned.values()):,} rows read")
        if self._position is not None and stats.position_lsn:
            where = f"at {self._position(stats.position_lsn)}"
            if not stats.connected:
                where += " (reconnecting to the server)"
            elif self._wal_behind is not None:
                try:
                    behind = self._wal_behind()
                except Exception as err:  # the lag is for show: capture goes on
                    where += f" (WAL lag unknown: {str(err).strip().splitlines()[0]})"
                else:
                    where += f", {_size(max(behind, 0))} of WAL behind the server"
            parts.append(where)
        behind_ms = stats.millis_behind_source
        if behind_ms is not None:
            parts.append(f"newest event read {behind_ms / 1000:,.1f} s after its commit")
        return "; ".join(parts)


def _size(count: int) -> str:
    """*count* bytes in the largest unit that keeps the number at 1 or more."""
    value, unit = float(count), 0
    while value >= 1024 and unit < len(_UNITS) - 1:
        value, unit = value / 1024, unit + 1
    return f"{count} B" if unit == 0 else f"{value:,.1f} {_UNITS[unit]}"
