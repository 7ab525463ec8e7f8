"""Prometheus metrics of ``tidemark capture``, the engine and ``tidemark run``.

Named as Debezium's metrics appear in Prometheus through the JMX exporter that
Debezium's own images and dashboards use — ``debezium_metrics_<MBean attribute>`` with
the labels ``context`` (``streaming`` or ``snapshot``), ``plugin`` and ``name`` — so
existing Debezium dashboards and alerts read tidemark unchanged. What Debezium has no
name for is ``tidemark_…``.

Values are read when Prometheus scrapes (custom collectors over the components' own
counters), so the capture and apply loops pay nothing per event for them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tidemark.errors import ConfigError

log = logging.getLogger(__name__)

#: The prefix of Debezium's metric names and their labels.
DEBEZIUM = "debezium_metrics_"
LABELS = ("context", "plugin", "name")


def gauge(name: str, doc: str, labels: Iterable[str] = LABELS) -> GaugeMetricFamily:
    """A gauge family, labelled as Debezium's by default."""
    return GaugeMetricFamily(name, doc, labels=list(labels))


class QueueState(Protocol):
    """What the engine's metrics read of one task's bounded in-flight queue."""

    @property
    def in_flight(self) -> int: ...

    @property
    def limit(self) -> int: ...


def queue_metrics(queues: Iterable[tuple[str, QueueState]], *, name: str,
                  plugin: str) -> Iterator[Metric]:
    """QueueTotalCapacity and QueueRemainingCapacity of the engine's tasks."""
    total = gauge(DEBEZIUM + "QueueTotalCapacity", "Records a task may have in flight.",
                   (*LABELS, "task"))
    remaining = gauge(DEBEZIUM + "QueueRemainingCapacity",
                       "Records a task may still take before its reader waits.",
                       (*LABELS, "task"))
    for task, queue in queues:
        labels = ["streaming", plugin, name, task]
        total.add_metric(labels, queue.limit)
        remaining.add_metric(labels, max(0, queue.limit - queue.in_flight))
    yield total
    yield remaining


class FunctionCollector(Collector):
    """A collector whose metrics a function makes at each scrape."""

    def __init__(self, make: Callable[[], Iterable[Metric]]) -> None:
        self._make = make

    def collect(self) -> Iterable[Metric]:
        try:
            return list(self._make())
        except Exception as err:  # a scrape must never break the component
            log.warning("metrics could not be collected: %s", err)
            return []


class MetricsServer:
    """An HTTP endpoint (``/metrics``) serving the given collectors."""

    def __init__(self, port: int, *collectors: Collector, addr: str = "0.0.0.0") -> None:
        if not 0 <= port <= 65535:
            raise ConfigError("metrics_port", f"must be a TCP port (1-65535, 0 = any free "
                                              f"one), got {port}")
        self.registry = CollectorRegistry(auto_describe=False)
        for collector in collectors:
            self.registry.register(collector)
        try:
            self._server, self._thread = start_http_server(port, addr=addr,
                                                           registry=self.registry)
        except OSError as err:
            raise ConfigError("metrics_port", f"cannot listen on {addr}:{port}: "
                                              f"{err.strerror or err}") from None
        self.port = int(self._server.server_port)
        log.info("metrics on http://%s:%d/metrics", addr, self.port)

    def close(self) -> None:
        """Stop serving."""
        self._server.shutdown()
        self._server.server_close()
        if isinstance(self._thread, threading.Thread):
            self._thread.join(5)


def serve(port: int, make: Callable[[], Iterable[Metric]], **kwargs: Any) -> MetricsServer:
    """Serve the metrics *make* returns at each scrape on *port* (0: any free port)."""
    return MetricsServer(port, FunctionCollector(make), **kwargs)
