"""Benchmark: what a Spark source batch's reads cost with the slot's restart point kept
close (:mod:`tidemark.source.postgres.restart_point`) and without.

A durable PostgreSQL (16 or later: the PostgreSQL 18 wheel) holds ``t10`` with ``--rows``
rows; a writer makes ``--rate`` changes/s in transactions of 100 (60 inserts, 30 updates
and 10 deletes of uniformly random keys, as ``soak_pipeline.py --keys uniform``). Every
0.5 s a batch is read as the source reads it, through its own functions
(``tidemark.source.postgres.wal_reads``): its end (``readable_end``), a copy of the slot
positioned at its start whose scan counts its changes (what sizing a batch and each
partition's peek decode), then the slot advanced to its end (the commit). The two
contenders alternate in phases of ``--phase`` seconds, ``--phases`` in all: the server's
own records of its running transactions only (every 15 s), and one logged as each
batch's end is chosen (``RestartPoints``). Per contender: the median gap from the slot's
``restart_lsn`` to its position, the median seconds of the copy and scan and of the
advance, and their ratios. With ``--checkpoint`` a ``CHECKPOINT`` starts each phase:
the full-page images that follow it fill the WAL, as in the 30-minute soak.

Usage: ``uv run --frozen python benchmarks/bench_slot_restart.py [--rows 1000000]
[--rate 10000] [--phase 30] [--phases 6] [--checkpoint]``
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import psycopg
import workload
from soak_pipeline import Writer

from tidemark.source.postgres import wal_reads as wal
from tidemark.source.postgres.restart_point import RestartPoints
from tidemark.testing.postgres import PostgresCluster, sql_connection

_SLOT, _PUBLICATION = "bench", "bench"
_BATCH_S = 0.5


def _gap(conn: psycopg.Connection[Any], slot: str) -> int:
    """How far the slot's restart_lsn is behind its confirmed position, in bytes."""
    row = conn.execute(
        "SELECT (confirmed_flush_lsn - restart_lsn)::bigint FROM pg_replication_slots "
        "WHERE slot_name = %s", (slot,)).fetchone()
    assert row is not None
    return int(row[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rate", type=int, default=10_000)
    parser.add_argument("--phase", type=float, default=30)
    parser.add_argument("--phases", type=int, default=6)
    parser.add_argument("--checkpoint", action="store_true")
    args = parser.parse_args()
    with PostgresCluster(durable=True) as cluster:
        print(f"server: PostgreSQL, {cluster.durability}")
        dsn = cluster.create_database("bench")
        workload.fill_t10(dsn, args.rows, f"CREATE PUBLICATION {_PUBLICATION} FOR TABLE t10")
        conn = wal.connect(dsn, purpose="bench")
        start = wal.ensure_slot(conn, _SLOT)
        writer = Writer(dsn, args.rows + 1, args.rate, "uniform")
        writer.start()
        modes = ("server's records", "a record per batch")
        gaps: dict[str, list[int]] = {m: [] for m in modes}
        reads: dict[str, list[float]] = {m: [] for m in modes}
        advances: dict[str, list[float]] = {m: [] for m in modes}
        changes: dict[str, list[int]] = {m: [] for m in modes}
        try:
            for phase in range(args.phases):
                mode = modes[phase % 2]
                points = RestartPoints() if phase % 2 else None
                if args.checkpoint:
                    with contextlib.closing(sql_connection(dsn, autocommit=True)) as admin:
                        admin.execute("CHECKPOINT")
                ends = time.monotonic() + args.phase
                due = time.monotonic()
                while time.monotonic() < ends:
                    due += _BATCH_S
                    time.sleep(max(0.0, due - time.monotonic()))  # the trigger's pace
                    if writer.error is not None:
                        raise SystemExit(f"the writer failed: {writer.error}")
                    end = wal.readable_end(conn, _SLOT)
                    if points is not None and points.due(end):
                        points.log_record(conn)
                    gap = _gap(conn, _SLOT)
                    began = time.perf_counter()
                    with wal.slot_copy_at(conn, _SLOT, start) as copy:
                        txns, _ = wal.scan(conn, copy, _PUBLICATION, end, 10_000_000)
                    read = time.perf_counter() - began
                    began = time.perf_counter()
                    wal.advance_slot(conn, _SLOT, end)
                    advance = time.perf_counter() - began
                    start = end
                    if phase >= 2:  # the first two phases warm up
                        gaps[mode].append(gap)
                        reads[mode].append(read)
                        advances[mode].append(advance)
                        changes[mode].append(sum(t.changes for t in txns))
                print(f"phase {phase + 1} ({mode}) done", flush=True)
        finally:
            writer.stop.set()
            writer.join()
            conn.close()
        for mode in modes:
            print(f"{mode}: {len(reads[mode])} batches of {statistics.median(changes[mode]):,.0f}"
                  f" changes (median); restart_lsn {statistics.median(gaps[mode]) / 2**20:.1f}"
                  f" MiB behind the slot; copy + scan {statistics.median(reads[mode]):.3f} s"
                  f", advance {statistics.median(advances[mode]):.3f} s")
        before, after = modes
        print(f"a record per batch / the server's: copy + scan "
              f"{statistics.median(reads[after]) / statistics.median(reads[before]):.2f}x, "
              f"advance "
              f"{statistics.median(advances[after]) / statistics.median(advances[before]):.2f}x")


if __name__ == "__main__":
    main()
