"""Benchmark: a MariaDB incremental snapshot through ``tidemark capture`` against a plain
``SELECT`` of the table, same run (the MariaDB sibling of ``bench_snapshot.py``).

Builds the MariaDB form of table ``t10`` (``bench_mariadb.py``'s layout) with ``--rows``
rows in a private, durable MariaDB (its defaults: ``innodb_flush_log_at_trx_commit=1``,
``sync_binlog`` as the server has it) and measures, in the same run:

* ``mariadb -N -B -e 'SELECT * FROM t10'`` to /dev/null — the baseline (the server's own
  client reading the whole table in one statement);
* ``tidemark capture`` after an ``execute-snapshot`` signal (Debezium JSON lines to
  a pipe, where this script counts the ``op: "r"`` lines) at each ``--chunk-size``
  (default: tidemark's default): rows/s = table rows / wall time from process start to
  the last read line (then it is stopped with SIGTERM: a ``--baseline-src`` checkout
  older than the stopend branch has a ``--stop-at-end`` that stops at the binlog's end as
  it was at the start and leaves the snapshot to the next capture), and rows /
  (wall - startup), where startup is a ``--stop-at-end`` run with nothing to do from the
  same offsets, measured just before;
* the same with a writer doing single-row UPDATEs of random rows at ``--update-rate``
  per second (default 1,000; the achieved rate is printed);
* CPU seconds (user + sys) of the measured process and of the server (``mariadbd``).

With ``--baseline-src DIR`` each tidemark contender also runs with ``PYTHONPATH=DIR``
(another checkout's ``src``): before/after pairs in the same run. The contenders'
order is reversed every other run. One unmeasured run at the end writes its output to
a file and checks one ``op: "r"`` line per row and every id once.

Usage: ``uv run python benchmarks/bench_snapshot_mariadb.py [--rows 300000] [--runs 3]
[--baseline-src DIR]``
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

sys.path.insert(0, str(Path(__file__).parent))

import workload
from bench_mariadb import T10_DDL
from bench_snapshot import run_usage

from tidemark.testing.mariadb import MariaDbServer

FILL = """
INSERT INTO t10
SELECT seq, seq % 1000, seq * 1000003, CONCAT('row ', LPAD(seq, 16, '0')),
       (seq % 100000) / 100.0, TIMESTAMP'2024-01-01 00:00:00' + INTERVAL seq SECOND,
       seq % 2 = 0, CONCAT('label-', seq % 97), seq / 7.0,
       DATE'2024-01-01' + INTERVAL (seq % 365) DAY
FROM seq_1_to_{rows}
"""
SIGNAL_DDL = ("CREATE TABLE dbz_signal (id VARCHAR(42) PRIMARY KEY, type VARCHAR(32) NOT NULL, "
              "data VARCHAR(2048) NULL)")


@dataclass
class Sample:
    seconds: float
    cpu: float
    server_cpu: float
    rss: int
    startup: float | None = None
    updates_per_s: float | None = None


@dataclass
class Contender:
    name: str
    chunk: int | None = None  # None: the SELECT baseline
    update_rate: float = 0.0
    src: str | None = None
    samples: list[Sample] = field(default_factory=list)


class Bench:
    def __init__(self, server: MariaDbServer, rows: int, workdir: Path) -> None:
        self.server, self.rows, self.workdir = server, rows, workdir
        self.conn = server.connect("bench")
        with self.conn.cursor() as cur:
            cur.execute("SELECT @@pid_file")
            (pid_file,) = cur.fetchone()
        self.server_pid = int(Path(pid_file).read_text().split()[0])
        self.runs = 0

    def server_cpu(self) -> float:
        stat = Path(f"/proc/{self.server_pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")

    def select(self) -> Sample:
        argv = [shutil.which("mariadb") or "mariadb", "-h", self.server.host, "-P",
                str(self.server.port), "-u", self.server.user, "-N", "-B", "bench",
                "-e", "SELECT * FROM t10"]
        env = {**os.environ, "MYSQL_PWD": self.server.password}
        before = self.server_cpu()
        seconds, rss, cpu, _ = run_usage(argv, env)
        return Sample(seconds, cpu, self.server_cpu() - before, rss)

    def snapshot(self, chunk: int, update_rate: float, src: str | None = None,
                 keep: IO[bytes] | None = None) -> Sample:
        self.runs += 1
        offsets = self.workdir / f"offsets-{self.runs}.json"
        argv = [sys.executable, "-m", "tidemark", "--log-level", "INFO", "capture",
                "--table", "bench.t10", "--snapshot-mode", "no_data", "--offsets",
                str(offsets), "--signal-table", "bench.dbz_signal",
                "--incremental-snapshot-chunk-size", str(chunk)]
        env = {**os.environ, "TIDEMARK_DSN": self.server.dsn("bench")}
        if src is not None:
            env["PYTHONPATH"] = src
        # Starts at the binlog's end and saves it.
        startup, _, _, _ = run_usage([*argv, "--stop-at-end"], env)
        with self.conn.cursor() as cur:
            cur.execute("INSERT INTO dbz_signal VALUES (%s, 'execute-snapshot', %s)",
                        (f"bench-{self.runs}", json.dumps(
                            {"data-collections": ["bench.t10"], "type": "incremental"})))
        writer = None
        if update_rate > 0:
            writer = workload.PacedUpdates(lambda: self.server.connect("bench"), self.rows,
                                           update_rate, seed=self.runs)
            writer.start()
            writer.ready.wait()
        before = self.server_cpu()
        try:
            seconds, rss, cpu = _until_read(argv, env, self.rows, keep)
        finally:
            if writer is not None:
                writer.stop.set()
                writer.join()
        server = self.server_cpu() - before
        return Sample(seconds, cpu, server, rss, startup,
                      writer.achieved if writer else None)

    def verify(self, chunk: int) -> float:
        with tempfile.TemporaryFile(dir=self.workdir) as out:
            sample = self.snapshot(chunk, 0.0, keep=out)
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
        return sample.seconds


def _until_read(argv: list[str], env: dict[str, str], rows: int,
                keep: IO[bytes] | None = None) -> tuple[float, int, float]:
    """Run *argv* until its output holds *rows* reads, then stop it (SIGTERM): (seconds
    to that point, peak RSS bytes, CPU seconds of the whole run). *keep* gets the
    output."""
    with tempfile.TemporaryFile() as err:
        started = time.perf_counter()
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=err)
        assert proc.stdout is not None
        reads = 0
        tail = b""
        seconds = None
        while block := proc.stdout.read1(1 << 16):
            if keep is not None:
                keep.write(block)
            data = tail + block
            reads += data.count(b'"op":"r"')
            tail = data[-(len(b'"op":"r"') - 1):]
            if reads >= rows:
                seconds = time.perf_counter() - started
                proc.send_signal(signal.SIGTERM)
                break
        if keep is not None:
            keep.write(proc.stdout.read())
        else:
            proc.stdout.read()
        _, status, usage = os.wait4(proc.pid, 0)
        err.seek(0)
        text = err.read().decode(errors="replace")
    if seconds is None:
        raise SystemExit(f"the snapshot did not finish ({reads:,} reads):\n{text}")
    if "incremental snapshot of bench.t10 finished" not in text:
        raise SystemExit(f"{reads:,} reads but no end of the snapshot in the log:\n{text}")
    code = os.waitstatus_to_exitcode(status)
    if code not in (0, -signal.SIGTERM):
        raise SystemExit(f"capture failed ({code}):\n{text}")
    return seconds, usage.ru_maxrss * 1024, usage.ru_utime + usage.ru_stime


def _fmt(values: list[float], digits: int = 0) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:,.{digits}f}"
    return (f"{statistics.median(values):,.{digits}f} "
            f"({min(values):,.{digits}f}-{max(values):,.{digits}f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=300_000, help="table rows")
    parser.add_argument("--chunk-size", type=int, action="append", dest="chunks",
                        help="incremental snapshot chunk size (repeatable; default 1024)")
    parser.add_argument("--update-rate", type=float, default=1000.0,
                        help="UPDATEs/s for the 'updates' contenders (0: leave them out)")
    parser.add_argument("--runs", type=int, default=2, help="measurements per contender")
    parser.add_argument("--baseline-src", help="also run each tidemark contender with "
                        "PYTHONPATH=this directory (another checkout's src)")
    args = parser.parse_args()
    chunks = args.chunks or [1024]
    codes: list[tuple[str, str | None]] = [("", None)]
    if args.baseline_src:
        codes = [(" [baseline]", str(Path(args.baseline_src).resolve())), ("", None)]
    contenders = [Contender("SELECT * FROM t10 (mariadb)")]
    for chunk in chunks:
        for label, src in codes:
            contenders.append(Contender(f"chunk {chunk}{label}", chunk, src=src))
            if args.update_rate > 0:
                contenders.append(Contender(f"chunk {chunk}, updates{label}", chunk,
                                            args.update_rate, src))

    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    with MariaDbServer(durable=True) as server, \
            tempfile.TemporaryDirectory(prefix="tidemark-bench-") as workdir:
        print(f"server: MariaDB, {server.durability}")
        conn = server.connect()
        with contextlib.closing(conn), conn.cursor() as cur:
            cur.execute("CREATE DATABASE bench")
            cur.execute("USE bench")
            cur.execute(T10_DDL)
            cur.execute(SIGNAL_DDL)
            t0 = time.perf_counter()
            cur.execute(FILL.format(rows=int(args.rows)))
            cur.execute("SELECT data_length FROM information_schema.TABLES "
                        "WHERE table_schema = 'bench' AND table_name = 't10'")
            (size,) = cur.fetchone()
        print(f"table t10: {args.rows:,} rows, {size / 2**20:.0f} MB, built in "
              f"{time.perf_counter() - t0:.1f} s")
        bench = Bench(server, args.rows, Path(workdir))
        for run in range(args.runs):
            order = contenders if run % 2 == 0 else contenders[::-1]
            for c in order:
                sample = bench.select() if c.chunk is None else \
                    bench.snapshot(c.chunk, c.update_rate, c.src)
                c.samples.append(sample)
                extra = ""
                if sample.startup is not None:
                    extra += f", startup {sample.startup:.2f} s"
                if sample.updates_per_s is not None:
                    extra += f", {sample.updates_per_s:,.0f} updates/s achieved"
                print(f"run {run + 1}: {c.name}: {sample.seconds:.2f} s, "
                      f"{args.rows / sample.seconds:,.0f} rows/s, CPU {sample.cpu:.2f} s, "
                      f"server CPU {sample.server_cpu:.2f} s, peak RSS "
                      f"{sample.rss / 2**20:.0f} MB{extra}", flush=True)
        seconds = bench.verify(chunks[0])
        print(f"check (unmeasured run, chunk {chunks[0]}, output to a file, {seconds:.1f} s): "
              f"{args.rows:,} 'r' lines, every id once")
        bench.conn.close()
    load = os.getloadavg()

    print()
    print(f"rows/s: median over {args.runs} runs (min-max); ratio: median of the per-run "
          "ratios to the SELECT in the same run; CPU: seconds, median (min-max)")
    print(f"{'contender':<30}{'rows/s wall':>26}{'rows/s excl. startup':>26}{'ratio':>7}"
          f"{'CPU':>18}{'server CPU':>18}{'RSS':>7}{'updates/s':>22}")
    base = contenders[0]
    for c in contenders:
        wall = [args.rows / s.seconds for s in c.samples]
        net = [args.rows / (s.seconds - s.startup) for s in c.samples if s.startup is not None]
        ratio = statistics.median(b.seconds / s.seconds
                                  for s, b in zip(c.samples, base.samples, strict=True))
        updates = [s.updates_per_s for s in c.samples if s.updates_per_s is not None]
        print(f"{c.name:<30}{_fmt(wall):>26}{_fmt(net):>26}{ratio:>6.2f}x"
              f"{_fmt([s.cpu for s in c.samples], 2):>18}"
              f"{_fmt([s.server_cpu for s in c.samples], 2):>18}"
              f"{max(s.rss for s in c.samples) / 2**20:>5.0f}MB{_fmt(updates):>22}")
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in load)}")


if __name__ == "__main__":
    main()
