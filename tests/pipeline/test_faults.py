"""tidemark.faults: the crash hook of the exactly-once tests does nothing unless asked,
and then kills at exactly the named point, taking its whole process group along."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tidemark import faults

_CHILD = """
import subprocess, sys
from tidemark import faults
# A second process in the group stands in for Spark's JVM: it must die too.
sibling = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(sibling.pid, flush=True)
for n in range(3):
    faults.crash_point("after_read", n)
    faults.crash_point("between_targets", n)
    faults.crash_point("after_write", n)
"""


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.parametrize(("fault", "killed"), [
    ("after_write:1", True), ("between_targets:2", True), (None, False),
    ("after_write:7", False), ("before_advance:1", False),
])
def test_only_the_named_point_kills_the_process_group(fault: str | None,
                                                      killed: bool) -> None:
    env = {k: v for k, v in os.environ.items() if k != faults.ENV}
    if fault is not None:
        env[faults.ENV] = fault
    child = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True,
                           text=True, timeout=60, start_new_session=True, check=False)
    sibling = int(child.stdout.split()[0])
    try:
        assert child.returncode == (-signal.SIGKILL if killed else 0), child.stderr
        deadline = time.monotonic() + 5
        while killed and _alive(sibling) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _alive(sibling) != killed
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(sibling, signal.SIGKILL)


_WORKER_CHILD = """
import subprocess, sys
# A process in a group of its own, as PySpark's daemon puts the executors' workers.
worker = subprocess.Popen([sys.executable, "-c",
                           "from tidemark import faults; faults.crash_point('mor_after_files', 3)"],
                          process_group=0)
worker.wait()
print("the driver outlived its worker's crash", flush=True)
"""


def test_a_crash_in_a_worker_of_its_own_group_kills_the_session_leader() -> None:
    env = {**os.environ, faults.ENV: "mor_after_files:3"}
    child = subprocess.run([sys.executable, "-c", _WORKER_CHILD], env=env,
                           capture_output=True, text=True, timeout=60,
                           start_new_session=True, check=False)
    assert child.returncode == -signal.SIGKILL, (child.stdout, child.stderr)


def test_a_bad_value_names_the_points(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(faults.ENV, "after_wirte:1")
    faults._armed.cache_clear()
    try:
        with pytest.raises(ValueError, match="after_read, between_steps, between_targets, "
                                             "after_write, "
                                             "before_advance"):
            faults.crash_point("after_write", 1)
    finally:
        monkeypatch.delenv(faults.ENV)
        faults._armed.cache_clear()
