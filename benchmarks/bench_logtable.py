"""Benchmark: CDC log tables on PostgreSQL and SQLite — the write cost, the read scaling,
and ``tidemark run`` into Delta.

1. **Write cost.** The application's inserts and updates into a table with the log
   triggers against the same into an identical table without, alternating: in
   statements of 1,000 rows (bulk) and as single-row transactions (an application's
   usual write), ``--write-rows`` rows each.
2. **Read scaling.** A log pre-filled with ``--changes`` changes (default 5,000,000: half
   inserts, half updates of every inserted row, 16 groups, 256 streams) read to its end
   by ``tidemark capture --stop-at-end`` (Debezium JSON with cells, to /dev/null) as one
   task and as two tasks (two processes, ``--tasks 2 --task i``, timed until both
   finish); on PostgreSQL also the same changes through logical replication
   (``tidemark capture`` from a slot created before the fill, pgoutput) for comparison.
   Peak RSS per process (``wait4``).
3. **Into Delta.** ``tidemark run --available-now`` over a log of ``--pipeline-changes``
   changes (changes/s over the whole run, Spark's start included), and on PostgreSQL the
   commit→visible lag with a writer making ``--rate`` changes/s (transactions of 100)
   for ``--lag-seconds``: a probe row a second, read from Delta every 0.1 s (the soak's
   method, ``soak_pipeline.py``).

Runs of one contender alternate with the others; with ``--runs`` > 1 the table gives the
median. Usage: ``uv run python benchmarks/bench_logtable.py [--changes 5000000]
[--runs 1] [--write-rows 100000] [--skip-pipeline]``
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import soak_pipeline
import workload
from processes import run_measured

from tidemark.source.logtable import postgres_install, sqlite_install
from tidemark.testing.postgres import PostgresCluster, sql_connection

TABLE = "CREATE TABLE {name} (id bigint PRIMARY KEY, a integer, b text, c double precision)"
SQLITE_TABLE = "CREATE TABLE {name} (id INTEGER PRIMARY KEY, a INTEGER, b TEXT, c REAL)"
_CHUNK = 100_000


def _median(values: list[float]) -> float:
    return statistics.median(values)


# -- 1. write cost -----------------------------------------------------------------------
def _pg_writes(dsn: str, rows: int, single: int, runs: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    with contextlib.closing(sql_connection(dsn)) as conn:
        conn.autocommit = True
        cur = conn.cursor()
        for name in ("w_plain", "w_logged"):
            cur.execute(TABLE.format(name=name))
        postgres_install.install(conn, ["w_logged"])
        for run in range(runs):
            for name in ("w_plain", "w_logged"):
                base = run * (rows + single) * 2
                started = time.perf_counter()
                for lo in range(base, base + rows, 1000):
                    cur.execute(f"INSERT INTO {name} SELECT g, g %% 100, 'text ' || g, g * 0.5 "
                                "FROM generate_series(%s, %s) g", (lo, lo + 999))
                out.setdefault(f"{name} bulk insert", []).append(
                    rows / (time.perf_counter() - started))
                started = time.perf_counter()
                for lo in range(base, base + rows, 1000):
                    cur.execute(f"UPDATE {name} SET a = a + 1, b = 'changed' "
                                "WHERE id BETWEEN %s AND %s", (lo, lo + 999))
                out.setdefault(f"{name} bulk update", []).append(
                    rows / (time.perf_counter() - started))
                started = time.perf_counter()
                for key in range(base + rows, base + rows + single):
                    cur.execute(f"INSERT INTO {name} VALUES (%s, 1, 'one', 1.5)", (key,))
                out.setdefault(f"{name} single-row insert", []).append(
                    single / (time.perf_counter() - started))
                started = time.perf_counter()
                for key in range(base + rows, base + rows + single):
                    cur.execute(f"UPDATE {name} SET a = 2 WHERE id = %s", (key,))
                out.setdefault(f"{name} single-row update", []).append(
                    single / (time.perf_counter() - started))
    return out


def _sqlite_connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")  # WAL's usual setting for applications
    return conn


def _sqlite_writes(path: Path, rows: int, single: int, runs: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    conn = _sqlite_connect(path)
    for name in ("w_plain", "w_logged"):
        conn.execute(SQLITE_TABLE.format(name=name))
    sqlite_install.install(conn, ["w_logged"])
    for run in range(runs):
        for name in ("w_plain", "w_logged"):
            base = run * (rows + single) * 2
            started = time.perf_counter()
            for lo in range(base, base + rows, 1000):
                conn.execute("BEGIN")
                conn.execute(f"WITH RECURSIVE g(x) AS (SELECT ? UNION ALL SELECT x + 1 FROM g "
                             f"WHERE x < ?) INSERT INTO {name} SELECT x, x % 100, 'text ' || x, "
                             "x * 0.5 FROM g", (lo, lo + 999))
                conn.execute("COMMIT")
            out.setdefault(f"{name} bulk insert", []).append(
                rows / (time.perf_counter() - started))
            started = time.perf_counter()
            for lo in range(base, base + rows, 1000):
                conn.execute(f"UPDATE {name} SET a = a + 1, b = 'changed' WHERE id BETWEEN ? "
                             "AND ?", (lo, lo + 999))
            out.setdefault(f"{name} bulk update", []).append(
                rows / (time.perf_counter() - started))
            started = time.perf_counter()
            for key in range(base + rows, base + rows + single):
                conn.execute(f"INSERT INTO {name} VALUES (?, 1, 'one', 1.5)", (key,))
            out.setdefault(f"{name} single-row insert", []).append(
                single / (time.perf_counter() - started))
            started = time.perf_counter()
            for key in range(base + rows, base + rows + single):
                conn.execute(f"UPDATE {name} SET a = 2 WHERE id = ?", (key,))
            out.setdefault(f"{name} single-row update", []).append(
                single / (time.perf_counter() - started))
    conn.close()
    return out


def _print_writes(database: str, results: dict[str, list[float]]) -> None:
    print(f"\n{database}: the application's writes, rows/s (median)")
    print(f"{'write':<22}{'no log':>12}{'with log':>12}{'ratio':>8}")
    for what in ("bulk insert", "bulk update", "single-row insert", "single-row update"):
        plain = _median(results[f"w_plain {what}"])
        logged = _median(results[f"w_logged {what}"])
        print(f"{what:<22}{plain:>12,.0f}{logged:>12,.0f}{logged / plain:>7.2f}x")


# -- 2. read scaling ---------------------------------------------------------------------
def _fill_pg(dsn: str, changes: int) -> None:
    rows = changes // 2
    with contextlib.closing(sql_connection(dsn)) as conn:
        conn.autocommit = True
        cur = conn.cursor()
        for lo in range(1, rows + 1, _CHUNK):
            cur.execute("INSERT INTO events SELECT g, g %% 100, 'text ' || g, g * 0.5 FROM "
                        "generate_series(%s, %s) g", (lo, min(rows, lo + _CHUNK - 1)))
        for lo in range(1, rows + 1, _CHUNK):
            cur.execute("UPDATE events SET a = a + 1, b = 'changed' WHERE id BETWEEN %s AND %s",
                        (lo, lo + _CHUNK - 1))


def _fill_sqlite(path: Path, changes: int) -> None:
    rows = changes // 2
    conn = _sqlite_connect(path)
    for lo in range(1, rows + 1, _CHUNK):
        conn.execute("BEGIN")
        conn.execute("WITH RECURSIVE g(x) AS (SELECT ? UNION ALL SELECT x + 1 FROM g WHERE "
                     "x < ?) INSERT INTO events SELECT x, x % 100, 'text ' || x, x * 0.5 FROM g",
                     (lo, min(rows, lo + _CHUNK - 1)))
        conn.execute("COMMIT")
    for lo in range(1, rows + 1, _CHUNK):
        conn.execute("UPDATE events SET a = a + 1, b = 'changed' WHERE id BETWEEN ? AND ?",
                     (lo, lo + _CHUNK - 1))
    conn.close()


def _parallel(argvs: list[list[str]], env: dict[str, str]) -> tuple[float, int, list[int]]:
    """Run processes together; (seconds until the last exits, max peak RSS, delivered
    event counts from their logs)."""
    started = time.perf_counter()
    procs = [subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE) for argv in argvs]
    peaks, delivered = [], []
    for proc in procs:
        assert proc.stderr is not None
        err = proc.stderr.read().decode(errors="replace")
        _, status, usage = os.wait4(proc.pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"capture failed:\n{err}")
        peaks.append(usage.ru_maxrss * 1024)
        delivered.append(_delivered(err))
    return time.perf_counter() - started, max(peaks), delivered


def _delivered(log: str) -> int:
    match = re.search(r"delivered (\d+) change events", log)
    return int(match.group(1)) if match else -1


def _read(dsn: str, changes: int, runs: int, env: dict[str, str], *,
          pgoutput: Callable[[int], list[str]] | None) -> dict[str, list[tuple[float, int]]]:
    base = [sys.executable, "-m", "tidemark", "--log-level", "INFO", "capture", "--dsn", dsn,
            "--stop-at-end", "--retention-s", "-1"]
    if not dsn.startswith("sqlite:"):
        base += ["--source", "logtable"]
    out: dict[str, list[tuple[float, int]]] = {}
    for run in range(runs):
        for tasks in (1, 2):
            seconds, rss, delivered = _parallel(
                [[*base, "--tasks", str(tasks), "--task", str(i)] for i in range(tasks)], env)
            if sum(delivered) != changes:
                raise SystemExit(f"{tasks} task(s) delivered {delivered}, expected {changes}")
            out.setdefault(f"log tables, {tasks} task{'s' if tasks > 1 else ''}", []).append(
                (changes / seconds, rss))
        if pgoutput is not None:
            seconds, rss, err = run_measured(pgoutput(run), env)
            if _delivered(err) != changes:
                raise SystemExit(f"pgoutput delivered {_delivered(err)}, expected {changes}")
            out.setdefault("logical replication (pgoutput)", []).append((changes / seconds, rss))
        print(f"  run {run + 1}: " + ", ".join(f"{k} {v[-1][0]:,.0f}/s" for k, v in out.items()))
    return out


def _print_reads(database: str, changes: int, results: dict[str, list[tuple[float, int]]]
                 ) -> None:
    print(f"\n{database}: reading {changes:,} logged changes (median of runs)")
    print(f"{'contender':<36}{'changes/s':>12}{'peak RSS':>12}")
    for name, rows in results.items():
        print(f"{name:<36}{_median([r[0] for r in rows]):>12,.0f}"
              f"{max(r[1] for r in rows) / 2**20:>10.0f}MB")
    one = _median([r[0] for r in results["log tables, 1 task"]])
    two = _median([r[0] for r in results["log tables, 2 tasks"]])
    print(f"2 tasks / 1 task: {two / one:.2f}x (target >= 1.8x on 2 cores)")
    if "logical replication (pgoutput)" in results:
        wal = _median([r[0] for r in results["logical replication (pgoutput)"]])
        print(f"log tables (2 tasks) / pgoutput: {two / wal:.2f}x")


# -- 3. tidemark run ----------------------------------------------------------------------
def _pipeline_file(work: Path, dsn: str, tables: list[str], extra: str = "",
                   snapshot: str = "initial") -> Path:
    kind = "" if dsn.startswith("sqlite:") else 'kind = "logtable"\n'
    targets = "".join(f'[targets."{t}"]\npath = "{work}/lake/{t}"\nkeys = ["id"]\n'
                      f'snapshot = "{snapshot}"\n' for t in tables)
    file = work / "pipeline.toml"
    file.write_text(f'[source]\ndsn = "{dsn}"\n{kind}[spark]\ncheckpoint = "{work}/chk"\n'
                    f'conf = {{ "spark.ui.enabled" = "false" }}\n{extra}{targets}')
    return file


def _run_available_now(file: Path, changes: int) -> float:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    seconds, _, _ = run_measured([sys.executable, "-m", "tidemark", "run", str(file),
                                  "--available-now"], env)
    return changes / seconds


def _lag(cluster: PostgresCluster, seconds: float, rate: int) -> tuple[float, float, int]:
    dsn = cluster.create_database("lag")
    workload.fill_t10(dsn, 10_000, "CREATE TABLE probe (id int PRIMARY KEY, at timestamptz)")
    with contextlib.closing(sql_connection(dsn)) as conn:
        conn.autocommit = True
        postgres_install.install(conn, ["t10", "probe"])
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        file = _pipeline_file(work, dsn, ["public.t10", "public.probe"],
                              "trigger_interval_ms = 500\n")
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
        log = work / "run.log"
        with log.open("wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", "tidemark", "run", str(file)],
                                    env=env, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        try:
            lake = work / "lake/public.t10"
            deadline = time.monotonic() + 300
            while not lake.exists():
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"tidemark run did not start:\n{log.read_text()[-3000:]}")
                time.sleep(0.5)  # polling the first batch
            writer = soak_pipeline.Writer(dsn, 10_001, rate, "tail")
            probe = soak_pipeline.Probe(dsn, work / "lake/public.probe")
            writer.start()
            probe.start()
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                if proc.poll() is not None:
                    raise SystemExit(f"tidemark run stopped:\n{log.read_text()[-3000:]}")
                time.sleep(0.5)  # the measurement's duration
            writer.stop.set()
            probe.stop.set()
            writer.join()
            probe.join()
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 15)
            proc.wait(60)
    lags = sorted(lag for at, lag in probe.lags if at > probe.lags[0][0] + 10) \
        if probe.lags else []
    if not lags:
        raise SystemExit("no probe row became visible")
    p99 = lags[min(len(lags) - 1, int(len(lags) * 0.99))]
    return statistics.median(lags), p99, writer.changes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--changes", type=int, default=5_000_000)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--write-rows", type=int, default=100_000)
    parser.add_argument("--single-rows", type=int, default=10_000)
    parser.add_argument("--pipeline-changes", type=int, default=1_000_000)
    parser.add_argument("--rate", type=int, default=10_000)
    parser.add_argument("--lag-seconds", type=float, default=60)
    parser.add_argument("--skip-pipeline", action="store_true")
    args = parser.parse_args()

    with PostgresCluster(durable=True) as cluster, tempfile.TemporaryDirectory() as tmp:
        print(f"server: PostgreSQL, {cluster.durability}")
        work = Path(tmp)
        # 1. write cost
        pg_writes = _pg_writes(cluster.create_database("writes"), args.write_rows,
                               args.single_rows, args.runs)
        (work / "writes.db").touch()
        lite_writes = _sqlite_writes(work / "writes.db", args.write_rows, args.single_rows,
                                     args.runs)
        _print_writes("PostgreSQL", pg_writes)
        _print_writes("SQLite", lite_writes)

        # 2. read scaling
        dsn = cluster.create_database("bench")
        env = {**os.environ}
        with contextlib.closing(sql_connection(dsn)) as conn:
            conn.autocommit = True
            cur = conn.cursor()
            cur.execute(TABLE.format(name="events"))
            postgres_install.install(conn, ["events"])
            cur.execute("CREATE PUBLICATION bench FOR TABLE events")
            cur.execute("SELECT pg_create_logical_replication_slot('main', 'pgoutput')")
            started = time.perf_counter()
            _fill_pg(dsn, args.changes)
            print(f"\nPostgreSQL: {args.changes:,} changes logged in "
                  f"{time.perf_counter() - started:.0f} s")
            for run in range(args.runs):
                cur.execute("SELECT pg_copy_logical_replication_slot('main', %s)",
                            (f"copy_{run}",))

        def pgoutput(run: int) -> list[str]:
            return [sys.executable, "-m", "tidemark", "--log-level", "INFO", "capture",
                    "--dsn", dsn, "--table", "public.events", "--slot", f"copy_{run}",
                    "--publication", "bench", "--snapshot-mode", "no_data", "--stop-at-end"]

        pg_reads = _read(dsn, args.changes, args.runs, env, pgoutput=pgoutput)
        with contextlib.closing(sql_connection(dsn)) as conn:
            conn.autocommit = True
            conn.cursor().execute("SELECT pg_drop_replication_slot('main')")
        lite = work / "bench.db"
        conn_lite = _sqlite_connect(lite)
        conn_lite.execute(SQLITE_TABLE.format(name="events"))
        sqlite_install.install(conn_lite, ["events"])
        conn_lite.close()
        started = time.perf_counter()
        _fill_sqlite(lite, args.changes)
        print(f"SQLite: {args.changes:,} changes logged in {time.perf_counter() - started:.0f} s")
        lite_reads = _read(f"sqlite://{lite}", args.changes, args.runs, env, pgoutput=None)
        _print_reads("PostgreSQL", args.changes, pg_reads)
        _print_reads("SQLite", args.changes, lite_reads)
        lite.unlink()

        if args.skip_pipeline:
            return
        # 3. tidemark run
        print()
        for kind in ("PostgreSQL", "SQLite"):
            run_dir = work / f"run-{kind}"
            run_dir.mkdir()
            if kind == "PostgreSQL":
                source = cluster.create_database("pipeline")
                with contextlib.closing(sql_connection(source)) as conn:
                    conn.autocommit = True
                    conn.cursor().execute(TABLE.format(name="events"))
                    postgres_install.install(conn, ["events"])
                _fill_pg(source, args.pipeline_changes)
                table = "public.events"
            else:
                path = run_dir / "app.db"
                conn_lite = _sqlite_connect(path)
                conn_lite.execute(SQLITE_TABLE.format(name="events"))
                sqlite_install.install(conn_lite, ["events"])
                conn_lite.close()
                _fill_sqlite(path, args.pipeline_changes)
                source, table = f"sqlite://{path}", "main.events"
            # Every row came after the install: the log holds it all, no snapshot needed.
            file = _pipeline_file(run_dir, source, [table], snapshot="never")
            rate = _run_available_now(file, args.pipeline_changes)
            print(f"{kind}: tidemark run --available-now, {args.pipeline_changes:,} logged "
                  f"changes into Delta: {rate:,.0f} changes/s (Spark's start included)")
        p50, p99, written = _lag(cluster, args.lag_seconds, args.rate)
        print(f"PostgreSQL: commit->visible at {args.rate:,} changes/s for "
              f"{args.lag_seconds:.0f} s ({written:,} changes): p50 {p50:.2f} s, p99 {p99:.2f} s")


if __name__ == "__main__":
    main()
