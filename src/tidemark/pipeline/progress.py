"""What a running pipeline reports after each micro-batch, and its one-line rendering."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class BatchReport:
    """One applied micro-batch.

    ``lag_bytes`` is ``pg_current_wal_flush_lsn()`` minus the batch's end offset (WAL the
    pipeline has not read yet, including WAL of tables it does not capture);
    ``lag_seconds`` is the age of the newest commit the batch applied (0 for an empty
    batch: nothing captured was waiting).
    """

    batch_id: int
    changes: dict[str, int]
    """Change rows applied per target table (replayed batches count as 0)."""
    seconds: float
    lag_bytes: int
    lag_seconds: float
    replayed: tuple[str, ...] = ()
    """Tables whose Delta target already held this batch (a replay after a crash)."""
    snapshot: str = ""
    """Progress of a running snapshot (table, chunks), empty when none runs."""
    merges: tuple[tuple[str, str], ...] = ()
    """How each target the batch merged into was merged, as (table, ``copy_on_write`` or
    ``merge_on_read``); replays and snapshot loads are left out."""
    upkeep: tuple[tuple[str, str, str], ...] = ()
    """Upkeep tasks that ran after the batch, as (table, task, what it did): ``("public.a",
    "checkpoint", "checkpoint at version 40 (0.1 s)")``; see :mod:`tidemark.lake.upkeep`."""

    @property
    def total(self) -> int:
        return sum(self.changes.values())

    @property
    def rate(self) -> float:
        """Changes per second of this batch, apply included."""
        return self.total / self.seconds if self.seconds > 0 else 0.0


def format_report(report: BatchReport) -> str:
    """``batch 3: public.orders +120, public.customers +4 | 1,830 changes/s | lag 0 B, 0.4 s
    | merge public.orders merge_on_read, public.customers copy_on_write``"""
    per_table = ", ".join(f"{table} +{count}" for table, count in report.changes.items()
                          if count) or "no changes"
    replay = f" (replayed, skipped: {', '.join(report.replayed)})" if report.replayed else ""
    snapshot = f" | {report.snapshot}" if report.snapshot else ""
    merges = (" | merge " + ", ".join(f"{table} {how}" for table, how in report.merges)
              if report.merges else "")
    upkeep = (" | upkeep " + "; ".join(f"{table}: {text}" for table, _, text in report.upkeep)
              if report.upkeep else "")
    return (f"batch {report.batch_id}: {per_table}{replay} | {report.rate:,.0f} changes/s | "
            f"lag {_bytes(report.lag_bytes)}, {report.lag_seconds:.1f} s{merges}{snapshot}{upkeep}")


def _bytes(count: int) -> str:
    size = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(size) < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{count} B"  # pragma: no cover - the loop always returns
