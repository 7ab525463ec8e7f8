"""Benchmark: a populated table into Delta with ``tidemark run --available-now`` (its
snapshot, then the stream), against ``COPY`` of the same table in the same run.

Builds table ``t10`` (the shared workload's 10-column layout) with each ``--rows`` count
in a private PostgreSQL and measures, alternating the order of the contenders every run:

* ``psql -c 'COPY t10 TO STDOUT'`` to /dev/null — the baseline;
* ``tidemark run --available-now`` on a new checkpoint, slot and Delta target, at each
  ``--master`` (``local[1]``, ``local[2]``): rows/s = rows / wall time from process start
  to exit, and rows / (wall - startup), where startup is the wall time of the same run
  against an empty table, measured just before (Spark's start, the first batches);
* peak RSS, sampled every 0.1 s: the Python driver (where each batch is collected and
  applied), Spark's JVM (which in local mode holds the executors too) and the Python
  workers together.

Every measured run is then checked: the Delta table has exactly the table's row count.
Medians over ``--runs``.

Usage: ``uv run python benchmarks/bench_pipeline_snapshot.py [--rows 1000000 --rows
5000000] [--runs 2] [--master 'local[1]' --master 'local[2]']``
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from deltalake import DeltaTable

sys.path.insert(0, str(Path(__file__).parent))

import workload

from tidemark.lake.delta_read import live_rows
from tidemark.testing.postgres import PostgresCluster, sql_connection


class Peaks(threading.Thread):
    """Peak RSS of a ``tidemark run`` process tree: the Python driver, the JVM, the
    Python workers (summed)."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.root = psutil.Process(pid)
        self.driver = self.jvm = self.workers = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.1):
            with contextlib.suppress(psutil.Error):
                self.driver = max(self.driver, self.root.memory_info().rss)
                jvm = workers = 0
                for child in self.root.children(recursive=True):
                    with contextlib.suppress(psutil.Error):
                        rss = child.memory_info().rss
                        if "java" in child.name():
                            jvm += rss
                        else:
                            workers += rss
                self.jvm, self.workers = max(self.jvm, jvm), max(self.workers, workers)


def run_pipeline(file: Path, *args: str) -> tuple[float, Peaks, str]:
    """Run ``tidemark [args] run file`` to its end: wall seconds, the peaks of its
    process tree and its output (a failure ends the benchmark with the output's end)."""
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    log = file.parent / "run.log"
    started = time.perf_counter()
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "tidemark", *args, "run", str(file)],
                                env=env, stdout=out, stderr=subprocess.STDOUT)
        peaks = Peaks(proc.pid)
        peaks.start()
        code = proc.wait()
    seconds = time.perf_counter() - started
    peaks.stop.set()
    peaks.join()
    text = log.read_text(errors="replace")
    if code != 0:
        raise SystemExit(f"tidemark run failed ({code}):\n{text[-3000:]}")
    return seconds, peaks, text


@dataclass
class Sample:
    seconds: float
    startup: float = 0.0
    driver: int = 0
    jvm: int = 0
    workers: int = 0


@dataclass
class Contender:
    name: str
    master: str | None = None  # None: COPY
    samples: list[Sample] = field(default_factory=list)


class Bench:
    def __init__(self, cluster: PostgresCluster, rows: int, work: Path) -> None:
        self.cluster, self.rows, self.work = cluster, rows, work
        self.dsn = cluster.create_database(f"bench{rows}")
        self.dbname = f"bench{rows}"
        self.runs = 0
        self.conn = sql_connection(self.dsn)
        self.conn.autocommit = True
        workload.fill_t10(self.dsn, rows, "CREATE TABLE empty (LIKE t10 INCLUDING ALL)")

    def copy(self) -> Sample:
        psql = [str(Path(self.cluster.bindir) / "psql"), "-X", "-q", "-h", self.cluster.host,
                "-p", str(self.cluster.port), "-U", self.cluster.superuser,
                "-d", self.dbname, "-c", "COPY t10 TO STDOUT"]
        env = {**os.environ, "PGPASSWORD": self.cluster.password}
        started = time.perf_counter()
        subprocess.run(psql, env=env, stdout=subprocess.DEVNULL, check=True)
        return Sample(time.perf_counter() - started)

    def _pipeline(self, table: str, master: str) -> tuple[Path, Path]:
        self.runs += 1
        home = self.work / f"run{self.runs}"
        home.mkdir()
        file = home / "pipeline.toml"
        file.write_text(
            f'[source]\ndsn = "{self.dsn}"\nslot = "bench_{self.runs}"\n'
            f'publication = "bench_{self.runs}"\n'
            f'[spark]\nmaster = "{master}"\ncheckpoint = "chk"\navailable_now = true\n'
            'conf = { "spark.ui.enabled" = "false" }\n'
            f'[targets."public.{table}"]\npath = "lake"\nkeys = ["id"]\n')
        return file, home / "lake"

    def _run(self, table: str, master: str) -> tuple[Sample, Path]:
        file, lake = self._pipeline(table, master)
        seconds, peaks, _ = run_pipeline(file)
        with self.conn.cursor() as cur:
            cur.execute(f"SELECT pg_drop_replication_slot('bench_{self.runs}')")
        return Sample(seconds, driver=peaks.driver, jvm=peaks.jvm,
                      workers=peaks.workers), lake

    def pipeline(self, master: str) -> Sample:
        startup, _ = self._run("empty", master)
        sample, lake = self._run("t10", master)
        delta_rows = live_rows(DeltaTable(str(lake))).count_rows()
        if delta_rows != self.rows:
            raise SystemExit(f"Delta holds {delta_rows} rows, the table {self.rows}")
        sample.startup = startup.seconds
        return sample


def _mib(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, action="append")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--master", action="append")
    args = parser.parse_args()
    sizes = args.rows or [1_000_000]
    masters = args.master or ["local[1]", "local[2]"]
    with PostgresCluster(durable=True) as cluster, tempfile.TemporaryDirectory() as tmp:
        print(f"server: PostgreSQL, {cluster.durability}")
        for rows in sizes:
            bench = Bench(cluster, rows, Path(tmp))
            contenders = [Contender("COPY t10 TO STDOUT"),
                          *(Contender(f"tidemark run {m}", m) for m in masters)]
            for run in range(args.runs):
                order = contenders if run % 2 == 0 else contenders[::-1]
                for contender in order:
                    sample = bench.copy() if contender.master is None else \
                        bench.pipeline(contender.master)
                    contender.samples.append(sample)
            copy_rate = rows / statistics.median(s.seconds for s in contenders[0].samples)
            print(f"\n{rows:,} rows of t10 (10 columns), median of {args.runs} alternating "
                  "runs")
            print(f"  {contenders[0].name:<24} {copy_rate:>12,.0f} rows/s")
            for contender in contenders[1:]:
                samples = contender.samples
                wall = statistics.median(s.seconds for s in samples)
                startup = statistics.median(s.startup for s in samples)
                net = rows / max(1e-9, wall - startup)
                print(f"  {contender.name:<24} {rows / wall:>12,.0f} rows/s wall "
                      f"({wall:.1f} s), {net:,.0f} rows/s without startup ({startup:.1f} s; "
                      f"{net / copy_rate:.2f}x COPY) | peak RSS: driver "
                      f"{_mib(max(s.driver for s in samples))}, JVM "
                      f"{_mib(max(s.jvm for s in samples))}, Python workers "
                      f"{_mib(max(s.workers for s in samples))}")


if __name__ == "__main__":
    main()
