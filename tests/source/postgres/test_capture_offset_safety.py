"""Offsets that must not be trusted, and a reader that goes away, on a real PostgreSQL.

An offset ahead of the server's WAL, an offsets file of the wrong shape or in a place
that cannot be written are refused before the slot or publication is touched; a
capture whose stdout is closed (``tidemark capture | head -1``) fails, keeping the
offset of what it wrote in full and nothing more.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import select
import subprocess
import sys
import termios
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from capture_helpers import drain, events, make_connector
from conftest import Database
from tidemark.errors import ConfigError
from tidemark.offsets.file import FileOffsetStore
from tidemark.offsets.memory import MemoryOffsetStore
from tidemark.source.postgres.pgoutput import lsn_to_str, str_to_lsn
from tidemark.source.postgres.task import PostgresConnector

# Run on every PostgreSQL version CI tests (scripts/test.sh).
pytestmark = pytest.mark.every_pg_version

SLOT = "tidemark"
# Far beyond any WAL a test cluster writes: another server's offset, or a typo.
_AHEAD_BY = 1 << 36


# -- helpers ----------------------------------------------------------------------------
def wait_for(predicate: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def _cli(db: Database, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tidemark", "capture", "--table", "public.t", *args],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "TIDEMARK_DSN": db.dsn}, check=False,
    )


def _one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    """The single ``error: …`` line a failed run printed (and nothing else)."""
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: "), proc.stderr
    return lines[0]


def _confirmed(db: Database) -> int | None:
    rows = db.query("SELECT (confirmed_flush_lsn - '0/0')::bigint FROM pg_replication_slots "
                    "WHERE slot_name = %s", (SLOT,))
    return int(rows[0][0]) if rows else None


def _slots_and_publications(db: Database) -> tuple[int, int]:
    return (int(db.scalar("SELECT count(*) FROM pg_replication_slots "
                          "WHERE database = current_database()")),
            int(db.scalar("SELECT count(*) FROM pg_publication")))


def _lsns_in(message: str) -> list[int]:
    return [str_to_lsn(m) for m in re.findall(r"\b[0-9A-F]{1,8}/[0-9A-F]{1,8}\b", message)]


# -- 4. an offset ahead of the server ------------------------------------------------------
def test_offset_ahead_of_the_server_is_refused_before_the_slot_moves(
        db: Database, tmp_path: Path) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    first = make_connector(db.dsn, "public.t", snapshot_mode="no_data")
    first.start()
    try:
        drain(first, db.insert_lsn())
        key = first.partition
    finally:
        first.stop()
    # Once the slot is released its last status update has been applied.
    assert db.settled_scalar("SELECT active_pid IS NULL FROM pg_replication_slots", True)
    slot_before = _confirmed(db)
    assert slot_before is not None
    db.autocommit("INSERT INTO t VALUES (1)", "INSERT INTO t VALUES (2)")

    path = tmp_path / "offsets.json"
    ahead = db.insert_lsn() + _AHEAD_BY
    path.write_text(json.dumps({key: {"lsn": ahead, "snapshot_completed": True}}))
    server_before = db.insert_lsn()
    connector = make_connector(db.dsn, "public.t", snapshot_mode="no_data")
    try:
        with pytest.raises(ConfigError) as info:
            connector.start(store=FileOffsetStore(path))
            connector.poll()  # today's code fails (if at all) only once streaming
    finally:
        connector.stop()
    server_after = db.insert_lsn()
    message = str(info.value)
    assert message.startswith("offsets: ")
    assert str(path) in message and repr(key) in message
    assert lsn_to_str(ahead) in message
    assert any(server_before <= lsn <= server_after for lsn in _lsns_in(message)), \
        f"the server's position is not in the message: {message}"
    assert "delete" in message  # what to do about it
    # Nothing was confirmed: the slot still holds the changes after its old position.
    assert _confirmed(db) == slot_before

    path.write_text("{}")  # the way out the message names
    again = make_connector(db.dsn, "public.t", snapshot_mode="no_data")
    again.start(store=FileOffsetStore(path))
    try:
        got = events(drain(again, db.insert_lsn()))
    finally:
        again.stop()
    assert [e.key["id"] for e in got if e.key] == [1, 2]


@pytest.mark.slow
def test_cli_offset_ahead_of_the_server_exits_2_and_leaves_the_slot(
        db: Database, tmp_path: Path) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    path = tmp_path / "offsets.json"
    first = _cli(db, "--snapshot-mode", "no_data", "--offsets", str(path), "--stop-at-end")
    assert first.returncode == 0, first.stderr
    stored = json.loads(path.read_text())
    (key,) = stored
    slot_before = db.settled_scalar("SELECT (confirmed_flush_lsn - '0/0')::bigint "
                                    "FROM pg_replication_slots", stored[key]["lsn"])
    db.autocommit("INSERT INTO t VALUES (1)", "INSERT INTO t VALUES (2)")
    ahead = db.insert_lsn() + _AHEAD_BY
    path.write_text(json.dumps({key: {"lsn": ahead, "snapshot_completed": True}}))

    refused = _cli(db, "--offsets", str(path), "--stop-at-end")
    assert refused.returncode == 2, refused.stderr
    line = _one_error_line(refused)
    assert line.startswith("error: offsets: ")
    assert str(path) in line and repr(key) in line and lsn_to_str(ahead) in line
    assert refused.stdout == ""
    assert _confirmed(db) == slot_before
    assert json.loads(path.read_text()) == {key: {"lsn": ahead, "snapshot_completed": True}}

    path.unlink()  # the way out the message names
    rest = _cli(db, "--offsets", str(path), "--stop-at-end", "--no-tombstones")
    assert rest.returncode == 0, rest.stderr
    # A new snapshot (no offset), and the stream from the slot's old position.
    changes = [json.loads(ln)["value"] for ln in rest.stdout.splitlines()]
    assert [c["after"]["id"] for c in changes if c["op"] == "c"] == [1, 2]


def test_engine_task_refuses_an_offset_ahead_of_the_server(db: Database) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    source = PostgresConnector({"dsn": db.dsn, "table_include_list": ["public.t"],
                                      "snapshot_mode": "no_data"})
    task = source.create_task(source.task_configs(1)[0])
    store = MemoryOffsetStore()
    ahead = db.insert_lsn() + _AHEAD_BY
    store.save(f"postgres/{db.name}/{SLOT}", {"lsn": ahead, "snapshot_completed": True})
    try:
        with pytest.raises(ConfigError) as info:
            task.start(store)
            task.poll()
    finally:
        task.stop()
    assert lsn_to_str(ahead) in str(info.value)
    assert _slots_and_publications(db) == (0, 0)


# -- 13. offsets files of the wrong shape, or where nothing can be written ------------------
_BAD_SHAPES = {
    "lsn-text": ('{"KEY": {"lsn": "abc"}}', '"abc"'),
    "offset-number": ('{"KEY": 5}', "5"),
    "top-level-list": ('[{"lsn": 1}]', "JSON object"),
    "no-lsn": ('{"KEY": {"snapshot_completed": true}}', "lsn"),
    "negative-lsn": ('{"KEY": {"lsn": -1, "snapshot_completed": true}}', "-1"),
    "boolean-lsn": ('{"KEY": {"lsn": true, "snapshot_completed": true}}', "true"),
    "completed-text": ('{"KEY": {"lsn": 1, "snapshot_completed": "yes"}}', '"yes"'),
}


@pytest.mark.parametrize("content,shown", list(_BAD_SHAPES.values()), ids=list(_BAD_SHAPES))
def test_cli_offsets_of_the_wrong_shape_exit_2_before_any_slot(
        db: Database, tmp_path: Path, content: str, shown: str) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY)", "INSERT INTO t VALUES (1)")
    path = tmp_path / "offsets.json"
    path.write_text(content.replace("KEY", f"postgres/{db.name}/{SLOT}"))
    proc = _cli(db, "--offsets", str(path), "--stop-at-end")
    assert proc.returncode == 2, proc.stderr
    line = _one_error_line(proc)
    assert line.startswith("error: offsets: ")
    assert str(path) in line
    assert shown in line  # what is wrong
    assert "lsn" in line or "object" in line  # what is allowed
    assert proc.stdout == ""
    assert _slots_and_publications(db) == (0, 0)


def _under_a_file(tmp_path: Path) -> Path:
    parent = tmp_path / "plain-file"
    parent.write_text("not a directory")
    return parent / "offsets.json"


@pytest.mark.parametrize("where", [
    _under_a_file,
    # procfs refuses new files to root as well.
    lambda tmp_path: Path(f"/proc/tidemark-offsets-{os.getpid()}.json"),
], ids=["parent-is-a-file", "under-proc"])
def test_cli_unwritable_offsets_path_exits_2_before_any_slot(
        db: Database, tmp_path: Path, where: Callable[[Path], Path]) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY)", "INSERT INTO t VALUES (1)")
    path = where(tmp_path)
    proc = _cli(db, "--offsets", str(path), "--stop-at-end")
    assert proc.returncode == 2, proc.stderr
    line = _one_error_line(proc)
    assert line.startswith("error: offsets: ")
    assert str(path.parent) in line
    assert proc.stdout == ""
    assert _slots_and_publications(db) == (0, 0)


# -- 10. stdout closed by its reader --------------------------------------------------------
def _read_line(fd: int, timeout_s: float) -> bytes:
    """One line from the pipe *fd*, read with a deadline."""
    data = b""
    deadline = time.monotonic() + timeout_s
    while b"\n" not in data:
        left = deadline - time.monotonic()
        assert left > 0, f"no line within {timeout_s}s (got {data!r})"
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            chunk = os.read(fd, 65536)
            assert chunk, f"the pipe closed before a whole line (got {data!r})"
            data += chunk
    return data


def _unread(fd: int) -> int:
    """Bytes waiting in the pipe *fd*."""
    buf = fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0")
    return int.from_bytes(buf, sys.byteorder)


def _saved_lsn(path: Path) -> int:
    (offset,) = json.loads(path.read_text()).values()
    return int(offset["lsn"])


@pytest.mark.slow
@pytest.mark.parametrize("unbuffered", [False, True], ids=["buffered", "PYTHONUNBUFFERED"])
def test_cli_closed_stdout_fails_keeping_only_what_was_written(
        db: Database, tmp_path: Path, unbuffered: bool) -> None:
    """``tidemark capture | head -1``: the capture exits non-zero, and its offset covers
    the line head read but not the one that was being written when head left.

    Under PYTHONUNBUFFERED Python's stdout is the raw file, whose write() reports a write
    cut short only in its return value."""
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text NOT NULL)")
    path = tmp_path / "offsets.json"
    stderr_path = tmp_path / "capture.stderr"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    if unbuffered:
        env["PYTHONUNBUFFERED"] = "1"
    with stderr_path.open("wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tidemark", "capture", "--table", "public.t",
             "--snapshot-mode", "no_data", "--offsets", str(path), "--no-tombstones",
             "--offset-flush-interval-ms", "0"],
            stdout=subprocess.PIPE, stderr=stderr, env={**env, "TIDEMARK_DSN": db.dsn})
    try:
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        # The smallest pipe the kernel allows: the transaction below cannot fit into it.
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, 4096)
        capacity = fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ)
        wait_for(path.exists, 20, "the capture's first offset")
        started_at = _saved_lsn(path)

        db.autocommit("INSERT INTO t VALUES (1, 'first')")
        first = _read_line(fd, 20)
        assert json.loads(first.split(b"\n")[0])["key"] == {"id": 1}
        # Written in full, so saved: a restart must not repeat it.
        wait_for(lambda: _saved_lsn(path) > started_at, 20, "the offset of the first line")
        after_first = _saved_lsn(path)

        # One line far larger than the pipe: the capture is stuck in the middle of writing
        # it once the pipe is full, and closing the pipe then cuts it.
        db.autocommit("INSERT INTO t VALUES (2, repeat('x', 50000))")
        wait_for(lambda: _unread(fd) >= capacity - 512, 20, "the capture to fill the pipe")
        proc.stdout.close()  # head -1 has what it wanted
        try:
            rc = proc.wait(20)
        except subprocess.TimeoutExpired:
            raise AssertionError("the capture went on after its stdout was closed: it took "
                                 "the cut write for a whole one") from None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    stderr_text = stderr_path.read_text()
    assert rc != 0, stderr_text
    assert "Traceback" not in stderr_text and "Exception ignored" not in stderr_text
    lines = stderr_text.strip().splitlines()
    assert len(lines) == 1, stderr_text
    assert lines[0].startswith("error: ") and "stdout" in lines[0], stderr_text
    assert str(path) in lines[0]
    assert _saved_lsn(path) >= after_first

    rest = _cli(db, "--offsets", str(path), "--stop-at-end", "--no-tombstones")
    assert rest.returncode == 0, rest.stderr
    ids = [json.loads(ln)["key"]["id"] for ln in rest.stdout.splitlines()]
    # Not the first line (delivered and saved), but the one that was cut.
    assert ids == [2]
    assert len(rest.stdout) > capacity
