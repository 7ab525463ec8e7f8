"""Whether a pipeline's run may be running, from its run record (tidemark.run_record)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import msgspec

from tidemark.run_record import FILE_NAME, RunRecord, may_be_running


def _record(checkpoint: Path, **fields: object) -> None:
    (checkpoint / FILE_NAME).write_bytes(msgspec.json.encode(RunRecord(**fields)))


def test_a_running_record_is_running_only_while_its_process_lives(tmp_path: Path) -> None:
    assert not may_be_running(str(tmp_path)), "never run"
    here = socket.gethostname()
    _record(tmp_path, outcome="running", host=here, pid=os.getpid())
    assert may_be_running(str(tmp_path))
    _record(tmp_path, outcome="finished", host=here, pid=os.getpid())
    assert not may_be_running(str(tmp_path))

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    _record(tmp_path, outcome="running", host=here, pid=dead.pid)
    assert not may_be_running(str(tmp_path)), "a killed run leaves 'running' behind"

    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    os.waitid(os.P_PID, zombie.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped
    _record(tmp_path, outcome="running", host=here, pid=zombie.pid)
    assert not may_be_running(str(tmp_path))
    zombie.wait()

    # Another host's process cannot be looked at; a record without one is old.
    _record(tmp_path, outcome="running", host=here + "-elsewhere", pid=dead.pid)
    assert may_be_running(str(tmp_path))
    _record(tmp_path, outcome="running")
    assert may_be_running(str(tmp_path))
