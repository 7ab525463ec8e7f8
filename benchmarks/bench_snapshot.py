"""Benchmark: an incremental snapshot through ``tidemark capture`` against ``COPY``, same run.

Builds table ``t10`` (the shared workload's 10-column layout: bigint key, integer,
bigint, two texts, numeric, timestamptz, boolean, double precision, date) with
``--rows`` rows twice in a private, durable PostgreSQL (fsync, full_page_writes and
synchronous_commit on): in database ``analyzed`` after ``VACUUM (FREEZE, ANALYZE)``, and
in database ``fresh`` as a bulk load leaves it (no VACUUM, no ANALYZE, autovacuum off
for the table so that it stays without statistics; one ``count(*)`` sets its hint
bits). For each table it measures, in the same run:

* ``psql -c 'COPY t10 TO STDOUT'`` to /dev/null — the baseline;
* ``tidemark capture --stop-at-end`` after an ``execute-snapshot`` signal (Debezium JSON
  lines to /dev/null), at each ``--chunk-size`` (default: tidemark's default): rows/s =
  table rows / wall time from process start to exit, and rows / (wall - startup),
  where startup is the wall time of a ``--stop-at-end`` run on the same slot with
  nothing to do, measured just before;
* the same with a writer doing single-row UPDATEs of random rows, paced at
  ``--update-rate`` per second (default 1,000) while the snapshot runs (the achieved
  rate is printed: on a busy machine it can fall short);
* CPU seconds (user + sys) of the measured process and of the server (the postmaster
  and its children, exited ones included), and peak RSS of the process.

With ``--baseline-src DIR`` each tidemark contender also runs with ``PYTHONPATH=DIR``
(another checkout's ``src``, e.g. ``git archive`` of an older commit with its built C
extensions copied in): before/after pairs in the same run.

Each measurement has its own slot and its own signal, so none decodes another's WAL.
The order of the contenders is reversed every other run. After the measured runs one
unmeasured run per table (no writer) writes its output to a file and checks that it
holds exactly one ``op: "r"`` line per row and every id once.

Usage: ``uv run python benchmarks/bench_snapshot.py [--rows 1000000] [--runs 3]
[--chunk-size 1024 --chunk-size 8192 ...] [--baseline-src DIR]``
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
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

from tidemark.testing.postgres import PostgresCluster, sql_connection

PUBLICATION = "bench_pub"
SIGNALS = "public.dbz_signal"


@dataclass
class Sample:
    seconds: float
    rss: int
    cpu: float
    """CPU seconds (user + sys) of the measured process."""
    server_cpu: float
    """CPU seconds of the server's processes while it ran."""
    startup: float | None = None
    updates_per_s: float | None = None
    rereads: int = 0
    """Chunks read again (the capture's log says why)."""


@dataclass
class Contender:
    name: str
    database: str
    chunk: int | None = None  # None: COPY
    update_rate: float = 0.0
    src: str | None = None  # PYTHONPATH of the code measured (None: this checkout)
    samples: list[Sample] = field(default_factory=list)


def _cpu_of(pid: int, *, children: bool = False) -> float:
    """CPU seconds of process *pid* (with *children*: of its reaped children too)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0  # it has exited: its parent's children counters hold it
    ticks = int(fields[11]) + int(fields[12])  # utime, stime
    if children:
        ticks += int(fields[13]) + int(fields[14])  # cutime, cstime
    return ticks / os.sysconf("SC_CLK_TCK")


class ServerCpu:
    """CPU seconds used by a PostgreSQL server: the postmaster, its live children and
    the children it has reaped."""

    def __init__(self, conn: Any) -> None:
        backend = conn.info.backend_pid
        stat = Path(f"/proc/{backend}/stat").read_text().rsplit(")", 1)[1].split()
        self.postmaster = int(stat[1])

    def seconds(self) -> float:
        total = _cpu_of(self.postmaster, children=True)
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError, IndexError):
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if int(stat[1]) == self.postmaster:
                    total += (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")
        return total


#: The longest a measured process may run: past it, it is killed and the benchmark ends.
RUN_TIMEOUT_S = 300.0


def run_usage(argv: list[str], env: dict[str, str],
              stdout: int | IO[bytes] = subprocess.DEVNULL) -> tuple[float, int, float, str]:
    """Run to completion: (wall seconds, peak RSS bytes, CPU seconds, stderr text)."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=stdout, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    killer = threading.Timer(RUN_TIMEOUT_S, proc.kill)
    killer.start()
    try:
        err = proc.stderr.read()
        _, status, usage = os.wait4(proc.pid, 0)
    finally:
        killer.cancel()
    if time.perf_counter() - started >= RUN_TIMEOUT_S:
        raise SystemExit(f"{' '.join(argv[:4])}… did not exit within {RUN_TIMEOUT_S:.0f} s "
                         f"(killed):\n{err.decode(errors='replace')[-3000:]}")
    elapsed = time.perf_counter() - started
    text = err.decode(errors="replace")
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(argv[:4])}… failed:\n{text}")
    return elapsed, usage.ru_maxrss * 1024, usage.ru_utime + usage.ru_stime, text


class Bench:
    def __init__(self, cluster: PostgresCluster, database: str, rows: int) -> None:
        self.cluster, self.database, self.rows = cluster, database, rows
        self.dsn = cluster.create_database(database)
        self.env = {**os.environ, "PGPASSWORD": cluster.password}
        self.env.pop("PGSERVICEFILE", None)
        self.capture_env = {**os.environ, "TIDEMARK_DSN": self.dsn}
        self.slots = 0
        self.conn: Any = None

    def connect(self) -> None:
        self.conn = sql_connection(self.dsn)
        self.conn.autocommit = True
        self.server = ServerCpu(self.conn)

    def sql(self, statement: str,
            params: tuple[Any, ...] | None = None) -> list[tuple[Any, ...]]:
        with self.conn.cursor() as cur:
            cur.execute(statement, params)
            return cur.fetchall() if cur.description else []

    def copy(self) -> Sample:
        psql = [str(Path(self.cluster.bindir) / "psql"), "-X", "-q", "-h", self.cluster.host,
                "-p", str(self.cluster.port), "-U", self.cluster.superuser, "-d",
                self.database, "-c", "COPY t10 TO STDOUT"]
        server = self.server.seconds()
        seconds, rss, cpu, _ = run_usage(psql, self.env)
        return Sample(seconds, rss, cpu, self.server.seconds() - server)

    def _capture_argv(self, slot: str, chunk: int) -> list[str]:
        return [sys.executable, "-m", "tidemark", "--log-level", "INFO", "capture",
                "--table", "public.t10", "--slot", slot, "--publication", PUBLICATION,
                "--snapshot-mode", "no_data", "--signal-table", SIGNALS,
                "--incremental-snapshot-chunk-size", str(chunk), "--stop-at-end"]

    def snapshot(self, chunk: int, update_rate: float, src: str | None = None,
                 stdout: int | IO[bytes] = subprocess.DEVNULL) -> Sample:
        """A fresh slot; a run with nothing to do (startup); the signal; the measured run."""
        self.slots += 1
        slot = f"snap_{self.slots}"
        self.sql("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        argv = self._capture_argv(slot, chunk)
        env = self.capture_env if src is None else {**self.capture_env, "PYTHONPATH": src}
        startup, _, _, _ = run_usage(argv, env)
        self.sql("INSERT INTO dbz_signal VALUES (%s, 'execute-snapshot', %s)",
                 (f"bench-{self.slots}", json.dumps({"data-collections": ["public.t10"],
                                                     "type": "incremental"})))
        writer = None
        if update_rate > 0:
            writer = workload.PacedUpdates(
                lambda: sql_connection(self.dsn, autocommit=True), self.rows, update_rate,
                seed=self.slots)
            writer.start()
            writer.ready.wait()
        server = self.server.seconds()
        try:
            seconds, rss, cpu, err = run_usage(argv, env, stdout)
        finally:
            if writer is not None:
                writer.stop.set()
                writer.join()
        server = self.server.seconds() - server
        if "incremental snapshot of public.t10 finished" not in err:
            raise SystemExit(f"the snapshot did not finish:\n{err}")
        self.drop_slot(slot)
        if writer is not None:
            # The next measurement reads an equally tidy table (VACUUM alone leaves
            # the fresh table without column statistics).
            self.sql("VACUUM t10")
        return Sample(seconds, rss, cpu, server, startup,
                      writer.achieved if writer else None,
                      err.count("reading the chunk again"))

    def drop_slot(self, slot: str, timeout_s: float = 30.0) -> None:
        """Drop *slot* once its walsender has gone (it outlives the client briefly)."""
        deadline = time.monotonic() + timeout_s
        while self.sql("SELECT active FROM pg_replication_slots WHERE slot_name = %s",
                       (slot,))[0][0]:
            if time.monotonic() > deadline:
                raise SystemExit(f"slot {slot} still active {timeout_s:.0f} s after its "
                                 "client exited")
            time.sleep(0.02)
        self.sql("SELECT pg_drop_replication_slot(%s)", (slot,))

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
            raise SystemExit(f"verification failed ({self.database}): {reads:,} 'r' lines, "
                             f"{len(ids):,} distinct ids, expected {self.rows:,} of each")
        return sample.seconds, reads

    def build(self, *, analyzed: bool) -> None:
        workload.create_table(self.dsn)
        self.connect()
        if not analyzed:
            self.sql("ALTER TABLE t10 SET (autovacuum_enabled = false)")
        self.sql(workload.T10_FILL.format(rows=int(self.rows)))
        self.sql("CREATE TABLE dbz_signal (id varchar(42) PRIMARY KEY, "
                 "type varchar(32) NOT NULL, data varchar(2048) NULL)")
        self.sql(f"CREATE PUBLICATION {PUBLICATION} FOR TABLE t10, dbz_signal")
        if analyzed:
            # Hint bits, the visibility map and statistics set before anything runs.
            self.sql("VACUUM (FREEZE, ANALYZE) t10")
        else:
            self.sql("SELECT count(*) FROM t10")  # hint bits only: no statistics
        self.sql("CHECKPOINT")
        (size,) = self.sql("SELECT pg_size_pretty(pg_table_size('t10'))")[0]
        print(f"{self.database}: table t10, {self.rows:,} rows, {size}, "
              f"{self.statistics()} column statistics")

    def statistics(self) -> int:
        return int(self.sql("SELECT count(*) FROM pg_stats WHERE tablename = 't10'")[0][0])


def _fmt(values: list[float], digits: int = 0) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:,.{digits}f}"
    return (f"{statistics.median(values):,.{digits}f} "
            f"({min(values):,.{digits}f}-{max(values):,.{digits}f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="table rows")
    parser.add_argument("--chunk-size", type=int, action="append", dest="chunks",
                        help="incremental snapshot chunk size (repeatable; default 1024, "
                             "tidemark's default)")
    parser.add_argument("--update-rate", type=float, default=1000.0,
                        help="UPDATEs/s during the snapshot for the 'with updates' "
                             "contenders (0: leave them out)")
    parser.add_argument("--runs", type=int, default=2, help="measurements per contender")
    parser.add_argument("--baseline-src", help="also run each tidemark contender with "
                        "PYTHONPATH=this directory (another checkout's src)")
    parser.add_argument("--tables", choices=["both", "fresh", "analyzed"], default="both")
    args = parser.parse_args()
    chunks = args.chunks or [1024]
    databases = ["fresh", "analyzed"] if args.tables == "both" else [args.tables]
    codes: list[tuple[str, str | None]] = [("", None)]
    if args.baseline_src:
        codes = [(" [baseline]", str(Path(args.baseline_src).resolve())), ("", None)]

    contenders: list[Contender] = []
    for database in databases:
        contenders.append(Contender(f"{database}: COPY t10 TO STDOUT", database))
        for chunk in chunks:
            for label, src in codes:
                contenders.append(Contender(f"{database}: chunk {chunk}{label}", database,
                                            chunk, src=src))
                if args.update_rate > 0:
                    contenders.append(Contender(f"{database}: chunk {chunk}, updates{label}",
                                                database, chunk, args.update_rate, src))

    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    with PostgresCluster(durable=True) as cluster:
        print(f"server: PostgreSQL {cluster.server_version()}, {cluster.durability}")
        benches: dict[str, Bench] = {}
        t0 = time.perf_counter()
        for database in databases:
            benches[database] = Bench(cluster, database, args.rows)
            benches[database].build(analyzed=database == "analyzed")
        print(f"built in {time.perf_counter() - t0:.1f} s")
        for run in range(args.runs):
            order = contenders if run % 2 == 0 else contenders[::-1]
            for c in order:
                bench = benches[c.database]
                sample = bench.copy() if c.chunk is None else \
                    bench.snapshot(c.chunk, c.update_rate, c.src)
                c.samples.append(sample)
                extra = ""
                if sample.startup is not None:
                    extra += f", startup {sample.startup:.2f} s"
                if sample.updates_per_s is not None:
                    extra += f", {sample.updates_per_s:,.0f} updates/s achieved"
                if sample.rereads:
                    extra += f", {sample.rereads} chunk(s) read again"
                print(f"run {run + 1}: {c.name}: {sample.seconds:.2f} s, "
                      f"{args.rows / sample.seconds:,.0f} rows/s, CPU {sample.cpu:.2f} s, "
                      f"server CPU {sample.server_cpu:.2f} s, "
                      f"peak RSS {sample.rss / 2**20:.0f} MB{extra}", flush=True)
        for database, bench in benches.items():
            check_seconds, reads = bench.verify(chunks[0])
            print(f"check ({database}, unmeasured run, chunk {chunks[0]}, output to a file, "
                  f"{check_seconds:.1f} s): {reads:,} 'r' lines, every id once; "
                  f"{bench.statistics()} column statistics")
            bench.conn.close()
    load = os.getloadavg()

    print()
    print(f"rows/s: median over {args.runs} runs (min-max); ratio: median of the per-run "
          f"ratios to COPY of the same table in the same run; CPU: seconds, median (min-max)"
          f"; peak RSS: the largest of the runs")
    print(f"{'contender':<36}{'rows/s wall':>26}{'rows/s excl. startup':>26}{'ratio':>7}"
          f"{'CPU':>18}{'server CPU':>18}{'RSS':>7}{'updates/s':>22}")
    for c in contenders:
        copy = next(x for x in contenders if x.database == c.database and x.chunk is None)
        wall = [args.rows / s.seconds for s in c.samples]
        # A run shorter than the start-up it is compared with has no figure.
        net = [args.rows / (s.seconds - s.startup) for s in c.samples
               if s.startup is not None and s.seconds > s.startup]
        ratio = statistics.median(cs.seconds / s.seconds
                                  for s, cs in zip(c.samples, copy.samples, strict=True))
        updates = [s.updates_per_s for s in c.samples if s.updates_per_s is not None]
        print(f"{c.name:<36}{_fmt(wall):>26}{_fmt(net):>26}{ratio:>6.2f}x"
              f"{_fmt([s.cpu for s in c.samples], 2):>18}"
              f"{_fmt([s.server_cpu for s in c.samples], 2):>18}"
              f"{max(s.rss for s in c.samples) / 2**20:>5.0f}MB{_fmt(updates):>22}")
    startups = [s.startup for c in contenders for s in c.samples if s.startup is not None]
    if startups:
        print(f"startup (a --stop-at-end run with nothing to do): median "
              f"{statistics.median(startups):.2f} s ({min(startups):.2f}-{max(startups):.2f})")
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in load)}")
    print("targets (not measured here): >= 200k rows/s through tidemark capture, analyzed "
          "or not, with 1,000 updates/s; Debezium 3.6's incremental snapshot does about "
          "20k rows/s on these machines")


if __name__ == "__main__":
    main()
