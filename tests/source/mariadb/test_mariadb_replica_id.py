"""Two captures of one MariaDB server with one replica id (``server_id``) would end
each other's binlog dump over and over: the second is refused at its start, in one line
naming the id and what to do, and the first streams on. Another topic prefix (which
derives another id) lets the second run."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from conftest import MariaDatabase
from mariadb_helpers import _capture_process, _ids, _lines, _wait_for_offsets
from tidemark.source.mariadb.config import MariaDbSourceConfig


def _capture(dsn: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tidemark", "capture", "--dsn", dsn,
                           "--stop-at-end", *extra],
                          capture_output=True, text=True, timeout=60, check=False)


def test_a_second_capture_with_the_same_server_id_is_refused(
        mdb: MariaDatabase, tmp_path: Path,
        kill_on_exit: list[subprocess.Popen[bytes]]) -> None:
    mdb.execute("CREATE TABLE t (id INT PRIMARY KEY)", "INSERT INTO t VALUES (1)")
    out = tmp_path / "first.jsonl"
    first = _capture_process(mdb.dsn, tmp_path / "offsets.json", out)
    kill_on_exit.append(first)
    _wait_for_offsets(tmp_path / "offsets.json", first)

    second = _capture(mdb.dsn)
    assert second.returncode != 0
    assert second.stdout == ""
    lines = [line for line in second.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, second.stderr
    server_id = MariaDbSourceConfig.from_mapping({"dsn": mdb.dsn}).replica_server_id
    assert f"server_id {server_id} is in use by another capture" in lines[0]
    assert "--topic-prefix" in lines[0]

    # The first kept its dump: a change made now reaches it.
    mdb.execute("INSERT INTO t VALUES (2)")
    deadline = time.monotonic() + 30
    while 2 not in _ids(_lines(out)):
        assert first.poll() is None, "the first capture stopped"
        assert time.monotonic() < deadline, "the first capture lost its stream"
        time.sleep(0.05)

    other = _capture(mdb.dsn, "--topic-prefix", "other")  # another derived server_id
    assert other.returncode == 0, other.stderr
    assert len(other.stdout.splitlines()) >= 2
    first.terminate()
    first.wait(timeout=30)
    # Once the first let go, the id is free again.
    again = _capture(mdb.dsn, "--snapshot-mode", "no_data")
    assert again.returncode == 0, again.stderr
