"""Prometheus metrics, scraped from the endpoint while capture and the engine run
(Debezium's names: existing Debezium dashboards read them). The pipeline's metrics are
scraped in tests/test_pipeline_run.py."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import Database
from pipeline_helpers import samples, scrape, value
from tidemark.engine.engine import Engine
from tidemark.source.postgres.task import PostgresConnector
from tidemark.testing.local_server import free_port
from tidemark.testing.sink import MemorySink

pytestmark = pytest.mark.integration


def wait_until(condition: object, what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_engine_metrics_count_what_the_engine_saw(db: Database) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text)",
               "INSERT INTO t SELECT g, 'x' FROM generate_series(1, 5) g")
    sink = MemorySink()
    engine = Engine(PostgresConnector({"dsn": db.dsn, "table_include_list": ["public.t"],
                                             "slot_name": f"s_{db.name}"}),
                    sink, config={"metrics_port": 0, "max_in_flight": 500})
    runner = threading.Thread(target=engine.run)
    runner.start()
    try:
        wait_until(lambda: len(sink.records) >= 5, "the snapshot")
        db.execute("INSERT INTO t SELECT g, 'y' FROM generate_series(6, 8) g")
        db.execute("UPDATE t SET v = 'z' WHERE id = 1")
        wait_until(lambda: len(sink.records) >= 9, "the streamed changes")
        port = engine.metrics_port
        assert port
        text = scrape(port)
        labels = {"context": "streaming", "plugin": "postgres"}
        wait_until(lambda: value(scrape(port), "debezium_metrics_TotalNumberOfEventsSeen",
                                 **labels) == 9, "9 events seen")
        assert value(text, "debezium_metrics_RowsScanned", context="snapshot",
                     table="public.t") == 5
        assert value(text, "debezium_metrics_SnapshotCompleted", context="snapshot") == 1
        assert value(text, "debezium_metrics_Connected", **labels) == 1
        assert value(text, "debezium_metrics_QueueTotalCapacity", **labels) == 500
        assert 0 <= value(text, "debezium_metrics_QueueRemainingCapacity", **labels) <= 500
        text = scrape(port)
        assert value(text, "debezium_metrics_NumberOfCommittedTransactions", **labels) == 2
        assert 0 <= value(text, "debezium_metrics_MilliSecondsBehindSource", **labels) < 60_000
    finally:
        engine.close()
        runner.join(60)
    with pytest.raises(OSError):
        scrape(port)  # the endpoint goes with the engine


def test_capture_serves_metrics_while_it_runs(db: Database, tmp_path: Path) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY)", "INSERT INTO t VALUES (1), (2)")
    port = free_port()
    out = (tmp_path / "out.jsonl").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tidemark", "capture", "--table", "public.t",
         "--slot", f"s_{db.name}", "--metrics-port", str(port)],
        stdout=out, stderr=subprocess.PIPE, env={**os.environ, "TIDEMARK_DSN": db.dsn})
    try:
        def events_seen() -> float:
            try:
                text = scrape(port)
            except OSError:
                return -1  # not listening yet
            # The endpoint listens before the source's task starts, and has no samples
            # until it does.
            found = samples(text, "debezium_metrics_TotalNumberOfEventsSeen",
                            context="streaming")
            assert len(found) <= 1, text
            return found[0] if found else -1
        wait_until(lambda: events_seen() == 2, "the snapshot's 2 rows")
        db.execute("INSERT INTO t VALUES (3)")
        wait_until(lambda: events_seen() == 3, "the streamed insert")
        text = scrape(port)
        assert value(text, "debezium_metrics_RowsScanned", table="public.t") == 2
        assert value(text, "debezium_metrics_Connected", context="streaming") == 1
    finally:
        proc.terminate()
        assert proc.wait(30) == 0, proc.stderr.read() if proc.stderr else ""
        out.close()
