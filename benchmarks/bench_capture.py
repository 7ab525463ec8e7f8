"""Benchmark: ``tidemark capture`` against ``pg_recvlogical`` on the same WAL, same run.

Builds the shared workload (table ``t10``, 300,000 changes in transactions of 100) in a
private PostgreSQL with a logical slot created before it, copies the slot once per
contender (``pg_copy_logical_replication_slot``) so each reads exactly the same
changes, and measures:

* ``pg_recvlogical`` (pgoutput, binary, to /dev/null) — the baseline;
* ``tidemark capture --stop-at-end`` (Debezium JSON lines to /dev/null);
* time from starting ``tidemark capture`` to its first event on stdout;
* peak RSS of each process (``wait4`` rusage).

Usage: ``uv run python benchmarks/bench_capture.py [--transactions 3000] [--runs 2]``
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import workload
from processes import first_line_seconds, run_measured

from tidemark.testing.postgres import PostgresCluster, sql_connection

PUBLICATION = "bench_pub"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--transactions", type=int, default=3000,
                        help="transactions of 100 changes (default 3000 = 300k changes)")
    parser.add_argument("--runs", type=int, default=2, help="measurements per contender")
    args = parser.parse_args()

    bindir = None
    with PostgresCluster(durable=True) as cluster:
        print(f"server: PostgreSQL, {cluster.durability}")
        bindir = cluster.bindir
        dsn = cluster.create_database("bench")
        workload.create_table(dsn)
        with contextlib.closing(sql_connection(dsn)) as conn:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute(f"CREATE PUBLICATION {PUBLICATION} FOR TABLE t10")
                cur.execute("SELECT pg_create_logical_replication_slot('main', 'pgoutput')")
                t0 = time.perf_counter()
                changes = workload.run_workload(dsn, args.transactions)
                print(f"workload: {changes:,} changes in {args.transactions:,} transactions "
                      f"built in {time.perf_counter() - t0:.1f} s")
                cur.execute("SELECT pg_current_wal_insert_lsn()::text, "
                            "pg_size_pretty(pg_current_wal_insert_lsn() - "
                            "(SELECT restart_lsn FROM pg_replication_slots "
                            "WHERE slot_name = 'main'))")
                end_lsn, wal_size = cur.fetchone()
                print(f"WAL to decode: {wal_size}")
                slots = [f"copy_{i}" for i in range(2 * args.runs + 1)]
                for name in slots:
                    cur.execute("SELECT pg_copy_logical_replication_slot('main', %s)", (name,))

        env = {**os.environ, "PGPASSWORD": cluster.password}
        env.pop("PGSERVICEFILE", None)
        recv = [str(Path(bindir) / "pg_recvlogical"), "-h", cluster.host, "-p",
                str(cluster.port), "-U", cluster.superuser, "-d", "bench", "--start",
                "-o", "proto_version=1", "-o", f"publication_names={PUBLICATION}",
                "-f", "/dev/null", "-E", end_lsn, "--no-loop"]
        capture_env = {**os.environ, "TIDEMARK_DSN": dsn}

        def capture(slot: str, *extra: str) -> list[str]:
            return [sys.executable, "-m", "tidemark", "--log-level", "INFO", "capture",
                    "--table", "public.t10", "--slot", slot, "--publication", PUBLICATION,
                    "--snapshot-mode", "no_data", *extra]

        results: dict[str, list[tuple[float, int]]] = {"pg_recvlogical": [], "tidemark": []}
        for run in range(args.runs):
            seconds, rss, _ = run_measured([*recv, "--slot", slots[2 * run]], env)
            results["pg_recvlogical"].append((changes / seconds, rss))
            seconds, rss, err = run_measured(capture(slots[2 * run + 1], "--stop-at-end"),
                                     capture_env)
            match = re.search(r"delivered (\d+) change events", err)
            delivered = int(match.group(1)) if match else -1
            if delivered != changes:
                raise SystemExit(f"tidemark delivered {delivered} events, expected {changes}")
            results["tidemark"].append((changes / seconds, rss))
            print(f"run {run + 1}: pg_recvlogical {results['pg_recvlogical'][-1][0]:,.0f}/s, "
                  f"tidemark {results['tidemark'][-1][0]:,.0f}/s")
        first = first_line_seconds(capture(slots[-1], "--max-events", "1"), capture_env)

    best = {name: max(r[0] for r in rows) for name, rows in results.items()}
    peak = {name: max(r[1] for r in rows) for name, rows in results.items()}
    print()
    print(f"{'contender':<28}{'changes/s (best)':>18}{'peak RSS':>12}")
    print(f"{'pg_recvlogical (baseline)':<28}{best['pg_recvlogical']:>18,.0f}"
          f"{peak['pg_recvlogical'] / 2**20:>10.0f}MB")
    print(f"{'tidemark capture (JSON)':<28}{best['tidemark']:>18,.0f}"
          f"{peak['tidemark'] / 2**20:>10.0f}MB")
    paired = sorted(t[0] / r[0] for t, r in zip(results["tidemark"], results["pg_recvlogical"],
                                               strict=True))
    print(f"ratio tidemark / pg_recvlogical: {best['tidemark'] / best['pg_recvlogical']:.2f}x "
          f"best vs best, {statistics.median(paired):.2f}x median of paired runs "
          f"({', '.join(f'{p:.2f}' for p in paired)}) (target >= 1.0x)")
    print(f"time from start to first event: {first:.3f} s (target <= 0.3 s)")
    print(f"tidemark peak RSS: {peak['tidemark'] / 2**20:.0f} MB (target <= 100 MB)")
    print("reference (not run here): Debezium 3.6.3 embedded, 15-20k events/s, "
          "2-4 s to first event, ~1 GB RSS")


if __name__ == "__main__":
    main()
