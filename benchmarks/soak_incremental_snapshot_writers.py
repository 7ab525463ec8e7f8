"""Soak: an incremental snapshot through ``tidemark capture`` beside a writer, many times.

Each run, in a fresh database of one private PostgreSQL: a table
``t (id int primary key, v text, n int)`` with ``--rows`` rows (default 300,000) freshly
loaded, a Debezium signal table, and a slot made by a first ``--stop-at-end`` capture.
Then ``tidemark capture --signal-table …`` runs while an ``execute-snapshot`` signal is
sent and a writer commits ``--transactions`` transactions (default 40), ``--gap-ms``
apart (default 50): transaction *i* updates ``v`` and ``n`` of every row with
``id % 997 = i`` and deletes one row; ``--busy-writers N`` more threads meanwhile update
single random rows as fast as they can (more commits in flight when a window opens).
Once the saved offset says the snapshot is done and
the stream has passed the writer's last commit, capture is stopped (SIGTERM) and the
table the events describe (reads and creates/updates upsert, deletes remove) is
compared with the source table.

A run "differs" when any row differs; for each differing row the events of that key are
printed with their positions. The issue this checks for: a chunk read in a snapshot that
did not yet see a transaction committed before its window opened, which hands on a row
older than a change already streamed.

The server runs with the test settings (``fsync``, ``full_page_writes`` and
``synchronous_commit`` off), the setting under which that race was seen; ``--production``
starts it with PostgreSQL's defaults instead.

Usage: ``uv run python benchmarks/soak_incremental_snapshot_writers.py [--runs 10]
[--rows 300000] [--transactions 40] [--gap-ms 50] [--busy-writers 0] [--production]``
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from tidemark.testing.postgres import PostgresCluster, sql_connection

SIGNALS = "public.dbz_signal"


def _execute(dsn: str, *statements: str, params: Any = None) -> None:
    with contextlib.closing(sql_connection(dsn)) as conn, conn.transaction(), conn.cursor() as cur:
        for statement in statements:
            cur.execute(statement, params)


def _query(dsn: str, statement: str) -> list[tuple[Any, ...]]:
    with contextlib.closing(sql_connection(dsn)) as conn, conn.cursor() as cur:
        cur.execute(statement)
        return list(cur.fetchall())


def _capture(dsn: str, offsets: Path, out: Any, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tidemark", "capture", "--table", "public.t", "--slot", "soak",
         "--snapshot-mode", "no_data", "--offsets", str(offsets), "--signal-table", SIGNALS,
         "--offset-flush-interval-ms", "0", "--progress-interval-s", "0", *args],
        stdout=out, stderr=subprocess.PIPE, env={**os.environ, "TIDEMARK_DSN": dsn})


def _writer(dsn: str, transactions: int, gap_s: float, done: list[int]) -> None:
    with contextlib.closing(sql_connection(dsn)) as conn:
        for i in range(transactions):
            with conn.transaction(), conn.cursor() as cur:
                cur.execute("UPDATE t SET v = %s, n = n + 1 WHERE id %% 997 = %s",
                            (f"u{i}", i))
                cur.execute("DELETE FROM t WHERE id = %s", (997 * 250 + i,))
            time.sleep(gap_s)
        with conn.cursor() as cur:
            cur.execute("SELECT pg_current_wal_insert_lsn() - '0/0'")
            row = cur.fetchone()
        assert row is not None
        done.append(int(row[0]))


def _busy_writer(dsn: str, rows: int, seed: int, stop: threading.Event) -> None:
    rng = random.Random(seed)
    with contextlib.closing(sql_connection(dsn)) as conn:
        conn.autocommit = True
        with conn.cursor() as cur:
            while not stop.is_set():
                cur.execute("UPDATE t SET v = %s, n = n + 1 WHERE id = %s",
                            (f"b{rng.random()}", rng.randint(1, rows)))


def _snapshot_done(offsets: Path, end_lsn: int) -> bool:
    try:
        saved = json.loads(offsets.read_text())
    except (OSError, ValueError):
        return False
    for offset in saved.values():
        tables = (offset.get("incremental_snapshot") or {}).get("tables") or []
        if not tables and int(offset.get("lsn", 0)) >= end_lsn:
            return True
    return False


def one_run(cluster: PostgresCluster, run: int, args: argparse.Namespace,
            workdir: Path) -> bool:
    """One snapshot beside the writer; True when the events equal the table."""
    name = f"soak{run}"
    with contextlib.closing(sql_connection(cluster.dsn("postgres"))) as conn:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE {name}")
    dsn = cluster.dsn(name)
    _execute(dsn, "CREATE TABLE t (id int PRIMARY KEY, v text, n int)",
             f"INSERT INTO t SELECT g, md5(g::text), g FROM generate_series(1, {args.rows}) g",
             "CREATE TABLE dbz_signal (id varchar(42) PRIMARY KEY, type varchar(32) NOT NULL,"
             " data varchar(2048) NULL)")
    offsets = workdir / f"{name}.offsets.json"
    first = _capture(dsn, offsets, subprocess.DEVNULL, "--stop-at-end")
    _, err = first.communicate(timeout=120)
    if first.returncode != 0:
        raise SystemExit(f"the first capture failed: {err.decode()}")
    output = workdir / f"{name}.jsonl"
    with output.open("wb") as out:
        proc = _capture(dsn, offsets, out)
        signal_data = json.dumps({"data-collections": ["public.t"], "type": "incremental"})
        _execute(dsn, "INSERT INTO dbz_signal VALUES ('soak', 'execute-snapshot', %s)",
                 params=(signal_data,))
        ended: list[int] = []
        writer = threading.Thread(target=_writer,
                                  args=(dsn, args.transactions, args.gap_ms / 1000, ended))
        stop = threading.Event()
        busy = [threading.Thread(target=_busy_writer, args=(dsn, args.rows, i, stop))
                for i in range(args.busy_writers)]
        started = time.monotonic()
        for thread in busy:
            thread.start()
        writer.start()
        writer.join()
        stop.set()
        for thread in busy:
            thread.join()
        with contextlib.closing(sql_connection(dsn)) as conn, conn.cursor() as cur:
            cur.execute("SELECT pg_current_wal_insert_lsn() - '0/0'")
            row = cur.fetchone()
        assert row is not None
        ended[0] = max(ended[0], int(row[0]))
        deadline = time.monotonic() + 600
        while not (ended and _snapshot_done(offsets, ended[0])):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"capture ended or stalled: {proc.stderr.read().decode()}"
                                 if proc.stderr else "capture ended or stalled")
            time.sleep(0.1)
        elapsed = time.monotonic() - started
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    table: dict[int, tuple[str, int]] = {}
    history: dict[int, list[str]] = {}
    for line in output.read_bytes().splitlines():
        value = json.loads(line)["value"]
        if value is None:
            continue
        row = value["after"] or value["before"]
        key = row["id"]
        history.setdefault(key, []).append(
            f"{value['op']} {value['after']} at {value['source'].get('lsn')}")
        if value["op"] == "d":
            table.pop(key, None)
        else:
            table[key] = (row["v"], row["n"])
    source = {i: (v, n) for i, v, n in _query(dsn, "SELECT id, v, n FROM t")}
    differing = sorted(k for k in source.keys() | table.keys() if source.get(k) != table.get(k))
    reads = sum(1 for h in history.values() for e in h if e.startswith("r "))
    print(f"run {run + 1}: {reads} reads in {elapsed:.1f} s, "
          f"{len(differing)} differing row(s)", flush=True)
    for key in differing[:5]:
        print(f"  id {key}: source {source.get(key)}, events say {table.get(key)}")
        for event in history.get(key, []):
            print(f"    {event}")
    with contextlib.closing(sql_connection(dsn)) as conn:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("SELECT pg_drop_replication_slot('soak')")
    output.unlink()
    return not differing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--transactions", type=int, default=40)
    parser.add_argument("--gap-ms", type=int, default=50)
    parser.add_argument("--busy-writers", type=int, default=0)
    parser.add_argument("--production", action="store_true",
                        help="PostgreSQL's durable defaults instead of the test settings")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, \
            PostgresCluster(durable=args.production) as cluster:
        version = _query(cluster.dsn("postgres"), "SHOW server_version")[0][0]
        print(f"server: PostgreSQL {version}, "
              f"{'production settings' if args.production else 'test settings (fsync off)'}")
        bad = sum(not one_run(cluster, run, args, Path(tmp)) for run in range(args.runs))
    print(f"{bad} of {args.runs} runs differ from the source")
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()
