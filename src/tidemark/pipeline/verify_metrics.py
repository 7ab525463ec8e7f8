"""The last ``tidemark verify``'s metrics, exported by a running pipeline's endpoint.

Read from ``<checkpoint>/verify.json`` (:mod:`tidemark.status.verify_record`) at each
scrape, so a verify run in another process shows up at the next scrape; a pipeline
never verified exports neither metric.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence

from prometheus_client.core import GaugeMetricFamily, Metric

from tidemark.status.verify_record import read_record


def verify_families(checkpoint: str | os.PathLike[str],
                    labels: Sequence[str], values: Sequence[str]) -> Iterator[Metric]:
    """``tidemark_verify_rows_different`` per table and
    ``tidemark_verify_last_run_timestamp_seconds`` of *checkpoint*'s last verify, with
    the pipeline's *labels* set to *values*."""
    record = read_record(checkpoint)
    if record is None:
        return
    different = GaugeMetricFamily(
        "tidemark_verify_rows_different",
        "Rows the last tidemark verify found missing, extra or different, per target "
        "table.", labels=[*labels, "table"])
    for table in record.get("tables") or ():
        if not isinstance(table, dict):
            continue
        count = table.get("rows_different")
        if isinstance(count, int) and not isinstance(count, bool):
            different.add_metric([*values, str(table.get("table"))], count)
    yield different
    started = record.get("started_at")
    if isinstance(started, (int, float)) and not isinstance(started, bool):
        last = GaugeMetricFamily("tidemark_verify_last_run_timestamp_seconds",
                                 "When the last tidemark verify started (Unix time).",
                                 labels=list(labels))
        last.add_metric(list(values), float(started))
        yield last
