"""``tidemark run`` on a Spark standalone cluster (a master and two one-core workers, each
its own JVM, from the pyspark wheel), not ``local[N]``: the executors decode and merge
into Delta (``apply_on = "executors"``) in their own JVMs and Python workers, and a
worker killed mid-run costs nothing."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from conftest import Database
from pipeline_helpers import (
    _assert_equal_to_source,
    _lake_equals,
    _pipeline_file,
    _prepare,
    _tidemark_run,
    _wait_for_batches,
    _Writer,
)
from tidemark.testing.spark_cluster import SparkStandaloneCluster
from waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _executor_dirs(cluster: SparkStandaloneCluster, index: int) -> list[Path]:
    """The executors worker *index* ran (``<work dir>/<app id>/<executor id>``)."""
    return [d for app in cluster.worker_dir(index).glob("app-*") for d in app.iterdir()]


def test_tidemark_run_on_a_standalone_cluster_goes_on_when_a_worker_is_killed(
        db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db.execute("CREATE TABLE a (id int PRIMARY KEY, v text, n numeric(10, 2))",
               "CREATE TABLE b (id int PRIMARY KEY, v text)")
    source = _prepare(db, "a", "b") + "maxChangesPerTrigger = 200\n"
    monkeypatch.setenv("TIDEMARK_DSN", db.dsn)
    with SparkStandaloneCluster(tmp_path / "spark", workers=2, cores=1) as cluster:
        spark = (f'master = "{cluster.master_url}"\ntrigger_interval_ms = 200\n'
                 'apply_on = "executors"\n'
                 'conf = { "spark.driver.host" = "127.0.0.1", '
                 '"spark.executor.memory" = "1g" }')
        config = _pipeline_file(tmp_path, source, spark, changelog=False)
        db.execute("INSERT INTO a VALUES (1, 'first', 1)", "INSERT INTO b VALUES (1, 'first')")
        log = tmp_path / "run.log"
        writer = _Writer(db.dsn, 11, limit=None)
        proc = _tidemark_run(config, log, log_level="DEBUG")
        try:
            _wait_for_batches(log, 1, proc)
            # Each worker runs an executor of the pipeline: the work is in their JVMs.
            assert _executor_dirs(cluster, 0) and _executor_dirs(cluster, 1)
            writer.start()
            wait_for(lambda: writer.committed >= 150, 60, "writes")
            cluster.kill_worker(0)  # mid-run, with batches in flight
            cluster.wait_for_workers(1, timeout_s=120)
            killed_at = writer.committed
            wait_for(lambda: writer.committed >= killed_at + 150, 60, "writes after the kill")
            writer.finish()

            def caught_up() -> bool:
                assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
                return _lake_equals(db, tmp_path)
            try:
                # Every poll compares both tables with PostgreSQL: not too often.
                wait_for(caught_up, 180, "Delta to equal the source", interval_s=0.5)
            except AssertionError as err:
                raise AssertionError(f"{err}:\n{log.read_text(errors='replace')[-3000:]}") \
                    from None
            assert proc.poll() is None, "the pipeline stopped when a worker was lost"
            text = log.read_text(errors="replace")
            # The batches were applied by the executors' tasks, not on the driver.
            assert "s: plan " in text and ", executors " in text
            assert "s: read " not in text
        finally:
            writer.finish()
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(120)
    _assert_equal_to_source(db, tmp_path)
