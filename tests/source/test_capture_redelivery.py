"""What ``tidemark capture`` redelivers after ``kill -9``, for every source: nothing is
lost, and what comes again is what the capture wrote in the last
``--offset-flush-interval-ms`` before the kill, plus the batch in progress: changes
committed over at most that long, plus, for log tables, an idle reader's wait
(``poll_interval_ms``) — README, docs/configuration.md.

A writer inserts one row per transaction, every 20 ms, and keeps the time it committed
each one. The capture is killed just before its next offset save (the moment that
redelivers most: the saves' cadence is read from the offsets file), then run again from
its offsets; the rows both runs wrote are the redelivered ones.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest

from logtable_helpers import LogDb
from tidemark.source.logtable.config import LogTableSourceConfig
from tidemark.testing.postgres import sql_connection
from waiting import wait_for

pytestmark = pytest.mark.integration

SOURCES = ("postgres", "mariadb", "postgres-logtable", "sqlite-logtable")
#: Not the default (1 s), not a multiple of a log-table reader's idle wait: a poll that
#: held back a due save (it slept that wait) shows as a save a whole wait late.
FLUSH_MS = 800
#: What "the batch in progress" may add to the flush interval: the batch the capture
#: wrote when its save fell due (a poll returns within about 50 ms), its query, and a
#: loaded machine's scheduling.
BATCH_SLACK_S = 0.15
#: How long an idle log-table reader waits before it looks again: a change waits in the
#: log up to that long before the capture reads it.
LOGTABLE_WAIT_S = LogTableSourceConfig(dsn="sqlite:///x.db").poll_interval_ms / 1000
TABLE = "redeliver_t"


@dataclass
class Source:
    """A database holding ``redeliver_t (id int key, at float)`` and how to capture it."""

    name: str
    args: list[str]  # tidemark capture's, after the command
    connect: Callable[[], Any]  # an autocommit DB-API connection
    read_wait_s: float = 0.0  # how long a committed change may wait to be read


@pytest.fixture(params=SOURCES)
def source(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Source]:
    kind: str = request.param
    ddl = f"CREATE TABLE {TABLE} (id integer PRIMARY KEY, at double precision)"
    if kind == "mariadb":
        mdb = request.getfixturevalue("mdb")
        mdb.execute(f"CREATE TABLE {TABLE} (id INT PRIMARY KEY, at DOUBLE)")
        yield Source(kind, ["--dsn", mdb.dsn, "--snapshot-mode", "no_data"],
                     lambda: mdb.server.connect(mdb.name))
        return
    if kind == "sqlite-logtable":
        path = tmp_path / "app.db"
        path.touch()
        lite = LogDb("sqlite", f"sqlite:///{path}", path)
        lite.execute(ddl.replace("double precision", "real"))
        lite.install([TABLE], streams=8, groups=2)
        yield Source(kind, ["--dsn", lite.dsn],
                     lambda: sqlite3.connect(path, isolation_level=None, timeout=30),
                     LOGTABLE_WAIT_S)
        return
    db = request.getfixturevalue("db")
    db.execute(ddl)

    def connect() -> Any:
        conn = sql_connection(db.dsn)
        conn.autocommit = True
        return conn

    if kind == "postgres-logtable":
        LogDb("postgres", db.dsn).install([TABLE], streams=8, groups=2)
        yield Source(kind, ["--dsn", db.dsn, "--source", "logtable"], connect,
                     LOGTABLE_WAIT_S)
        return
    yield Source(kind, ["--dsn", db.dsn, "--table", f"public.{TABLE}",
                        "--snapshot-mode", "no_data"], connect)


class Writer:
    """Inserts rows 1, 2, … one per transaction; ``committed[id]`` is when each one
    committed (``time.monotonic``)."""

    def __init__(self, source: Source) -> None:
        self._connect = source.connect
        self._placeholder = "?" if source.name.startswith("sqlite") else "%s"
        self.committed: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.error: BaseException | None = None

    def _run(self) -> None:
        p = self._placeholder
        n = 0
        try:
            with contextlib.closing(self._connect()) as conn:
                cur = conn.cursor()
                while not self._stop.is_set():
                    n += 1
                    cur.execute(f"INSERT INTO {TABLE} VALUES ({p}, {p})", (n, time.time()))
                    self.committed[n] = time.monotonic()
                    # A steady rate (not a wait for a condition), one that leaves a log
                    # table's reader idle between rows.
                    self._stop.wait(0.02)
        except BaseException as err:
            self.error = err

    def __enter__(self) -> Writer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)


def _capture(source: Source, offsets: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "tidemark", "capture", *source.args,
            "--offsets", str(offsets), "--offset-flush-interval-ms", str(FLUSH_MS),
            "--no-tombstones", "--progress-interval-s", "0", *extra]


def _written(data: bytes) -> dict[int, float]:
    """Row id -> when the capture made its event (``ts_us``, epoch seconds), of the whole
    lines of a capture's output (a kill may cut the last one)."""
    made = {}
    for line in data.split(b"\n"):
        try:
            record = msgspec.json.decode(line)
        except msgspec.DecodeError:
            continue
        made[int(record["key"]["id"])] = record["value"]["ts_us"] / 1e6
    return made


class SaveWatch:
    """The moments the capture replaced its offsets file (read every 2 ms)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.saves: list[float] = []
        self._last: int | None = None

    def look(self) -> float | None:
        """The moment of a save seen now, if any."""
        with contextlib.suppress(FileNotFoundError):
            stamp = os.stat(self.path).st_mtime_ns
            if stamp != self._last:
                self._last = stamp
                now = time.monotonic()
                self.saves.append(now)
                return now
        return None

    def next_save(self, timeout_s: float) -> float:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            seen = self.look()
            if seen is not None:
                return seen
            time.sleep(0.002)
        raise AssertionError(f"no offset save within {timeout_s}s")


def test_a_killed_capture_redelivers_at_most_the_flush_interval_of_output(
        source: Source, tmp_path: Path, kill_on_exit: list[subprocess.Popen[bytes]]) -> None:
    offsets = tmp_path / "offsets.json"
    out = tmp_path / "first.jsonl"
    err = tmp_path / "first.err"
    with out.open("wb") as sink, err.open("wb") as errors:
        first = subprocess.Popen(_capture(source, offsets), stdout=sink, stderr=errors)
    kill_on_exit.append(first)

    def alive() -> None:
        assert first.poll() is None, err.read_text(errors="replace")[-3000:]

    with Writer(source) as writer:
        # Streaming: the rows flow out and the offsets are saved.
        wait_for(lambda: alive() or (offsets.exists() and out.stat().st_size > 0), 60,
                 f"{source.name}: the capture's first rows")
        watch = SaveWatch(offsets)
        for _ in range(4):
            watch.next_save(10 * FLUSH_MS / 1000)
            alive()
        cadence = min(b - a for a, b in zip(watch.saves[1:], watch.saves[2:], strict=False))
        # Just before the next save: everything since the last one comes again.
        last = watch.next_save(10 * FLUSH_MS / 1000)
        while time.monotonic() < last + cadence - 0.03 and watch.look() is None:
            time.sleep(0.002)
        killed_wall = time.time()
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
        killed_at = time.monotonic()
    assert writer.error is None, writer.error
    second = subprocess.run(_capture(source, offsets, "--stop-at-end"), capture_output=True,
                            timeout=120, check=False)
    assert second.returncode == 0, second.stderr.decode(errors="replace")[-3000:]

    before, after = _written(out.read_bytes()), _written(second.stdout)
    assert before, f"{source.name}: the first capture wrote nothing"
    # Nothing lost: every row written after the capture's stream opened comes once at
    # least (log tables read from the log's start; the streams from their first change).
    expected = set(range(min(before), max(writer.committed) + 1))
    missing = expected - set(before) - set(after)
    assert not missing, f"{source.name}: lost {len(missing)} rows, e.g. {sorted(missing)[:5]}"
    redelivered = set(before) & set(after)
    assert redelivered, f"{source.name}: the kill redelivered nothing (killed after a save?)"
    committed = [writer.committed[i] for i in redelivered]
    span = max(committed) - min(committed)
    output_age = killed_wall - min(before[i] for i in redelivered)
    print(f"\n{source.name}: saves every {cadence:.3f}s; killed "
          f"{killed_at - last:.3f}s after one; redelivered {len(redelivered)} rows "
          f"written over {span:.3f}s, output over the last {output_age:.3f}s")
    flush_s = FLUSH_MS / 1000
    assert output_age <= flush_s + BATCH_SLACK_S, (
        f"{source.name}: a kill redelivered what the capture wrote over the last "
        f"{output_age:.3f}s; the documented bound is --offset-flush-interval-ms "
        f"({FLUSH_MS} ms) plus the batch in progress (was a save held back?)")
    assert span <= flush_s + source.read_wait_s + BATCH_SLACK_S, (
        f"{source.name}: a kill redelivered the rows committed over {span:.3f}s; the "
        f"documented bound is --offset-flush-interval-ms ({FLUSH_MS} ms) plus "
        f"{source.read_wait_s:.1f}s (an idle reader's wait) plus the batch in progress")
