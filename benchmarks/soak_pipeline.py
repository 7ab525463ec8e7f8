"""Soak: ``tidemark run`` for a long time under a steady mixed load; does it stay fresh?

A private PostgreSQL holds ``t10`` (the shared 10-column layout) with ``--rows`` rows
(default 1M), loaded into Delta by the pipeline's snapshot. Then for ``--minutes``
(default 30) a writer makes ``--rate`` changes/s (default 10,000) in transactions of 100:
60 inserts of new keys, 30 updates and 10 deletes of existing keys picked at random among
the newest 100,000 (``--keys tail``, the common case) or among all (``--keys uniform``:
every merge then rewrites the whole table, which grows by 5,000 rows a second, so
freshness must degrade: see ``bench_merge_scaling.py``); and a probe writer inserts one
row a second into ``probe (id, at)`` in its own transaction.
``tidemark run`` (``trigger_interval_ms = 500``, ``local[2]``, default upkeep) applies
both tables.

Commit→visible lag is measured as a reader sees it: a thread reads the ``probe`` Delta
table every 0.1 s; a probe row's lag is the moment it is first seen minus its commit time
(``clock_timestamp()`` at the end of its transaction, same machine clock). Per window of
``--window`` minutes it prints the p50/p99 probe lag, the changes the writer made, and the
``t10`` target's file count, ``_delta_log`` size and bytes on disk at the window's end
(replaced files stay until vacuum deletes them, ``vacuum_retention_hours`` later), and the
source's WAL rate, full-page images and checkpoints in the window (what the capture
decodes: several times more WAL a change once checkpoints start). The freshness
check: the last window's p99 within 1.3x of the first's.

Usage: ``uv run python benchmarks/soak_pipeline.py [--minutes 30] [--window 5]
[--rows 1000000] [--rate 10000] [--keys tail|uniform]
[--merge copy_on_write|merge_on_read|auto] [--file-mb N] [--log FILE] [--probes FILE]``;
at the end ``tidemark verify`` compares both targets with the source.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import psycopg
from deltalake import DeltaTable

sys.path.insert(0, str(Path(__file__).parent))

import workload

from tidemark.lake.delta_read import live_rows
from tidemark.testing.postgres import PostgresCluster, sql_connection

_TXN = 100
_TAIL = 100_000


class Writer(threading.Thread):
    """Mixed transactions of 100 changes at *rate* changes/s until stopped."""

    def __init__(self, dsn: str, first_new: int, rate: int, keys: str) -> None:
        super().__init__(daemon=True)
        self.dsn, self.next_id, self.rate, self.keys = dsn, first_new, rate, keys
        self.changes = 0
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        rng = np.random.default_rng(1)
        interval = _TXN / self.rate
        try:
            with contextlib.closing(sql_connection(self.dsn)) as conn:
                due = time.monotonic()
                while not self.stop.is_set():
                    lo, self.next_id = self.next_id, self.next_id + 60
                    low = 1 if self.keys == "uniform" else max(1, lo - _TAIL)
                    keys = [int(k) for k in rng.integers(low, lo, 40)]
                    with conn.transaction(), conn.cursor() as cur:
                        cur.execute(workload.t10_insert(lo, lo + 59))
                        cur.execute("UPDATE t10 SET c_int = c_int + 1, c_label = 'soak' "
                                    "WHERE id = ANY(%s)", (keys[:30],))
                        cur.execute("DELETE FROM t10 WHERE id = ANY(%s)", (keys[30:],))
                    self.changes += _TXN
                    due += interval
                    delay = due - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)  # pacing to the rate, not waiting for a condition
        except BaseException as err:
            self.error = err


class Probe(threading.Thread):
    """One probe row a second, and a reader that notes when each becomes visible."""

    def __init__(self, dsn: str, lake: Path) -> None:
        super().__init__(daemon=True)
        self.dsn, self.lake = dsn, lake
        self.committed: dict[int, float] = {}
        self.lags: list[tuple[float, float]] = []  # (seen at, lag s)
        self.stop = threading.Event()

    def run(self) -> None:
        with contextlib.closing(sql_connection(self.dsn)) as conn:
            conn.autocommit = True
            n = 0
            last = 0.0
            seen: set[int] = set()
            table: DeltaTable | None = None
            while not self.stop.wait(0.1):
                now = time.time()
                if now - last >= 1.0:
                    n += 1
                    with conn.cursor() as cur:
                        cur.execute("INSERT INTO probe VALUES (%s, clock_timestamp()) "
                                    "RETURNING extract(epoch FROM at)", (n,))
                        self.committed[n] = float(cur.fetchone()[0])
                    last = now
                with contextlib.suppress(Exception):  # the table may not exist yet
                    if table is None:
                        table = DeltaTable(str(self.lake))
                    else:
                        table.update_incremental()
                    ids = live_rows(table).to_table(columns=["id"]).column("id")
                    at = time.time()
                    for probe_id in ids.to_pylist():
                        if probe_id not in seen and probe_id in self.committed:
                            seen.add(probe_id)
                            self.lags.append((at, at - self.committed[probe_id]))


def _source_wal(dsn: str) -> tuple[int, int, int]:
    """The source server's WAL bytes, full-page images and checkpoints so far: uniform
    updates of a table bigger than ``shared_buffers`` write a full page image for the
    first change of each page after every checkpoint, and the capture decodes all of it."""
    with contextlib.closing(sql_connection(dsn)) as conn, conn.cursor() as cur:
        cur.execute("SELECT wal_bytes, wal_fpi FROM pg_stat_wal")
        wal_bytes, fpi = cur.fetchone()
        try:  # PostgreSQL 17 on; before, pg_stat_bgwriter counted them
            cur.execute("SELECT num_timed + num_requested FROM pg_stat_checkpointer")
        except psycopg.errors.UndefinedTable:
            conn.rollback()
            cur.execute("SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter")
        (checkpoints,) = cur.fetchone()
    return int(wal_bytes), int(fpi), int(checkpoints)


def _disk(path: Path) -> int:
    """Bytes under *path* (data files no version references stay until vacuum); files
    and folders the writer deletes meanwhile (its scratch folders) are left out."""
    total = 0
    for folder, _, names in os.walk(path):
        for name in names:
            with contextlib.suppress(FileNotFoundError):
                total += os.stat(os.path.join(folder, name)).st_size
    return total


def _log_size(lake: Path) -> tuple[int, int]:
    files, total = 0, 0
    for entry in (lake / "_delta_log").iterdir():  # log cleanup may delete some meanwhile
        with contextlib.suppress(FileNotFoundError):
            total += entry.stat().st_size
            files += 1
    return files, total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30)
    parser.add_argument("--window", type=float, default=5)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rate", type=int, default=10_000)
    parser.add_argument("--keys", choices=("tail", "uniform"), default="tail")
    parser.add_argument("--merge", choices=("copy_on_write", "merge_on_read", "auto"),
                        default="copy_on_write", help="the t10 target's merge setting")
    parser.add_argument("--file-mb", type=int, default=None,
                        help="the t10 target's upkeep target_file_mb (default: upkeep's)")
    parser.add_argument("--log", type=Path, help="keep tidemark run's output (its batch "
                        "lines) in this file instead of the temporary directory")
    parser.add_argument("--probes", type=Path, help="write each probe row's commit time, "
                        "when it was seen and its lag (CSV) to this file at the end, to "
                        "line the slow ones up with the batch lines of --log")
    args = parser.parse_args()
    with PostgresCluster(durable=True) as cluster, tempfile.TemporaryDirectory() as tmp:
        print(f"server: PostgreSQL, {cluster.durability}")
        dsn = cluster.create_database("soak")
        workload.fill_t10(dsn, args.rows,
                          "CREATE TABLE probe (id int PRIMARY KEY, at timestamptz)")
        work = Path(tmp)
        file = work / "pipeline.toml"
        file.write_text(
            f'[source]\ndsn = "{dsn}"\nslot = "soak"\npublication = "soak"\n'
            '[spark]\ncheckpoint = "chk"\ntrigger_interval_ms = 500\n'
            'conf = { "spark.ui.enabled" = "false" }\n'
            f'[targets."public.t10"]\npath = "lake/t10"\nkeys = ["id"]\n'
            f'merge = "{args.merge}"\n'
            + (f"upkeep = {{ target_file_mb = {args.file_mb} }}\n" if args.file_mb else "") +
            '[targets."public.probe"]\npath = "lake/probe"\nkeys = ["id"]\n')
        log = args.log or work / "run.log"
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
        with log.open("wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", "tidemark",
                                     *(["--log-level", "debug"] if args.log else []),
                                     "run", str(file)],
                                    env=env, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        try:
            lake = work / "lake/t10"
            deadline = time.monotonic() + 600
            while DeltaTable.is_deltatable(str(lake)) is False or \
                    live_rows(DeltaTable(str(lake))).count_rows() < args.rows:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"the snapshot did not finish:\n{log.read_text()[-3000:]}")
                time.sleep(1)  # polling the snapshot's progress
            print(f"{args.rows:,} rows loaded by the snapshot; soaking {args.minutes:g} min at "
                  f"{args.rate:,} changes/s (transactions of {_TXN}, {args.keys} keys, "
                  f"merge = {args.merge}), "
                  f"windows of {args.window:g} min")
            writer = Writer(dsn, args.rows + 1, args.rate, args.keys)
            probe = Probe(dsn, work / "lake/probe")
            writer.start()
            probe.start()
            start = time.time()
            windows: list[float] = []
            done_changes = 0
            wal_before = _source_wal(dsn)
            for w in range(int(args.minutes / args.window)):
                end = start + (w + 1) * args.window * 60
                while time.time() < end:
                    if proc.poll() is not None:
                        raise SystemExit(f"tidemark run stopped:\n{log.read_text()[-3000:]}")
                    if writer.error is not None:
                        raise SystemExit(f"the writer failed: {writer.error}")
                    time.sleep(1)  # waiting for the window's end
                lags = [lag for at, lag in probe.lags if end - args.window * 60 <= at < end]
                table = DeltaTable(str(lake))
                log_files, log_bytes = _log_size(lake)
                changes = writer.changes - done_changes
                done_changes = writer.changes
                wal_now = _source_wal(dsn)
                wal_bytes, fpi, checkpoints = (a - b for a, b in zip(wal_now, wal_before,
                                                                     strict=True))
                wal_before = wal_now
                source = (f"source WAL {wal_bytes / 2**20 / (args.window * 60):.1f} MiB/s, "
                          f"{fpi / (args.window * 60):,.0f} full-page images/s, "
                          f"{checkpoints} checkpoints")
                if not lags:
                    print(f"window {w + 1}: no probe row became visible | {source}")
                    windows.append(float("inf"))
                    continue
                p50 = statistics.median(lags)
                p99 = float(np.percentile(lags, 99))
                windows.append(p99)
                print(f"window {w + 1} (to {dt.datetime.now().strftime('%H:%M:%S')}): "
                      f"{changes / (args.window * 60):,.0f} changes/s written, "
                      f"commit->visible p50 {p50:.2f} s, p99 {p99:.2f} s ({len(lags)} "
                      f"probes) | t10: {len(table.file_uris())} files, version "
                      f"{table.version()}, _delta_log {log_files} files "
                      f"{log_bytes / 2**20:.1f} MiB, on disk {_disk(lake) / 2**30:.1f} GiB | "
                      f"{source}")
            writer.stop.set()
            probe.stop.set()
            if args.probes:
                args.probes.write_text("committed,seen,lag_s\n" + "".join(
                    f"{dt.datetime.fromtimestamp(at - lag).isoformat()},"
                    f"{dt.datetime.fromtimestamp(at).isoformat()},{lag:.3f}\n"
                    for at, lag in probe.lags))
            if len(windows) >= 2:
                ratio = windows[-1] / windows[0]
                print(f"last window's p99 / first window's: {ratio:.2f}x (target <= 1.3x)")
            writer.join()
            # The final tables against the source, by checksums while the pipeline runs.
            check = subprocess.run([sys.executable, "-m", "tidemark", "verify", str(file),
                                    "--wait", "600"], cwd=work, env=env, capture_output=True,
                                   text=True, check=False)
            print(f"tidemark verify after the soak: exit {check.returncode} "
                  f"({'equal' if check.returncode == 0 else 'NOT equal or failed'})")
            if check.returncode:
                print(check.stdout[-3000:], check.stderr[-3000:])
        finally:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)


if __name__ == "__main__":
    main()
