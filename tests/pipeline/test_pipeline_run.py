"""``tidemark run`` on a real PostgreSQL and Spark: Delta equals the source, exactly once.

Spark is slow to start (about 20 s for a driver's first batch): every test shares one
in-process session except the kill tests, which run the CLI in subprocesses (a SIGKILL
must hit a whole driver, JVM included). The deterministic kill points are
:mod:`tidemark.faults`.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import shutil
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import SparkSession

from conftest import Database
from delta_rows import live_count, live_table
from pipeline_helpers import (
    _assert_equal_to_source,
    _batch_lines,
    _LivePipeline,
    _pipeline_file,
    _prepare,
    _signal_server,
    _tidemark_run,
    _wait_for_batches,
    _Writer,
    scrape,
    value,
)
from tidemark.errors import ConfigError
from tidemark.lake.written_targets import TargetLostError
from tidemark.pipeline import load_config
from tidemark.pipeline.compare import compare
from tidemark.pipeline.progress import BatchReport
from tidemark.pipeline.runner import Pipeline, PipelineError
from tidemark.source.postgres.stream_offsets import from_offset
from tidemark.testing.postgres import PostgresCluster

pytestmark = pytest.mark.integration


def _assert_changelog_once(tmp_path: Path) -> None:
    """No change twice in the Parquet change log (a replayed batch overwrites its own)."""
    changelog = pq.read_table(tmp_path / "lake/_changes")
    changes = Counter(zip(changelog.column("table").to_pylist(),
                          changelog.column("_commit_lsn").to_pylist(),
                          changelog.column("_seq").to_pylist(), strict=True))
    assert changes and max(changes.values()) == 1, "a change is twice in the change log"


def _batch_files(checkpoint: Path, log: str) -> set[int]:
    """The batch ids in Spark's ``offsets`` or ``commits`` log."""
    return {int(f.name) for f in (checkpoint / log).iterdir() if f.name.isdigit()}


def _batch_end(checkpoint: Path, batch: int) -> int:
    """A batch's end offset (LSN) from Spark's offset log."""
    lines = (checkpoint / "offsets" / str(batch)).read_text().splitlines()
    return from_offset(json.loads(lines[-1]))


def _slot_lsn(db: Database) -> int:
    return int(db.scalar("SELECT (confirmed_flush_lsn - '0/0')::bigint FROM "
                         "pg_replication_slots WHERE slot_name = %s", (f"s_{db.name}",)))


def test_available_now_makes_delta_equal_the_source_with_scd2_history(
        spark: SparkSession, db: Database, tmp_path: Path) -> None:
    db.execute("CREATE TABLE a (id int PRIMARY KEY, v text, n numeric(10, 2))",
               "CREATE TABLE b (id int PRIMARY KEY, v text)")
    source = _prepare(db, "a", "b") + f'dsn = "{db.dsn}"\nmaxChangesPerTrigger = 7\n'
    db.execute("INSERT INTO a SELECT g, 'x' || g, g / 4.0 FROM generate_series(1, 20) g",
               "INSERT INTO b SELECT g, 'first' FROM generate_series(1, 5) g")
    db.execute("UPDATE a SET v = 'updated' WHERE id <= 3", "UPDATE b SET v = 'second'")
    db.execute("UPDATE a SET id = 100 WHERE id = 4", "DELETE FROM a WHERE id = 5",
               "DELETE FROM b WHERE id = 5")
    db.execute("UPDATE b SET v = 'third' WHERE id = 1")
    config = load_config(_pipeline_file(tmp_path, source, "available_now = true"))
    flushed = int(db.scalar("SELECT (pg_current_wal_flush_lsn() - '0/0')::bigint"))
    reports = []
    Pipeline(config, spark=spark, on_batch=reports.append).run()

    assert sum(r.total for r in reports) == 20 + 5 + 3 + 5 + 2 + 1 + 1 + 1
    assert len([r for r in reports if r.total]) > 1  # maxChangesPerTrigger split it
    # b: 5 first versions, 5 second ones (id 5's closed by its delete), id 1's third.
    assert _assert_equal_to_source(db, tmp_path) == 5 + 5 + 1
    # Caught up: the last batch ends at or after everything flushed before the run. The
    # byte lag is only roughly small: it also counts WAL that the cluster's other
    # databases and background work (autovacuum, checkpoints) write meanwhile.
    last = max(_batch_files(tmp_path / "chk", "offsets"))
    assert _batch_end(tmp_path / "chk", last) >= flushed
    assert reports[-1].lag_bytes < 1 << 20 and reports[-1].lag_seconds == 0
    assert (tmp_path / "lake/_changes").is_dir()

    # A second run with nothing new changes nothing.
    version = DeltaTable(str(tmp_path / "lake/a")).version()
    Pipeline(config, spark=spark).run()
    assert DeltaTable(str(tmp_path / "lake/a")).version() == version


@contextlib.contextmanager
def _reproducible(where: str) -> Iterator[None]:
    """Prefix the message of a failed assertion with *where* (the seed of the run)."""
    try:
        yield
    except AssertionError as err:
        raise AssertionError(f"{where}: {err}") from err


@pytest.mark.slow
@pytest.mark.parametrize(("seed", "changelog"), [(1, True), (2, False), (3, True)],
                         ids=["seed1-changelog", "seed2", "seed3-changelog"])
def test_sigkill_at_a_random_moment_then_restart_loses_and_doubles_nothing(
        seed: int, changelog: bool, db: Database, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A SIGKILL at a moment the seed picks while a writer runs; the restart must catch
    up exactly. With and without a change log (without: the default path, opaque Arrow
    rows, which the kills at the named points do not take)."""
    kill_after_s = random.Random(seed).uniform(0.0, 4.0)
    where = (f"seed {seed}: SIGKILL {kill_after_s:.2f} s into the writes "
             f"({'with' if changelog else 'without'} a change log)")
    print(where)  # shown with a failure
    db.execute("CREATE TABLE a (id int PRIMARY KEY, v text, n numeric(10, 2))",
               "CREATE TABLE b (id int PRIMARY KEY, v text)")
    source = _prepare(db, "a", "b") + "maxChangesPerTrigger = 100\n"
    config = _pipeline_file(tmp_path, source, "trigger_interval_ms = 50", changelog=changelog)
    monkeypatch.setenv("TIDEMARK_DSN", db.dsn)  # the children read the DSN from here
    db.execute("INSERT INTO a VALUES (1, 'first', 1)", "INSERT INTO b VALUES (1, 'first')")
    log = tmp_path / "run.log"
    writer = _Writer(db.dsn, seed)
    try:
        proc = _tidemark_run(config, log)
        try:
            # Once the pipeline runs its batches, the writer starts, and the kill comes
            # at the seed's moment into its writes: in a batch's read, its Delta
            # writes, between Spark's commit and the slot advance, or between batches.
            _wait_for_batches(log, 1, proc)
            writer.start()
            time.sleep(kill_after_s)  # the random moment, not a wait for something
            with _reproducible(where):
                assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
                assert writer.is_alive(), "the writer had stopped: the kill was not mid-stream"
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
        committed_at_kill = writer.committed
        # Changes after the crash too.
        deadline = time.monotonic() + 30
        while writer.committed < committed_at_kill + 20:
            with _reproducible(where):
                assert writer.is_alive() and time.monotonic() < deadline, \
                    "the writer wrote nothing after the kill"
            time.sleep(0.02)
    finally:
        writer.finish()
    restart = _tidemark_run(config, log, "--available-now")
    with _reproducible(where):
        assert restart.wait(180) == 0, log.read_text(errors="replace")[-3000:]
        assert _assert_equal_to_source(db, tmp_path) > 0
        if changelog:
            _assert_changelog_once(tmp_path)


# -- a SIGKILL at each point that decides exactly once (tidemark.faults) ----------------
# Five transactions that maxChangesPerTrigger = 8 cuts into four batches (a transaction is
# never split; the third and fourth share batch 2), each of batches 1 and 2 touching
# both tables; more transactions follow each crash.
_WORKLOAD = [
    ("INSERT INTO a SELECT g, 'x' || g, g / 4.0 FROM generate_series(1, 10) g",
     "INSERT INTO b SELECT g, 'first' FROM generate_series(1, 5) g"),
    ("UPDATE a SET v = 'updated' WHERE id <= 3", "UPDATE b SET v = 'second'"),
    ("UPDATE a SET id = 100 WHERE id = 4", "DELETE FROM a WHERE id = 5",
     "DELETE FROM b WHERE id = 5"),
    ("UPDATE b SET v = 'third' WHERE id = 1", "INSERT INTO a VALUES (11, 'y', 1)"),
    ("UPDATE a SET n = n + 1", "DELETE FROM b WHERE id = 2"),
]
_AFTER_CRASHES = [
    ("UPDATE b SET v = 'fourth' WHERE id IN (1, 3)", "DELETE FROM a WHERE id = 1"),
    ("INSERT INTO b VALUES (2, 'back')", "UPDATE a SET v = 'late' WHERE id = 2"),
    ("UPDATE b SET v = 'fifth' WHERE id = 4", "INSERT INTO a VALUES (12, 'z', 3)"),
]


@pytest.mark.slow
def test_sigkill_at_each_exactly_once_point_then_restart_loses_and_doubles_nothing(
        spark: SparkSession, db: Database, tmp_path: Path) -> None:
    """A SIGKILL (a) after reading a batch, (b) after writing it to Delta, before Spark
    commits it, (c) after Spark commits it, before the slot advances, (d) after writing
    it to the first of its two Delta targets; each restart resumes from the checkpoint.

    The four kills are one chain, each restart being the next crash's run, and the
    last restart runs in this process's shared session: four driver starts instead of
    eight (a driver needs about 20 s to its first batch, most of this test's time), and
    restarts that crash again are covered too. After each kill, the checkpoint, the
    Delta app transactions and the slot show that it landed where meant. The change
    log is on: it is written before the targets, and a replayed batch must replace its
    own (the random kills cover the default path without it).
    """
    db.execute("CREATE TABLE a (id int PRIMARY KEY, v text, n numeric(10, 2))",
               "CREATE TABLE b (id int PRIMARY KEY, v text)")
    source = _prepare(db, "a", "b") + f'dsn = "{db.dsn}"\nmaxChangesPerTrigger = 8\n'
    for transaction in _WORKLOAD:
        db.execute(*transaction)
    # Tiny batches: one core's worth of Spark starts faster, and needs no 200 shuffle
    # partitions nor a UI.
    spark_conf = ('master = "local[1]"\navailable_now = true\nconf = { '
                  '"spark.ui.enabled" = "false", "spark.sql.shuffle.partitions" = "1" }')
    config = _pipeline_file(tmp_path, source, spark_conf, changelog=True)
    checkpoint = tmp_path / "chk"

    def run(fault: str) -> list[str]:
        log = tmp_path / f"run-{fault}.log"
        proc = _tidemark_run(config, log, extra_env={"TIDEMARK_FAULT": fault})
        assert proc.wait(180) == -signal.SIGKILL, log.read_text(errors="replace")[-3000:]
        return _batch_lines(log)

    def state() -> tuple[set[int], set[int], dict[str, int | None]]:
        """Batches in the offset log and the commit log, the batch in each target."""
        query_id = json.loads((checkpoint / "metadata").read_text().splitlines()[0])["id"]
        written = {t: DeltaTable(str(tmp_path / "lake" / t)).transaction_version(
            f"tidemark-{query_id}-public.{t}") for t in "ab"}
        return (_batch_files(checkpoint, "offsets"), _batch_files(checkpoint, "commits"),
                written)

    # (a) Batch 1 read, nothing of it written: the slot was released up to batch 0 only.
    lines = run("after_read:1")
    assert [line.split(":")[0] for line in lines] == ["batch 0"]
    assert state() == ({0, 1}, {0}, {"a": 0, "b": 0})
    assert _slot_lsn(db) == _batch_end(checkpoint, 0)
    db.execute(*_AFTER_CRASHES[0])

    # (b) The restart redoes batch 1 (new to Delta: applied, not a replay), then batch 2
    # is written to Delta and the kill comes before Spark commits it.
    lines = run("after_write:2")
    assert len(lines) == 1 and lines[0].startswith("batch 1: public.a +3, public.b +5 |")
    assert state() == ({0, 1, 2}, {0, 1}, {"a": 2, "b": 2})
    assert _slot_lsn(db) == _batch_end(checkpoint, 1)
    db.execute(*_AFTER_CRASHES[1])

    # (c) The restart replays batch 2, which Delta already holds (skipped by its app
    # transaction); Spark commits it and the kill comes in the source's first commit()
    # of this run, batch 2's, before the slot moves past batch 1.
    lines = run("before_advance:0")
    assert len(lines) == 1 and "(replayed, skipped: public.a, public.b)" in lines[0], lines
    assert state() == ({0, 1, 2, 3}, {0, 1, 2}, {"a": 2, "b": 2})
    assert _slot_lsn(db) == _batch_end(checkpoint, 1)
    db.execute(*_AFTER_CRASHES[2])

    # (d) The restart runs batch 3 (offsets logged, never run), and the kill comes once
    # it is in a, not yet in b. The slot never passes the last batch Spark committed.
    assert run("between_targets:3") == []
    assert state() == ({0, 1, 2, 3}, {0, 1, 2}, {"a": 3, "b": 2})
    assert _batch_end(checkpoint, 1) <= _slot_lsn(db) <= _batch_end(checkpoint, 2)

    # The last restart replays batch 3 (a skips it, b applies it) and runs what came after.
    reports: list[BatchReport] = []
    Pipeline(load_config(config), spark=spark, on_batch=reports.append).run()
    assert reports[0].batch_id == 3 and reports[0].replayed == ("public.a",)
    assert reports[0].changes == {"public.a": 0, "public.b": 1}
    assert len(reports) > 1 and not any(r.replayed for r in reports[1:])
    # b's versions: 5 first, 5 second, id 1's third, ids 1 and 3's fourth, id 2's
    # return, id 4's fifth (each (id, __START_AT) once, checked inside).
    assert _assert_equal_to_source(db, tmp_path) == 5 + 5 + 1 + 2 + 1 + 1
    _assert_changelog_once(tmp_path)


# -- a transaction of a million rows ---------------------------------------------------
def _status_kib(pid: int) -> tuple[str, int, int]:
    """``(Name, VmRSS, VmHWM)`` of a process, from one read of its status file (a child
    forked but not yet exec'd still carries its parent's name and memory); a zombie has
    no memory lines (0)."""
    fields = dict(line.split(":", 1) for line in
                  Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return (fields["Name"].strip(), int(fields.get("VmRSS", "0").split()[0]),
            int(fields.get("VmHWM", "0").split()[0]))


class _PythonPeaks:
    """The peak RSS of every Python process Spark runs for this process (the source's
    runner, readers, Arrow workers), sampled until :meth:`stop`: the source's runner
    exits with its query, taking its high-water mark along."""

    def __init__(self) -> None:
        self.kib: dict[int, int] = {}
        self._stop = threading.Event()
        for child in psutil.Process().children(recursive=True):
            with contextlib.suppress(OSError):  # reused workers start from now
                Path(f"/proc/{child.pid}/clear_refs").write_text("5")
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(0.2):
            for child in psutil.Process().children(recursive=True):
                with contextlib.suppress(OSError):
                    name, _, peak = _status_kib(child.pid)
                    if name.startswith("python"):
                        self.kib[child.pid] = max(peak, self.kib.get(child.pid, 0))

    def stop(self) -> dict[int, int]:
        self._stop.set()
        self._thread.join()
        return self.kib


def test_a_million_row_transaction_keeps_driver_memory_bounded(
        spark: SparkSession, db: Database, tmp_path: Path) -> None:
    # Narrow rows (an int key only) keep the cost in the source and the apply, where a
    # transaction's size could pile up, not in moving wide values around.
    rows = 1_000_000
    db.execute("CREATE TABLE big (id int PRIMARY KEY)")
    source = _prepare(db, "big") + f'dsn = "{db.dsn}"\nmaxChangesPerTrigger = 10000\n'
    db.execute(f"INSERT INTO big SELECT generate_series(1, {rows})")
    file = tmp_path / "pipeline.toml"
    file.write_text(f"[source]\n{source}\n[spark]\ncheckpoint = \"chk\"\navailable_now = true\n"
                    '[targets."public.big"]\npath = "lake/big"\nkeys = ["id"]\n'
                    'snapshot = "never"\n')  # the transaction, through the stream
    reports: list[BatchReport] = []
    # The driver is this process: its high-water mark restarts from its current size.
    Path("/proc/self/clear_refs").write_text("5")
    _, start_kib, _ = _status_kib(os.getpid())
    peaks = _PythonPeaks()
    try:
        Pipeline(load_config(file), spark=spark, on_batch=reports.append).run()
    finally:
        workers = peaks.stop()
    driver_growth = (_status_kib(os.getpid())[2] - start_kib) * 1024

    # Admission control cannot split a transaction: one batch, far over the limit.
    assert [r.total for r in reports if r.total] == [rows]
    assert live_count(DeltaTable(str(tmp_path / "lake/big"))) == rows
    # The driver holds the batch's rows as Arrow for the Delta merge (about 50 bytes a
    # row here, copied a few times by the merge); as Python objects the rows alone would
    # take over 500 bytes each.
    assert driver_growth < 400 * rows, f"driver grew by {driver_growth >> 20} MiB"
    # The source's processes stream: readers hand on Arrow batches of bounded size, the
    # driver-side runner only counts changes per transaction.
    assert workers and max(workers.values()) < 512 * 1024, workers


# -- bad input that only shows once the query runs -------------------------------------
def test_a_target_that_stops_being_a_delta_table_fails_the_batch_and_keeps_the_slot(
        spark: SparkSession, db: Database, tmp_path: Path) -> None:
    # The file check (tidemark.pipeline.config) passed; then a file took the target's
    # place. The start finds it (tidemark.pipeline.start_checks), so the slot keeps its
    # changes.
    db.execute("CREATE TABLE a (id int PRIMARY KEY, v text, n numeric(10, 2))")
    source = _prepare(db, "a") + f'dsn = "{db.dsn}"\n'
    db.execute("INSERT INTO a SELECT g, 'x', g FROM generate_series(1, 3) g")
    file = tmp_path / "pipeline.toml"
    file.write_text(f"[source]\n{source}\n[spark]\ncheckpoint = \"chk\"\navailable_now = true\n"
                    '[targets."public.a"]\npath = "lake/a"\nkeys = ["id"]\n')
    config = load_config(file)
    (tmp_path / "lake").mkdir()
    (tmp_path / "lake/a").write_text("not a table")
    slot = _slot_lsn(db)
    with pytest.raises(ConfigError) as err:
        Pipeline(config, spark=spark).run()
    assert str(err.value).startswith('targets."public.a".path: ')
    assert f"{tmp_path / 'lake/a'} is a file, not a Delta table" in str(err.value)
    assert _slot_lsn(db) == slot
    assert not (tmp_path / "chk" / "commits").exists()  # Spark never started

    (tmp_path / "lake/a").unlink()
    Pipeline(config, spark=spark).run()
    source_rows, lake_rows = compare(db.dsn, "public.a", str(tmp_path / "lake/a"),
                                     ["id", "v", "n"])
    assert len(lake_rows) == 3 and source_rows == lake_rows


def test_a_target_deleted_or_replaced_while_its_checkpoint_remains_stops_the_pipeline(
        spark: SparkSession, db: Database, tmp_path: Path) -> None:
    # Recreating it would hold only the changes after the checkpoint: silently partial.
    db.execute("CREATE TABLE a (id int PRIMARY KEY, v text, n numeric(10, 2))")
    source = _prepare(db, "a") + f'dsn = "{db.dsn}"\n'
    file = tmp_path / "pipeline.toml"
    file.write_text(f"[source]\n{source}\n[spark]\ncheckpoint = \"chk\"\navailable_now = true\n"
                    '[targets."public.a"]\npath = "lake/a"\nkeys = ["id"]\n')
    config = load_config(file)
    db.execute("INSERT INTO a SELECT g, 'x', g FROM generate_series(1, 3) g")
    Pipeline(config, spark=spark).run()
    target = tmp_path / "lake/a"
    shutil.rmtree(target)
    db.execute("INSERT INTO a VALUES (4, 'y', 4)")
    slot = _slot_lsn(db)
    with pytest.raises(TargetLostError, match=r'targets\."public\.a"\.path: the Delta table '
                                              r".*lake/a is gone.*Restore the table"):
        Pipeline(config, spark=spark).run()
    assert not target.exists() and _slot_lsn(db) == slot

    # Another table in its place (someone's copy, a new pipeline's) is refused too.
    write_deltalake(str(target), pa.table({"id": [1], "v": ["z"], "n": [None]}))
    with pytest.raises(TargetLostError, match="is another Delta table now"):
        Pipeline(config, spark=spark).run()
    assert _slot_lsn(db) == slot


def test_a_running_pipeline_rides_out_a_postgres_restart(
        spark: SparkSession, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A fast restart (or failover) cut every connection: the query is started again
    from its checkpoint with backoff, so nothing is lost or applied twice."""
    with PostgresCluster() as cluster:
        cluster.create_database("app")
        db = Database(cluster, "app")
        db.execute("CREATE TABLE a (id int PRIMARY KEY, v text, n numeric(10, 2))",
                   "CREATE TABLE b (id int PRIMARY KEY, v text)")
        source = _prepare(db, "a", "b") + f'dsn = "{db.dsn}"\nreconnect_backoff_ms = 100\n'
        file = _pipeline_file(tmp_path, source, "trigger_interval_ms = 200", changelog=False)
        file.write_text(file.read_text() + "\n[metrics]\nport = 0\n")  # any free port
        config = load_config(file)
        with _LivePipeline(config, spark) as live:
            db.execute("INSERT INTO a SELECT g, 'x', g FROM generate_series(1, 10) g",
                       "INSERT INTO b SELECT g, 'first' FROM generate_series(1, 5) g")
            live.applied(15)
            # Scraped while it runs, under Debezium's names (tests/test_metrics.py).
            port = live.pipeline.metrics_port
            assert port
            text = scrape(port)
            assert value(text, "debezium_metrics_TotalNumberOfEventsSeen") == 15
            assert value(text, "debezium_metrics_NumberOfCommittedTransactions") == 1
            assert value(text, "tidemark_pipeline_changes", table="public.a") == 10
            assert 0 <= value(text, "debezium_metrics_MilliSecondsBehindSource") < 60_000
            cluster.restart()
            db.execute("UPDATE a SET v = 'after' WHERE id <= 5", "UPDATE b SET v = 'second'",
                       "DELETE FROM a WHERE id = 10")
            live.applied(15 + 5 + 5 + 1)
            assert live.running and not live.failures
        assert not live.failures, live.failures
        _assert_equal_to_source(db, tmp_path)
    assert "PostgreSQL is unreachable" in caplog.text  # the restart path was taken


def test_a_stopped_server_does_not_hang_a_running_pipeline(
        spark: SparkSession, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """SIGSTOP: no RST, no error, no keepalive failure; without a bound on each wait the
    source's query would wait forever. It fails after serverTimeoutMs, the query is
    restarted, and once the server runs again the changes arrive."""
    with PostgresCluster() as cluster:
        cluster.create_database("app")
        db = Database(cluster, "app")
        db.execute("CREATE TABLE a (id int PRIMARY KEY, v text, n numeric(10, 2))",
                   "CREATE TABLE b (id int PRIMARY KEY, v text)")
        source = _prepare(db, "a", "b") + (f'dsn = "{db.dsn} connect_timeout=2"\n'
                                           "reconnect_backoff_ms = 100\n"
                                           "serverTimeoutMs = 2000\n")
        config = load_config(_pipeline_file(tmp_path, source, "trigger_interval_ms = 200",
                                            changelog=False))
        with _LivePipeline(config, spark) as live:
            db.execute("INSERT INTO a SELECT g, 'x', g FROM generate_series(1, 3) g")
            live.applied(3)
            _signal_server(cluster, signal.SIGSTOP)
            try:
                live.wait_until(lambda: "PostgreSQL is unreachable" in caplog.text,
                                "the pipeline to notice the stopped server", timeout_s=60)
            finally:
                _signal_server(cluster, signal.SIGCONT)
            db.execute("UPDATE a SET v = 'after' WHERE id = 1")
            live.applied(4)
        assert not live.failures, live.failures
        source_a, lake_a = compare(db.dsn, "public.a", str(tmp_path / "lake/a"),
                                   ["id", "v", "n"])
        assert source_a == lake_a


def test_a_pipeline_whose_postgres_stays_down_stops_with_one_clear_line(
        tmp_path: Path) -> None:
    with PostgresCluster() as cluster:
        cluster.create_database("app")
        db = Database(cluster, "app")
        db.execute("CREATE TABLE a (id int PRIMARY KEY, v text)")
        (tmp_path / "pipeline.toml").write_text(
            f'[source]\ndsn = "{db.dsn}"\nslot = "s"\nreconnect_max_attempts = 2\n'
            'reconnect_backoff_ms = 100\n[spark]\ncheckpoint = "chk"\n'
            'trigger_interval_ms = 200\n[targets."public.a"]\npath = "lake/a"\nkeys = ["id"]\n')
        log = tmp_path / "run.log"
        proc = _tidemark_run(tmp_path / "pipeline.toml", log)
        try:
            deadline = time.monotonic() + 120
            while "batch 0" not in log.read_text(errors="replace"):
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.05)
            cluster.stop()
            assert proc.wait(120) == 2
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    output = log.read_text(errors="replace")
    assert "Traceback" not in output and "\tat org.apache" not in output, output[-3000:]
    errors = [line for line in output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "PostgreSQL is unreachable" in errors[0], output[-3000:]
    assert "gave up after 2 restarts" in errors[0]
    assert output.count("restarting the query from its checkpoint") == 2


def test_a_table_without_primary_key_fails_before_the_query_starts(
        spark: SparkSession, db: Database, tmp_path: Path) -> None:
    db.execute("CREATE TABLE keyless (id int, v text)")
    file = tmp_path / "pipeline.toml"
    file.write_text(f'[source]\ndsn = "{db.dsn}"\nslot = "s_{db.name}"\n'
                    '[spark]\ncheckpoint = "chk"\navailable_now = true\n'
                    '[targets."public.keyless"]\npath = "lake/k"\nkeys = ["id"]\n')
    with pytest.raises(PipelineError, match=r"public\.keyless have no primary key.*ADD "
                                            r"PRIMARY KEY"):
        Pipeline(load_config(file), spark=spark).run()
    # Nothing was started: no slot holds WAL; the failed first start left no checkpoint
    # and no target directory behind.
    assert db.scalar("SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s",
                     (f"s_{db.name}",)) == 0
    assert not (tmp_path / "chk").exists() and not (tmp_path / "lake").exists()


def test_unchanged_toast_truncate_and_a_new_column_reach_delta(
        spark: SparkSession, db: Database, tmp_path: Path) -> None:
    db.execute("CREATE TABLE a (id int PRIMARY KEY, v text, n numeric(10, 2), big text)",
               "ALTER TABLE a ALTER COLUMN big SET STORAGE EXTERNAL",
               "CREATE TABLE b (id int PRIMARY KEY, v text)")
    source = _prepare(db, "a", "b") + f'dsn = "{db.dsn}"\n'
    config = load_config(_pipeline_file(tmp_path, source, "available_now = true",
                                        changelog=False))
    db.execute("INSERT INTO a SELECT g, 'x', g, repeat('big' || g, 5000) "
               "FROM generate_series(1, 4) g",
               "INSERT INTO b SELECT g, 'first' FROM generate_series(1, 3) g")
    Pipeline(config, spark=spark).run()
    # The updates leave big alone, so the server does not send it (unchanged TOAST): the
    # target must keep its value. A truncate of b closes every current SCD2 version.
    db.execute("UPDATE a SET v = 'updated' WHERE id <= 2", "TRUNCATE b",
               "INSERT INTO b VALUES (9, 'after the truncate')")
    Pipeline(config, spark=spark).run()
    source_a, lake_a = compare(db.dsn, "public.a", str(tmp_path / "lake/a"), ["id", "v", "big"])
    assert source_a == lake_a and len(lake_a) == 4
    source_b, lake_b = compare(db.dsn, "public.b", str(tmp_path / "lake/b"), ["id", "v"],
                               scd2=True)
    assert source_b == lake_b == [(9, "after the truncate")]

    # A column added while the pipeline runs: the query stops, saying to restart; the
    # restart reads the same batch again with the column, which the target gains.
    live_config = load_config(_pipeline_file(tmp_path, source, "trigger_interval_ms = 200",
                                             changelog=False))
    applied = threading.Event()
    live = Pipeline(live_config, spark=spark,
                    on_batch=lambda report: report.total and applied.set())
    failures: list[PipelineError] = []

    def run_live() -> None:
        try:
            live.run()
        except PipelineError as err:
            failures.append(err)

    runner = threading.Thread(target=run_live)
    runner.start()
    try:
        db.execute("UPDATE a SET v = 'live' WHERE id = 4")
        assert applied.wait(120), "the running pipeline applied nothing"
        # With a DEFAULT the rows already there hold it in PostgreSQL without any
        # change being sent for them: the target's existing rows must get it too.
        db.execute("ALTER TABLE a ADD COLUMN note text DEFAULT 'none'",
                   "UPDATE a SET note = 'n' || id WHERE id = 3")
        runner.join(120)
    finally:
        live.request_stop()
        runner.join(60)
    assert failures and "gained column(s) note" in str(failures[0])
    assert "restart the query" in str(failures[0])
    Pipeline(config, spark=spark).run()
    source_a, lake_a = compare(db.dsn, "public.a", str(tmp_path / "lake/a"),
                               ["id", "v", "big", "note"])
    assert source_a == lake_a
    assert [row[3] for row in lake_a] == ["none", "none", "n3", "none"]


def test_numbers_at_their_limits_reach_delta_unrounded(
        spark: SparkSession, db: Database, tmp_path: Path) -> None:
    """numeric(p, s) up to 38 digits lands as decimal(p, s) exactly; wider or
    unconstrained numerics, NaN and infinities land as their exact text (Spark decimals
    stop at 38 digits); float8 keeps its extremes, -0, infinity and NaN."""
    db.execute("CREATE TABLE a (id int PRIMARY KEY, v text, n numeric(38, 10), "
               "wide numeric(50, 2), free numeric, f8 float8)",
               "CREATE TABLE b (id int PRIMARY KEY, v text)")
    source = _prepare(db, "a", "b") + f'dsn = "{db.dsn}"\n'
    values = [
        (1, "9999999999999999999999999999.9999999999", "9" * 48 + ".99",
         "0.000000000000000000000000000001", "1.7976931348623157e308"),
        (2, "-9999999999999999999999999999.9999999999", "-1.01",
         "123456789012345678901234567890.5", "-0.0"),
        (3, "0.0000000001", "0", "NaN", "Infinity"),
        (4, "1", "2", "Infinity", "NaN")]
    for row in values:
        db.execute("INSERT INTO a VALUES (%s, 'x', %s, %s, %s, %s)", params=row)
    config = load_config(_pipeline_file(tmp_path, source, "available_now = true",
                                        changelog=False))
    Pipeline(config, spark=spark).run()
    lake = live_table(DeltaTable(str(tmp_path / "lake/a"))).sort_by("id").to_pylist()
    assert [(r["id"], r["n"], r["wide"], r["free"]) for r in lake] == [
        (1, Decimal(values[0][1]), values[0][2], "0.000000000000000000000000000001"),
        (2, Decimal(values[1][1]), values[1][2], values[1][3]),
        (3, Decimal(values[2][1]), "0.00", "NaN"),
        (4, Decimal(1), "2.00", "Infinity")]
    assert str(lake[0]["n"]) == values[0][1]  # all 38 digits, none rounded
    assert [r["f8"] for r in lake[:3]] == [1.7976931348623157e308, 0.0, float("inf")]
    assert math.copysign(1, lake[1]["f8"]) == -1 and math.isnan(lake[3]["f8"])
    source_a, lake_a = compare(db.dsn, "public.a", str(tmp_path / "lake/a"),
                               ["id", "n", "wide", "free"])
    assert source_a == lake_a
