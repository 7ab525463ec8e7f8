"""``tidemark logtable`` and ``tidemark capture`` of log tables, as a user runs them:
install, status, a capture SIGKILLed under a writer and restarted from its offsets
(nothing lost), two captures sharing the groups, and the errors a user can make."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from logtable_helpers import LogDb, reader
from tidemark.offsets.file import FileOffsetStore
from tidemark.source.spi import save_offset
from waiting import wait_for


def _tidemark(*args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tidemark", *args], capture_output=True,
                          text=True, timeout=120, check=False, **kwargs)


def _capture_args(logdb: LogDb, *args: str) -> list[str]:
    source = [] if logdb.kind == "sqlite" else ["--source", "logtable"]
    return [sys.executable, "-m", "tidemark", "capture", "--dsn", logdb.dsn, *source, *args]


def _replay(lines: list[str]) -> dict[int, dict[str, Any]]:
    """Apply captured JSON lines (cells) group by group in ``source.time`` order."""
    values = [json.loads(line)["value"] for line in lines]
    changes = sorted((v for v in values if v is not None),
                     key=lambda v: v["source"]["time"])
    state: dict[int, dict[str, Any]] = {}
    for value in changes:
        row = value["after"] or value["before"]
        key = row["id"]
        if value["op"] == "d":
            state.pop(key, None)
            continue
        current = state.setdefault(key, {"id": key})
        for name, cell in row.items():
            if name != "id" and cell is not None:
                current[name] = cell["value"]
    return state


def test_install_status_and_uninstall(logdb: LogDb) -> None:
    logdb.execute("CREATE TABLE t (id integer PRIMARY KEY, v text)")
    done = _tidemark("logtable", "install", logdb.dsn, "--table", "t", "--groups", "4",
                     "--streams", "64")
    assert done.returncode == 0, done.stderr
    assert "64 streams in 4 groups" in done.stdout
    logdb.execute("INSERT INTO t VALUES (1, 'a')", "INSERT INTO t VALUES (2, 'b')")
    status = _tidemark("logtable", "status", logdb.dsn, "--json")
    assert status.returncode == 0, status.stderr
    report = json.loads(status.stdout)
    assert report["generations"][0]["streams"] == 64
    assert [t["rows"] for t in report["tables"]] == [2]
    removed = _tidemark("logtable", "uninstall", logdb.dsn)
    assert removed.returncode == 0, removed.stderr
    logdb.execute("INSERT INTO t VALUES (3, 'c')")  # no trigger left to fail or log
    status = _tidemark("logtable", "status", logdb.dsn)
    assert "no log tables installed" in status.stdout


def test_bad_input_names_what_is_wrong(logdb: LogDb, tmp_path: Path) -> None:
    logdb.execute("CREATE TABLE keyless (a integer)", "CREATE TABLE t (id integer PRIMARY KEY)")
    done = _tidemark("logtable", "install", logdb.dsn, "--table", "keyless")
    assert done.returncode == 2 and "no primary key" in done.stderr
    done = _tidemark("logtable", "install", logdb.dsn, "--table", "t", "--streams", "10",
                     "--groups", "4")
    assert done.returncode == 2 and "multiple of the groups" in done.stderr
    done = _tidemark("logtable", "install", logdb.dsn, "--table", "missing")
    assert done.returncode == 2 and "missing" in done.stderr
    captured = subprocess.run(_capture_args(logdb, "--stop-at-end"), capture_output=True,
                              text=True, timeout=60, check=False)
    assert captured.returncode == 2 and "logtable install" in captured.stderr
    captured = subprocess.run(_capture_args(logdb, "--slot", "s"), capture_output=True,
                              text=True, timeout=60, check=False)
    assert captured.returncode == 2 and "--slot does not apply to log tables" in captured.stderr
    missing = subprocess.run([sys.executable, "-m", "tidemark", "capture", "--dsn",
                              f"sqlite:///{tmp_path}/nothing.db"], capture_output=True,
                             text=True, timeout=60, check=False)
    assert missing.returncode == 2 and "does not exist" in missing.stderr


def test_a_killed_capture_resumes_from_its_group_offsets_and_loses_nothing(
        logdb: LogDb, tmp_path: Path) -> None:
    logdb.execute("CREATE TABLE t (id integer PRIMARY KEY, v integer, note text)")
    logdb.install(["t"], streams=32, groups=8)
    offsets = tmp_path / "offsets.json"
    out1 = tmp_path / "first.jsonl"
    stop = threading.Event()
    written = [0]

    def writer() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            logdb.execute(f"INSERT INTO t VALUES ({n}, {n}, 'x')",
                          f"UPDATE t SET v = v + 1, note = NULL WHERE id = {max(1, n - 3)}")
            if n % 5 == 0:
                logdb.execute(f"DELETE FROM t WHERE id = {n - 2}")
            written[0] = n

    thread = threading.Thread(target=writer)
    thread.start()
    with out1.open("w") as sink:
        first = subprocess.Popen(_capture_args(logdb, "--offsets", str(offsets),
                                               "--offset-flush-interval-ms", "0"),
                                 stdout=sink, stderr=subprocess.PIPE)
        try:
            wait_for(lambda: offsets.exists() and out1.stat().st_size > 20_000, 60,
                     "the first capture's output and offsets")
        finally:
            os.kill(first.pid, signal.SIGKILL)
            first.wait()
    stop.set()
    thread.join()
    assert written[0] > 20
    second = subprocess.run(_capture_args(logdb, "--offsets", str(offsets), "--stop-at-end"),
                            capture_output=True, text=True, timeout=120, check=False)
    assert second.returncode == 0, second.stderr
    lines = [line for line in out1.read_text().splitlines() if line.endswith("}")]
    # The killed capture may have cut its last line; only whole lines count.
    whole = []
    for line in lines:
        try:
            json.loads(line)
        except ValueError:
            continue
        whole.append(line)
    lines = whole + second.stdout.splitlines()
    times = {json.loads(line)["value"]["source"]["time"] for line in lines
             if json.loads(line)["value"] is not None}
    logged = logdb.query('SELECT count(*) FROM t_cdc_log')[0][0]
    assert len(times) == logged, "a change was lost across the kill"
    rows = {r[0]: {"id": r[0], "v": r[1], "note": r[2]}
            for r in logdb.query("SELECT id, v, note FROM t")}
    assert _replay(lines) == rows


def test_stop_at_end_from_an_offset_left_mid_step_reads_what_came_before_it(
        logdb: LogDb, tmp_path: Path) -> None:
    """A capture stopped (or killed) part way through a read leaves its group's offset
    there; on PostgreSQL that is mid-step, at a snapshot older than the next run. A
    bounded run from that offset must still read every transaction committed before it
    starts, not stop once the old step is read."""
    logdb.execute("CREATE TABLE t (id integer PRIMARY KEY, v text)")
    logdb.install(["t"], streams=8, groups=1)
    logdb.execute(*(f"INSERT INTO t VALUES ({i}, 'a')" for i in range(1, 11)))
    offsets = tmp_path / "offsets.json"
    store = FileOffsetStore(offsets)
    first = reader(logdb, store=store, max_batch_events=4)
    batch = first.poll()
    assert len(batch.records) == 4 and batch.offset is not None
    save_offset(store, first, batch.offset)
    first.stop()
    if logdb.kind == "postgres":  # the case this test is for: the offset is mid-step
        assert "step" in batch.offset["groups"]["0"]
    for i in range(11, 16):
        logdb.execute(f"INSERT INTO t VALUES ({i}, 'b')")
    done = subprocess.run(_capture_args(logdb, "--offsets", str(offsets), "--stop-at-end"),
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    ids = sorted(json.loads(line)["key"]["id"] for line in done.stdout.splitlines())
    assert ids == list(range(5, 16))


def test_two_captures_share_the_groups(logdb: LogDb) -> None:
    logdb.execute("CREATE TABLE t (id integer PRIMARY KEY, v text)")
    logdb.install(["t"], streams=16, groups=4)
    logdb.execute(*(f"INSERT INTO t VALUES ({i}, 'a')" for i in range(200)))
    outputs = []
    for task in ("0", "1"):
        done = subprocess.run(_capture_args(logdb, "--tasks", "2", "--task", task,
                                            "--stop-at-end"),
                              capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr
        outputs.append([json.loads(line)["key"]["id"] for line in done.stdout.splitlines()])
    assert all(outputs)
    assert sorted(outputs[0] + outputs[1]) == list(range(200))


def test_status_counts_unread_changes_and_reports_a_missing_log(logdb: LogDb,
                                                                tmp_path: Path) -> None:
    logdb.execute("CREATE TABLE t (id integer PRIMARY KEY, v text)")
    logdb.install(["t"], streams=8, groups=2)
    logdb.execute(*(f"INSERT INTO t VALUES ({i}, 'a')" for i in range(30)))
    offsets = tmp_path / "offsets.json"
    source = [] if logdb.kind == "sqlite" else ["--source", "logtable"]

    def status() -> tuple[int, dict[str, Any]]:
        done = _tidemark("status", "--dsn", logdb.dsn, *source, "--offsets", str(offsets),
                         "--json")
        assert done.returncode in (0, 1), done.stderr
        return done.returncode, json.loads(done.stdout)

    code, report = status()
    assert code == 0 and report["source"] == "logtable"
    assert report["lag"]["changes"] == 30
    done = subprocess.run(_capture_args(logdb, "--offsets", str(offsets), "--stop-at-end"),
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    logdb.execute("INSERT INTO t VALUES (100, 'b')")
    code, report = status()
    assert code == 0 and report["lag"]["changes"] == 1
    assert report["offsets"]["groups"] == 2
    log = "t_cdc_log"
    if logdb.kind == "postgres":
        logdb.execute("SET tidemark.logtable_ddl = 'on'", f"DROP TABLE {log}")
    else:
        logdb.execute(f"DROP TABLE {log}")
    code, report = status()
    assert code == 1 and any("missing" in p for p in report["problems"])
