"""At-least-once across SIGKILL, in every delivery mode: kill the engine's process
mid-stream, restart it from its offset file, and check that every record was delivered
and that no more were delivered twice than the in-flight limit allows."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import psycopg2
import pytest

from conftest import Database

CHILD = Path(__file__).with_name("engine_child.py")
MODES = ["batch", "ordered", "async", "per_key"]
IN_FLIGHT = 500
BATCH = 200  # the most records one poll hands on (synthetic: 100; PostgreSQL: 200 messages)


def lines(path: Path) -> list[int]:
    if not path.exists():
        return []
    text = path.read_text()
    return [int(x) for x in text.split("\n")[:-1]]  # a torn last line has no newline


def child(mode: str, tmp: Path, run: str, *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, str(CHILD), "--mode", mode, "--offsets", str(tmp / "offsets.json"),
         "--out", str(tmp / f"{run}.txt"), "--max-in-flight", str(IN_FLIGHT), *extra],
        stderr=subprocess.PIPE)


def wait_for_lines(path: Path, n: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while len(lines(path)) < n:
        if proc.poll() is not None:
            raise AssertionError(f"child exited early: {proc.stderr.read().decode()[-2000:]}"
                                 if proc.stderr else "child exited early")
        assert time.monotonic() < deadline, f"no {n} lines in {path}"
        time.sleep(0.02)


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_sigkill_then_restart_delivers_everything_synthetic(mode: str, tmp_path: Path) -> None:
    first = child(mode, tmp_path, "first")
    wait_for_lines(tmp_path / "first.txt", 5_000, first)
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    saved = json.loads((tmp_path / "offsets.json").read_text())
    position = saved["synthetic/synthetic/0"]["position"]
    run1 = lines(tmp_path / "first.txt")
    assert set(range(position)) <= set(run1), "the saved offset passed an unprocessed record"

    total = max(run1) + 2_000
    second = child(mode, tmp_path, "second", "--total", str(total))
    assert second.wait(60) == 0, second.stderr.read().decode() if second.stderr else ""
    run2 = lines(tmp_path / "second.txt")
    assert min(run2) == position, "the restart did not resume at the saved offset"
    assert set(run1) | set(run2) == set(range(total)), "a record was lost"
    duplicates = sum((Counter(run1) + Counter(run2)).values()) - total
    assert duplicates <= IN_FLIGHT + BATCH


def insert_continuously(dsn: str, total: int, stop: threading.Event,
                        resume: threading.Event, rows: int = 10) -> threading.Thread:
    """Insert rows 2..total in statements of *rows*; the second half only once *resume*
    is set, so that the writer is surely still writing when the test kills the reader."""
    def run() -> None:
        with contextlib.closing(psycopg2.connect(dsn)) as conn:
            conn.autocommit = True  # one transaction per statement
            with conn.cursor() as cur:
                for start in range(2, total + 1, rows):
                    if start > total // 2:
                        resume.wait(60)
                    if stop.is_set():
                        return
                    cur.execute("INSERT INTO t SELECT g, 'v' FROM generate_series(%s, %s) g",
                                (start, min(start + rows - 1, total)))
                    time.sleep(0.005)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_sigkill_then_restart_delivers_every_postgres_change(
        mode: str, db: Database, tmp_path: Path) -> None:
    total = 6_000
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    stop = threading.Event()
    resume = threading.Event()
    first = child(mode, tmp_path, "first", "--dsn", db.dsn)
    try:
        # The first row shows the capture is streaming (slot created, snapshot done).
        db.execute("INSERT INTO t VALUES (1, 'v')")
        wait_for_lines(tmp_path / "first.txt", 1, first)
        writer = insert_continuously(db.dsn, total, stop, resume)
        wait_for_lines(tmp_path / "first.txt", 1_000, first)
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        assert writer.is_alive(), "the writer finished before the kill: not mid-stream"
        resume.set()
        writer.join(120)
        second = child(mode, tmp_path, "second", "--dsn", db.dsn, "--stop-after-id", str(total))
        assert second.wait(120) == 0, second.stderr.read().decode() if second.stderr else ""
    finally:
        stop.set()
        resume.set()
        for proc in (first,):
            if proc.poll() is None:
                proc.kill()
    run1, run2 = lines(tmp_path / "first.txt"), lines(tmp_path / "second.txt")
    assert set(run1) | set(run2) == set(range(1, total + 1)), "a committed change was lost"
    duplicates = len(set(run1) & set(run2))
    assert duplicates <= IN_FLIGHT + BATCH
    # The killed process's walsender lets go of the slot on its own schedule.
    assert db.settled_scalar("SELECT count(*) FROM pg_replication_slots "
                             "WHERE active AND database = current_database()", 0) == 0


@pytest.mark.slow
def test_sigkill_then_restart_on_the_fused_json_path_redelivers_at_most_max_in_flight(
        db: Database, tmp_path: Path) -> None:
    """The Debezium JSON converter with no transforms: the PostgreSQL task makes the
    converter's records itself (RenderedRecord, batches passed on as ConvertedBatch).
    Killed mid-stream and restarted, it loses nothing and redelivers no more than the
    README promises: at most ``max_in_flight`` records.

    In ``batch`` mode, the default. (In ``async`` mode a batch's earlier chunks stop
    counting as in flight once processed, while the batch's offset comes with its last
    chunk: a crash may redeliver up to a batch more than ``max_in_flight``, as the
    synthetic test above allows.)"""
    mode = "batch"
    total = 6_000
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    stop = threading.Event()
    resume = threading.Event()
    first = child(mode, tmp_path, "first", "--dsn", db.dsn, "--json")
    try:
        db.execute("INSERT INTO t VALUES (1, 'v')")
        wait_for_lines(tmp_path / "first.txt", 1, first)
        # Transactions of 50 rows: a poll (200 messages) mostly ends inside one, so the
        # saved offset mostly holds a partial transaction that the restart skips.
        writer = insert_continuously(db.dsn, total, stop, resume, rows=50)
        wait_for_lines(tmp_path / "first.txt", 1_000, first)
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        assert writer.is_alive(), "the writer finished before the kill: not mid-stream"
        resume.set()
        writer.join(120)
        second = child(mode, tmp_path, "second", "--dsn", db.dsn, "--json",
                       "--stop-after-id", str(total))
        assert second.wait(120) == 0, second.stderr.read().decode() if second.stderr else ""
    finally:
        stop.set()
        resume.set()
        if first.poll() is None:
            first.kill()
    for run in ("first", "second"):
        general = (tmp_path / f"{run}.txt.general").read_text()
        assert general == "", f"{run}: off the fused path: {general.splitlines()[:3]}"
    run1, run2 = lines(tmp_path / "first.txt"), lines(tmp_path / "second.txt")
    assert len(run1) == len(set(run1)) and len(run2) == len(set(run2))
    assert set(run1) | set(run2) == set(range(1, total + 1)), "a committed change was lost"
    redelivered = len(run1) + len(run2) - total
    assert redelivered <= IN_FLIGHT, \
        f"{redelivered} records delivered twice, more than max_in_flight={IN_FLIGHT}"
