"""At-least-once across SIGKILL, in every delivery mode: kill the engine's process
mid-stream, restart it from its offset file, and check that every record was delivered
and that no more were delivered twice than the in-flight limit allows: the child saves
offsets after every batch (``offset_flush_interval_ms = 0``), where docs/configuration.md
promises at most ``max_in_flight`` redelivered records in every mode."""

from __future__ import annotations

import contextlib
import json
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Sized
from pathlib import Path
from typing import Any

import pytest

from conftest import Database
from tidemark.testing.postgres import sql_connection

CHILD = Path(__file__).parents[1] / "engine_child.py"
MODES = ["batch", "ordered", "async", "per_key"]
IN_FLIGHT = 450  # not a multiple of a batch: a part of one fits in what frees up


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


def wait_for_lines(path: Path, n: int, proc: subprocess.Popen[bytes],
                   read: Callable[[Path], Sized] = lines) -> None:
    """Wait until *path* holds *n* lines (as *read* counts them) while *proc* runs."""
    deadline = time.monotonic() + 60
    while len(read(path)) < n:
        if proc.poll() is not None:
            raise AssertionError(f"child exited early: {proc.stderr.read().decode()[-2000:]}"
                                 if proc.stderr else "child exited early")
        assert time.monotonic() < deadline, f"no {n} lines in {path}"
        time.sleep(0.02)


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_sigkill_then_restart_delivers_everything_synthetic(mode: str, tmp_path: Path) -> None:
    # A stall at every 1000th record: the other workers finish what is in flight behind
    # it, the worst case for what a crash redelivers (and the kill mostly lands in one).
    first = child(mode, tmp_path, "first", "--stall-every", "1000")
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
    print(f"{mode}: {duplicates} records delivered twice")
    assert duplicates <= IN_FLIGHT, \
        f"{duplicates} records delivered twice, more than max_in_flight={IN_FLIGHT}"


def insert_continuously(dsn: str, total: int, stop: threading.Event,
                        resume: threading.Event, rows: int = 10) -> threading.Thread:
    """Insert rows 2..total in statements of *rows*; the second half only once *resume*
    is set, so that the writer is surely still writing when the test kills the reader."""
    def run() -> None:
        with contextlib.closing(sql_connection(dsn)) as conn:
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
    assert duplicates <= IN_FLIGHT, \
        f"{duplicates} records delivered twice, more than max_in_flight={IN_FLIGHT}"
    # The killed process's walsender lets go of the slot on its own schedule.
    assert db.settled_scalar("SELECT count(*) FROM pg_replication_slots "
                             "WHERE active AND database = current_database()", 0) == 0


@pytest.mark.slow
def test_sigkill_then_restart_on_the_fused_json_path_redelivers_at_most_max_in_flight(
        db: Database, tmp_path: Path) -> None:
    """The Debezium JSON converter with no transforms: the PostgreSQL task makes the
    converter's records itself (RenderedRecord, batches passed on as ConvertedBatch).
    Killed mid-stream and restarted, it loses nothing and redelivers no more than the
    README promises: at most ``max_in_flight`` records (in ``batch`` mode, the default;
    the tests above cover every mode)."""
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


@pytest.mark.slow
def test_sigkill_during_an_incremental_snapshot_then_restart_loses_nothing(
        db: Database, tmp_path: Path) -> None:
    """The engine with an incremental snapshot running and a writer updating the rows:
    killed mid-snapshot and restarted, it continues from the snapshot's last chunk
    (saved in the offset), and the events rebuild the table exactly."""
    rows = 20_000
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text)",
               f"INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, {rows}) g",
               "CREATE TABLE dbz_signal (id varchar(42) PRIMARY KEY, type varchar(32) "
               "NOT NULL, data varchar(2048) NULL)")
    signal_args = ("--dsn", db.dsn, "--signal-table", "public.dbz_signal")
    offsets = tmp_path / "offsets.json"
    first = child("batch", tmp_path, "first", *signal_args)
    stop = threading.Event()
    try:
        # Streaming (slot created) once a change comes through; one written before the
        # slot exists is not captured, so write until one is.
        deadline = time.monotonic() + 60
        while not _rows(tmp_path / "first.txt"):
            assert first.poll() is None and time.monotonic() < deadline, "never streamed"
            db.execute("UPDATE t SET v = 'first' WHERE id = 1")
            time.sleep(0.2)
        db.execute("INSERT INTO dbz_signal VALUES ('snap-1', 'execute-snapshot', "
                   "'{\"data-collections\": [\"public.t\"], \"type\": \"incremental\"}')")
        writer = _update_continuously(db.dsn, rows, stop)
        wait_for_lines(tmp_path / "first.txt", 5_000, first, _rows)
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        state = json.loads(offsets.read_text())
        assert any("incremental_snapshot" in v for v in state.values()), state
        second = child("batch", tmp_path, "second", *signal_args)
        stop.set()
        writer.join(60)
        db.execute(f"INSERT INTO t VALUES ({rows + 1}, 'last')")
        deadline = time.monotonic() + 120
        while True:  # the snapshot done and the last change delivered
            saved = json.loads(offsets.read_text())
            done = not any(v.get("incremental_snapshot") for v in saved.values())
            if done and [[ "c", rows + 1, "last"]] == [r for r in _rows(tmp_path / "second.txt")
                                                      if r[1] == rows + 1]:
                break
            assert second.poll() is None, second.stderr.read().decode() if second.stderr else ""
            assert time.monotonic() < deadline, "the snapshot did not finish after the restart"
            time.sleep(0.05)
        second.send_signal(signal.SIGKILL)
        second.wait(10)
    finally:
        stop.set()
        for proc in (first,):
            if proc.poll() is None:
                proc.kill()
    run1, run2 = _rows(tmp_path / "first.txt"), _rows(tmp_path / "second.txt")
    reads2 = [r for r in run2 if r[0] == "r"]
    assert 0 < len(reads2) < rows - 4_000, "the restart did not continue from the last chunk"
    table: dict[int, str] = {}
    for op, key, value in run1 + run2:
        if op == "d":
            table.pop(key, None)
        else:
            table[key] = value
    assert table == {int(i): v for i, v in db.query("SELECT id, v FROM t")}


def _rows(path: Path) -> list[list[Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().split("\n")[:-1]]


def _update_continuously(dsn: str, rows: int, stop: threading.Event) -> threading.Thread:
    """Single-row updates of random rows, until *stop*."""
    def run() -> None:
        rng = random.Random(5)
        with contextlib.closing(sql_connection(dsn)) as conn:
            conn.autocommit = True
            with conn.cursor() as cur:
                while not stop.is_set():
                    cur.execute("UPDATE t SET v = v || '+' WHERE id = %s",
                                (rng.randint(1, rows),))
                    time.sleep(0.001)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread
