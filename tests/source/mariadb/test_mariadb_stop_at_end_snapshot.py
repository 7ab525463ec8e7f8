"""``tidemark capture --stop-at-end`` on MariaDB waits for the incremental snapshots
signalled before its end, as on PostgreSQL, even beside a writer that never pauses
(chunks read after the log's end at the start went on only in the next capture)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
from pathlib import Path

from conftest import MariaDatabase
from mariadb_helpers import _capture_process, _lines
from tidemark import send_signal

_ROWS = 3000


def test_stop_at_end_waits_for_a_snapshot_signalled_before_it(
        mdb: MariaDatabase, tmp_path: Path,
        kill_on_exit: list[subprocess.Popen[bytes]]) -> None:
    mdb.execute("CREATE TABLE t (id INT PRIMARY KEY, pad VARCHAR(100))",
                "CREATE TABLE w (id INT PRIMARY KEY)",
                "CREATE TABLE sig (id VARCHAR(42) PRIMARY KEY, type VARCHAR(32) NOT NULL, "
                "data VARCHAR(2048))",
                f"INSERT INTO t SELECT seq, REPEAT('x', 100) FROM seq_1_to_{_ROWS}")
    offsets = tmp_path / "offsets.json"
    options = ("--snapshot-mode", "no_data", "--signal-table", f"{mdb.name}.sig",
               "--incremental-snapshot-chunk-size", "100", "--heartbeat-interval-ms", "200",
               "--stop-at-end")
    first = _capture_process(mdb.dsn, offsets, tmp_path / "first.jsonl", *options)
    kill_on_exit.append(first)
    assert first.wait(timeout=60) == 0  # places the capture before the signal
    send_signal(mdb.dsn, f"{mdb.name}.sig", "execute-snapshot",
                {"data-collections": [f"{mdb.name}.t"]})
    stop = threading.Event()
    writer = threading.Thread(target=_write, args=(mdb, stop), daemon=True)
    writer.start()
    try:
        out = tmp_path / "second.jsonl"
        second = _capture_process(mdb.dsn, offsets, out, *options)
        kill_on_exit.append(second)
        # Generous: on a loaded 2-core machine this took 133 s once (4-14 s alone).
        _, err = second.communicate(timeout=300)
    finally:
        stop.set()
        writer.join(timeout=30)
    assert second.returncode == 0, err.decode()[-3000:]
    values = [json.loads(line)["value"] for line in _lines(out)]
    reads = [v["after"]["id"] for v in values
             if v is not None and v["op"] == "r" and v["source"]["table"] == "t"]
    assert sorted(reads) == list(range(1, _ROWS + 1))  # every row, once


def _write(mdb: MariaDatabase, stop: threading.Event) -> None:
    """A commit after another on another table, until *stop*: the stream never idles."""
    with contextlib.closing(mdb.server.connect(mdb.name)) as conn, conn.cursor() as cur:
        i = 0
        while not stop.is_set():
            i += 1
            cur.execute("INSERT INTO w VALUES (%s)", (i,))
