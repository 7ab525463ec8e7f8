"""`tidemark run` helpers shared by the pipeline, snapshot and cluster tests."""

from __future__ import annotations

import contextlib
import os
import random
import re
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from conftest import Database
from delta_rows import live_count, live_table
from tidemark.pipeline import load_config
from tidemark.pipeline.compare import compare
from tidemark.pipeline.progress import BatchReport
from tidemark.pipeline.runner import Pipeline
from tidemark.source.postgres import wal_reads as wal
from tidemark.testing.postgres import PostgresCluster, sql_connection


def _prepare(db: Database, *tables: str) -> str:
    """Publication and slot before the first change (the stream starts at the slot)."""
    db.autocommit(f"CREATE PUBLICATION p_{db.name} FOR TABLE {', '.join(tables)}")
    with contextlib.closing(wal.connect(db.dsn, purpose="test")) as conn:
        wal.ensure_slot(conn, f"s_{db.name}")
    return f'slot = "s_{db.name}"\npublication = "p_{db.name}"\n'


def _pipeline_file(tmp_path: Path, source: str, spark: str, *,
                   changelog: bool = True) -> Path:
    """a (SCD1) and b (SCD2); with a change log, the batch takes Spark's column path.
    No snapshot: these tests stream every change from a slot made before the first one
    (snapshots: test_pipeline_snapshot.py)."""
    file = tmp_path / "pipeline.toml"
    file.write_text(f"[source]\n{source}\n[spark]\ncheckpoint = \"chk\"\n{spark}\n"
                    '[targets."public.a"]\npath = "lake/a"\nkeys = ["id"]\n'
                    'snapshot = "never"\n\n'
                    '[targets."public.b"]\npath = "lake/b"\nkeys = ["id"]\n'
                    'stored_as_scd_type = 2\nsnapshot = "never"\n')
    if changelog:
        with file.open("a") as out:
            out.write("\n[changelog]\npath = \"lake/_changes\"\n")
    return file


def _assert_equal_to_source(db: Database, tmp_path: Path) -> int:
    """Both targets equal the source; returns the number of SCD2 versions of b."""
    source, lake = compare(db.dsn, "public.a", str(tmp_path / "lake/a"), ["id", "v", "n"])
    assert source == lake
    source, lake = compare(db.dsn, "public.b", str(tmp_path / "lake/b"), ["id", "v"],
                           scd2=True)
    assert source == lake
    history = live_table(DeltaTable(str(tmp_path / "lake/b")))
    versions = Counter(zip(history.column("id").to_pylist(),
                           history.column("__START_AT").to_pylist(), strict=True))
    assert max(versions.values()) == 1, "an SCD2 version was applied twice"
    return history.num_rows


def _lake_equals(db: Database, tmp_path: Path) -> bool:
    """Whether both targets equal the source now (for polling)."""
    try:
        _assert_equal_to_source(db, tmp_path)
    except AssertionError:
        return False
    return True


def _batch_lines(log: Path) -> list[str]:
    return [line for line in log.read_text(errors="replace").splitlines()
            if line.startswith("batch ")]


class _Writer(threading.Thread):
    """Small random transactions on a and b (ids 1..40 churn), counted in ``committed``,
    until :meth:`finish`, at most *limit* (500: a bounded backlog keeps the catch-up after
    the crash short; None: no limit). Each has 1 to *changes* changes (:meth:`_change`),
    *pause_s* apart."""

    def __init__(self, dsn: str, seed: int, *, limit: int | None = 500, changes: int = 4,
                 pause_s: float = 0.02) -> None:
        super().__init__(daemon=True)
        self.dsn = dsn
        self.rng = random.Random(seed)
        self.limit = limit
        self.changes = changes
        self.pause_s = pause_s
        self.committed = 0
        self.error: BaseException | None = None
        self._halt = threading.Event()

    def run(self) -> None:
        rng = self.rng
        try:
            with contextlib.closing(sql_connection(self.dsn)) as conn:
                while not self._halt.is_set() and (self.limit is None
                                                   or self.committed < self.limit):
                    with conn.transaction(), conn.cursor() as cur:
                        for _ in range(rng.randint(1, self.changes)):
                            self._change(cur, rng)
                    self.committed += 1
                    time.sleep(self.pause_s)  # pacing the writer, not waiting for a condition
        except BaseException as err:  # reported by finish()
            self.error = err

    def _change(self, cur: Any, rng: random.Random) -> None:
        key = rng.randint(1, 40)
        table = rng.choice("ab")
        op = rng.random()
        if op < 0.5:
            cur.execute(f"INSERT INTO {table} (id, v) VALUES (%s, %s) "
                        "ON CONFLICT (id) DO UPDATE SET v = excluded.v",
                        (key, f"v{rng.randint(0, 999)}"))
        elif op < 0.8:
            cur.execute(f"UPDATE {table} SET v = v || '+' WHERE id = %s", (key,))
        else:
            cur.execute(f"DELETE FROM {table} WHERE id = %s", (key,))

    def finish(self) -> None:
        if self.ident is None:
            return  # never started
        self._halt.set()
        self.join(30)
        assert not self.is_alive(), "the writer did not stop"
        if self.error is not None:
            raise self.error


def _tidemark_run(config: Path, log: Path, *args: str,
                  extra_env: dict[str, str] | None = None,
                  log_level: str = "WARNING") -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, **(extra_env or {})}
    with log.open("ab") as out:
        # A new session: a SIGKILL of its process group (the tests' or tidemark.faults')
        # hits the driver and its JVM together.
        return subprocess.Popen([sys.executable, "-m", "tidemark", "--log-level", log_level,
                                 "run", str(config), *args],
                                stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)


def _wait_for_batches(log: Path, count: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        applied = [line for line in log.read_text(errors="replace").splitlines()
                   if line.startswith("batch ") and "no changes" not in line]
        if len(applied) >= count:
            return
        assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
        time.sleep(0.01)
    pytest.fail("the pipeline applied no batches in time:\n" + log.read_text()[-3000:])


class _LivePipeline:
    """A pipeline running in a thread: its batch reports, and what it raised."""

    def __init__(self, config: Any, spark: SparkSession) -> None:
        self.reports: list[BatchReport] = []
        self.failures: list[BaseException] = []
        self.pipeline = Pipeline(config, spark=spark, on_batch=self.reports.append)
        self._thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        try:
            self.pipeline.run()
        except BaseException as err:  # reported by the test
            self.failures.append(err)

    def __enter__(self) -> _LivePipeline:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.pipeline.request_stop()
        self._thread.join(120)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def wait_until(self, condition: Callable[[], bool], what: str,
                   timeout_s: float = 120) -> None:
        """Poll *condition* until it holds; fail on a pipeline failure or the deadline."""
        deadline = time.monotonic() + timeout_s
        while not condition():
            assert not self.failures, self.failures
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.05)

    def applied(self, total: int) -> None:
        """Wait until *total* changes have been applied in all."""
        self.wait_until(lambda: sum(r.total for r in self.reports) >= total,
                        f"{total} changes applied")


def check_a_snapshot_and_an_empty_table_s_snapshot(spark: SparkSession, db: Database,
                                                   tmp_path: Path, settings: str) -> None:
    """Table c (35 rows, chunks of 10) and the empty table e, loaded by their snapshots
    with the ``[spark]`` *settings*: c equals the source, e exists and is empty."""
    db.execute("CREATE TABLE c (id int PRIMARY KEY, v text)",
               "INSERT INTO c SELECT g, 'row ' || g FROM generate_series(1, 35) g",
               "CREATE TABLE e (id int PRIMARY KEY, v text)")
    file = tmp_path / "pipeline.toml"
    file.write_text(f'[source]\ndsn = "{db.dsn}"\nslot = "s_{db.name}"\n'
                    f'publication = "p_{db.name}"\nsnapshotChunkRows = 10\n'
                    f"[spark]\ncheckpoint = \"chk\"\n{settings}\n"
                    '[targets."public.c"]\npath = "lake/c"\nkeys = ["id"]\n'
                    '[targets."public.e"]\npath = "lake/e"\nkeys = ["id"]\n')
    Pipeline(load_config(file), spark=spark).run()
    source, lake = compare(db.dsn, "public.c", str(tmp_path / "lake/c"), ["id", "v"])
    assert source == lake and len(lake) == 35
    assert live_count(DeltaTable(str(tmp_path / "lake/e"))) == 0


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return str(response.read().decode())


def samples(text: str, name: str, **labels: str) -> list[float]:
    """Every sample of *name* whose labels include *labels*."""
    found = []
    for line in text.splitlines():
        match = re.fullmatch(rf"{re.escape(name)}\{{(.*)\}} (\S+)", line)
        if match and all(f'{k}="{v}"' in match.group(1) for k, v in labels.items()):
            found.append(float(match.group(2)))
    return found


def value(text: str, name: str, **labels: str) -> float:
    """The sample of *name* whose labels include *labels* (exactly one must match)."""
    found = samples(text, name, **labels)
    assert len(found) == 1, f"{name} {labels}: {found}\n{text}"
    return found[0]


def _signal_server(cluster: PostgresCluster, signum: int) -> None:
    """Send *signum* to the postmaster and every backend (the walsender included)."""

    pid = int((cluster.datadir / "postmaster.pid").read_text().splitlines()[0])
    postmaster = psutil.Process(pid)
    for process in [postmaster, *postmaster.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.send_signal(signum)
