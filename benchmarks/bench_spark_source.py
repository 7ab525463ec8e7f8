"""Benchmark: the tidemark Spark source and ``tidemark run`` into Delta, at ``local[1]`` and
``local[2]``, against ``tidemark capture`` on the same WAL in the same run.

Builds the shared workload (table ``t10``, 300,000 changes in transactions of 100) in a
private PostgreSQL after creating one logical slot, and copies that slot for every
contender (``pg_copy_logical_replication_slot``) so each reads exactly the same
changes. Measured:

* the baseline: ``tidemark capture --stop-at-end`` (Debezium JSON lines to /dev/null);
* per master, in its own process (a fresh SparkSession):

  - **noop**: the typed stream of ``t10`` into Spark's ``noop`` sink;
  - **delta**: the pipeline of ``tidemark run`` (envelope stream, ``apply_changes``
    SCD1 into a Delta table with delta-rs), checked against PostgreSQL afterwards;
    ``--batches`` + 1 times, each into a new table from its own slot copy: the first
    full-size batch of a process is reported apart (it still pays for the JIT
    compilation of Spark's large-batch code), the figure is the median of the others;
  - **delta 100k**: the same with ``maxChangesPerTrigger = 100000`` (four batches);
  - **empty batch**: the time of a batch that holds no captured change;
  - **trivial query**: a query of a one-row Python source into ``foreachBatch``:
    Spark's own cost of starting and ending a streaming query, which every one-shot
    figure above includes;

  all with ``Trigger.AvailableNow``, timed from ``start()`` to the end of the query,
  and for noop and delta also by Spark's own batch time (``triggerExecution``, for delta
  plus the slot advance of the last batch): what a running pipeline spends on these
  changes, without the query's start and end.
  Each process first runs the same pipeline once on a small warm-up table, as a
  long-running pipeline is warm (JIT, Python workers); the time of Spark's start and of
  the cold first query are printed too;
* peak memory of each Spark process: the driver's RSS (Python driver and JVM) and the
  PSS of the whole tree (with the Python workers).

Usage: ``uv run python benchmarks/bench_spark_source.py [--transactions 3000] [--runs 2]
[--batches 2]``
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

sys.path.insert(0, str(Path(__file__).parent))

import workload

import tidemark.spark as ts
from tidemark.pipeline.compare import compare
from tidemark.pipeline.config import parse_config
from tidemark.pipeline.runner import Pipeline, build_session
from tidemark.source.postgres import wal_reads as wal
from tidemark.source.postgres.stream_offsets import from_offset
from tidemark.testing.postgres import PostgresCluster

PUBLICATION = "bench_pub"
WARM_PUBLICATION = "bench_warm"
BASE_SLOT = "bench_base"
WARM_SLOT = "bench_warm"
WARM_TRANSACTIONS = 50

log = logging.getLogger("bench_spark_source")


def _copy_slot(dsn: str, source: str, name: str) -> None:
    with wal.connect(dsn, purpose="bench") as conn:
        conn.execute("SELECT pg_copy_logical_replication_slot(%s, %s)", (source, name))


def _drop_slots(dsn: str, names: list[str]) -> None:
    """Drop a contender's slot copies once it is done (the server has few slots)."""
    with wal.connect(dsn, purpose="bench") as conn:
        for name in names:
            conn.execute("SELECT pg_drop_replication_slot(%s)", (name,))


class _PeakMemory:
    """Samples a Spark process tree every 200 ms: the driver's RSS (the Python driver and
    its JVM) and the whole tree's PSS (driver, JVM, Python workers). PSS, not RSS, for the
    tree: the workers are forked from one daemon and share most of their pages, which a
    sum of RSS would count once per process."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.driver = 0
        self.tree = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(self.pid)
            while not self._stop.wait(0.2):
                driver = tree = 0
                for proc in [root, *root.children(recursive=True)]:
                    with contextlib.suppress(psutil.Error):
                        info = proc.memory_full_info()
                        tree += info.pss
                        if proc.pid == root.pid or proc.name() == "java":
                            driver += info.rss
                self.driver = max(self.driver, driver)
                self.tree = max(self.tree, tree)

    def stop(self) -> tuple[int, int]:
        self._stop.set()
        self._thread.join()
        return self.driver, self.tree


# -- the child: one master, one SparkSession --------------------------------------------
def _pipeline_config(dsn: str, table: str, slot: str, publication: str, base: Path,
                     max_changes: int | None = None) -> Any:
    source: dict[str, Any] = {"dsn": dsn, "slot": slot, "publication": publication,
                              "tables": [table]}
    if max_changes is not None:
        source["maxChangesPerTrigger"] = max_changes
    raw = {"source": source,
           "spark": {"master": os.environ["BENCH_MASTER"], "checkpoint": "checkpoint",
                     "available_now": True, "app_name": "bench"},
           "targets": {table: {"path": "lake", "keys": ["id"]}}}
    return parse_config(raw, base=base, environ={})


def _run_pipeline(spark: Any, config: Any) -> tuple[float, list[dict[str, Any]], int]:
    """Seconds from start to end, Spark's progress reports, changes applied."""
    reports: list[Any] = []
    started = time.perf_counter()
    query = Pipeline(config, spark=spark, on_batch=reports.append).start()
    query.awaitTermination()
    return (time.perf_counter() - started, list(query.recentProgress),
            sum(r.total for r in reports))


class _OneRowReader(DataSourceStreamReader):
    """A stream of one row in one batch: what any Python streaming source costs."""

    def initialOffset(self) -> dict[str, int]:  # noqa: N802 - pyspark API name
        return {"offset": 0}

    def latestOffset(self) -> dict[str, int]:  # noqa: N802 - pyspark API name
        return {"offset": 1}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        return [InputPartition(0)]

    def read(self, partition: InputPartition) -> Iterator[tuple[int]]:
        yield (1,)


class _OneRowSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "bench_one_row"

    def schema(self) -> str:
        return "x int"

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:  # noqa: N802 - pyspark API name
        return _OneRowReader()


def _spark_floor(spark: Any, checkpoint: Path) -> float:
    """Seconds of an AvailableNow query of a trivial Python source into foreachBatch
    (collecting its one row): Spark's own cost of starting and ending a query."""
    spark.dataSource.register(_OneRowSource)
    started = time.perf_counter()
    query = (spark.readStream.format("bench_one_row").load().writeStream
             .foreachBatch(lambda batch, _: batch.collect())
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    query.awaitTermination()
    return time.perf_counter() - started


def _advance_seconds(dsn: str, slot: str, config: Any) -> float:
    """Seconds to advance *slot* to the end of the query's last batch (the source's
    ``commit``), read from the checkpoint's offset log."""
    offsets = Path(config.checkpoint) / "offsets"
    last = max(int(f.name) for f in offsets.iterdir() if f.name.isdigit())
    end = from_offset(json.loads((offsets / str(last)).read_text().splitlines()[-1]))
    with wal.connect(dsn, purpose="bench") as conn:
        started = time.perf_counter()
        wal.advance_slot(conn, slot, end)
        return time.perf_counter() - started


def _child(master: str, dsn: str, slots: dict[str, Any]) -> dict[str, float]:
    os.environ["BENCH_MASTER"] = master
    results: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        started = time.perf_counter()
        warm_config = _pipeline_config(dsn, "public.t_warm", slots["warm"], WARM_PUBLICATION,
                                       root / "warm")
        spark = build_session(warm_config)
        spark.conf.set("spark.sql.shuffle.partitions", "2")
        results["startup"] = time.perf_counter() - started
        results["cold"], _, _ = _run_pipeline(spark, warm_config)
        _spark_floor(spark, root / "floor_warm")
        results["floor"] = _spark_floor(spark, root / "floor")

        stream = ts.read_table(spark, dsn=dsn, table="public.t10", slot=slots["noop"],
                               publication=PUBLICATION)
        started = time.perf_counter()
        query = (stream.writeStream.format("noop")
                 .option("checkpointLocation", str(root / "noop"))
                 .trigger(availableNow=True).start())
        query.awaitTermination()
        results["noop_seconds"] = time.perf_counter() - started
        results["noop_rows"] = sum(int(p["numInputRows"]) for p in query.recentProgress)
        results["noop_batch_seconds"] = sum(p["durationMs"]["triggerExecution"]
                                            for p in query.recentProgress) / 1000

        # The first full-size batch of a process still pays for compiling Spark's
        # code for large batches (C2 JIT threads took 0.4-1.2 s of CPU in it, on a core
        # the decoders need): it is reported apart, as "first", and the pipeline's
        # steady figure is the median of the batches after it.
        batch_seconds: list[float] = []
        one_shot: list[float] = []
        counts: set[int] = set()
        for i, slot in enumerate(slots["delta"]):
            config = _pipeline_config(dsn, "public.t10", slot, PUBLICATION,
                                      root / f"delta_{i}")
            seconds, progress, rows = _run_pipeline(spark, config)
            counts.add(rows)
            # Spark's own time for the batches, without the query's start and end, plus
            # the source's commit of the last batch (the slot advance), which a running
            # pipeline does at its next trigger and an AvailableNow query leaves to its
            # next start.
            batch_seconds.append(sum(p["durationMs"]["triggerExecution"] for p in progress)
                                 / 1000 + _advance_seconds(dsn, slot, config))
            one_shot.append(seconds)
            results["delta_batches"] = len(progress)
            source, lake = compare(dsn, "public.t10", str(root / f"delta_{i}" / "lake"),
                                   ["id", "c_int", "c_text", "c_label"])
            results["delta_equal"] = results.get("delta_equal", 1.0) * float(source == lake)
        # Every run must have applied every change (checked by the caller).
        results["delta_rows"] = counts.pop() if len(counts) == 1 else -1
        results["delta_first_batch_seconds"] = batch_seconds[0]
        results["delta_batch_seconds"] = statistics.median(batch_seconds[1:])
        results["delta_seconds"] = statistics.median(one_shot[1:])

        # The same changes in batches of at most 100k changes (whole transactions).
        config_100k = _pipeline_config(dsn, "public.t10", slots["delta_100k"], PUBLICATION,
                                       root / "delta_100k", max_changes=100_000)
        _, progress_100k, results["delta_100k_rows"] = _run_pipeline(spark, config_100k)
        results["delta_100k_batches"] = len(progress_100k)
        results["delta_100k_batch_seconds"] = (
            sum(p["durationMs"]["triggerExecution"] for p in progress_100k) / 1000
            + _advance_seconds(dsn, slots["delta_100k"], config_100k))
        source_100k, lake_100k = compare(dsn, "public.t10", str(root / "delta_100k" / "lake"),
                                         ["id", "c_int", "c_text", "c_label"])
        results["delta_equal"] *= float(source_100k == lake_100k)

        # A batch with no captured change: WAL moved on, but only for another table.
        with wal.connect(dsn, purpose="bench") as conn:
            conn.execute("INSERT INTO t_other VALUES (DEFAULT)")
        _, progress, _ = _run_pipeline(spark, config_100k)
        empty = [p["durationMs"]["triggerExecution"] for p in progress
                 if int(p["numInputRows"]) == 0]
        results["empty_batch"] = (statistics.median(empty) / 1000) if empty else -1.0
        spark.stop()
    return results


def _measure(master: str, dsn: str, slots: dict[str, Any]
             ) -> tuple[dict[str, float], tuple[int, int]]:
    proc = subprocess.Popen(
        [sys.executable, __file__, "--child", master, "--slots", json.dumps(slots)],
        env={**os.environ, "BENCH_DSN": dsn}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    sampler = _PeakMemory(proc.pid)
    out, err = proc.communicate()
    peak = sampler.stop()
    if proc.returncode != 0:
        raise SystemExit(f"run {master} failed:\n{err.decode(errors='replace')[-4000:]}")
    return json.loads(out.decode().strip().splitlines()[-1]), peak


def _capture_rate(dsn: str, slot: str, changes: int) -> float:
    argv = [sys.executable, "-m", "tidemark", "--log-level", "INFO", "capture", "--table",
            "public.t10", "--slot", slot, "--publication", PUBLICATION, "--snapshot-mode",
            "no_data", "--stop-at-end"]
    started = time.perf_counter()
    proc = subprocess.run(argv, env={**os.environ, "TIDEMARK_DSN": dsn},
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False)
    seconds = time.perf_counter() - started
    err = proc.stderr.decode(errors="replace")
    match = re.search(r"delivered (\d+) change events", err)
    if proc.returncode != 0 or not match or int(match.group(1)) != changes:
        raise SystemExit(f"tidemark capture failed or delivered the wrong count:\n{err}")
    return changes / seconds


def _prepare(dsn: str, transactions: int) -> int:
    workload.create_table(dsn)
    with wal.connect(dsn, purpose="bench") as conn:
        conn.execute("CREATE TABLE t_warm (LIKE t10 INCLUDING ALL)")
        conn.execute("CREATE TABLE t_other (id serial PRIMARY KEY)")
        conn.execute(f"CREATE PUBLICATION {WARM_PUBLICATION} FOR TABLE t_warm")
        conn.execute(f"CREATE PUBLICATION {PUBLICATION} FOR TABLE t10")
        wal.ensure_slot(conn, WARM_SLOT)
        # The warm-up table: a little of the workload's shape.
        for i in range(WARM_TRANSACTIONS):
            conn.execute("INSERT INTO t_warm (id, c_int, c_text, c_numeric, c_ts) "
                         "SELECT g, g, 'w' || g, g / 10.0, now() "
                         "FROM generate_series(%s::int, %s::int) g", (i * 60 + 1, i * 60 + 60))
        wal.ensure_slot(conn, BASE_SLOT)
    started = time.perf_counter()
    changes = workload.run_workload(dsn, transactions)
    log.info("workload: %d changes in %.1f s", changes, time.perf_counter() - started)
    return changes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--transactions", type=int, default=3000,
                        help="transactions of 100 changes (default 3000 = 300k changes)")
    parser.add_argument("--runs", type=int, default=2, help="measurements per contender")
    parser.add_argument("--batches", type=int, default=2,
                        help="measured Delta batches per Spark process, after a first one "
                             "(default 2)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--slots", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.batches < 1:
        parser.error("--batches must be at least 1")
    if args.child:
        logging.basicConfig(level=logging.WARNING)
        result = _child(args.child, os.environ["BENCH_DSN"], json.loads(args.slots))
        print(json.dumps(result))
        return

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    rates: dict[str, list[float]] = {"capture": []}
    extra: dict[str, list[float]] = {}
    peaks: dict[str, tuple[int, int]] = {}
    with PostgresCluster(durable=True) as cluster:
        print(f"server: PostgreSQL, {cluster.durability}")
        dsn = cluster.create_database("bench")
        changes = _prepare(dsn, args.transactions)
        for run in range(args.runs):
            _copy_slot(dsn, BASE_SLOT, f"capture_{run}")
            rates["capture"].append(_capture_rate(dsn, f"capture_{run}", changes))
            _drop_slots(dsn, [f"capture_{run}"])
            log.info("run %d: tidemark capture %.0f changes/s", run + 1, rates["capture"][-1])
            for master in ("local[1]", "local[2]"):
                tag = f"{master[6]}_{run}"
                slots: dict[str, Any] = {
                    "warm": f"warm_{tag}", "noop": f"noop_{tag}",
                    "delta": [f"delta_{tag}_{i}" for i in range(args.batches + 1)],
                    "delta_100k": f"delta_100k_{tag}"}
                _copy_slot(dsn, WARM_SLOT, slots["warm"])
                copies = [slots["noop"], *slots["delta"], slots["delta_100k"]]
                for name in copies:
                    _copy_slot(dsn, BASE_SLOT, name)
                result, peak = _measure(master, dsn, slots)
                _drop_slots(dsn, [slots["warm"], *copies])
                for kind in ("noop", "delta", "delta_100k"):
                    if result[f"{kind}_rows"] != changes:
                        raise SystemExit(f"{master} {kind} read {result[f'{kind}_rows']} "
                                         f"changes, expected {changes}")
                if result["delta_equal"] != 1.0:
                    raise SystemExit(f"{master}: the Delta table differs from PostgreSQL")
                for kind in ("noop", "delta"):
                    rates.setdefault(f"{master} {kind}", []).append(
                        changes / result[f"{kind}_seconds"])
                rates.setdefault(f"{master} noop, batch time", []).append(
                    changes / result["noop_batch_seconds"])
                rates.setdefault(f"{master} delta, first batch", []).append(
                    changes / result["delta_first_batch_seconds"])
                rates.setdefault(f"{master} delta, batch time", []).append(
                    changes / result["delta_batch_seconds"])
                rates.setdefault(f"{master} delta 100k, batch time", []).append(
                    changes / result["delta_100k_batch_seconds"])
                for key in ("startup", "cold", "empty_batch", "floor"):
                    extra.setdefault(f"{master} {key}", []).append(result[key])
                old = peaks.get(master, (0, 0))
                peaks[master] = (max(old[0], peak[0]), max(old[1], peak[1]))
                log.info("run %d %s: noop %.0f/s (batch time %.0f/s), delta %.0f/s (%d "
                         "batches; batch time %.0f/s, first batch of the process %.0f/s), "
                         "in %d batches of <= 100k: batch time %.0f/s, empty batch "
                         "%.2f s, trivial query %.2f s, Spark start %.1f s, cold warm-up query "
                         "%.1f s, peak driver RSS %.0f MB, tree PSS %.0f MB", run + 1, master,
                         rates[f"{master} noop"][-1], rates[f"{master} noop, batch time"][-1],
                         rates[f"{master} delta"][-1], result["delta_batches"],
                         rates[f"{master} delta, batch time"][-1],
                         rates[f"{master} delta, first batch"][-1],
                         result["delta_100k_batches"],
                         rates[f"{master} delta 100k, batch time"][-1], result["empty_batch"],
                         result["floor"], result["startup"], result["cold"], peak[0] / 2**20,
                         peak[1] / 2**20)

    def fmt(values: list[float]) -> str:
        return (f"{statistics.median(values):>9,.0f}/s  (runs: "
                f"{', '.join(f'{v:,.0f}' for v in values)})")

    capture = statistics.median(rates["capture"])
    print(f"\n{changes:,} changes; medians of {args.runs} runs")
    print(f"{'tidemark capture (baseline)':<34}{fmt(rates['capture'])}")
    kinds = ("noop", "noop, batch time", "delta", "delta, first batch", "delta, batch time",
             "delta 100k, batch time")
    for master in ("local[1]", "local[2]"):
        for kind in kinds:
            name = f"{master} {kind}"
            ratio = statistics.median(rates[name]) / capture
            print(f"{name:<34}{fmt(rates[name])}  {ratio:.2f}x capture")
        print(f"{master + ' trivial query':<34}"
              f"{statistics.median(extra[f'{master} floor']):>9.2f} s (Spark's own start and "
              "end of an AvailableNow query of a one-row Python source)")
        print(f"{master + ' empty batch':<34}"
              f"{statistics.median(extra[f'{master} empty_batch']):>9.2f} s;  peak driver RSS "
              f"{peaks[master][0] / 2**20:,.0f} MB, all processes (PSS) "
              f"{peaks[master][1] / 2**20:,.0f} MB;  Spark start "
              f"{statistics.median(extra[f'{master} startup']):.1f} s, cold first query "
              f"{statistics.median(extra[f'{master} cold']):.1f} s")
    for kind in kinds:
        ratio = (statistics.median(rates[f"local[2] {kind}"])
                 / statistics.median(rates[f"local[1] {kind}"]))
        print(f"local[2] / local[1] {kind}: {ratio:.2f}x")


if __name__ == "__main__":
    main()
