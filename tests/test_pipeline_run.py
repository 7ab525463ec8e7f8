"""``tidemark run`` on a real PostgreSQL and Spark: Delta equals the source, exactly once.

Spark is slow to start: the end-to-end test shares one in-process session; only the kill
test runs the CLI in subprocesses (a SIGKILL must hit a whole driver, JVM included).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import psycopg2
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from conftest import Database
from tidemark.pipeline import load_config
from tidemark.pipeline.compare import compare
from tidemark.pipeline.runner import Pipeline
from tidemark.spark import wal

pytestmark = pytest.mark.integration


def _prepare(db: Database, *tables: str) -> str:
    """Publication and slot before the first change (the stream starts at the slot)."""
    db.autocommit(f"CREATE PUBLICATION p_{db.name} FOR TABLE {', '.join(tables)}")
    with contextlib.closing(wal.connect(db.dsn, purpose="test")) as conn:
        wal.ensure_slot(conn, f"s_{db.name}")
    return f'slot = "s_{db.name}"\npublication = "p_{db.name}"\n'


def _pipeline_file(tmp_path: Path, source: str, spark: str) -> Path:
    file = tmp_path / "pipeline.toml"
    file.write_text(f"[source]\n{source}\n[spark]\ncheckpoint = \"chk\"\n{spark}\n"
                    '[targets."public.a"]\npath = "lake/a"\nkeys = ["id"]\n\n'
                    '[targets."public.b"]\npath = "lake/b"\nkeys = ["id"]\n'
                    "stored_as_scd_type = 2\n\n[changelog]\npath = \"lake/_changes\"\n")
    return file


def _assert_equal_to_source(db: Database, tmp_path: Path) -> int:
    """Both targets equal the source; returns the number of SCD2 versions of b."""
    source, lake = compare(db.dsn, "public.a", str(tmp_path / "lake/a"), ["id", "v", "n"])
    assert source == lake
    source, lake = compare(db.dsn, "public.b", str(tmp_path / "lake/b"), ["id", "v"],
                           scd2=True)
    assert source == lake
    history = DeltaTable(str(tmp_path / "lake/b")).to_pyarrow_table()
    versions = Counter(zip(history.column("id").to_pylist(),
                           history.column("__START_AT").to_pylist(), strict=True))
    assert max(versions.values()) == 1, "an SCD2 version was applied twice"
    return history.num_rows


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
    reports = []
    Pipeline(config, spark=spark, on_batch=reports.append).run()

    assert sum(r.total for r in reports) == 20 + 5 + 3 + 5 + 2 + 1 + 1 + 1
    assert len([r for r in reports if r.total]) > 1  # maxChangesPerTrigger split it
    # b: 5 first versions, 5 second ones (id 5's closed by its delete), id 1's third.
    assert _assert_equal_to_source(db, tmp_path) == 5 + 5 + 1
    # Caught up: only WAL without captured changes (a few records) is left behind.
    assert reports[-1].lag_bytes < 4096 and reports[-1].lag_seconds == 0
    assert (tmp_path / "lake/_changes").is_dir()

    # A second run with nothing new changes nothing.
    version = DeltaTable(str(tmp_path / "lake/a")).version()
    Pipeline(config, spark=spark).run()
    assert DeltaTable(str(tmp_path / "lake/a")).version() == version


def _writer(dsn: str, stop: threading.Event, seed: int) -> None:
    """Small random transactions on a and b (ids 1..40 churn) until *stop*, at most 500:
    a bounded backlog keeps the catch-up after the crash short."""
    rng = random.Random(seed)
    with contextlib.closing(psycopg2.connect(dsn)) as conn:
        for _ in range(500):
            if stop.is_set():
                break
            with conn, conn.cursor() as cur:
                for _ in range(rng.randint(1, 4)):
                    key = rng.randint(1, 40)
                    table = rng.choice("ab")
                    op = rng.random()
                    if op < 0.5:
                        cur.execute(f"INSERT INTO {table} (id, v) VALUES (%s, %s) ON CONFLICT "
                                    f"(id) DO UPDATE SET v = excluded.v",
                                    (key, f"v{rng.randint(0, 999)}"))
                    elif op < 0.8:
                        cur.execute(f"UPDATE {table} SET v = v || '+' WHERE id = %s", (key,))
                    else:
                        cur.execute(f"DELETE FROM {table} WHERE id = %s", (key,))
            time.sleep(0.02)


def _tidemark_run(config: Path, log: Path, *args: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    with log.open("ab") as out:
        # A new session: the SIGKILL below hits the driver and its JVM together.
        return subprocess.Popen([sys.executable, "-m", "tidemark", "run", str(config), *args],
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


def test_sigkill_mid_stream_then_restart_loses_and_doubles_nothing(
        db: Database, tmp_path: Path) -> None:
    db.execute("CREATE TABLE a (id int PRIMARY KEY, v text, n numeric(10, 2))",
               "CREATE TABLE b (id int PRIMARY KEY, v text)")
    source = _prepare(db, "a", "b") + "maxChangesPerTrigger = 100\n"
    config = _pipeline_file(tmp_path, source, "trigger_interval_ms = 50")
    os.environ["TIDEMARK_DSN"] = db.dsn  # the children read the DSN from here
    log = tmp_path / "run.log"
    stop = threading.Event()
    writer = threading.Thread(target=_writer, args=(db.dsn, stop, 7), daemon=True)
    writer.start()
    try:
        proc = _tidemark_run(config, log)
        try:
            # Right after a batch line: the batch is in Delta, and Spark has probably
            # not yet written its commit, so the restart replays it (the Delta app
            # transaction must skip it); later kills land inside the next batch.
            _wait_for_batches(log, 3, proc)
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
        time.sleep(0.5)  # changes after the crash too
    finally:
        stop.set()
        writer.join(10)
    restart = _tidemark_run(config, log, "--available-now")
    assert restart.wait(180) == 0, log.read_text(errors="replace")[-3000:]
    assert _assert_equal_to_source(db, tmp_path) > 0
