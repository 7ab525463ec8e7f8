"""A capture's figures (:class:`CaptureStats`) as Debezium's streaming and snapshot
metrics, for :mod:`tidemark.metrics`' endpoint (``tidemark capture`` and the engine).

Imported only where metrics are served: it pulls in ``prometheus_client``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping

from prometheus_client.core import Metric

from tidemark.metrics import DEBEZIUM, LABELS, gauge
from tidemark.source.capture_stats import CaptureStats


def capture_metrics(stats: CaptureStats, *, name: str, plugin: str = "postgres",
                    extra: Mapping[str, str] | None = None) -> Iterator[Metric]:
    """Debezium's streaming and snapshot metrics of one capture."""
    extra = dict(extra or {})
    keys = (*LABELS, *extra)
    streaming = ["streaming", plugin, name, *extra.values()]
    snapshot = ["snapshot", plugin, name, *extra.values()]

    def one(metric: str, doc: str, labels: list[str], value: float) -> Metric:
        family = gauge(DEBEZIUM + metric, doc, keys)
        family.add_metric(labels, value)
        return family

    yield one("TotalNumberOfEventsSeen", "Change events handed on.", streaming,
              stats.events_seen)
    yield one("NumberOfCommittedTransactions", "Transactions whose commit was processed.",
              streaming, stats.transactions_committed)
    yield one("Connected", "1 while the replication stream is open.", streaming,
              1.0 if stats.connected else 0.0)
    behind = stats.millis_behind_source
    yield one("MilliSecondsBehindSource", "Age of the newest event's commit when it was "
              "handed on (-1 before the first event).", streaming,
              -1.0 if behind is None else behind)
    since = stats.last_event_at
    if since is not None:
        yield one("MilliSecondsSinceLastEvent", "Time since the newest event was handed on.",
                  streaming, max(0.0, (time.time() - since) * 1000))
    yield one("SourceEventPosition", "The newest offset handed on (LSN as a number).",
              streaming, stats.position_lsn)
    yield one("SnapshotRunning", "1 while the initial snapshot runs.", snapshot,
              1.0 if stats.snapshot_running else 0.0)
    yield one("SnapshotCompleted", "1 once the initial snapshot finished.", snapshot,
              1.0 if stats.snapshot_completed else 0.0)
    rows = gauge(DEBEZIUM + "RowsScanned", "Snapshot rows read, per table.",
                  (*keys, "table"))
    for table, count in sorted(stats.rows_scanned.items()):
        rows.add_metric([*snapshot, table], count)
    yield rows
