"""Benchmark: the embedded engine.

1. Engine only: synthetic connector → identity transform → Debezium JSON → null consumer,
   records/s for 1, 2, 4, 8 workers in each delivery mode, median of ``--runs``. Baseline
   in the same runs: the same source, transform and converter in a plain loop without
   the engine (what the engine adds).
2. I/O-bound consumer (1 ms per record, like a network write): 16 workers in modes
   ``async`` (c) and ``per_key`` (d) against ``ordered`` (b), and the ceiling of this
   machine in the same run: the same sleeps in 16 bare threads without the engine (a
   1 ms sleep takes 1.3-1.6 ms on these VMs, and 16 threads sleeping at once do not
   reach 16x of one).
3. End to end on the foundation workload (300k changes): PostgreSQL → engine (batch
   mode, Debezium JSON) → null consumer, with one worker and with ``--e2e-workers``
   (default: the machine's cores), against ``tidemark capture --stop-at-end`` to
   /dev/null and ``pg_recvlogical`` on copies of the same slot, with peak RSS, ``--runs``
   times (capture and the engines take turns at going first); the ratios engine /
   capture and N workers / 1 worker as the median of the runs and of all runs together
   (total time).

Usage: ``uv run python benchmarks/bench_engine.py [--runs 3] [--skip-e2e | --e2e-only]
[--e2e-workers N]``
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import workload

from tidemark.engine.consumers import BatchCommitter
from tidemark.engine.converters import ConvertedRecord, DebeziumJsonConverter
from tidemark.engine.delivery import Pipeline
from tidemark.engine.engine import Engine
from tidemark.engine.records import ChangeRecord
from tidemark.offsets.memory import MemoryOffsetStore
from tidemark.source.postgres.task import PostgresConnector
from tidemark.source.synthetic import SyntheticConnector
from tidemark.testing.postgres import PostgresCluster, sql_connection

MODES = ["batch", "ordered", "async", "per_key"]


def identity(record: ChangeRecord) -> ChangeRecord:
    return record


class NullBatch:
    def handle_batch(self, records: list[ConvertedRecord], committer: BatchCommitter) -> None:
        pass


def null_record(record: ConvertedRecord) -> None:
    pass


def engine_rate(mode: str, workers: int, records: int, transforms: bool = True) -> float:
    connector = SyntheticConnector(total=records, batch_size=2048)
    consumer: Any = NullBatch() if mode == "batch" else null_record
    engine = Engine(connector, consumer, transforms=[identity] if transforms else [],
                    config={"delivery_mode": mode, "worker_count": workers,
                            "max_in_flight": 20_000})
    started = time.perf_counter()
    engine.run()
    return records / (time.perf_counter() - started)


def plain_loop_rate(records: int) -> float:
    """The source, the transform and the converter without the engine: the engine's
    own code for a batch (``Pipeline.convert``) called in a loop."""
    connector = SyntheticConnector(total=records, batch_size=2048)
    task = connector.create_task({"index": 0})
    task.start(MemoryOffsetStore())
    pipeline = Pipeline([identity], DebeziumJsonConverter(), None, 1)
    started = time.perf_counter()
    while True:
        batch = task.poll()
        pipeline.convert(batch.records)
        if batch.finished:
            break
    return records / (time.perf_counter() - started)


def io_bound_rate(mode: str, workers: int, records: int) -> float:
    def slow(record: ConvertedRecord) -> None:
        time.sleep(0.001)

    connector = SyntheticConnector(total=records, batch_size=256)
    engine = Engine(connector, slow, config={"delivery_mode": mode, "worker_count": workers})
    started = time.perf_counter()
    engine.run()
    return records / (time.perf_counter() - started)


def bare_threads_rate(threads: int, records: int) -> float:
    """Records/s of *threads* plain threads that each sleep 1 ms per record."""
    def sleeper() -> None:
        for _ in range(records // threads):
            time.sleep(0.001)

    pool = [threading.Thread(target=sleeper) for _ in range(threads)]
    started = time.perf_counter()
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    return records // threads * threads / (time.perf_counter() - started)


def engine_only(records: int, runs: int) -> None:
    """Part 1, *runs* times over (this machine's speed drifts by tens of percent within
    a minute): every mode and worker count, and the no-engine loop, in each run."""
    print(f"1. engine only: {records:,} synthetic records, identity transform, "
          f"Debezium JSON, null consumer (records/s, median of {runs} runs)")
    cells = [(mode, workers) for mode in MODES for workers in (1, 2, 4, 8)]
    rates: dict[tuple[str, int], list[float]] = {cell: [] for cell in cells}
    baselines = []
    for _ in range(runs):
        baselines.append(plain_loop_rate(records))
        for mode, workers in cells:
            rates[(mode, workers)].append(engine_rate(mode, workers, records))
    baseline = statistics.median(baselines)
    print(f"   baseline, no engine (source + transform + JSON in a loop): {baseline:,.0f} "
          f"({', '.join(f'{rate:,.0f}' for rate in baselines)})")
    print(f"{'mode':<10}" + "".join(f"{f'{w} worker' + ('s' if w > 1 else ''):>14}"
                                    for w in (1, 2, 4, 8)))
    for mode in MODES:
        print(f"{mode:<10}" + "".join(f"{statistics.median(rates[(mode, w)]):>14,.0f}"
                                      for w in (1, 2, 4, 8)))
    best = max(cells, key=lambda cell: statistics.median(rates[cell]))
    best_rate = statistics.median(rates[best])
    print(f"best: {best[0]} with {best[1]} worker(s), {best_rate:,.0f} records/s "
          f"(runs: {', '.join(f'{rate:,.0f}' for rate in rates[best])}) = "
          f"{best_rate / baseline:.2f}x the no-engine loop (target >= 300,000)")


def end_to_end(transactions: int, runs: int, workers: int) -> None:
    with PostgresCluster(durable=True) as cluster:
        print(f"server: PostgreSQL, {cluster.durability}")
        dsn = cluster.create_database("bench")
        workload.create_table(dsn)
        with contextlib.closing(sql_connection(dsn)) as conn:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute("CREATE PUBLICATION bench_pub FOR TABLE t10")
                cur.execute("SELECT pg_create_logical_replication_slot('main', 'pgoutput')")
                changes = workload.run_workload(dsn, transactions)
                cur.execute("SELECT pg_current_wal_insert_lsn()::text, "
                            "(pg_current_wal_insert_lsn() - '0/0')::bigint")
                end_text, end_lsn = cur.fetchone()
                for i in range(4 * runs):
                    cur.execute("SELECT pg_copy_logical_replication_slot('main', %s)",
                                (f"copy_{i}",))
        env = {**os.environ, "PGPASSWORD": cluster.password, "TIDEMARK_DSN": dsn}
        recv = [str(Path(cluster.bindir) / "pg_recvlogical"), "-h", cluster.host, "-p",
                str(cluster.port), "-U", cluster.superuser, "-d", "bench", "--start",
                "-o", "proto_version=1", "-o", "publication_names=bench_pub",
                "-f", "/dev/null", "-E", end_text, "--no-loop"]
        print(f"\n3. end to end: {changes:,} changes (transactions of 100)")
        print(f"{'run':<5}{'pg_recvlogical':>16}{'capture':>12}{'engine':>12}"
              f"{'engine/capture':>16}{'engine RSS':>12}{'CPU s capture':>15}"
              f"{'CPU s engine':>14}{'CPU ratio':>11}{f'engine x{workers}':>14}"
              f"{f'x{workers} / x1':>10}")
        ratios = []
        cpu_ratios = []
        scaling = []
        seconds = [0.0, 0.0, 0.0]  # wall time of capture and the engines, over all runs
        cpu_total = [0.0, 0.0]  # their user + system seconds
        expect = str(changes + workload.deletes(transactions))
        for run in range(runs):
            commands = [
                [*recv, "--slot", f"copy_{4 * run}"],
                [sys.executable, "-m", "tidemark", "capture", "--table", "public.t10",
                 "--slot", f"copy_{4 * run + 1}", "--publication", "bench_pub",
                 "--snapshot-mode", "no_data", "--stop-at-end"],
                [sys.executable, __file__, "--e2e-child", f"copy_{4 * run + 2}",
                 "--stop-at", str(end_lsn), "--expect", expect],
                [sys.executable, __file__, "--e2e-child", f"copy_{4 * run + 3}",
                 "--stop-at", str(end_lsn), "--expect", expect,
                 "--workers", str(workers)],
            ]
            # Capture and the engines take turns at going first, so that a drift of the
            # machine's speed within a run does not always favour the same one.
            order = [0, *[[1, 2, 3], [2, 3, 1], [3, 1, 2]][run % 3]]
            measured: dict[int, tuple[float, float, int]] = {}
            for i in order:
                argv = commands[i]
                started = time.perf_counter()
                proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL)
                _, status, usage = os.wait4(proc.pid, 0)
                if os.waitstatus_to_exitcode(status) != 0:
                    raise SystemExit(f"{argv[:3]} failed")
                measured[i] = (changes / (time.perf_counter() - started),
                               usage.ru_utime + usage.ru_stime, usage.ru_maxrss // 1024)
            rates = [measured[i][0] for i in range(4)]
            cpu = [measured[i][1] for i in range(4)]
            rss = measured[2][2]
            seconds[0] += changes / rates[1]
            seconds[1] += changes / rates[2]
            seconds[2] += changes / rates[3]
            cpu_total[0] += cpu[1]
            cpu_total[1] += cpu[2]
            ratios.append(rates[2] / rates[1])
            cpu_ratios.append(cpu[1] / cpu[2])
            scaling.append(rates[3] / rates[2])
            print(f"{run + 1:<5}{rates[0]:>16,.0f}{rates[1]:>12,.0f}{rates[2]:>12,.0f}"
                  f"{ratios[-1]:>15.2f}x{rss:>10} MB{cpu[1]:>15.2f}{cpu[2]:>14.2f}"
                  f"{cpu_ratios[-1]:>10.2f}x{rates[3]:>14,.0f}{scaling[-1]:>9.2f}x")
        print(f"engine / capture: best {max(ratios):.2f}x, "
              f"median {statistics.median(ratios):.2f}x, "
              f"all runs together {seconds[0] / seconds[1]:.2f}x (target >= 0.9x); "
              f"by CPU time (less sensitive to other load on the machine): "
              f"median {statistics.median(cpu_ratios):.2f}x, "
              f"all runs together {cpu_total[0] / cpu_total[1]:.2f}x")
        print(f"engine, {workers} workers / 1 worker: median {statistics.median(scaling):.2f}x, "
              f"all runs together {seconds[1] / seconds[2]:.2f}x")


def e2e_child(slot: str, stop_at: int, expect: int, table: str = "public.t10",
              workers: int = 1) -> None:
    """The engine (*workers* workers) on *slot* (publication ``bench_pub``) until
    *stop_at*, checking that it delivered *expect* records of *table*."""
    count = [0]

    class Counter:
        """A null consumer that still checks the count of records (change events and
        the tombstones after deletes)."""

        def handle_batch(self, records: list[ConvertedRecord],
                         committer: BatchCommitter) -> None:
            count[0] += len(records)

    connector = PostgresConnector(
        {"dsn": os.environ["TIDEMARK_DSN"], "table_include_list": [table],
         "slot_name": slot, "publication_name": "bench_pub", "snapshot_mode": "no_data"},
        stop_at_lsn=stop_at)
    Engine(connector, Counter(),
           config={"delivery_mode": "batch", "worker_count": workers}).run()
    if count[0] != expect:
        raise SystemExit(f"engine delivered {count[0]} records, expected {expect}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=300_000)
    # Enough for about 2 s at 16 workers: with a few thousand records the run lasts
    # 0.2-0.4 s and measures the engine's start and stop more than its throughput.
    parser.add_argument("--io-records", type=int, default=20_000)
    parser.add_argument("--transactions", type=int, default=3_000)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--skip-e2e", action="store_true")
    parser.add_argument("--e2e-only", action="store_true", help="run only part 3")
    parser.add_argument("--e2e-child", help=argparse.SUPPRESS)
    parser.add_argument("--stop-at", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--expect", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--workers", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--e2e-workers", type=int, default=os.cpu_count() or 2,
                        help="workers of the end-to-end engine compared with one")
    args = parser.parse_args()
    if args.e2e_child:
        e2e_child(args.e2e_child, args.stop_at, args.expect, workers=args.workers)
        return
    if args.e2e_only:
        end_to_end(args.transactions, args.runs, args.e2e_workers)
        return

    engine_only(args.records, args.runs)
    print(f"peak RSS so far: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024} MB")

    print(f"\n2. I/O-bound consumer, 1 ms per record, {args.io_records:,} records")
    ordered = io_bound_rate("ordered", 1, args.io_records // 8)
    print(f"   ordered (b), one consumer thread: {ordered:,.0f} records/s (baseline)")
    ceiling = bare_threads_rate(16, args.io_records)
    print(f"   16 bare threads sleeping 1 ms, no engine: {ceiling:,.0f} records/s = "
          f"{ceiling / ordered:.1f}x (this machine's ceiling)")
    for mode in ("async", "per_key"):
        rate = io_bound_rate(mode, 16, args.io_records)
        print(f"   {mode:<8} 16 workers: {rate:,.0f} records/s = {rate / ordered:.1f}x "
              f"(target >= 12x), {rate / ceiling:.2f} of the bare threads")

    if not args.skip_e2e:
        end_to_end(args.transactions, args.runs, args.e2e_workers)


if __name__ == "__main__":
    main()
