"""Prometheus metrics of a running pipeline (``[metrics] port`` in pipeline.toml).

Debezium's streaming names where they mean the same (see :mod:`tidemark.metrics`),
``tidemark_pipeline_…`` for what is the pipeline's own (batches, WAL lag in bytes).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from tidemark.pipeline.progress import BatchReport
from tidemark.pipeline.verify_metrics import verify_families

_LABELS = ["context", "plugin", "name"]


class RunMetrics:
    """Totals of the batches applied so far, turned into metrics at each scrape."""

    def __init__(self, name: str, plugin: str = "postgres",
                 checkpoint: str | os.PathLike[str] | None = None) -> None:
        self.name = name
        self.plugin = plugin
        """The source kind's name (Debezium's ``plugin`` label)."""
        self.checkpoint = checkpoint
        """Where the last verify's record is read (None: no verify metrics)."""
        self._lock = threading.Lock()
        self._changes: dict[str, int] = {}
        self._transactions = 0
        self._batches = 0
        self._last: BatchReport | None = None
        self._last_at: float | None = None

    def observe(self, report: BatchReport, transactions: int) -> None:
        """One applied batch holding *transactions* source transactions."""
        with self._lock:
            for table, count in report.changes.items():
                self._changes[table] = self._changes.get(table, 0) + count
            self._transactions += transactions
            self._batches += 1
            self._last = report
            self._last_at = time.time()

    def families(self) -> Iterator[Metric]:
        with self._lock:
            changes = dict(self._changes)
            transactions, batches, last, last_at = (self._transactions, self._batches,
                                                    self._last, self._last_at)
        labels = ["streaming", self.plugin, self.name]

        def gauge(name: str, doc: str, value: float) -> Metric:
            family = GaugeMetricFamily(name, doc, labels=_LABELS)
            family.add_metric(labels, value)
            return family

        yield gauge("debezium_metrics_TotalNumberOfEventsSeen",
                    "Change rows applied to Delta.", sum(changes.values()))
        yield gauge("debezium_metrics_NumberOfCommittedTransactions",
                    "Source transactions applied to Delta.", transactions)
        yield gauge("debezium_metrics_MilliSecondsBehindSource",
                    "Age of the newest commit in the last batch when it was applied "
                    "(-1 before the first batch).",
                    -1.0 if last is None else last.lag_seconds * 1000)
        if last_at is not None:
            yield gauge("debezium_metrics_MilliSecondsSinceLastEvent",
                        "Time since the last batch was applied.",
                        max(0.0, (time.time() - last_at) * 1000))
        per_table = GaugeMetricFamily("tidemark_pipeline_changes",
                                      "Change rows applied, per target table.",
                                      labels=[*_LABELS, "table"])
        for table, count in sorted(changes.items()):
            per_table.add_metric([*labels, table], count)
        yield per_table
        yield gauge("tidemark_pipeline_batches", "Micro-batches applied.", batches)
        if last is not None:
            yield gauge("tidemark_pipeline_last_batch_id", "The last applied batch's id.",
                        last.batch_id)
            yield gauge("tidemark_pipeline_last_batch_seconds",
                        "How long the last batch took, apply included.", last.seconds)
            yield gauge("tidemark_pipeline_lag_bytes",
                        "WAL flushed by the server after the last batch's end.",
                        last.lag_bytes)
        if self.checkpoint is not None:
            yield from verify_families(self.checkpoint, _LABELS, labels)
