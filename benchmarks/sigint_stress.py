"""Stress: Ctrl-C of ``tidemark run`` under load, many times; does it stop cleanly?

A private PostgreSQL holds ``t10`` (the shared 10-column layout) with ``--rows`` rows
(default 200k), loaded into Delta by the pipeline's snapshot. A writer then makes
``--rate`` changes/s (default 2,000) in transactions of 100 (60 inserts, 30 updates,
10 deletes) for the whole run. ``--tries`` times (default 13), ``tidemark run``
(``trigger_interval_ms = 500``) is started on the same checkpoint, left to apply a few
batches, and sent SIGINT at a random moment up to 1.5 s later (``--group``: to its
whole process group, as a terminal's Ctrl-C does). Each try is counted by how the
process ended: ``clean`` (exit 130, and no fatal error on its output), ``crash``
(killed by a signal, or ``Fatal Python error``), ``hang`` (still running after 90 s; then
killed), or ``other``; and ``graceful`` counts the tries that said they stop after the
batch in progress.
At the end the writer stops, ``tidemark run --available-now`` catches up, and ``t10``
in Delta must equal the source row for row (nothing lost or applied twice across the
stops).

Usage: ``uv run python benchmarks/sigint_stress.py [--tries 13] [--rows 200000]
[--rate 2000] [--batches 2] [--group] [--seed 1] [--keep DIR]``
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from deltalake import DeltaTable

sys.path.insert(0, str(Path(__file__).parent))

import workload

from tidemark.pipeline.compare import compare
from tidemark.testing.postgres import PostgresCluster, sql_connection

_TXN = 100
_COLUMNS = ["id", "c_int", "c_label"]
#: The exit status of ``tidemark run`` stopped by one SIGINT.
_STOPPED = 130


class Writer(threading.Thread):
    """Mixed transactions of 100 changes at *rate* changes/s until stopped."""

    def __init__(self, dsn: str, first_new: int, rate: int) -> None:
        super().__init__(daemon=True)
        self.dsn, self.next_id, self.rate = dsn, first_new, rate
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
                    keys = [int(k) for k in rng.integers(1, lo, 40)]
                    with conn.transaction(), conn.cursor() as cur:
                        cur.execute(workload.t10_insert(lo, lo + 59))
                        cur.execute("UPDATE t10 SET c_int = c_int + 1, c_label = 'stress' "
                                    "WHERE id = ANY(%s)", (keys[:30],))
                        cur.execute("DELETE FROM t10 WHERE id = ANY(%s)", (keys[30:],))
                    self.changes += _TXN
                    due += interval
                    delay = due - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)  # pacing to the rate, not waiting for a condition
        except BaseException as err:
            self.error = err


def _start(file: Path, log: Path, *args: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYTHONFAULTHANDLER": "1"}
    with log.open("wb") as out:
        return subprocess.Popen([sys.executable, "-m", "tidemark", "run", str(file), *args],
                                env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _applied(log: Path) -> int:
    return sum(1 for line in log.read_text(errors="replace").splitlines()
               if line.startswith("batch ") and "no changes" not in line)


def _outcome(code: int | None, text: str) -> str:
    if code is None:
        return "hang"
    if code < 0 or code in (134, 139) or "Fatal Python error" in text:
        return "crash"
    return "clean" if code == _STOPPED else "other"


def one_try(n: int, file: Path, work: Path, batches: int, group: bool,
            rng: random.Random) -> tuple[str, int | None, bool]:
    log = work / f"run{n}.log"
    proc = _start(file, log)
    try:
        deadline = time.monotonic() + 300
        while _applied(log) < batches:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"try {n}: no batches:\n{log.read_text()[-3000:]}")
            time.sleep(0.05)  # polling the run's output
        # A moment within the trigger interval and a batch's apply: the signal lands
        # between batches, in a batch's read, or in its merge into Delta.
        time.sleep(rng.uniform(0, 1.5))
        if group:
            os.killpg(proc.pid, signal.SIGINT)
        else:
            proc.send_signal(signal.SIGINT)
        try:
            code: int | None = proc.wait(90)
        except subprocess.TimeoutExpired:
            code = None
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    text = log.read_text(errors="replace")
    outcome = _outcome(code, text)
    graceful = "stopping after the current batch" in text
    if outcome != "clean":
        tail = "\n    ".join(text.splitlines()[-12:])
        print(f"try {n}: {outcome} (exit {code}); the end of its output:\n    {tail}",
              flush=True)
    else:
        print(f"try {n}: clean (exit {code}){', graceful' if graceful else ''}", flush=True)
    return outcome, code, graceful


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tries", type=int, default=13)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--rate", type=int, default=2_000)
    parser.add_argument("--batches", type=int, default=2,
                        help="batches with changes to wait for before the SIGINT")
    parser.add_argument("--group", action="store_true",
                        help="signal the process group (a terminal's Ctrl-C)")
    parser.add_argument("--seed", type=int, default=1, help="of the signals' moments")
    parser.add_argument("--keep", type=Path, help="work in this directory and keep it")
    args = parser.parse_args()
    with PostgresCluster(durable=True) as cluster, contextlib.ExitStack() as stack:
        print(f"server: PostgreSQL, {cluster.durability}")
        work = args.keep or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        work.mkdir(parents=True, exist_ok=True)
        dsn = cluster.create_database("stress")
        workload.fill_t10(dsn, args.rows)
        file = work / "pipeline.toml"
        file.write_text(
            f'[source]\ndsn = "{dsn}"\nslot = "stress"\npublication = "stress"\n'
            '[spark]\ncheckpoint = "chk"\ntrigger_interval_ms = 500\n'
            'conf = { "spark.ui.enabled" = "false" }\n'
            '[targets."public.t10"]\npath = "lake/t10"\nkeys = ["id"]\n')
        snapshot = subprocess.run(
            [sys.executable, "-m", "tidemark", "run", str(file), "--available-now"],
            env={**os.environ, "PYSPARK_PYTHON": sys.executable}, capture_output=True,
            text=True, check=False, timeout=900)
        if snapshot.returncode != 0:
            raise SystemExit(f"the snapshot failed:\n{snapshot.stdout}{snapshot.stderr}")
        print(f"{args.rows:,} rows loaded; {args.tries} SIGINTs"
              f"{' to the process group' if args.group else ''} while a writer makes "
              f"{args.rate:,} changes/s", flush=True)
        writer = Writer(dsn, args.rows + 1, args.rate)
        writer.start()
        rng = random.Random(args.seed)
        outcomes: collections.Counter[str] = collections.Counter()
        codes: collections.Counter[int | None] = collections.Counter()
        try:
            for n in range(1, args.tries + 1):
                outcome, code, graceful = one_try(n, file, work, args.batches, args.group,
                                                  rng)
                outcomes[outcome] += 1
                outcomes["graceful"] += graceful
                codes[code] += 1
                if writer.error is not None:
                    raise SystemExit(f"the writer failed: {writer.error}")
        finally:
            writer.stop.set()
            writer.join(30)
        catch_up = subprocess.run(
            [sys.executable, "-m", "tidemark", "run", str(file), "--available-now"],
            env={**os.environ, "PYSPARK_PYTHON": sys.executable}, capture_output=True,
            text=True, check=False, timeout=900)
        source, lake = compare(dsn, "public.t10", str(work / "lake/t10"), _COLUMNS)
        equal = catch_up.returncode == 0 and source == lake
        print(f"{args.tries} tries: " + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items()))
              + f"; exit statuses {dict(codes)}; {writer.changes:,} changes written; "
              f"Delta equals the source after catching up: {equal}"
              + ("" if equal else f" (catch-up exit {catch_up.returncode}, "
                 f"{len(source)} source rows, {len(lake)} Delta rows, version "
                 f"{DeltaTable(str(work / 'lake/t10')).version()})"), flush=True)
        if not equal or outcomes["clean"] != args.tries:
            raise SystemExit(1)


if __name__ == "__main__":
    main()
