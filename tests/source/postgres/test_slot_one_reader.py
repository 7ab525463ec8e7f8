"""One slot, one reader: a second capture (or stream) on a slot another process reads
is refused at its start, in one line naming the slot and the process, and the first
goes on losing nothing."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import Database
from tidemark.source.postgres import slot_holder
from tidemark.source.postgres import wal_reads as wal
from waiting import wait_for


def _capture(db: Database, tmp: Path, name: str, slot: str) -> tuple[subprocess.Popen[bytes],
                                                                      Path, Path]:
    out, err = tmp / f"{name}.jsonl", tmp / f"{name}.stderr"
    with out.open("wb") as o, err.open("wb") as e:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tidemark", "capture", "--table", "public.t",
             "--slot", slot, "--publication", f"p_{db.name}"],
            stdout=o, stderr=e, env={**os.environ, "TIDEMARK_DSN": db.dsn})
    return proc, out, err


def _ids(out: Path) -> list[int]:
    return [json.loads(line)["value"]["after"]["id"]
            for line in out.read_text().splitlines() if line.strip()]


def _holder(db: Database, slot: str) -> int | None:
    rows = db.query("SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s",
                    (slot,))
    return rows[0][0] if rows else None


def test_second_capture_on_a_slot_is_refused_at_start(
        db: Database, tmp_path: Path, kill_on_exit: list[subprocess.Popen[bytes]]) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY)", "INSERT INTO t VALUES (1)")
    slot = f"s_{db.name}"
    first, first_out, _ = _capture(db, tmp_path, "first", slot)
    kill_on_exit.append(first)
    wait_for(lambda: _ids(first_out) == [1], 60, "the first capture's snapshot")
    pid = wait_for(lambda: _holder(db, slot), 30, "the first capture to hold the slot")

    began = time.monotonic()
    second, second_out, second_err = _capture(db, tmp_path, "second", slot)
    kill_on_exit.append(second)
    code = second.wait(timeout=60)
    took = time.monotonic() - began

    assert code != 0
    errors = [line for line in second_err.read_text().splitlines() if line.strip()]
    assert len(errors) == 1, errors  # one line, no traceback
    assert f"replication slot '{slot}'" in errors[0]
    assert f"PID {pid}" in errors[0]
    assert "--slot" in errors[0]
    assert second_out.read_text() == ""  # nothing delivered, nothing taken
    assert took < 20, took
    # The first goes on, and loses nothing.
    db.execute("INSERT INTO t VALUES (2)", "INSERT INTO t VALUES (3)")
    wait_for(lambda: _ids(first_out) == [1, 2, 3], 30, "the first capture's changes")
    assert first.poll() is None


def test_stream_driver_claims_its_slot(db: Database) -> None:
    """The Spark stream's driver holds its slot while it runs (it streams from copies,
    so the slot itself is not active): a capture or a second stream is refused."""
    db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    slot = f"s_{db.name}"
    with contextlib.closing(wal.connect(db.dsn, purpose="test")) as conn:
        wal.ensure_slot(conn, slot)
        slot_holder.claim(conn, slot, "slot")
        mine = conn.info.backend_pid
        with contextlib.closing(wal.connect(db.dsn, purpose="test")) as other:
            with pytest.raises(slot_holder.SlotHeldError, match=f"PID {mine}"):
                slot_holder.claim(other, slot, "slot", wait_s=0.5)
            with pytest.raises(slot_holder.SlotHeldError, match=f"'{slot}'"):
                slot_holder.wait_until_free(other, slot, "slot", wait_s=0.5)
    # Its session gone, the slot is free again.
    with contextlib.closing(wal.connect(db.dsn, purpose="test")) as conn:
        wait_for(lambda: slot_holder.holder(conn, slot) is None, 10, "the claim to end")
        slot_holder.claim(conn, slot, "slot", wait_s=0.5)
