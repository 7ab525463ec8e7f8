"""A Spark standalone cluster on loopback, started from the pyspark wheel itself.

A master and N workers, each its own JVM (``spark-class …deploy.master.Master`` /
``…deploy.worker.Worker``), as on a real cluster: a driver that connects to
:attr:`SparkStandaloneCluster.master_url` gets executors in the workers' JVMs, whose
Python workers import tidemark from the interpreter the driver names
(``PYSPARK_PYTHON``), so tidemark reaches them as it would on a cluster where it is
installed on every node. For tests and benchmarks; nothing here is needed to run
tidemark on an existing cluster.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from types import TracebackType

import pyspark

from tidemark.errors import TidemarkError
from tidemark.testing.local_server import free_port


class SparkClusterError(TidemarkError):
    """The standalone cluster did not start."""


class SparkStandaloneCluster:
    """A master and *workers* workers of *cores* cores and *memory_mb* each, their
    logs and work directories under *work_dir*."""

    def __init__(self, work_dir: Path, *, workers: int = 2, cores: int = 1,
                 memory_mb: int = 2048) -> None:
        self.work_dir = work_dir
        self.workers, self.cores, self.memory_mb = workers, cores, memory_mb
        self.port, self.ui_port = free_port(), free_port()
        self._master: subprocess.Popen[bytes] | None = None
        self._workers: list[subprocess.Popen[bytes]] = []
        self._spark_class = Path(pyspark.__file__).parent / "bin" / "spark-class"

    @property
    def master_url(self) -> str:
        """``spark://127.0.0.1:PORT``: the ``master`` a driver connects to."""
        return f"spark://127.0.0.1:{self.port}"

    def worker_dir(self, index: int) -> Path:
        """Worker *index*'s work directory (one sub-directory per application)."""
        return self.work_dir / f"worker{index}"

    def _launch(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1",
               "SPARK_HOME": str(self._spark_class.parent.parent)}
        with (self.work_dir / f"{name}.log").open("ab") as out:
            # Its own session: a kill of the group takes the worker's executors with it.
            return subprocess.Popen([str(self._spark_class), *args], stdout=out,
                                    stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)

    def start(self) -> SparkStandaloneCluster:
        """Start the master and the workers; return once every worker is registered."""
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self._master = self._launch("master", [
            "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
            "--port", str(self.port), "--webui-port", str(self.ui_port)])
        for index in range(self.workers):
            self.worker_dir(index).mkdir(exist_ok=True)
            self._workers.append(self._launch(f"worker{index}", [
                "org.apache.spark.deploy.worker.Worker", self.master_url,
                "--host", "127.0.0.1", "--cores", str(self.cores),
                "--memory", f"{self.memory_mb}m", "--webui-port", "0",
                "--work-dir", str(self.worker_dir(index))]))
        self.wait_for_workers(self.workers, timeout_s=120)
        return self

    def state(self) -> dict[str, object]:
        """The master's state (its web UI's ``/json``)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/",
                                    timeout=5) as reply:
            return dict(json.load(reply))

    def alive_workers(self) -> int:
        """Workers the master sees alive."""
        workers = self.state().get("workers", [])
        assert isinstance(workers, list)
        return sum(1 for w in workers if w.get("state") == "ALIVE")

    def wait_for_workers(self, count: int, *, timeout_s: float) -> None:
        """Until the master sees exactly *count* workers alive."""
        deadline = time.monotonic() + timeout_s
        while True:
            with contextlib.suppress(OSError, ValueError):
                if self.alive_workers() == count:
                    return
            if self._master is not None and self._master.poll() is not None:
                raise SparkClusterError(self._log_tail("master"))
            if time.monotonic() > deadline:
                raise SparkClusterError(f"{count} workers were not alive after "
                                        f"{timeout_s:.0f} s:\n{self._log_tail('master')}")
            time.sleep(0.2)  # polling the master

    def kill_worker(self, index: int) -> None:
        """SIGKILL worker *index* and its executors (a machine lost)."""
        _kill(self._workers[index])

    def _log_tail(self, name: str) -> str:
        path = self.work_dir / f"{name}.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def stop(self) -> None:
        """Kill the workers and the master (their state is not needed afterwards)."""
        for process in [*self._workers, *([self._master] if self._master else [])]:
            _kill(process)
        self._workers, self._master = [], None

    def __enter__(self) -> SparkStandaloneCluster:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.stop()


def _kill(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL *process* and its session (a worker's executors with it)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(30)
