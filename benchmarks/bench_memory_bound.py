"""Benchmark: memory of ``tidemark run`` against its settings, for one transaction far
larger than the JVM's heap, of wide rows, from each source.

One transaction of ``--rows`` inserts into ``big (id integer PRIMARY KEY, v text)``, each
``v`` ``--width`` bytes of hex md5 text (which neither TOAST, the binlog nor Parquet
shrinks), goes through ``tidemark run --available-now`` with ``spark.driver.memory =
--heap`` (local mode: the one JVM holds the driver and the executors) and default
settings otherwise. ``--source``:

* ``postgres``: a private PostgreSQL with durable settings (``fsync``,
  ``full_page_writes``, ``synchronous_commit`` on), read from a slot made before;
* ``mariadb``: a private MariaDB with its default durability, read from the binlog;
* ``logtable-postgres``, ``logtable-sqlite``: CDC log tables in that PostgreSQL or a SQLite
  file (WAL mode, as applications use it).

Measured, and printed against the settings (heap, the source's ``arrowBatchBytes``,
``spark.collect_max_mb``, ``spark.apply_step_mb``):

* JVM heap, from the JVM's GC log (``-Xlog:gc`` through
  ``spark.driver.extraJavaOptions``): the peak in use (before a collection: live data
  and garbage), the peak after a collection (what it could not free then), and the
  number of full collections;
* peak memory, sampled every 0.1 s: RSS of the Python driver and of the JVM; Spark's
  Python workers as their summed PSS and the largest one's RSS;
* wall time of the run (Spark's start included).

The Delta table is then checked against the source: every id, and the md5 of every ``v``.

``--values repeated`` (PostgreSQL): each ``v`` one md5 repeated, which TOAST compresses.

``--changelog``: with a ``[changelog]`` (each batch is persisted, written to it, then
applied).

``--phase snapshot``: the same rows as a populated table, loaded by the pipeline's
snapshot (``snapshot = "initial"``) instead of streamed.

Usage: ``uv run python benchmarks/bench_memory_bound.py --source postgres [--rows 1000000]
[--width 1024] [--heap 512m] [--phase snapshot]``
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
from deltalake import DeltaTable

from tidemark.lake.delta_read import live_rows
from tidemark.pipeline import load_config
from tidemark.source.logtable import postgres_install, sqlite_install
from tidemark.spark.options import DEFAULT_ARROW_BATCH_BYTES
from tidemark.testing.mariadb import MariaDbServer
from tidemark.testing.postgres import PostgresCluster, sql_connection

#: MariaDB's own defaults for the memory the test servers give it.
_DEFAULT_MARIADB_MEMORY = {"innodb-buffer-pool-size": "128M", "innodb-log-file-size": "96M"}
#: ``... 812M->95M(1024M) 12.3ms``: heap in use before and after, and its size.
_GC_LINE = re.compile(r"(\d+)M->(\d+)M\((\d+)M\)")
_READ = 50_000


def _mib(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB"


def _pipeline(work: Path, source: str, table: str, heap: str | None, gc_log: Path,
              java_options: str = "", snapshot: str = "never",
              changelog: bool = False) -> Path:
    conf = '"spark.ui.enabled" = "false"'
    if heap is not None:
        conf += (f', "spark.driver.memory" = "{heap}", '
                 f'"spark.driver.extraJavaOptions" = "-Xlog:gc:file={gc_log} {java_options}"')
    file = work / "pipeline.toml"
    file.write_text(f'[source]\n{source}\n[spark]\ncheckpoint = "{work}/chk"\n'
                    f'available_now = true\nconf = {{ {conf} }}\n'
                    f'[targets."{table}"]\npath = "{work}/lake"\nkeys = ["id"]\n'
                    f'snapshot = "{snapshot}"\n'
                    + (f'[changelog]\npath = "{work}/changes"\n' if changelog else ""))
    return file


class Peaks(threading.Thread):
    """Peak memory of a ``tidemark run`` process tree, sampled every 0.1 s: RSS of the
    Python driver and of the JVM; Spark's Python workers both as the largest one's RSS
    and as their summed PSS (forked workers share pages, which summed RSS counts
    again)."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.root = psutil.Process(pid)
        self.driver = self.jvm = self.worker = self.workers = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.1):
            with contextlib.suppress(psutil.Error):
                self.driver = max(self.driver, self.root.memory_info().rss)
                pss = 0
                for child in self.root.children(recursive=True):
                    with contextlib.suppress(psutil.Error):
                        if "java" in child.name():
                            self.jvm = max(self.jvm, child.memory_info().rss)
                            continue
                        info = child.memory_full_info()
                        self.worker = max(self.worker, info.rss)
                        pss += info.pss
                self.workers = max(self.workers, pss)


def _run(file: Path) -> tuple[float, Peaks, str]:
    """``tidemark run`` to its end: wall seconds, memory peaks, output."""
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    log = file.parent / "run.log"
    started = time.perf_counter()
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "tidemark", "--log-level", "INFO",
                                 "run", str(file)], env=env, stdout=out,
                                stderr=subprocess.STDOUT)
        peaks = Peaks(proc.pid)
        peaks.start()
        code = proc.wait()
    seconds = time.perf_counter() - started
    peaks.stop.set()
    peaks.join()
    text = log.read_text(errors="replace")
    if code != 0:
        kept = Path(tempfile.gettempdir()) / "bench_memory_bound.run.log"
        kept.write_text(text)
        cause = "\n".join(line for line in text.splitlines()
                          if re.search(r"Error|Exception|Killed|batch \d", line))
        raise SystemExit(f"tidemark run failed ({code}); its log: {kept}\n{cause[-3000:]}")
    return seconds, peaks, text


def _gc_peaks(gc_log: Path) -> tuple[int, int, int, int]:
    """From the GC log, in MiB: peak heap in use before a collection (live data and
    garbage), peak in use after one (what it could not free then), the largest heap
    size; and the number of full collections. Remark and cleanup pauses free nothing:
    they are left out."""
    text = gc_log.read_text(errors="replace")
    shutil.copy(gc_log, Path(tempfile.gettempdir()) / "bench_memory_bound.gc.log")
    used = kept = size = 0
    for line in text.splitlines():
        found = _GC_LINE.search(line)
        if found is None or "Remark" in line or "Cleanup" in line:
            continue
        before, after, total = (int(v) for v in found.groups())
        used, kept, size = max(used, before), max(kept, after), max(size, total)
    return used, kept, size, text.count("Pause Full")


def _hex_sql_postgres(width: int) -> str:
    return (f"(SELECT string_agg(md5(g || '-' || i), '') FROM generate_series(1, "
            f"{width // 32}) i)")


class Source:
    """A source database for one run: its pipeline section and its rows."""

    source: str = ""
    table = ""
    kind = ""

    def prepare(self) -> None:
        """Create ``big`` (and whatever reads it) before the transaction."""

    def load(self, rows: int, width: int) -> None:
        raise NotImplementedError

    def first_run(self, work: Path) -> None:
        """A run before the transaction, for a source whose stream starts at its end."""

    def digests(self, rows: int) -> Iterator[tuple[int, str]]:
        raise NotImplementedError


class Postgres(Source):
    def __init__(self, cluster: PostgresCluster, logtable: bool, repeated: bool) -> None:
        self.dsn = cluster.create_database("bench")
        self.repeated = repeated
        self.logtable = logtable
        self.table = "public.big"
        self.kind = "logtable-postgres" if logtable else "postgres"
        self.source = f'dsn = "{self.dsn}"\n' + (
            'kind = "logtable"\n' if logtable else 'slot = "bench"\npublication = "bench"\n')

    def _execute(self, statement: str) -> None:
        with contextlib.closing(sql_connection(self.dsn)) as conn, conn.transaction(), \
                conn.cursor() as cur:
            cur.execute(statement)

    def prepare(self) -> None:
        self._execute("CREATE TABLE big (id integer PRIMARY KEY, v text)")
        if self.logtable:
            with contextlib.closing(sql_connection(self.dsn)) as conn:
                conn.autocommit = True
                postgres_install.install(conn, ["big"])
        else:
            self._execute("CREATE PUBLICATION bench FOR TABLE big")
            self._execute("SELECT pg_create_logical_replication_slot('bench', 'pgoutput')")

    def load(self, rows: int, width: int) -> None:
        # Repeated, a value compresses (TOAST) to a few dozen bytes of WAL.
        value = f"repeat(md5(g::text), {width // 32})" if self.repeated else \
            _hex_sql_postgres(width)
        self._execute(f"INSERT INTO big SELECT g, {value} FROM generate_series(1, {rows}) g")

    def digests(self, rows: int) -> Iterator[tuple[int, str]]:
        with contextlib.closing(sql_connection(self.dsn)) as conn, conn.cursor() as cur:
            for lo in range(1, rows + 1, _READ):
                cur.execute("SELECT id, md5(v) FROM big WHERE id >= %s AND id < %s",
                            (lo, lo + _READ))
                yield from cur.fetchall()


class MariaDb(Source):
    def __init__(self, server: MariaDbServer) -> None:
        self.server = server
        self.dsn = server.dsn("bench")
        self.table = "bench.big"
        self.kind = "mariadb"
        self.source = f'dsn = "{self.dsn}"\n'

    def _execute(self, statement: str) -> list[tuple[Any, ...]]:
        conn = self.server.connect()
        with contextlib.closing(conn), conn.cursor() as cur:
            cur.execute(statement)
            rows = list(cur.fetchall())
            conn.commit()
            return rows

    def prepare(self) -> None:
        self._execute("CREATE DATABASE IF NOT EXISTS bench")
        self._execute("CREATE TABLE bench.big (id INT PRIMARY KEY, v LONGTEXT)")

    def first_run(self, work: Path) -> None:
        # The binlog is read from where the query starts: start it before the load.
        _run(_pipeline(work, self.source, self.table, None, work / "gc.log"))

    def load(self, rows: int, width: int) -> None:
        self._execute(f"INSERT INTO bench.big SELECT s.seq, (SELECT GROUP_CONCAT(MD5(CONCAT("
                      f"s.seq, '-', i.seq)) ORDER BY i.seq SEPARATOR '') FROM bench."
                      f"seq_1_to_{width // 32} i) FROM bench.seq_1_to_{rows} s")

    def digests(self, rows: int) -> Iterator[tuple[int, str]]:
        for lo in range(1, rows + 1, _READ):
            yield from self._execute(f"SELECT id, MD5(v) FROM bench.big WHERE id >= {lo} "
                                     f"AND id < {lo + _READ}")


class Sqlite(Source):
    def __init__(self, path: Path) -> None:
        self.path = path
        self.table = "main.big"
        self.kind = "logtable-sqlite"
        self.source = f'dsn = "sqlite://{path}"\n'

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")  # WAL's usual setting for applications
        return conn

    def prepare(self) -> None:
        with contextlib.closing(self._connect()) as conn:
            conn.execute("CREATE TABLE big (id integer PRIMARY KEY, v text)")
            sqlite_install.install(conn, ["big"])

    def load(self, rows: int, width: int) -> None:
        with contextlib.closing(self._connect()) as conn:
            conn.create_function("hexof", 2, lambda i, n: "".join(
                hashlib.md5(f"{i}-{k}".encode()).hexdigest() for k in range(1, n + 1)),
                deterministic=True)
            conn.execute("BEGIN")
            conn.execute(f"WITH RECURSIVE g(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM g "
                         f"WHERE i < {rows}) INSERT INTO big SELECT i, hexof(i, {width // 32})"
                         " FROM g")
            conn.execute("COMMIT")

    def digests(self, rows: int) -> Iterator[tuple[int, str]]:
        with contextlib.closing(self._connect()) as conn:
            for lo in range(1, rows + 1, _READ):
                for i, v in conn.execute("SELECT id, v FROM big WHERE id >= ? AND id < ?",
                                         (lo, lo + _READ)):
                    yield i, hashlib.md5(v.encode()).hexdigest()


def _lake_digests(lake: Path) -> dict[int, str]:
    out: dict[int, str] = {}
    for batch in live_rows(DeltaTable(str(lake))).to_batches(
            columns=["id", "v"], batch_size=_READ):
        for i, v in zip(batch.column(0).to_pylist(), batch.column(1).to_pylist(),
                        strict=True):
            out[int(i)] = hashlib.md5(v.encode()).hexdigest()
    return out


def _measure(source: Source, args: argparse.Namespace, work: Path) -> None:
    source.prepare()
    snapshot = args.phase == "snapshot"
    if not snapshot:
        source.first_run(work)
    started = time.perf_counter()
    source.load(args.rows, args.width)
    load_s = time.perf_counter() - started
    data = args.rows * (args.width // 32 * 32)
    gc_log = work / "gc.log"
    file = _pipeline(work, source.source, source.table, args.heap, gc_log, args.java_options,
                     "initial" if snapshot else "never", args.changelog)
    spark = load_config(file).spark
    what = ("a table (its snapshot)" if snapshot else "one transaction") + \
        (", with a change log" if args.changelog else "")
    print(f"{source.kind}: {what} of {args.rows:,} rows x {args.width // 32 * 32} "
          f"bytes of text ({_mib(data)} of values, written in {load_s:.0f} s); settings: "
          f"heap {args.heap}, arrowBatchBytes {_mib(DEFAULT_ARROW_BATCH_BYTES)}, "
          f"collect_max_mb {spark.collect_max_mb}, apply_step_mb {spark.apply_step_mb}, "
          f"apply_step_rows {spark.apply_step_rows:,}")
    seconds, peaks, log = _run(file)
    used, live, size, full = _gc_peaks(gc_log)
    spilled = "spilled, applied in steps" if "the executors write it" in log \
        else "collected to the driver"
    print(f"  tidemark run: {seconds:.0f} s ({spilled}); JVM heap (of {size} MiB): peak in use "
          f"{used} MiB, after a collection {live} MiB, {full} full GCs; peak RSS: driver "
          f"{_mib(peaks.driver)}, JVM {_mib(peaks.jvm)}, Python workers "
          f"{_mib(peaks.workers)} (PSS summed; the largest one {_mib(peaks.worker)} RSS)")
    lake = _lake_digests(work / "lake")
    wanted = dict(source.digests(args.rows))
    if len(wanted) != args.rows:
        raise SystemExit(f"the source holds {len(wanted)} rows, not {args.rows}")
    if lake != wanted:
        differ = sum(1 for k, v in wanted.items() if lake.get(k) != v)
        raise SystemExit(f"Delta differs from the source: {len(lake)} rows, {differ} "
                         "missing or different")
    print(f"  Delta equals the source: {len(lake):,} rows, every v's md5")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", choices=("postgres", "mariadb", "logtable-postgres",
                                             "logtable-sqlite"), default="postgres")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--width", type=int, default=1024, help="bytes of v (multiple of 32)")
    parser.add_argument("--heap", default="512m", help="spark.driver.memory")
    parser.add_argument("--phase", choices=("transaction", "snapshot"), default="transaction",
                        help="the rows as one streamed transaction, or as a table's snapshot")
    parser.add_argument("--java-options", default="",
                        help="more JVM options (e.g. a flight recording, to see what fills it)")
    parser.add_argument("--changelog", action="store_true",
                        help="with a [changelog] (the batch is persisted and written twice)")
    parser.add_argument("--values", choices=("hashed", "repeated"), default="hashed",
                        help="v as md5 hex of each part (incompressible), or one md5 "
                             "repeated (PostgreSQL compresses it; PostgreSQL sources only)")
    args = parser.parse_args()
    if args.values == "repeated" and args.source not in ("postgres", "logtable-postgres"):
        parser.error("--values repeated is for the PostgreSQL sources")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)

        def run(source: Source) -> None:
            _measure(source, args, work)

        if args.source == "mariadb":
            with MariaDbServer(durable=True, settings=_DEFAULT_MARIADB_MEMORY) as server:
                print(f"server: MariaDB, {server.durability}")
                run(MariaDb(server))
        elif args.source == "logtable-sqlite":
            run(Sqlite(work / "bench.db"))
        else:
            with PostgresCluster(durable=True) as cluster:
                print(f"server: PostgreSQL, {cluster.durability}")
                run(Postgres(cluster, logtable=args.source == "logtable-postgres",
                             repeated=args.values == "repeated"))


if __name__ == "__main__":
    main()
