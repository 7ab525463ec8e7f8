"""Benchmark: the tidemark Spark source at ``local[1]`` and ``local[2]``, same WAL, same run.

Builds the shared workload (table ``t10``, 300,000 changes in transactions of 100) in a
private PostgreSQL after creating one logical slot, copies that slot once per run
(``pg_copy_logical_replication_slot``) so every run reads exactly the same changes, and
measures:

* the baseline: ``pg_logical_slot_peek_binary_changes`` fetched with a psycopg 3 binary
  cursor, no decoding (what any SQL-interface reader pays before decoding);
* the typed stream of ``t10`` into Spark's ``noop`` sink with ``Trigger.AvailableNow``,
  at ``local[1]`` and ``local[2]`` (``numPartitions`` = Spark's default parallelism),
  each in its own process; the time is from ``start()`` to the end of the query (Spark's
  own start-up excluded, reported separately);
* peak RSS of each Spark run's process tree (driver Python + JVM + Python workers).

Usage: ``uv run python benchmarks/bench_spark_source.py [--transactions 3000] [--runs 2]``
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
from pyspark.sql import SparkSession

sys.path.insert(0, str(Path(__file__).parent))

import workload

import tidemark.spark as ts
from tidemark.spark import wal
from tidemark.testing.postgres import PostgresCluster

PUBLICATION = "bench_pub"
BASE_SLOT = "bench_base"

log = logging.getLogger("bench_spark_source")


def _copy_slot(dsn: str, name: str) -> None:
    with wal.connect(dsn, purpose="bench") as conn:
        conn.execute("SELECT pg_copy_logical_replication_slot(%s, %s)", (BASE_SLOT, name))


def _raw_peek(dsn: str, slot: str) -> tuple[float, int]:
    """Seconds and rows for fetching the slot's whole content without decoding."""
    with wal.connect(dsn, purpose="bench") as conn:
        flush = wal.flush_lsn(conn)
        started = time.perf_counter()
        rows = sum(len(chunk) for chunk in wal.peek(conn, slot, PUBLICATION, flush))
        return time.perf_counter() - started, rows


class _PeakRss:
    """Samples the summed RSS of a process tree every 100 ms."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(self.pid)
            while not self._stop.wait(0.1):
                total = 0
                for proc in [root, *root.children(recursive=True)]:
                    with contextlib.suppress(psutil.Error):
                        total += proc.memory_info().rss
                self.peak = max(self.peak, total)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def _spark_run(master: str, dsn: str, slot: str) -> dict[str, float]:
    """One measured run (in a child process): returns rows, seconds, startup seconds."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    started = time.perf_counter()
    spark = (SparkSession.builder.master(master).config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    stream = ts.read_table(spark, dsn=dsn, table="public.t10", slot=slot,
                           publication=PUBLICATION)
    startup = time.perf_counter() - started
    with tempfile.TemporaryDirectory() as checkpoint:
        started = time.perf_counter()
        query = (stream.writeStream.format("noop").option("checkpointLocation", checkpoint)
                 .trigger(availableNow=True).start())
        query.awaitTermination()
        elapsed = time.perf_counter() - started
        rows = sum(int(p["numInputRows"]) for p in query.recentProgress)
        batches = len(query.recentProgress)
    spark.stop()
    return {"rows": rows, "seconds": elapsed, "startup": startup, "batches": batches}


def _measure(master: str, dsn: str, slot: str) -> tuple[dict[str, float], int]:
    proc = subprocess.Popen(
        [sys.executable, __file__, "--child", master, "--dsn-env", "--slot", slot],
        env={**os.environ, "BENCH_DSN": dsn}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    sampler = _PeakRss(proc.pid)
    out, err = proc.communicate()
    peak = sampler.stop()
    if proc.returncode != 0:
        raise SystemExit(f"run {master} failed:\n{err.decode(errors='replace')[-4000:]}")
    return json.loads(out.decode().strip().splitlines()[-1]), peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--transactions", type=int, default=3000,
                        help="transactions of 100 changes (default 3000 = 300k changes)")
    parser.add_argument("--runs", type=int, default=2, help="measurements per contender")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--dsn-env", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--slot", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        result = _spark_run(args.child, os.environ["BENCH_DSN"], args.slot)
        print(json.dumps(result))
        return

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with PostgresCluster() as cluster:
        dsn = cluster.create_database("bench")
        workload.create_table(dsn)
        with wal.connect(dsn, purpose="bench") as conn:
            conn.execute(f"CREATE PUBLICATION {PUBLICATION} FOR TABLE t10")
            wal.ensure_slot(conn, BASE_SLOT)
        started = time.perf_counter()
        changes = workload.run_workload(dsn, args.transactions)
        log.info("workload: %d changes in %.1f s", changes, time.perf_counter() - started)

        results: dict[str, list[float]] = {"peek": [], "local[1]": [], "local[2]": []}
        peaks: dict[str, int] = {}
        for run in range(args.runs):
            name = f"peek_{run}"
            _copy_slot(dsn, name)
            seconds, rows = _raw_peek(dsn, name)
            results["peek"].append(rows / seconds)
            log.info("raw peek fetch: %d messages in %.2f s = %.0f/s", rows, seconds,
                     rows / seconds)
            for master in ("local[1]", "local[2]"):
                slot = f"run_{master[6]}_{run}"
                _copy_slot(dsn, slot)
                result, peak = _measure(master, dsn, slot)
                if result["rows"] != changes:
                    raise SystemExit(f"{master} read {result['rows']} rows, expected {changes}")
                rate = result["rows"] / result["seconds"]
                results[master].append(rate)
                peaks[master] = max(peaks.get(master, 0), peak)
                log.info("%s: %d changes in %.2f s = %.0f changes/s (%d batches; Spark start "
                         "%.1f s; peak RSS %.0f MB)", master, result["rows"], result["seconds"],
                         rate, result["batches"], result["startup"], peak / 2**20)

    def fmt(rates: list[float]) -> str:
        return f"{statistics.median(rates):,.0f}/s (runs: {', '.join(f'{r:,.0f}' for r in rates)})"

    print(f"raw peek fetch, no decoding: {fmt(results['peek'])} messages")
    print(f"tidemark source local[1]:    {fmt(results['local[1]'])} changes, "
          f"peak RSS {peaks['local[1]'] / 2**20:.0f} MB")
    print(f"tidemark source local[2]:    {fmt(results['local[2]'])} changes, "
          f"peak RSS {peaks['local[2]'] / 2**20:.0f} MB")
    ratio = statistics.median(results["local[2]"]) / statistics.median(results["local[1]"])
    print(f"local[2] / local[1]: {ratio:.2f}x")


if __name__ == "__main__":
    main()
