"""A capture stopped in the middle of a large transaction does not deliver it again
from its start (PostgreSQL resends an unfinished transaction whole): the offset keeps
how much of it was handed on, as Debezium's keeps its last processed event."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import IO

import pytest

from conftest import Database

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.every_pg_version]

ROWS = 60_000


def _capture(db: Database, offsets: Path, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tidemark", "capture", "--table", "public.t",
         "--slot", f"s_{db.name}", "--snapshot-mode", "no_data", "--offsets", str(offsets),
         *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**os.environ, "TIDEMARK_DSN": db.dsn})


def _ids(lines: list[bytes]) -> list[int]:
    out = []
    for line in lines:
        value = json.loads(line)["value"]
        if value is not None and value["after"] is not None:
            out.append(int(value["after"]["id"]))
    return out


def _read_lines(stream: IO[bytes], count: int) -> list[bytes]:
    return [stream.readline() for _ in range(count)]


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_stop_inside_a_large_transaction_redelivers_only_what_was_not_saved(
        db: Database, tmp_path: Path, stop: signal.Signals) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    offsets = tmp_path / "offsets.json"
    first = _capture(db, offsets, "--stop-at-end")  # creates the slot
    assert first.wait(60) == 0, first.stderr.read() if first.stderr else ""
    db.execute(f"INSERT INTO t SELECT g, 'row ' || g FROM generate_series(1, {ROWS}) g")

    proc = _capture(db, offsets)
    assert proc.stdout is not None
    # The pipe fills and capture blocks in a write, a third of the way through the
    # transaction: certainly inside it when the signal comes.
    delivered = _read_lines(proc.stdout, ROWS // 3)
    proc.send_signal(stop)
    delivered += proc.stdout.read().splitlines(keepends=True)  # what it wrote, whole
    code = proc.wait(60)
    assert code == (0 if stop == signal.SIGTERM else -signal.SIGKILL), \
        proc.stderr.read() if proc.stderr else ""
    if delivered and not delivered[-1].endswith(b"\n"):
        delivered.pop()  # a line cut by the kill was not delivered
    before = _ids(delivered)
    assert 0 < len(before) < ROWS
    saved = json.loads(offsets.read_text())
    (offset,) = saved.values()
    assert offset.get("partial_messages"), offset  # saved inside the transaction

    again = _capture(db, offsets, "--stop-at-end")
    out, err = again.communicate(timeout=120)
    assert again.returncode == 0, err.decode()
    after = _ids(out.splitlines())
    duplicates = len(set(before) & set(after))
    assert sorted(set(before) | set(after)) == list(range(1, ROWS + 1))
    assert len(after) == len(set(after))
    # Exactly what came after the saved offset is delivered again: nothing after a
    # graceful stop, which saves what it wrote.
    assert duplicates == len(before) - offset["partial_messages"], (duplicates, offset)
    if stop == signal.SIGTERM:
        assert duplicates == 0
