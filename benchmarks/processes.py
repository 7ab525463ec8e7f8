"""Running a contender as a process and measuring it: what every benchmark shares."""

from __future__ import annotations

import os
import subprocess
import time
from typing import IO


def run_measured(argv: list[str], env: dict[str, str] | None = None,
                 stdout: int | IO[bytes] = subprocess.DEVNULL) -> tuple[float, int, str]:
    """Run to completion; returns (seconds from start to exit, peak RSS in bytes,
    stderr text). A failure ends the benchmark with the process's stderr."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=stdout, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    err = proc.stderr.read()  # a few log lines; EOF when the process exits
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    text = err.decode(errors="replace")
    if proc.returncode != 0:
        raise SystemExit(f"{argv[0]} {' '.join(argv[1:4])}… failed ({proc.returncode}):\n{text}")
    return elapsed, usage.ru_maxrss * 1024, text


def first_line_seconds(argv: list[str], env: dict[str, str]) -> float:
    """Seconds from starting *argv* to its first line on stdout (then it is stopped)."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdout is not None
    proc.stdout.readline()
    elapsed = time.perf_counter() - started
    proc.terminate()
    proc.wait()
    return elapsed
