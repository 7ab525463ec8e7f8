"""Benchmark: one huge transaction (a bulk load) through capture, the engine and ``tidemark run``.

A single ``INSERT … SELECT`` of ``--rows`` rows (default 10,000,000; about 1 GB of WAL)
into ``big (id bigint PRIMARY KEY, v text, n integer)`` in a private PostgreSQL, read from
copies of one slot made before it, with default settings everywhere:

* ``pg_recvlogical`` to /dev/null — the baseline: the server's decoding and the wire;
* ``tidemark capture --stop-at-end`` (Debezium JSON lines to /dev/null);
* the embedded engine (batch mode, Debezium JSON, a counting consumer that checks the
  count);
* ``tidemark run --available-now`` into a new Delta table (``local[2]``), checked after the
  run: the table holds every row, and the transaction is one Delta commit.

Each prints changes/s (rows / wall time from process start to exit) and its ratio to the
baseline of the same run, and peak RSS: capture and the engine from ``wait4``; for
``tidemark run`` the Python driver, Spark's JVM (executors included in local mode) and the
Python workers, sampled every 0.1 s. One run per contender: each takes minutes at 10M.

``--source mariadb``: the same bulk load (``INSERT … SELECT`` from ``seq_1_to_N``) in a
private MariaDB, read from the binlog by ``mariadb-binlog -v`` (the baseline) and by
``tidemark capture --stop-at-end`` with default settings, which must deliver every row.

Usage: ``uv run python benchmarks/bench_big_transaction.py [--rows 10000000]
[--skip-run] [--skip-engine] [--source mariadb]``
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

from deltalake import DeltaTable

sys.path.insert(0, str(Path(__file__).parent))

from bench_engine import e2e_child
from bench_pipeline_snapshot import run_pipeline
from processes import run_measured

from tidemark.lake.delta_read import live_rows
from tidemark.source.mariadb import client
from tidemark.testing.mariadb import MariaDbServer
from tidemark.testing.postgres import PostgresCluster, sql_connection

_SLOTS = ("recv", "capture", "engine", "run")


def _mib(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB"


def _write_pipeline(dsn: str, work: Path) -> Path:
    file = work / "pipeline.toml"
    file.write_text(
        f'[source]\ndsn = "{dsn}"\nslot = "run"\npublication = "bench_pub"\n'
        '[spark]\ncheckpoint = "chk"\navailable_now = true\n'
        'conf = { "spark.ui.enabled" = "false" }\n'
        '[targets."public.big"]\npath = "lake"\nkeys = ["id"]\nsnapshot = "never"\n')
    return file


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--skip-run", action="store_true", help="no tidemark run")
    parser.add_argument("--skip-engine", action="store_true", help="no embedded engine")
    parser.add_argument("--source", choices=("postgres", "mariadb"), default="postgres")
    parser.add_argument("--engine-child", help=argparse.SUPPRESS)
    parser.add_argument("--stop-at", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--expect", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.engine_child:
        e2e_child(args.engine_child, args.stop_at, args.expect, table="public.big")
        return
    rows = args.rows
    if args.source == "mariadb":
        _mariadb(rows)
        return
    with PostgresCluster(durable=True) as cluster, tempfile.TemporaryDirectory() as tmp:
        print(f"server: PostgreSQL, {cluster.durability}")
        dsn = cluster.create_database("bench")
        with contextlib.closing(sql_connection(dsn)) as conn:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute("CREATE TABLE big (id bigint PRIMARY KEY, v text, n integer)")
                cur.execute("CREATE PUBLICATION bench_pub FOR TABLE big")
                for slot in _SLOTS:
                    cur.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')",
                                (slot,))
                started = time.perf_counter()
                cur.execute("INSERT INTO big SELECT g, 'value ' || lpad(g::text, 12, '0'), "
                            f"g % 1000 FROM generate_series(1, {rows}) g")
                insert_s = time.perf_counter() - started
                cur.execute("SELECT pg_current_wal_insert_lsn()::text, "
                            "(pg_current_wal_insert_lsn() - '0/0')::bigint, "
                            "pg_wal_lsn_diff(pg_current_wal_insert_lsn(), "
                            "(SELECT restart_lsn FROM pg_replication_slots "
                            "WHERE slot_name = 'recv'))")
                end_text, end_lsn, wal_bytes = cur.fetchone()
        print(f"one transaction of {rows:,} inserts ({_mib(float(wal_bytes))} of WAL, "
              f"written in {insert_s:.0f} s); one run per contender, default settings")
        env = {**os.environ, "PGPASSWORD": cluster.password, "TIDEMARK_DSN": dsn}
        recv = [str(Path(cluster.bindir) / "pg_recvlogical"), "-h", cluster.host, "-p",
                str(cluster.port), "-U", cluster.superuser, "-d", "bench", "--start",
                "-o", "proto_version=1", "-o", "publication_names=bench_pub",
                "-f", "/dev/null", "-E", end_text, "--no-loop", "--slot", "recv"]
        base_s, base_rss, _ = run_measured(recv, env)
        base = rows / base_s
        print(f"  {'pg_recvlogical (baseline)':<28}{base:>12,.0f} changes/s "
              f"({base_s:.0f} s), peak RSS {_mib(base_rss)}")
        capture = [sys.executable, "-m", "tidemark", "capture", "--table", "public.big",
                   "--slot", "capture", "--publication", "bench_pub",
                   "--snapshot-mode", "no_data", "--stop-at-end"]
        seconds, rss, _ = run_measured(capture, env)
        print(f"  {'tidemark capture (JSON)':<28}{rows / seconds:>12,.0f} changes/s "
              f"({seconds:.0f} s, {rows / seconds / base:.2f}x baseline), peak RSS "
              f"{_mib(rss)}")
        if not args.skip_engine:
            engine = [sys.executable, __file__, "--engine-child", "engine",
                      "--stop-at", str(end_lsn), "--expect", str(rows)]
            seconds, rss, _ = run_measured(engine, env)
            print(f"  {'embedded engine (JSON)':<28}{rows / seconds:>12,.0f} changes/s "
                  f"({seconds:.0f} s, {rows / seconds / base:.2f}x baseline), peak RSS "
                  f"{_mib(rss)}")
        if not args.skip_run:
            seconds, peaks, log = run_pipeline(_write_pipeline(dsn, Path(tmp)),
                                               "--log-level", "INFO")
            lake = Path(tmp) / "lake"
            table = DeltaTable(str(lake))
            delta_rows = live_rows(table).count_rows()
            if delta_rows != rows:
                raise SystemExit(f"Delta holds {delta_rows} rows, the transaction {rows}")
            commits = [c.get("operation") for c in table.history()
                       if c.get("operation") != "CREATE TABLE"]
            steps = "applied in steps" if "in steps" in log else "collected whole"
            print(f"  {'tidemark run local[2]':<28}{rows / seconds:>12,.0f} changes/s "
                  f"({seconds:.0f} s with Spark's start, {rows / seconds / base:.2f}x "
                  f"baseline; {steps}, Delta commits after CREATE TABLE: {', '.join(commits)}) | "
                  f"peak RSS: driver "
                  f"{_mib(peaks.driver)}, JVM {_mib(peaks.jvm)}, Python workers "
                  f"{_mib(peaks.workers)}")


def _mariadb(rows: int) -> None:
    binlog_tool = shutil.which("mariadb-binlog") or shutil.which("mysqlbinlog")
    if binlog_tool is None:
        raise SystemExit("mariadb-binlog not found: install mariadb-client")
    with MariaDbServer(durable=True, settings={"max-binlog-size": "1G"}) as server, \
            tempfile.TemporaryDirectory() as tmp:
        print(f"server: MariaDB, {server.durability}")
        conn = server.connect()
        with contextlib.closing(conn), conn.cursor() as cur:
            cur.execute("CREATE DATABASE bench")
            cur.execute("USE bench")
            cur.execute("CREATE TABLE big (id BIGINT PRIMARY KEY, v TEXT, n INT)")
            start = client.current_position(conn)
            started = time.perf_counter()
            cur.execute(f"INSERT INTO big SELECT seq, CONCAT('value ', LPAD(seq, 12, '0')), "
                        f"seq % 1000 FROM seq_1_to_{rows}")
            conn.commit()
            insert_s = time.perf_counter() - started
            end = client.current_position(conn)
        print(f"one transaction of {rows:,} inserts ({_mib(float(end.pos - start.pos))} of "
              f"binlog, written in {insert_s:.0f} s); one run per contender, default settings")
        base_s, base_rss, _ = run_measured(
            [binlog_tool, "--read-from-remote-server", f"--host={server.host}",
             f"--port={server.port}", f"--user={server.user}", f"--password={server.password}",
             "-v", "--base64-output=decode-rows", f"--start-position={start.pos}",
             f"--stop-position={end.pos}", start.file])
        base = rows / base_s
        print(f"  {'mariadb-binlog -v (baseline)':<28}{base:>12,.0f} changes/s "
              f"({base_s:.1f} s), peak RSS {_mib(base_rss)}")
        offsets = Path(tmp) / "offsets.json"
        offsets.write_text(json.dumps({f"mariadb/{server.host}:{server.port}/tidemark":
                                       {"binlog": start.to_offset()}}))
        seconds, rss, err = run_measured(
            [sys.executable, "-m", "tidemark", "--log-level", "INFO", "capture", "--offsets",
             str(offsets), "--stop-at-end"], {**os.environ, "TIDEMARK_DSN": server.dsn("bench")})
        match = re.search(r"delivered (\d+) change events", err)
        if match is None or int(match.group(1)) != rows:
            raise SystemExit(f"tidemark capture did not deliver {rows} events:\n{err[-2000:]}")
        print(f"  {'tidemark capture (JSON)':<28}{rows / seconds:>12,.0f} changes/s "
              f"({seconds:.1f} s, {rows / seconds / base:.2f}x baseline), peak RSS "
              f"{_mib(rss)}")


if __name__ == "__main__":
    main()
