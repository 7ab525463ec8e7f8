"""Benchmark: an incremental snapshot through ``tidemark capture`` against ``COPY``, same run.

Builds table ``t10`` (the shared workload's 10-column layout: bigint key, integer,
bigint, two texts, numeric, timestamptz, boolean, double precision, date) with
``--rows`` rows in a private PostgreSQL, and measures, in the same run:

* ``psql -c 'COPY t10 TO STDOUT'`` to /dev/null — the baseline;
* ``tidemark capture --stop-at-end`` after an ``execute-snapshot`` signal (Debezium JSON
  lines to /dev/null), at each ``--chunk-size``: rows/s = table rows / wall time from
  process start to exit, and rows / (wall - startup), where startup is the wall time of
  a ``--stop-at-end`` run on the same slot with nothing to do, measured just before;
* the same with a writer doing single-row UPDATEs of random rows, paced at
  ``--update-rate`` per second (default 1,000) while the snapshot runs (the achieved
  rate is printed: on a busy machine it can fall short);
* peak RSS of each process (``wait4`` rusage).

Each measurement has its own slot and its own signal, so none decodes another's WAL.
The order of the contenders is reversed every other run. After the measured runs one
unmeasured run (first chunk size, no writer) writes its output to a file and checks that
it holds exactly one ``op: "r"`` line per row and every id once.

Usage: ``uv run python benchmarks/bench_snapshot.py [--rows 1000000] [--runs 3]
[--chunk-size 1024 --chunk-size 8192 ...]``
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

sys.path.insert(0, str(Path(__file__).parent))

import workload
from processes import run_measured

from tidemark.testing.postgres import PostgresCluster, sql_connection

PUBLICATION = "bench_pub"
SIGNALS = "public.dbz_signal"


class Writer(threading.Thread):
    """Single-row UPDATEs of random rows, each its own transaction, paced at *rate*/s
    (a writer that falls behind does not sleep until it has caught up)."""

    def __init__(self, dsn: str, rows: int, rate: float, seed: int) -> None:
        super().__init__(daemon=True)
        self.dsn, self.rows, self.rate = dsn, rows, rate
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.ready = threading.Event()
        self.done = 0
        self.seconds = 0.0

    def run(self) -> None:
        with contextlib.closing(sql_connection(self.dsn)) as conn:
            conn.autocommit = True
            with conn.cursor() as cur:
                self.ready.set()
                started = time.perf_counter()
                while not self.stop.is_set():
                    due = started + self.done / self.rate
                    wait = due - time.perf_counter()
                    if wait > 0:
                        time.sleep(wait)
                    cur.execute("UPDATE t10 SET c_int = c_int + 1, c_label = 'updated' "
                                "WHERE id = %s", (self.rng.randint(1, self.rows),))
                    self.done += 1
                self.seconds = time.perf_counter() - started

    @property
    def achieved(self) -> float:
        return self.done / self.seconds if self.seconds else 0.0


@dataclass
class Sample:
    seconds: float
    rss: int
    startup: float | None = None
    updates_per_s: float | None = None


@dataclass
class Contender:
    name: str
    chunk: int | None = None  # None: COPY
    update_rate: float = 0.0
    samples: list[Sample] = field(default_factory=list)


class Bench:
    def __init__(self, cluster: PostgresCluster, dsn: str, rows: int) -> None:
        self.cluster, self.dsn, self.rows = cluster, dsn, rows
        self.env = {**os.environ, "PGPASSWORD": cluster.password}
        self.env.pop("PGSERVICEFILE", None)
        self.capture_env = {**os.environ, "TIDEMARK_DSN": dsn}
        self.slots = 0
        self.conn = sql_connection(dsn)
        self.conn.autocommit = True

    def sql(self, statement: str,
            params: tuple[Any, ...] | None = None) -> list[tuple[Any, ...]]:
        with self.conn.cursor() as cur:
            cur.execute(statement, params)
            return cur.fetchall() if cur.description else []

    def copy(self) -> Sample:
        psql = [str(Path(self.cluster.bindir) / "psql"), "-X", "-q", "-h", self.cluster.host,
                "-p", str(self.cluster.port), "-U", self.cluster.superuser, "-d", "bench",
                "-c", "COPY t10 TO STDOUT"]
        seconds, rss, _ = run_measured(psql, self.env)
        return Sample(seconds, rss)

    def _capture_argv(self, slot: str, chunk: int) -> list[str]:
        return [sys.executable, "-m", "tidemark", "--log-level", "INFO", "capture",
                "--table", "public.t10", "--slot", slot, "--publication", PUBLICATION,
                "--snapshot-mode", "no_data", "--signal-table", SIGNALS,
                "--incremental-snapshot-chunk-size", str(chunk), "--stop-at-end"]

    def snapshot(self, chunk: int, update_rate: float,
                 stdout: int | IO[bytes] = subprocess.DEVNULL) -> Sample:
        """A fresh slot; a run with nothing to do (startup); the signal; the measured run."""
        self.slots += 1
        slot = f"snap_{self.slots}"
        self.sql("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        argv = self._capture_argv(slot, chunk)
        startup, _, _ = run_measured(argv, self.capture_env)
        self.sql("INSERT INTO dbz_signal VALUES (%s, 'execute-snapshot', %s)",
                 (f"bench-{self.slots}", json.dumps({"data-collections": ["public.t10"],
                                                     "type": "incremental"})))
        writer = None
        if update_rate > 0:
            writer = Writer(self.dsn, self.rows, update_rate, seed=self.slots)
            writer.start()
            writer.ready.wait()
        try:
            seconds, rss, err = run_measured(argv, self.capture_env, stdout)
        finally:
            if writer is not None:
                writer.stop.set()
                writer.join()
        if "incremental snapshot of public.t10 finished" not in err:
            raise SystemExit(f"the snapshot did not finish:\n{err}")
        self.sql("SELECT pg_drop_replication_slot(%s)", (slot,))
        if writer is not None:
            self.sql("VACUUM t10")  # the next measurement reads an equally tidy table
        return Sample(seconds, rss, startup, writer.achieved if writer else None)

    def verify(self, chunk: int) -> tuple[float, int]:
        """One unmeasured run into a file: one "r" line per row, every id once."""
        with tempfile.TemporaryFile(dir=os.environ.get("TMPDIR")) as out:
            sample = self.snapshot(chunk, 0.0, stdout=out)
            out.seek(0)
            reads = 0
            ids: set[int] = set()
            key = re.compile(rb'^\{"key":\{"id":(\d+)\}')
            for line in out:
                if b'"op":"r"' in line:
                    reads += 1
                    match = key.match(line)
                    if match:
                        ids.add(int(match.group(1)))
        if reads != self.rows or ids != set(range(1, self.rows + 1)):
            raise SystemExit(f"verification failed: {reads:,} 'r' lines, {len(ids):,} "
                             f"distinct ids, expected {self.rows:,} of each")
        return sample.seconds, reads


def _build(dsn: str, rows: int) -> None:
    workload.create_table(dsn)
    with contextlib.closing(sql_connection(dsn)) as conn:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(workload.T10_FILL.format(rows=int(rows)))
            cur.execute("CREATE TABLE dbz_signal (id varchar(42) PRIMARY KEY, "
                        "type varchar(32) NOT NULL, data varchar(2048) NULL)")
            cur.execute(f"CREATE PUBLICATION {PUBLICATION} FOR TABLE t10, dbz_signal")
            # Hint bits and the visibility map set once, before anything is measured.
            cur.execute("VACUUM (FREEZE, ANALYZE) t10")
            cur.execute("CHECKPOINT")
            cur.execute("SELECT pg_size_pretty(pg_table_size('t10'))")
            (size,) = cur.fetchone()
    print(f"table t10: {rows:,} rows, {size}")


def _fmt_rate(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:,.0f}"
    return f"{statistics.median(values):,.0f} ({min(values):,.0f}-{max(values):,.0f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="table rows")
    parser.add_argument("--chunk-size", type=int, action="append", dest="chunks",
                        help="incremental snapshot chunk size (repeatable; default 1024 "
                             "(tidemark's default), 8192 and 32768)")
    parser.add_argument("--update-rate", type=float, default=1000.0,
                        help="UPDATEs/s during the snapshot for the 'with updates' "
                             "contenders (0: leave them out)")
    parser.add_argument("--runs", type=int, default=2, help="measurements per contender")
    args = parser.parse_args()
    chunks = args.chunks or [1024, 8192, 32768]

    contenders = [Contender("COPY t10 TO STDOUT (psql)")]
    for chunk in chunks:
        contenders.append(Contender(f"tidemark, chunk {chunk}", chunk))
        if args.update_rate > 0:
            contenders.append(Contender(f"tidemark, chunk {chunk}, updates", chunk,
                                        args.update_rate))

    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    with PostgresCluster(durable=True) as cluster:
        print(f"server: PostgreSQL, {cluster.durability}")
        dsn = cluster.create_database("bench")
        t0 = time.perf_counter()
        _build(dsn, args.rows)
        print(f"built in {time.perf_counter() - t0:.1f} s")
        bench = Bench(cluster, dsn, args.rows)
        for run in range(args.runs):
            order = contenders if run % 2 == 0 else contenders[::-1]
            for c in order:
                sample = bench.copy() if c.chunk is None else \
                    bench.snapshot(c.chunk, c.update_rate)
                c.samples.append(sample)
                extra = ""
                if sample.startup is not None:
                    extra += f", startup {sample.startup:.2f} s"
                if sample.updates_per_s is not None:
                    extra += f", {sample.updates_per_s:,.0f} updates/s achieved"
                print(f"run {run + 1}: {c.name}: {sample.seconds:.2f} s, "
                      f"{args.rows / sample.seconds:,.0f} rows/s, "
                      f"peak RSS {sample.rss / 2**20:.0f} MB{extra}", flush=True)
        check_seconds, reads = bench.verify(chunks[0])
        print(f"check (unmeasured run, chunk {chunks[0]}, output to a file, "
              f"{check_seconds:.1f} s): {reads:,} 'r' lines, every id once")
        bench.conn.close()
    load = os.getloadavg()

    copy = contenders[0]
    print()
    print(f"rows/s: median over {args.runs} runs (min-max); ratio: median of the per-run "
          f"ratios to COPY in the same run; peak RSS: the largest of the runs")
    header = (f"{'contender':<34}{'rows/s wall':>28}{'rows/s excl. startup':>28}"
              f"{'ratio':>8}{'peak RSS':>10}{'updates/s':>24}")
    print(header)
    for c in contenders:
        wall = [args.rows / s.seconds for s in c.samples]
        net = [args.rows / (s.seconds - s.startup) for s in c.samples if s.startup is not None]
        ratio = statistics.median(cs.seconds / s.seconds
                                  for s, cs in zip(c.samples, copy.samples, strict=True))
        updates = [s.updates_per_s for s in c.samples if s.updates_per_s is not None]
        print(f"{c.name:<34}{_fmt_rate(wall):>28}{_fmt_rate(net) if net else '-':>28}"
              f"{ratio:>7.2f}x{max(s.rss for s in c.samples) / 2**20:>8.0f}MB"
              f"{_fmt_rate(updates) if updates else '-':>24}")
    startups = [s.startup for c in contenders for s in c.samples if s.startup is not None]
    if startups:
        print(f"startup (a --stop-at-end run with nothing to do): median "
              f"{statistics.median(startups):.2f} s ({min(startups):.2f}-{max(startups):.2f})")
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in load)}")
    print("targets (not measured here): >= 200k rows/s through tidemark capture; "
          "Debezium 3.6's incremental snapshot does about 20k rows/s on these machines")


if __name__ == "__main__":
    main()
