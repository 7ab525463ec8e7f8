"""Benchmark: CPU seconds of ``tidemark capture`` and of the walsender serving it, per
300k changes, in paired alternating runs.

Wall-clock rates on a shared 2-core machine say more about the neighbours than about
the client. What says whether the client keeps up with the server is CPU: the client's
(``wait4`` rusage, user + sys) against its walsender's (``/proc/<pid>/stat`` of the
slot's active PID, read until it exits). Each contender reads its own copy of one slot
(``pg_copy_logical_replication_slot``), so all decode the same WAL: ``pg_recvlogical``,
the working tree's ``tidemark capture --stop-at-end``, and any ``NAME=PYTHONPATH``
given (another tree of tidemark, e.g. ``git archive`` of an older commit, with its
compiled modules and bytecode), in alternating order.

Usage: ``uv run python benchmarks/bench_capture_cpu.py [--runs 6] [before=/tmp/old/src]``
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import workload

from tidemark.testing.postgres import PostgresCluster, sql_connection

PUBLICATION = "bench_pub"
# A slot and a walsender per run of every contender.
SLOTS = {"max_replication_slots": "100", "max_wal_senders": "100"}
_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU of *pid* so far, None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / _TICK


def _walsender_cpu(dsn: str, slot: str, done: threading.Event, out: list[float]) -> None:
    """The CPU seconds of the walsender that serves *slot*, read until it exits."""
    pid = None
    with contextlib.closing(sql_connection(dsn)) as conn:
        conn.autocommit = True
        cur = conn.cursor()
        while pid is None and not done.is_set():
            cur.execute("SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s",
                        (slot,))
            row = cur.fetchone()
            pid = row[0] if row else None
            if pid is None:
                time.sleep(0.005)  # polling the slot's holder, not a wait for a result
    last = 0.0
    while pid is not None and (cpu := _cpu_seconds(pid)) is not None:
        last = cpu
        time.sleep(0.01)
    out.append(last)


def _run(argv: list[str], env: dict[str, str], dsn: str, slot: str) -> dict[str, float]:
    done, walsender = threading.Event(), []
    watcher = threading.Thread(target=_walsender_cpu, args=(dsn, slot, done, walsender))
    watcher.start()
    started = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    done.set()
    watcher.join()
    if status != 0:
        raise SystemExit(f"{argv[0]} failed:\n{err.decode(errors='replace')}")
    return {"client": usage.ru_utime + usage.ru_stime, "walsender": walsender[0],
            "wall": wall, "rss_mb": usage.ru_maxrss / 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--transactions", type=int, default=3000,
                        help="transactions of 100 changes (default 3000 = 300k changes)")
    parser.add_argument("--runs", type=int, default=6, help="rounds of every contender")
    parser.add_argument("variants", nargs="*", help="NAME=PYTHONPATH of other trees")
    args = parser.parse_args()
    trees = {"tidemark": "", **dict(v.split("=", 1) for v in args.variants)}
    names = ["pg_recvlogical", *trees]
    with PostgresCluster(durable=True, settings=SLOTS) as cluster:
        print(f"server: PostgreSQL, {cluster.durability}")
        dsn = cluster.create_database("bench")
        workload.create_table(dsn)
        with contextlib.closing(sql_connection(dsn)) as conn:
            conn.autocommit = True
            cur = conn.cursor()
            cur.execute(f"CREATE PUBLICATION {PUBLICATION} FOR TABLE t10")
            cur.execute("SELECT pg_create_logical_replication_slot('main', 'pgoutput')")
            changes = workload.run_workload(dsn, args.transactions)
            cur.execute("SELECT pg_current_wal_insert_lsn()::text")
            end_lsn = cur.fetchone()[0]
            slots = [f"copy_{i}" for i in range(args.runs * len(names))]
            for slot in slots:
                cur.execute("SELECT pg_copy_logical_replication_slot('main', %s)", (slot,))
        recv_env = {**os.environ, "PGPASSWORD": cluster.password}
        recv_env.pop("PGSERVICEFILE", None)
        recv = [str(Path(cluster.bindir) / "pg_recvlogical"), "-h", cluster.host, "-p",
                str(cluster.port), "-U", cluster.superuser, "-d", "bench", "--start",
                "-o", "proto_version=1", "-o", f"publication_names={PUBLICATION}",
                "-f", "/dev/null", "-E", end_lsn, "--no-loop"]
        results: dict[str, list[dict[str, float]]] = {name: [] for name in names}
        for run in range(args.runs):
            for name in (names if run % 2 == 0 else [names[0], *reversed(names[1:])]):
                slot = slots.pop()
                if name == "pg_recvlogical":
                    results[name].append(_run([*recv, "--slot", slot], recv_env, dsn, slot))
                    continue
                env = {**os.environ, "TIDEMARK_DSN": dsn}
                if trees[name]:
                    env["PYTHONPATH"] = trees[name]
                argv = [sys.executable, "-m", "tidemark", "capture", "--table", "public.t10",
                        "--slot", slot, "--publication", PUBLICATION,
                        "--snapshot-mode", "no_data", "--stop-at-end"]
                results[name].append(_run(argv, env, dsn, slot))
    print(f"{changes:,} changes, {args.runs} runs each; medians [min-max]")
    for name, rows in results.items():
        def median(key: str, rows: list[dict[str, float]] = rows) -> str:
            values = sorted(r[key] for r in rows)
            return f"{statistics.median(values):.3f} [{values[0]:.3f}-{values[-1]:.3f}]"
        print(f"{name:<16} client CPU s {median('client')}  walsender CPU s "
              f"{median('walsender')}  wall s {median('wall')}  peak RSS MB {median('rss_mb')}")


if __name__ == "__main__":
    main()
